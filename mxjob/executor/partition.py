"""One partition of the job: download, decode and score one batch; write its results to S3.

:func:`score_partition` is what each Spark task runs. A partition holds one
batch: the task reads its keys from the run's batch list (one ranged GET), fetches
and decodes the images on a thread pool while the model loads or scores the
previous micro-batch, and writes the batch's results, one record batch sorted
by key (:mod:`mxjob.results.results`), to S3 as one Arrow IPC part before Spark hears
the task is done (:func:`part_key`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, NamedTuple

import pyarrow as pa

from mxjob import tasks
from mxjob.core import constants, plugins, state
from mxjob.core.errors import error_object, first_line
from mxjob.executor.stats import ERROR_EXAMPLES, StatsFold, TaskStats
from mxjob.inputs import batch_list
from mxjob.model import worker
from mxjob.model.device import task_context
from mxjob.model.handlers import Handlers, get_handlers
from mxjob.model.predictor import ModelError, ModelSpec, Predictor, get_model
from mxjob.model.preprocess import Preprocess
from mxjob.results import part_format, results
from mxjob.s3 import object_reader, reads
from mxjob.tasks import Task

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class _JobSpecBase:
    """Everything an executor needs, as plain values (pickled once per task).

    Besides the fields below, one field per executor setting
    (:data:`mxjob.options.settings.SETTINGS` with ``to="executor"``: ``batch_size``,
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
    plugins : tuple of str
        The driver's local copies of the --plugin files, shipped the same way;
        a task imports them first (their tasks are registered then).
    host_threads : HostThreads, optional
        Where the workers run, from the driver (``mxjob.run.cluster.host_threads``); ``None`` outside a Spark job.
    output_bucket, parts_prefix : str, optional
        Where each batch's results become durable: ``s3://output_bucket/parts_prefix``
        (see :func:`part_key`). ``None``: the part travels back to the caller instead.
    batches_key : str, optional
        The run's batch list in ``output_bucket`` (``batch_list.write_batches``): when set, a
        partition holds one ``(offset, length)`` span and the task reads its keys from there.
    json_lines : bool
        Each part holds its rows' rendered JSON lines (``part_format.write_part``):
        the output is JSON Lines. False for Parquet, which never reads them.
    """

    model: ModelSpec
    preprocess: Preprocess
    bucket: str
    handler: str | None = None
    plugins: tuple = ()
    host_threads: worker.HostThreads | None = None
    output_bucket: str | None = None
    parts_prefix: str | None = None
    batches_key: str | None = None
    json_lines: bool = True

    @property
    def forward_batch(self) -> int:
        """The module's bound batch: ``micro_batch_size``, never more than ``batch_size``."""
        return max(1, min(self.micro_batch_size or self.batch_size, self.batch_size))


def job_spec_class(names: Sequence[str], defaults) -> type:
    """``JobSpec``: :class:`_JobSpecBase`'s fields, then one per executor setting in ``names``, ``defaults``' value.

    ``names`` and ``defaults`` are :mod:`mxjob.core.constants`' ``EXECUTOR_SETTINGS``
    and ``DEFAULT``, generated from :data:`mxjob.options.settings.SETTINGS`: a setting
    declared there with ``to="executor"`` is a field here, and an executor
    imports no option table. Made importable as ``mxjob.executor.partition.JobSpec``,
    so that it pickles to the executors.
    """
    cls = dataclasses.make_dataclass(
        "JobSpec", [(name, Any, dataclasses.field(default=getattr(defaults, name))) for name in names],
        bases=(_JobSpecBase,), frozen=True, namespace={"__doc__": _JobSpecBase.__doc__})
    cls.__module__ = __name__
    return cls


JobSpec = job_spec_class(constants.EXECUTOR_SETTINGS, constants.DEFAULT)


def part_key(parts_prefix: str, index: int) -> str:
    """The S3 key of batch ``index``'s part under a run's ``parts_prefix``.

    A batch always writes the same key, so a retried or speculative task
    replaces the object (S3 PUTs are atomic) instead of adding a second copy.
    """
    return f"{parts_prefix}part-{index:08d}.arrows.zst"


def score_partition(index: int, items: Iterable, job: JobSpec) -> Iterator[tuple]:
    """Score one partition (one batch); yields a single ``(index, count, blob, stats)``.

    ``count`` is the number of rows the batch made (one per key), ``stats`` a
    :class:`TaskStats`. ``items`` are ``(key, size)`` pairs; ``None`` marks a
    padding slot, which downloads nothing and yields nothing. With
    ``job.batches_key``, ``items`` is one ``(offset, length)`` span of the run's
    plan instead, and the batch's keys come from one ranged GET of it (the
    driver never ships the keys). The partition's results, one record batch
    sorted by key (:mod:`mxjob.results.results`), are written to S3 as one part
    (:func:`part_key`, :func:`part_format.write_part`) when ``job.parts_prefix``
    is set, and ``blob`` is ``None``; otherwise ``blob`` is the part's bytes,
    for the caller (:func:`part_format.read_part`).

    The steps, each a function below: configure the worker, read the batch's
    keys, start fetching, load the model, score as images arrive, write the
    part, and report.
    """
    started, started_at, started_cpu = time.perf_counter(), time.time(), time.process_time()
    started_thread_cpu = time.thread_time()
    # First thing: MXNet reads its thread settings when it loads, and a handler may import it.
    threads, lanes = worker.configure_threads(*_threads_and_lanes(job))
    handlers = get_handlers(job.handler)
    task = job_task(job, handlers)
    reader = object_reader.s3_reader(job.endpoint_url, job.region, max_attempts=job.s3_max_attempts,
                             max_pool_connections=max(10, job.io_threads + 2), kind=job.s3_reader)
    io_stats = reads.IOStats()
    keys = batch_keys(items, job, reader, io_stats)
    # --with-object-metadata: each object's ETag and length as its GET read them, {key: (etag, size)}.
    seen: dict | None = {} if job.with_object_metadata else None
    # Downloading and decoding start now, so a worker's first task fetches while MXNet
    # loads and the model comes in; later tasks find the model in this worker's cache.
    fetch = partial(_fetch_and_decode, reader, job, decoder(job, task, handlers), io_stats=io_stats, seen=seen)
    fetched = _prefetched(keys, fetch, _pool(state.pools, job.io_threads, "fetch"), max(job.max_in_flight, 1))
    scoring = Scoring([load_model(job, index, task.model_class, lane) for lane in range(lanes)], job, task)
    for result in fetched:
        scoring.add(result)
    scoring.finish()
    batch = scoring.results.record_batch()
    write_started = time.perf_counter()
    blob = write_results(job, task, index, reader.client, batch, seen)
    scoring.timing["write"] = time.perf_counter() - write_started
    stats = TaskStats(
        partition=index, executor=f"{socket.gethostname()}/{os.getppid()}", worker_pid=os.getpid(),
        attempt=_task_attempt(), keys=len(keys), errors=scoring.errors, worker_task=state.counters.tasks_run + 1,
        seconds={**{k: round(v, 4) for k, v in scoring.timing.items()},
                 "task": round(time.perf_counter() - started, 4), "cpu": round(time.process_time() - started_cpu, 4),
                 "task_thread_cpu": round(time.thread_time() - started_thread_cpu, 4)},
        s3_retries={"request": io_stats.request_retries, "body": io_stats.body_retries},
        model_loads=state.counters.model_loads, started=started_at, ended=time.time(), threads=threads, lanes=lanes,
        host=worker.host_share(job.host_threads), memory=worker.memory_bytes(),
        error_kinds=results.error_kinds(batch, ERROR_EXAMPLES), top1=task.top_labels(batch))
    _task_done()
    log.info("partition %d: %d keys, %d errors in %.2fs", index, len(keys), sum(scoring.errors.values()),
             stats.seconds["task"])
    yield index, len(scoring.results), blob, stats


def batch_keys(items: Iterable, job: JobSpec, reader: object_reader.ObjectReader, io_stats: reads.IOStats) -> list:
    """The batch's ``(key, size)`` pairs: read from the run's batch list (``job.batches_key``), else ``items`` less
    padding."""
    if job.batches_key is None:
        return [item for item in items if item is not None]
    [(offset, length)] = list(items)
    return batch_list.read_batch(reads.read_object(reader.client, job.output_bucket, job.batches_key,
                                                   stats=io_stats, byte_range=(offset, length)))


def _threads_and_lanes(job: JobSpec) -> tuple[int, int]:
    """This worker's MXNet threads in all and its forward lanes (``--threads``, ``--forward-lanes``)."""
    threads = worker.worker_threads(job.threads, job.host_threads)
    gpu = str(job.model.context).startswith("gpu")
    return threads, worker.worker_lanes(job.forward_lanes, threads, gpu=gpu, handlers=job.handler is not None)


def load_model(job: JobSpec, index: int, kind: type, lane: int = 0) -> Predictor:
    """This worker's model for the task's device, bound at the micro-batch; a failure raises :class:`ModelError`.

    Bound at the micro-batch: the first forward pass starts as soon as that
    many images are decoded, while the pool fetches the rest of the batch.
    ``lane`` > 0: another bound copy, for forward passes at the same time.
    """
    try:
        # The cache keys on the device, so each GPU of a worker gets its own module.
        spec = replace(job.model, context=task_context(job.model.context, index))
        return get_model(spec, job.preprocess.input_shape, job.forward_batch, kind, lane=lane)
    except Exception as exc:
        # Same message on every attempt, so the driver's error names the cause
        # (weights unreachable from the executors, corrupt, ...), not a stack.
        raise ModelError(f"executor {socket.gethostname()} cannot load the model {job.model.params_uri}: "
                         f"{type(exc).__name__}: {first_line(exc)}") from exc


class Scoring:
    """One batch's results as its images arrive: decoded images are scored a micro-batch at a time.

    :meth:`add` takes each result of :func:`_fetch_and_decode` in key order:
    a failed download or decode becomes its error row at once; a decoded
    image waits for a full micro-batch (the model's bound batch), which then
    goes through one forward pass. :meth:`finish` scores the last, short one.
    With several ``models`` (forward lanes, bound copies of one model), each
    micro-batch goes to the next lane on a thread of its own, so that up to
    that many forward passes run at once; a lane's rows join ``results``
    when it is done. ``results`` holds the rows (:class:`results.Results`);
    ``timing`` sums each stage's seconds (download and decode over the pool's
    threads; forward over the lanes, and wait on this thread), ``errors``
    counts error rows by stage.
    """

    def __init__(self, models: list[Predictor], job: JobSpec, task: Task):
        self.models, self.job, self.task = list(models), job, task
        self.model = self.models[0]
        self.results = task.results(task.result_schema(job, self.model))
        self.timing = dict.fromkeys(("forward", "wait", *FetchTimes._fields), 0.0)
        self.errors = {"download": 0, "decode": 0, "predict": 0}
        self._keys, self._inputs = [], []  # the micro-batch waiting for its forward pass
        self._waiting_since = time.perf_counter()
        self._lanes = _pool(state.lane_pools, len(self.models), "lane") if len(self.models) > 1 else None
        self._running: deque = deque()  # (future, its Results), oldest first; at most one per lane
        self._passes = 0

    def add(self, result: tuple) -> None:
        """One image's ``(key, input, failure, times)``, ``times`` a :class:`FetchTimes`."""
        self.timing["wait"] += time.perf_counter() - self._waiting_since
        key, decoded, failure, times = result
        for name, seconds in zip(times._fields, times):
            self.timing[name] += seconds
        if failure is not None:
            stage, error = failure
            self.results.fail(key, error)
            self.errors[stage] += 1
        else:
            self._keys.append(key)
            self._inputs.append(decoded)
            if len(self._keys) == self.model.batch_size:
                self._forward()
        self._waiting_since = time.perf_counter()

    def finish(self) -> None:
        """Score the images still waiting (the last micro-batch), and wait for every lane."""
        self.timing["wait"] += time.perf_counter() - self._waiting_since
        if self._keys:
            self._forward()
        while self._running:
            self._collect()

    def _forward(self) -> None:
        model = self.models[self._passes % len(self.models)]
        self._passes += 1
        keys, inputs, self._keys, self._inputs = self._keys, self._inputs, [], []
        if self._lanes is None:
            self._add(self._score(model, keys, inputs, self.results))
            return
        out = self.task.results(self.results.schema)
        self._running.append((self._lanes.submit(self._score, model, keys, inputs, out), out))
        # The next pass goes to the oldest running one's lane: wait for it once every lane is busy.
        while len(self._running) >= len(self.models):
            self._collect()

    def _score(self, model, keys, inputs, out: results.Results) -> tuple[float, int]:
        """Score one micro-batch into ``out``: its seconds and its failed keys."""
        started, failed = time.perf_counter(), out.errors
        self.task.score(model, keys, inputs, self.job, out)
        return time.perf_counter() - started, out.errors - failed

    def _collect(self) -> None:
        future, out = self._running.popleft()
        self._add(future.result())
        self.results.extend(out)

    def _add(self, scored: tuple[float, int]) -> None:
        seconds, failed = scored
        self.timing["forward"] += seconds
        self.errors["predict"] += failed


def job_task(job: JobSpec, handlers: Handlers | None = None) -> Task:
    """The task that serves ``job`` (``--task``, its ``--handler``'s; :meth:`Task.with_handlers`), its ``--plugin``
    files imported first: a plug-in's task is registered then."""
    plugins.load(job.plugins)
    return tasks.get(job.task).with_handlers(handlers if handlers is not None else get_handlers(job.handler))


def write_results(job: JobSpec, task: Task, index: int, client, batch: pa.RecordBatch,
                  seen: dict | None = None) -> bytes | None:
    """Make the batch's part durable under ``job.parts_prefix`` (returns ``None``), or return the part's bytes.

    ``seen``: the objects' ETags and lengths (``{key: (etag, size)}``), written into the part as
    :data:`results.OBJECT_METADATA`.
    """
    metadata = None if seen is None else part_format.object_metadata(batch.column("key").to_pylist(), seen)
    data = task.write_part(batch, job.json_lines, metadata)
    if job.parts_prefix is None:
        return data
    # Durable before Spark hears the task is done: a dead driver loses nothing this task scored. One PUT: atomic.
    client.put_object(Bucket=job.output_bucket, Key=part_key(job.parts_prefix, index), Body=data,
                      ContentType="application/vnd.apache.arrow.stream", ContentEncoding="zstd")
    return None


def _task_done() -> None:
    """Count the task; after a worker's first Spark task, its long-lived objects leave the GC's young generations."""
    state.counters.tasks_run += 1
    if state.counters.tasks_run == 1 and state.spark_task() is not None:
        worker.freeze_long_lived()


def score_into(index: int, items: Iterable, job: JobSpec, stats) -> Iterator[int]:
    """:func:`score_partition`, with its stats added to the accumulator ``stats``; yields the keys it scored."""
    for _, _, _, task_stats in score_partition(index, items, job):
        stats.add(StatsFold.of_task(task_stats))
        yield task_stats.keys


# ----------------------------------------------------------------------------
# What the runner calls


def _pool(pools, threads: int, prefix: str) -> ThreadPoolExecutor:
    """This worker's pool of ``threads`` threads named ``prefix``, kept in ``pools``: :data:`mxjob.core.state.pools`
    (downloads) or :data:`mxjob.core.state.lane_pools` (one thread per forward lane)."""
    return pools.get(threads, lambda: ThreadPoolExecutor(threads, thread_name_prefix=prefix))


def decoder(job: JobSpec, task: Task, handlers: Handlers | None):
    """``decode(key, data)``: the ``--handler``'s ``input_handler`` if it has one, else the task's decoding."""
    if handlers is not None and handlers.input_handler is not None:
        return lambda key, data: handlers.decode(key, data, job.preprocess.input_shape)
    return lambda key, data: task.decode(data, job.preprocess)


def _fetch_and_decode(reader: object_reader.ObjectReader, job: JobSpec, decode, key: str, size: int,
                      *, io_stats: reads.IOStats, seen: dict | None = None):
    """Download and decode one object with ``decode`` (:func:`decoder`).

    Returns ``(key, input, None, times)``, or ``(key, None, (stage, error object), times)``, ``times`` a
    :class:`FetchTimes` (this thread's CPU included: the in-job split of a worker's CPU). The input is
    the array, or for ``--task detect`` ``(array, geometry)`` (:func:`decode_image_geometry`).
    ``seen``, a dict, gets ``seen[key] = (etag, length)`` of a downloaded object.
    """
    started, started_cpu = time.perf_counter(), time.thread_time()

    def failed(stage, exc, times):
        return key, None, (stage, error_object(stage, exc)), times

    if size is not None and size > job.max_object_bytes:
        return failed("download", reads.too_large(size, job.max_object_bytes), FetchTimes())
    try:
        # Also checked from the GET's Content-Length: a manifest may not give sizes (size -1).
        headers = None if seen is None else {}
        data = reader.read(job.bucket, key, stats=io_stats, max_bytes=job.max_object_bytes, seen=headers)
    except Exception as exc:  # noqa: BLE001 - every download failure becomes this key's error line
        return failed("download", exc, FetchTimes(time.perf_counter() - started, 0.0,
                                                  time.thread_time() - started_cpu, 0.0))
    if seen is not None:
        seen[key] = (headers.get("etag"), len(data))  # one key per thread: a dict's item assignment is atomic
    downloaded, downloaded_cpu = time.perf_counter(), time.thread_time()
    try:
        array = decode(key, data)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this image's, not the batch's
        return failed("decode", exc, _times(started, downloaded, started_cpu, downloaded_cpu))
    return key, array, None, _times(started, downloaded, started_cpu, downloaded_cpu)


class FetchTimes(NamedTuple):
    """One image's seconds in :func:`_fetch_and_decode`: wall clock and its thread's CPU, download and decoding.

    Each field is also the name of the :class:`Scoring` timing it adds to.
    """

    download: float = 0.0
    decode: float = 0.0
    download_cpu: float = 0.0
    decode_cpu: float = 0.0


def _times(started: float, downloaded: float, started_cpu: float, downloaded_cpu: float) -> FetchTimes:
    """The :class:`FetchTimes` of an image downloaded at ``downloaded`` (``downloaded_cpu``) and decoded until now."""
    return FetchTimes(downloaded - started, time.perf_counter() - downloaded,
                      downloaded_cpu - started_cpu, time.thread_time() - downloaded_cpu)


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


def warm_worker(index: int, job: JobSpec) -> list[Predictor]:
    """Ready this Python worker for the run's tasks: its threads set, MXNet imported, the model in its cache.

    What :func:`score_partition` does first, without a batch: the run's tasks
    then find the model loaded (the worker is reused between tasks). Runs in
    the warm-up job's task (:func:`mxjob.executor.model_check.warm_and_check`); returns
    each forward lane's copy of the model.
    """
    _, lanes = worker.configure_threads(*_threads_and_lanes(job))
    kind = job_task(job).model_class
    return [load_model(job, index, kind, lane) for lane in range(lanes)]
