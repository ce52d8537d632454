"""The benchmark's two checkpoints, made here with random weights (nothing is downloaded).

* ``resnet18``: MXNet's model zoo ``resnet18_v1`` (11.7 M parameters, 1,000
  classes) at 3x224x224, the original article's model;
* ``resnet20``: a CIFAR-style ResNet-20 (0.27 M parameters, 10 classes) at
  3x32x32, small enough that downloading and decoding dominate. MXNet's own
  model zoo has no CIFAR ResNet, so it is built from the zoo's ``BasicBlockV1``
  as in He et al. (2016), section 4.2: a 16-channel stem, three stages of three
  blocks (16, 32, 64 channels), global average pooling, a dense head.

Weights are Xavier-random with a fixed seed; speed and memory do not depend on
their values. Both are exported as ``PREFIX-symbol.json`` and
``PREFIX-0000.params``, exactly what the job loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchModel:
    name: str
    input_shape: tuple
    classes: int
    description: str

    @property
    def shape_arg(self) -> str:
        return ",".join(map(str, self.input_shape))


RESNET18 = BenchModel("resnet18", (3, 224, 224), 1000, "ResNet-18 (model zoo resnet18_v1)")
RESNET20 = BenchModel("resnet20", (3, 32, 32), 10, "ResNet-20 (CIFAR-style)")
MODELS = {m.name: m for m in (RESNET18, RESNET20)}
# ImageNet's per-channel statistics on 0-255 values, as the job's --mean/--std.
MEAN, STD = "123.68,116.78,103.94", "58.4,57.12,57.38"


def cifar_resnet20(classes: int = 10):
    from mxnet.gluon import nn
    from mxnet.gluon.model_zoo.vision.resnet import BasicBlockV1

    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, 1, 1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"))
    in_channels = 16
    for stage, channels in enumerate((16, 32, 64)):
        for block in range(3):
            stride = 2 if stage > 0 and block == 0 else 1
            net.add(BasicBlockV1(channels, stride, downsample=stride != 1 or in_channels != channels,
                                 in_channels=in_channels))
            in_channels = channels
    net.add(nn.GlobalAvgPool2D(), nn.Flatten(), nn.Dense(classes))
    return net


def export(model: BenchModel, out_dir: str | Path, seed: int = 0) -> Path:
    """Write ``out_dir/NAME-symbol.json`` and ``NAME-0000.params`` (reused if present); return the prefix."""
    prefix = Path(out_dir) / model.name
    files = [prefix.with_name(f"{model.name}{suffix}") for suffix in ("-symbol.json", "-0000.params")]
    if all(f.exists() for f in files):
        return prefix
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    net = vision.resnet18_v1(classes=model.classes) if model is RESNET18 else cifar_resnet20(model.classes)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, *model.input_shape)))
    net.export(str(prefix), epoch=0)
    return prefix


#: The detectors' classes (VOC's 20) and anchors per cell: an SSD-style head on a backbone's last feature map.
DETECTOR_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
                    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
                    "tvmonitor")
_ANCHOR_SIZES, _ANCHOR_RATIOS = (0.2, 0.5, 0.8), (1, 2)
#: Anchors per cell of the feature map: one per size with the first ratio, one per further ratio.
ANCHORS_PER_CELL = len(_ANCHOR_SIZES) + len(_ANCHOR_RATIOS) - 1


def detector_for(backbone: BenchModel) -> BenchModel:
    """The detector :func:`export_detector` makes on ``backbone``: ``NAME-ssd``, the same input shape, 20 classes."""
    return BenchModel(f"{backbone.name}-ssd", backbone.input_shape, len(DETECTOR_CLASSES),
                      f"{backbone.description} features + SSD-style head (MultiBoxPrior, MultiBoxDetection)")


DETECTOR = detector_for(RESNET18)


def _features(backbone: BenchModel):
    """``backbone``'s network up to its last feature map: without its pooling and classifier."""
    from mxnet.gluon.model_zoo import vision

    if backbone is RESNET18:
        return vision.resnet18_v1(classes=backbone.classes).features[:-1]  # stage 4: 512 x 7 x 7 at 224 x 224
    return cifar_resnet20(backbone.classes)[:-3]  # stage 3: 64 x 8 x 8 at 32 x 32


def export_detector(out_dir: str | Path, backbone: BenchModel = RESNET18, seed: int = 0) -> Path:
    """``NAME-ssd``: ``backbone``'s features (its network without pooling and classifier) with an SSD head.

    The head is a class and a box convolution over the last feature map
    (ResNet-18's 7x7x512: 196 anchors; ResNet-20's 8x8x64: 256),
    ``MultiBoxPrior`` anchors (:data:`ANCHORS_PER_CELL` per cell) and
    ``MultiBoxDetection``: the output layout ``(batch, anchors, 6)`` the job's
    ``--task detect`` reads. The forward pass is the backbone's plus the head,
    so its cost is comparable to the classifier's. Random weights, fixed seed;
    ``synset.txt`` beside it holds the 20 labels. Reused if already written.
    """
    detector = detector_for(backbone)
    prefix = Path(out_dir) / "detector" / detector.name  # a folder of its own: its synset.txt is its alone
    files = [prefix.with_name(f"{detector.name}{suffix}") for suffix in ("-symbol.json", "-0000.params")]
    if all(f.exists() for f in files):
        return prefix
    import mxnet as mx
    import numpy as np

    prefix.parent.mkdir(parents=True, exist_ok=True)
    mx.random.seed(seed)
    features = _features(backbone)
    features.initialize(mx.init.Xavier())
    features.hybridize()
    features(mx.nd.zeros((1, *detector.input_shape)))
    body = features(mx.sym.var("data"))
    classes = len(DETECTOR_CLASSES) + 1  # and the background
    anchors = mx.sym.contrib.MultiBoxPrior(body, sizes=_ANCHOR_SIZES, ratios=_ANCHOR_RATIOS, name="ssd_anchors")
    cls = mx.sym.Convolution(body, num_filter=ANCHORS_PER_CELL * classes, kernel=(3, 3), pad=(1, 1), name="ssd_cls")
    cls = mx.sym.transpose(mx.sym.reshape(mx.sym.transpose(cls, axes=(0, 2, 3, 1)), shape=(0, -1, classes)),
                           axes=(0, 2, 1))
    loc = mx.sym.Convolution(body, num_filter=ANCHORS_PER_CELL * 4, kernel=(3, 3), pad=(1, 1), name="ssd_loc")
    loc = mx.sym.flatten(mx.sym.transpose(loc, axes=(0, 2, 3, 1)))
    detections = mx.sym.contrib.MultiBoxDetection(mx.sym.softmax(cls, axis=1), loc, anchors, nms_threshold=0.45,
                                                  name="ssd_detection")
    trained = {name: param.data() for name, param in features.collect_params().items()}
    aux_names = set(detections.list_auxiliary_states())
    shapes, _, _ = detections.infer_shape(data=(1, *detector.input_shape))
    rng = np.random.RandomState(seed)
    params = {}
    for name, shape in zip(detections.list_arguments(), shapes):
        if name == "data":
            continue
        params[f"arg:{name}"] = trained.get(name, mx.nd.array(rng.randn(*shape) * 0.05))
    for name in aux_names:
        params[f"aux:{name}"] = trained[name]
    detections.save(str(files[0]))
    mx.nd.save(str(files[1]), params)
    prefix.with_name("synset.txt").write_text("\n".join(DETECTOR_CLASSES) + "\n")
    return prefix
