"""Per-process state of a Python worker, all of it in this one module.

A module is imported once per Python worker, and with
``spark.python.worker.reuse=true`` (Spark's default) that worker runs every
later task of its executor. What is kept here is paid for by a worker's first
task and reused by the others: the bound models, the handler files, the
download pools, the S3 clients and readers, the thread setting MXNet loaded
with, and the counters the summary reports. On the driver it also holds who hears that a
run's batches are durable (:data:`durable_batches`). Spark's ``pyspark.ml.model_cache`` and mlflow's
``spark_model_cache`` keep their models the same way, in a module of their
own rather than in the job script, which Spark would pickle and ship instead.

Every cache is a :class:`ProcessCache`: keyed, locked, bounded, and evicting
the least recently used entry. Its capacity is named, with the reason for it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any


class _Bounded:
    """Entries by key, in the order of their last use, under one lock: what a cache and a listener table share."""

    def __init__(self, name: str, capacity: int):
        if capacity < 1:
            raise ValueError(f"{name}: capacity must be at least 1, got {capacity}")
        self.name, self.capacity = name, capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries


class ProcessCache(_Bounded):
    """A keyed, locked, bounded cache; the least recently used entry goes first.

    Parameters
    ----------
    name : str
        What it holds, for messages.
    capacity : int
        Entries kept; adding one more evicts the least recently used.
    on_evict : callable, optional
        Called with an evicted value (a thread pool is shut down, say).
    """

    def __init__(self, name: str, capacity: int, on_evict: Callable[[Any], None] | None = None):
        super().__init__(name, capacity)
        self._on_evict = on_evict

    def get(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value for ``key``, made by ``make()`` on first use.

        ``make`` runs under the lock, so two threads of one worker asking for
        the same model load it once, not twice. If it raises, nothing is kept.
        """
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
            value = make()
            self._entries[key] = value
            while len(self._entries) > self.capacity:
                _, evicted = self._entries.popitem(last=False)
                if self._on_evict is not None:
                    self._on_evict(evicted)
            return value

    def clear(self) -> None:
        """Forget every entry (without calling ``on_evict``)."""
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


#: Bound modules a worker keeps. An executor serves one job, which needs one
#: module per device its worker uses: ``--context gpu`` spreads a worker's
#: tasks over the GPUs it sees, and nodes have up to 4 (8 on the largest, which
#: then reload at most once per task). On the CPU a job needs one per forward
#: lane (``--forward-lanes``, 4 at most by default); a notebook that changes the
#: batch size or the checkpoint keeps its last ones.
MAX_MODELS = 8
#: Handler files a worker keeps imported: a job has one (``--handler``).
MAX_HANDLERS = 4
#: Download pools a worker keeps, by thread count: a job uses one size.
MAX_POOLS = 2

#: S3 clients a process keeps, by their settings and purpose (``clients.cached_client``): a job's
#: driver and workers use three or four (the plain one, the lean reader's own, its retries', the model's).
MAX_S3_CLIENTS = 8
#: Object readers (``object_reader.s3_reader``): one per client and ``--s3-reader`` choice.
MAX_S3_READERS = 4

models = ProcessCache("models", MAX_MODELS)
handlers = ProcessCache("handlers", MAX_HANDLERS)
#: --plugin files a process has imported (``mxjob.core.plugins.load``): a job has a few.
plugins = ProcessCache("plugins", MAX_HANDLERS)
pools = ProcessCache("download pools", MAX_POOLS, on_evict=lambda pool: pool.shutdown(wait=False))
#: Forward-lane pools a worker keeps, by lane count (``mxjob.executor.partition``): a job uses one.
lane_pools = ProcessCache("forward-lane pools", MAX_POOLS, on_evict=lambda pool: pool.shutdown(wait=False))
s3_clients = ProcessCache("S3 clients", MAX_S3_CLIENTS)
#: The boto3 session the cached S3 clients are made from (``clients.cached_client``), one per process id.
s3_sessions = ProcessCache("S3 sessions", 1)
s3_readers = ProcessCache("S3 readers", MAX_S3_READERS)
#: Iceberg catalogs the driver keeps (``mxjob.outputs.iceberg_run.catalog_of``): a run writes one table.
catalogs = ProcessCache("Iceberg catalogs", 2)


class Listeners(_Bounded):
    """Who in this process hears of something, one listener per key: keyed, locked and bounded like the caches.

    :meth:`notify` calls the key's listener outside the lock (a listener takes
    locks of its own), and does nothing for a key nobody listens to.

    Parameters
    ----------
    name : str
        What is heard, for messages.
    capacity : int
        Keys kept; listening to one more forgets the oldest (a listener nobody forgot).
    """

    def listen(self, key: Hashable, listener: Callable) -> None:
        """``listener(*args)`` hears every :meth:`notify` of ``key`` from now on, in place of any other."""
        with self._lock:
            self._entries[key] = listener
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def forget(self, key: Hashable, listener: Callable) -> None:
        """``listener`` hears no more of ``key`` (a later listener of the same key stays)."""
        with self._lock:
            if self._entries.get(key) == listener:  # equal, not identical: each ``obj.method`` is a new object
                del self._entries[key]

    def notify(self, key: Hashable, *args) -> bool:
        """Tell ``key``'s listener; whether there was one."""
        with self._lock:
            listener = self._entries.get(key)
        if listener is None:
            return False
        listener(*args)
        return True


#: Runs whose durable batches a driver follows at once. A driver follows the one run Spark is scoring
#: (its live merge, ``mxjob.outputs.merge.LiveRun``); a notebook or a test may start a few without forgetting them.
MAX_FOLLOWED_RUNS = 4

#: The driver's live merge of a run, keyed by the run's ``(output bucket, parts prefix)``, hears the batches whose
#: tasks' stats reached the driver (``mxjob.executor.stats.StatsAccumulator``): a task writes its part before its stats
#: leave the executor, so those batches are durable. Executors never notify it.
durable_batches = Listeners("durable batches", MAX_FOLLOWED_RUNS)


@dataclass
class Counters:
    """What this process has done, for the summary and for tests that prove reuse."""

    #: Models this process has loaded (a reused worker loads once).
    model_loads: int = 0
    #: Seconds the last of them took to load and bind (``mxjob.model.predictor.get_model``); ``None``: none loaded.
    model_load_seconds: float | None = None
    #: Tasks this Python worker has run; the summary plots its memory against it.
    tasks_run: int = 0
    #: Whether MXNet's threads were set (``mxjob.model.worker.configure_threads``), and to what:
    #: ``None`` is MXNet's own default, when it was loaded before the setting could apply.
    threads_set: bool = False
    threads: int | None = None
    #: Forward passes the worker runs at once (``mxjob.model.worker.worker_lanes``), each on ``threads // lanes``.
    lanes: int = 1
    #: Seconds the first ``import mxnet`` took in this process (``mxjob.model.worker.import_mxnet``);
    #: ``None``: not timed.
    mxnet_import_seconds: float | None = None
    #: Why the lean listing fell back to botocore's parser, once said (``mxjob.inputs.listing``); ``None``: not said.
    listing_fallback: str | None = None
    #: SparkContexts this driver started (``mxjob.run.cluster``): a cluster-mode driver that started none starts one
    #: before it exits (:func:`mxjob.run.cluster.satisfy_application_master`).
    spark_contexts: int = 0


counters = Counters()


def clear() -> None:
    """Forget the loaded models and handlers: the next use loads them again (tests, notebooks)."""
    models.clear()
    handlers.clear()


def spark_task():
    """The running Spark task's ``TaskContext``; ``None`` on the driver or without Spark."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the library used without Spark installed
        return None
    return TaskContext.get()
