"""The files docs/library.md's examples read, made here, offline: ``make examples``.

Usage::

    python -m demo.examples [OUT_DIR] [DEMO_DIR]   # defaults: run/examples, run/demo

writes into ``OUT_DIR``:

- ``three.png``, ``seven.png``, ``one.gif``: the first held-out three, seven and one of the demo's digits
  (scikit-learn's scans, scaled up exactly as ``demo/make_demo.py`` writes the demo's PNGs);
- ``astronaut.jpg``: scikit-image's astronaut photo (512x512), stored sideways with an EXIF orientation
  tag, as phones store photos;
- ``ssd/shades-symbol.json``, ``ssd/shades-0000.params``, ``ssd/synset.txt``: a small SSD-style detector
  (:func:`shades_detector`) whose weights are set by hand, not trained: it finds dark and bright windows.

The classify and embed examples read the demo model, ``DEMO_DIR/model/digits``; when it is missing it is
trained there as ``make run-local`` trains it (seeded: the same weights, in seconds), with no S3 or Spark.
Nothing is downloaded: the digits ship with scikit-learn, the photo with scikit-image.
"""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from demo import make_demo

#: The digits the examples name, by file: (digit, format).
DIGITS = {"three.png": (3, "PNG"), "seven.png": (7, "PNG"), "one.gif": (1, "GIF")}
PHOTO = "astronaut.jpg"
#: EXIF orientation 6: the stored pixels are turned a quarter left; a viewer turns them a quarter right.
SIDEWAYS = 6

# The demo detector: its input, the windows it scores, and the brightness levels it reports.
SHADES_SHAPE = (3, 128, 128)
SHADES_LABELS = ("dark", "bright")
#: Each window is WINDOW x WINDOW pixels of the model's input; windows start every STRIDE pixels (7 x 7 of them).
WINDOW, STRIDE = 32, 16
#: A window's mean brightness (0 black, 1 white) under DARK is `dark`, over BRIGHT `bright`: there the score passes 0.5.
DARK, BRIGHT = 1 / 3, 2 / 3
#: How fast the score goes from 0 to 1 around those levels: 0.95 at 0.1 past them.
SHARPNESS = 30.0
#: Boxes of one class overlapping a better one by more than this (intersection over union) are dropped: windows
#: half a window apart overlap by 1/3, so a dark region gives its darkest windows, not every window in it.
SHADES_NMS = 0.3


@dataclass(frozen=True)
class Anchors:
    """Where the detector's anchors go: ``MultiBoxPrior``'s ``sizes`` and ``ratios`` (per feature cell,
    ``len(sizes) + len(ratios) - 1`` anchors), and its ``steps`` and ``offsets`` (MXNet's defaults if None)."""

    sizes: tuple = (0.3, 0.6)
    ratios: tuple = (1, 2)
    steps: tuple | None = None
    offsets: tuple | None = None


def ssd_symbol(num_classes: int, filters: int = 8, pool: int = 4, pool_stride: int | None = None,
               pool_type: str = "max", anchors: Anchors | None = None, nms_threshold: float = 0.45):
    """A tiny SSD-style detector: conv features, MultiBoxPrior anchors, MultiBoxDetection.

    Its output is MXNet's detection layout, ``(batch, anchors, 6)``. The features are one 3x3 convolution
    (stride 2) and a pooling; per feature cell, the ``anchors`` (:class:`Anchors`' defaults if None), each
    scored over the background and ``num_classes`` classes by a 3x3 convolution, its box moved by another.
    """
    import mxnet as mx

    anchors = anchors or Anchors()

    with mx.name.NameManager():  # counters of its own: the same layer names, so the same file, in any process
        data = mx.sym.var("data")
        body = mx.sym.Activation(mx.sym.Convolution(data, num_filter=filters, kernel=(3, 3), stride=(2, 2),
                                                    pad=(1, 1), name="c1"), act_type="relu")
        body = mx.sym.Pooling(body, kernel=(pool, pool), stride=(pool_stride or pool,) * 2, pool_type=pool_type)
        placing = {"steps": anchors.steps, "offsets": anchors.offsets}
        priors = mx.sym.contrib.MultiBoxPrior(body, sizes=anchors.sizes, ratios=anchors.ratios, name="anchors",
                                              **{k: v for k, v in placing.items() if v is not None})
        per_cell = len(anchors.sizes) + len(anchors.ratios) - 1
        cls = mx.sym.Convolution(body, num_filter=per_cell * (num_classes + 1), kernel=(3, 3), pad=(1, 1),
                                 name="cls")
        cls = mx.sym.transpose(mx.sym.reshape(mx.sym.transpose(cls, axes=(0, 2, 3, 1)),
                                              shape=(0, -1, num_classes + 1)), axes=(0, 2, 1))
        loc = mx.sym.Convolution(body, num_filter=per_cell * 4, kernel=(3, 3), pad=(1, 1), name="loc")
        loc = mx.sym.flatten(mx.sym.transpose(loc, axes=(0, 2, 3, 1)))
        return mx.sym.contrib.MultiBoxDetection(mx.sym.softmax(cls, axis=1), loc, priors,
                                                nms_threshold=nms_threshold, name="det")


def save_detector(prefix: str | Path, symbol, params: dict, labels) -> Path:
    """``prefix-symbol.json``, ``prefix-0000.params`` and ``synset.txt`` beside them: a checkpoint the job reads."""
    import mxnet as mx

    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    symbol.save(f"{prefix}-symbol.json")
    mx.nd.save(f"{prefix}-0000.params", {f"arg:{name}": mx.nd.array(value) for name, value in params.items()})
    prefix.with_name("synset.txt").write_text("\n".join(labels) + "\n")
    return prefix


def random_detector(prefix: str | Path, input_shape: tuple, labels, seed: int = 7) -> Path:
    """:func:`ssd_symbol` with fixed random weights: detections of no meaning, in the right layout (for tests)."""
    symbol = ssd_symbol(len(labels))
    shapes, _, _ = symbol.infer_shape(data=(1, *input_shape))
    rng = np.random.RandomState(seed)
    params = {name: rng.randn(*shape) * (0.5 if name.endswith("weight") else 0.1)
              for name, shape in zip(symbol.list_arguments(), shapes) if name != "data"}
    return save_detector(prefix, symbol, params, labels)


def shades_detector(prefix: str | Path) -> Path:
    """The demo detector: on a (3, 128, 128) input, every 32x32 window whose mean brightness is under 1/3
    (``dark``, class 0) or over 2/3 (``bright``, class 1), as a box; weights set by hand, not trained.

    Takes 0-255 pixels (the job's default ``--mean 0 --std 1``). The first convolution's two filters are each
    pixel's brightness ``b`` (the mean of R, G, B over 255, taken at every other pixel by the stride) and
    ``1 - b``; average pooling makes their means over each window, and each window is exactly one anchor
    (``MultiBoxPrior``'s steps and offsets put the anchors on the pooling windows). Of its three scores,
    background is ``SHARPNESS * 2/3``, dark ``SHARPNESS * (1 - mean)`` and bright ``SHARPNESS * mean``; the
    softmax of them is the detection's score, so it passes 0.5 where the mean passes 1/3 or 2/3. No box
    regression: a box is its window. ``MultiBoxDetection`` then drops windows of a class that overlap a better
    one by more than ``SHADES_NMS``.
    """
    side = SHADES_SHAPE[1]
    symbol = ssd_symbol(len(SHADES_LABELS), filters=2, pool=WINDOW // 2, pool_stride=STRIDE // 2, pool_type="avg",
                        anchors=Anchors(sizes=(WINDOW / side,), ratios=(1,), steps=(STRIDE / side,) * 2,
                                        offsets=(WINDOW / STRIDE / 2,) * 2), nms_threshold=SHADES_NMS)
    c1_weight = np.zeros((2, 3, 3, 3), np.float32)
    c1_weight[0, :, 1, 1] = 1 / (3 * 255)  # the centre tap only: each pixel, not a blur of it
    c1_weight[1, :, 1, 1] = -1 / (3 * 255)
    cls_weight = np.zeros((3, 2, 3, 3), np.float32)  # (background, dark, bright) from (brightness, darkness)
    cls_weight[1, 1, 1, 1] = SHARPNESS
    cls_weight[2, 0, 1, 1] = SHARPNESS
    params = {"c1_weight": c1_weight, "c1_bias": np.array([0.0, 1.0], np.float32),
              "cls_weight": cls_weight, "cls_bias": np.array([SHARPNESS * BRIGHT, 0.0, 0.0], np.float32),
              "loc_weight": np.zeros((4, 2, 3, 3), np.float32), "loc_bias": np.zeros(4, np.float32)}
    return save_detector(prefix, symbol, params, SHADES_LABELS)


def window_brightness(array: np.ndarray) -> np.ndarray:
    """What :func:`shades_detector` measures, by hand: the mean brightness (0..1) of each window of a
    (3, 128, 128) input of 0-255 pixels, at the pixels its stride-2 convolution reads; (7, 7), rows then columns."""
    brightness = array.mean(axis=0)[::2, ::2] / 255.0
    window, stride = WINDOW // 2, STRIDE // 2
    count = (brightness.shape[0] - window) // stride + 1
    return np.array([[brightness[i * stride: i * stride + window, j * stride: j * stride + window].mean()
                      for j in range(count)] for i in range(count)])


def digit_files(out: Path) -> dict[str, Path]:
    """``three.png``, ``seven.png``, ``one.gif``: the first held-out digit of each, as the demo writes them."""
    (_, _), (test_x, test_y) = make_demo.digits_split()
    written = {}
    for name, (digit, fmt) in DIGITS.items():
        image = test_x[int(np.flatnonzero(test_y == digit)[0])]
        png = make_demo.digit_png(image)
        if fmt != "PNG":
            buffer = io.BytesIO()
            Image.open(io.BytesIO(png)).save(buffer, format=fmt)  # greyscale: the same 256 levels
            png = buffer.getvalue()
        (out / name).write_bytes(png)
        written[name] = out / name
    return written


def sideways_photo(path: Path) -> Path:
    """scikit-image's astronaut as a JPEG stored turned a quarter left, with the tag that turns it upright."""
    from skimage import data

    exif = Image.Exif()
    exif[0x0112] = SIDEWAYS
    stored = Image.fromarray(data.astronaut()).transpose(Image.ROTATE_90)
    stored.save(path, format="JPEG", quality=90, exif=exif.tobytes())
    return path


def demo_model(demo_dir: Path) -> Path:
    """The demo model's prefix, trained into ``demo_dir`` as ``make run-local`` does when it is not there yet."""
    prefix = demo_dir / "model" / "digits"
    needed = (Path(f"{prefix}-symbol.json"), Path(f"{prefix}-0000.params"), prefix.with_name("synset.txt"))
    if not all(p.is_file() for p in needed):
        make_demo.make_demo(demo_dir)
    return prefix


def make_examples(out_dir: str | Path = "run/examples", demo_dir: str | Path | None = "run/demo") -> dict:
    """Write the examples' files into ``out_dir`` (and the demo model into ``demo_dir``, unless None); return them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    made = {name: str(path) for name, path in digit_files(out).items()}
    made[PHOTO] = str(sideways_photo(out / PHOTO))
    made["detector"] = str(shades_detector(out / "ssd" / "shades"))
    if demo_dir is not None:
        made["demo_model"] = str(demo_model(Path(demo_dir)))
    return made


if __name__ == "__main__":
    print(json.dumps(make_examples(*sys.argv[1:3]), indent=2))
