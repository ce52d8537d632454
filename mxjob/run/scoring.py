"""The run once its workload is claimed: its batches scored on Spark while the output is assembled, then the summary,
the last status and the exit code (:class:`ClaimedRun`)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mxjob.core.errors import EXIT_TOO_MANY_ERRORS, JobError, first_line, plural
from mxjob.executor.stats import StatsFold
from mxjob.inputs import listing
from mxjob.options.config import JobConfig, allowed_errors
from mxjob.outputs import merge, work_prefix
from mxjob.outputs.assembly import Assembly
from mxjob.outputs.claim import yarn_attempt
from mxjob.planning.sizing import Sizing
from mxjob.reporting.status import RunMonitor
from mxjob.reporting.summary import RunOutcome, closing_lines, summarize
from mxjob.run.checks import DriverCheck
from mxjob.run.cluster import SparkStop, run_spark
from mxjob.run.keys import carried_columns
from mxjob.run.spark_start import SparkStart
from mxjob.s3 import clients, object_reader, writes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClaimedRun:
    """A run once its workload is claimed: what the driver's last steps (Spark, the assembly, the summary) pass around.

    ``cfg`` holds the batch size chosen for the run (:func:`size_run`);
    ``work`` is its work prefix, read and written with ``client``;
    ``images`` every key listed; ``workload`` the keys still to score and the
    earlier runs reused; ``monitor`` writes the status beside the output.
    """

    cfg: JobConfig
    client: Any
    work: work_prefix.WorkPrefix
    images: listing.Listing
    workload: work_prefix.Workload
    monitor: RunMonitor


def end_run(run: ClaimedRun, checked: DriverCheck, sizing: Sizing, scored: tuple, seconds: dict) -> int:
    """The run's end once Spark has scored it: the summary, the last status, the closing lines; the exit code."""
    cfg, images, workload, monitor = run.cfg, run.images, run.workload, run.monitor
    stats, counts, spark_stop = scored
    if stats.last_end is not None:  # the output is whole now: how long after the last task's end
        seconds["output_after_last_task"] = max(0.0, time.time() - stats.last_end)
    summary = summarize(cfg, RunOutcome(
        images=len(images), batches=workload.todo.num_batches(cfg.batch_size), fold=stats, counts=counts,
        elapsed=time.time() - monitor.started, model_summary=checked.model_summary, seconds=seconds, workload=workload,
        fingerprint=checked.fingerprint, spark=spark_summary(spark_stop), skipped_keys=images.skipped_keys,
        precision=checked.precision, batch_size_choice=sizing.choice, estimate=sizing.estimate,
        # the manifest's keys that got no line, by reason, and its repeated keys
        manifest=images.manifest, files=dict(monitor.where),
        existing=workload.layout.existing.entry() if workload.layout is not None and workload.layout.existing else None,
        lease=monitor.lease.entry() if monitor.lease is not None else None,
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


def score_and_assemble(run: ClaimedRun, start: SparkStart | None, seconds: dict,
                       plan_started: float) -> tuple[StatsFold, merge.AssemblyCounts, SparkStop | None]:
    """Run the workload's batches on Spark (if any are left) and merge every durable line into the output.

    The merge follows the run while Spark scores it (:class:`mxjob.outputs.assembly.Assembly`).
    Adds the ``plan``, ``spark``, ``assembly`` (from the job's end to the
    output's) and ``assembly_cpu`` seconds to ``seconds``. Returns the
    stats, the assembly's counts, and the SparkContext's stop (``None``
    without a Spark job), still running: the caller waits for it last.
    """
    cfg, client, work, images, workload, monitor = run.cfg, run.client, run.work, run.images, run.workload, run.monitor
    batches = workload.todo.num_batches(cfg.batch_size)
    log.info("%s under %s: %s%s of up to %d", plural(len(images), "image"), cfg.input_uri,
             f"{len(images) - len(workload.todo)} already scored, " if workload.resumed else "",
             plural(batches, "batch", "batches"), cfg.batch_size)
    stats, spark_stop = StatsFold(), None

    def merge(runs, live):
        return assemble_output(cfg, client, work, images, runs, live, workload, before_close=monitor.check_lease)

    if batches:
        monitor.check_lease()
        this_run = work.start_run(workload.number, workload.todo, cfg.batch_size, yarn_attempt()[0],
                                  run_id=monitor.lease.run_id if monitor.lease is not None else None)
        seconds["plan"] = time.time() - plan_started
        assembly = Assembly(merge, work, [*workload.runs, this_run], during=True)
        assembly.start()
        spark_started = time.time()
        try:
            stats, spark_stop = run_spark(cfg, this_run, work.batches_key(this_run), start,
                                          on_tick=monitor and monitor.on_tick, ticks=monitor and monitor.ticks)
        except BaseException:
            assembly.cancel()
            raise
        seconds["spark"] = time.time() - spark_started
    else:
        seconds["plan"] = time.time() - plan_started
        assembly = Assembly(merge, work, workload.runs, during=False)
    tail_started = time.time()
    counts = assembly.finish()
    seconds["assembly"] = time.time() - tail_started
    # The driver's own CPU in the merge (reading, checking, compressing); the rest is waiting for S3.
    seconds["assembly_cpu"] = assembly.cpu_seconds
    # Closing the output (its last upload): a part of the assembly's time that no merge can shorten.
    seconds["output_close"] = counts.close_seconds
    live = assembly.live
    log.info("assembled %s from %s%s; %.2f s after the Spark job, of which %.2f s closing the output",
             cfg.output_uri, plural(counts.parts_read, "part"),
             f" as the batches became durable ({live.left_at_finish} of the run's {live.run.batches} were left to "
             "read when the Spark job ended)" if live is not None and live.left_at_finish is not None else "",
             seconds["assembly"], counts.close_seconds)
    return stats, counts, spark_stop


def finish_run(run: ClaimedRun, summary: dict, counts: merge.AssemblyCounts) -> int:
    """Write the summary, remove the work prefix, and return the exit code (3: more errors than --max-errors)."""
    cfg, work = run.cfg, run.work
    run.monitor.check_lease()
    writes.put_text(run.client, cfg.output_bucket, cfg.summary_key, json.dumps(summary, indent=2) + "\n")
    for warning in summary["threads"]["warnings"]:
        log.warning("%s", warning)
    try:
        removed = work.remove()
    except clients.S3_ERRORS as exc:  # the output and its summary are published: the run succeeded
        removed = 0
        log.warning("the output is complete, but the work prefix %s could not be removed (%s); remove it with: "
                    "aws s3 rm --recursive %s", work.uri, first_line(exc), work.uri)
    log.info("summary: %s", json.dumps({k: summary[k] for k in (
        "keys_listed", "predicted", "failed", "reused", "scored", "batches", "elapsed_seconds")}))
    log.info("wrote %s and s3://%s/%s; removed %d work objects under %s", cfg.output_uri, cfg.output_bucket,
             cfg.summary_key, removed, work.uri)
    limit = allowed_errors(cfg.max_errors, len(run.images))
    if counts.failed > limit:
        log.error("%s failed, more than --max-errors %s allows (%d); see the error lines in %s",
                  plural(counts.failed, "image"), cfg.max_errors, limit, cfg.output_uri)
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


def assemble_output(  # noqa: PLR0913 - the merge's inputs, then optional ones its callers name
        cfg: JobConfig, client, work: work_prefix.WorkPrefix, images: listing.Listing,
        runs: list | None = None, live: merge.LiveRun | None = None, workload: work_prefix.Workload | None = None, *,
        before_close: Callable[[], None] | None = None) -> merge.AssemblyCounts:
    """Merge the durable lines of ``runs`` (default: every run under ``work``) into the output's sink
    (:meth:`mxjob.outputs.Output.sink`: one object, completed only when whole, or files each completed when
    whole). With ``live``, the merge follows that run's batches as Spark makes them durable (:func:`merge.assemble`).
    ``before_close`` runs just before the output is published (the lease's check): if it raises, the sink is
    aborted and nothing appears.
    """
    sink = cfg.output.sink(cfg, client, work, workload)
    try:  # on any failure the sink is aborted: nothing partial appears
        reader = object_reader.s3_reader(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts,
                                         kind=cfg.s3_reader)
        counts = merge.assemble(work, work.runs() if runs is None else runs, images, sink, reader=reader,
                                  carried=carried_columns(cfg, images), live=live)
        if before_close is not None:
            before_close()
        closing = time.monotonic()
        sink.close()
        counts.close_seconds = time.monotonic() - closing
    except BaseException as exc:
        sink.abort()
        if isinstance(exc, work_prefix.ResumeError):
            raise JobError(str(exc)) from exc
        if isinstance(exc, clients.S3_ERRORS):  # an upload, its completion or a commit failed after its retries
            call = getattr(exc, "operation_name", None) or type(exc).__name__
            raise JobError(f"writing {cfg.output_uri} failed: S3 {call}: {first_line(exc)}; nothing was published, "
                           "and the scored batches stay durable") from exc
        raise
    counts.entry = cfg.output.summary_entry(sink, workload)
    return counts
