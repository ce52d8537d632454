"""The run's summary (``OUTPUT.summary.json``): what was scored and reused, where the time went, threads per host."""

from __future__ import annotations

from dataclasses import dataclass

from mxjob.core.errors import EXIT_TOO_MANY_ERRORS, plural
from mxjob.executor.stats import StatsFold
from mxjob.model.worker import memory_bytes
from mxjob.options.config import JobConfig
from mxjob.outputs import merge, work_prefix
from mxjob.reporting import records
from mxjob.reporting.progress import duration, iso
from mxjob.reporting.record_fields import ABSENT, to_json


@dataclass(frozen=True)
class RunOutcome:
    """What a run came to, as its summary reports it (:func:`summarize`): the driver's
    :func:`mxjob.run.scoring.end_run`
    builds it once the output is whole.

    Attributes
    ----------
    images : int
        Keys listed.
    batches : int
        Batches this run scored (a resume scores fewer than the listing holds).
    fold : StatsFold
        The tasks' stats, folded (the job's accumulator).
    counts : merge.AssemblyCounts
        Lines in the output: predicted, failed, and what the assembly read and dropped.
    elapsed : float
        Seconds from start to the summary.
    model_summary : dict
        :meth:`Predictor.model_summary` of the checked model.
    seconds : dict
        The driver's own stages: ``listing``, ``model_check``, ``plan``, ``spark``, ``assembly`` (from the Spark
        job's end to the output's), ``assembly_cpu``, ``output_close`` (the output's last upload: a single
        object's last part and CompleteMultipartUpload, a dataset's last file) and ``output_after_last_task``
        (from the last task's end to the output's, whole).
    plan : work_prefix.Workload
        The earlier runs reused and the keys scored.
    fingerprint : dict
        What every line depends on (:func:`fingerprint.fingerprint`).
    spark : dict, optional
        Where the Spark job ran: ``version``, ``master``, ``deploy_mode``, ``application_id`` and
        ``yarn_attempt`` (``None`` outside YARN); ``None`` when this run started no Spark job.
    skipped_keys : dict, optional
        A prefix's keys that were not images (``count``, ``why``, ``examples``:
        :meth:`listing.Skipped.entry`); ``None`` for a manifest, whose own
        entry counts them.
    precision, batch_size_choice, estimate, manifest, files, dataset : optional
        The driver's checks and sizing, the input manifest's report, the run's files
        (:attr:`RunMonitor.where`) and a dataset's files; a field not given (``manifest`` or
        ``dataset`` None) is left out.
    existing : dict, optional
        A ``--skip-existing`` run's :meth:`mxjob.outputs.existing.Existing.entry`: ``images`` then counts the keys
        it scored or reused, and the summary's ``keys_listed`` adds the ``skipped`` ones.
    """

    images: int
    batches: int
    fold: StatsFold
    counts: merge.AssemblyCounts
    elapsed: float
    model_summary: dict
    seconds: dict
    workload: work_prefix.Workload
    fingerprint: dict
    spark: dict | None = None
    skipped_keys: dict | None = None
    precision: dict = ABSENT
    batch_size_choice: dict = ABSENT
    estimate: dict | None = ABSENT
    manifest: dict | None = None
    files: dict = ABSENT
    dataset: dict | None = None
    existing: dict | None = None
    #: An Iceberg table output's files and commits (:meth:`mxjob.outputs.iceberg_run.TableSink.summary_entry`).
    table: dict | None = None
    #: The run's lease on the output (:meth:`mxjob.outputs.lease.Lease.entry`).
    lease: dict | None = None


def summarize(cfg: JobConfig, run: RunOutcome) -> dict:
    """The run's summary, as written to ``OUTPUT.summary.json``.

    Parameters
    ----------
    cfg : JobConfig
        The run's settings; the summary repeats them under ``options``.
    run : RunOutcome
        What the run came to: counts, stats, the driver's seconds, plan, fingerprint, Spark's context, and
        the driver's checks and sizing.

    Returns
    -------
    dict
        :func:`record_fields.to_json` of a :class:`records.Summary`: counts first (listed,
        predicted, failed, reused, scored), then time (``elapsed_seconds``,
        ``seconds`` by stage summed over executors and the driver's own, the
        tasks' window), then per executor, per Python worker and per host
        (``threads``), then the model, fingerprint and options, the rates named.
    """
    fold, counts, workload, images, elapsed = run.fold, run.counts, run.workload, run.images, run.elapsed
    executors = {name: records.ExecutorStats(**{k: round(v, 3) if isinstance(v, float) else v for k, v in e.items()})
                 for name, e in fold.executors.items()}
    # Throughput while tasks ran: from the first task's start to the last one's end
    # (elapsed_seconds also counts listing, Spark start-up and the assembly).
    window = fold.last_end - fold.first_start if fold.first_start is not None else None
    tasks = records.Tasks(first_start=fold.first_start, last_end=fold.last_end,
                          seconds=round(window, 3) if window else None,
                          images_per_second=round(fold.keys / window, 2) if window else None,
                          first_start_iso=iso(fold.first_start), last_end_iso=iso(fold.last_end))
    stage_seconds = records.Seconds(**{k: round(sum(e[k] for e in fold.executors.values()), 3) for k in fold.STAGES},
                                    **{k: round(v, 3) for k, v in run.seconds.items()})
    images_per_second = round(fold.keys / elapsed, 2) if elapsed > 0 else None
    spark_seconds = stage_seconds.spark or None  # ABSENT without a Spark job; rounded, as the summary shows it
    return to_json(records.Summary(
        input=cfg.input_uri, output=cfg.output_uri, output_format=cfg.output_format,
        keys_listed=images + (run.existing["skipped"] if run.existing is not None else 0),
        skipped_keys=records.SkippedKeys(**run.skipped_keys) if run.skipped_keys is not None else None,
        predicted=counts.predicted, failed=counts.failed,
        # reused: keys whose line an earlier run made durable; scored: keys this run scored.
        reused=images - len(workload.todo), scored=fold.keys, resumed=workload.resumed, runs=workload.number,
        errors_by_stage=records.ErrorsByStage(**fold.errors), batches=run.batches, batch_size=cfg.batch_size,
        elapsed_seconds=round(elapsed, 3), images_per_second=images_per_second, seconds=stage_seconds,
        assembly=records.Assembly(parts_read=counts.parts_read, bytes_read=counts.bytes_read,
                                  lines_dropped=counts.dropped, lines_superseded=counts.superseded),
        executors=executors, s3_retries=records.S3Retries(**fold.s3_retries),
        python_workers={name: python_worker(fold.worker_summary(name)) for name in sorted(fold.workers)},
        tasks=tasks, driver_max_rss_bytes=memory_bytes()["max_rss"], spark=spark_run(run.spark),
        # Batches whose result came from a retried task (lost worker or executor, ...).
        retried_batches=fold.retried,
        # Task attempts that failed and were run again (a lost spot node's in-flight batches): Spark's count.
        lost_task_attempts=fold.lost_task_attempts,
        # A classifier's model_summary replaces "labels" with the file it read, and adds "labels_count".
        model={"symbol": cfg.model.symbol_uri, "params": cfg.model.params_uri,
               "labels": cfg.model.labels_uri, **run.model_summary},
        fingerprint=run.fingerprint, options=cfg.options(), threads=thread_fit(fold),
        # Beside the machine fields, what a person reads: the rates, named (images_per_second and
        # tasks.images_per_second stay), and what the seconds sum.
        rates=records.Rates(images_per_second_spark=round(fold.keys / spark_seconds, 2) if spark_seconds else None,
                            images_per_second_tasks=tasks.images_per_second,
                            images_per_second_elapsed=images_per_second, what=RATES), seconds_what=SECONDS_WHAT,
        precision=run.precision, batch_size_choice=run.batch_size_choice, estimate=run.estimate,
        manifest=ABSENT if run.manifest is None else run.manifest,
        files=records.Files(**run.files) if run.files is not ABSENT else ABSENT,
        dataset=ABSENT if run.dataset is None else records.SummaryDataset(**run.dataset),
        existing=ABSENT if run.existing is None else records.SummaryExisting(**run.existing),
        table=ABSENT if run.table is None else summary_table(run.table),
        lease=ABSENT if run.lease is None else records.SummaryLease(**run.lease),
    ))


def summary_table(entry: dict) -> records.SummaryTable:
    """The summary's ``table`` record from :meth:`mxjob.outputs.iceberg_run.TableSink.summary_entry`."""
    resumed = entry.get("resumed")
    return records.SummaryTable(
        **{**entry, "resumed": ABSENT if resumed is None else records.SummaryTableResume(**resumed)})


#: What each of the summary's rates measures (``rates.what``).
RATES = {
    "images_per_second_spark": "keys the Spark job scored / seconds of the Spark job (from submitting it to its "
                               "last task's end, with the executors' start-up and model loads): the run's throughput",
    "images_per_second_tasks": "keys the tasks scored / seconds from the first task's start to the last task's end",
    "images_per_second_elapsed": "keys scored / elapsed_seconds (the whole run: listing, model check, Spark, "
                                 "assembly)",
}
#: What the summary's ``seconds`` sum (``seconds_what``): download and decode run on the download threads and
#: are summed over them, so with --io-threads 8 they can exceed "task", the task threads' wall time.
SECONDS_WHAT = ("seconds summed over executors; download and decode are also summed over each task's download "
                "threads, so they overlap the rest and can exceed task; cpu is the Python workers' CPU in tasks, "
                "every thread: download_cpu and decode_cpu its download threads', task_thread_cpu the task's own "
                "thread's (the model's load and Python side, results, the part), the rest MXNet's threads (the "
                "forward passes; with several forward lanes, the lanes' threads and the model's Python side with "
                "them)")


def python_worker(worker: dict) -> records.PythonWorker:
    """One Python worker's entry (:meth:`StatsFold.worker_summary`), with its first task's times in ISO 8601 beside
    the epoch ones: beside ``first_task``, not in it, so that ``first_task`` keeps its machine shape."""
    first = worker["first_task"]
    times = records.TimesIso(started=iso(first["started"]), ended=iso(first["ended"]))
    return records.PythonWorker(**{**worker, "first_task": records.FirstTask(**first), "first_task_iso": times})


def spark_run(spark: dict | None) -> records.SparkRun | None:
    """The summary's ``spark`` (where the Spark job ran) from the driver's dict, or ``None`` without a Spark job."""
    if spark is None:
        return None
    container = spark.get("executor_container")
    nested = {"executor_container": records.ExecutorContainer(**container)} if container else {}
    return records.SparkRun(**{**spark, **nested})


def closing_lines(summary: dict, code: int) -> list[str]:
    """The run's last lines, for a person: counts, errors by kind, wall time, one images/s, where things are.

    Parameters
    ----------
    summary : dict
        The run's summary (:func:`summarize`, with ``files``).
    code : int
        The exit code: 3 adds the line that says too many images failed.
    """
    errors = ", ".join(f"{stage} {n:,}" for stage, n in summary["errors_by_stage"].items() if n) or "none"
    rate = summary["rates"]["images_per_second_spark"]
    files = summary.get("files", {})
    existing = summary.get("existing")
    # The whole run's rate, named, after the Spark job's: the summary's images_per_second is this one.
    elapsed = summary["rates"].get("images_per_second_elapsed")
    whole = f", {elapsed:,.1f} over the whole run (keys scored / elapsed seconds)" if elapsed else ""
    lines = [
        f"run finished: {summary['keys_listed']:,} keys, {summary['predicted']:,} predicted, "
        f"{summary['failed']:,} failed ({errors}); {summary['reused']:,} reused from an earlier run"
        + (f"; {existing['skipped']:,} skipped: already in the output" if existing else ""),
        f"wall time {duration(summary['elapsed_seconds'])} (Spark job {duration(summary['seconds'].get('spark', 0))}); "
        + (f"{rate:,.1f} images/s (keys scored / Spark job wall seconds){whole}" if rate
           else "nothing scored in this run"),
        f"output:  {summary['output']}",
        f"report:  {files.get('report', '-')} (copy it here and open it in a browser)",
        f"summary: {files.get('summary', '-')}",
    ]
    if code == EXIT_TOO_MANY_ERRORS:
        lines.append(f"exit {code}: more images failed than --max-errors allows; see the error lines in the output")
    return lines


def thread_fit(fold: StatsFold) -> records.Threads:
    """Per host: its cores, executors and MXNet threads in all; a warning where threads x executors miss the cores.

    ``fold`` holds the tasks' stats. The
    executors are those that ran tasks, or as many as the driver's plan
    put on the host if more (an executor may get no task in a small job).
    Assumes one task at a time per executor (``spark.executor.cores=1``, the
    job's shape); an executor's threads are the most any of its workers used.
    """
    out = records.Threads(hosts={}, warnings=[])
    for host, h in sorted(fold.hosts.items()):
        executors = max(len(h["executors"]), h["planned"])
        total = max(h["executors"].values()) * executors
        out.hosts[host] = records.Host(cores=h["cores"], executors=executors, threads=total)
        if total != h["cores"]:
            fit = "cores left idle" if total < h["cores"] else "threads wait for cores"
            out.warnings.append(
                f"host {host}: {plural(executors, 'executor')} x {max(h['executors'].values())} MXNet threads = "
                f"{total} on {h['cores']} cores ({fit}); leave --threads and spark.executorEnv.OMP_NUM_THREADS unset "
                "to fit the node, or set them to cores / executors per host")
    return out
