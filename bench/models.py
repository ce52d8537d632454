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
