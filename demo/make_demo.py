"""Make the demo model and images here, offline, in seconds.

The data set is scikit-learn's handwritten digits (1,797 real 8x8 scans that
ship inside the package). Images are written as greyscale PNGs; the model is
trained on exactly what the job's decoder makes of those PNGs, so the demo's
accuracy is the model's accuracy through our own pipeline.

Usage::

    python -m demo.make_demo OUT_DIR     # writes OUT_DIR/model/digits-*, OUT_DIR/images/...
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image

import mxinfer

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
INPUT_SHAPE = (3, 32, 32)
# Pixels are scaled to 0-1 by the job's --std, as a user's model would expect.
PREPROCESS = mxinfer.Preprocess(input_shape=INPUT_SHAPE, mean=(0.0, 0.0, 0.0), std=(255.0, 255.0, 255.0))
IMAGE_SIDE = 48


def digits_split(test_fraction: float = 0.2, seed: int = 0):
    """Digits as uint8 8x8 images, split into train and held-out test sets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = np.clip(digits.images * (255.0 / 16.0), 0, 255).astype(np.uint8)
    order = np.random.RandomState(seed).permutation(len(images))
    cut = int(len(images) * (1 - test_fraction))
    train, test = order[:cut], order[cut:]
    return (images[train], digits.target[train]), (images[test], digits.target[test])


def digit_png(image8: np.ndarray) -> bytes:
    """One digit as a greyscale PNG, scaled up so the job's resize does real work."""
    img = Image.fromarray(image8).resize((IMAGE_SIDE, IMAGE_SIDE), Image.NEAREST)
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def build_net():
    import mxnet as mx
    from mxnet.gluon import nn

    # Name counters of its own: gluon numbers layers per process (dense0, dense1, ...), so without them a
    # process that built another network first would export other layer names (and another symbol file).
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(
            nn.Conv2D(16, kernel_size=3, padding=1, activation="relu"),
            nn.MaxPool2D(2),
            nn.Conv2D(32, kernel_size=3, padding=1, activation="relu"),
            nn.MaxPool2D(2),
            nn.Flatten(),
            nn.Dense(64, activation="relu"),
            nn.Dense(10),
        )
    return net


def train(images: np.ndarray, labels: np.ndarray, epochs: int = 12, seed: int = 0):
    """Train the small CNN on the job's own decoding of the PNGs; return the Gluon net."""
    import mxnet as mx
    from mxnet import autograd, gluon

    mx.random.seed(seed)
    np.random.seed(seed)
    x = np.stack([mxinfer.decode_image(digit_png(img), PREPROCESS) for img in images])
    y = labels.astype(np.float32)
    net = build_net()
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.003})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(x), 64):
            idx = order[start: start + 64]
            data, label = mx.nd.array(x[idx]), mx.nd.array(y[idx])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            trainer.step(len(idx))
    return net


def export_logits(net, prefix: Path) -> None:
    """``prefix-symbol.json`` and ``prefix-0000.params``; the head is a Dense layer (logits)."""
    net.export(str(prefix), epoch=0)


def export_softmax_head(prefix_in: Path, prefix_out: Path) -> None:
    """The same weights with ``SoftmaxOutput`` on top (a ``softmax_label`` argument), as Module-era checkpoints."""
    import mxnet as mx

    sym, arg_params, aux_params = mx.model.load_checkpoint(str(prefix_in), 0)
    head = mx.sym.SoftmaxOutput(sym, name="softmax")
    mx.model.save_checkpoint(str(prefix_out), 0, head, arg_params, aux_params)


def make_demo(out_dir: str | Path, epochs: int = 12) -> dict:
    """Write the demo model, labels and held-out PNGs under ``out_dir``; return what was made."""
    out = Path(out_dir)
    (out / "model").mkdir(parents=True, exist_ok=True)
    (train_x, train_y), (test_x, test_y) = digits_split()
    net = train(train_x, train_y, epochs=epochs)
    prefix = out / "model" / "digits"
    export_logits(net, prefix)
    (out / "model" / "synset.txt").write_text("\n".join(LABELS) + "\n")
    images = out / "images"
    for i, (img, label) in enumerate(zip(test_x, test_y)):
        folder = images / str(int(label))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i:04d}.png").write_bytes(digit_png(img))
    made = {"model_prefix": str(prefix), "images": str(images), "train": len(train_x), "test": len(test_x)}
    (out / "made.json").write_text(json.dumps(made, indent=2))
    return made


def true_label(key: str) -> int:
    """Demo keys look like ``digits/test/7/0123.png``: the folder is the digit."""
    return int(key.rsplit("/", 2)[-2])


if __name__ == "__main__":
    print(json.dumps(make_demo(sys.argv[1] if len(sys.argv) > 1 else "run/demo"), indent=2))
