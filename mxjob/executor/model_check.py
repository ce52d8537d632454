"""The model's check where the model is loaded anyway: what the driver needs of it, and how a load's failure reads.

The driver checks the model before any batch is scored: it loads, its labels
match its classes, ``--top-k`` fits, and the run's fingerprint, table schema
and summary name its facts (:class:`ModelFacts`). When the executors load the
model early (:mod:`mxjob.run.spark_start`'s warm-up), one of them makes that check
and measures the estimate's sample (:func:`warm_and_check`), so the driver
never imports MXNet, loads the model or scores the sample itself: on a
two-core host those were about 3 CPU-seconds beside the executors' own start.
The driver falls back to its own check when the warm-up cannot answer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from mxjob.core import state
from mxjob.core.errors import first_line
from mxjob.executor.measure import SampleCost, measure
from mxjob.executor.partition import JobSpec, warm_worker
from mxjob.model.predictor import ModelError


@dataclass(frozen=True)
class ModelFacts:
    """What the driver's checks and records read of a loaded model, with no MXNet: picklable, a few kB.

    Read the way a :class:`mxjob.model.predictor.Predictor` is (``labels``,
    ``num_classes``, ``dimension``, ``output_layer``, ``file_digests``, :meth:`model_summary`),
    by :func:`mxjob.outputs.claim.job_fingerprint` and
    :func:`mxjob.executor.partition.result_schema`. ``num_classes`` is a classifier's
    (``None`` for another kind), ``dimension`` and ``output_layer`` an
    embedder's.
    """

    kind: str
    summary: dict
    labels: tuple[str, ...] | None = None
    num_classes: int | None = None
    dimension: int | None = None
    output_layer: str | None = None
    #: SHA-256 of the model's files, by URI, as the model was loaded from them (``Predictor.file_digests``).
    file_digests: dict | None = None

    @classmethod
    def of(cls, model) -> ModelFacts:
        """The facts of a loaded :class:`mxjob.model.predictor.Predictor`."""
        labels = getattr(model, "labels", None)
        return cls(kind=type(model).__name__, summary=model.model_summary(),
                   labels=tuple(labels) if labels else None, num_classes=getattr(model, "num_classes", None),
                   dimension=getattr(model, "dimension", None), output_layer=getattr(model, "output_layer", None),
                   file_digests=dict(getattr(model, "file_digests", None) or {}) or None)

    def model_summary(self) -> dict:
        """The summary's ``model``: :meth:`mxjob.model.predictor.Predictor.model_summary` as the model gave it."""
        return dict(self.summary)


def load_failure(exc: BaseException, symbol_uri: str) -> str:
    """The one line that says why the model did not load on the driver; an executor's check says a bad model so too."""
    if isinstance(exc, ModelError):
        return f"model: {exc}"
    if isinstance(exc, FileNotFoundError):
        return f"model file missing: {exc}"
    return f"cannot load the model ({symbol_uri}): {first_line(exc)}"


def executor_failure(exc: ModelError, symbol_uri: str) -> str:
    """The line for a load that failed in an executor (:func:`mxjob.executor.partition.load_model`'s ``ModelError``).

    A bad model (a ``ModelError`` or a missing file underneath) reads as the
    driver's own check says it (:func:`load_failure`); anything else (access
    denied, the network) as ``load_model`` says it: the executor's host, the
    file, the error, since the driver may well read what the executors cannot.
    """
    cause = exc.__cause__
    if isinstance(cause, (ModelError, FileNotFoundError)):
        return load_failure(cause, symbol_uri)
    return str(exc)


@dataclass(frozen=True)
class WarmReport:
    """What one warm-up task did: the models its worker holds; for the checking task, the check and the sample.

    ``failure``: the model did not load (:func:`executor_failure`'s line),
    and the driver refuses the run with it; ``facts`` and
    ``cost`` are then ``None``. ``cost``: this task's share of the sample
    (``None`` without one); only the checking task has ``facts``.
    """

    index: int
    loads: int
    facts: ModelFacts | None = None
    cost: SampleCost | None = None
    failure: str | None = None
    #: Where a measuring task's seconds went, in order (:func:`warm_split`); ``None`` for the others.
    seconds: dict | None = None


def warm_and_check(index: int, tasks: int, job: JobSpec, sample: list | None = None,
                   endpoint_url: str | None = None, check: bool = False) -> WarmReport:
    """Load the model into this worker (each lane's copy); with ``check``, check it and score a share of ``sample``.

    Task ``index`` of the warm-up job's ``tasks`` (:meth:`mxjob.run.spark_start.SparkStart.warm`):
    the run's tasks then find the model in their worker's cache. With
    ``check``, a task whose load fails reports why instead of failing (Spark
    would retry it, printing its errors before the driver's one line), task
    0 reports the model's facts for the driver, and the first
    :func:`measurers` tasks score a share of ``sample`` (listing items)
    each, every ``measurers``-th key from their ``index``-th, as
    :func:`mxjob.executor.measure.measure` does on the driver: the driver
    combines the shares (:func:`mxjob.executor.measure.combined`). A share's first forward pass (its first
    micro-batch, or one image of a short share) also builds the kernels that
    the run's first batch would otherwise wait for (a tenth of a second for a
    ResNet-18; the other tasks leave that to it).
    """
    if not check:
        warm_worker(index, job)
        return WarmReport(index, state.counters.model_loads)
    started = time.perf_counter()
    try:
        models = warm_worker(index, job)
    except ModelError as exc:  # every task: a retried task would print Spark's errors and stacks before the line
        return WarmReport(index, state.counters.model_loads, failure=executor_failure(exc, job.model.symbol_uri))
    loaded = time.perf_counter()
    count = measurers(len(sample or ()), tasks, job.forward_batch)
    share = list(sample[index::count]) if index < count else []
    cost = measure(job, share, endpoint_url, warm_batch=True) if share else None
    seconds = warm_split(loaded - started, time.perf_counter() - loaded, cost) if cost is not None else None
    return WarmReport(index, state.counters.model_loads, ModelFacts.of(models[0]) if index == 0 else None, cost,
                      seconds=seconds)


#: A measuring warm-up task's steps, in their order (:func:`warm_split`'s keys), and the words the driver's log names
#: them with (``mxjob.run.warm_up.split_words``). The first forward pass builds the model's kernels, which the
#: sample's timed pass then excludes.
WARM_STEPS = {"mxnet_import": "MXNet's import", "model_load": "the model's load",
              "first_pass": "the first forward pass", "sample": "the sample's timed pass"}


def warm_split(load: float, measured: float, cost: SampleCost) -> dict:
    """A measuring warm-up task's seconds, in order: MXNet's import, the model's load (every lane's copy), the
    first forward pass (one image or a micro-batch per lane: it builds the kernels), the sample's timed pass.

    ``load`` is :func:`warm_worker`'s time (the import included, when this worker imported MXNet there),
    ``measured`` :func:`measure`'s; the first pass's is its task's own (``cost.first``).

    >>> from types import SimpleNamespace
    >>> first = (b"", SimpleNamespace(seconds={"task": 2.0}))
    >>> cost = SampleCost(16, 16, 0.1, 0.0, 2.5, mxnet_import_seconds=2.3, first=first)
    >>> warm_split(2.9, 3.7, cost)
    {'mxnet_import': 2.3, 'model_load': 0.6, 'first_pass': 2.0, 'sample': 1.7}
    """
    imported = cost.mxnet_import_seconds or 0.0
    first = cost.first[1].seconds.get("task", 0.0) if cost.first is not None else 0.0
    steps = (imported, max(0.0, load - imported), first, max(0.0, measured - first))
    return {step: round(seconds, 3) for step, seconds in zip(WARM_STEPS, steps)}


def measurers(sample: int, tasks: int, micro_batch: int) -> int:
    """How many warm-up tasks score a share of a ``sample``-image sample: one per two micro-batches, at most
    ``tasks``.

    A share is timed in whole micro-batches (:func:`mxjob.executor.measure.whole_micro_batches`): the 8 images of
    a 128-image run's sample in one share cost one forward pass, where 4 in each of two cost two. Two: the
    first builds the task's kernels, untimed (:func:`mxjob.executor.measure.measure`'s ``warm_batch``), the second
    is timed.

    >>> measurers(64, 2, 16), measurers(8, 2, 16), measurers(64, 100, 16), measurers(0, 2, 16), measurers(40, 8, 1)
    (2, 1, 2, 0, 8)
    """
    return min(tasks, -(-sample // (2 * max(1, micro_batch))))
