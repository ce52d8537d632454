"""The run's batch size and estimate, from one measurement of a sample scored on the driver.

:func:`size_run` scores ``--estimate-images`` keys as an executor would
(:func:`mxjob.estimate.measure`); that one measurement gives
``--batch-size auto`` its choice (:mod:`mxjob.batchsize`) and the estimate
its projection (:func:`mxjob.estimate.project`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from mxjob import (
    batchsize,
    estimate,
    listing,
    settings,
)
from mxjob.config import JobConfig
from mxjob.worker import import_mxnet

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


def size_run(cfg: JobConfig, images: listing.Listing, to_score: int,
             spark_conf: dict | None = None) -> tuple[JobConfig, Sizing]:
    """Measure the sample once, choose the batch size, project the run: ``(cfg with the batch size, sizing)``.

    ``--estimate-images`` keys spread over the listing are scored on the
    driver as an executor would (:func:`estimate.measure`); that one
    measurement gives ``--batch-size auto`` its choice
    (:func:`batchsize.choose_batch_size`, for the ``to_score`` keys on
    ``--estimate-cluster`` or the Spark configuration in force) and the
    estimate its projection. The returned ``cfg`` holds the chosen number,
    so every ``JobSpec`` built from it carries an int.
    """
    cost = cluster = None
    if cfg.estimate_images and to_score:
        cluster = run_cluster(cfg, spark_conf)
        items = estimate.sample_items(images, cfg.estimate_images)
        measured = replace(cfg, batch_size=bound_batch(cfg))  # a number, whatever auto will choose
        cost = estimate.measure(measured.job_spec(), items, cfg.endpoint_url)
    choice = choose_batch(cfg, cost, cluster, to_score)
    log.info("batch size %d: %s", choice.chosen, choice.why)
    cfg = replace(cfg, batch_size=choice.chosen)
    return cfg, Sizing(choice.as_dict(), estimate_run(cfg, cost, cluster, to_score),
                       cost.first if cost is not None else None)


def run_cluster(cfg: JobConfig, spark_conf: dict | None) -> estimate.Cluster:
    """The cluster the run is sized for: ``--estimate-cluster``, else the Spark configuration in force."""
    if cfg.estimate_cluster:
        return estimate.parse_cluster(cfg.estimate_cluster)
    return estimate.cluster_from_conf({**estimate.spark_conf_in_force(), **(spark_conf or {})})


def choose_batch(cfg: JobConfig, cost: estimate.SampleCost | None, cluster: estimate.Cluster | None,
                 to_score: int) -> batchsize.BatchChoice:
    """``--batch-size`` as given, or auto's choice from the sample's cost on ``cluster``."""
    overhead = estimate.TASK_OVERHEAD_SECONDS
    per_image = None
    if cost is not None and cost.scored and cost.cpu_seconds_per_image > 0:
        # One image's wall time on one executor: its CPU over the executor's share of the node's vCPUs.
        per_image = cost.cpu_seconds_per_image * cluster.executors / cluster.vcpus
    if cfg.batch_size != settings.AUTO:
        return batchsize.given(cfg.batch_size, per_image, overhead)
    if per_image is None:
        reason = ("--estimate-images 0 measures nothing" if not cfg.estimate_images else
                  "nothing to score" if not to_score else "no sample image could be scored")
        return batchsize.unmeasured(reason, overhead)
    return batchsize.choose_batch_size(per_image, overhead, cluster.executors, to_score, cfg.micro_batch_size)


def bound_batch(cfg: JobConfig) -> int:
    """The forward pass's bound batch: the micro-batch, or a smaller ``--batch-size`` (auto never picks one)."""
    return cfg.micro_batch_size if cfg.batch_size == settings.AUTO else cfg.job_spec().forward_batch


def estimate_run(cfg: JobConfig, cost: estimate.SampleCost | None, cluster: estimate.Cluster | None,
                 to_score: int) -> dict | None:
    """The run's time (and cost) estimate (:mod:`mxjob.estimate`) from the sample's ``cost``, logged; or ``None``.

    Projects the ``to_score`` keys, in batches of ``cfg.batch_size``, onto ``cluster``.
    """
    if cost is None:
        return None
    start = estimate.start_seconds(cost.model_load_seconds, estimate.jvm_start_seconds(), import_mxnet())
    projected = estimate.project(cost.cpu_seconds_per_image, to_score, cfg.batch_size, cluster,
                                 model_load_seconds=cost.model_load_seconds, start_seconds=start,
                                 node_price=cfg.node_price, sample_images=cost.images,
                                 s3_server_cpu=cost.s3_server_cpu_seconds_per_image)
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
