"""The run's batch size and estimate, from one measurement of a sample scored on the driver.

:func:`size_run` scores ``--estimate-images`` keys as an executor would
(:func:`mxjob.executor.measure`); that one measurement gives
``--batch-size auto`` its choice (:mod:`mxjob.planning.batchsize`) and the estimate
its projection (:func:`mxjob.planning.estimate.project`).
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, replace

from mxjob.core import constants, state
from mxjob.executor.measure import SampleCost, measure
from mxjob.inputs import listing
from mxjob.model.worker import worker_lanes
from mxjob.options.config import JobConfig
from mxjob.planning import batchsize, estimate

log = logging.getLogger(__name__)


@dataclass
class Sizing:
    """The batch size chosen for a run and its estimate, from one measurement of the driver's sample."""

    #: :meth:`batchsize.BatchChoice.as_dict`: the summary's and the dry run's ``batch_size_choice``.
    choice: dict
    #: :meth:`estimate.Estimate.as_dict`, or ``None`` with ``--estimate-images 0``.
    estimate: dict | None
    #: The sample's first image (the first key of the listing), scored: ``(part, stats)``; ``None`` unmeasured.
    first: tuple | None = None


def size_run(cfg: JobConfig, images: listing.Listing, to_score: int, spark_conf: dict | None = None,
             head_start: float = 0.0, measured: SampleCost | None = None) -> tuple[JobConfig, Sizing]:
    """Measure the sample once, choose the batch size, project the run: ``(cfg with the batch size, sizing)``.

    ``--estimate-images`` keys spread over the listing are scored on the
    driver as an executor would (:func:`measure`); that one
    measurement gives ``--batch-size auto`` its choice
    (:func:`batchsize.choose_batch_size`, for the ``to_score`` keys on
    ``--estimate-cluster`` or the Spark configuration in force) and the
    estimate its projection. The returned ``cfg`` holds the chosen number,
    so every ``JobSpec`` built from it carries an int. ``head_start``: the
    seconds Spark has been starting already (the driver starts it first,
    :mod:`mxjob.run.spark_start`), which come off the run's start-up.
    ``measured``: the sample's cost as the executors measured it in their
    warm-up (:mod:`mxjob.executor.model_check`); the driver then scores nothing, and
    the start-up is behind the run: its executors have loaded the model.
    """
    if measured is not None:
        head_start = math.inf
    cost = cluster = None
    if cfg.estimate_images and to_score:
        cluster = run_cluster(cfg, spark_conf)
        cost = measured
        if cost is None:
            items = sample_items(images, sample_size(cfg.estimate_images, to_score, bound_batch(cfg)))
            bound = replace(cfg, batch_size=bound_batch(cfg))  # a number, whatever auto will choose
            cost = measure(bound.job_spec(), items, cfg.endpoint_url)
    state.models.clear()  # the driver's copy (its check's, kept for the sample): the executors' copy is theirs
    choice = choose_batch(cfg, cost, cluster, to_score)
    log.info("batch size %d: %s", choice.chosen, choice.why)
    cfg = replace(cfg, batch_size=choice.chosen)
    return cfg, Sizing(choice.as_dict(), estimate_run(cfg, cost, cluster, to_score, head_start),
                       cost.first if cost is not None else None)


def run_cluster(cfg: JobConfig, spark_conf: dict | None) -> estimate.Cluster:
    """The cluster the run is sized for: ``--estimate-cluster``, else the Spark configuration in force."""
    if cfg.estimate_cluster:
        return estimate.parse_cluster(cfg.estimate_cluster)
    return estimate.cluster_from_conf({**spark_conf_in_force(), **(spark_conf or {})})


def choose_batch(cfg: JobConfig, cost: SampleCost | None, cluster: estimate.Cluster | None,
                 to_score: int) -> batchsize.BatchChoice:
    """``--batch-size`` as given, or auto's choice from the sample's cost on ``cluster``."""
    overhead = estimate.TASK_OVERHEAD_SECONDS
    per_image = None
    if cost is not None and cost.scored and cost.cpu_seconds_per_image > 0:
        # One image's wall time on one executor: its CPU over the executor's share of the node's vCPUs.
        per_image = cost.cpu_seconds_per_image * cluster.executors / cluster.vcpus
    if cfg.batch_size != constants.AUTO:  # a number: that number
        size = int(cfg.batch_size)
        return batchsize.BatchChoice(size, size, f"--batch-size {cfg.batch_size}", per_image, overhead)
    if per_image is None:
        reason = ("--estimate-images 0 measures nothing" if not cfg.estimate_images else
                  "nothing to score" if not to_score else "no sample image could be scored")
        return batchsize.unmeasured(reason, overhead)
    # The executors' forward lanes (mxjob.executor.partition's), for the threads each will have.
    lanes = worker_lanes(cfg.forward_lanes, cfg.threads or max(1, int(cluster.threads)),
                         gpu=str(cfg.model.context).startswith("gpu"), handlers=cfg.handler_path is not None)
    return batchsize.choose_batch_size(per_image, overhead, cluster.executors, to_score, cfg.micro_batch_size,
                                       lanes=lanes)


def bound_batch(cfg: JobConfig) -> int:
    """The forward pass's bound batch: the micro-batch, or a smaller ``--batch-size`` (auto never picks one)."""
    return cfg.micro_batch_size if cfg.batch_size == constants.AUTO else cfg.job_spec().forward_batch


def estimate_run(cfg: JobConfig, cost: SampleCost | None, cluster: estimate.Cluster | None,
                 to_score: int, head_start: float = 0.0) -> dict | None:
    """The run's time (and cost) estimate (:mod:`mxjob.planning.estimate`) from the sample's ``cost``, logged;
    or ``None``.

    Projects the ``to_score`` keys, in batches of ``cfg.batch_size``, onto ``cluster``. On the cluster in force,
    the ``head_start`` seconds Spark (and the executors' warm-up) had already come off the start-up; not for
    ``--estimate-cluster``, a cluster of another run.
    """
    if cost is None:
        return None
    start = estimate.start_seconds(cost.model_load_seconds, jvm_start_seconds(), cost.mxnet_import_seconds)
    if not cfg.estimate_cluster:
        # What Spark's start left, and at least the run's own job's: its submission and first task's launch, about a
        # task's overhead (a warm 28-image job's tasks took 0.42 s of its 1.05 s).
        start = max(estimate.TASK_OVERHEAD_SECONDS, start - head_start)
    projected = estimate.project(cost, to_score, cfg.batch_size, cluster, start_seconds=start,
                                 node_price=cfg.node_price, master_price=cfg.master_price)
    price = "" if projected.cost is None else f", about {projected.cost.describe()}"
    log.info("estimate: %d images in about %s (%.1f images/s on %d vCPUs: %s, after %.0f s of start-up)%s; measured "
             "on %d images at %.1f ms of CPU each", to_score, _duration(projected.wall_seconds),
             projected.images_per_second, cluster.vcpus, cluster.source, projected.start_seconds, price, cost.images,
             1000 * cost.cpu_seconds_per_image)
    return projected.as_dict()


def _duration(seconds: float) -> str:
    """``3h05m``, ``12m40s`` or ``42s``."""
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


# ----------------------------------------------------------------------------
# Measuring the sample on the driver (the estimate's projection is mxjob.planning.estimate's)


def jvm_start_seconds() -> float | None:
    """How long this host took to start the JVM that started this Python process; ``None`` if it was not one.

    Under spark-submit (client mode, or YARN's ApplicationMaster in cluster
    mode) the driver's parent is the JVM that launched it: the seconds
    between their creations are one JVM's start on this host, which is what
    Spark's executors pay too. A notebook or a plain ``python`` starts no JVM first.
    """
    try:
        import psutil

        me = psutil.Process()
        parent = me.parent()
        if parent is None or "java" not in parent.name().lower():
            return None
        return max(0.0, me.create_time() - parent.create_time())
    except Exception as exc:  # noqa: BLE001 - no psutil or no permission: the default stands in
        log.info("estimate: cannot time this host's JVM start (%s)", exc)
        return None


#: A small run's sample is at most one ``SAMPLE_SHARE``-th of its keys (and at least :data:`SAMPLE_FLOOR`),
#: all the estimate needs of it: the full ``--estimate-images`` 32 of a 128-image run had the driver score a
#: quarter of the run (which the executors score again) while they started beside it on the same cores.
SAMPLE_SHARE = 16
SAMPLE_FLOOR = 8


def sample_size(estimate_images: int, to_score: int, micro_batch: int = 1) -> int:
    """The sample's size: ``--estimate-images``, at most a sixteenth of the ``to_score`` keys but never under 8;
    in whole ``micro_batch``-image forward passes where that is at most ``--estimate-images`` and half the keys.

    A forward pass costs the same for a short micro-batch as for a whole one (the model is bound at the
    micro-batch), so whole ones measure more images for the same forward passes.

    >>> sample_size(32, 100_000, 16), sample_size(32, 128, 16), sample_size(32, 40, 16), sample_size(4, 40, 16)
    (32, 16, 16, 4)
    """
    size = min(estimate_images, max(SAMPLE_FLOOR, to_score // SAMPLE_SHARE))
    step, limit = max(1, micro_batch), min(estimate_images, to_score // 2)
    up = -(-size // step) * step
    if up <= limit:
        return up
    return min(size, limit) // step * step or size


def sample_items(images, count: int) -> list:
    """``count`` keys evenly spaced over the sorted listing (the ``i * n // count``-th of ``n``)."""
    n = min(count, len(images))
    return [images[i * len(images) // n] for i in range(n)] if n else []


def spark_conf_in_force() -> dict:
    """The Spark configuration spark-submit gave this driver, read without starting a SparkContext.

    Under spark-submit the configuration lives in its JVM: a Py4J gateway to
    it (PySpark's public ``launch_gateway``, which joins the running JVM)
    reads it and closes again, so a dry run starts no executors. Outside
    spark-submit, or if that fails (logged), it is empty and the estimate is
    for this host unless ``--estimate-cluster`` says otherwise.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return {}
    try:
        from pyspark.java_gateway import launch_gateway

        gateway = launch_gateway()
        try:
            return {pair._1(): pair._2() for pair in gateway.jvm.org.apache.spark.SparkConf(True).getAll()}
        finally:
            gateway.close()
    except Exception as exc:  # noqa: BLE001 - the estimate falls back to this host, and says so
        log.warning("estimate: cannot read the Spark configuration (%s); estimating for this host", exc)
        return {}
