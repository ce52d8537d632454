"""Claiming the output for a run: a fresh run or the next of an earlier one, and what would overwrite or mix results.

:func:`claim_workload` decides from what is already there (the output itself,
asked through its :class:`mxjob.outputs.Output`; an earlier run's progress
under the work prefix) and the run's fingerprint
(:mod:`mxjob.outputs.fingerprint`); YARN's next attempt of an application
resumes its first attempt's progress (:func:`yarn_retry`) or ends as it did
(:func:`finished_by_this_application`). The command that resumes a run is
:mod:`mxjob.run.rerun`'s.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from mxjob.core.errors import JobError, first_line, plural
from mxjob.inputs import extsort, listing
from mxjob.outputs import work_prefix
from mxjob.outputs.base import LayoutInputs, side_key
from mxjob.outputs.fingerprint import differences
from mxjob.outputs.lease import Lease, holder_facts, new_run_id
from mxjob.s3 import access

if TYPE_CHECKING:
    from mxjob.options.config import JobConfig

log = logging.getLogger(__name__)


def output_lease(cfg: JobConfig, client) -> Lease:
    """This run's lease on its output (not taken yet): ``lease.json`` in the output's home, naming this run."""
    application, attempt = yarn_attempt()
    holder = holder_facts(new_run_id(), cfg.output_uri, application, attempt)
    return Lease(client, cfg.output_bucket, cfg.output.side_key("lease.json"), holder)


def refuse_unresumed_progress(cfg: JobConfig, client, yarn_retry: bool) -> None:
    """Before the listing: an earlier run's progress that this run would not resume (no ``--resume``,
    ``--overwrite`` or YARN's next attempt) is refused now, in seconds, with what to do (:func:`refuse_progress`)."""
    if cfg.overwrite or cfg.resume or yarn_retry or cfg.dry_run:
        return
    work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    if work.exists():
        refuse_progress(work, cfg.output)


def yarn_attempt() -> tuple[str | None, int]:
    """``(application id, attempt number)`` of this YARN container from ``CONTAINER_ID``, else ``(None, 1)``.

    YARN names a container ``container[_eE]_<cluster ts>_<app>_<attempt>_<n>``:
    the application master of attempt 2 runs in ``..._0001_02_000001``.
    """
    match = re.match(r"container_(?:e\d+_)?(\d+)_(\d+)_(\d+)_\d+$", os.environ.get("CONTAINER_ID", ""))
    if not match:
        return None, 1
    return f"application_{match.group(1)}_{match.group(2)}", int(match.group(3))


@dataclass(frozen=True)
class WorkloadInputs:
    """What a workload's files are made from besides the key list and the settings."""

    #: ``--rows-per-file auto``'s ``(rows, why)`` for this model and key list.
    auto_rows: tuple = (0, "")
    #: A ``--skip-existing`` run's :class:`mxjob.outputs.existing.Existing`: what the output holds already.
    existing: object = None


#: A workload's inputs when there are none.
NO_INPUTS = WorkloadInputs()


def claim_workload(cfg: JobConfig, client, work: work_prefix.WorkPrefix, images: listing.Listing, fingerprint: dict,
                dry: bool = False, inputs: WorkloadInputs = NO_INPUTS) -> work_prefix.Workload:
    """Decide between a fresh run and a resume; refuse what would overwrite or mix results.

    Raises :class:`JobError` with what to do: the output exists (``--overwrite``),
    an earlier run's progress exists (``--resume`` or ``--overwrite``), or the
    earlier run's fingerprint differs from this one's; :class:`Completed` for
    a resume of a finished output. A fresh run records its fingerprint, and
    ``--overwrite`` removes the earlier progress (and what the output clears:
    :meth:`mxjob.outputs.Output.clear`), unless ``dry``. An output cut into
    files plans them (:meth:`mxjob.outputs.Output.files`, from ``inputs``);
    they are the workload's ``layout``.

    ``--skip-existing`` (``inputs.existing``: what :meth:`mxjob.outputs.Output.existing`
    read, ``images`` the keys it left) adds to an output that exists, as a new
    run with files of its own, once the rows there are found to be made as
    this run's are.
    """
    output, existing = cfg.output, inputs.existing
    output_exists, work_exists, found = existing_output(cfg, client, work)
    if cfg.overwrite:
        if work_exists and not dry:
            log.info("--overwrite: removing %d objects of the earlier run under %s", work.remove(), work.uri)
        work_exists = False
    resume = cfg.resume or (work_exists and not cfg.overwrite and yarn_retry(work))
    if work_exists and not resume:
        refuse_progress(work, output)
    appending = cfg.skip_existing and output.adds_rows
    if output_exists and not cfg.overwrite and not (resume and work_exists) and not appending:
        refuse_existing_output(cfg, client, resume)
    if appending and existing is not None:
        output.check_fingerprints(existing, fingerprint)
    if cfg.overwrite and not dry:
        output.clear(cfg, client, found)
    files = output.files(cfg, client, LayoutInputs(work, images, inputs.auto_rows, existing, found, resumed=work_exists,
                                               appending=appending, dry=dry))
    if work_exists:
        workload = resumed_workload(work, images, fingerprint)
    else:
        workload = fresh_workload(cfg, work, images, fingerprint, resume and not appending, dry, files)
    workload.layout = files
    if not dry and (cfg.overwrite or work_exists):
        abort_left_uploads(work, output)
    return workload


def refuse_progress(work: work_prefix.WorkPrefix, output) -> NoReturn:
    """Raise for an earlier run's progress that this run does not resume (``output`` says what to do instead)."""
    runs = work.runs()
    done = sum(len(run.done) for run in runs)
    progress = (f"{work.uri} holds an earlier run's progress ({plural(done, 'durable batch', 'durable batches')} in "
                f"{plural(len(runs), 'run')})")
    raise JobError(f"{progress}; {output.progress_advice(work)}")


def refuse_existing_output(cfg: JobConfig, client, resume: bool) -> NoReturn:
    """Raise for a complete output: :class:`Completed` (a resume, or YARN's retry of the run that wrote it), else
    what the output says (:meth:`mxjob.outputs.Output.refuse_existing`)."""
    if resume:
        raise Completed(cfg.output_uri)
    if (code := finished_by_this_application(cfg, client)) is not None:
        raise Completed(cfg.output_uri, code)
    cfg.output.refuse_existing(cfg)
    raise AssertionError("Output.refuse_existing returned")


def abort_left_uploads(work: work_prefix.WorkPrefix, output) -> None:
    """Abort the uploads a killed driver left open beside the output, its files among them (never visible; S3 bills
    their parts): :meth:`mxjob.outputs.Output.left_upload` says which are its."""
    aborted = work.abort_uploads(output.left_upload)
    if aborted:
        log.info("aborted %s an earlier driver left open (never visible; S3 bills their parts until then)",
                 plural(aborted, "incomplete upload"))


def existing_output(cfg: JobConfig, client, work: work_prefix.WorkPrefix) -> tuple[bool, bool, object]:
    """``(output exists, work prefix exists, what the output holds)`` (:meth:`mxjob.outputs.Output.contents`, read
    once for the plan's every look at it). An unreadable output raises :class:`JobError`."""
    try:
        found = cfg.output.contents(cfg, client)
        return cfg.output.exists(cfg, client, found), work.exists(), found
    except JobError:
        raise
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


def fresh_workload(cfg: JobConfig, work: work_prefix.WorkPrefix, images: listing.Listing, fingerprint: dict,
                   resume: bool, dry: bool, new_dataset=None) -> work_prefix.Workload:
    """Every key to score; records the fingerprint (and a dataset's layout) under the work prefix (not dry)."""
    if resume:
        log.info("--resume: nothing under %s yet; scoring every key", work.uri)
    if not dry:
        try:
            work.write_job(fingerprint, cfg.output_uri, new_dataset.record() if new_dataset is not None else None)
        except Exception as exc:
            raise JobError(f"cannot write {work.uri}: {first_line(exc)}; the job needs s3:PutObject, s3:GetObject, "
                           "s3:ListBucket and s3:DeleteObject on the output key and the prefix beside it") from exc
    return work_prefix.Workload(runs=[], todo=images, number=1, resumed=False)


def resumed_workload(work: work_prefix.WorkPrefix, images: listing.Listing, fingerprint: dict) -> work_prefix.Workload:
    """The keys without a durable line, after checking that the earlier run's fingerprint is this one's."""
    job = work.read_job()
    if job is None:
        raise JobError(f"{work.uri} has no job.json, so what made its lines is unknown; "
                       "add --overwrite to discard it and start again")
    differ = differences(job["fingerprint"], fingerprint)
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
    number = max((run.number for run in runs), default=0) + 1
    return work_prefix.Workload(runs=runs, todo=todo, number=number, resumed=True)


class Completed(Exception):
    """``--resume`` of an output that an earlier run already completed: nothing to do.

    ``exit_code``: what this driver exits with; YARN's next attempt of an application whose
    first attempt finished the run (and then exited non-zero) repeats that attempt's code.
    """

    def __init__(self, output_uri: str, exit_code: int = 0):
        super().__init__(output_uri)
        self.exit_code = exit_code


def complete_already(cfg: JobConfig, client) -> Completed | None:
    """Before the listing: a ``--resume`` of an output that an earlier run completed (it is there, and no progress
    is left beside it) has nothing to do, in seconds however large the input. ``None`` otherwise."""
    if not cfg.resume or cfg.skip_existing or cfg.dry_run:
        return None
    output_exists, work_exists, _ = existing_output(cfg, client,
                                                    work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key))
    return Completed(cfg.output_uri) if output_exists and not work_exists else None


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
        status_key = side_key(cfg.output_key, "status.json")
        status = json.loads(client.get_object(Bucket=cfg.output_bucket, Key=status_key)["Body"].read())
    except Exception as exc:  # noqa: BLE001 - no summary or status of ours: not this application's output
        log.debug("no finished run of %s: %s", app, exc)
        return None
    if (summary.get("spark") or {}).get("application_id") != app or status.get("exit_code") is None:
        return None
    log.warning("YARN attempt %d of %s: attempt %d finished the run (exit code %d), so this attempt ends as it did",
                attempt, app, attempt - 1, status["exit_code"])
    return int(status["exit_code"])
