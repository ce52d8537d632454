"""Single-process measurements, each run in a fresh process by ``run_bench`` and printed as one JSON line.

MXNet sizes its thread pools when it loads, so every probe runs in its own
process whose environment the caller sets (``worker.thread_env``).

* ``limit``  L: forward passes on pre-decoded arrays, nothing else.
* ``square`` S: the original's square wave: download a batch one object after
  the other, then decode it, then run the model, then the next batch.
* ``results`` what executors would send back for N keys, from a fake fast
  model (random probabilities), pickled to a file;
* ``quantize`` the int8 checkpoint the job would make (``mxinfer.quantize_int8``),
  calibrated on the given images, written beside the model as ``PREFIX-int8``;
* ``decode`` CPU per image of ``decode_image`` on the given files, with
  ``decode="draft"`` and ``"exact"``, and how far the two inputs differ;
* ``driver`` the driver's memory for those N results: the listing, the plan,
  the model check, the collected result blobs, the checked stream to an S3
  multipart upload and the summary, without Spark or executors.

Usage::

    python -m bench.probes limit  --model PREFIX --shape 3,224,224 --batch 64 --seconds 15 IMAGE...
    python -m bench.probes square --model PREFIX --shape 3,224,224 --batch 64 --endpoint URL \\
        --bucket B --batches 6 KEY...
    python -m bench.probes quantize --model PREFIX --shape 3,224,224 IMAGE...
    python -m bench.probes decode --model PREFIX --shape 3,224,224 IMAGE...
    python -m bench.probes results --model PREFIX --shape 3,224,224 --results 100000 --results-file F
    python -m bench.probes driver --model PREFIX --shape 3,224,224 --endpoint URL --bucket B --results 100000 \\
        --results-file F
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import mxinfer  # noqa: E402
from bench.models import MEAN, STD  # noqa: E402
from mxjob.executor.partition import part_key  # noqa: E402
from mxjob.executor.stats import StatsFold  # noqa: E402
from mxjob.model import worker  # noqa: E402
from mxjob.options import config  # noqa: E402
from mxjob.reporting.summary import RunOutcome, summarize  # noqa: E402
from mxjob.run.checks import load_model_on_driver  # noqa: E402
from mxjob.run.scoring import assemble_output  # noqa: E402
from mxjob.s3 import clients, object_reader, writes  # noqa: E402
from mxjob.tasks.classify import prediction_entries  # noqa: E402

#: Predictions per key in the fake results, and the driver probe's --top-k: the two must agree.
TOP_K = 5
#: The driver probe's --micro-batch-size.
MICRO_BATCH = 16


def _preprocess(shape: tuple) -> mxinfer.Preprocess:
    mean = tuple(float(x) for x in MEAN.split(","))
    std = tuple(float(x) for x in STD.split(","))
    return mxinfer.Preprocess(input_shape=shape, mean=mean, std=std)


def limit(model: str, shape: tuple, batch: int, images: list[str], seconds: float) -> dict:
    """Forward passes of ``batch`` pre-decoded images for about ``seconds``: images/s and CPU ms per image.

    The rate is the best of windows of at least a second each, so that a
    moment of other load on the machine does not lower the limit E is held to;
    ``cpu_ms_per_image`` is the CPU per image of that same window, so that the
    cost and the rate describe the same moment. Another process's load costs a
    forward pass of two OpenMP threads more CPU than its own (a thread that
    waits at a barrier for one that was preempted spins), so the whole run's
    mean (``mean_cpu_ms_per_image``) can be a quarter above the best window's
    on a busy machine.
    """
    classifier = mxinfer.Predictor(model, shape, batch)  # the forward pass alone, whatever the model's head
    prep = _preprocess(shape)
    arrays = np.stack([mxinfer.decode_image(Path(p).read_bytes(), prep) for p in images])
    batches = [arrays[i: i + batch] for i in range(0, len(arrays) - batch + 1, batch)] or [arrays[:batch]]
    for b in batches[:2]:  # warm-up: the first pass creates oneDNN's kernels
        classifier.predict(b)
    done, passes, started = 0, 0, time.perf_counter()
    cpu = time.process_time()
    windows, window_start, window_cpu, window_done = [], started, cpu, 0  # windows: (images/s, CPU ms per image)
    while passes < 3 or time.perf_counter() - started < seconds:
        n = len(classifier.predict(batches[passes % len(batches)])[0])
        done, window_done, passes = done + n, window_done + n, passes + 1
        now = time.perf_counter()
        if now - window_start >= 1.0:
            now_cpu = time.process_time()
            windows.append((window_done / (now - window_start), 1000 * (now_cpu - window_cpu) / window_done))
            window_start, window_cpu, window_done = now, now_cpu, 0
    elapsed = time.perf_counter() - started
    mean_cpu = 1000 * (time.process_time() - cpu) / done
    best_rate, best_cpu = max(windows or [(done / elapsed, mean_cpu)])
    return {"images_per_second": best_rate, "mean_images_per_second": done / elapsed, "passes": passes,
            "seconds": elapsed, "cpu_ms_per_image": best_cpu, "mean_cpu_ms_per_image": mean_cpu}


def square(model: str, shape: tuple, batch: int, endpoint: str, bucket: str, keys: list[str],
           batches: int) -> dict:
    """The original's loop: for each batch, download every object in turn, decode them all, run the model."""
    classifier = mxinfer.Classifier(model, shape, batch)
    prep = _preprocess(shape)
    reader = object_reader.s3_reader(endpoint)  # the job's own S3 reader: the loop's shape is what differs
    classifier.predict(np.zeros((batch, *shape), np.float32))  # warm-up, as E's steady state has had
    phases = {"download": 0.0, "decode": 0.0, "forward": 0.0}
    images, rates = 0, []
    started = time.perf_counter()
    for b in range(batches):
        chunk = keys[b * batch: (b + 1) * batch]
        t0 = time.perf_counter()
        data = [reader.read(bucket, key) for key in chunk]
        t1 = time.perf_counter()
        arrays = np.stack([mxinfer.decode_image(d, prep) for d in data])
        t2 = time.perf_counter()
        lines = [json.dumps({"key": k, "predictions": prediction_entries(row)})
                 for k, row in zip(chunk, classifier.classify(arrays, 5))]
        t3 = time.perf_counter()
        assert len(lines) == len(chunk)
        phases["download"] += t1 - t0
        phases["decode"] += t2 - t1
        phases["forward"] += t3 - t2
        images += len(chunk)
        rates.append(len(chunk) / (t3 - t0))
    elapsed = time.perf_counter() - started
    # The best batch: the original at its least disturbed, which E is compared with.
    return {"images_per_second": max(rates), "mean_images_per_second": images / elapsed, "images": images,
            "seconds": elapsed, "phases": {k: round(v, 3) for k, v in phases.items()}}


def quantize(model: str, shape: tuple, images: list[str], batch: int = 16) -> dict:
    """Quantize ``model`` to int8 on ``images`` as the job's driver does; the int8 prefix and the time it took."""
    prep = _preprocess(shape)
    arrays = np.stack([mxinfer.decode_image(Path(p).read_bytes(), prep) for p in images])
    started = time.perf_counter()
    spec = mxinfer.quantize_int8(mxinfer.ModelSpec.from_prefix(model), shape, arrays, f"{model}-int8", (), batch)
    return {"prefix": spec.symbol_uri[: -len("-symbol.json")], "seconds": time.perf_counter() - started,
            "calibration_images": len(arrays)}


def decode(shape: tuple, images: list[str], repeats: int = 2) -> dict:
    """CPU ms per image of :func:`mxinfer.decode_image`, draft and exact, and the mean and max input difference."""
    prep = _preprocess(shape)
    datas = [Path(p).read_bytes() for p in images]
    out: dict = {"images": len(datas)}
    arrays = {}
    for mode in mxinfer.DECODE_MODES:
        mode_prep = replace(prep, decode=mode)
        mxinfer.decode_image(datas[0], mode_prep)
        cpu = time.process_time()
        for _ in range(repeats):
            arrays[mode] = np.stack([mxinfer.decode_image(d, mode_prep) for d in datas])
        out[f"{mode}_cpu_ms_per_image"] = 1000 * (time.process_time() - cpu) / (repeats * len(datas))
    difference = np.abs(arrays["draft"] - arrays["exact"])
    out["mean_abs_difference"], out["max_abs_difference"] = float(difference.mean()), float(difference.max())
    return out


def _listing(results: int, bucket: str = "bench"):
    """What the driver's listing would return for ``results`` photos: a sorted ``listing.Listing``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from mxjob.inputs import listing

    index = pa.array(np.arange(results, dtype=np.int64))
    keys = pc.binary_join_element_wise(
        "photos/", pc.utf8_lpad(pc.cast(pc.divide(index, 1000), pa.string()), 4, "0"), "/img",
        pc.utf8_lpad(pc.cast(index, pa.string()), 7, "0"), ".jpg", "")
    return listing.Listing.build(bucket, keys, pc.add(pc.bit_wise_and(index, 4095), 60_000))


def fake_results(model: str, shape: tuple, results: int, endpoint: str, bucket: str, batch: int = 64,
                 top_k: int = TOP_K) -> dict:
    """Leave under the work prefix what a run's executors would have left for ``results`` keys.

    The run's plan (``work_prefix.WorkPrefix.start_run``) and one part per
    batch (``mxjob.executor.partition.part_key``, :func:`mxjob.results.part_format.write_part`) with the
    real classifier's top-k rows (random probabilities over its classes
    instead of a forward pass), written to S3 with a few threads. Made in a
    process of its own, so the driver probe holds only what a driver holds.
    """
    from concurrent.futures import ThreadPoolExecutor

    from mxjob.outputs import work_prefix
    from mxjob.tasks import classify
    from mxjob.tasks.classify import top_classes

    classifier = mxinfer.Classifier(model, shape, 1)
    images = _listing(results, bucket)
    keys = images.keys.to_pylist()
    client = clients.s3_client(endpoint, max_pool_connections=16)
    work = work_prefix.WorkPrefix(client, bucket, _output_key(results))
    work.remove()
    run = work.start_run(1, images, batch, None)
    rng = np.random.RandomState(0)

    def part(index: int) -> int:
        chunk = keys[index * batch: (index + 1) * batch]
        probs = np.random.RandomState(index).dirichlet(np.full(classifier.num_classes, 0.1), size=len(chunk))
        rows = classify.TASK.results()
        for k, row in zip(chunk, top_classes(probs, top_k)):
            rows.add(k, classify.prediction_entries(classifier.labelled(row)))
        data = classify.TASK.write_part(rows.record_batch(), lines=True)
        client.put_object(Bucket=bucket, Key=part_key(run.prefix, index), Body=data)
        return len(data)

    del rng
    with ThreadPoolExecutor(16) as pool:
        part_bytes = sum(pool.map(part, range(run.batches)))
    return {"results": results, "parts": run.batches, "part_bytes": part_bytes}


def _output_key(results: int) -> str:
    return f"out/driver-{results}.jsonl"


def driver(model: str, shape: tuple, endpoint: str, bucket: str, results: int, batch: int = 64) -> dict:
    """Peak RSS and assembly time of the driver's own work for ``results`` keys that :func:`fake_results` left.

    The driver's steps in its order: its S3 client (the listing), the model
    check, the listing and the plan, what a ``--resume`` reads (the earlier
    run's plan and parts, to find the keys still to score: none here), then
    the assembly of every part into the output (a real S3 multipart upload)
    and the summary. Spark is not started: with executors writing their own
    parts, nothing of the results passes through the driver before the
    assembly.
    """
    from mxjob.outputs import work_prefix


    before = worker.memory_bytes()
    cfg = config.resolve(config.merge_settings({
        "input": f"s3://{bucket}/photos/", "model": model, "output": f"s3://{bucket}/{_output_key(results)}",
        "endpoint_url": endpoint, "batch_size": batch, "micro_batch_size": MICRO_BATCH,
        "input_shape": ",".join(map(str, shape)), "top_k": TOP_K, "overwrite": True,
    }, {}))
    client = clients.s3_client(endpoint)
    client.list_objects_v2(Bucket=bucket, MaxKeys=1)
    classifier = load_model_on_driver(cfg)
    images = _listing(results, bucket)
    loaded = worker.memory_bytes()
    work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    started = time.perf_counter()
    runs = work.runs()
    todo = images.filter(work_prefix.remaining_keys(work, runs, images))
    plan_seconds = time.perf_counter() - started
    assert not todo, f"{len(todo)} keys without a part"
    planned = worker.memory_bytes()
    started = time.perf_counter()
    counts = assemble_output(cfg, client, work, images)
    assembly_seconds = time.perf_counter() - started
    workload = work_prefix.Workload(runs=runs, todo=todo, number=2, resumed=True)
    summary = summarize(cfg, RunOutcome(images=len(images), batches=0, fold=StatsFold(), counts=counts, elapsed=1.0,
                                        model_summary=classifier.model_summary(),
                                        seconds={"assembly": assembly_seconds}, workload=workload, fingerprint={}))
    writes.put_text(client, cfg.output_bucket, cfg.summary_key, json.dumps(summary))
    after = worker.memory_bytes()
    size = client.head_object(Bucket=cfg.output_bucket, Key=cfg.output_key)["ContentLength"]
    work.remove()
    return {"results": results, "predicted": counts.predicted, "parts_read": counts.parts_read,
            "part_bytes": counts.bytes_read, "bytes_written": size, "resume_plan_seconds": plan_seconds,
            "assembly_seconds": assembly_seconds, "rss_start": before["rss"],
            "rss_model_loaded": loaded["rss"], "max_rss_model_loaded": loaded["max_rss"],
            "max_rss_planned": planned["max_rss"], "rss_end": after["rss"], "max_rss": after["max_rss"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("probe", choices=("limit", "square", "results", "driver", "quantize", "decode"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--shape", required=True)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--endpoint")
    parser.add_argument("--bucket")
    parser.add_argument("--batches", type=int, default=6)
    parser.add_argument("--results", type=int, default=10_000)
    parser.add_argument("items", nargs="*", help="image files (limit) or keys (square)")
    args = parser.parse_intermixed_args(argv)
    shape = tuple(int(x) for x in args.shape.split(","))
    if args.probe == "limit":
        out = limit(args.model, shape, args.batch, args.items, args.seconds)
    elif args.probe == "square":
        out = square(args.model, shape, args.batch, args.endpoint, args.bucket, args.items, args.batches)
    elif args.probe == "quantize":
        out = quantize(args.model, shape, args.items)
    elif args.probe == "decode":
        out = decode(shape, args.items)
    elif args.probe == "results":
        out = fake_results(args.model, shape, args.results, args.endpoint, args.bucket, args.batch)
    else:
        out = driver(args.model, shape, args.endpoint, args.bucket, args.results, args.batch)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
