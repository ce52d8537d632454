"""One run on the driver, from listing to summary: :func:`run_job` and its steps.

List (or read the manifest), check the model and the handler on the driver,
quantize for ``--precision int8`` (:mod:`mxjob.int8.int8_prep`), decide between a
fresh run and a resume (:mod:`mxjob.outputs.claim`), size the batches
(:mod:`mxjob.planning.sizing`), run them on Spark (:mod:`mxjob.run.cluster`), assemble the
durable lines into the output (:mod:`mxjob.outputs.work_prefix`), write the summary
(:mod:`mxjob.reporting.summary`). ``--dry-run`` makes every check and scores one image
instead of starting Spark (:mod:`mxjob.run.dry_run`).
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mxjob import tasks
from mxjob.core import state
from mxjob.core.errors import EXIT_TOO_MANY_ERRORS, JobError, first_line
from mxjob.executor.measure import SampleCost, combined
from mxjob.executor.model_check import ModelFacts, WarmReport, load_failure, warm_and_check
from mxjob.executor.partition import job_task
from mxjob.executor.stats import StatsFold
from mxjob.inputs import extsort, listing, manifest
from mxjob.int8.int8_prep import prepare_precision
from mxjob.model.handlers import HandlerError, get_handlers
from mxjob.model.predictor import Predictor, get_model
from mxjob.model.worker import import_mxnet
from mxjob.options.config import JobConfig, allowed_errors
from mxjob.outputs import dataset, merge, work_prefix
from mxjob.outputs.assembly import Assembly
from mxjob.outputs.claim import (
    Completed,
    PlanInputs,
    finished_by_this_application,
    plan_output,
    unfinished_output,
    yarn_attempt,
)
from mxjob.outputs.fingerprint import carried_names, job_fingerprint
from mxjob.planning.sizing import Sizing, bound_batch, choose_batch, sample_items, sample_size, size_run
from mxjob.reporting.status import RunMonitor
from mxjob.reporting.summary import RunOutcome, closing_lines, summarize
from mxjob.run.checks import check_model_files
from mxjob.run.cluster import SparkStop, expected_executors, run_spark, thread_plan
from mxjob.run.dry_run import dry_run
from mxjob.run.signals import Interrupted
from mxjob.run.spark_start import SparkStart
from mxjob.s3 import clients, lean_list, object_reader, parallel_list, reads, uris, writes
from mxjob.tasks import Task

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------
# The run


def run_job(cfg: JobConfig, spark_conf: dict | None = None, resume_command: str | None = None) -> int:
    """List, plan, check the model, score on Spark, assemble; return the exit code.

    From the moment the run may write its output (:func:`open_status`),
    ``OUTPUT.status.json`` and ``OUTPUT.report.html`` beside it say what the
    run is doing and, if it fails, why (:class:`mxjob.reporting.status.RunMonitor`);
    ``resume_command`` is the command they show to resume the run.
    """
    started = time.time()
    client = clients.s3_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts)
    retry = yarn_attempt()[1] > 1
    # The output's home (an Iceberg table's is beside its location) holds the run's status, summary and work.
    if cfg.output is not None:  # (a dry run may name none)
        cfg = replace(cfg, output=cfg.output.locate(cfg))
        # The output first: seconds, where the listing may take hours. An output that is refused (it exists, or a
        # dataset's prefix holds objects the job did not write) or cannot be written ends the run before it writes
        # anything beside it: the status there is the run's that wrote that output, or no PUT could replace it.
        cfg.output.check(cfg, client, yarn_retry=retry)
    monitor = open_status(cfg, client, started, resume_command, retry)
    start = early_spark(cfg, spark_conf)
    try:
        code = checked_run(cfg, client, monitor, spark_conf, start)
    except (Exception, Interrupted) as exc:
        monitor.ended(exc)  # the status says why (if it is this run's): mxjob.reporting.watch exits with the job's code
        if start is not None and not isinstance(exc, Interrupted):  # a signal's JVM shutdown stops Spark itself
            start.stop()
        raise
    finally:
        monitor.close()
    if start is not None:
        start.stop()  # a run that needed no Spark job (the run's own job stopped it already)
    return code


def early_spark(cfg: JobConfig, spark_conf: dict | None) -> SparkStart | None:
    """The SparkContext, started now in a thread of its own, under spark-submit.

    Spark's start then overlaps the listing, the model's check and the
    sample, and the executors load the model meanwhile (:mod:`mxjob.run.spark_start`):
    the start-up of a small run is mostly that (``make bench-peers``). In
    cluster mode it is needed too: YARN's ApplicationMaster fails an
    application whose driver has no SparkContext after
    ``spark.yarn.am.waitTime`` (100 s by default), which a long listing or an
    int8 search reached. In client mode it begins after the listing
    (:func:`checked_run`): a run that fails there or finds nothing new then
    starts no Spark at all (local-cluster's in-process workers print a stack
    trace now and then when stopped as they start), and a dry run starts none.
    In process (the library, no spark-submit) Spark starts at the job.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    cluster_mode = bool(os.environ.get("CONTAINER_ID"))
    if cfg.dry_run and not cluster_mode:
        return None
    return SparkStart(cfg.app_name, spark_conf, begin=cluster_mode)


def begin_spark(start: SparkStart | None, cfg: JobConfig, images: listing.Listing) -> bool:
    """Once the listing found something to score: Spark begins starting in client mode (:func:`early_spark`), and
    the executors load the model as given, when the driver's check changes nothing they load (:func:`warm_up`);
    one of them then checks it and measures the estimate's sample on ``images``' keys (:func:`executors_check`).
    Whether they were sent to warm up."""
    if start is None:
        return False
    start.begin()
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
        return replace(job, thread_plan=thread_plan(sc)), expected_executors(dict(sc.getConf().getAll())) or 1

    start.warm(job_for, functools.partial(warm_and_check, sample=sample, endpoint_url=cfg.endpoint_url,
                                          check=sample is not None))
    return True


def open_status(cfg: JobConfig, client, started: float, resume_command: str | None, retry: bool) -> RunMonitor:
    """The run's :class:`RunMonitor`, claimed at once (status "running") when its output check has passed.

    The status beside the output is this run's as soon as the run may write
    the output: for ``--overwrite``, and for a fresh run (the check refused
    an existing output), before the listing, so ``mxjob.reporting.watch`` never reads
    the earlier run's final state as this run's. It stays another run's for a
    dry run (which writes nothing), for ``--resume`` of a complete output (it
    ends "already complete", and that status is the run's that completed it),
    and for YARN's next attempt on an output there (its first attempt's exit
    code, read from that status, may be the one to repeat:
    :func:`finished_by_this_application`); such a run claims it at its plan.
    A fresh run beside an earlier run's progress does replace that run's
    "interrupted" status: its own failure says to add ``--resume``, and its
    resume command is the one to run.
    """
    monitor = RunMonitor(client, cfg.output_bucket, cfg.output_key, started, resume_command,
                         {"options": cfg.options()}, output_uri=cfg.output_uri)
    if not cfg.dry_run and (cfg.overwrite or not (cfg.resume or retry) or unfinished_output(cfg, client)):
        monitor.claim("starting")
    return monitor


def checked_run(cfg: JobConfig, client, monitor: RunMonitor, spark_conf: dict | None,
                start: SparkStart | None = None) -> int:
    """:func:`run_job` once the output is checked: the handler and the model's files, the listing, the driver's
    checks, the plan, then the scoring (:func:`planned_run`)."""
    seconds: dict[str, float] = {}
    # The handler and the model's files before the listing too: seconds, where the listing may take hours.
    cfg = prepare_handler(cfg, client)
    check_model_files(cfg.model)
    monitor.enter("listing")
    images = list_images(client, cfg)
    cfg = replace(cfg, input_bucket=images.bucket)  # a manifest names the bucket the executors read
    seconds["listing"] = time.time() - monitor.started
    found, settled = None, None
    if not cfg.dry_run:  # what a resumed run left that the output takes first (a table's whole files committed)
        images, settled = cfg.output.settle(cfg, client, images)
    if cfg.skip_existing:  # the run's keys are those the output lacks: the full listing goes now
        found = cfg.output.existing(cfg, client, images)
        images, seconds["existing"] = found.new, found.seconds
    elif settled is not None and not len(images):
        found = settled.nothing_left(images)
    if found is not None and not len(images) and not cfg.dry_run:
        return nothing_new(cfg, client, monitor, found, seconds)
    warmed = begin_spark(start, cfg, images)
    check_started = time.time()
    monitor.enter("model_check")
    cfg, checked = check_on_driver(cfg, client, images, start if warmed and executors_check(cfg) else None)
    if not warmed:
        warm_up(start, cfg)  # the checked model (int8's, the layer found): loaded while the driver samples and plans
    inputs = PlanInputs(checked.auto_rows, found)
    if cfg.dry_run:
        return dry_run(cfg, images, checked.classifier, client, checked.fingerprint, inputs)
    checked.classifier = None  # checked: the driver needs the model no more (its cache keeps it for the sample)
    seconds["model_check"] = time.time() - check_started
    plan_started = time.time()
    monitor.enter("planning")
    work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    try:
        plan = plan_output(cfg, client, work, images, checked.fingerprint, inputs=inputs)
        if plan.dataset is not None:
            plan.dataset.settled = settled
    except Completed as done:
        log.info("%s is already complete (its summary is s3://%s/%s); nothing to resume", cfg.output_uri,
                 cfg.output_bucket, cfg.summary_key)
        return done.exit_code
    # Before the run's plan is written (score_and_assemble): its batches are of the size chosen here.
    cfg, sizing = size_run(cfg, images, len(plan.todo), spark_conf,
                           head_start=start.head_start() if start is not None else 0.0, measured=checked.sample_cost)
    monitor.context = {"options": cfg.options(), "fingerprint": checked.fingerprint}
    monitor.claim("planning")  # from the plan on the files are this run's, whoever's they were
    run = PlannedRun(cfg, client, work, images, plan, monitor)
    try:
        scored = score_and_assemble(run, start, seconds, plan_started)
    except (JobError, Interrupted) as exc:
        exc.work = work  # main() says what is durable and how to resume
        raise
    return planned_run(run, checked, sizing, scored, seconds)


def nothing_new(cfg: JobConfig, client, monitor: RunMonitor, found, seconds: dict) -> int:
    """End a ``--skip-existing`` run whose every listed key has its row already: no Spark job, no new file.

    The summary and the status say so; the exit code is 0, or the code of
    YARN's earlier attempt of this application if that attempt finished the
    run (it wrote these rows, then exited with it).
    """
    code = finished_by_this_application(cfg, client)
    if code is not None:
        return code
    log.info("--skip-existing: nothing new to score: all %s listed keys have a row in %s; no Spark job, no new "
             "file", f"{found.listed:,}", cfg.output_uri)
    # What the run being resumed left: its files, if none of its keys is listed any more; its progress.
    cfg.output.finish_nothing_new(cfg, client, work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key),
                                  found)
    monitor.claim("planning")
    choice = choose_batch(cfg, None, None, 0)
    cfg = replace(cfg, batch_size=choice.chosen)
    stage = dict.fromkeys(("model_check", "plan", "assembly", "assembly_cpu", "output_close"), 0.0)
    made = summarize(cfg, RunOutcome(
        images=0, batches=0, fold=StatsFold(), counts=merge.AssemblyCounts(),
        elapsed=time.time() - monitor.started, model_summary={}, seconds={**stage, **seconds},
        plan=work_prefix.Plan(runs=[], todo=found.new, number=1, resumed=False), fingerprint={},
        precision={"precision": cfg.precision}, batch_size_choice=choice.as_dict(), estimate=None,
        files=dict(monitor.where), existing=found.entry()))
    writes.put_text(client, cfg.output_bucket, cfg.summary_key, json.dumps(made, indent=2) + "\n")
    monitor.write("succeeded", 0, summary=made)
    for line in closing_lines(made, 0):
        log.info("%s", line)
    return 0


@dataclass(frozen=True)
class PlannedRun:
    """A run once its plan is made: what the driver's last steps (Spark, the assembly, the summary) pass around.

    ``cfg`` holds the batch size chosen for the run (:func:`size_run`);
    ``work`` is its work prefix, read and written with ``client``;
    ``images`` every key listed; ``plan`` the keys still to score and the
    earlier runs reused; ``monitor`` writes the status beside the output.
    """

    cfg: JobConfig
    client: Any
    work: work_prefix.WorkPrefix
    images: listing.Listing
    plan: work_prefix.Plan
    monitor: RunMonitor


def planned_run(run: PlannedRun, checked: DriverCheck, sizing: Sizing, scored: tuple, seconds: dict) -> int:
    """The run's end once Spark has scored it: the summary, the last status, the closing lines; the exit code."""
    cfg, images, plan, monitor = run.cfg, run.images, run.plan, run.monitor
    stats, counts, spark_stop = scored
    if stats.last_end is not None:  # the output is whole now: how long after the last task's end
        seconds["output_after_last_task"] = max(0.0, time.time() - stats.last_end)
    summary = summarize(cfg, RunOutcome(
        images=len(images), batches=plan.todo.num_batches(cfg.batch_size), fold=stats,
        counts=counts,
        elapsed=time.time() - monitor.started, model_summary=checked.model_summary, seconds=seconds, plan=plan,
        fingerprint=checked.fingerprint, spark=spark_summary(spark_stop), skipped_keys=images.skipped_keys,
        precision=checked.precision, batch_size_choice=sizing.choice, estimate=sizing.estimate,
        # the manifest's keys that got no line, by reason, and its repeated keys
        manifest=images.manifest, files=dict(monitor.where),
        existing=plan.dataset.existing.entry() if plan.dataset is not None and plan.dataset.existing else None,
        **({cfg.output.summary_field: counts.entry} if cfg.output.summary_field else {})))
    code = finish_run(run, summary, counts)
    monitor.write("succeeded", code, summary=summary)
    for line in closing_lines(summary, code):  # the run's last lines: for the person who started it
        log.info("%s", line)
    if spark_stop is not None:
        stopped = spark_stop.wait()
        log.info("Spark stopped in %s (the executors were released while the output was finished)",
                 f"{stopped:.1f} s" if stopped is not None else "more than 2 minutes; exiting without it")
    return code


def spark_summary(spark_stop: SparkStop | None) -> dict | None:
    """The summary's ``spark``: master, deploy mode, application id and YARN attempt; ``None`` without a Spark job."""
    if spark_stop is None:
        return None
    application, attempt = yarn_attempt()
    return {**spark_stop.context, "yarn_attempt": attempt if application else None}


@dataclass
class DriverCheck:
    """What the driver's checks found: the model loaded here, its summary, the precision report, the fingerprint."""

    #: The model the driver loaded for its check; ``None`` when an executor checked it (:func:`executors_check`).
    classifier: Predictor | None
    model_summary: dict
    precision: dict
    fingerprint: dict
    #: ``--rows-per-file auto``'s ``(rows, why)`` for this model and key list (used by a dataset output only).
    auto_rows: tuple = (0, "")
    #: The estimate's sample, measured by the executor that checked the model; ``None``: the driver measures it.
    sample_cost: SampleCost | None = None


def check_on_driver(cfg: JobConfig, client, images: listing.Listing,
                    start: SparkStart | None = None) -> tuple[JobConfig, DriverCheck]:
    """Load the model, check --top-k against it, quantize for int8, and take the run's fingerprint.

    Before any batch: a bad checkpoint, shape or labels file fails now,
    with its cause, instead of in every task. With ``start``, one executor's
    warm-up has loaded and checked the model and measured the sample
    (:func:`mxjob.executor.model_check.warm_and_check`): its report stands for the
    driver's load, which happens here only if the warm-up could not tell.
    """
    report = executors_report(start)
    if report is not None and report.failure is not None:
        raise JobError(report.failure)
    classifier = load_model_on_driver(cfg) if report is None else None
    model = ModelFacts.of(classifier) if report is None else report.facts
    task = run_task(cfg)
    for warning in task.warnings(cfg, cfg.output_format == "parquet"):
        log.warning("%s", warning)
    try:
        task.check(cfg, model)
    except ValueError as exc:
        raise JobError(str(exc)) from None
    # What the check found that the executors must load too (an embedding's layer); the fingerprint names it.
    cfg = replace(cfg, model=task.checked_spec(cfg.model, model))
    cfg, precision = prepare_precision(cfg, client, images, classifier)
    summary = model.model_summary()
    fingerprint = job_fingerprint(cfg, model, carried_names(cfg, images))
    # What must exist with the run's columns and fingerprint (an Iceberg table), made or refused before any Spark work.
    if cfg.output is not None:
        cfg.output.open(cfg, row_schema(cfg, task, model, images), fingerprint)
    # Only a dataset or a table cuts files: the keys' mean length costs a pass over every key.
    cuts_files = cfg.output is not None and cfg.output.cuts_files
    auto_rows = auto_rows_per_file(cfg, task, images, summary) if cuts_files else (0, "")
    if classifier is not None:
        keep_for_sample(cfg, classifier)
    return cfg, DriverCheck(classifier, summary, precision, fingerprint, auto_rows,
                            report.cost if report is not None else None)


def executors_report(start: SparkStart | None) -> WarmReport | None:
    """The report of the warm-up task that checked the model (:func:`begin_spark`); ``None`` without one.

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
        log.info("an executor checked the model and measured the estimate's sample on %d images as it warmed up; "
                 "the driver loads no MXNet", report.cost.images)
    elif report.failure is None:
        log.info("an executor checked the model as it warmed up; the driver loads no MXNet")
    return report


def keep_for_sample(cfg: JobConfig, classifier: Predictor) -> None:
    """Drop the check's copy of the model from the process's cache unless the driver's sample scores with it.

    The sample loads the model the executors load: int8's quantized one, or
    an embedding's with the layer the check found, are other models; the
    check's copy would then only double the driver's memory while it samples.
    """
    if replace(cfg.job_spec().model, context="cpu") != classifier.spec:
        state.models.clear()


def row_schema(cfg: JobConfig, task: Task, model, images: listing.Listing) -> pa.Schema:
    """The schema of the output's rows: the task's columns for this model, then the carried ones
    (:func:`carried_columns`)."""
    schema = task.result_schema(cfg.job_spec(), model)
    carried = carried_columns(cfg, images)
    return pa.schema(list(schema) + (list(carried.schema) if carried is not None else []),
                     metadata=schema.metadata)


def auto_rows_per_file(cfg: JobConfig, task: Task, images, model_summary: dict) -> tuple[int, str]:
    """``--rows-per-file auto`` for this run (:func:`dataset.auto_rows_per_file`): the keys' mean length, the task's
    row (:meth:`Task.row_bytes`)."""
    keys = getattr(images, "keys", None)
    count = len(images)
    key_bytes = (pc.sum(pc.binary_length(keys)).as_py() or 0) / count if keys is not None and count else 64.0
    return dataset.auto_rows_per_file(key_bytes, *task.row_bytes(cfg, model_summary))


def run_task(cfg: JobConfig) -> Task:
    """The run's task (:func:`mxjob.executor.partition.job_task`); a ``--handler`` it cannot use raises
    :class:`JobError`."""
    try:
        return job_task(cfg.job_spec())
    except HandlerError as exc:
        raise JobError(f"--handler: {exc}") from exc


def score_and_assemble(run: PlannedRun, start: SparkStart | None, seconds: dict,
                       plan_started: float) -> tuple[StatsFold, merge.AssemblyCounts, SparkStop | None]:
    """Run the plan's batches on Spark (if any are left) and merge every durable line into the output.

    The merge follows the run while Spark scores it (:class:`mxjob.outputs.assembly.Assembly`).
    Adds the ``plan``, ``spark``, ``assembly`` (from the job's end to the
    output's) and ``assembly_cpu`` seconds to ``seconds``. Returns the
    stats, the assembly's counts, and the SparkContext's stop (``None``
    without a Spark job), still running: the caller waits for it last.
    """
    cfg, client, work, images, plan, monitor = run.cfg, run.client, run.work, run.images, run.plan, run.monitor
    batches = plan.todo.num_batches(cfg.batch_size)
    log.info("%d images under %s: %s%d batches of up to %d", len(images), cfg.input_uri,
             f"{len(images) - len(plan.todo)} already scored, " if plan.resumed else "",
             batches, cfg.batch_size)
    stats, spark_stop = StatsFold(), None

    def merge(runs, live):
        return assemble_output(cfg, client, work, images, runs, live, plan)

    if batches:
        application, _ = yarn_attempt()
        this_run = work.start_run(plan.number, plan.todo, cfg.batch_size, application)
        seconds["plan"] = time.time() - plan_started
        assembly = Assembly(merge, work, [*plan.runs, this_run], during=True)
        assembly.start()
        spark_started = time.time()
        try:
            stats, spark_stop = run_spark(cfg, this_run, work.plan_key(this_run), start,
                                          on_tick=monitor and monitor.on_tick, ticks=monitor and monitor.ticks)
        except BaseException:
            assembly.cancel()
            raise
        seconds["spark"] = time.time() - spark_started
    else:
        seconds["plan"] = time.time() - plan_started
        assembly = Assembly(merge, work, plan.runs, during=False)
    tail_started = time.time()
    counts = assembly.finish()
    seconds["assembly"] = time.time() - tail_started
    # The driver's own CPU in the merge (reading, checking, compressing); the rest is waiting for S3.
    seconds["assembly_cpu"] = assembly.cpu_seconds
    # Closing the output (its last upload): a part of the assembly's time that no merge can shorten.
    seconds["output_close"] = counts.close_seconds
    live = assembly.live
    log.info("assembled %s from %d parts%s; %.2f s after the Spark job, of which %.2f s closing the output",
             cfg.output_uri, counts.parts_read,
             f" as the batches became durable ({live.left_at_finish} of the run's {live.run.batches} were left to "
             "read when the Spark job ended)" if live is not None and live.left_at_finish is not None else "",
             seconds["assembly"], counts.close_seconds)
    return stats, counts, spark_stop


def finish_run(run: PlannedRun, summary: dict, counts: merge.AssemblyCounts) -> int:
    """Write the summary, remove the work prefix, and return the exit code (3: more errors than --max-errors)."""
    cfg, work = run.cfg, run.work
    writes.put_text(run.client, cfg.output_bucket, cfg.summary_key, json.dumps(summary, indent=2) + "\n")
    for warning in summary["threads"]["warnings"]:
        log.warning("%s", warning)
    removed = work.remove()
    log.info("summary: %s", json.dumps({k: summary[k] for k in (
        "keys_listed", "predicted", "failed", "reused", "scored", "batches", "elapsed_seconds")}))
    log.info("wrote %s and s3://%s/%s; removed %d work objects under %s", cfg.output_uri, cfg.output_bucket,
             cfg.summary_key, removed, work.uri)
    limit = allowed_errors(cfg.max_errors, len(run.images))
    if counts.failed > limit:
        log.error("%d images failed, more than --max-errors %s allows (%d); see the error lines in %s",
                  counts.failed, cfg.max_errors, limit, cfg.output_uri)
        return EXIT_TOO_MANY_ERRORS
    return 0


def durable_status(work: work_prefix.WorkPrefix | None) -> str:
    """``N of M batches are durable under URI`` for the messages of a run that did not finish."""
    if work is None:
        return ""
    try:
        runs = work.runs()
    except Exception as exc:  # noqa: BLE001 - S3 unreachable: say so instead of hiding the first error
        return f"could not read {work.uri} ({first_line(exc)})"
    if not runs:
        return f"nothing was durable yet under {work.uri}"
    last = runs[-1]
    return (f"{len(last.done)} of {last.batches} batches of this run are durable under {work.uri}"
            + (f" (and {sum(len(r.done) for r in runs[:-1])} of earlier runs)" if len(runs) > 1 else ""))


# ----------------------------------------------------------------------------
# Listing


def list_images(client, cfg: JobConfig) -> listing.Listing:
    """Every image key of the input with its size, sorted, limited: a compact :class:`listing.Listing`.

    The keys under the input prefix, listed with ``--list-concurrency`` calls
    in flight (on a client of ``--s3-reader``'s kind), or those
    ``--input-manifest`` names (``client`` reads it). The listing's
    ``bucket`` is the one to read the images from, and a prefix's
    ``skipped_keys`` says which keys were not images. A manifest too large to
    sort in memory is sorted out of core (:mod:`mxjob.inputs.extsort`); under
    ``--dry-run`` its sorted keys then stay on local disk (an
    :class:`extsort.SpilledListing`), since the dry run only plans them.
    """
    if cfg.input_manifest:
        try:
            return manifest.read_manifest(cfg.input_manifest, client, bucket=cfg.input_bucket,
                                          prefix=cfg.input_prefix, suffixes=cfg.suffixes, limit=cfg.limit,
                                          spill=extsort.Spill(in_memory=not cfg.dry_run))
        except manifest.ManifestError as exc:
            raise JobError(str(exc)) from exc
        except OSError as exc:  # unreadable file, full disk for the downloaded copy
            raise JobError(f"cannot read --input-manifest {cfg.input_manifest}: {exc}") from exc
    try:
        # Its own client, with a connection per list call in flight; under --s3-reader lean, one
        # whose parser skips the dates (lean_list.list_client).
        # --with-object-metadata needs the ETags, which only botocore's own parser reads.
        lister = lean_list.list_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts,
                                     max_pool_connections=max(10, cfg.list_concurrency),
                                     kind="botocore" if cfg.with_object_metadata else cfg.s3_reader)
        keys, sizes, *etags = parallel_list.list_prefix(lister, cfg.input_bucket, cfg.input_prefix,
                                                        cfg.list_concurrency, etags=cfg.with_object_metadata)
        skipped = listing.Skipped(suffixes=cfg.suffixes)
        images = listing.Listing.build(cfg.input_bucket, keys, sizes, suffixes=cfg.suffixes, limit=cfg.limit,
                                       carried={"etag": etags[0]} if etags else None, skipped=skipped)
        images.skipped_keys = skipped.entry("not_image")
    except Exception as exc:  # NoSuchBucket, AccessDenied, endpoint unreachable
        raise JobError(f"cannot list {cfg.input_uri}: {first_line(exc)}") from exc
    if not len(images):
        raise JobError(f"no images under {cfg.input_uri} (looked for keys ending in "
                       f"{' '.join(cfg.suffixes)}); check --input and --suffixes")
    return images


# ----------------------------------------------------------------------------
# Assembly


def carried_columns(cfg: JobConfig, images: listing.Listing) -> pa.Table | None:
    """The table :func:`merge.assemble` appends to the rows (a row per key of ``images``), or None."""
    names = carried_names(cfg, images)
    if not names:
        return None
    table = images.table
    columns = {name: table[name] for name in names if name not in ("etag", "size")}
    if cfg.with_object_metadata:
        columns["etag"] = table["etag"] if "etag" in table.column_names else pa.nulls(len(table), pa.string())
        sizes = table["size"]
        columns["size"] = pc.if_else(pc.equal(sizes, listing.UNKNOWN_SIZE), pa.scalar(None, pa.int64()), sizes)
    return pa.table(columns)


def assemble_output(cfg: JobConfig, client, work: work_prefix.WorkPrefix, images: listing.Listing,
                    runs: list | None = None, live: merge.LiveRun | None = None,
                    plan: work_prefix.Plan | None = None) -> merge.AssemblyCounts:
    """Merge the durable lines of ``runs`` (default: every run under ``work``) into the output's sink
    (:meth:`mxjob.outputs.Output.sink`: one object, completed only when whole, or files each completed when
    whole). With ``live``, the merge follows that run's batches as Spark makes them durable (:func:`merge.assemble`).
    """
    sink = cfg.output.sink(cfg, client, work, plan)
    counts = _assemble(cfg, work, images, runs, live, sink)
    counts.entry = cfg.output.summary_entry(sink, plan)
    return counts


def _assemble(cfg: JobConfig, work: work_prefix.WorkPrefix, images: listing.Listing, runs: list | None,
              live: merge.LiveRun | None, sink) -> merge.AssemblyCounts:
    """Merge into ``sink``, then close it; on any failure abort it (nothing partial appears)."""
    try:
        reader = object_reader.s3_reader(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts,
                                         kind=cfg.s3_reader)
        counts = merge.assemble(work, work.runs() if runs is None else runs, images, sink, reader=reader,
                                  carried=carried_columns(cfg, images), live=live)
        closing = time.monotonic()
        sink.close()
        counts.close_seconds = time.monotonic() - closing
    except work_prefix.ResumeError as exc:
        sink.abort()
        raise JobError(str(exc)) from exc
    except BaseException:
        sink.abort()
        raise
    return counts


# ----------------------------------------------------------------------------
# Checks on the driver: handler, model


#: The name the driver gives its copy of ``--handler``, before the file's own name.
HANDLER_PREFIX = "mxinfer_handler_"


def prepare_handler(cfg: JobConfig, client) -> JobConfig:
    """Check --handler on the driver, downloading a URI first; return ``cfg`` with its local file.

    A handler that is missing, fails to import or defines neither function
    stops the run here, before any listing or Spark work.
    """
    if not cfg.handler:
        return cfg
    path = cfg.handler
    try:
        data = reads.read_uri(path, client if uris.is_s3_uri(path) else None)
    except FileNotFoundError:
        raise JobError(f"--handler: {path} does not exist") from None
    except Exception as exc:
        raise JobError(f"cannot read --handler {path}: {first_line(exc)}") from exc
    folder = tempfile.mkdtemp(prefix="mxinfer-handler-")
    # Kept until the driver exits: executors fetch it from the driver while the job runs.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    # Shipped under a name of its own: SparkContext.addFile puts files side by side with
    # the --py-files, so a handler called utils.py would clash with ours (and Spark
    # refuses a second file of one name with different contents).
    path = os.path.join(folder, HANDLER_PREFIX + path.rsplit("/", 1)[-1])
    with open(path, "wb") as handle:
        handle.write(data)
    try:
        handlers = get_handlers(path)
    except HandlerError as exc:
        raise JobError(f"--handler: {str(exc).replace(path, cfg.handler)}") from exc
    log.info("handler %s defines %s", cfg.handler, " and ".join(
        name for name in ("input_handler", "output_handler") if getattr(handlers, name) is not None))
    return replace(cfg, handler_file=path)


def load_model_on_driver(cfg: JobConfig) -> Predictor:
    """The model, loaded on the driver's CPU (the driver need not have a GPU) to check it."""
    import_mxnet()  # timed: the estimate counts each executor's import of MXNet as this one took
    kind = run_task(cfg).model_class
    try:
        # Bound as the executors bind it (at the micro-batch), so the check costs the driver no more memory; and
        # through the worker's cache, where the driver's sample (mxjob.executor.measure.measure) finds it instead of
        # reading and binding the model a second time. size_run drops it.
        return get_model(replace(cfg.model, context="cpu"), cfg.preprocess.input_shape, bound_batch(cfg), kind)
    except Exception as exc:
        raise JobError(load_failure(exc, cfg.model.symbol_uri)) from exc


