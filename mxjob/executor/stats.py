"""The tasks' stats: folded as tasks end into one Spark accumulator, whatever the number of tasks."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from mxjob.core import state
from mxjob.core.errors import first_line
from mxjob.executor.timeline import Timeline

log = logging.getLogger(__name__)

#: Example keys kept per kind of error (stage and exception type), for the report.
ERROR_EXAMPLES = 3
#: Kinds of error kept: a job fails in a handful of ways; past this many, the rarest are dropped.
MAX_ERROR_KINDS = 50
#: Top-1 labels counted: ImageNet has 1,000 classes. Past this many, the rarest half is dropped (the
#: counts of the most frequent labels, which the report shows, are exact unless a label kept was dropped once).
MAX_LABELS = 2000


class FirstTask(NamedTuple):
    """A Python worker's first task (its lowest task number), which pays the worker's MXNet import and model load."""

    #: The task's number in its worker (1 for a worker's first).
    number: int
    started: float
    ended: float
    keys: int
    #: The task's CPU seconds, every thread; ``None`` when not measured.
    cpu: float | None
    #: Of ``cpu``: the :data:`StatsFold.CPU_PARTS` (download and decode threads, the task's own thread), or ``None``.
    cpu_parts: tuple | None = None


@dataclass
class TaskStats:
    """What one task (one batch) did: :func:`mxjob.executor.partition.score_partition` makes one per task.

    Executors fold it into the job's accumulator (:class:`StatsFold`) at once;
    only folds travel to the driver.
    """

    #: The batch's index in the run.
    partition: int
    #: ``host/PID`` of the executor (the Python worker's parent).
    executor: str
    worker_pid: int
    #: The task's attempt number: 0 the first time, more after a lost worker or executor.
    attempt: int
    #: Keys in the batch.
    keys: int
    #: Failed keys by stage: ``download``, ``decode``, ``predict``.
    errors: dict
    #: Seconds in each of :data:`StatsFold.STAGES`; ``cpu`` is the worker's CPU seconds (all its threads).
    seconds: dict
    #: S3 attempts retried: ``request`` (botocore's) and ``body`` (a cut body read again).
    s3_retries: dict
    #: Models this worker had loaded by the task's end.
    model_loads: int
    #: Wall-clock start and end (``time.time()``).
    started: float
    ended: float
    #: MXNet/OpenMP threads in force in the worker, over all its lanes (``None``: MXNet's default).
    threads: int | None = None
    #: Forward passes the worker ran at once (``--forward-lanes``), each on ``threads // lanes`` threads.
    lanes: int = 1
    #: This host's ``cores`` and the Python ``workers`` the driver's plan put on it.
    host: dict = field(default_factory=dict)
    #: 1 for the worker's first task, 2 for its second, ...
    worker_task: int = 1
    #: The worker's ``rss`` and ``max_rss`` in bytes after the task.
    memory: dict = field(default_factory=dict)
    #: Failed keys by ``stage/type``: ``{"count": n, "examples": [key, ...]}`` (up to :data:`ERROR_EXAMPLES`).
    error_kinds: dict = field(default_factory=dict)
    #: Predicted keys by their top-1 label (or class id without labels); empty with an ``output_handler``.
    top1: dict = field(default_factory=dict)


class StatsFold:
    """The stats of every task of a job, folded as tasks finish: one entry per executor, worker and host.

    Its size grows with the cluster, not with the job: a job of ten million
    keys (156,000 tasks) holds no list of task stats anywhere. Executors fold
    their task's stats into a Spark accumulator (:class:`StatsAccumulator`),
    which the driver merges as each task ends; Spark applies a successful
    task's update once, also when the task was retried.
    """

    #: Of a task's ``cpu``, the CPU seconds of its download threads' GETs, of their decoding, and of the task's
    #: own thread (the model's load and Python side, results, the part); the rest is MXNet's threads: the forward
    #: (with several forward lanes, the lanes' threads too, and with them the model's Python side of each pass).
    CPU_PARTS = ("download_cpu", "decode_cpu", "task_thread_cpu")
    STAGES = ("download", "decode", "forward", "wait", "write", "task", "cpu", *CPU_PARTS)

    def __init__(self):
        self.tasks = 0
        self.keys = 0
        self.errors = {"download": 0, "decode": 0, "predict": 0}
        self.s3_retries = {"request": 0, "body": 0}
        #: Tasks whose result came from a retried attempt (lost worker or executor, ...).
        self.retried = 0
        #: Task attempts that failed (lost executor or worker): set on the driver from Spark's status tracker.
        self.lost_task_attempts: int | None = 0
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.executors: dict[str, dict] = {}
        self.workers: dict[str, dict] = {}
        self.hosts: dict[str, dict] = {}
        #: The tasks over time, per executor (the run report's charts).
        self.timeline = Timeline()
        self.error_kinds: dict[str, dict] = {}
        self.top1: dict[str, int] = {}
        #: The batch of each task folded in here, until the driver hands them on (:class:`StatsAccumulator`):
        #: a task's fold carries its one batch to the driver, whose own fold keeps none.
        self.finished_batches: list[int] = []

    @classmethod
    def of(cls, stats: Iterable[TaskStats]) -> StatsFold:
        """A fold of :class:`TaskStats`."""
        fold = cls()
        for s in stats:
            fold.add(s)
        return fold

    @classmethod
    def of_task(cls, s: TaskStats) -> StatsFold:
        """The fold of one task's stats: what an executor adds to the accumulator when the task ends."""
        fold = cls()
        fold.tasks, fold.keys, fold.retried = 1, s.keys, int(s.attempt > 0)
        fold.finished_batches = [s.partition]
        fold.errors = {k: s.errors[k] for k in fold.errors}
        fold.s3_retries = {k: s.s3_retries[k] for k in fold.s3_retries}
        fold.first_start, fold.last_end = s.started, s.ended
        fold.executors[s.executor] = {"batches": 1, "images": s.keys, **{k: s.seconds.get(k, 0.0) for k in cls.STAGES}}
        n, rss, max_rss = s.worker_task, s.memory.get("rss"), s.memory.get("max_rss")
        # The CPU parts, or None if the task did not measure them.
        parts = tuple(s.seconds[k] for k in cls.CPU_PARTS) if all(k in s.seconds for k in cls.CPU_PARTS) else None
        worker = {"batches": 1, "model_loads": s.model_loads, "last_task": n, "threads": s.threads, "lanes": s.lanes,
                  "last_rss": rss, "first": FirstTask(n, s.started, s.ended, s.keys, s.seconds.get("cpu"), parts),
                  "task_seconds": s.ended - s.started, "last_end": s.ended, "rss_after": {}}
        if max_rss:
            worker["max_rss"] = max_rss
        # Resident memory after the worker's 1st, 2nd, 5th, 10th, 20th, ... task: flat once warm, or it leaks.
        if rss is not None and str(n).strip("0") in ("1", "2", "5"):
            worker["rss_after"][n] = rss
        fold.workers[f"{s.executor}/{s.worker_pid}"] = worker
        fold.timeline.add(s.ended, s.executor, {"tasks": 1, "keys": s.keys, "errors": sum(s.errors.values()),
                                                **s.seconds})
        fold.error_kinds = {k: {"count": v["count"], "examples": list(v["examples"])} for k, v in s.error_kinds.items()}
        fold.top1 = dict(s.top1)
        if s.threads is not None and s.host.get("cores") is not None:
            fold.hosts[s.executor.rsplit("/", 1)[0]] = {"cores": s.host["cores"], "planned": s.host.get("workers") or 0,
                                                        "executors": {s.executor: s.threads}}
        return fold

    def add(self, s: TaskStats) -> StatsFold:
        """Fold in one task's stats (:meth:`merge` of :meth:`of_task`: one way to combine, for tasks and folds)."""
        return self.merge(StatsFold.of_task(s))

    def merge(self, other: StatsFold) -> StatsFold:
        """Fold in another fold (an executor's, when its task ends)."""
        self.tasks += other.tasks
        self.keys += other.keys
        for mine, theirs in ((self.errors, other.errors), (self.s3_retries, other.s3_retries)):
            for k in mine:
                mine[k] += theirs[k]
        self.retried += other.retried
        self.first_start = min(filter(None, (self.first_start, other.first_start)), default=None)
        self.last_end = max(filter(None, (self.last_end, other.last_end)), default=None)
        for name, o in other.executors.items():
            e = self.executors.setdefault(name, {"batches": 0, "images": 0, **dict.fromkeys(self.STAGES, 0.0)})
            for k, v in o.items():
                e[k] += v
        for name, o in other.workers.items():
            self._merge_worker(name, o)
        for name, o in other.hosts.items():
            h = self.hosts.setdefault(name, {"cores": o["cores"], "planned": 0, "executors": {}})
            h["planned"] = max(h["planned"], o["planned"])
            for executor, threads in o["executors"].items():
                h["executors"][executor] = max(h["executors"].get(executor, 0), threads)
        self.timeline.merge(other.timeline)
        self._merge_counts(other)
        self.finished_batches.extend(other.finished_batches)
        return self

    def _merge_counts(self, other: StatsFold) -> None:
        """Fold in the other fold's error kinds and top-1 labels, each bounded."""
        for kind, o in other.error_kinds.items():
            e = self.error_kinds.setdefault(kind, {"count": 0, "examples": []})
            e["count"] += o["count"]
            e["examples"] = (e["examples"] + [k for k in o["examples"] if k not in e["examples"]])[:ERROR_EXAMPLES]
        if len(self.error_kinds) > MAX_ERROR_KINDS:
            self.error_kinds = dict(sorted(self.error_kinds.items(), key=lambda kv: -kv[1]["count"])[:MAX_ERROR_KINDS])
        for label, count in other.top1.items():
            self.top1[label] = self.top1.get(label, 0) + count
        if len(self.top1) > MAX_LABELS:
            self.top1 = dict(sorted(self.top1.items(), key=lambda kv: -kv[1])[:MAX_LABELS // 2])

    def _merge_worker(self, name: str, o: dict) -> None:
        """Fold one Python worker's entry of another fold into this fold's entry for it."""
        w = self.workers.get(name)
        if w is None:
            self.workers[name] = {k: dict(v) if isinstance(v, dict) else v for k, v in o.items()}
            return
        # Every worker entry comes from of_task, so it has every key but max_rss.
        w["batches"] += o["batches"]
        w["model_loads"] = max(w["model_loads"], o["model_loads"])
        if o["last_task"] >= w["last_task"]:
            w["last_task"], w["threads"], w["last_rss"] = o["last_task"], o["threads"], o["last_rss"]
            w["lanes"] = o.get("lanes", 1)
        if o["first"].number < w["first"].number:
            w["first"] = o["first"]
        w["task_seconds"] += o["task_seconds"]
        w["last_end"] = max(w["last_end"], o["last_end"])
        if "max_rss" in o:
            w["max_rss"] = max(w.get("max_rss", 0), o["max_rss"])
        w["rss_after"].update(o["rss_after"])

    def worker_summary(self, name: str) -> dict:
        """One Python worker as the job's summary shows it."""
        w = self.workers[name]
        first = w["first"]
        # The first task includes importing MXNet and loading the model: steady state starts after it.
        first_task = {"started": first.started, "ended": first.ended, "images": first.keys, "cpu": first.cpu}
        if first.cpu_parts is not None:
            first_task.update(zip(self.CPU_PARTS, first.cpu_parts))
        # Then the seconds in tasks, and idle between them (Spark handing over the next task).
        out = {"batches": w["batches"], "model_loads": w["model_loads"], "threads": w["threads"],
               "lanes": w.get("lanes", 1), "first_task": first_task, "task_seconds": round(w["task_seconds"], 3),
               "idle_between_tasks_seconds": round(w["last_end"] - first.started - w["task_seconds"], 3)}
        if "max_rss" in w:
            out["max_rss_bytes"] = w["max_rss"]
        after = {str(k): v for k, v in sorted(w["rss_after"].items())}
        if w["last_rss"] is not None:
            after["last"] = w["last_rss"]
        out["rss_bytes_after_task"] = after
        return out


try:  # executors and the driver have pyspark; the library's other users may not
    from pyspark.accumulators import AccumulatorParam as _AccumulatorParam
except ImportError:  # pragma: no cover - without pyspark there is no accumulator to make
    _AccumulatorParam = object


class StatsAccumulator(_AccumulatorParam):
    """Spark accumulator type of a :class:`StatsFold`: ``sc.accumulator(StatsFold(), StatsAccumulator(run))``.

    On the driver, PySpark's accumulator server calls :meth:`addInPlace`
    with each finished task's fold as the update arrives (in its own thread,
    while Spark's scheduler waits for the acknowledgement). A task writes its
    part before its stats leave the executor, so its batch is durable by
    then: the batches go to whoever follows ``run`` on the driver
    (:data:`mxjob.core.state.durable_batches`, the live merge), and the driver's
    fold keeps none. The copy a task unpickles on an executor only folds that
    task's stats into the zero it starts from; it tells nobody.

    Parameters
    ----------
    run : tuple of (str, str), optional
        The run's output bucket and parts prefix (``JobSpec.output_bucket``, ``parts_prefix``).
    """

    def __init__(self, run: tuple[str, str] | None = None):
        self.run = run
        self._on_driver = True

    def __getstate__(self) -> dict:
        # What a task unpickles: the same run, and no driver to tell.
        return {"run": self.run, "_on_driver": False}

    def zero(self, value: StatsFold) -> StatsFold:
        return StatsFold()

    def addInPlace(self, value1: StatsFold, value2: StatsFold) -> StatsFold:
        merged = value1.merge(value2)
        if self._on_driver and merged.finished_batches:
            batches, merged.finished_batches = merged.finished_batches, []
            try:
                state.durable_batches.notify(self.run, batches)
            except Exception as exc:  # noqa: BLE001 - the stats must still be folded; the merge lists instead
                log.warning("the live merge missed batches %s (%s: %s); it finds them by listing",
                            batches, type(exc).__name__, first_line(exc))
        return merged
