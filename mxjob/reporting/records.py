"""The run's own records, each declared once: the summary, ``status.json`` and the dry run's plan.

Each record is a frozen dataclass whose fields carry their JSON type (the
annotation) and a one-line meaning (``metadata["doc"]``), nested where the
document nests (:mod:`mxjob.reporting.record_fields` says how). The builders
(:func:`mxjob.reporting.summary.summarize`, :func:`mxjob.reporting.status.status_document`,
:func:`mxjob.run.dry_run.dry_run`) construct these records and write them with
:func:`mxjob.reporting.record_fields.to_json`. An object whose shape another
module owns (the model's summary, the options, the estimate) is typed
``dict[str, Any]`` here, its meaning pointing to where it is described.

Standard library only: ``python -m mxjob.reporting.watch`` runs where neither Spark nor MXNet is installed.
"""

import dataclasses
from typing import Any, ClassVar, Optional

from mxjob.reporting.record_fields import choice, optional, record, required

#: What ``state`` may be; ``running`` until the driver writes the last status.
STATES = ("running", "succeeded", "failed", "interrupted")
#: What the driver is doing (``stage``), in order: its checks of the handler and the model's files, the
#: listing, the model's check on the driver (and int8's quantization), the plan and Spark's start, then the
#: scoring and the output's assembly. A final status keeps the stage the run ended in.
STAGES = ("starting", "listing", "model_check", "planning", "scoring")
#: The tasks' seconds, summed over executors (:data:`mxjob.executor.stats.StatsFold.STAGES`, in its order).
TASK_SECONDS = (
    ("download", "fetching the images from S3, also summed over each task's download threads (so it can "
                 "exceed `task`)"),
    ("decode", "decoding and resizing the images, summed as `download` is"),
    ("forward", "the model's forward passes"),
    ("wait", "the forward passes waiting for decoded images"),
    ("write", "writing each batch's results (its part)"),
    ("task", "the tasks' wall time"),
    ("cpu", "the Python workers' CPU in tasks, every thread"),
    ("download_cpu", "of `cpu`: the download threads' GETs"),
    ("decode_cpu", "of `cpu`: the download threads' decoding"),
    ("task_thread_cpu", "of `cpu`: the task's own thread (the model's load and Python side, the results, the "
                        "part); the rest of `cpu` is MXNet's threads (the forward passes)"),
)


# ----------------------------------------------------------------------------
# The summary: OUTPUT.summary.json


@record
class SkippedKeys:
    """The keys under the input prefix that were not images (:meth:`mxjob.inputs.listing.Skipped.entry`)."""

    count: int = required("how many keys got no line")
    why: str = required("why: the suffixes they lack")
    examples: list[str] = required("the first ten of them in key order (also on the report)")


@record
class ErrorsByStage:
    """Failed keys by the stage they failed in."""

    download: int = required("keys that could not be read from S3")
    decode: int = required("keys that are not an image the job can decode")
    predict: int = required("keys whose forward pass or output handler failed")


def _stage_fields(extra: tuple = ()) -> list:
    """``extra`` fields, then one float field per :data:`TASK_SECONDS` entry, for :func:`dataclasses.make_dataclass`."""
    return [*extra, *((name, float, required(doc)) for name, doc in TASK_SECONDS)]


#: One executor's tasks (``executors.*``): batches, images, and :data:`TASK_SECONDS`.
ExecutorStats = dataclasses.make_dataclass("ExecutorStats", _stage_fields((
    ("batches", int, required("batches the executor scored")),
    ("images", int, required("images in them")),
)), frozen=True)
#: The summary's ``seconds``: :data:`TASK_SECONDS` summed over executors, then the driver's own stages.
Seconds = dataclasses.make_dataclass("Seconds", [*_stage_fields(), *(
    ("listing", float, required("the driver listing the input, from the run's start")),
    ("model_check", float, required("loading and checking the model on the driver (and int8's quantization)")),
    ("plan", float, required("planning the batches (and, when there are any, writing the plan)")),
    ("spark", float, optional("the Spark job, from submitting it to its last task's end: executors' start-up "
                              "and model loads included", "a Spark job ran")),
    ("assembly", float, required("from the Spark job's end to the output's: the tail of an assembly that ran "
                                 "during the job")),
    ("assembly_cpu", float, required("the driver's CPU in the assembly (reading, checking, compressing)")),
    ("output_close", float, required("the output's last upload: a single object's last part and "
                                     "CompleteMultipartUpload, a dataset's last file")),
    ("output_after_last_task", float, optional("from the last task's end to the output's, whole", "a task ran")),
    ("existing", float, optional("reading the key column of the dataset's files and leaving out the keys they hold",
                                 "`--skip-existing`")),
)], frozen=True)


@record
class Assembly:
    """What the assembly read, and the lines it did not write."""

    parts_read: int = required("parts (one per batch) merged into the output")
    bytes_read: int = required("their bytes")
    lines_dropped: int = required("lines whose key is no longer in the key list (the input changed between runs)")
    lines_superseded: int = required("lines of a key an earlier run had already made durable (that one is kept)")


@record
class S3Retries:
    """S3 attempts the executors retried."""

    request: int = required("requests botocore retried")
    body: int = required("bodies cut off and read again")


@record
class FirstTask:
    """A Python worker's first task, which pays for MXNet's import and the model's load."""

    started: float = required("its start (epoch seconds)")
    ended: float = required("its end (epoch seconds)")
    images: int = required("images in it")
    cpu: Optional[float] = required("its CPU seconds, every thread; `null` when not measured")
    download_cpu: float = optional("of `cpu`: the download threads' GETs", "measured")
    decode_cpu: float = optional("of `cpu`: the download threads' decoding", "measured")
    task_thread_cpu: float = optional("of `cpu`: the task's own thread; the rest is MXNet's threads", "measured")


@record
class TimesIso:
    """A start and an end as ISO 8601 local times."""

    started: str = required("the start, ISO 8601 local time")
    ended: str = required("the end, ISO 8601 local time")


@record
class PythonWorker:
    """One Python worker (``host/executor PID/worker PID``): its tasks, threads and memory."""

    batches: int = required("batches it scored")
    model_loads: int = required("models it loaded")
    threads: Optional[int] = required("MXNet threads in force over all its forward lanes; `null`: MXNet's default")
    lanes: int = required("forward passes it ran at once (`--forward-lanes`)")
    first_task: FirstTask = required("its first task (MXNet's import and the model's load are in it)")
    task_seconds: float = required("seconds in tasks")
    idle_between_tasks_seconds: float = required("seconds between its tasks (Spark handing over the next one)")
    max_rss_bytes: int = optional("its peak resident memory", "measured (Linux)")
    rss_bytes_after_task: dict[str, int] = required("resident memory after its 1st, 2nd, 5th, 10th, 20th, ... "
                                                    "task (by number) and its `last`: flat once warm, or it leaks")
    first_task_iso: TimesIso = required("`first_task`'s start and end as ISO 8601 local times")


@record
class Tasks:
    """The window in which tasks ran: from the first one's start to the last one's end."""

    first_start: Optional[float] = required("the first task's start (epoch seconds); `null` when none ran")
    last_end: Optional[float] = required("the last task's end (epoch seconds); `null` when none ran")
    seconds: Optional[float] = required("the window's length")
    images_per_second: Optional[float] = required("keys the tasks scored / `seconds`")
    first_start_iso: Optional[str] = required("`first_start` as ISO 8601 local time")
    last_end_iso: Optional[str] = required("`last_end` as ISO 8601 local time")


@record
class ExecutorContainer:
    """What YARN gives each executor, in MiB, and the Python workers' peak (:func:`mxjob.run.container_memory.fit`)."""

    limit_mib: int = required("the container's limit: the sum of the next three")
    memory_mib: int = required("`spark.executor.memory`")
    memory_overhead_mib: int = required("`spark.executor.memoryOverhead` (or Spark's default)")
    pyspark_memory_mib: int = required("`spark.executor.pyspark.memory`")
    python_worker_peak_rss_mib: Optional[float] = required("the Python workers' peak resident memory")
    python_worker_peak_share_of_limit: Optional[float] = required("that peak's share of `limit_mib`")


@record
class SparkRun:
    """Where the Spark job ran."""

    version: str = required("Spark's version: 3.5.x on the EMR 7 stack, 4.0.x on EMR 8's")
    python: str = required("the driver's Python version (the executors' is the same on a stack: 3.9 or 3.11 on EMR 7, "
                           "3.11 on EMR 8)")
    master: str = required("the master (`yarn`, `local-cluster[2,1,1024]`, ...)")
    deploy_mode: str = required("`client` or `cluster` (the driver in YARN's ApplicationMaster)")
    application_id: str = required("the application's id")
    executor_container: ExecutorContainer = optional("each executor's container", "on YARN")
    yarn_attempt: Optional[int] = required("the YARN attempt that wrote the summary; `null` outside YARN")


@record
class Host:
    """One host's cores and the MXNet threads its executors used."""

    cores: int = required("the host's cores")
    executors: int = required("executors that ran tasks there, or as many as the plan put there if more")
    threads: int = required("MXNet threads in all: threads per executor x executors")


@record
class Threads:
    """Threads per host, and a warning where threads x executors miss the cores."""

    hosts: dict[str, Host] = required("each host's cores, executors and threads, by host name")
    warnings: list[str] = required("one line per host whose threads x executors differ from its cores")


@record
class Rates:
    """Each images/s figure, named, and what it measures."""

    images_per_second_spark: Optional[float] = required("keys the Spark job scored / `seconds.spark`: the run's "
                                                          "throughput")
    images_per_second_tasks: Optional[float] = required("= `tasks.images_per_second`")
    images_per_second_elapsed: Optional[float] = required("= `images_per_second`")
    what: dict[str, str] = required("what each of the three measures, in words")


@record
class Files:
    """The run's files beside the output."""

    output: str = required("the output")
    summary: str = required("the summary, `KEY.summary.json`")
    report: str = required("the report, `KEY.report.html`")
    status: str = required("the status file, `KEY.status.json`")


@record
class SummaryDataset:
    """A Parquet dataset's files (:func:`mxjob.outputs.dataset_files.summary_of`) and why it has as many rows per
    file."""

    files: int = required("this run's files (`part-NNNNN.parquet`, or a `--skip-existing` run's "
                          "`part-<run>-NNNNN.parquet`), those kept from its interrupted attempt included")
    rows_per_file: int = required("rows per file (the last file may hold fewer)")
    kept_from_an_earlier_run: int = required("files an interrupted run had written and this one kept")
    bytes: int = required("the files' bytes")
    first: Optional[str] = required("the first file's key")
    last: Optional[str] = required("the last file's key")
    rows_per_file_why: str = required("how `--rows-per-file` was chosen")
    run: str = optional("the run's name in its files' names, its UTC start (`20261126T071846Z`)", "`--skip-existing`")
    files_rewritten: int = optional("earlier files rewritten with the rows of their rescored keys in place of "
                                    "the error rows", "`--skip-existing`")


@record
class SummaryTableResume:
    """What a resumed table run found of its earlier attempt (:func:`mxjob.outputs.iceberg_run.settle`)."""

    run: Optional[str] = required("the run's id (in its files' names and its commits' summaries)")
    files_committed_before: int = required("its files the table's history had committed before this attempt")
    files_committed_on_resume: int = required("its whole files no commit named (a driver killed between an "
                                              "upload and its commit), committed by this attempt, once")
    keys_in_its_files: int = required("listed keys left out: its files held their rows already")


@record
class SummaryTable:
    """An Iceberg table output: this run's files and commits
    (:meth:`mxjob.outputs.iceberg_run.TableSink.summary_entry`)."""

    table: str = required("the table, `iceberg://CATALOG/NAMESPACE.TABLE`")
    location: str = required("the table's location")
    run: str = required("the run's id: its files are `mxinfer-<run>-NNNNN.parquet`, its commits' snapshot summaries "
                        "carry it as `mxinfer.run-id`")
    files: int = required("data files this run committed")
    rows: int = required("their rows")
    bytes: int = required("their bytes")
    commits: int = required("snapshots this run committed (every `commit_seconds`, and at the end)")
    snapshot_ids: list[int] = required("their ids, oldest first")
    commit_seconds: int = required("`--commit-seconds`")
    rows_per_file: int = required("rows per file at most (a commit ends a file sooner)")
    rows_per_file_why: str = required("how `--rows-per-file` was chosen")
    error_rows_replaced: int = required("earlier error rows whose keys this run scored again and replaced in the "
                                        "same commits (`--rescore-errors`)")
    resumed: SummaryTableResume = optional("what this attempt found of the run's earlier one", "a resumed run")


@record
class SummaryExisting:
    """What a `--skip-existing` run found in the dataset, and what it left out."""

    keys_in_output: int = required("listed keys with a row in the dataset's files")
    skipped: int = required("of them, keys not scored: their row stands")
    rescored_errors: int = required("of them, keys whose row is an error, scored again (`--rescore-errors`)")
    new_keys: int = required("listed keys without a row, scored")
    files_read: int = required("the earlier runs' files whose key column was read")
    rows_read: int = required("their rows")
    seconds: float = required("reading them and leaving their keys out of the run")


@record
class SummaryLease:
    """The run's lease on the output (docs/resume.md#one-run-at-a-time) and what it cost."""

    key: str = required("the lease object, beside the output")
    run_id: str = required("the run's id in the lease")
    lease_seconds: float = required("how long the lease lasts without renewal")
    requests: int = required("S3 requests the lease made: take, renewals, checks before durable writes, release")
    seconds: float = required("the time those requests took, on the driver, mostly beside the Spark job")
    renewals: int = required("renewals, one per status heartbeat")


@record
class Summary:
    """``OUTPUT.summary.json``: what was scored and reused, where the time went, threads per host."""

    record_name: ClassVar[str] = "summary"

    input: str = required("the `--input` prefix as `s3://bucket/prefix`, or the `--input-manifest` URI")
    output: str = required("the output object, or a dataset's prefix")
    output_format: str = required("`jsonl` or `parquet`")
    keys_listed: int = required("keys listed: the output has one line (row) for each")
    skipped_keys: Optional[SkippedKeys] = required(
        "keys under the `--input` prefix without one of `--suffixes`, which get no line; `null` with "
        "`--input-manifest`, whose `manifest` entry counts its own")
    predicted: int = required("keys with predictions")
    failed: int = required("keys whose line is an error")
    reused: int = required("keys whose line an earlier, interrupted run made durable")
    scored: int = required("keys scored in this run")
    resumed: bool = required("whether this run went on from an earlier one's durable batches")
    runs: int = required("runs that scored the output, this one included")
    errors_by_stage: ErrorsByStage = required("failed keys by stage")
    batches: int = required("batches this run scored (a resume scores fewer than the listing holds)")
    batch_size: int = required("images per batch")
    elapsed_seconds: float = required("seconds from the run's start to the summary")
    images_per_second: Optional[float] = required("keys scored / `elapsed_seconds`")
    seconds: Seconds = required("seconds by stage: the tasks' summed over executors, then the driver's own")
    assembly: Assembly = required("what the assembly read and did not write")
    executors: dict[str, ExecutorStats] = required("each executor's batches, images and seconds, by `host/PID`")
    s3_retries: S3Retries = required("S3 attempts retried on the executors")
    python_workers: dict[str, PythonWorker] = required("each Python worker, by `host/executor PID/worker PID`")
    tasks: Tasks = required("the tasks' window: first start to last end, and the images/s between them")
    driver_max_rss_bytes: Optional[int] = required("the driver's peak resident memory")
    spark: Optional[SparkRun] = required("where the Spark job ran; `null` when the run started no Spark job")
    retried_batches: int = required("batches whose line came from a second or later attempt of their task")
    lost_task_attempts: Optional[int] = required("task attempts that failed and ran again (a lost node's "
                                                 "in-flight batches): Spark's count")
    model: dict[str, Any] = required(
        "the model: its files (`symbol`, `params`; `labels`, the labels file the lines' labels came from: "
        "`synset.txt` beside the model when `--labels` is not given, `null` without labels), `parameters`, "
        "`inputs`, `outputs`, classes, head, and `labels_count`, the labels file's lines")
    fingerprint: dict[str, Any] = required("what every line depends on; a `--resume` must match it")
    options: dict[str, Any] = required("every option, as the run resolved it")
    threads: Threads = required("threads per host")
    rates: Rates = required("each images/s figure and what it measures")
    seconds_what: str = required("what `seconds` sums, in words")
    precision: dict[str, Any] = required("the precision the run scored in; with int8, its check against fp32 "
                                         "(see [int8](int8.md))")
    batch_size_choice: dict[str, Any] = required("what `--batch-size auto` chose and why (see "
                                                 "[Planning a run](planning.md))")
    estimate: Optional[dict[str, Any]] = required("the run's time and cost as estimated before it (see "
                                                  "[Planning a run](planning.md)); `null` with "
                                                  "`--estimate-images 0`")
    manifest: dict[str, Any] = optional("the manifest's keys and those that got no line, by reason (see "
                                        "[Input](input.md))", "with `--input-manifest`")
    files: Files = required("where the run's files are")
    dataset: SummaryDataset = optional("the dataset's files", "a Parquet dataset output")
    existing: SummaryExisting = optional("the keys the dataset held already: `keys_listed` counts them, and "
                                         "`skipped` of them got no new row", "`--skip-existing`")
    table: SummaryTable = optional("the Iceberg table's files and commits", "an Iceberg table output")
    lease: SummaryLease = optional("the run's lease on the output and its cost", "a run that took one")


# ----------------------------------------------------------------------------
# The status: OUTPUT.status.json


@record
class Done:
    """How many of a total are done."""

    done: int = required("done so far (when the run has ended: durable, what `--resume` skips)")
    total: int = required("in the run")


@record
class Status:
    """``OUTPUT.status.json``: what the run is doing, how far it is, and how it ended."""

    record_name: ClassVar[str] = "status"

    state: str = choice("`running` until the driver writes the last status, then `succeeded`, `failed` or "
                        "`interrupted`", STATES)
    stage: str = choice("what the driver is doing, or was doing when the run ended: `starting` (its checks of "
                        "the handler and the model's files), `listing`, `model_check` (the model on the driver, "
                        "int8's quantization), `planning` (up to Spark's first batch), `scoring` (with the "
                        "output's assembly)", STAGES)
    updated: float = required("when it was written (epoch seconds): `mxjob.reporting.watch` gives up when it stops "
                              "changing")
    updated_iso: str = required("`updated` as ISO 8601 local time")
    started: float = required("the run's start (epoch seconds)")
    started_iso: str = required("`started` as ISO 8601 local time")
    elapsed_seconds: float = required("seconds since the run's start")
    output: str = required("the output")
    summary: str = required("where the summary goes")
    report: str = required("the report beside it")
    status: str = required("this file")
    batches: Done = optional("batches done and in the run's Spark job (not a resume's reused ones)",
                             "once the batches run")
    keys: Done = optional("keys done and in the run's Spark job", "once the batches run")
    errors: int = optional("keys failed so far", "once the batches run")
    images_per_second: Optional[float] = optional("keys done / seconds since the first task started",
                                                  "once the batches run")
    images_per_second_recent: Optional[float] = optional("the rate over the last progress ticks",
                                                         "once the batches run")
    eta_seconds: Optional[float] = optional("seconds left; `null` while estimating and once the run has ended",
                                            "once the batches run")
    predicted_end_iso: Optional[str] = optional("the predicted end, ISO 8601 local time; `null` as `eta_seconds` "
                                                "is", "once the batches run")
    exit_code: int = optional("the driver's exit code: what `mxjob.reporting.watch` exits with", "the run has ended")
    message: str = optional("why it failed or was interrupted", "a failed or interrupted run")
    resume_command: str = optional("the command that resumes the run", "until the run succeeds")


# ----------------------------------------------------------------------------
# The dry run's plan: the last line of --dry-run's standard output


@record
class PlanDataset:
    """A Parquet dataset output's files, as the run would write them."""

    rows_per_file: int = required("rows per file")
    why: str = required("how `--rows-per-file` was chosen")
    files: int = required("files the output will have")
    files_kept: int = required("files an interrupted run wrote that a `--resume` keeps")


@record
class Plan:
    """``--dry-run``'s plan: the checks passed, the batches, one image scored, the estimate."""

    record_name: ClassVar[str] = "plan"

    input: str = required("the `--input` prefix as `s3://bucket/prefix`, or the `--input-manifest` URI")
    output: Optional[str] = required("the output; `null` without `--output`")
    output_format: str = required("`jsonl` or `parquet`")
    output_writable: Optional[bool] = required("`true`: a probe object was written beside the output and "
                                               "deleted; `null` without `--output`")
    images: int = required("keys listed")
    to_score: int = required("keys the run would score (fewer for a `--resume`)")
    batch_size: int = required("images per batch")
    batch_size_choice: dict[str, Any] = required("what `--batch-size auto` chose and why (see "
                                                 "[Planning a run](planning.md))")
    batches: int = required("batches of the listing")
    partitions: int = required("Spark partitions: one per batch")
    plan_bytes: int = required("the batch plan's size, which the executors read")
    first_key: str = required("the listing's first key")
    last_key: str = required("the listing's last key")
    model: dict[str, Any] = required("the model as loaded on the driver: parameters, inputs, outputs, classes, head")
    sample: dict[str, Any] = required("the first key's output line, scored on the driver's CPU")
    sample_seconds: dict[str, float] = required("its task's seconds by stage, as an executor measures them "
                                                "(`download`, `decode`, `forward`, ..., `task`: the whole)")
    estimate: Optional[dict[str, Any]] = required("the run's time and cost (see [Planning a run](planning.md)); "
                                                  "`null` with `--estimate-images 0`")
    dataset: PlanDataset = optional("the dataset's rows per file and files", "a Parquet dataset output")
    existing: SummaryExisting = optional("the keys the dataset holds already and those the run would score; "
                                         "`images` counts every key listed, `to_score` the rest", "`--skip-existing`")


# ----------------------------------------------------------------------------
# Writing and checking


# ----------------------------------------------------------------------------
# The docs' tables


