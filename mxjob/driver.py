"""One run on the driver, from listing to summary: :func:`run_job` and its steps.

List (or read the manifest), check the model and the handler on the driver,
quantize for ``--precision int8``, decide between a fresh run and a resume
(:func:`plan_output`), run the batches on Spark (:mod:`mxjob.cluster`),
assemble the durable lines into the output (:mod:`mxjob.durable`), write the
summary (:mod:`mxjob.summary`). ``--dry-run`` makes every check and scores
one image instead of starting Spark (:func:`dry_run`).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import NoReturn

import click
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

import utils
from mxjob import (
    batchsize,
    dataset,
    durable,
    estimate,
    extsort,
    int8_search,
    listing,
    manifest,
    preflight,
    results,
    settings,
)
from mxjob.assembly import Assembly
from mxjob.cluster import SparkStop, run_spark
from mxjob.config import JobConfig, allowed_errors
from mxjob.errors import EXIT_TOO_MANY_ERRORS, JobError, first_line, plural
from mxjob.handlers import HandlerError, get_handlers, model_class
from mxjob.int8 import agreement, agreement_refusal, int8_excluded, quantize_int8, sample_too_small, weight_layers
from mxjob.int8_search import quantize_auto
from mxjob.model import Classifier, Embedder, ModelError, Predictor
from mxjob.partition import score_partition
from mxjob.preprocess import decode_image
from mxjob.signals import Interrupted
from mxjob.stats import StatsFold
from mxjob.status import RunMonitor, status_key
from mxjob.summary import closing_lines, summarize
from mxjob.worker import import_mxnet

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------
# The run


def run_job(cfg: JobConfig, spark_conf: dict | None = None, resume_command: str | None = None) -> int:
    """List, plan, check the model, score on Spark, assemble; return the exit code.

    From the moment the run may write its output (:func:`open_status`),
    ``OUTPUT.status.json`` and ``OUTPUT.report.html`` beside it say what the
    run is doing and, if it fails, why (:class:`mxjob.status.RunMonitor`);
    ``resume_command`` is the command they show to resume the run.
    """
    started = time.time()
    client = utils.s3_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts)
    retry = yarn_attempt()[1] > 1
    # The output first: seconds, where the listing may take hours. An output that is refused (it exists, or a
    # dataset's prefix holds objects the job did not write) or cannot be written ends the run before it writes
    # anything beside it: the status there is the run's that wrote that output, or no PUT could replace it.
    preflight.check_output(cfg, client, yarn_retry=retry)
    monitor = open_status(cfg, client, started, resume_command, retry)
    try:
        return checked_run(cfg, client, monitor, spark_conf)
    except (Exception, Interrupted) as exc:
        monitor.ended(exc)  # the status says why (if it is this run's): mxjob.watch exits with the job's code
        raise
    finally:
        monitor.close()


def open_status(cfg: JobConfig, client, started: float, resume_command: str | None, retry: bool) -> RunMonitor:
    """The run's :class:`RunMonitor`, claimed at once (status "running") when its output check has passed.

    The status beside the output is this run's as soon as the run may write
    the output: for ``--overwrite``, and for a fresh run (the check refused
    an existing output), before the listing, so ``mxjob.watch`` never reads
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
                         {"options": cfg.options()})
    if not cfg.dry_run and (cfg.overwrite or not (cfg.resume or retry) or unfinished_output(cfg, client)):
        monitor.claim("starting")
    return monitor


def unfinished_output(cfg: JobConfig, client) -> bool:
    """Whether there is something to resume: no output yet, or an earlier run's progress (:func:`plan_output`'s
    test for a resume that is not already complete)."""
    output_exists, work_exists, _ = existing_output(cfg, client,
                                                    durable.WorkPrefix(client, cfg.output_bucket, cfg.output_key))
    return work_exists or not output_exists


def checked_run(cfg: JobConfig, client, monitor: RunMonitor, spark_conf: dict | None) -> int:
    """:func:`run_job` once the output is checked: the handler and the model's files, the listing, the driver's
    checks, the plan, then the scoring (:func:`planned_run`)."""
    seconds: dict[str, float] = {}
    # The handler and the model's files before the listing too: seconds, where the listing may take hours.
    cfg = prepare_handler(cfg, client)
    preflight.check_model_files(cfg.model)
    monitor.enter("listing")
    images = list_images(client, cfg)
    cfg = replace(cfg, input_bucket=images.bucket)  # a manifest names the bucket the executors read
    seconds["listing"] = time.time() - monitor.started
    check_started = time.time()
    monitor.enter("model_check")
    cfg, checked = check_on_driver(cfg, client, images)
    if cfg.dry_run:
        return dry_run(cfg, images, checked.classifier, client, checked.fingerprint, checked.auto_rows)
    checked.classifier = None  # checked: the driver needs the model no more
    seconds["model_check"] = time.time() - check_started
    plan_started = time.time()
    monitor.enter("planning")
    work = durable.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    try:
        plan = plan_output(cfg, client, work, images, checked.fingerprint, auto_rows=checked.auto_rows)
    except Completed as done:
        log.info("%s is already complete (its summary is s3://%s/%s); nothing to resume", cfg.output_uri,
                 cfg.output_bucket, cfg.summary_key)
        return done.exit_code
    # Before the run's plan is written (score_and_assemble): its batches are of the size chosen here.
    cfg, sizing = size_run(cfg, images, len(plan.todo), spark_conf)
    monitor.context = {"options": cfg.options(), "fingerprint": checked.fingerprint}
    monitor.claim("planning")  # from the plan on the files are this run's, whoever's they were
    try:
        stats, counts, spark_stop = score_and_assemble(cfg, client, work, images, plan, spark_conf, seconds,
                                                       plan_started, monitor)
    except (JobError, Interrupted) as exc:
        exc.work = work  # main() says what is durable and how to resume
        raise
    return planned_run(cfg, client, work, monitor, images, plan, checked, sizing,
                       (stats, counts, spark_stop), seconds)


def planned_run(cfg: JobConfig, client, work: durable.WorkPrefix, monitor: RunMonitor, images: listing.Listing,
                plan: durable.Plan, checked: DriverCheck, sizing: Sizing, scored: tuple, seconds: dict) -> int:
    """The run's end once Spark has scored it: the summary, the last status, the closing lines; the exit code."""
    stats, counts, spark_stop = scored
    if stats.last_end is not None:  # the output is whole now: how long after the last task's end
        seconds["output_after_last_task"] = max(0.0, time.time() - stats.last_end)
    summary = summarize(cfg, len(images), plan.todo.num_batches(cfg.batch_size), stats, counts,
                        time.time() - monitor.started, checked.model_summary, seconds, plan, checked.fingerprint,
                        spark=spark_summary(spark_stop), skipped_keys=images.skipped_keys)
    summary["precision"] = checked.precision
    summary["batch_size_choice"] = sizing.choice
    summary["estimate"] = sizing.estimate
    if images.manifest is not None:  # the manifest's keys that got no line, by reason, and its repeated keys
        summary["manifest"] = images.manifest
    summary["files"] = dict(monitor.where)
    if counts.dataset is not None:
        summary["dataset"] = {**counts.dataset, "rows_per_file_why": plan.dataset.why}
    code = finish_run(cfg, client, work, summary, counts, len(images))
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

    classifier: Predictor | None
    model_summary: dict
    precision: dict
    fingerprint: dict
    #: ``--rows-per-file auto``'s ``(rows, why)`` for this model and key list (used by a dataset output only).
    auto_rows: tuple = (0, "")


def check_on_driver(cfg: JobConfig, client, images: listing.Listing) -> tuple[JobConfig, DriverCheck]:
    """Load the model, check --top-k against it, quantize for int8, and take the run's fingerprint.

    On the driver first: a bad checkpoint, shape or labels file fails now,
    with its cause, instead of in every task after the cluster spun up.
    """
    classifier = load_model_on_driver(cfg)
    readers = float16_readers(cfg)
    if readers:
        log.warning("%s", readers)
    if isinstance(classifier, Classifier) and cfg.top_k > classifier.num_classes:
        raise JobError(f"--top-k {cfg.top_k} is larger than the model's {classifier.num_classes} classes")
    if isinstance(classifier, Embedder):  # the layer found, not None: executors and the fingerprint name it
        cfg = replace(cfg, model=replace(cfg.model, output_layer=classifier.output_layer))
    cfg, precision = prepare_precision(cfg, client, images, classifier)
    summary = classifier.model_summary()
    fingerprint = job_fingerprint(cfg, classifier, carried_names(cfg, images))
    # Only a dataset cuts files: the keys' mean length costs a pass over every key.
    auto_rows = auto_rows_per_file(cfg, images, summary) if cfg.dataset else (0, "")
    return cfg, DriverCheck(classifier, summary, precision, fingerprint, auto_rows)


def auto_rows_per_file(cfg: JobConfig, images, model_summary: dict) -> tuple[int, str]:
    """``--rows-per-file auto`` for this run (:func:`dataset.auto_rows_per_file`): the keys' mean length, the task."""
    keys = getattr(images, "keys", None)
    count = len(images)
    key_bytes = (pc.sum(pc.binary_length(keys)).as_py() or 0) / count if keys is not None and count else 64.0
    outputs = list((model_summary.get("outputs") or {}).values())
    values = int(np.prod(outputs[0])) if outputs else None
    itemsize = 2 if cfg.embedding_dtype == "float16" else 4
    return dataset.auto_rows_per_file(cfg.task, key_bytes, cfg.top_k, values, itemsize)


def float16_readers(cfg: JobConfig) -> str | None:
    """The warning for float16 embeddings in Parquet, which not every reader the output is for can read; else None.

    pyarrow writes them as Parquet's FLOAT16 type: pyarrow and pandas read it,
    Spark 3.5 fails on the file's footer and Trino (Athena) refuses the type.
    """
    if cfg.task != "embed" or cfg.embedding_dtype != "float16" or cfg.output_format != "parquet":
        return None
    return ("--embedding-dtype float16 in Parquet: pyarrow and pandas read it, but Spark 3.5 and Athena cannot "
            "read Parquet's FLOAT16 type; use --embedding-dtype float32 (twice the bytes) for them")


def score_and_assemble(cfg: JobConfig, client, work: durable.WorkPrefix, images: listing.Listing,
                       plan: durable.Plan, spark_conf: dict | None, seconds: dict,
                       plan_started: float,
                       monitor: RunMonitor | None = None) -> tuple[StatsFold, durable.AssemblyCounts, SparkStop | None]:
    """Run the plan's batches on Spark (if any are left) and merge every durable line into the output.

    The merge follows the run while Spark scores it (``--assembly during``,
    :class:`mxjob.assembly.Assembly`), or starts when the job has ended.
    Adds the ``plan``, ``spark``, ``assembly`` (from the job's end to the
    output's) and ``assembly_cpu`` seconds to ``seconds``. Returns the
    stats, the assembly's counts, and the SparkContext's stop (``None``
    without a Spark job), still running: the caller waits for it last.
    """
    batches = plan.todo.num_batches(cfg.batch_size)
    log.info("%d images under %s: %s%d batches of up to %d", len(images), cfg.input_uri,
             f"{len(images) - len(plan.todo)} already scored, " if plan.resumed else "", batches, cfg.batch_size)
    stats, spark_stop = StatsFold(), None

    def merge(runs, live):
        return assemble_output(cfg, client, work, images, runs, live, plan.dataset)

    if batches:
        application, _ = yarn_attempt()
        run = work.start_run(plan.number, plan.todo, cfg.batch_size, application)
        seconds["plan"] = time.time() - plan_started
        assembly = Assembly(merge, work, [*plan.runs, run], during=cfg.assembly == "during")
        assembly.start()
        spark_started = time.time()
        try:
            stats, spark_stop = run_spark(cfg, run, work.plan_key(run), spark_conf,
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


def finish_run(cfg: JobConfig, client, work: durable.WorkPrefix, summary: dict, counts: durable.AssemblyCounts,
               keys: int) -> int:
    """Write the summary, remove the work prefix, and return the exit code (3: more errors than --max-errors)."""
    utils.put_text(client, cfg.output_bucket, cfg.summary_key, json.dumps(summary, indent=2) + "\n")
    for warning in summary["threads"]["warnings"]:
        log.warning("%s", warning)
    removed = work.remove()
    log.info("summary: %s", json.dumps({k: summary[k] for k in (
        "keys_listed", "predicted", "failed", "reused", "scored", "batches", "elapsed_seconds")}))
    log.info("wrote %s and s3://%s/%s; removed %d work objects under %s", cfg.output_uri, cfg.output_bucket,
             cfg.summary_key, removed, work.uri)
    limit = allowed_errors(cfg.max_errors, keys)
    if counts.failed > limit:
        log.error("%d images failed, more than --max-errors %s allows (%d); see the error lines in %s",
                  counts.failed, cfg.max_errors, limit, cfg.output_uri)
        return EXIT_TOO_MANY_ERRORS
    return 0


def durable_status(work: durable.WorkPrefix | None) -> str:
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
    sort in memory is sorted out of core (:mod:`mxjob.extsort`); under
    ``--dry-run`` its sorted keys then stay on local disk (an
    :class:`extsort.SpilledListing`), since the dry run only plans them.
    """
    if cfg.input_manifest:
        try:
            return manifest.read_manifest(cfg.input_manifest, client, bucket=cfg.input_bucket,
                                          prefix=cfg.input_prefix, suffixes=cfg.suffixes, limit=cfg.limit,
                                          in_memory=not cfg.dry_run)
        except manifest.ManifestError as exc:
            raise JobError(str(exc)) from exc
        except OSError as exc:  # unreadable file, full disk for the downloaded copy
            raise JobError(f"cannot read --input-manifest {cfg.input_manifest}: {exc}") from exc
    try:
        # Its own client, with a connection per list call in flight; under --s3-reader lean, one
        # whose parser skips the dates (listing.list_client).
        # --with-object-metadata needs the ETags, which only botocore's own parser reads.
        lister = listing.list_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts,
                                     max_pool_connections=max(10, cfg.list_concurrency),
                                     kind="botocore" if cfg.with_object_metadata else cfg.s3_reader)
        keys, sizes, *etags = listing.list_prefix(lister, cfg.input_bucket, cfg.input_prefix, cfg.list_concurrency,
                                                  etags=cfg.with_object_metadata)
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
# Plan, resume, assembly


def yarn_attempt() -> tuple[str | None, int]:
    """``(application id, attempt number)`` of this YARN container from ``CONTAINER_ID``, else ``(None, 1)``.

    YARN names a container ``container[_eE]_<cluster ts>_<app>_<attempt>_<n>``:
    the application master of attempt 2 runs in ``..._0001_02_000001``.
    """
    match = re.match(r"container_(?:e\d+_)?(\d+)_(\d+)_(\d+)_\d+$", os.environ.get("CONTAINER_ID", ""))
    if not match:
        return None, 1
    return f"application_{match.group(1)}_{match.group(2)}", int(match.group(3))


def line_settings(cfg: JobConfig) -> dict:
    """Every setting that changes what a line says about an image: those the table marks ``fingerprint``.

    The recipe's settings are one entry, ``preprocess``.
    """
    values = {s.name: setting_value(cfg, s) for s in settings.SETTINGS if s.to != "resolve"}
    out: dict = {}
    for s in settings.SETTINGS:
        if s.in_fingerprint(values):
            if s.to == "preprocess":
                out["preprocess"] = asdict(cfg.preprocess)
            else:
                out[s.name] = values[s.name]
    return out


def setting_value(cfg: JobConfig, setting: settings.Setting):
    """The value of a ``driver``, ``executor``, ``model`` or ``preprocess`` setting in this run."""
    holder = {"model": cfg.model, "preprocess": cfg.preprocess}.get(setting.to, cfg)
    return getattr(holder, setting.name)


def carried_names(cfg: JobConfig, images) -> list[str]:
    """The columns carried to every output row: the manifest's (named as in its header), then etag and size."""
    names = [name for name in getattr(images, "carried", ()) if name != "etag"]
    return names + (["etag", "size"] if cfg.with_object_metadata else [])


def carried_columns(cfg: JobConfig, images: listing.Listing) -> pa.Table | None:
    """The table :func:`durable.assemble` appends to the rows (a row per key of ``images``), or None."""
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


def job_fingerprint(cfg: JobConfig, classifier: Predictor, carried: list[str] = ()) -> dict:
    """:func:`durable.fingerprint` of this run: settings, model files, labels and handler by content.

    ``carried`` (:func:`carried_names`) is in it when the rows carry any column, so that a resume
    never mixes rows with and without them.
    """
    labels = getattr(classifier, "labels", None)
    handler = cfg.handler_path
    files = {
        "model_symbol": cfg.model.read(cfg.model.symbol_uri),
        "model_params": cfg.model.read(cfg.model.params_uri),
        "labels": "\n".join(labels).encode("utf-8") if labels else None,
        "handler": utils.read_uri(handler) if handler else None,
        # The quantized model itself: calibrated on the job's own sample, it is part of what made the lines.
        "int8_params": cfg.int8_model.read(cfg.int8_model.params_uri) if cfg.int8_model else None,
    }
    values = line_settings(cfg)
    if carried:
        values["carried"] = list(carried)
    return durable.fingerprint(values, files)


def plan_output(cfg: JobConfig, client, work: durable.WorkPrefix, images: listing.Listing, fingerprint: dict,
                dry: bool = False, auto_rows: tuple = (0, "")) -> durable.Plan:
    """Decide between a fresh run and a resume; refuse what would overwrite or mix results.

    Raises :class:`JobError` with what to do: the output exists (``--overwrite``),
    an earlier run's progress exists (``--resume`` or ``--overwrite``), or the
    earlier run's fingerprint differs from this one's; :class:`Completed` for
    a resume of a finished output. A fresh run records its fingerprint, and
    ``--overwrite`` removes the earlier progress (and a dataset's files), unless ``dry``.
    A dataset output's plan (:func:`plan_dataset`) is the plan's ``dataset``.
    """
    output_exists, work_exists, found = existing_output(cfg, client, work)
    if cfg.overwrite:
        if work_exists and not dry:
            log.info("--overwrite: removing %d objects of the earlier run under %s", work.remove(), work.uri)
        work_exists = False
    resume = cfg.resume or (work_exists and not cfg.overwrite and yarn_retry(work))
    if work_exists and not resume:
        runs = work.runs()
        done = sum(len(run.done) for run in runs)
        raise JobError(f"{work.uri} holds an earlier run's progress ({plural(done, 'durable batch', 'durable batches')}"
                       f" in {plural(len(runs), 'run')}); add --resume to finish it, or --overwrite to discard it "
                       "and start again")
    if output_exists and not cfg.overwrite and not (resume and work_exists):
        refuse_existing_output(cfg, client, resume)
    if found is not None and cfg.overwrite and not dry:
        clear_dataset(cfg, client, found)
    if work_exists:
        plan = resume_plan(work, images, fingerprint)
        if found is not None:
            plan.dataset = plan_dataset(cfg, client, work, images, auto_rows, dry, found)
    else:
        new = dataset.fresh_plan(cfg.rows_per_file, auto_rows, images) if cfg.dataset else None
        plan = fresh_plan(cfg, work, images, fingerprint, resume, dry, new)
        plan.dataset = new
    if not dry and (cfg.overwrite or work_exists):
        abort_left_uploads(work)
    return plan


def refuse_existing_output(cfg: JobConfig, client, resume: bool) -> NoReturn:
    """Raise for a complete output: :class:`Completed` (a resume, or YARN's retry of the run that wrote it), else
    :class:`JobError` naming ``--overwrite``."""
    if resume:
        raise Completed(cfg.output_uri)
    if (code := finished_by_this_application(cfg, client)) is not None:
        raise Completed(cfg.output_uri, code)
    raise JobError(f"{cfg.output_uri} (or its summary) already exists; add --overwrite to replace it")


def abort_left_uploads(work: durable.WorkPrefix) -> None:
    """Abort the uploads a killed driver left open beside the output (never visible; S3 bills their parts)."""
    aborted = work.abort_uploads()
    if aborted:
        log.info("aborted %s an earlier driver left open (never visible; S3 bills their parts until then)",
                 plural(aborted, "incomplete upload"))


def existing_output(cfg: JobConfig, client,
                    work: durable.WorkPrefix) -> tuple[bool, bool, dataset.Contents | None]:
    """``(output exists, work prefix exists, a dataset prefix's contents or None)``.

    A dataset's prefix is listed once here, for the plan's every look at it. An
    unreadable output bucket raises :class:`JobError`.
    """
    try:
        if cfg.dataset:
            found = preflight.dataset_contents(cfg, client)
            return found.output_exists, work.exists(), found
        return preflight.output_exists(cfg, client), work.exists(), None
    except Exception as exc:
        why = utils.unreachable(client, exc) or (f"{first_line(exc)}; the job needs s3:ListBucket, s3:GetObject, "
                                                 "s3:PutObject and s3:DeleteObject on the output bucket")
        raise JobError(f"cannot write {cfg.output_uri}: {why}") from exc


def yarn_retry(work: durable.WorkPrefix) -> bool:
    """Whether this driver is YARN's next attempt of the application whose progress ``work`` holds: then it resumes."""
    app, attempt = yarn_attempt()
    if attempt <= 1:
        return False
    runs = work.runs()
    if runs and runs[-1].application == app:
        log.warning("YARN attempt %d of %s: resuming the progress the earlier attempt made durable under %s",
                    attempt, app, work.uri)
        return True
    return False


def fresh_plan(cfg: JobConfig, work: durable.WorkPrefix, images: listing.Listing, fingerprint: dict, resume: bool,
               dry: bool, new_dataset: dataset.DatasetPlan | None = None) -> durable.Plan:
    """Every key to score; records the fingerprint (and a dataset's plan) under the work prefix (not for a dry run)."""
    if resume:
        log.info("--resume: nothing under %s yet; scoring every key", work.uri)
    if not dry:
        try:
            work.write_job(fingerprint, cfg.output_uri, new_dataset.record() if new_dataset is not None else None)
        except Exception as exc:
            raise JobError(f"cannot write {work.uri}: {first_line(exc)}; the job needs s3:PutObject, "
                           "s3:GetObject, s3:ListBucket and s3:DeleteObject on the output key and the "
                           "prefix beside it") from exc
    return durable.Plan(runs=[], todo=images, number=1, resumed=False)


def resume_plan(work: durable.WorkPrefix, images: listing.Listing, fingerprint: dict) -> durable.Plan:
    """The keys without a durable line, after checking that the earlier run's fingerprint is this one's."""
    job = work.read_job()
    if job is None:
        raise JobError(f"{work.uri} has no job.json, so what made its lines is unknown; "
                       "add --overwrite to discard it and start again")
    differ = durable.differences(job["fingerprint"], fingerprint)
    if differ:
        raise JobError(f"cannot resume: the earlier run under {work.uri} used different settings or files, "
                       f"and one output must not mix them: {'; '.join(differ)}. Rerun with the earlier "
                       "settings, or add --overwrite (instead of --resume) to start again")
    runs = work.runs()
    if isinstance(images, extsort.SpilledListing):
        images = images.load()  # a dry run's resume check: which keys lack a line needs every key in memory
    todo = images.filter(durable.remaining_keys(work, runs, images))
    log.info("--resume: %d of %d keys already have a durable line (%d runs under %s); scoring %d",
             len(images) - len(todo), len(images), len(runs), work.uri, len(todo))
    return durable.Plan(runs=runs, todo=todo, number=max((run.number for run in runs), default=0) + 1, resumed=True)


def clear_dataset(cfg: JobConfig, client, found: dataset.Contents) -> None:
    """``--overwrite`` of a dataset: its files, ``_SUCCESS`` and summary (``found``) go before any new file appears."""
    removed = utils.delete_objects(client, cfg.output_bucket, [key for key, _ in found.files.values()] + found.own)
    if removed:
        log.info("--overwrite: removed the %s of the earlier dataset under %s", plural(removed, "object"),
                 cfg.output_uri)


def plan_dataset(cfg: JobConfig, client, work: durable.WorkPrefix, images, auto_rows: tuple, dry: bool,
                 found: dataset.Contents) -> dataset.DatasetPlan:
    """A resumed dataset's plan: the first run's rows per file; its files (``found``) kept, or deleted if the keys
    changed."""
    job = work.read_job() or {}
    plan = dataset.resume_plan(job.get("dataset"), cfg.rows_per_file, auto_rows, images, found)
    stale = [key for index, (key, _) in found.files.items() if index not in plan.keep]
    if plan.keep:
        log.info("--resume: keeping the %s an earlier run completed under %s (same keys)",
                 plural(len(plan.keep), "dataset file"), cfg.output_uri)
    if stale and not dry:
        # The key list changed since: those files' rows would not be this run's. Gone before any new file appears.
        utils.delete_objects(client, cfg.output_bucket, stale)
        log.info("--resume: the input's keys changed since the earlier run; deleted its %s under %s, to be "
                 "written again", plural(len(stale), "dataset file"), cfg.output_uri)
    return plan


class Completed(Exception):
    """``--resume`` of an output that an earlier run already completed: nothing to do.

    ``exit_code``: what this driver exits with; YARN's next attempt of an application whose
    first attempt finished the run (and then exited non-zero) repeats that attempt's code.
    """

    def __init__(self, output_uri: str, exit_code: int = 0):
        super().__init__(output_uri)
        self.exit_code = exit_code


def finished_by_this_application(cfg: JobConfig, client) -> int | None:
    """The exit code of this YARN application's earlier attempt, if it finished the run; else ``None``.

    An attempt that wrote the output and its summary and then exited non-zero
    (3: more images failed than --max-errors allows) makes YARN start the
    next attempt, which finds the output complete: it must end as the
    first did, neither with "already exists" nor by scoring again.
    """
    app, attempt = yarn_attempt()
    if attempt <= 1:
        return None
    try:
        summary = json.loads(client.get_object(Bucket=cfg.output_bucket, Key=cfg.summary_key)["Body"].read())
        status = json.loads(client.get_object(Bucket=cfg.output_bucket, Key=status_key(cfg.output_key))["Body"]
                            .read())
    except Exception as exc:  # noqa: BLE001 - no summary or status of ours: not this application's output
        log.debug("no finished run of %s: %s", app, exc)
        return None
    if (summary.get("spark") or {}).get("application_id") != app or status.get("exit_code") is None:
        return None
    log.warning("YARN attempt %d of %s: attempt %d finished the run (exit code %d), so this attempt ends as it did",
                attempt, app, attempt - 1, status["exit_code"])
    return int(status["exit_code"])


def assemble_output(cfg: JobConfig, client, work: durable.WorkPrefix, images: listing.Listing,
                    runs: list | None = None, live: durable.LiveRun | None = None,
                    dataset_plan: dataset.DatasetPlan | None = None) -> durable.AssemblyCounts:
    """Merge the durable lines of ``runs`` (default: every run under ``work``) into the output.

    One multipart upload, completed only when whole; for a dataset, files of
    ``dataset_plan.rows_per_file`` rows, each completed when whole
    (:class:`dataset.DatasetSink`). With ``live``, the merge follows that
    run's batches as Spark makes them durable (:func:`durable.assemble`).
    """
    if cfg.dataset:
        return _assemble(cfg, work, images, runs, live, dataset.DatasetSink(
            client, cfg.output_bucket, cfg.output_key, dataset_plan.rows_per_file,
            durable.provenance(work.read_job()), dataset_plan.keep))
    try:
        # Parts of S3's smallest size: the last one, uploaded after the last batch, is the assembly's tail.
        writer = utils.MultipartWriter(client, cfg.output_bucket, cfg.output_key, part_bytes=utils.MIN_PART_BYTES,
                                       content_type=durable.content_type(cfg.output_format, cfg.output_key))
    except Exception as exc:
        raise JobError(f"cannot write {cfg.output_uri}: {first_line(exc)}; the job needs "
                       "s3:PutObject on the output key") from exc
    sink = (durable.ParquetSink(writer, metadata=durable.provenance(work.read_job()))
            if cfg.output_format == "parquet" else durable.JsonLinesSink(writer, gzip=durable.is_gzip(cfg.output_key)))
    return _assemble(cfg, work, images, runs, live, sink)


def _assemble(cfg: JobConfig, work: durable.WorkPrefix, images: listing.Listing, runs: list | None,
              live: durable.LiveRun | None, sink) -> durable.AssemblyCounts:
    """Merge into ``sink``, then close it; on any failure abort it (nothing partial appears)."""
    try:
        reader = utils.s3_reader(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts, kind=cfg.s3_reader)
        counts = durable.assemble(work, work.runs() if runs is None else runs, images, sink, reader=reader,
                                  carried=carried_columns(cfg, images), live=live)
        closing = time.monotonic()
        sink.close()
        counts.close_seconds = time.monotonic() - closing
    except durable.ResumeError as exc:
        sink.abort()
        raise JobError(str(exc)) from exc
    except BaseException:
        sink.abort()
        raise
    if isinstance(sink, dataset.DatasetSink):
        counts.dataset = dataset.summary_of(sink)
    return counts


# ----------------------------------------------------------------------------
# Checks on the driver: handler, model, int8


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
        data = utils.read_uri(path, client if utils.is_s3_uri(path) else None)
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


def sample_keys(images: list, count: int) -> tuple[list, list]:
    """The int8 samples: ``(calibration, held_out)``, each up to ``count`` keys of the sorted listing.

    ``2 * count`` keys evenly spaced over the whole listing (the ``i * n //
    (2 * count)``-th of ``n``), so they span every folder and date; the even
    ones calibrate, the odd ones are held out to check agreement, so no image
    does both. A job of one image uses it for both.
    """
    n = min(2 * count, len(images))
    picked = [images[i * len(images) // n] for i in range(n)]
    calibration, held_out = picked[0::2], picked[1::2]
    return calibration, held_out or calibration


def sample_arrays(cfg: JobConfig, client, items: list) -> np.ndarray:
    """Download and decode ``items`` as the executors do; images that fail are left out (they fail in the job too)."""
    handlers = get_handlers(cfg.handler_path)

    def one(item):
        key, _ = item
        try:
            data = utils.read_object(client, cfg.input_bucket, key)
            if handlers is not None and handlers.input_handler is not None:
                return handlers.decode(key, data, cfg.preprocess.input_shape)
            return decode_image(data, cfg.preprocess)
        except Exception as exc:  # noqa: BLE001 - the job records it as this key's error line
            log.debug("int8 sample: %s left out: %s", key, first_line(exc))
            return None

    with ThreadPoolExecutor(cfg.io_threads) as pool:
        arrays = [a for a in pool.map(one, items) if a is not None]
    return np.stack(arrays) if arrays else np.zeros((0, *cfg.preprocess.input_shape), np.float32)


def prepare_precision(cfg: JobConfig, client, images: list, classifier: Predictor) -> tuple[JobConfig, dict]:
    """For ``--precision int8``: quantize on the driver, check agreement, return ``cfg`` with the int8 model.

    The driver quantizes once (:func:`quantize_int8`; with ``--int8-exclude
    auto``, :func:`quantize_auto` searches for the layers to keep in fp32,
    :func:`quantize_for_job`), calibrated on
    :func:`sample_keys`' calibration images, and scores the held-out ones in
    fp32 and int8. Below ``--min-agreement`` the job refuses (``JobError``)
    with the figures and what to try; otherwise the executors get the int8
    checkpoint through ``SparkContext.addFile`` and load it through the same
    per-worker cache. Returns the summary's ``precision`` entry.
    """
    if cfg.precision == "fp32":
        return cfg, {"precision": "fp32"}
    if not isinstance(classifier, Classifier):
        raise JobError("--precision int8 checks that int8 and fp32 agree on the top-1 class, so it needs a "
                       "classifier; with an output_handler use --precision fp32")
    started = time.time()
    calibration_keys, held_out_keys = sample_keys(images, cfg.calibration_images)
    calibration = sample_arrays(cfg, client, calibration_keys)
    held_out = sample_arrays(cfg, client, held_out_keys)
    if not len(calibration) or not len(held_out):
        raise JobError(f"--precision int8: none of the {len(calibration_keys) + len(held_out_keys)} sampled "
                       f"images could be read and decoded; check the input, or use --precision fp32")
    too_small = sample_too_small(len(held_out), len(held_out_keys), cfg.calibration_images, len(images))
    if too_small:  # before the quantization: a sample this small proves nothing
        raise JobError(too_small)
    try:
        symbol_json = cfg.model.read(cfg.model.symbol_uri).decode("utf-8")
        exclude = [] if int8_search.is_auto(cfg.int8_exclude) else int8_excluded(symbol_json, cfg.int8_exclude)
    except ModelError as exc:
        raise JobError(str(exc)) from exc
    folder = tempfile.mkdtemp(prefix="mxinfer-int8-")
    # Kept until the driver exits: executors fetch the files from the driver while the job runs.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    forward_batch = bound_batch(cfg)
    spec, exclude, search = quantize_for_job(cfg, symbol_json, exclude, calibration, held_out,
                                             os.path.join(folder, "model-int8"), classifier)
    labels_uri = ""
    if classifier.labels:
        labels_uri = os.path.join(folder, "synset.txt")
        with open(labels_uri, "w", encoding="utf-8") as handle:
            handle.write("\n".join(classifier.labels) + "\n")
    spec = replace(spec, labels_uri=labels_uri, context=cfg.model.context)
    int8 = Classifier(spec, cfg.preprocess.input_shape, forward_batch, context="cpu")
    figures = agreement(classifier.probabilities(held_out), int8.probabilities(held_out))
    layers = weight_layers(symbol_json)
    report = {"precision": "int8", **figures, "min_agreement": cfg.min_agreement,
              "calibration_images": len(calibration), "excluded_layers": exclude,
              "quantize_seconds": round(time.time() - started, 2)}
    if search is not None:
        report.update(granularity=search.chosen.granularity, speedup=search.timing["speedup"],
                      search=search.as_dict())
    log.info("int8: top-1 agreement with fp32 %.2f%% on %d held-out images, largest probability difference "
             "%.4f (calibrated on %d images, %s kept in fp32, %.1fs)",
             100 * figures["top1_agreement"], figures["images"], figures["max_probability_difference"],
             len(calibration), plural(len(exclude), "layer"), report["quantize_seconds"])
    if figures["top1_agreement"] < cfg.min_agreement:
        raise JobError(agreement_refusal(figures, cfg.min_agreement, layers, len(calibration), search))
    return replace(cfg, int8_model=spec), report


def quantize_for_job(cfg: JobConfig, symbol_json: str, exclude: list, calibration: np.ndarray,
                     held_out: np.ndarray, out_prefix: str, classifier: Classifier):
    """The int8 checkpoint, the layers it keeps in fp32, and ``--int8-exclude auto``'s search (else ``None``).

    With ``auto``, :func:`quantize_auto` chooses the layers; a search that
    finds nothing that agrees and is faster refuses the job here, with the
    best it found.
    """
    auto = int8_search.is_auto(cfg.int8_exclude)
    try:
        if auto:
            spec, search = quantize_auto(cfg.model, weight_layers(symbol_json), calibration, held_out, out_prefix,
                                         bound_batch(cfg), cfg.min_agreement, cfg.int8_search_seconds,
                                         classifier.output_is_probability)
        else:
            spec, search = quantize_int8(cfg.model, cfg.preprocess.input_shape, calibration, out_prefix, exclude,
                                         bound_batch(cfg)), None
    except Exception as exc:  # MXNetError from the quantization pass or the calibration run
        raise JobError(f"cannot quantize the model to int8: {first_line(exc)}; keep the layer it names "
                       f"in fp32 with --int8-exclude, or use --precision fp32") from exc
    if not auto:
        return spec, exclude, None
    log.info("%s", int8_search.describe(search))
    if spec is None:
        raise JobError(int8_search.refusal(search, cfg.min_agreement, len(held_out)))
    return spec, search.chosen.excluded, search


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


def load_model_on_driver(cfg: JobConfig) -> Predictor:
    """The model, loaded on the driver's CPU (the driver need not have a GPU) to check it."""
    import_mxnet()  # timed: the estimate counts each executor's import of MXNet as this one took
    try:
        kind = model_class(get_handlers(cfg.handler_path), cfg.task)
    except HandlerError as exc:
        raise JobError(f"--handler: {exc}") from exc
    try:
        # Bound as the executors bind it (at the micro-batch), so the check costs the driver no more memory.
        return kind(cfg.model, cfg.preprocess.input_shape, bound_batch(cfg), context="cpu")
    except ModelError as exc:
        raise JobError(f"model: {exc}") from exc
    except FileNotFoundError as exc:
        raise JobError(f"model file missing: {exc}") from exc
    except Exception as exc:
        raise JobError(f"cannot load the model ({cfg.model.symbol_uri}): {first_line(exc)}") from exc


def dry_run(cfg: JobConfig, images: list, classifier: Classifier, client, fingerprint: dict,
            auto_rows: tuple = (0, "")) -> int:
    """Make every check the real run makes before Spark, score one image on the driver's CPU, print the plan.

    Starts no Spark job and leaves nothing behind. The checks: the output may
    be written, and :func:`plan_output`'s (an existing output, an earlier
    run's progress, a resume with other settings). The plan is one JSON object
    on the last line of standard output: under spark-submit the driver's log
    and MXNet's own messages share that stream, so a script reads the last
    line only. ``auto_rows`` is the driver check's ``--rows-per-file auto`` (a dataset output).
    """
    to_score, dataset_plan = len(images), None
    if cfg.output_key:  # preflight.check_before_listing proved the output writable already
        work = durable.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
        try:
            planned = plan_output(cfg, client, work, images, fingerprint, dry=True, auto_rows=auto_rows)
            to_score, dataset_plan = len(planned.todo), planned.dataset
        except Completed:
            to_score, dataset_plan = 0, None
    cfg, sizing = size_run(cfg, images, to_score)
    if sizing.first is not None:  # the sample starts at the listing's first key: already scored
        blob, stats = sizing.first
    else:
        job = cfg.job_spec()
        job = replace(job, model=replace(job.model, context="cpu"))
        [(_, _, blob, stats)] = score_partition(0, images[:1], job)
    # Plan every batch as the run would, without writing the plan anywhere: its size is what the run's
    # executors read (a ranged GET each), and planning is the driver's last step before Spark.
    spans = listing.write_plan(images, cfg.batch_size, lambda data: None)
    batches = len(spans)
    plan = {
        "input": cfg.input_uri, "output": cfg.output_uri, "output_format": cfg.output_format,
        "output_writable": bool(cfg.output_key) or None,
        # keys an earlier run made durable (--resume) are not scored again
        "images": len(images), "to_score": to_score, "batch_size": cfg.batch_size,
        "batch_size_choice": sizing.choice, "batches": batches,
        "partitions": batches, "plan_bytes": sum(spans[-1]) if spans else 0,
        "first_key": images[0][0], "last_key": images[-1][0],
        "model": classifier.model_summary(),
        "sample": results.objects(results.read_part(blob))[0],
        "sample_seconds": stats.seconds,
        "estimate": sizing.estimate,
    }
    if dataset_plan is not None:
        plan["dataset"] = {"rows_per_file": dataset_plan.rows_per_file, "why": dataset_plan.why,
                           "files": -(-len(images) // dataset_plan.rows_per_file),
                           "files_kept": len(dataset_plan.keep)}
    # Whatever was logged or printed before ends its line first, so the plan is a line of its own.
    sys.stderr.flush()
    click.echo(json.dumps(plan, ensure_ascii=False))
    sys.stdout.flush()
    return 0
