"""``make bench-recipes``: faster decodes than the recipe, what each saves and what it does to a real model's answers.

Not a test, and not an option of the job: it measures why the recipe
(``mxjob.model.preprocess``, docs/performance.md "Preprocessing: check our
numbers") stays as it is although it alone costs a 500x375 JPEG most of
the 3 ms of worker CPU per image the job aims at beyond the forward pass.
Each alternative decodes the same JPEGs (quality 90, about 500x375:
distinct random views of the nine real photos scikit-learn and
scikit-image ship, ``demo.photos.photo_views``) to EfficientNet-Lite0's
3x224x224 input:

* ``recipe``: :func:`mxjob.model.preprocess.decode_image` (Pillow's libjpeg-turbo,
  ``draft``, BILINEAR resize);
* ``simplejpeg, full scale``: libjpeg-turbo through simplejpeg at full
  scale, then the recipe's resize: is it the recipe's input, and cheaper?
* ``simplejpeg, scaled``: libjpeg-turbo's DCT scaling to the smallest of its
  eighths (1/8 ... 8/8, where Pillow's ``draft`` only has halvings) that is
  still the model's size, then the recipe's resize;
* ``simplejpeg, scaled, fast DCT and upsampling``: the same with
  libjpeg-turbo's fastest integer DCT and chroma upsampling.

For each it prints the CPU per JPEG (best of ``--repeats`` passes, the
alternatives interleaved), how far its input is from the recipe's (mean and
largest absolute difference in units of ``std``), and the real
EfficientNet-Lite0's (``demo/pretrained.py``) top-1 agreement and top-5
(as a set) agreement with its answers on the recipe's input, against the
0.99 top-1 agreement ``--precision int8`` must reach to run. The CPU is named
(model, and whether it has VNNI).

Usage::

    python -m bench.decode_alternatives                  # 400 views
    python -m bench.decode_alternatives --images 100 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.int8_search import cpu_description  # noqa: E402
from bench.worker_steps import best_ms  # noqa: E402
from demo import photos as images  # noqa: E402
from demo import pretrained  # noqa: E402
from mxjob.model.preprocess import Preprocess, decode_image, normalise_into  # noqa: E402

#: The top-1 agreement ``--precision int8`` needs by default (``--min-agreement``): the same bar here.
GATE = 0.99


def simplejpeg_decoder(prep: Preprocess, scaled: bool, fast: bool = False):
    """A ``data -> float32 CHW`` function: simplejpeg's RGB decode (at the smallest eighth scale that keeps the
    model's size when ``scaled``), then the recipe's BILINEAR resize and normalisation (``stretch`` only)."""
    import simplejpeg

    _, height, width = prep.input_shape
    minimum = {"min_height": height, "min_width": width} if scaled else {}

    def decode(data: bytes) -> np.ndarray:
        rgb = simplejpeg.decode_jpeg(data, colorspace="RGB", fastdct=fast, fastupsample=fast, **minimum)
        out = np.empty(prep.input_shape, dtype=np.float32)
        normalise_into(Image.fromarray(rgb).resize((width, height), Image.BILINEAR), prep, out)
        return out

    return decode


def alternatives(prep: Preprocess) -> dict:
    """Name -> decoder, the recipe first."""
    return {"recipe": lambda data: decode_image(data, prep),
            "simplejpeg, full scale": simplejpeg_decoder(prep, scaled=False),
            "simplejpeg, scaled": simplejpeg_decoder(prep, scaled=True),
            "simplejpeg, scaled, fast DCT and upsampling": simplejpeg_decoder(prep, scaled=True, fast=True)}


def predictions(prefix: Path, arrays: np.ndarray, batch: int = 50) -> np.ndarray:
    """EfficientNet-Lite0's logits for ``arrays`` (N, 3, 224, 224), fp32, on the CPU: bound and run as the
    driver's int8 search does (:func:`mxjob.model.predictor.bind`, :func:`mxjob.int8.int8_search.forward`)."""
    import mxnet as mx

    from mxjob.int8.int8_search import forward
    from mxjob.model.predictor import bind

    symbol, args, aux = mx.model.load_checkpoint(str(prefix), 0)
    return forward(bind(symbol, args, aux, "data", arrays.shape[1:], batch), arrays, batch)


def agreement(reference: np.ndarray, other: np.ndarray) -> dict:
    """Top-1 agreement and top-5 agreement as sets between two ``(N, classes)`` score arrays."""
    top5 = np.argsort(-reference, axis=1)[:, :5], np.argsort(-other, axis=1)[:, :5]
    return {"top1_agreement": float(np.mean(reference.argmax(1) == other.argmax(1))),
            "top5_set_agreement": float(np.mean([set(a) == set(b) for a, b in zip(*top5)]))}


def run(count: int, repeats: int, seed: int, work: Path) -> dict:
    """Every alternative's CPU, input difference and agreement on ``count`` views; a dict for :func:`report`."""
    prep = pretrained.preprocess()
    datas = images.photo_views(count, seed)
    decoders = alternatives(prep)
    cpu_ms = {name: float("inf") for name in decoders}
    for _ in range(repeats):  # interleaved: a slow spell of the machine costs every alternative alike
        for name, decode in decoders.items():
            cpu_ms[name] = min(cpu_ms[name], best_ms(decode, datas, 1))
    arrays = {name: np.stack([decode(data) for data in datas]) for name, decode in decoders.items()}
    prefix = pretrained.export(work)
    logits = {name: predictions(prefix, batch) for name, batch in arrays.items()}
    rows = []
    for name in decoders:
        difference = np.abs(arrays[name] - arrays["recipe"])
        rows.append({"alternative": name, "cpu_ms_per_jpeg": round(cpu_ms[name], 3),
                     "mean_abs_difference": float(difference.mean()), "max_abs_difference": float(difference.max()),
                     **agreement(logits["recipe"], logits[name])})
    return {"cpu": cpu_description(), "images": count, "repeats": repeats, "gate": GATE, "rows": rows}


def report(out: dict) -> list[str]:
    """The printout: the CPU, then one table row per alternative with what it saves against the recipe."""
    recipe = out["rows"][0]["cpu_ms_per_jpeg"]
    lines = [f"CPU: {out['cpu']}",
             f"{out['images']} JPEGs (quality 90, about 500x375, views of 9 real photos) to EfficientNet-Lite0's "
             f"3x224x224; CPU per JPEG the best of {out['repeats']} interleaved passes",
             "| decode | CPU ms per JPEG | saves | input difference mean / max (std units) "
             "| Lite0 top-1 agreement | top-5 set agreement |",
             "|---|---:|---:|---|---:|---:|"]
    for row in out["rows"]:
        verdict = "" if row["alternative"] == "recipe" else (
            " (passes" if row["top1_agreement"] >= out["gate"] else " (below") + f" the {out['gate']} gate)"
        lines.append(f"| {row['alternative']} | {row['cpu_ms_per_jpeg']:.2f} | {recipe - row['cpu_ms_per_jpeg']:+.2f} "
                     f"| {row['mean_abs_difference']:.4f} / {row['max_abs_difference']:.3f} "
                     f"| {row['top1_agreement']:.3f}{verdict} | {row['top5_set_agreement']:.3f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=400, help="views of the real photos")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timing passes (the best counts)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-recipes-") as work:
        out = run(args.images, args.repeats, args.seed, Path(work))
    print("\n".join(report(out)), flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
