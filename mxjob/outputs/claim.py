"""The output's plan: a fresh run or a resume, and what would overwrite or mix results.

:func:`plan_output` decides from what is already there (the output, an
earlier run's progress under the work prefix, a dataset's files) and the
run's fingerprint (:func:`job_fingerprint`: the settings that change a line,
the model's files by content); YARN's next attempt of an application resumes
its first attempt's progress (:func:`yarn_retry`) or ends as it did
(:func:`finished_by_this_application`).
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict
from typing import NoReturn

from mxjob.core.errors import JobError, first_line, plural
from mxjob.executor.model_check import ModelFacts
from mxjob.inputs import extsort, listing
from mxjob.model.predictor import Predictor
from mxjob.options import settings
from mxjob.options.config import JobConfig
from mxjob.outputs import dataset, preflight, work_prefix
from mxjob.reporting.status import status_key
from mxjob.s3 import access, reads, writes

log = logging.getLogger(__name__)


def unfinished_output(cfg: JobConfig, client) -> bool:
    """Whether there is something to resume: no output yet, or an earlier run's progress (:func:`plan_output`'s
    test for a resume that is not already complete)."""
    output_exists, work_exists, _ = existing_output(cfg, client,
                                                    work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key))
    return work_exists or not output_exists


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


def job_fingerprint(cfg: JobConfig, classifier: Predictor | ModelFacts, carried: list[str] = ()) -> dict:
    """:func:`work_prefix.fingerprint` of this run: settings, model files, labels and handler by content.

    ``carried`` (:func:`carried_names`) is in it when the rows carry any column, so that a resume
    never mixes rows with and without them.
    """
    labels = getattr(classifier, "labels", None)
    handler = cfg.handler_path
    # The model's files as the check loaded them (on the driver, or in an executor: mxjob.executor.model_check), by
    # digest: the driver reads no model file a second time (a few hundred MB for some models).
    known = getattr(classifier, "file_digests", None) or {}
    files = {
        "model_symbol": known.get(cfg.model.symbol_uri) or cfg.model.read(cfg.model.symbol_uri),
        "model_params": known.get(cfg.model.params_uri) or cfg.model.read(cfg.model.params_uri),
        "labels": "\n".join(labels).encode("utf-8") if labels else None,
        "handler": reads.read_uri(handler) if handler else None,
        # The quantized model itself: calibrated on the job's own sample, it is part of what made the lines.
        "int8_params": cfg.int8_model.read(cfg.int8_model.params_uri) if cfg.int8_model else None,
    }
    values = line_settings(cfg)
    if carried:
        values["carried"] = list(carried)
    return work_prefix.fingerprint(values, files)


def plan_output(cfg: JobConfig, client, work: work_prefix.WorkPrefix, images: listing.Listing, fingerprint: dict,
                dry: bool = False, inputs: dataset.PlanInputs = dataset.NO_INPUTS) -> work_prefix.Plan:
    """Decide between a fresh run and a resume; refuse what would overwrite or mix results.

    Raises :class:`JobError` with what to do: the output exists (``--overwrite``),
    an earlier run's progress exists (``--resume`` or ``--overwrite``), or the
    earlier run's fingerprint differs from this one's; :class:`Completed` for
    a resume of a finished output. A fresh run records its fingerprint, and
    ``--overwrite`` removes the earlier progress (and a dataset's files), unless ``dry``.
    A dataset output's plan (:func:`plan_dataset`, from ``inputs``) is the plan's ``dataset``.

    ``--skip-existing`` (``inputs.existing``: what :func:`mxjob.outputs.existing.find` read,
    ``images`` the keys it left) appends to a dataset that exists, as a new
    run with files of its own (:func:`dataset.new_run`), once the files'
    fingerprint is found to be this run's.
    """
    output_exists, work_exists, found = existing_output(cfg, client, work)
    auto_rows, existing = inputs.auto_rows, inputs.existing
    if cfg.overwrite:
        if work_exists and not dry:
            log.info("--overwrite: removing %d objects of the earlier run under %s", work.remove(), work.uri)
        work_exists = False
    resume = cfg.resume or (work_exists and not cfg.overwrite and yarn_retry(work))
    if work_exists and not resume:
        refuse_progress(work, cfg.table)
    appending = cfg.skip_existing and (found is not None or cfg.table)
    if output_exists and not cfg.overwrite and not (resume and work_exists) and not appending:
        refuse_existing_output(cfg, client, resume)
    if appending and existing is not None and found is not None:  # a table's fingerprint is its property's
        dataset.check_fingerprints(existing.fingerprints, fingerprint, cfg.output_uri)
    if found is not None and cfg.overwrite and not dry:
        clear_dataset(cfg, client, found)
    if work_exists:
        plan = resume_plan(work, images, fingerprint)
        plan.dataset = resumed_files(cfg, client, work, images, inputs, dry, found)
    else:
        new = dataset.fresh_plan(cfg.rows_per_file, auto_rows, images, run_name(cfg, found, appending), existing,
                                 cfg.rescore_errors, skip_existing=cfg.skip_existing) if cfg.cuts_files else None
        plan = fresh_plan(cfg, work, images, fingerprint, resume and not appending, dry, new)
        plan.dataset = new
    if not dry and (cfg.overwrite or work_exists):
        abort_left_uploads(work, cfg)
    return plan


def resumed_files(cfg: JobConfig, client, work: work_prefix.WorkPrefix, images, inputs: dataset.PlanInputs, dry: bool,
                  found: dataset.Contents | None) -> dataset.DatasetPlan | None:
    """A resumed run's files: a dataset's (:func:`plan_dataset`), a table's, or none (one output object)."""
    if found is not None:
        return plan_dataset(cfg, client, work, images, inputs, dry, found)
    if cfg.table:
        return dataset.table_resume_plan((work.read_job() or {}).get("dataset"), cfg.rows_per_file,
                                         inputs.auto_rows, inputs.existing, cfg.skip_existing, cfg.rescore_errors)
    return None


def run_name(cfg: JobConfig, found: dataset.Contents | None, appending: bool) -> str | None:
    """The name in a new run's file names: a table run's id, a ``--skip-existing`` dataset run's UTC start, else
    ``None`` (``part-NNNNN.parquet``)."""
    if cfg.table:
        from mxjob.outputs import iceberg_run  # pyiceberg, for a table output only

        return iceberg_run.new_run_id()
    return dataset.new_run(found) if appending else None


def refuse_progress(work: work_prefix.WorkPrefix, table: bool = False) -> NoReturn:
    """Raise for an earlier run's progress that this run does not resume: ``--resume`` or ``--overwrite``."""
    runs = work.runs()
    done = sum(len(run.done) for run in runs)
    progress = (f"{work.uri} holds an earlier run's progress ({plural(done, 'durable batch', 'durable batches')} in "
                f"{plural(len(runs), 'run')})")
    if table:  # --overwrite does not apply to a table (mxjob.options.config.check_table_output)
        raise JobError(f"{progress}; add --resume to finish it (the rows it committed to the table stay either "
                       f"way), or delete {work.uri} to start a new run")
    raise JobError(f"{progress}; add --resume to finish it, or --overwrite to discard it and start again")


def refuse_existing_output(cfg: JobConfig, client, resume: bool) -> NoReturn:
    """Raise for a complete output: :class:`Completed` (a resume, or YARN's retry of the run that wrote it), else
    :class:`JobError` naming ``--overwrite``."""
    if resume:
        raise Completed(cfg.output_uri)
    if (code := finished_by_this_application(cfg, client)) is not None:
        raise Completed(cfg.output_uri, code)
    if cfg.table:
        from mxjob.outputs import iceberg_run  # pyiceberg, for a table output only

        iceberg_run.refuse_rows(cfg)
    raise JobError(f"{cfg.output_uri} (or its summary) already exists; add --overwrite to replace it")


def abort_left_uploads(work: work_prefix.WorkPrefix, cfg: JobConfig) -> None:
    """Abort the uploads a killed driver left open beside the output, a dataset's files among them (never visible;
    S3 bills their parts). A table's are its run's to abort (:func:`mxjob.outputs.iceberg_run.settle`)."""
    def dataset_file(key: str) -> bool:
        return dataset.file_id(key, cfg.output_key) is not None

    aborted = work.abort_uploads(dataset_file if cfg.dataset else None)
    if aborted:
        log.info("aborted %s an earlier driver left open (never visible; S3 bills their parts until then)",
                 plural(aborted, "incomplete upload"))


def existing_output(cfg: JobConfig, client,
                    work: work_prefix.WorkPrefix) -> tuple[bool, bool, dataset.Contents | None]:
    """``(output exists, work prefix exists, a dataset prefix's contents or None)``.

    A dataset's prefix is listed once here, for the plan's every look at it. An
    unreadable output bucket raises :class:`JobError`.
    """
    if cfg.table:  # the table's rows, from its catalog (which says what is wrong itself)
        from mxjob.outputs import iceberg_run  # pyiceberg, for a table output only

        rows = iceberg_run.target(cfg).rows
    try:
        if cfg.table:
            return rows > 0, work.exists(), None
        if cfg.dataset:
            found = preflight.dataset_contents(cfg, client)
            return found.output_exists, work.exists(), found
        return preflight.output_exists(cfg, client), work.exists(), None
    except Exception as exc:
        why = access.unreachable(client, exc) or (f"{first_line(exc)}; the job needs s3:ListBucket, s3:GetObject, "
                                                 "s3:PutObject and s3:DeleteObject on the output bucket")
        raise JobError(f"cannot write {cfg.output_uri}: {why}") from exc


def yarn_retry(work: work_prefix.WorkPrefix) -> bool:
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


def fresh_plan(cfg: JobConfig, work: work_prefix.WorkPrefix, images: listing.Listing, fingerprint: dict, resume: bool,
               dry: bool, new_dataset: dataset.DatasetPlan | None = None) -> work_prefix.Plan:
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
    return work_prefix.Plan(runs=[], todo=images, number=1, resumed=False)


def resume_plan(work: work_prefix.WorkPrefix, images: listing.Listing, fingerprint: dict) -> work_prefix.Plan:
    """The keys without a durable line, after checking that the earlier run's fingerprint is this one's."""
    job = work.read_job()
    if job is None:
        raise JobError(f"{work.uri} has no job.json, so what made its lines is unknown; "
                       "add --overwrite to discard it and start again")
    differ = work_prefix.differences(job["fingerprint"], fingerprint)
    if differ:
        raise JobError(f"cannot resume: the earlier run under {work.uri} used different settings or files, "
                       f"and one output must not mix them: {'; '.join(differ)}. Rerun with the earlier "
                       "settings, or add --overwrite (instead of --resume) to start again")
    runs = work.runs()
    if isinstance(images, extsort.SpilledListing):
        images = images.load()  # a dry run's resume check: which keys lack a line needs every key in memory
    todo = images.filter(work_prefix.remaining_keys(work, runs, images))
    log.info("--resume: %d of %d keys already have a durable line (%d runs under %s); scoring %d",
             len(images) - len(todo), len(images), len(runs), work.uri, len(todo))
    return work_prefix.Plan(runs=runs, todo=todo, number=max((run.number for run in runs), default=0) + 1, resumed=True)


def clear_dataset(cfg: JobConfig, client, found: dataset.Contents) -> None:
    """``--overwrite`` of a dataset: its files, ``_SUCCESS`` and summary (``found``) go before any new file appears."""
    removed = writes.delete_objects(client, cfg.output_bucket, [*found.files, *found.own])
    if removed:
        log.info("--overwrite: removed the %s of the earlier dataset under %s", plural(removed, "object"),
                 cfg.output_uri)


def plan_dataset(cfg: JobConfig, client, work: work_prefix.WorkPrefix, images, inputs: dataset.PlanInputs, dry: bool,
                 found: dataset.Contents) -> dataset.DatasetPlan:
    """A resumed dataset's plan: the first run's rows per file; its files (``found``) kept, or deleted if the keys
    changed. Only the run's own files: a ``--skip-existing`` run's earlier runs' files are never its to delete."""
    job = work.read_job() or {}
    plan = dataset.resume_plan(job.get("dataset"), cfg.rows_per_file, inputs.auto_rows, images, found,
                               inputs.existing, cfg.skip_existing)
    stale = [key for index, (key, _) in found.run_files(plan.run).items() if index not in plan.keep]
    if plan.keep:
        log.info("--resume: keeping the %s an earlier run completed under %s (same keys)",
                 plural(len(plan.keep), "dataset file"), cfg.output_uri)
    if stale and not dry:
        # The key list changed since: those files' rows would not be this run's. Gone before any new file appears.
        writes.delete_objects(client, cfg.output_bucket, stale)
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
