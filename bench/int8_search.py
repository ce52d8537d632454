"""``make bench-int8``: ``--int8-exclude auto`` on the real EfficientNet-Lite0, printed.

Not a test: it prints what the driver's search does on a real pretrained
model (``demo/pretrained.py``) and real photos. The photos are the nine
that scikit-learn and scikit-image ship; there are too few of them, so each
image is a distinct random view of one (a crop, a flip, brightness /
contrast / colour jitter: ``demo.photos.photo_views``, deterministic for a
seed). The views are split as the job splits its sample: the even ones
calibrate, the odd ones are held out. It prints the configurations tried,
the layers kept in fp32, the agreement and the speed-up reached, the
seconds, the CPU model and whether it has VNNI (int8 dot products).

Usage::

    python -m bench.int8_search                      # 200 calibration, 200 held out, 120 s budget
    python -m bench.int8_search --held-out 50 --budget 30
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo import photos as images  # noqa: E402
from demo import pretrained  # noqa: E402


def cpu_description() -> str:
    """``"MODEL NAME, N cores, VNNI: avx512_vnni"`` from ``/proc/cpuinfo`` (``"unknown"`` parts off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                 "unknown")
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    vnni = [f for f in ("avx512_vnni", "avx_vnni") if f in flags]
    return f"{model}, {os.cpu_count()} cores, VNNI: {', '.join(vnni) or 'no'}"


def photo_arrays(count: int, seed: int) -> np.ndarray:
    """``count`` views of the real photos, decoded as the job decodes them for EfficientNet-Lite0."""
    from mxjob.model.preprocess import decode_image

    preprocess = pretrained.preprocess()
    return np.stack([decode_image(data, preprocess) for data in images.photo_views(count, seed)])


def run(held_out: int, budget: float, min_agreement: float, batch: int, seed: int, work: Path) -> dict:
    """Export the model, make the views, run the search as the driver does; the result as a dict."""
    from mxjob.int8.int8 import weight_layers
    from mxjob.int8.int8_search import SampleArrays, SearchGoal, quantize_auto
    from mxjob.model.predictor import ModelSpec

    prefix = pretrained.export(work)
    arrays = photo_arrays(2 * held_out, seed)
    spec = ModelSpec.from_prefix(str(prefix))
    layers = weight_layers(spec.read(spec.symbol_uri).decode("utf-8"))
    started = time.time()
    chosen, result = quantize_auto(spec, layers, SampleArrays(arrays[0::2], arrays[1::2]), str(work / "auto-int8"),
                                   batch, SearchGoal(min_agreement, budget))
    return {"cpu": cpu_description(), "threads": os.environ.get("OMP_NUM_THREADS", f"{os.cpu_count()} (default)"),
            "calibration_images": len(arrays[0::2]), "held_out": len(arrays[1::2]), "layers": len(layers),
            "budget_seconds": budget, "min_agreement": min_agreement, "passed": chosen is not None,
            "seconds_with_calibration": round(time.time() - started, 1), **result.as_dict()}


def report(out: dict) -> list[str]:
    """The printout: one line per configuration tried on every held-out image, then the outcome."""
    lines = [f"CPU: {out['cpu']}; MXNet threads {out['threads']}",
             f"EfficientNet-Lite0, {out['layers']} convolution / dense layers; {out['calibration_images']} "
             f"calibration and {out['held_out']} held-out views of 9 real photos; --min-agreement "
             f"{out['min_agreement']}, --int8-search-seconds {out['budget_seconds']:g}",
             f"{out['configurations_tried']} configurations tried in {out['seconds']} s "
             f"({out['seconds_with_calibration']} s with the calibration pass); stopped: {out['stopped']}",
             "most sensitive layers (one-layer KL divergence): "
             + ", ".join(f"{s['layer']} {s['kl_divergence']:.5f}" for s in out["most_sensitive"]),
             "| layers in fp32 | granularity | top-1 agreement | KL divergence | speed-up (in-search timing) |",
             "|---|---|---|---|---|"]
    lines += [f"| {t['excluded_layers']} | {t['granularity']} | {t['top1_agreement']:.3f} | {t['kl_divergence']:.5f} "
              f"| {t['speedup']:.2f} |" for t in out["trials"]]
    best, timing = out["best"], out["timing"]
    lines.append(f"{'PASSED' if out['passed'] else 'REFUSED'}: {len(best['excluded_layers'])} layers kept in fp32 "
                 f"({', '.join(best['excluded_layers']) or 'none'}), {best['granularity']}, top-1 agreement "
                 f"{best['top1_agreement']:.3f}; final timing fp32 {timing['fp32_ms_per_image']} ms/image, int8 "
                 f"{timing['int8_ms_per_image']} ms/image: speed-up {timing['speedup']:.2f}x")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held-out", type=int, default=200, help="held-out views (as many calibrate)")
    parser.add_argument("--budget", type=float, default=120.0, help="--int8-search-seconds")
    parser.add_argument("--min-agreement", type=float, default=0.99)
    parser.add_argument("--batch", type=int, default=16, help="bound batch of every forward pass")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None, help="where the model is exported (a temporary folder)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object too")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-int8-"))
    out = run(args.held_out, args.budget, args.min_agreement, args.batch, args.seed, work)
    print("\n".join(report(out)), flush=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
