"""One run on the driver, from listing to summary: :func:`run_job` and its steps, in the pipeline's order.

Check the output, the handler and the model's files (:mod:`mxjob.run.checks`), list the keys
(:mod:`mxjob.run.keys`) while Spark starts and the executors warm up (:mod:`mxjob.run.warm_up`), check the
model (:func:`mxjob.run.checks.check_on_driver`), decide between a fresh run and a resume
(:mod:`mxjob.outputs.claim`), size the batches (:mod:`mxjob.planning.sizing`), then score them and assemble
the output (:mod:`mxjob.run.scoring`). ``--dry-run`` makes every check and scores one image instead of
starting Spark (:mod:`mxjob.run.dry_run`).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace

from mxjob.core.errors import JobError
from mxjob.executor.stats import StatsFold
from mxjob.options.config import JobConfig, own_inputs_problem
from mxjob.outputs import claim, merge, work_prefix
from mxjob.outputs.lease import Lease, LeaseLost
from mxjob.planning.sizing import choose_batch, size_run
from mxjob.reporting.progress import STATUS_SECONDS
from mxjob.reporting.status import RunMonitor
from mxjob.reporting.summary import RunOutcome, closing_lines, summarize
from mxjob.run import signals
from mxjob.run.checks import check_model_files, check_on_driver, prepare_handler
from mxjob.run.dry_run import dry_run
from mxjob.run.keys import list_images
from mxjob.run.scoring import ClaimedRun, end_run, score_and_assemble
from mxjob.run.signals import Interrupted
from mxjob.run.spark_start import SparkStart
from mxjob.run.warm_up import early_spark, executors_check, warm_early, warm_up
from mxjob.s3 import clients, writes

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
    retry = claim.yarn_attempt()[1] > 1
    lease = None
    # The output's home (an Iceberg table's is beside its location) holds the run's status, summary and work.
    if cfg.output is not None:  # (a dry run may name none)
        cfg = replace(cfg, output=cfg.output.locate(cfg))
        # The output first: seconds, where the listing may take hours. A refused run writes nothing beside it.
        done = claim.complete_already(cfg, client)
        if done is not None:
            log.info("%s is already complete (its summary is s3://%s/%s); nothing to resume", cfg.output_uri,
                     cfg.output_bucket, cfg.summary_key)
            return done.exit_code
        lease = claim_output(cfg, client, retry)
    try:
        return monitored_run(cfg, client, started, resume_command, retry, spark_conf, lease)
    finally:
        if lease is not None:
            lease.release()


def claim_output(cfg: JobConfig, client, retry: bool) -> Lease | None:
    """Refuse now what refuses the run without a listing, then take the output's lease (none for a dry run).

    An Iceberg table's home that would overwrite what the run reads or sits
    in the input (``resolve`` refused any other output that would); an
    output that is refused (it exists, or a dataset's prefix holds objects
    the job did not write) or cannot be written; another run's live lease,
    named with what to do; an earlier run's progress this run does not
    resume.
    All read only, so a refused run leaves the status and files there as
    they were. Then the lease (:mod:`mxjob.outputs.lease`), renewed every
    :data:`STATUS_SECONDS` while the run lives: from here on no other run
    writes the output.
    """
    problem = own_inputs_problem(cfg)  # again: an Iceberg table's home is known only now
    if problem:
        raise JobError(problem)
    cfg.output.check(cfg, client, yarn_retry=retry)
    lease = claim.output_lease(cfg, client)
    lease.refuse_if_held(resume=cfg.resume, output_uri=cfg.output_uri)
    if cfg.dry_run:
        return None
    claim.refuse_unresumed_progress(cfg, client, retry)
    lease.take(resume=cfg.resume, output_uri=cfg.output_uri)
    lease.keep_renewed(STATUS_SECONDS)
    return lease


def monitored_run(cfg: JobConfig, client, started: float, resume_command: str | None, retry: bool,
                  spark_conf: dict | None, lease: Lease | None) -> int:
    """The run under its status (:func:`open_status`) and its early SparkContext, started once the handler and the
    model's files are found; returns the exit code."""
    monitor = RunMonitor(client, cfg.output_bucket, cfg.output_key, started, resume_command,
                         {"options": cfg.options()}, output_uri=cfg.output_uri)
    monitor.lease = lease
    start = None
    try:  # from the status's first write on: a signal while it is written, or while Spark starts, ends the run too
        open_status(cfg, monitor, retry)
        # The handler and the model's files before Spark and the listing: seconds, where the listing may take hours.
        cfg = prepare_handler(cfg, client)
        check_model_files(cfg.model)
        start = early_spark(cfg, spark_conf)
        code = checked_run(cfg, client, monitor, spark_conf, start)
    except (Exception, Interrupted) as exc:
        signals.ending.set()
        monitor.ended(exc)  # the status says why (if it is this run's): mxjob.reporting.watch exits with the job's code
        if start is not None and not isinstance(exc, Interrupted):  # a signal's JVM shutdown stops Spark itself
            start.stop()
        raise
    finally:
        monitor.close()
    if start is not None:
        start.stop()  # a run that needed no Spark job (the run's own job stopped it already)
    return code


def open_status(cfg: JobConfig, monitor: RunMonitor, retry: bool) -> None:
    """Claim the run's status at once (status "running") for a run that nothing can refuse now.

    The status beside the output is this run's at once for ``--overwrite``
    and for a fresh run (everything that would refuse them is refused
    already: :func:`claim_output`), so ``mxjob.reporting.watch`` never reads
    the earlier run's final state as this run's. A ``--resume`` (or YARN's
    next attempt) claims it only at its plan, once the earlier run's
    fingerprint is found to be its own: a resume refused for changed
    settings leaves the stopped run's status, report and resume command as
    they were. A dry run writes none. With the monitor's lease, nothing is
    written once the lease is lost.
    """
    if not cfg.dry_run and (cfg.overwrite or not (cfg.resume or retry)):
        monitor.claim("starting")


def checked_run(cfg: JobConfig, client, monitor: RunMonitor, spark_conf: dict | None,
                start: SparkStart | None = None) -> int:
    """:func:`run_job` once the output, the handler and the model's files are checked: the listing, the driver's
    checks, the plan, then the scoring (:func:`end_run`)."""
    seconds: dict[str, float] = {}
    monitor.enter("listing")
    images = list_images(client, cfg)
    cfg = replace(cfg, input_bucket=images.bucket)  # a manifest names the bucket the executors read
    seconds["listing"] = time.time() - monitor.started
    images, found, settled = keys_to_score(cfg, client, monitor, images, seconds)
    if found is not None and not len(images) and not cfg.dry_run:
        return nothing_new(cfg, client, monitor, found, seconds)
    warmed = warm_early(start, cfg, images)
    check_started = time.time()
    monitor.enter("model_check")
    cfg, checked = check_on_driver(cfg, client, images, start if warmed and executors_check(cfg) else None)
    if not warmed:
        warm_up(start, cfg)  # the checked model (int8's, the layer found): loaded while the driver samples and plans
    inputs = claim.WorkloadInputs(checked.auto_rows, found)
    if cfg.dry_run:
        return dry_run(cfg, images, checked.classifier, client, checked.fingerprint, inputs)
    checked.classifier = None  # checked: the driver needs the model no more (its cache keeps it for the sample)
    seconds["model_check"] = time.time() - check_started
    plan_started = time.time()
    monitor.enter("planning")
    work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    monitor.check_lease()  # the plan records the run, or clears the earlier one's under --overwrite
    try:
        workload = claim.claim_workload(cfg, client, work, images, checked.fingerprint, inputs=inputs)
        if workload.layout is not None:
            workload.layout.settled = settled
    except claim.Completed as done:
        log.info("%s is already complete (its summary is s3://%s/%s); nothing to resume", cfg.output_uri,
                 cfg.output_bucket, cfg.summary_key)
        return done.exit_code
    # Before the run's plan is written (score_and_assemble): its batches are of the size chosen here.
    cfg, sizing = size_run(cfg, images, len(workload.todo), spark_conf,
                           head_start=start.head_start() if start is not None else 0.0, measured=checked.sample_cost)
    monitor.context = {"options": cfg.options(), "fingerprint": checked.fingerprint}
    monitor.claim("planning")  # from the plan on the files are this run's, whoever's they were
    run = ClaimedRun(cfg, client, work, images, workload, monitor)
    try:
        scored = score_and_assemble(run, start, seconds, plan_started)
    except (JobError, Interrupted) as exc:
        if not isinstance(exc, LeaseLost):  # the output is another run's now: nothing of this one to resume
            exc.work = work  # main() says what is durable and how to resume
        raise
    return end_run(run, checked, sizing, scored, seconds)


def keys_to_score(cfg: JobConfig, client, monitor: RunMonitor, images, seconds: dict) -> tuple:
    """``(keys, found, settled)``: the listed keys less those the output holds already (``--skip-existing``: what
    it found) and those a resumed run's whole files hold (committed first: what was settled)."""
    found, settled = None, None
    if not cfg.dry_run:  # what a resumed run left that the output takes first (a table's whole files committed)
        monitor.check_lease()
        images, settled = cfg.output.settle(cfg, client, images)
    if cfg.skip_existing:  # the run's keys are those the output lacks: the full listing goes now
        found = cfg.output.existing(cfg, client, images)
        images, seconds["existing"] = found.new, found.seconds
    elif settled is not None and not len(images):
        found = settled.nothing_left(images)
    return images, found, settled


def nothing_new(cfg: JobConfig, client, monitor: RunMonitor, found, seconds: dict) -> int:
    """End a ``--skip-existing`` run whose every listed key has its row already: no Spark job, no new file.

    The summary and the status say so; the exit code is 0, or the code of
    YARN's earlier attempt of this application if that attempt finished the
    run (it wrote these rows, then exited with it).
    """
    code = claim.finished_by_this_application(cfg, client)
    if code is not None:
        return code
    log.info("--skip-existing: nothing new to score: all %s listed keys have a row in %s; no Spark job, no new "
             "file", f"{found.listed:,}", cfg.output_uri)
    # What the run being resumed left: its files, if none of its keys is listed any more; its progress.
    monitor.check_lease()
    cfg.output.finish_nothing_new(cfg, client, work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key),
                                  found)
    monitor.claim("planning")
    choice = choose_batch(cfg, None, None, 0)
    cfg = replace(cfg, batch_size=choice.chosen)
    stage = dict.fromkeys(("model_check", "plan", "assembly", "assembly_cpu", "output_close"), 0.0)
    made = summarize(cfg, RunOutcome(
        images=0, batches=0, fold=StatsFold(), counts=merge.AssemblyCounts(),
        elapsed=time.time() - monitor.started, model_summary={}, seconds={**stage, **seconds},
        workload=work_prefix.Workload(runs=[], todo=found.new, number=1, resumed=False), fingerprint={},
        precision={"precision": cfg.precision}, batch_size_choice=choice.as_dict(), estimate=None,
        files=dict(monitor.where), existing=found.entry(), lease=monitor.lease.entry() if monitor.lease else None))
    writes.put_text(client, cfg.output_bucket, cfg.summary_key, json.dumps(made, indent=2) + "\n")
    monitor.write("succeeded", 0, summary=made)
    for line in closing_lines(made, 0):
        log.info("%s", line)
    return 0


# ----------------------------------------------------------------------------
# Listing


# ----------------------------------------------------------------------------
# Assembly


# ----------------------------------------------------------------------------
# Checks on the driver: handler, model


