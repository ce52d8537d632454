"""The worker's own CPU per image beyond the forward pass, step by step: ``python -m bench.worker_steps``.

Each step of what a Python worker does for one image besides the model is
timed on its own, on the benchmark's realistic photos (:mod:`demo.photos`:
about 500x375, JPEG quality 90) and on 8-12 MP ones, as CPU time of the
calling thread (``time.thread_time``), not wall time, so that other load on
the machine moves the figures little. Each figure is the best of
``--repeats`` passes over every image.

* the S3 GET through the job's lean reader (``object_reader.ObjectReader``) against a
  local moto server: the client's CPU only (the server's is not the worker's);
  botocore's ``get_object`` beside it; and the lean GET's SigV4 signing alone
  and with the send (:func:`signer_ms`);
* the recipe's steps (``mxjob.model.preprocess``): open, draft, JPEG decode, EXIF
  transpose, RGB conversion, resize, array, CHW transpose, float conversion
  and normalisation, batch assembly, each on the previous step's output;
* end to end: :func:`mxjob.model.preprocess.decode_image` then ``np.stack`` (how
  the job assembles its micro-batches), and ``decode_into`` rows of a
  preallocated batch (the library's option that saves the stack);
* the Python glue of ``mxjob.executor.partition``: the pool's futures, the result
  tuples and the timing sums per image, with the download and the decoding
  replaced by stubs (CPU of every thread of the process);
* the whole task, in process: :func:`mxjob.executor.partition.score_partition` over
  one batch of the photos served by the local moto server, with the model
  replaced by a classifier whose forward pass costs nothing (ImageNet's 1,000
  classes, labelled, precomputed logits): CPU of every thread per image, and
  each of its steps measured alone on the same batch (GET, decode, top-k and
  result rows, the record batch, the JSON lines, the part's Arrow IPC + zstd,
  the PUT); what is left is the pool, the threads and the task's bookkeeping.
  ``--profile`` prints cProfile's top functions of one such task;
* the whole task with the model's real forward pass (ResNet-18, random
  weights, one thread), in fp32 and in int8 quantized as the job's driver
  does: the forward pass alone, the rest of the task (measured with a
  forward pass that costs nothing), the whole task, the local S3
  stand-in's CPU, and how much of int8's speed-up the worker's image keeps
  (``--model none`` leaves it out);
* large photos: decode CPU per photo with DCT scaling (``draft``), without
  (``exact``), and the JPEG decoder's floor: entropy decoding at 1/8 scale
  (``img.draft("RGB", (w // 8, h // 8))`` then ``load()``), which no scaling avoids.

It prints one table, with the CPU's model name and whether it has AVX-512
VNNI (int8 convolutions on oneDNN), and with ``--json`` one JSON line too.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
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

from mxjob.s3 import clients, object_reader, reads

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import models as bench_models  # noqa: E402
from bench.models import MEAN, STD  # noqa: E402
from demo import photos as bench_images  # noqa: E402
from mxjob.executor import partition  # noqa: E402
from mxjob.model import preprocess  # noqa: E402
from mxjob.model.predictor import ModelSpec  # noqa: E402
from mxjob.model.preprocess import Preprocess, decode_image, draft_size, to_rgb  # noqa: E402
from mxjob.tasks.classify import Classifier  # noqa: E402

BUCKET = "bench-worker-steps"


def cpu_model() -> tuple[str, bool]:
    """``lscpu``'s model name (``/proc/cpuinfo``'s where lscpu is missing) and whether ``/proc/cpuinfo``'s flags
    have AVX-512 VNNI (lscpu's where there is no ``/proc/cpuinfo``)."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        text = cpuinfo
    name = next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.lower().startswith(("model name", "modelname"))), "unknown")
    return name, "avx512_vnni" in (cpuinfo or text)


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


def recipe_floor(datas: list[bytes], prep: Preprocess, repeats: int = 3) -> dict:
    """What the recipe alone costs per image on this CPU: the floor under the worker's own work.

    For every image of ``datas`` and for its JPEGs alone (the unit of #22's
    target): ``recipe_ms``, :func:`mxjob.model.preprocess.decode_image` whole (best
    of ``repeats`` passes, CPU of the calling thread), and of it
    ``decoder_and_resize_ms``, the decoder's ``load()`` (libjpeg-turbo; zlib
    for a PNG) and Pillow's BILINEAR resize: the two steps the recipe fixes
    bit for bit, which no code of ours around them can make cheaper. ``make
    bench`` adds the job's own GETs and holds the sum against the 3 ms a
    500x375 JPEG may cost beyond the forward pass.
    """
    def costs(items: list[bytes]) -> dict:
        opened = best_ms(_opened, items, repeats)
        loaded = best_ms(partial(_loaded, prep=prep), items, repeats)
        images = [to_rgb(ImageOps.exif_transpose(_loaded(d, prep))) for d in items]
        return {"images": len(items), "recipe_ms": best_ms(partial(decode_image, prep=prep), items, repeats),
                "decoder_and_resize_ms": max(0.0, loaded - opened) + best_ms(partial(_resized, prep=prep), images,
                                                                             repeats)}

    jpegs = [d for d in datas if d[:3] == b"\xff\xd8\xff"]
    return {**costs(datas), "jpeg": costs(jpegs) if jpegs else None}


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
    best = float("inf")
    work = partial(partition._fetch_and_decode, reader, job, lambda key, data: array, io_stats=reads.IOStats())
    for _ in range(repeats):
        started = time.process_time()
        scoring = partition.Scoring([_Model()], job, partition.job_task(job))
        for result in partition._prefetched(keys, work, pool, window):
            scoring.add(result)
        best = min(best, (time.process_time() - started) / count)
    pool.shutdown()
    return 1000 * best


def get_ms(datas: list[bytes], repeats: int) -> dict[str, float]:
    """Client CPU ms per GET, lean reader and botocore, against a local moto server (started and stopped here)."""
    with _served(datas) as (endpoint, keys):
        return _get_ms(endpoint, keys, repeats)


@contextlib.contextmanager
def _served(datas: list[bytes]):
    """A local moto server holding ``datas`` in :data:`BUCKET`: yields its endpoint and the keys."""
    from demo.s3local import FAKE_AWS_ENV, moto_server

    os.environ.update({k: os.environ.get(k, v) for k, v in FAKE_AWS_ENV.items()})
    keys = [f"photos/img{i:06d}.jpg" for i in range(len(datas))]
    with moto_server() as endpoint:
        client = clients.s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        for key, data in zip(keys, datas):
            client.put_object(Bucket=BUCKET, Key=key, Body=data)
        yield endpoint, keys


def _get_ms(endpoint: str, keys: list[str], repeats: int) -> dict[str, float]:
    out = {}
    for kind in object_reader.S3_READERS:
        reader = object_reader.s3_reader(endpoint, kind=kind)
        reader.read(BUCKET, keys[0])  # the lean reader learns the bucket's address from botocore's first GET
        out[kind] = best_ms(partial(reader.read, BUCKET), keys, repeats)
    return out


#: Signs per key in the signing-only figure: one signature costs some 20-70 us, too little to time alone.
SIGN_LOOPS = 20


def signer_ms(endpoint: str, keys: list[str], repeats: int) -> dict[str, float]:
    """Client CPU ms per lean GET of its SigV4 signing, alone and with the send: what a faster signer could save.

    ``"sign"`` is the lean reader's signed, prepared request
    (``object_reader._signed_get``: botocore's public ``S3SigV4Auth`` on an
    ``AWSRequest``, as botocore signs a GET); ``"sign + send"`` adds sending
    it through the reader's HTTP session and reading the body from the local
    moto server. Each is the best of ``repeats`` passes. A hand-written
    signer measured 0.015 ms against this signer's 0.066 (``_signed_get``
    says why it was dropped).
    """
    import botocore.utils

    reader = object_reader.s3_reader(endpoint)
    reader.read(BUCKET, keys[0])  # the reader learns the bucket's address from botocore's first GET
    base, region, agent = reader._learned[BUCKET]
    urls = [base + botocore.utils.percent_encode(key, safe="/~") for key in keys]

    def sign(url: str):
        return object_reader._signed_get(reader.credentials.get_frozen_credentials(), region, url, agent).prepare()

    def send(url: str) -> None:
        response = reader._http.send(sign(url))
        if response.status_code != 200 or not response.content:
            raise RuntimeError(f"the local moto server refused a lean GET of {url}: {response.status_code}")

    return {"sign": best_ms(sign, urls * SIGN_LOOPS, repeats), "sign + send": best_ms(send, urls, repeats)}


# ----------------------------------------------------------------------------
# The whole task, in process, with a forward pass that costs nothing


#: What :class:`FreeForward` claims to be loaded from; nothing is read.
FREE_MODEL = ModelSpec("s3://bench/free-symbol.json", "s3://bench/free-0000.params")


class FreeForward(Classifier):
    """A :class:`Classifier` of ``classes`` labelled classes whose forward pass returns precomputed logits.

    Everything around the forward pass is the real classifier's: ``predict``'s
    checks and padding, the softmax, the top-k and the labels.
    """

    def __init__(self, input_shape: tuple, batch_size: int, classes: int = 1000, seed: int = 0):
        self.spec = FREE_MODEL
        self.input_shape, self.batch_size = tuple(input_shape), batch_size
        self.output_shapes, self.num_classes = [(classes,)], classes
        self.output_is_probability, self.head_op = False, "FullyConnected"
        self.labels = [f"class {c}, a label of about this length" for c in range(classes)]
        self._logits = np.random.RandomState(seed).standard_normal((4, batch_size, classes)).astype(np.float32)
        self._passes = 0

    def _forward(self, batch: np.ndarray) -> list[np.ndarray]:
        self._passes += 1
        return [self._logits[self._passes % len(self._logits)]]


def task_job(prep: Preprocess, endpoint: str, keys: list[str], **options) -> partition.JobSpec:
    """The job's settings for one batch of ``keys`` from the local server, its part written back there."""
    return partition.JobSpec(model=FREE_MODEL, preprocess=prep, bucket=BUCKET, endpoint_url=endpoint,
                             batch_size=len(keys), output_bucket=BUCKET, parts_prefix="parts/", **options)


def run_task(job: partition.JobSpec, keys: list[str], model: Classifier) -> tuple:
    """One :func:`partition.score_partition` of ``keys`` with ``model``: its ``(index, count, blob, stats)``."""
    with mock.patch.object(partition, "load_model", lambda *_: model):
        [out] = partition.score_partition(0, [(key, None) for key in keys], job)
    return out


def task_ms(prep: Preprocess, endpoint: str, keys: list[str], repeats: int, **options) -> dict[str, float]:
    """CPU ms per image of the whole task (every thread), and of each of its steps measured alone.

    ``"task (score_partition)"`` is the whole; the steps after it are each
    run alone on the same batch (the GET on the calling thread); ``"the rest"``
    is the whole less the steps: the pool and its threads, the task's
    bookkeeping (stats, error kinds, timings), and what the GETs and the
    decoding cost more interleaved on the pool's threads than each in a
    tight loop of its own (caches).
    """
    job = task_job(prep, endpoint, keys, **options)
    model = FreeForward(prep.input_shape, job.forward_batch)
    out = {"task (score_partition)": task_cpu_ms(job, keys, model, repeats)[0]}
    reader = object_reader.s3_reader(endpoint)
    datas = [reader.read(BUCKET, key) for key in keys]
    out["GET (lean reader, client)"] = best_ms(partial(reader.read, BUCKET), keys, repeats)
    out["decode + preprocess"] = best_ms(partial(decode_image, prep=prep), datas, repeats)
    decoded = [(key, decode_image(data, prep), None, partition.FetchTimes()) for key, data in zip(keys, datas)]
    task = partition.job_task(job)

    def scored(_=None):
        scoring = partition.Scoring([model], job, task)
        for item in decoded:
            scoring.add(item)
        scoring.finish()
        return scoring

    out["stack, top-k and result rows (free forward)"] = best_ms(scored, [None], repeats) / len(keys)
    rows = scored().results
    out["record batch (sorted)"] = best_ms(lambda _: rows.record_batch(), [None], repeats) / len(keys)
    batch = rows.record_batch()
    if job.json_lines:
        out["JSON lines"] = best_ms(lambda _: task.json_lines(batch), [None], repeats) / len(keys)
    blob = partition.write_results(replace(job, parts_prefix=None), task, 0, None, batch)
    # Less the lines it renders (measured above), where it renders them: a difference, never below zero.
    out["part: Arrow IPC + zstd"] = max(0.0, best_ms(
        lambda _: partition.write_results(replace(job, parts_prefix=None), task, 0, None, batch), [None], repeats
    ) / len(keys) - out.get("JSON lines", 0.0))
    out["PUT of the part (client)"] = best_ms(
        lambda _: reader.client.put_object(Bucket=BUCKET, Key="parts/probe", Body=blob), [None], repeats) / len(keys)
    out["the rest: pool, threads, bookkeeping"] = max(0.0, out["task (score_partition)"] - sum(
        ms for step, ms in out.items() if step != "task (score_partition)"))
    return out


def task_cpu_ms(job: partition.JobSpec, keys: list[str], model: Classifier, repeats: int,
                server=None) -> tuple[float, float]:
    """CPU ms per image of :func:`run_task` (every thread of the process, the best of ``repeats``, after a first
    task in which the reader learns the bucket and the pool starts), and of the local ``server`` (a
    ``psutil.Process``; 0 without one) over those ``repeats`` tasks."""
    run_task(job, keys, model)
    before = server.cpu_times() if server is not None else None
    task = best_ms(lambda _: run_task(job, keys, model), [None], repeats, time.process_time) / len(keys)
    if before is None:
        return task, 0.0
    after = server.cpu_times()
    return task, 1000 * (after.user + after.system - before.user - before.system) / (repeats * len(keys))


def task_profile(prep: Preprocess, endpoint: str, keys: list[str], top: int = 25, **options) -> str:
    """cProfile's ``top`` functions by own CPU time of the calling thread in one task (after a first one), as text.

    The pool's threads (GETs, decoding) are not profiled: the calling thread
    is the task's own Python (scoring, rows, the part, the PUT, the stats).
    """
    job = task_job(prep, endpoint, keys, **options)
    model = FreeForward(prep.input_shape, job.forward_batch)
    run_task(job, keys, model)
    profiler = cProfile.Profile(time.thread_time)
    profiler.runcall(run_task, job, keys, model)
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


# ----------------------------------------------------------------------------
# The model's real forward pass, fp32 and int8


#: The precisions the real model's rows are measured in, as ``--precision`` names them.
PRECISIONS = ("fp32", "int8")


def precision_ms(endpoint: str, keys: list[str], datas: list[bytes], repeats: int, model=bench_models.RESNET18,
                 folder: Path | None = None) -> dict:
    """CPU ms per image of ``model``'s forward pass, of the rest of the task, and of the whole task, fp32 and int8.

    The checkpoint is ``bench.models``' (random weights, made once in
    ``folder``); its int8 copy is quantized as the job's driver does
    (:func:`mxjob.int8.int8.quantize_int8`, calibrated on ``datas``). One
    forward lane of one thread (``configure_threads(1, 1)``, unless MXNet was
    loaded before, as in a test), so that each figure is the CPU an image
    costs, not what an idle core's OpenMP spin adds; a worker of two lanes
    spends as much per image. Returns ``{"rest": ms, "fp32": {...}, "int8": {...}}``:

    - ``"rest"``: the task with a forward pass that costs nothing
      (:class:`FreeForward`): the GET, the decode, the rows, the part and its
      PUT, the pool. It is the same in both precisions, and measured so
      rather than as the whole task less the forward pass, a difference of
      two figures twenty times its size that the noise of either swamps;
    - per precision, ``"forward pass alone"``: ``predict`` on whole
      micro-batches of the decoded photos, process CPU (the passes run on
      MXNet's engine threads); ``"whole task"``: :func:`partition.score_partition`
      over ``keys`` (Parquet output) with the real model, every thread of
      the process; ``"S3 stand-in's server"``: the local moto server's CPU
      over those tasks, per image: what the same cores spend here that real
      S3 costs the cluster nothing.
    """
    from mxjob.executor.measure import local_server_process
    from mxjob.int8.int8 import quantize_int8
    from mxjob.model.worker import configure_threads

    configure_threads(1, 1)
    prep = bench_preprocess(model.input_shape)
    job = replace(task_job(prep, endpoint, keys), json_lines=False)
    micro = job.forward_batch
    decoded = [decode_image(data, prep) for data in datas]
    batches = [np.stack(decoded[i:i + micro]) for i in range(0, len(decoded) - micro + 1, micro)]
    if not batches:
        raise ValueError(f"precision_ms needs at least one micro-batch of {micro} photos, got {len(decoded)}")
    prefix = bench_models.export(model, folder or Path(os.environ.get("TMPDIR", "/tmp")) / "mxinfer-worker-steps")
    fp32 = ModelSpec.from_prefix(str(prefix))
    specs = {"fp32": fp32,
             "int8": quantize_int8(fp32, prep.input_shape, np.stack(decoded), f"{prefix}-int8", (), micro)}
    server = local_server_process(endpoint)
    out: dict = {"rest": task_cpu_ms(job, keys, FreeForward(prep.input_shape, micro), repeats)[0]}
    for precision in PRECISIONS:
        net = Classifier(specs[precision], prep.input_shape, batch_size=micro)
        net.predict(batches[0])  # the first pass builds the kernels
        forward = best_ms(net.predict, batches, repeats, time.process_time) / micro
        task, served = task_cpu_ms(job, keys, net, repeats, server)
        out[precision] = {"forward pass alone": forward, "whole task": task, "S3 stand-in's server": served}
    return out


def kept_gain(rest: float, fp32: dict, int8: dict) -> dict:
    """int8's speed-up of the forward pass alone and of the worker's image (the forward pass and the ``rest``),
    with and without the S3 stand-in's CPU, and the share of the forward pass's speed-up the image keeps:
    ``(image gain - 1) / (model gain - 1)``.

    >>> kept = kept_gain(2.0, {"forward pass alone": 8.0, "S3 stand-in's server": 1.0},
    ...                  {"forward pass alone": 2.0, "S3 stand-in's server": 1.0})
    >>> kept["model"], kept["image"], round(kept["image with the stand-in"], 3), round(kept["kept"], 3)
    (4.0, 2.5, 2.2, 0.5)
    """
    model = fp32["forward pass alone"] / int8["forward pass alone"]
    image = (fp32["forward pass alone"] + rest) / (int8["forward pass alone"] + rest)
    served = ((fp32["forward pass alone"] + rest + fp32["S3 stand-in's server"]) /
              (int8["forward pass alone"] + rest + int8["S3 stand-in's server"]))
    return {"model": model, "image": image, "image with the stand-in": served,
            "kept": (image - 1) / (model - 1) if model != 1 else float("nan")}


def precision_table(result: dict) -> list[str]:
    """The fp32 and int8 rows of :func:`table`, with the share of int8's gain the worker's image keeps."""
    figures = result.get("precision")
    if not figures:
        return []
    rest, fp32, int8 = figures["rest"], figures["fp32"], figures["int8"]
    rows = [("forward pass alone", fp32["forward pass alone"], int8["forward pass alone"]),
            ("the rest of the task: GET, decode, rows, part, pool (with a forward pass that costs nothing)", rest,
             rest),
            ("**the worker's image: the two above**", fp32["forward pass alone"] + rest,
             int8["forward pass alone"] + rest),
            ("whole task with the real model, measured", fp32["whole task"], int8["whole task"]),
            ("S3 stand-in's server (not the worker's)", fp32["S3 stand-in's server"], int8["S3 stand-in's server"])]
    lines = ["", f"The worker with the model's real forward pass ({result['precision_model']}, random weights, "
                 f"bound at 16, one thread), a batch of {result['task_batch']}, Parquet output: ms of CPU per image",
             "| step | fp32 | int8 | fp32 / int8 |", "|---|---|---|---|"]
    lines += [f"| {step} | {a:.2f} | {b:.2f} | {a / b if b > 0 else float('nan'):.2f} |" for step, a, b in rows]
    kept = kept_gain(rest, fp32, int8)
    share = rest / (int8["forward pass alone"] + rest)
    lines += ["", f"int8's speed-up: the forward pass alone {kept['model']:.2f}x, the worker's image "
                  f"{kept['image']:.2f}x ({kept['image with the stand-in']:.2f}x with the S3 stand-in's CPU): it "
                  f"keeps {kept['kept']:.0%} of the model's gain; the rest of the task is {share:.0%} of an int8 "
                  f"image (#47's target, on a CPU with VNNI: E int8 / E fp32 >= 2.5)"]
    return lines


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


def bench_preprocess(input_shape: tuple = (3, 224, 224)) -> Preprocess:
    """``make bench``'s recipe: its mean and std, for ``input_shape`` (3x224x224 unless given)."""
    return Preprocess(input_shape=tuple(input_shape), mean=tuple(float(x) for x in MEAN.split(",")),
                      std=tuple(float(x) for x in STD.split(",")))


def measure(images: int, large: int, repeats: int, s3: bool = True, steps: bool = True,
            task_batch: int = 64, model=None) -> dict:
    """Every figure of the table, as a dict; ``steps=False`` leaves out the recipe's steps and the glue.

    With ``s3``, the GETs and the whole task (:func:`task_ms`, batches of
    ``task_batch`` of the photos; 0 leaves it out) against a local moto server;
    with a ``model`` too (a ``bench.models`` model), the whole task with its
    real forward pass in fp32 and int8 (:func:`precision_ms`, best of
    ``repeats`` but at most 2: a ResNet-18's pass over 64 photos takes seconds).
    """
    prep = bench_preprocess()
    datas = photos(max(images, task_batch if s3 else 0))
    name, vnni = cpu_model()
    out: dict = {"cpu": name, "avx512_vnni": vnni, "images": images, "repeats": repeats}
    if steps:
        out.update({"steps": recipe_steps(datas[:images], prep, repeats),
                    "end_to_end": end_to_end(datas[:images], prep, repeats),
                    "glue": glue_ms(prep, max(images, 256), repeats)})
    if s3:
        with _served(datas) as (endpoint, keys):
            out["get"] = _get_ms(endpoint, keys[:images], repeats)
            out["signer"] = signer_ms(endpoint, keys[:images], repeats)
            if task_batch:
                out["task_batch"] = task_batch
                out["task"] = {label: task_ms(prep, endpoint, keys[:task_batch], repeats, **options)
                               for label, options in task_variants().items()}
                if model is not None:
                    out["precision_model"] = model.description
                    out["precision"] = precision_ms(endpoint, keys[:task_batch], datas[:task_batch],
                                                    min(repeats, 2), model)
    if large:
        out["large"] = large_ms(large_photos(large), prep, max(2, repeats // 2))
    return out


def task_variants() -> dict[str, dict]:
    """The task's settings measured: as the job runs for each output format (the lines rendered or not)."""
    return {"JSON Lines output": {"json_lines": True}, "Parquet output": {"json_lines": False}}


def table(result: dict) -> str:
    """The printed table: ms of CPU per image per step, and the totals."""
    lines = [f"CPU: {result['cpu']}; AVX-512 VNNI: {'yes' if result['avx512_vnni'] else 'no'}; "
             f"{result['images']} JPEGs of about 500x375 (q90) to 3x224x224, best of {result['repeats']}",
             "| step | ms CPU per image |", "|---|---|"]
    if "steps" in result:
        lines += [f"| {step} | {ms:.3f} |" for step, ms in result["steps"].items()]
        lines += [f"| end to end: {step} | {ms:.3f} |" for step, ms in result["end_to_end"].items()]
        lines.append(f"| Python glue: pool, futures, tuples, timing sums (all threads) | {result['glue']:.3f} |")
        best = min(result["end_to_end"].values())
        lines.append(f"| **total: decode + preprocess + assembly + glue** | **{best + result['glue']:.3f}** |")
    for kind, ms in result.get("get", {}).items():
        lines.append(f"| S3 GET, client CPU ({kind} reader, local moto) | {ms:.3f} |")
    signer = result.get("signer")
    if signer:
        lines.append(f"| lean GET's SigV4 signing + prepare (botocore S3SigV4Auth) | {signer['sign']:.4f} |")
        lines.append(f"| lean GET signed, sent and read (local moto) | {signer['sign + send']:.3f} |")
    lines += task_table(result)
    lines += precision_table(result)
    large = result.get("large")
    if large:
        lines += ["", "8-12 MP JPEGs (q90) to 3x224x224: decode CPU per photo",
                  "| path | ms CPU per photo |", "|---|---|"]
        lines += [f"| {path} | {ms:.1f} |" for path, ms in large.items()]
    return "\n".join(lines)


def task_table(result: dict) -> list[str]:
    """The whole task's rows of :func:`table`: per variant, the task and its steps, ms of CPU per image."""
    tasks = result.get("task")
    if not tasks:
        return []
    variants = list(tasks)
    lines = ["", f"The whole task in process (score_partition, a batch of {result['task_batch']}, free forward pass, "
                 "local moto), ms of CPU per image",
             "| step | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    steps = list(dict.fromkeys(step for figures in tasks.values() for step in figures))
    for step in steps:
        cells = [f"{tasks[v][step]:.3f}" if step in tasks[v] else "-" for v in variants]
        if step == "task (score_partition)":
            cells = [f"**{c}**" for c in cells]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=64, help="500x375 photos (default 64)")
    parser.add_argument("--large", type=int, default=3, help="8-12 MP photos (default 3; 0: none)")
    parser.add_argument("--repeats", type=int, default=5, help="passes per step; the best is printed (default 5)")
    parser.add_argument("--no-s3", action="store_true", help="leave out the GET (no moto server)")
    parser.add_argument("--task-batch", type=int, default=64,
                        help="images in the whole task's batch (default 64, as make bench; 0: leave the task out)")
    parser.add_argument("--task-only", action="store_true",
                        help="only the GET and the whole task (no recipe steps, no large photos)")
    parser.add_argument("--model", choices=("resnet18", "none"), default="resnet18",
                        help="the real model of the whole task's fp32 and int8 rows (default resnet18, about 2 "
                             "minutes; none: leave them out)")
    parser.add_argument("--profile", action="store_true", help="also print cProfile's top functions of one task")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args(argv)
    if args.model != "none" and not args.no_s3 and 0 < args.task_batch < 16:
        parser.error(f"--model {args.model} scores whole micro-batches of 16: give --task-batch 16 or more, "
                     "or --model none")
    if args.profile:
        with _served(photos(args.task_batch or 64)) as (endpoint, keys):
            print(task_profile(bench_preprocess(), endpoint, keys))
    result = measure(args.images, 0 if args.task_only else args.large, args.repeats, s3=not args.no_s3,
                     steps=not args.task_only, task_batch=args.task_batch,
                     model=bench_models.MODELS.get(args.model))
    print(table(result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
