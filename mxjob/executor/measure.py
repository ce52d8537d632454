"""The cost of scoring a sample, measured where the model is: the driver, or an executor's warm-up.

:func:`measure` scores the sample as an executor scores a batch
(:func:`mxjob.executor.partition.score_partition`) and times it: the one measurement
``--batch-size auto`` and the estimate share (:mod:`mxjob.planning.sizing`).
"""

from __future__ import annotations

import logging
import time
import urllib.parse
from dataclasses import dataclass, replace

from mxjob.core import state
from mxjob.executor.partition import score_partition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleCost:
    """What scoring the estimate's sample cost: the one measurement the estimate and ``--batch-size auto`` share.

    ``cpu_seconds_per_image`` counts a local S3 stand-in's CPU too (of which
    ``s3_server_cpu_seconds_per_image``; 0 against real S3); ``scored`` are
    the sample's images that got predictions rather than error lines.
    """

    images: int
    scored: int
    cpu_seconds_per_image: float
    s3_server_cpu_seconds_per_image: float
    model_load_seconds: float
    #: Images the timed pass scored: the sample's, repeated up to whole micro-batches (:func:`whole_micro_batches`);
    #: ``None``: the sample's own ``images``.
    timed: int | None = None
    #: Seconds the measuring process took to import MXNet (``None``: imported before, untimed): each
    #: executor's Python worker pays about as much before its first batch (:func:`mxjob.model.worker.import_mxnet`).
    mxnet_import_seconds: float | None = None
    #: The local S3 stand-in's CPU seconds so far when the sample began and when it ended (``None`` without
    #: one): where several processes measured shares of one sample at once (:func:`combined`), the server's
    #: CPU over their common window, counted once.
    server_cpu_window: tuple[float, float] | None = None
    #: The first pass's ``(part, stats)`` from :func:`mxjob.executor.partition.score_partition` (the model's
    #: load included), whose first row is the sample's first image: the dry run's sample line, so it needs no
    #: third load of the model. ``None`` when not kept.
    first: tuple | None = None

    @property
    def timed_images(self) -> int:
        """How many images the per-image CPU is the mean of."""
        return self.images if self.timed is None else self.timed


def whole_micro_batches(items: list, micro_batch: int) -> list:
    """``items`` repeated, in turn, up to a whole number of ``micro_batch``-image forward passes.

    A run's batches are whole micro-batches (``--batch-size auto`` picks a
    multiple), but a small sample is not: its last forward pass is padded to
    the model's bound batch and costs what a full one costs, so 4 images
    measured alone cost 16 images' forward pass and the estimate 3-4 times
    the run's CPU per image. Repeated, each image is fetched and decoded
    again, as a batch of other images would be.

    >>> whole_micro_batches(["a", "b", "c"], 4), whole_micro_batches(["a", "b"], 2), whole_micro_batches([], 4)
    (['a', 'b', 'c', 'a'], ['a', 'b'], [])
    """
    if not items or micro_batch <= 1:
        return list(items)
    passes = -(-len(items) // micro_batch)
    return [items[i % len(items)] for i in range(passes * micro_batch)]


def warm_images(share: int, micro_batch: int, lanes: int) -> int:
    """How many of a warm-up's ``share`` of the sample it scores first, untimed, building the kernels.

    A micro-batch on each of the worker's ``lanes`` at once, so that every
    lane's copy of the model builds its kernels there, not in the timed pass
    (and no lane idles meanwhile); fewer lanes' worth when that would leave
    fewer images to time than it takes; one image when even one micro-batch
    would (the timed pass then scores what is left: :func:`whole_micro_batches`).

    >>> warm_images(64, 16, 2), warm_images(48, 16, 2), warm_images(16, 16, 2), warm_images(64, 1, 2)
    (32, 16, 1, 1)
    """
    lanes_warmed = min(max(1, lanes), share // 2 // max(1, micro_batch))
    return lanes_warmed * micro_batch if micro_batch > 1 and lanes_warmed else 1


def measure(job, items: list, endpoint_url: str | None, warm_batch: bool = False) -> SampleCost:
    """The :class:`SampleCost` of scoring ``items`` in this process, as an executor scores a batch.

    On the driver, or in an executor's warm-up (:mod:`mxjob.executor.model_check`).
    Runs :func:`mxjob.executor.partition.score_partition` twice: one
    image first (the model loads: its wall time is the load, with the first
    forward pass's), then the sample, whose process CPU time is what an
    executor would spend. The model is usually in this process's cache
    already (the driver's check, :func:`mxjob.run.checks.load_model_on_driver`,
    or the warm-up's load): that load's seconds then count as this one's.
    The timed pass scores whole micro-batches (:func:`whole_micro_batches`).
    ``warm_batch`` (an executor's warm-up): with two micro-batches of
    ``items`` or more, the first pass is the first micro-batch of each forward
    lane (:func:`warm_images`), not one image padded to one, so that every
    lane builds its kernels before the timed pass; the rest is timed. On the CPU:
    the executors measure only for a CPU run
    (:func:`mxjob.run.warm_up.executors_check`), the driver has no GPU to use.
    """
    job = replace(job, model=replace(job.model, context="cpu"), parts_prefix=None, batches_key=None)
    tasks_run = state.counters.tasks_run
    try:
        return _measure(job, items, endpoint_url, warm_batch)
    finally:
        # Not one of this worker's tasks: the run's first task stays its first (the progress's ETA waits for
        # each executor's first task to end, and the summary tells it apart by that number).
        state.counters.tasks_run = tasks_run


def _measure(job, items: list, endpoint_url: str | None, warm_batch: bool) -> SampleCost:
    server = local_server_process(endpoint_url)
    loads, load_started = state.counters.model_loads, time.perf_counter()
    # The first forward pass builds the model's kernels, and its time is the load's, not an image's.
    warm = warm_images(len(items), job.forward_batch, state.counters.lanes) if warm_batch else 1
    [(_, _, first_part, first_stats)] = score_partition(0, items[:warm], job)
    load_seconds = time.perf_counter() - load_started
    if state.counters.model_loads == loads and state.counters.model_load_seconds is not None:
        load_seconds += state.counters.model_load_seconds  # the check's load, found in the cache
    rest = items[warm:] if warm > 1 else items
    timed = whole_micro_batches(rest, job.forward_batch)
    window_start = _cpu_seconds(server)
    [(_, _, _, stats)] = score_partition(0, timed, job)
    window_end = _cpu_seconds(server)
    server_cpu = window_end - window_start
    n = max(1, len(timed))
    # The repeats fail as their images do: the sample's share without an error line, in whole images.
    scored = round(len(rest) * (n - sum(stats.errors.values())) / n)
    return SampleCost(images=len(rest), scored=scored, timed=len(timed),
                      cpu_seconds_per_image=(stats.seconds["cpu"] + server_cpu) / n,
                      s3_server_cpu_seconds_per_image=server_cpu / n, model_load_seconds=load_seconds,
                      mxnet_import_seconds=state.counters.mxnet_import_seconds,
                      server_cpu_window=(window_start, window_end) if server is not None else None,
                      first=(first_part, first_stats))


def combined(costs: list[SampleCost | None]) -> SampleCost | None:
    """One :class:`SampleCost` of the shares of one sample that several processes measured at the same time.

    Their own CPU adds up; a local S3 stand-in's is its CPU over the shares'
    common window (each share's window saw the others' requests too); the
    model's load and MXNet's import are the slowest process's, as the run's
    start waits for its slowest executor. ``None`` when none measured.
    """
    costs = [cost for cost in costs if cost is not None]
    if not costs:
        return None
    images = sum(cost.images for cost in costs)
    timed = sum(cost.timed_images for cost in costs)
    own = sum((cost.cpu_seconds_per_image - cost.s3_server_cpu_seconds_per_image) * max(1, cost.timed_images)
              for cost in costs)
    windows = [cost.server_cpu_window for cost in costs if cost.server_cpu_window is not None]
    window = (min(start for start, _ in windows), max(end for _, end in windows)) if windows else None
    server = window[1] - window[0] if window else 0.0
    imports = [cost.mxnet_import_seconds for cost in costs if cost.mxnet_import_seconds is not None]
    n = max(1, timed)
    return SampleCost(images=images, scored=sum(cost.scored for cost in costs), timed=timed, server_cpu_window=window,
                      cpu_seconds_per_image=(own + server) / n, s3_server_cpu_seconds_per_image=server / n,
                      model_load_seconds=max(cost.model_load_seconds for cost in costs),
                      mxnet_import_seconds=max(imports) if imports else None)


def local_server_process(endpoint_url: str | None):
    """The process of an S3 endpoint on this machine (moto in ``make run-local``), or ``None``.

    A local stand-in shares the cores the job runs on, so its CPU is part of
    what an image costs here (real S3 costs the cluster none).
    """
    if not endpoint_url:
        return None
    parsed = urllib.parse.urlparse(endpoint_url)
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1") or not parsed.port:
        return None
    try:
        import psutil

        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == parsed.port and conn.pid:
                return psutil.Process(conn.pid)
    except Exception as exc:  # noqa: BLE001 - no psutil, or no permission: the estimate leaves the server out
        log.info("estimate: the CPU of the S3 endpoint %s is left out (%s)", endpoint_url, exc)
    return None


def _cpu_seconds(process) -> float:
    if process is None:
        return 0.0
    try:
        times = process.cpu_times()
        return times.user + times.system
    except Exception:  # noqa: BLE001 - the server ended: nothing more to count
        return 0.0
