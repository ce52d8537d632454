"""The output as a Parquet dataset: ``--output s3://BUCKET/PREFIX/`` (a trailing slash).

The prefix holds ``part-00000.parquet``, ``part-00001.parquet``, ... and, once
the job has ended, ``_SUCCESS`` (JSON: each file's key, rows and bytes) and
``_summary.json``; the job's own files (``_parts/``, ``_status.json``,
``_report.html``) start with an underscore, so readers skip them
(:mod:`mxjob.outputs.base`). The assembly gives the rows in key order, one per
key, while the job runs (:mod:`mxjob.outputs.assembly`), and :class:`DatasetSink`
cuts them into files of ``rows_per_file`` rows: file ``i`` holds rows ``i *
R`` to ``(i + 1) * R - 1`` of the job's sorted key list, so the same key
list always gives the same files. Each file is one multipart upload,
completed when the file is whole: a reader of the prefix (pyarrow.dataset,
Spark, Athena) sees whole files only, so whole rows, and never a key twice.

A resume keeps the files an interrupted run completed when the key list is
the one that run recorded (:func:`keys_digest` in ``_parts/job.json``): they
hold exactly the rows the resume would write. When the key list changed
(objects added or removed since), the old files are deleted before any new
one appears.

A ``--skip-existing`` run adds its files beside the earlier runs' under names
of its own, ``part-<run>-00000.parquet``, ..., where ``<run>`` is the run's
UTC start (``20261126T071846Z``), later than every earlier run's
(:func:`new_run`): its keys are those no earlier file holds
(:mod:`mxjob.outputs.existing`), so a reader still sees each key once. A resume of
such a run keeps and deletes only its own files; ``_SUCCESS`` lists every
run's files, with a section per run (:func:`success_body`).
"""

from __future__ import annotations

import calendar
import hashlib
import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core.errors import JobError, first_line, plural
from mxjob.inputs import listing
from mxjob.outputs import claim, merge, work_prefix
from mxjob.outputs.base import NAMES, LayoutInputs, Output, OutputError, is_prefix, refuse_gzipped_parquet, side_key
from mxjob.outputs.dataset_files import DatasetSink, file_id, summary_of
from mxjob.outputs.existing import EarlierFile, Existing, KeyFilter, in_memory, output_filesystem, read_keys, select
from mxjob.outputs.fingerprint import differences
from mxjob.outputs.parquet import provenance
from mxjob.s3 import clients, parallel_list, writes

log = logging.getLogger(__name__)

#: A run's name: its start, UTC, to the second (``RUN_FILE_NAME`` sorts the runs' files in the order they ran).
RUN_FORMAT = "%Y%m%dT%H%M%SZ"
#: ``--rows-per-file auto`` aims at files of about this many bytes (Athena reads 128 MiB splits well).
TARGET_FILE_BYTES = 128 * 2**20
#: ``auto``'s bounds: a file of fewer rows is all overhead; more rows, a long wait for the file to appear.
AUTO_ROWS = (1_000, 5_000_000)
#: Bytes a row costs besides the key and the task's columns (the error struct's nulls, Parquet's levels).
ROW_OVERHEAD_BYTES = 16


def new_run(found: Contents, now: float | None = None) -> str:
    """A name for a ``--skip-existing`` run's files: its UTC start, a second after the latest run's if not later.

    Names never collide with an earlier run's, and sort in the order the runs ran.
    """
    started = int(time.time() if now is None else now)
    latest = max((run for run in found.runs() if run), default=None)
    if latest is not None:
        started = max(started, calendar.timegm(time.strptime(latest, RUN_FORMAT)) + 1)
    return time.strftime(RUN_FORMAT, time.gmtime(started))


def auto_rows_per_file(key_bytes: float, task_bytes: float, what: str) -> tuple[int, str]:
    """``(rows, why)``: rows per file for files of about :data:`TARGET_FILE_BYTES`, from a row's size.

    A row's size is estimated from what it holds, before compression: the
    key (``key_bytes``, the listing's mean), the task's columns
    (``task_bytes``, ``what`` in words: ``Task.row_bytes``) and a little
    overhead. It depends only on the key list and the settings, so a resume
    finds the same number in ``job.json``.
    """
    row = key_bytes + task_bytes + ROW_OVERHEAD_BYTES
    rows = min(max(int(TARGET_FILE_BYTES // row), AUTO_ROWS[0]), AUTO_ROWS[1])
    rows = rows // 1000 * 1000 if rows >= 10_000 else rows
    return rows, (f"about {row:.0f} bytes a row before compression (a {key_bytes:.0f}-byte key, {what}): "
                  f"{rows:,} rows for files of about {TARGET_FILE_BYTES // 2**20} MiB")


def keys_digest(keys) -> str:
    """SHA-256 of a sorted key list (a :class:`listing.Listing`, or key strings), whatever its Arrow chunking.

    Each key's UTF-8 bytes and length, in order: two key lists have one
    digest only if they are the same keys in the same order.
    """
    lengths_digest, data_digest = hashlib.sha256(), hashlib.sha256()  # two streams: chunking cannot shift them
    for chunk in merge.key_column(keys).chunks:
        if not len(chunk):
            continue
        lengths = pc.binary_length(chunk).cast(pa.int64())
        lengths_digest.update(lengths.buffers()[1][lengths.offset * 8:(lengths.offset + len(lengths)) * 8])
        offsets = chunk.buffers()[1]
        start = int.from_bytes(offsets[chunk.offset * 8:chunk.offset * 8 + 8], "little", signed=True)
        end = int.from_bytes(offsets[(chunk.offset + len(chunk)) * 8:(chunk.offset + len(chunk)) * 8 + 8],
                             "little", signed=True)
        data_digest.update(chunk.buffers()[2][start:end])
    return hashlib.sha256(lengths_digest.digest() + data_digest.digest()).hexdigest()


@dataclass
class Contents:
    """What is under a dataset prefix, its work prefix aside."""

    #: The dataset's files, every run's: key to bytes, in key order (so the runs' in the order they ran).
    files: dict = field(default_factory=dict)
    #: The job's own files (``_SUCCESS``, ``_summary.json``, ``_status.json``, ``_report.html``).
    own: list = field(default_factory=list)
    #: Keys the job did not write.
    foreign: list = field(default_factory=list)
    #: The dataset's prefix (ends with ``/``).
    prefix: str = ""

    def runs(self) -> list[str | None]:
        """The runs whose files are there, in the order they ran (``None``: the files of a run without a name)."""
        return list(dict.fromkeys(file_id(key, self.prefix)[0] for key in sorted(self.files)))

    def run_files(self, run: str | None) -> dict[int, tuple[str, int]]:
        """The files of ``run`` (``None``: ``part-NNNNN.parquet``) by index: ``(key, bytes)``."""
        ids = {key: file_id(key, self.prefix) for key in self.files}
        return {index: (key, self.files[key]) for key, (found_run, index) in ids.items() if found_run == run}


def contents(client, bucket: str, prefix: str) -> Contents:
    """List the dataset prefix: its files, the job's own files, and keys the job did not write."""
    work = side_key(prefix, "parts/")
    own_names = {side_key(prefix, name) for name in NAMES if not name.endswith("/")}
    found = Contents(prefix=prefix)
    for key, size in parallel_list.list_objects(client, bucket, prefix):
        if key.startswith(work):
            continue
        if file_id(key, prefix) is not None:  # any run's file, this one's or an earlier one's
            found.files[key] = size
        elif key in own_names:
            found.own.append(key)
        else:
            found.foreign.append(key)
    return found


def refuse_foreign(found: Contents, uri: str) -> None:
    """A dataset prefix holding objects the job did not write is refused: its readers would read them as rows."""
    if found.foreign:
        raise JobError(f"{uri} holds {plural(len(found.foreign), 'object')} the job did not write (for example "
                       f"{found.foreign[0]!r}): a reader of the dataset would read "
                       f"{'it' if len(found.foreign) == 1 else 'them'} too. Choose an empty prefix, or move "
                       f"{'it' if len(found.foreign) == 1 else 'them'} away")


@dataclass
class DatasetLayout:
    """A run's dataset: rows per file (and why), the key list's digest, and the files an earlier run completed."""

    rows_per_file: int
    why: str
    keys_sha256: str
    #: Files kept from an interrupted run over the same key list: index to ``(key, bytes)``.
    keep: dict = field(default_factory=dict)
    #: A ``--skip-existing`` run's name (its files are ``part-<run>-NNNNN.parquet``); ``None``: ``part-NNNNN``.
    run: str | None = None
    #: A ``--skip-existing`` run's: what the earlier runs' files hold (:class:`mxjob.outputs.existing.Existing`).
    existing: object = None
    #: Whether the run scores again the keys whose row is an error (``--rescore-errors``).
    rescore_errors: bool = False
    #: Whether the run adds to what the output holds (``--skip-existing``); a table's runs have a name without it.
    skip_existing: bool = False
    #: An Iceberg table's run: what it found of its earlier attempt (:class:`mxjob.outputs.iceberg_run.Settled`).
    settled: object = None

    def record(self) -> dict:
        """What ``_parts/job.json`` keeps for a resume: rows per file, the key list's digest, the run's name."""
        out = {"rows_per_file": self.rows_per_file, "why": self.why, "keys_sha256": self.keys_sha256}
        if self.run is not None:
            out.update(run=self.run, skip_existing=self.skip_existing, rescore_errors=self.rescore_errors)
        return out


def rows_setting(given, auto: tuple[int, str]) -> tuple[int, str]:
    """``--rows-per-file`` as given (a number), or ``auto``'s ``(rows, why)``."""
    return (given, "--rows-per-file") if isinstance(given, int) else auto


def file_keys(keys, existing=None):
    """The keys that go into the run's files: all of ``keys``, less those a ``--rescore-errors`` run writes into
    the earlier files instead (``existing.rescore``)."""
    rescore = getattr(existing, "rescore", None)
    if rescore is None or not rescore.any():
        return keys
    return keys.filter(pa.array(~rescore))


def fresh_layout(given, auto: tuple[int, str], keys, run: str | None = None, existing=None,
                 rescore_errors: bool = False, skip_existing: bool | None = None) -> DatasetLayout:
    """A first run's dataset: its rows per file, and the digest of the keys its files will hold.

    ``run`` and ``existing``: a ``--skip-existing`` run's name (:func:`new_run`) and what the earlier
    files hold (:class:`mxjob.outputs.existing.Existing`). ``skip_existing``: whether the run adds to an output
    (default: whether it has a name, as a dataset's runs do).
    """
    return DatasetLayout(*rows_setting(given, auto), keys_digest(file_keys(keys, existing)), run=run,
                         existing=existing, rescore_errors=rescore_errors,
                         skip_existing=run is not None if skip_existing is None else skip_existing)


def recorded_rows(record: dict, given, auto: tuple[int, str]) -> tuple[int, str]:
    """``(rows, why)`` of the run being resumed (its ``job.json``'s), or as given now if it recorded none."""
    if "rows_per_file" not in record:
        return rows_setting(given, auto)
    return int(record["rows_per_file"]), str(record.get("why") or "the first run's")


def table_resumed_layout(record: dict | None, given, auto: tuple[int, str], existing=None,
                         skip_existing: bool = False, rescore_errors: bool = False) -> DatasetLayout:
    """A resumed Iceberg table run's layout: the first attempt's name and rows per file (no files are kept by
    index: the run's files are committed and their keys left out before the plan, by
    :func:`mxjob.outputs.iceberg_run.settle`)."""
    record = record or {}
    check_resumable(record, skip_existing, rescore_errors)
    if record.get("run") is None:
        raise JobError("cannot resume: the run being resumed did not write to an Iceberg table (its job.json names "
                       "no run); resume it with the output it was started with")
    return DatasetLayout(*recorded_rows(record, given, auto), "", run=record["run"], existing=existing,
                         skip_existing=skip_existing, rescore_errors=rescore_errors)


def resumed_layout(record: dict | None, given, auto: tuple[int, str], keys, found: Contents, existing=None,
                   skip_existing: bool = False) -> DatasetLayout:
    """A resume's dataset: the first run's rows per file and name; its files kept if the key list is the same.

    A number given now that is not the first run's is refused: the files
    written so far have the first run's boundaries. So is a resume with or
    without ``--skip-existing`` of a run that was the other kind: its key
    list would be another. The caller deletes the run's files this layout does
    not keep (:attr:`DatasetLayout.keep`), before any new one appears; the
    earlier runs' files are never this layout's to keep or delete.
    """
    record = record or {}
    check_resumable(record, skip_existing)
    rows, why = recorded_rows(record, given, auto)
    if "rows_per_file" in record and isinstance(given, int) and given != rows:
        raise JobError(f"--rows-per-file {given}: the run being resumed cut its files at {rows:,} rows, and the "
                       f"files it wrote keep that; resume with --rows-per-file {rows} (or auto), or start again "
                       "with --overwrite")
    digest = keys_digest(file_keys(keys, existing))
    layout = DatasetLayout(rows, why, digest, run=record.get("run"), existing=existing,
                           rescore_errors=bool(record.get("rescore_errors")), skip_existing=skip_existing)
    if "rows_per_file" in record and record.get("keys_sha256") == digest:
        layout.keep = found.run_files(layout.run)
    return layout


def check_resumable(record: dict, skip_existing: bool, rescore_errors: bool | None = None) -> None:
    """Refuse a resume whose ``--skip-existing`` (and, unless ``None``, ``--rescore-errors``) is not the run's it
    resumes (``record``: that run's): the key list depends on both."""
    earlier = bool(record.get("skip_existing"))
    if earlier and not skip_existing:
        raise JobError("cannot resume: the run being resumed was a --skip-existing run (it adds its files beside the "
                       "earlier runs'); resume it with --skip-existing, as it was started")
    if skip_existing and not earlier:
        raise JobError("cannot resume: the run being resumed was not a --skip-existing run (it writes every key); "
                       "resume it without --skip-existing, or add --overwrite instead of --resume to start again")
    if rescore_errors is not None and bool(record.get("rescore_errors")) != rescore_errors:
        started = "with" if record.get("rescore_errors") else "without"
        raise JobError(f"cannot resume: the run being resumed was started {started} --rescore-errors, and its key "
                       "list depends on it; resume it as it was started")


def check_fingerprints(fingerprints: dict, fingerprint: dict, uri: str) -> None:
    """Refuse to add rows made otherwise than the earlier files' (their ``mxinfer.fingerprint``) to a dataset.

    ``fingerprints``: each fingerprint the files hold (JSON, ``None`` for a file without one) to a file that
    holds it.
    """
    for text, key in fingerprints.items():
        earlier = json.loads(text) if text else None
        if earlier is None:
            raise JobError(f"--skip-existing: {key.rsplit('/', 1)[-1]} in {uri} has no mxinfer.fingerprint, so what "
                           "made its rows is unknown and this run's rows must not be added beside them; write to "
                           "another prefix, or replace the dataset with --overwrite instead of --skip-existing")
        differ = differences(earlier, fingerprint)
        if differ:
            raise JobError(f"--skip-existing: the rows in {uri} were made with other settings or files than this "
                           f"run's, and one dataset must not mix them: {'; '.join(differ)} (in "
                           f"{key.rsplit('/', 1)[-1]}). Run with the earlier settings, write to another prefix, or "
                           "replace the dataset with --overwrite instead of --skip-existing")


# ----------------------------------------------------------------------------
# The output


class DatasetOutput(Output):
    """A Parquet dataset: files of ``--rows-per-file`` rows under a prefix, each whole when it appears."""

    kind = "dataset"
    format = "parquet"
    form = "s3://BUCKET/PREFIX/"
    called = "a Parquet dataset, a prefix ending in '/'"
    adds_rows = True
    cuts_files = True
    summary_field = "dataset"

    @classmethod
    def claims(cls, uri: str, requested_format: str | None) -> bool:
        return uri.startswith("s3://") and is_prefix(uri)

    @classmethod
    def parse(cls, uri: str, settings) -> DatasetOutput:
        output = super().parse(uri, settings)
        requested = settings["output_format"]
        if requested and requested != "parquet":
            raise OutputError(f"{settings.name('output_format')} {requested}: an output ending in '/' "
                              f"({output.key!r}) is a Parquet dataset, a folder of Parquet files; for JSON Lines give "
                              "one object (--output s3://BUCKET/predictions.jsonl), or drop --output-format")
        refuse_gzipped_parquet(settings, output.key, "parquet")
        return output

    def refuse_foreign(self, found: Contents) -> None:
        """Objects the job did not write are refused whatever the flags: a reader of the dataset would read them."""
        refuse_foreign(found, self.uri)

    def contents(self, cfg, client) -> Contents:
        """What is under the prefix (:func:`contents`); unreadable raises :class:`JobError`."""
        try:
            return contents(client, self.bucket, self.key)
        except clients.S3_ERRORS as exc:
            raise JobError(f"cannot list {self.uri}: {first_line(exc)}; the job needs s3:ListBucket and "
                           "s3:GetObject on the output bucket") from exc

    def exists(self, cfg, client, found) -> bool:
        """Whether a dataset is there: files, ``_SUCCESS`` or a summary (a status or report alone is a run's)."""
        return bool(found.files) or any(key.endswith(("_SUCCESS", "_summary.json")) for key in found.own)

    def check_fingerprints(self, existing, fingerprint: dict) -> None:
        check_fingerprints(existing.fingerprints, fingerprint, self.uri)

    def clear(self, cfg, client, found) -> None:
        """``--overwrite``: its files, ``_SUCCESS`` and summary go before any new file appears."""
        removed = writes.delete_objects(client, self.bucket, [*found.files, *found.own])
        if removed:
            log.info("--overwrite: removed the %s of the earlier dataset under %s", plural(removed, "object"), self.uri)

    def files(self, cfg, client, planning: LayoutInputs) -> DatasetLayout:
        if not planning.resumed:
            run = new_run(planning.found) if planning.appending else None
            return fresh_layout(cfg.rows_per_file, planning.auto_rows, planning.images, run, planning.existing,
                              cfg.rescore_errors, skip_existing=cfg.skip_existing)
        return self._resumed(cfg, client, planning)

    def _resumed(self, cfg, client, planning: LayoutInputs) -> DatasetLayout:
        """A resumed dataset's layout: the first run's rows per file; its files kept, or deleted if the keys
        changed. Only the run's own files: a ``--skip-existing`` run's earlier runs' files are never its to delete."""
        found = planning.found
        job = planning.work.read_job() or {}
        layout = resumed_layout(job.get("dataset"), cfg.rows_per_file, planning.auto_rows, planning.images, found,
                           planning.existing, cfg.skip_existing)
        stale = [key for index, (key, _) in found.run_files(layout.run).items() if index not in layout.keep]
        if layout.keep:
            log.info("--resume: keeping the %s an earlier run completed under %s (same keys)",
                     plural(len(layout.keep), "dataset file"), self.uri)
        if stale and not planning.dry:
            # The key list changed since: those files' rows would not be this run's. Gone before any new file appears.
            writes.delete_objects(client, self.bucket, stale)
            log.info("--resume: the input's keys changed since the earlier run; deleted its %s under %s, to be "
                     "written again", plural(len(stale), "dataset file"), self.uri)
        return layout

    def left_upload(self, key: str) -> bool:
        return file_id(key, self.key) is not None

    def existing(self, cfg, client, images) -> Existing:
        return find(cfg, client, images)

    def finish_nothing_new(self, cfg, client, work, found) -> None:
        """A resumed run none of whose keys is listed any more: its files go, and its progress."""
        if found.run is None:
            return
        gone = writes.delete_objects(client, self.bucket, [
            key for key, _ in self.contents(cfg, client).run_files(found.run).values()])
        log.info("--skip-existing: the run being resumed has no listed key left; removed its %s and %d work objects",
                 plural(gone, "file"), work.remove())

    def sink(self, cfg, client, work, workload):
        files = workload.layout
        return DatasetSink(client, self.bucket, self.key, files.rows_per_file, provenance(work.read_job()),
                           files.keep, files if files.run else None)

    def summary_entry(self, sink, workload) -> dict:
        return {**summary_of(sink), "rows_per_file_why": workload.layout.why}


# ----------------------------------------------------------------------------
# --skip-existing: what the earlier runs' files hold


def find(cfg, client, images: listing.Listing) -> Existing:
    """Read what the output's files hold and filter the listing: the keys this ``--skip-existing`` run scores.

    The files of the run being resumed (``--resume``, or YARN's next attempt)
    are not "existing": its key list is the one its first attempt planned.
    An earlier run's progress that this run would not resume is refused here,
    before the files are read. Files whose rows were made otherwise (another
    model, task or recipe) are refused later, by the plan, against the run's
    fingerprint (:func:`dataset.check_fingerprints`).
    """
    started = time.time()
    images, sample = in_memory(images)
    found = cfg.output.contents(cfg, client)
    work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    own = resumed_run(cfg, work)
    files = [EarlierFile(key, size) for key, size in found.files.items()
             if own is None or file_id(key, found.prefix)[0] != own]
    if not files:
        log.info("--skip-existing: %s holds no file of an earlier run; every listed key is new", cfg.output_uri)
        return Existing(listed=len(images), new=images, sample=sample, run=own, seconds=time.time() - started)
    by_key = {f.key: i for i, f in enumerate(files)}
    marks, errors, owners, fingerprints = KeyFilter(images.keys), [], [], {}
    try:
        for key, keys, failed, fingerprint in read_keys(output_filesystem(cfg), cfg.output_bucket, files,
                                                       cfg.rescore_errors):
            files[by_key[key]].rows += len(keys)
            marks.add(keys)
            fingerprints.setdefault(fingerprint, key)
            if failed is not None and len(failed):
                errors.append(failed.cast(listing.KEY_TYPE))
                owners.append(np.full(len(failed), by_key[key], dtype=np.int64))
    except (OSError, pa.ArrowException) as exc:
        raise JobError(f"--skip-existing: cannot read the keys of the files in {cfg.output_uri}: "
                       f"{first_line(exc)}; the job needs s3:GetObject on them") from exc
    hit = marks.finish()
    new, rescore, owner = select(images, hit, pa.concat_arrays(errors) if errors else None,
                                 np.concatenate(owners) if owners else None)
    out = Existing(listed=len(images), new=new, in_output=int(hit.sum()), rescore=rescore, owner=owner,
                   files=files, fingerprints=fingerprints, sample=sample, run=own, seconds=time.time() - started)
    log.info("--skip-existing: %s of %s listed keys have a row in the %s under %s (read in %.1f s); %s%s to "
             "score", f"{out.in_output:,}", f"{out.listed:,}", plural(len(files), "earlier file"), cfg.output_uri,
             out.seconds, f"{out.rescored:,} of them errors to score again and " if out.rescored else "",
             plural(len(new) - out.rescored, "new key"))
    return out


def resumed_run(cfg, work) -> str | None:
    """The name of the ``--skip-existing`` run this one resumes (its files are not "existing"), or ``None``.

    Progress under the work prefix that this run would not resume is
    refused now, as the plan would refuse it, before any file is read; so is
    a resume of a run that was not ``--skip-existing``, or whose
    ``--rescore-errors`` differs.
    """
    if not work.exists():
        return None
    if not (cfg.resume or claim.yarn_retry(work)):
        claim.refuse_progress(work, cfg.output)
    record = (work.read_job() or {}).get("dataset") or {}
    check_resumable(record, True, cfg.rescore_errors)
    return record.get("run")
