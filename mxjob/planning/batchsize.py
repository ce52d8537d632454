"""``--batch-size auto``: the batch that makes Spark's per-task cost a small share of every task.

A batch is one Spark task. Each task costs Spark about
:data:`mxjob.planning.estimate.TASK_OVERHEAD_SECONDS` beyond its own work (scheduling,
the task's closure, the Python worker's hand-over, the plan's ranged GET and
the part's PUT), whatever its size; at 64 images of a fast model that is a
large share of the task. :func:`choose_batch_size` picks the smallest batch
for which that cost is at most :data:`OVERHEAD_SHARE` of a task, given the
time an image takes on one executor (measured by the driver on its sample,
the same measurement as the estimate: :class:`mxjob.executor.measure.SampleCost`).

Memory does not grow with the batch: a task holds at most ``--max-in-flight``
decoded images and its lines, and the forward pass is bound at
``--micro-batch-size``. What a large batch costs instead is balance: fewer
tasks to spread over the executors, and more to score again when one is
lost. So the batch is capped to leave :data:`WAVES` batches per executor
when the input has that many micro-batches, and at :data:`MAX_BATCH`; it is
always a multiple of the micro-batch, so no forward pass runs short but the
task's last.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from mxjob.core import constants
from mxjob.options import settings

#: The largest share of a task that Spark's per-task cost may take:
#: ``overhead / (batch * per_image + overhead) <= 5%``, so ``batch >= 19 * overhead / per_image``.
OVERHEAD_SHARE = 0.05
#: Batches per executor auto leaves at least, when the input has enough micro-batches: with several
#: waves the last, partly idle one is a small part of the run, and a lost task re-scores little.
WAVES = 4
#: The largest batch auto picks: a task of 4096 images takes minutes even for a small model on a slow
#: executor, long enough that progress lines and a retried task stay useful.
MAX_BATCH = 4096
#: The batch when nothing was measured (``--estimate-images 0``, or no sample image could be scored);
#: the library's default batch too (``Classifier``, ``model_udf``).
FALLBACK = settings.BY_NAME["batch_size"].fallback


@dataclass(frozen=True)
class BatchChoice:
    """The run's batch size and why, as the log and the summary's ``batch_size_choice`` show it.

    ``per_image_seconds`` is the wall time of one image on one executor
    (``None``: not measured); ``task_overhead_seconds`` Spark's cost per task.
    """

    chosen: int
    requested: int | str
    why: str
    per_image_seconds: float | None
    task_overhead_seconds: float

    @property
    def overhead_share(self) -> float | None:
        """The share of a task that Spark's per-task cost takes at the chosen batch (``None``: not measured)."""
        if not self.per_image_seconds:
            return None
        return self.task_overhead_seconds / (self.chosen * self.per_image_seconds + self.task_overhead_seconds)

    def as_dict(self) -> dict:
        share = self.overhead_share
        return {**asdict(self),  # the fields in their order, then the share
                "per_image_seconds": None if self.per_image_seconds is None else round(self.per_image_seconds, 6),
                "overhead_share": None if share is None else round(share, 4)}


def _round_down(n: int, step: int) -> int:
    return max(step, n // step * step)


def choose_batch_size(per_image_seconds: float, task_overhead_seconds: float, executors: int, keys: int,
                      micro_batch: int, *, maximum: int = MAX_BATCH, lanes: int = 1) -> BatchChoice:
    """The batch for ``keys`` images at ``per_image_seconds`` each on one of ``executors`` executors.

    The smallest multiple of ``micro_batch`` that keeps ``task_overhead_seconds``
    at most :data:`OVERHEAD_SHARE` of a task; then no more than leaves
    :data:`WAVES` batches per executor, and no more than ``maximum``, both
    rounded down to a multiple of ``micro_batch`` but never below it.
    With several forward ``lanes`` an executor scores that many micro-batches
    at once, so the batch is a multiple of all of them: one micro-batch
    would leave the other lanes' threads idle for the whole task.

    Examples
    --------
    >>> choose_batch_size(0.002, 0.2, executors=2, keys=100_000, micro_batch=16).chosen
    1904
    >>> choose_batch_size(0.05, 0.2, executors=2, keys=100_000, micro_batch=16).chosen
    80
    """
    if per_image_seconds <= 0 or micro_batch < 1:
        raise ValueError(f"per_image_seconds and micro_batch must be positive, got {per_image_seconds} "
                         f"and {micro_batch}")
    need = math.ceil((1 - OVERHEAD_SHARE) / OVERHEAD_SHARE * task_overhead_seconds / per_image_seconds)
    unit = micro_batch * max(1, lanes)
    of = (f"the micro-batch {micro_batch}" if unit == micro_batch else
          f"the micro-batch {micro_batch} times the executors' {lanes} forward lanes ({unit})")
    batch = -(-max(need, 1) // unit) * unit  # rounded up to a multiple of the unit
    overhead = (f"{OVERHEAD_SHARE:.0%} of a task for Spark's {task_overhead_seconds:g} s per task needs {need} "
                f"images of {1000 * per_image_seconds:.4g} ms")
    why = f"{overhead}, rounded up to a multiple of {of}"
    if batch == micro_batch and need < micro_batch:
        why = f"one micro-batch: {overhead}"
    elif batch == unit and need < unit:
        why = f"one micro-batch for each of the executors' {lanes} forward lanes: {overhead}"
    spread = _round_down(keys // (WAVES * max(1, executors)), unit)
    if batch > spread:
        batch = spread
        why = (f"capped so that {executors} executors get {WAVES} batches each: {keys} / {WAVES * executors} "
               f"images, a multiple of {of} and at least one ({overhead})")
    if batch > maximum:
        batch = _round_down(maximum, unit)
        why = f"the largest batch auto picks, {maximum} ({overhead})"
    return BatchChoice(batch, constants.AUTO, why, per_image_seconds, task_overhead_seconds)


def unmeasured(reason: str, task_overhead_seconds: float) -> BatchChoice:
    """``--batch-size auto`` with nothing measured: :data:`FALLBACK`, saying why."""
    return BatchChoice(FALLBACK, constants.AUTO, f"{reason}: the fixed {FALLBACK}", None, task_overhead_seconds)
