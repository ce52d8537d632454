"""One partition of the job: download, decode and score one batch; write its lines to S3.

:func:`score_partition` is what each Spark task runs. A partition holds one
batch: the task reads its keys from the run's plan (one ranged GET), fetches
and decodes the images on a thread pool while the model loads or scores the
previous micro-batch, and writes the batch's lines, sorted by key, to S3 as
one gzip object before Spark hears the task is done (:func:`part_key`).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import time
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np

import utils
from mxjob import defaults, listing, state
from mxjob.device import task_context
from mxjob.errors import error_line, first_line
from mxjob.handlers import Handlers, get_handlers, model_class
from mxjob.model import (
    ModelError,
    ModelSpec,
    Predictor,
    get_model,
    top_k_or_errors,
)
from mxjob.preprocess import Preprocess, decode_image
from mxjob.stats import StatsFold, TaskStats
from mxjob.worker import ThreadPlan, configure_threads, freeze_long_lived, host_share, memory_bytes, worker_threads

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class JobSpec:
    """Everything an executor needs, as plain values (pickled once per task)."""

    model: ModelSpec
    preprocess: Preprocess
    bucket: str
    batch_size: int = defaults.BATCH_SIZE
    top_k: int = defaults.TOP_K
    endpoint_url: str | None = None
    region: str | None = None
    io_threads: int = 16
    max_in_flight: int = 128
    max_object_bytes: int = 50 * 1024 * 1024
    s3_max_attempts: int = utils.S3_MAX_ATTEMPTS
    #: ``lean`` or ``botocore``: how executors GET objects (:func:`utils.s3_reader`).
    s3_reader: str = "lean"
    #: The driver's local copy of the --handler file; executors load the copy
    #: shipped with ``SparkContext.addFile`` under the same name.
    handler: str | None = None
    #: Images per forward pass (the module's bound batch); ``None``: ``batch_size``.
    micro_batch_size: int | None = None
    #: MXNet/OpenMP threads per Python worker; ``None``: see :func:`worker_threads`.
    threads: int | None = None
    #: Where the workers run, from the driver (``mxjob.cluster.thread_plan``); ``None`` outside a Spark job.
    thread_plan: ThreadPlan | None = None
    #: ``fp32`` or ``int8``; with ``int8``, ``model`` is the job's quantized checkpoint.
    precision: str = "fp32"
    #: Where each batch's lines become durable: ``s3://output_bucket/parts_prefix``
    #: (see :func:`part_key`). ``None``: the lines travel back to the driver instead.
    output_bucket: str | None = None
    parts_prefix: str | None = None
    #: The run's plan in ``output_bucket`` (``listing.write_plan``): when set, a
    #: partition holds one ``(offset, length)`` span and the task reads its keys from there.
    plan_key: str | None = None

    @property
    def forward_batch(self) -> int:
        """The module's bound batch: ``micro_batch_size``, never more than ``batch_size``."""
        return max(1, min(self.micro_batch_size or self.batch_size, self.batch_size))


def part_key(parts_prefix: str, index: int) -> str:
    """The S3 key of batch ``index``'s lines under a run's ``parts_prefix``.

    A batch always writes the same key, so a retried or speculative task
    replaces the object (S3 PUTs are atomic) instead of adding a second copy.
    """
    return f"{parts_prefix}part-{index:08d}.jsonl.gz"


def score_partition(index: int, items: Iterable, job: JobSpec) -> Iterator[tuple]:
    """Score one partition (one batch); yields a single ``(index, lines, blob, stats)``, ``stats`` a :class:`TaskStats`.

    ``items`` are ``(key, size)`` pairs; ``None`` marks a padding slot, which
    downloads nothing and yields nothing. With ``job.plan_key``, ``items`` is
    one ``(offset, length)`` span of the run's plan instead, and the batch's
    keys come from one ranged GET of it (the driver never ships the keys). The partition's JSON lines, sorted by
    key, are written to S3 as one gzip object of JSON Lines (:func:`part_key`)
    when ``job.parts_prefix`` is set, and ``blob`` is ``None``; otherwise
    ``blob`` is the lines joined by newlines and zlib-compressed, for the caller.
    """
    started, started_at, started_cpu = time.perf_counter(), time.time(), time.process_time()
    # First thing: MXNet reads its thread settings when it loads, and a handler may import it.
    threads = configure_threads(worker_threads(job.threads, job.thread_plan))
    handlers = get_handlers(job.handler)
    kind = model_class(handlers)
    reader = utils.s3_reader(job.endpoint_url, job.region, max_attempts=job.s3_max_attempts,
                             max_pool_connections=max(10, job.io_threads + 2), kind=job.s3_reader)
    io_stats = utils.IOStats()
    if job.plan_key is not None:
        [(offset, length)] = list(items)
        plan = utils.read_object(reader.client, job.output_bucket, job.plan_key, stats=io_stats,
                                 byte_range=(offset, length))
        real = listing.read_plan_batch(plan)
    else:
        real = [item for item in items if item is not None]
    lines: list[tuple[str, str]] = []
    timing = {"download": 0.0, "decode": 0.0, "forward": 0.0, "wait": 0.0}
    errors = {"download": 0, "decode": 0, "predict": 0}

    def work(key, size):
        return _fetch_and_decode(reader, job, handlers, key, size, io_stats)

    # Downloading and decoding start now, so a worker's first task fetches while MXNet
    # loads and the model comes in; later tasks find the model in this worker's cache.
    results = _prefetched(real, work, _pool(job.io_threads), max(job.max_in_flight, 1))
    try:
        # The cache keys on the device, so each GPU of a worker gets its own module.
        spec = replace(job.model, context=task_context(job.model.context, index))
        # Bound at the micro-batch: the first forward pass starts as soon as that
        # many images are decoded, while the pool fetches the rest of the batch.
        classifier = get_model(spec, job.preprocess.input_shape, job.forward_batch, kind)
    except Exception as exc:
        # Same message on every attempt, so the driver's error names the cause
        # (weights unreachable from the executors, corrupt, ...), not a stack.
        raise ModelError(f"executor {socket.gethostname()} cannot load the model {job.model.params_uri}: "
                         f"{type(exc).__name__}: {first_line(exc)}") from exc

    batch_keys: list[str] = []
    batch_arrays: list[np.ndarray] = []

    def flush():
        forward_started = time.perf_counter()
        for key, line, failed in output_lines(classifier, batch_keys, batch_arrays, job.top_k, handlers):
            lines.append((key, line))
            errors["predict"] += failed
        timing["forward"] += time.perf_counter() - forward_started
        batch_keys.clear()
        batch_arrays.clear()

    while True:
        wait_started = time.perf_counter()
        result = next(results, None)
        timing["wait"] += time.perf_counter() - wait_started
        if result is None:
            break
        key, array, failure, (download_s, decode_s) = result
        timing["download"] += download_s
        timing["decode"] += decode_s
        if failure is not None:
            stage, line = failure
            lines.append((key, line))
            errors[stage] += 1
            continue
        batch_keys.append(key)
        batch_arrays.append(array)
        if len(batch_keys) == classifier.batch_size:
            flush()
    if batch_keys:
        flush()
    lines.sort()
    text = "\n".join(line for _, line in lines).encode("utf-8")
    write_started = time.perf_counter()
    if job.parts_prefix is not None:
        # Durable before Spark hears the task is done: a dead driver loses nothing
        # this task scored. gzip level 1: ~5x smaller for a fraction of a ms.
        reader.client.put_object(Bucket=job.output_bucket, Key=part_key(job.parts_prefix, index),
                                 Body=gzip.compress(text + b"\n" if text else text, compresslevel=1),
                                 ContentType="application/gzip")
        blob = None
    else:
        blob = zlib.compress(text, 1)
    timing["write"] = time.perf_counter() - write_started
    stats = TaskStats(
        partition=index, executor=f"{socket.gethostname()}/{os.getppid()}", worker_pid=os.getpid(),
        attempt=_task_attempt(), keys=len(real), errors=errors,
        seconds={**{k: round(v, 4) for k, v in timing.items()}, "task": round(time.perf_counter() - started, 4),
                 "cpu": round(time.process_time() - started_cpu, 4)},
        s3_retries={"request": io_stats.request_retries, "body": io_stats.body_retries},
        model_loads=state.counters.model_loads, started=started_at, ended=time.time(), threads=threads,
        host=host_share(job.thread_plan), worker_task=state.counters.tasks_run + 1, memory=memory_bytes(),
    )
    state.counters.tasks_run += 1
    if state.counters.tasks_run == 1 and state.spark_task() is not None:
        freeze_long_lived()
    log.info("partition %d: %d keys, %d errors in %.2fs", index, len(real), sum(errors.values()),
             stats.seconds["task"])
    yield index, len(lines), blob, stats


def score_into(index: int, items: Iterable, job: JobSpec, stats) -> Iterator[int]:
    """:func:`score_partition`, with its stats added to the accumulator ``stats``; yields the keys it scored."""
    for _, _, _, task_stats in score_partition(index, items, job):
        stats.add(StatsFold.of_task(task_stats))
        yield task_stats.keys


# ----------------------------------------------------------------------------
# What the runner calls


def _pool(threads: int) -> ThreadPoolExecutor:
    """This worker's download pool of ``threads`` threads (kept in :data:`mxjob.state.pools`)."""
    return state.pools.get(threads, lambda: ThreadPoolExecutor(threads, thread_name_prefix="fetch"))


def _fetch_and_decode(reader: utils.ObjectReader, job: JobSpec, handlers: Handlers | None, key: str, size: int,
                      io_stats: utils.IOStats):
    """Download and decode one object (with ``handlers.input_handler`` if there is one).

    Returns ``(key, array, None, times)``, or ``(key, None, (stage, error_line), times)``.
    """
    started = time.perf_counter()

    def failed(stage, exc, times):
        return key, None, (stage, error_line(key, stage, exc)), times

    if size is not None and size > job.max_object_bytes:
        return failed("download", utils.too_large(size, job.max_object_bytes), (0.0, 0.0))
    try:
        # Also checked from the GET's Content-Length: a manifest may not give sizes (size -1).
        data = reader.read(job.bucket, key, stats=io_stats, max_bytes=job.max_object_bytes)
    except Exception as exc:  # noqa: BLE001 - every download failure becomes this key's error line
        return failed("download", exc, (time.perf_counter() - started, 0.0))
    downloaded = time.perf_counter()
    try:
        if handlers is not None and handlers.input_handler is not None:
            array = handlers.decode(key, data, job.preprocess.input_shape)
        else:
            array = decode_image(data, job.preprocess)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this image's, not the batch's
        return failed("decode", exc, (downloaded - started, time.perf_counter() - downloaded))
    return key, array, None, (downloaded - started, time.perf_counter() - downloaded)


def _prefetched(items: Sequence[tuple[str, int]], work, pool: ThreadPoolExecutor, window: int) -> Iterator:
    """Results of ``work(key, size)`` in input order, with at most ``window`` in flight.

    The window bounds memory (decoded images waiting for the model) while
    downloads and decoding run ahead of the model on the pool's threads. The
    first ``window`` items are submitted at once, on the call, not on the first
    ``next()``: a worker's first task fetches while it loads the model.
    """
    pending: deque = deque()
    it = iter(items)
    for key, size in it:
        pending.append(pool.submit(work, key, size))
        if len(pending) >= window:
            break
    return _drain(pending, it, work, pool)


def _drain(pending: deque, it: Iterator, work, pool: ThreadPoolExecutor) -> Iterator:
    while pending:
        result = pending.popleft().result()
        nxt = next(it, None)
        if nxt is not None:
            pending.append(pool.submit(work, *nxt))
        yield result


def _task_attempt() -> int:
    """This task's attempt number (0 the first time); 0 outside Spark."""
    task = state.spark_task()
    return task.attemptNumber() if task is not None else 0


def output_lines(model: Predictor, keys: list[str], arrays: list[np.ndarray], top_k: int,
                 handlers: Handlers | None = None) -> list[tuple[str, str, bool]]:
    """One forward pass over ``arrays``; per key, ``(key, JSON line, failed)``.

    The line holds the top-k ``predictions`` (``model`` is a
    :class:`Classifier`), or the object of the user's ``output_handler``. A
    failed forward pass fails every key of the batch; a non-finite output or
    a failing handler fails its key only. Failures are ``predict`` error lines.
    """
    out = []
    if handlers is None or handlers.output_handler is None:
        for key, (row, exc) in zip(keys, top_k_or_errors(model, arrays, top_k)):
            if exc is not None:
                out.append((key, error_line(key, "predict", exc), True))
            else:
                line = json.dumps({"key": key, "predictions": model.prediction_entries(row)}, ensure_ascii=False)
                out.append((key, line, False))
        return out
    try:
        outputs = model.predict(np.stack(arrays))
    except Exception as exc:  # noqa: BLE001 - a failed forward marks its images, other batches go on
        return [(key, error_line(key, "predict", exc), True) for key in keys]
    for i, key in enumerate(keys):
        try:
            out.append((key, handlers.output_line(key, [o[i] for o in outputs]), False))
        except Exception as exc:  # noqa: BLE001 - the user's code failing on one key fails that key
            out.append((key, error_line(key, "predict", exc), True))
    return out
