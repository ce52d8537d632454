"""The worker's own CPU per image beyond the forward pass, step by step: ``python -m bench.worker_steps``.

Each step of what a Python worker does for one image besides the model is
timed on its own, on the benchmark's realistic photos (:mod:`bench.images`:
about 500x375, JPEG quality 90) and on 8-12 MP ones, as CPU time of the
calling thread (``time.thread_time``), not wall time, so that other load on
the machine moves the figures little. Each figure is the best of
``--repeats`` passes over every image.

* the S3 GET through the job's lean reader (``utils.ObjectReader``) against a
  local moto server: the client's CPU only (the server's is not the worker's);
  botocore's ``get_object`` beside it;
* the recipe's steps (``mxjob.preprocess``): open, draft, JPEG decode, EXIF
  transpose, RGB conversion, resize, array, CHW transpose, float conversion
  and normalisation, batch assembly, each on the previous step's output;
* end to end: :func:`mxjob.preprocess.decode_image` then ``np.stack`` (how
  the job assembles its micro-batches), and ``decode_into`` rows of a
  preallocated batch (the library's option that saves the stack);
* the Python glue of ``mxjob.partition``: the pool's futures, the result
  tuples and the timing sums per image, with the download and the decoding
  replaced by stubs (CPU of every thread of the process);
* large photos: decode CPU per photo with DCT scaling (``draft``), without
  (``exact``), and the JPEG decoder's floor: entropy decoding at 1/8 scale
  (``img.draft("RGB", (w // 8, h // 8))`` then ``load()``), which no scaling avoids.

It prints one table, with the CPU's model name and whether it has AVX-512
VNNI (int8 convolutions on oneDNN), and with ``--json`` one JSON line too.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np
from PIL import Image, ImageOps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import utils  # noqa: E402
from bench import images as bench_images  # noqa: E402
from bench.models import MEAN, STD  # noqa: E402
from mxjob import partition, preprocess  # noqa: E402
from mxjob.preprocess import Preprocess, decode_image, draft_size, to_rgb  # noqa: E402

BUCKET = "bench-worker-steps"


def cpu_model() -> tuple[str, bool]:
    """``lscpu``'s model name and whether the CPU has AVX-512 VNNI (from ``/proc/cpuinfo`` where lscpu is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.lower().startswith(("model name", "modelname"))), "unknown")
    return name, "avx512_vnni" in text


def photos(count: int, seed: int = 0) -> list[bytes]:
    """``count`` of the benchmark's photos as JPEG quality 90 (its PNGs left out: the table is per JPEG)."""
    sources = bench_images.source_photos()
    rng = np.random.RandomState(seed)
    return [bench_images.encode(bench_images.make_image(sources[i % len(sources)], rng), 0)[1] for i in range(count)]


def large_photos(count: int, seed: int = 1) -> list[bytes]:
    """``count`` JPEGs of 8-12 MP (quality 90), as ``make bench``'s large photos."""
    sources = bench_images.source_photos()
    rng = np.random.RandomState(seed)
    out = []
    for i in range(count):
        img = bench_images.make_large_image(sources[i % len(sources)], rng,
                                            bench_images.LARGE_SIZES[i % len(bench_images.LARGE_SIZES)])
        buffer = io.BytesIO()
        img.save(buffer, format="JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def best_ms(work, items: list, repeats: int, clock=time.thread_time) -> float:
    """The best over ``repeats`` passes of ``clock`` ms per item of ``work(item)`` over ``items``."""
    best = float("inf")
    for _ in range(repeats):
        started = clock()
        for item in items:
            work(item)
        best = min(best, (clock() - started) / len(items))
    return 1000 * best


# ----------------------------------------------------------------------------
# The recipe, one step at a time: each step runs on the previous step's output.


def _opened(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data))


def _drafted(data: bytes, prep: Preprocess) -> Image.Image:
    img = _opened(data)
    if prep.decode == "draft" and img.format in ("JPEG", "MPO"):
        img.draft(None, draft_size(img, prep))
    return img


def _loaded(data: bytes, prep: Preprocess) -> Image.Image:
    img = _drafted(data, prep)
    img.load()
    return img


def _resized(img: Image.Image, prep: Preprocess) -> Image.Image:
    return img.resize((prep.input_shape[2], prep.input_shape[1]), Image.BILINEAR)


def _normalised(chw: np.ndarray, prep: Preprocess) -> np.ndarray:
    mean = np.asarray(prep.mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(prep.std, dtype=np.float32).reshape(-1, 1, 1)
    array = np.empty(chw.shape, dtype=np.float32)
    np.subtract(chw, mean, out=array, dtype=np.float32)
    array /= std
    return array


def recipe_steps(datas: list[bytes], prep: Preprocess, repeats: int) -> dict[str, float]:
    """CPU ms per image of each step of the recipe, each on the previous step's outputs."""
    steps: dict[str, float] = {}
    steps["open (header)"] = best_ms(_opened, datas, repeats)
    # Differences of two best times: noise can make a tiny step come out below zero, which reads as zero.
    steps["draft (DCT scale request)"] = max(
        0.0, best_ms(partial(_drafted, prep=prep), datas, repeats) - steps["open (header)"])
    steps["JPEG decode (load)"] = max(0.0, best_ms(partial(_loaded, prep=prep), datas, repeats) - sum(steps.values()))
    loaded = [_loaded(d, prep) for d in datas]
    steps["EXIF transpose"] = best_ms(partial(ImageOps.exif_transpose, in_place=True), loaded, repeats)
    steps["RGB conversion"] = best_ms(to_rgb, loaded, repeats)
    steps["resize (BILINEAR)"] = best_ms(partial(_resized, prep=prep), loaded, repeats)
    resized = [_resized(img, prep) for img in loaded]
    steps["to array (np.asarray)"] = best_ms(np.asarray, resized, repeats)
    hwc = [np.asarray(img) for img in resized]
    steps["CHW transpose (copy)"] = best_ms(lambda a: np.ascontiguousarray(a.transpose(2, 0, 1)), hwc, repeats)
    chw = [np.ascontiguousarray(a.transpose(2, 0, 1)) for a in hwc]
    steps["float32 + normalise (new array)"] = best_ms(partial(_normalised, prep=prep), chw, repeats)
    if hasattr(preprocess, "normalise_into"):  # the fused step: planar bands straight into a batch's rows
        batch = np.empty((len(resized), *prep.input_shape), np.float32)
        steps["bands + float32 + normalise into a batch row"] = best_ms(
            lambda pair: preprocess.normalise_into(pair[0], prep, pair[1]), list(zip(resized, batch)), repeats)
    steps["batch assembly (np.stack of 16)"] = micro_batch_stack_ms(prep, repeats)
    return steps


def micro_batch_stack_ms(prep: Preprocess, repeats: int, micro_batch: int = 16) -> float:
    """``np.stack`` of a micro-batch of fresh decoded images, per image (the copy ``decode_into`` avoids)."""
    arrays = [np.random.RandomState(i).rand(*prep.input_shape).astype(np.float32) for i in range(micro_batch)]
    return best_ms(lambda _: np.stack(arrays), range(20), repeats) / micro_batch


def end_to_end(datas: list[bytes], prep: Preprocess, repeats: int, micro_batch: int = 16) -> dict[str, float]:
    """Decoding and batch assembly as the job does (``decode_image`` + ``np.stack``) and with ``decode_into``."""
    micro_batch = min(micro_batch, len(datas))
    chunks = [datas[i: i + micro_batch] for i in range(0, len(datas) - micro_batch + 1, micro_batch)]
    out = {"decode_image + np.stack": best_ms(lambda chunk: np.stack([decode_image(d, prep) for d in chunk]),
                                              chunks, repeats) / micro_batch}
    decode_into = getattr(preprocess, "decode_into", None)
    if decode_into is not None:
        batch = np.empty((micro_batch, *prep.input_shape), np.float32)

        def into(chunk):
            for row, data in zip(batch, chunk):
                decode_into(data, prep, row)

        out["decode_into a preallocated batch"] = best_ms(into, chunks, repeats) / micro_batch
    return out


# ----------------------------------------------------------------------------
# The partition's glue, and the GET


class _Model:
    """A stand-in the size of the job's micro-batch that is never run: Scoring's bookkeeping only."""

    batch_size = 1 << 30


def glue_ms(prep: Preprocess, count: int, repeats: int, threads: int = 16, window: int = 128) -> float:
    """CPU ms per image (every thread) of the partition's pool, futures, result tuples and timing sums.

    Download and decoding are stubs (a dict lookup, a preallocated array), so
    what is left is the Python around them: ``_prefetched`` / ``_drain``,
    ``_fetch_and_decode``'s tuples and clocks, and ``Scoring.add``.
    """
    job = partition.JobSpec(model=None, preprocess=prep, bucket=BUCKET)
    array = np.zeros(prep.input_shape, np.float32)
    reader = mock.Mock(read=lambda bucket, key, **_: b"x")
    keys = [(f"img{i:06d}.jpg", 1) for i in range(count)]
    pool = ThreadPoolExecutor(threads)
    stubs = {name: (lambda *a, **k: array) for name in ("decode_image", "decode_into") if hasattr(partition, name)}
    best = float("inf")
    with mock.patch.multiple(partition, **stubs):
        for _ in range(repeats):
            started = time.process_time()
            scoring = partition.Scoring(_Model(), job, None)
            for result in partition._prefetched(keys, _glue_work(reader, job), pool, window):
                scoring.add(result)
            best = min(best, (time.process_time() - started) / count)
    pool.shutdown()
    return 1000 * best


def _glue_work(reader, job):
    # The job's own work function, whichever signature this version of partition.py has.
    return partial(partition._fetch_and_decode, reader, job, None, io_stats=utils.IOStats())


def get_ms(datas: list[bytes], repeats: int) -> dict[str, float]:
    """Client CPU ms per GET, lean reader and botocore, against a local moto server (started and stopped here)."""
    from demo.s3local import FAKE_AWS_ENV, moto_server

    os.environ.update({k: os.environ.get(k, v) for k, v in FAKE_AWS_ENV.items()})
    keys = [f"photos/img{i:06d}.jpg" for i in range(len(datas))]
    out = {}
    with moto_server() as endpoint:
        client = utils.s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        for key, data in zip(keys, datas):
            client.put_object(Bucket=BUCKET, Key=key, Body=data)
        for kind in utils.S3_READERS:
            reader = utils.s3_reader(endpoint, kind=kind)
            reader.read(BUCKET, keys[0])  # the lean reader learns the bucket's address from botocore's first GET
            out[kind] = best_ms(partial(reader.read, BUCKET), keys, repeats)
    return out


# ----------------------------------------------------------------------------
# Large photos


def large_ms(datas: list[bytes], prep: Preprocess, repeats: int) -> dict[str, float]:
    """Decode CPU ms per photo: the recipe with ``draft`` and ``exact``, and the entropy-decoding floor at 1/8."""
    def floor(data: bytes) -> None:
        with Image.open(io.BytesIO(data)) as img:
            img.draft("RGB", (img.width // 8, img.height // 8))
            img.load()

    exact = replace(prep, decode="exact")
    return {"draft": best_ms(partial(decode_image, prep=prep), datas, repeats),
            "exact": best_ms(partial(decode_image, prep=exact), datas, repeats),
            "JPEG decoder at 1/8 (floor)": best_ms(floor, datas, repeats),
            "JPEG decoder at the recipe's draft scale": best_ms(partial(_loaded, prep=prep), datas, repeats)}


# ----------------------------------------------------------------------------


def measure(images: int, large: int, repeats: int, s3: bool = True) -> dict:
    """Every figure of the table, as a dict."""
    prep = Preprocess(input_shape=(3, 224, 224), mean=tuple(float(x) for x in MEAN.split(",")),
                      std=tuple(float(x) for x in STD.split(",")))
    datas = photos(images)
    name, vnni = cpu_model()
    out: dict = {"cpu": name, "avx512_vnni": vnni, "images": images, "repeats": repeats,
                 "steps": recipe_steps(datas, prep, repeats), "end_to_end": end_to_end(datas, prep, repeats),
                 "glue": glue_ms(prep, max(images, 256), repeats)}
    if s3:
        out["get"] = get_ms(datas, repeats)
    if large:
        out["large"] = large_ms(large_photos(large), prep, max(2, repeats // 2))
    return out


def table(result: dict) -> str:
    """The printed table: ms of CPU per image per step, and the totals."""
    lines = [f"CPU: {result['cpu']}; AVX-512 VNNI: {'yes' if result['avx512_vnni'] else 'no'}; "
             f"{result['images']} JPEGs of about 500x375 (q90) to 3x224x224, best of {result['repeats']}",
             "| step | ms CPU per image |", "|---|---|"]
    lines += [f"| {step} | {ms:.3f} |" for step, ms in result["steps"].items()]
    lines += [f"| end to end: {step} | {ms:.3f} |" for step, ms in result["end_to_end"].items()]
    lines.append(f"| Python glue: pool, futures, tuples, timing sums (all threads) | {result['glue']:.3f} |")
    best = min(result["end_to_end"].values())
    lines.append(f"| **total: decode + preprocess + assembly + glue** | **{best + result['glue']:.3f}** |")
    for kind, ms in result.get("get", {}).items():
        lines.append(f"| S3 GET, client CPU ({kind} reader, local moto) | {ms:.3f} |")
    large = result.get("large")
    if large:
        lines += ["", "8-12 MP JPEGs (q90) to 3x224x224: decode CPU per photo",
                  "| path | ms CPU per photo |", "|---|---|"]
        lines += [f"| {path} | {ms:.1f} |" for path, ms in large.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=64, help="500x375 photos (default 64)")
    parser.add_argument("--large", type=int, default=3, help="8-12 MP photos (default 3; 0: none)")
    parser.add_argument("--repeats", type=int, default=5, help="passes per step; the best is printed (default 5)")
    parser.add_argument("--no-s3", action="store_true", help="leave out the GET (no moto server)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args(argv)
    result = measure(args.images, args.large, args.repeats, s3=not args.no_s3)
    print(table(result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
