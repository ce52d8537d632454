"""Progress while the Spark job runs: the ETA (a pure function), the progress line, and the ticks the report draws.

The ETA stays "estimating" until it means something: every executor has
finished a task (its first task includes loading the model, so before that the
rate says nothing about the steady state) and either 5% of the batches are done
or the tasks have run for 30 s. Then the rate is the steady one: keys finished
after each executor's first task, over the executors' time since then. Before
any executor has finished a second task, it is the rate since the first task
started, which counts the workers' start-up and so errs long, never short.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

#: Before this share of the batches is done (and :data:`MIN_SECONDS`), the ETA is "estimating".
MIN_FRACTION = 0.05
#: ... or before the tasks have run this long.
MIN_SECONDS = 30.0
#: The first progress line comes this soon, so a job of a few seconds prints one too.
FIRST_TICK_SECONDS = 5.0
#: The status file is refreshed at least this often, whatever --progress-seconds says.
STATUS_SECONDS = 60.0
#: Ticks the report keeps; past this, every other one is dropped (the first and the latest stay).
MAX_TICKS = 600


@dataclass(frozen=True)
class Progress:
    """Where the job stands at ``now``: what :func:`estimate_remaining` needs, and nothing from Spark."""

    now: float
    batches_done: int
    batches_total: int
    keys_done: int
    keys_total: int
    failed: int = 0
    #: The first task's start (epoch seconds); ``None`` before any task ended.
    first_start: float | None = None
    #: When each executor's first task ended (those that finished one).
    warm_ends: tuple = ()
    #: Keys those first tasks held.
    warm_keys: int = 0
    #: Executors the cluster should have (``None``: unknown, dynamic allocation).
    executors_expected: int | None = None


def estimate_remaining(p: Progress) -> float | None:
    """Seconds until the last batch ends, or ``None`` while it would be a guess ("estimating").

    Parameters
    ----------
    p : Progress
        The job's state at ``p.now``.

    Returns
    -------
    float or None
        ``0.0`` once every key is done; ``None`` until every expected executor
        has finished a task and 5% of the batches or 30 s of task time are done.

    Examples
    --------
    >>> estimate_remaining(Progress(now=100.0, batches_done=50, batches_total=100, keys_done=500,
    ...                             keys_total=1000, first_start=50.0, warm_ends=(55.0,), warm_keys=10))
    45.0
    """
    left = p.keys_total - p.keys_done
    if left <= 0:
        return 0.0
    if not _meaningful(p):
        return None
    rate = _steady_rate(p) or p.keys_done / max(p.now - p.first_start, 1e-9)
    return left / rate if rate > 0 else None


def _meaningful(p: Progress) -> bool:
    if not p.batches_done or p.first_start is None:
        return False
    wanted = min(p.executors_expected or 1, p.batches_total)
    if len(p.warm_ends) < wanted:
        return False
    return p.batches_done >= MIN_FRACTION * p.batches_total or p.now - p.first_start >= MIN_SECONDS


def _steady_rate(p: Progress) -> float | None:
    """Keys a second once warm: keys after the first tasks over the executors' seconds since theirs ended."""
    busy = sum(max(0.0, p.now - end) for end in p.warm_ends)
    after = p.keys_done - p.warm_keys
    return after / busy * len(p.warm_ends) if busy > 0 and after > 0 else None


def progress_of(fold, now: float, batches: int, keys: int, executors: int | None) -> Progress:
    """The :class:`Progress` of a :class:`mxjob.executor.stats.StatsFold` at ``now``."""
    firsts: dict[str, tuple] = {}
    for name, w in fold.workers.items():
        executor, first = name.rsplit("/", 1)[0], w["first"]
        if first.number == 1 and (executor not in firsts or first.ended < firsts[executor][0]):
            firsts[executor] = (first.ended, first.keys)
    return Progress(now=now, batches_done=fold.tasks, batches_total=batches, keys_done=fold.keys, keys_total=keys,
                    failed=sum(fold.errors.values()), first_start=fold.first_start,
                    warm_ends=tuple(e for e, _ in firsts.values()), warm_keys=sum(k for _, k in firsts.values()),
                    executors_expected=executors)


def duration(seconds: float | None) -> str:
    """``1h05m``, ``3m07s`` or ``12s``; "estimating" for ``None``."""
    if seconds is None or math.isnan(seconds):
        return "estimating"
    hours, rest = divmod(round(seconds), 3600)
    if hours:
        return f"{hours}h{rest // 60:02d}m"
    return f"{rest // 60}m{rest % 60:02d}s" if rest >= 60 else f"{rest}s"


def iso(epoch: float | None) -> str | None:
    """Local time as ISO 8601 with its offset, to the second (``None`` stays ``None``)."""
    return None if epoch is None else time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(epoch))


@dataclass(frozen=True)
class Tick:
    """One progress sample: the report's "done over time" chart and its ETA as predicted then."""

    time: float
    batches: int
    keys: int
    failed: int
    #: Keys a second since the previous tick.
    recent_rate: float
    #: Seconds left as estimated then (``None``: estimating), and the finish time it predicted.
    eta_seconds: float | None
    predicted_end: float | None


class Ticks:
    """The ticks of a run, bounded: past :data:`MAX_TICKS` every other one is dropped, the first and latest kept."""

    def __init__(self):
        self.items: list[Tick] = []
        self._lock = threading.Lock()

    def add(self, tick: Tick) -> None:
        with self._lock:
            self.items.append(tick)
            if len(self.items) > MAX_TICKS:
                self.items = self.items[:1] + self.items[2:-1:2] + self.items[-1:]

    def as_list(self) -> list[dict]:
        with self._lock:
            return [asdict(t) for t in self.items]


def progress_line(p: Progress, tick: Tick, interval: float) -> str:
    """The driver's progress line: done, images, failed, two rates, the ETA ("estimating" until meaningful)."""
    overall = p.keys_done / (p.now - p.first_start) if p.first_start and p.now > p.first_start else 0.0
    end = f" (at {iso(tick.predicted_end)})" if tick.predicted_end is not None and tick.eta_seconds else ""
    left = "done" if p.keys_done >= p.keys_total else (
        "ETA estimating" if tick.eta_seconds is None else f"about {duration(tick.eta_seconds)} left{end}")
    return (f"progress: {p.batches_done} of {p.batches_total} batches done "
            f"({100.0 * p.batches_done / max(p.batches_total, 1):.0f}%), {p.keys_done} of {p.keys_total} images, "
            f"{p.failed} failed; {tick.recent_rate:.1f} images/s in the last {interval:.0f} s, {overall:.1f} since "
            f"the first task started; {left}")


class Reporter:
    """The driver's progress thread: a line every ``every`` seconds, a tick (and ``on_tick``) at least every minute.

    Parameters
    ----------
    read_fold : callable
        Returns the job's :class:`mxjob.executor.stats.StatsFold` so far (the accumulator's value).
    batches, keys : int
        The run's totals.
    every : float
        ``--progress-seconds``.
    executors : int or None
        Executors expected (:func:`mxjob.run.cluster.expected_executors`).
    on_tick : callable, optional
        Called with ``(fold, progress, tick)`` after each tick (the status file and the report).
    ticks : Ticks, optional
        Where the ticks go (the report's); a new one by default.
    """

    def __init__(self, read_fold: Callable, batches: int, keys: int, every: float, executors: int | None,
                 on_tick: Callable | None = None, ticks: Ticks | None = None):
        self.read_fold, self.batches, self.keys, self.every = read_fold, batches, keys, every
        self.executors, self.on_tick = executors, on_tick
        self.ticks = ticks if ticks is not None else Ticks()
        self._last, self._last_line = (time.time(), 0), 0.0

    def run(self, stop: threading.Event) -> None:
        """Tick until ``stop`` is set: first after :data:`FIRST_TICK_SECONDS`, then every ``min(every, 60)``."""
        wait = min(FIRST_TICK_SECONDS, self.every)
        while not stop.wait(wait):
            try:
                self.tick()
            except RuntimeError as exc:
                # Spark merges a finished task's stats into the fold in another thread while this one reads
                # it ("dictionary changed size during iteration"): the next tick reads it again.
                log.debug("progress tick skipped: %s", exc)
            wait = min(self.every, STATUS_SECONDS)

    def tick(self, final: bool = False) -> tuple:
        """Sample the fold now; log the line when due (always if ``final``); return ``(fold, progress, tick)``."""
        fold, now = self.read_fold(), time.time()
        p = progress_of(fold, now, self.batches, self.keys, self.executors)
        last_time, last_keys = self._last
        eta = estimate_remaining(p)
        tick = Tick(time=now, batches=p.batches_done, keys=p.keys_done, failed=p.failed,
                    recent_rate=(p.keys_done - last_keys) / max(now - last_time, 1e-9), eta_seconds=eta,
                    predicted_end=now + eta if eta is not None else None)
        self.ticks.add(tick)
        if final or now - self._last_line >= self.every - 0.5:
            log.info("%s", progress_line(p, tick, now - last_time))
            self._last_line = now
        self._last = (now, p.keys_done)
        if self.on_tick is not None:
            self.on_tick(fold, p, tick)
        return fold, p, tick
