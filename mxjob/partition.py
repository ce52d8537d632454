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
from functools import partial

import numpy as np

import utils
from mxjob import listing, settings, state
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
from mxjob.stats import ERROR_EXAMPLES, StatsFold, TaskStats
from mxjob.worker import ThreadPlan, configure_threads, freeze_long_lived, host_share, memory_bytes, worker_threads

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class _JobSpecBase:
    """Everything an executor needs, as plain values (pickled once per task).

    Besides the fields below, one field per executor setting
    (:data:`mxjob.settings.SETTINGS` with ``to="executor"``: ``batch_size``,
    ``top_k``, ``io_threads``, ``s3_max_attempts``, ...), each with the job's
    default, so that an executor option is declared once, in the table.

    Parameters
    ----------
    model : ModelSpec
        The checkpoint; with ``precision="int8"``, the job's quantized one.
    preprocess : Preprocess
        The decoding recipe.
    bucket : str
        The bucket the batch's keys are in.
    handler : str, optional
        The driver's local copy of the --handler file; executors load the copy
        shipped with ``SparkContext.addFile`` under the same name.
    thread_plan : ThreadPlan, optional
        Where the workers run, from the driver (``mxjob.cluster.thread_plan``); ``None`` outside a Spark job.
    output_bucket, parts_prefix : str, optional
        Where each batch's lines become durable: ``s3://output_bucket/parts_prefix``
        (see :func:`part_key`). ``None``: the lines travel back to the driver instead.
    plan_key : str, optional
        The run's plan in ``output_bucket`` (``listing.write_plan``): when set, a
        partition holds one ``(offset, length)`` span and the task reads its keys from there.
    """

    model: ModelSpec
    preprocess: Preprocess
    bucket: str
    handler: str | None = None
    thread_plan: ThreadPlan | None = None
    output_bucket: str | None = None
    parts_prefix: str | None = None
    plan_key: str | None = None

    @property
    def forward_batch(self) -> int:
        """The module's bound batch: ``micro_batch_size``, never more than ``batch_size``."""
        return max(1, min(self.micro_batch_size or self.batch_size, self.batch_size))


JobSpec = settings.make_settings_dataclass("JobSpec", _JobSpecBase, settings.going_to("executor"), __name__)


def part_key(parts_prefix: str, index: int) -> str:
    """The S3 key of batch ``index``'s lines under a run's ``parts_prefix``.

    A batch always writes the same key, so a retried or speculative task
    replaces the object (S3 PUTs are atomic) instead of adding a second copy.
    """
    return f"{parts_prefix}part-{index:08d}.jsonl.gz"


def score_partition(index: int, items: Iterable, job: JobSpec) -> Iterator[tuple]:
    """Score one partition (one batch); yields a single ``(index, count, blob, stats)``.

    ``count`` is the number of lines the batch made (one per key), ``stats`` a
    :class:`TaskStats`. ``items`` are ``(key, size)`` pairs; ``None`` marks a
    padding slot, which downloads nothing and yields nothing. With
    ``job.plan_key``, ``items`` is one ``(offset, length)`` span of the run's
    plan instead, and the batch's keys come from one ranged GET of it (the
    driver never ships the keys). The partition's JSON lines, sorted by key,
    are written to S3 as one gzip object of JSON Lines (:func:`part_key`) when
    ``job.parts_prefix`` is set, and ``blob`` is ``None``; otherwise ``blob``
    is the lines joined by newlines and zlib-compressed, for the caller.

    The steps, each a function below: configure the worker, read the batch's
    keys, start fetching, load the model, score as images arrive, write the
    lines, and report.
    """
    started, started_at, started_cpu = time.perf_counter(), time.time(), time.process_time()
    # First thing: MXNet reads its thread settings when it loads, and a handler may import it.
    threads = configure_threads(worker_threads(job.threads, job.thread_plan))
    handlers = get_handlers(job.handler)
    reader = utils.s3_reader(job.endpoint_url, job.region, max_attempts=job.s3_max_attempts,
                             max_pool_connections=max(10, job.io_threads + 2), kind=job.s3_reader)
    io_stats = utils.IOStats()
    keys = batch_keys(items, job, reader, io_stats)
    # Downloading and decoding start now, so a worker's first task fetches while MXNet
    # loads and the model comes in; later tasks find the model in this worker's cache.
    results = _prefetched(keys, partial(_fetch_and_decode, reader, job, handlers, io_stats=io_stats),
                          _pool(job.io_threads), max(job.max_in_flight, 1))
    scoring = Scoring(load_model(job, index, model_class(handlers)), job.top_k, handlers)
    for result in results:
        scoring.add(result)
    scoring.finish()
    write_started = time.perf_counter()
    blob = write_lines(job, index, reader.client, scoring.sorted_lines())
    scoring.timing["write"] = time.perf_counter() - write_started
    stats = TaskStats(
        partition=index, executor=f"{socket.gethostname()}/{os.getppid()}", worker_pid=os.getpid(),
        attempt=_task_attempt(), keys=len(keys), errors=scoring.errors,
        seconds={**{k: round(v, 4) for k, v in scoring.timing.items()},
                 "task": round(time.perf_counter() - started, 4), "cpu": round(time.process_time() - started_cpu, 4)},
        s3_retries={"request": io_stats.request_retries, "body": io_stats.body_retries},
        model_loads=state.counters.model_loads, started=started_at, ended=time.time(), threads=threads,
        host=host_share(job.thread_plan), worker_task=state.counters.tasks_run + 1, memory=memory_bytes(),
        error_kinds=scoring.error_kinds, top1=scoring.top1,
    )
    _task_done()
    log.info("partition %d: %d keys, %d errors in %.2fs", index, len(keys), sum(scoring.errors.values()),
             stats.seconds["task"])
    yield index, len(scoring.lines), blob, stats


def batch_keys(items: Iterable, job: JobSpec, reader: utils.ObjectReader, io_stats: utils.IOStats) -> list:
    """The batch's ``(key, size)`` pairs: read from the run's plan (``job.plan_key``), else ``items`` less padding."""
    if job.plan_key is None:
        return [item for item in items if item is not None]
    [(offset, length)] = list(items)
    plan = utils.read_object(reader.client, job.output_bucket, job.plan_key, stats=io_stats,
                             byte_range=(offset, length))
    return listing.read_plan_batch(plan)


def load_model(job: JobSpec, index: int, kind: type) -> Predictor:
    """This worker's model for the task's device, bound at the micro-batch; a failure raises :class:`ModelError`.

    Bound at the micro-batch: the first forward pass starts as soon as that
    many images are decoded, while the pool fetches the rest of the batch.
    """
    try:
        # The cache keys on the device, so each GPU of a worker gets its own module.
        spec = replace(job.model, context=task_context(job.model.context, index))
        return get_model(spec, job.preprocess.input_shape, job.forward_batch, kind)
    except Exception as exc:
        # Same message on every attempt, so the driver's error names the cause
        # (weights unreachable from the executors, corrupt, ...), not a stack.
        raise ModelError(f"executor {socket.gethostname()} cannot load the model {job.model.params_uri}: "
                         f"{type(exc).__name__}: {first_line(exc)}") from exc


class Scoring:
    """One batch's lines as its images arrive: decoded images are scored a micro-batch at a time.

    :meth:`add` takes each result of :func:`_fetch_and_decode` in key order:
    a failed download or decode becomes its error line at once; a decoded
    image waits for a full micro-batch (the model's bound batch), which then
    goes through one forward pass. :meth:`finish` scores the last, short one.
    ``timing`` sums each stage's seconds (download and decode over the pool's
    threads; forward and wait on this one), ``errors`` counts error lines by stage.
    """

    def __init__(self, model: Predictor, top_k: int, handlers: Handlers | None):
        self.model, self.top_k, self.handlers = model, top_k, handlers
        self.lines: list[tuple[str, str]] = []
        self.timing = {"download": 0.0, "decode": 0.0, "forward": 0.0, "wait": 0.0}
        self.errors = {"download": 0, "decode": 0, "predict": 0}
        #: For the run report: failed keys by ``stage/type`` with a few examples, predicted keys by top-1 label.
        self.error_kinds: dict[str, dict] = {}
        self.top1: dict[str, int] = {}
        self._keys: list[str] = []
        self._arrays: list[np.ndarray] = []
        self._waiting_since = time.perf_counter()

    def add(self, result: tuple) -> None:
        """One image's ``(key, array, failure, (download_s, decode_s))``."""
        self.timing["wait"] += time.perf_counter() - self._waiting_since
        key, array, failure, (download_s, decode_s) = result
        self.timing["download"] += download_s
        self.timing["decode"] += decode_s
        if failure is not None:
            stage, line = failure
            self.lines.append((key, line))
            self.errors[stage] += 1
            self._count_error(key, line)
        else:
            self._keys.append(key)
            self._arrays.append(array)
            if len(self._keys) == self.model.batch_size:
                self._forward()
        self._waiting_since = time.perf_counter()

    def finish(self) -> None:
        """Score the images still waiting (the last micro-batch)."""
        self.timing["wait"] += time.perf_counter() - self._waiting_since
        if self._keys:
            self._forward()

    def sorted_lines(self) -> list[str]:
        """The batch's lines, sorted by key."""
        return [line for _, line in sorted(self.lines)]

    def _forward(self) -> None:
        started = time.perf_counter()
        for key, line, failed in output_lines(self.model, self._keys, self._arrays, self.top_k, self.handlers):
            self.lines.append((key, line))
            self.errors["predict"] += failed
            if failed:
                self._count_error(key, line)
            elif self.handlers is None or self.handlers.output_handler is None:
                self._count_top1(line)
        self.timing["forward"] += time.perf_counter() - started
        self._keys, self._arrays = [], []


    def _count_error(self, key: str, line: str) -> None:
        error = json.loads(line)["error"]
        kind = self.error_kinds.setdefault(f"{error['stage']}/{error['type']}", {"count": 0, "examples": []})
        kind["count"] += 1
        if len(kind["examples"]) < ERROR_EXAMPLES:
            kind["examples"].append(key)

    def _count_top1(self, line: str) -> None:
        # Parsing the line back costs ~10 us a key, next to milliseconds of forward pass.
        top = json.loads(line)["predictions"]
        if top:
            label = str(top[0].get("label", top[0]["class_id"]))
            self.top1[label] = self.top1.get(label, 0) + 1


def write_lines(job: JobSpec, index: int, client, lines: list[str]) -> bytes | None:
    """Make the batch's lines durable under ``job.parts_prefix`` (returns ``None``), or return them compressed."""
    text = "\n".join(lines).encode("utf-8")
    if job.parts_prefix is None:
        return zlib.compress(text, 1)
    # Durable before Spark hears the task is done: a dead driver loses nothing
    # this task scored. gzip level 1: ~5x smaller for a fraction of a ms.
    client.put_object(Bucket=job.output_bucket, Key=part_key(job.parts_prefix, index),
                      Body=gzip.compress(text + b"\n" if text else text, compresslevel=1),
                      ContentType="application/gzip")
    return None


def _task_done() -> None:
    """Count the task; after a worker's first Spark task, its long-lived objects leave the GC's young generations."""
    state.counters.tasks_run += 1
    if state.counters.tasks_run == 1 and state.spark_task() is not None:
        freeze_long_lived()


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
                      *, io_stats: utils.IOStats):
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
