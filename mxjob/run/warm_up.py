"""The executors warmed up while the driver lists: Spark started early, the model loaded in every Python worker,
one of them checking it and measuring the estimate's sample, so the driver loads no MXNet.

:mod:`mxjob.run.spark_start` starts the SparkContext in a thread of its own; this module decides when
(:func:`early_spark`, :func:`warm_early`), what the executors load (:func:`warm_up`), and reads the
checking task's report (:func:`executors_report`), or why its job failed when YARN killed its executors for their
memory (:func:`killed_for_memory`).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import replace

from mxjob import tasks
from mxjob.executor.measure import combined
from mxjob.executor.model_check import WARM_STEPS, WarmReport, warm_and_check
from mxjob.inputs import listing
from mxjob.options.config import JobConfig
from mxjob.planning.sizing import bound_batch, sample_items, sample_size
from mxjob.run import container_memory
from mxjob.run.cluster import expected_executors, host_threads
from mxjob.run.spark_start import SparkStart

log = logging.getLogger(__name__)


def early_spark(cfg: JobConfig, spark_conf: dict | None) -> SparkStart | None:
    """The SparkContext, started now in a thread of its own, under spark-submit.

    Spark's start then overlaps the listing, the model's check and the sample,
    and the executors load the model meanwhile (:mod:`mxjob.run.spark_start`):
    the start-up of a small run is mostly that (``make bench-startup``). In
    cluster mode it is needed too: YARN's ApplicationMaster fails an
    application whose driver has no SparkContext after
    ``spark.yarn.am.waitTime`` (100 s by default), which a long listing or an
    int8 search reached. It starts once the output is claimed and the model's
    files are found (:func:`mxjob.run.driver.monitored_run`): what refuses a
    run before that starts no Spark, a run that fails at its listing or finds
    nothing new stops it again, and a client-mode dry run starts none. In
    process (the library, no spark-submit) Spark starts at the job.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    if cfg.dry_run and not os.environ.get("CONTAINER_ID"):
        return None
    return SparkStart(cfg.app_name, spark_conf)


def warm_early(start: SparkStart | None, cfg: JobConfig, images: listing.Listing) -> bool:
    """Once the listing found something to score: the executors load the model as given, when the driver's check
    changes nothing they load (:func:`warm_up`); one of them then checks it and measures the estimate's sample on
    ``images``' keys (:func:`executors_check`). Whether they were sent to warm up."""
    if start is None:
        return False
    size = sample_size(cfg.estimate_images, len(images), bound_batch(cfg))
    sample = sample_items(images, size) if executors_check(cfg) else None
    return warm_up(start, cfg, early=True, sample=sample)


def executors_check(cfg: JobConfig) -> bool:
    """Whether an executor's warm-up checks the model and measures the sample, so the driver never loads MXNet.

    For the runs whose warm-up starts before the driver's check (:func:`warm_up`'s ``early``) on CPUs: the
    driver's sample measured a CPU's cost, and an executor measures with the copy it loaded for the run.
    """
    return cfg.model.context == "cpu"


def warm_up(start: SparkStart | None, cfg: JobConfig, early: bool = False, sample: list | None = None) -> bool:
    """Load the model in the executors' Python workers while the driver lists, checks, samples and plans.

    The run's ``JobSpec`` as its tasks will get it (bound at the micro-batch,
    the executors' thread plan), one warm-up task per executor
    (:func:`mxjob.executor.model_check.warm_and_check`). ``early``: before the driver's
    own check, when that check changes nothing the executors
    load: not for int8 (the driver quantizes the model they load) or an
    embedding whose layer the driver finds; a model the check then refuses
    ends the run as before, the warm-up's work lost. ``sample``: the first
    task checks the model and measures it on those keys for the driver
    (:func:`check_on_driver`). Never for a ``--handler``, whose file the run
    ships to the executors only when its job starts. Whether the warm-up was started.
    """
    if start is None or cfg.dry_run or cfg.int8_model is not None or cfg.handler_file or cfg.plugin_files:
        return False
    if early and (cfg.precision != "fp32" or tasks.get(cfg.task).model_found_by_check(cfg.model)):
        return False

    def job_for(sc):
        job = replace(cfg, batch_size=bound_batch(cfg)).job_spec()
        return replace(job, host_threads=host_threads(sc)), expected_executors(dict(sc.getConf().getAll())) or 1

    start.warm(job_for, functools.partial(warm_and_check, sample=sample, endpoint_url=cfg.endpoint_url,
                                          check=sample is not None))
    return True


def executors_report(start: SparkStart | None) -> WarmReport | None:
    """The report of the warm-up task that checked the model (:func:`warm_early`); ``None`` without one.

    Waits for the warm-up's job. A warm-up that failed (an executor lost, a
    task error) was logged by :class:`SparkStart`; the driver then checks the
    model itself, as it did before the executors could.
    """
    if start is None:
        return None
    reports = start.wait_reports() or []
    # A load that failed on any executor first: the run's tasks there would fail the same way.
    checked = [r for r in reports if r.failure is not None] + [r for r in reports if r.facts is not None]
    if not checked:
        log.info("the executors did not check the model; the driver checks it")
        return None
    report = replace(checked[0], cost=combined([r.cost for r in reports]))  # each task measured its share
    if report.cost is not None:
        log.info("an executor checked the model and measured the estimate's sample on %d images as it warmed up%s; "
                 "the driver loads no MXNet", report.cost.images, split_words(checked[0].seconds))
    elif report.failure is None:
        log.info("an executor checked the model as it warmed up; the driver loads no MXNet")
    return report


def split_words(seconds: dict | None) -> str:
    """`` (MXNet's import 2.3 s, ...)``: where the checking task's warm-up went, in the words of
    :data:`mxjob.executor.model_check.WARM_STEPS`; empty without its split.

    >>> split_words({"mxnet_import": 2.31, "sample": 1.7})
    " (MXNet's import 2.3 s, the sample's timed pass 1.7 s)"
    >>> split_words(None)
    ''
    """
    if not seconds:
        return ""
    return " (" + ", ".join(f"{words} {seconds[step]:.1f} s" for step, words in WARM_STEPS.items()
                            if step in seconds) + ")"


def killed_for_memory(start: SparkStart | None) -> str | None:
    """What to raise, when YARN killed the warm-up's executors for their memory as often as Spark retried its task.

    The run's tasks load the same model in the same containers: they would
    be killed the same way, each kill a container's start and a model's load
    later. The driver says so now (:func:`mxjob.run.container_memory.killed_message`,
    with its own peak: it has just loaded the model for its check), before
    the run claims the output. ``None`` for any other failure, or none.
    """
    if start is None or start.failure is None:
        return None
    container = container_memory.ExecutorContainer.from_conf(dict(start.context().getConf().getAll()))
    return container_memory.killed_message(start.failure, container, {}, container_memory.driver_peak_mib())
