"""The output as a Parquet dataset: ``--output s3://BUCKET/PREFIX/`` (a trailing slash).

The prefix holds ``part-00000.parquet``, ``part-00001.parquet``, ... and, once
the job has ended, ``_SUCCESS`` (JSON: each file's key, rows and bytes) and
``_summary.json``; the job's own files (``_parts/``, ``_status.json``,
``_report.html``) start with an underscore, so readers skip them
(:mod:`mxjob.outputs.sidecar`). The assembly gives the rows in key order, one per
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
import re
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core.errors import JobError, plural
from mxjob.outputs import merge, work_prefix
from mxjob.outputs.sidecar import NAMES, side_key
from mxjob.s3 import parallel_list

log = logging.getLogger(__name__)

#: A dataset file's name under the prefix: the file's index, at least 5 digits.
FILE_NAME = "part-{index:05d}.parquet"
#: ... and a ``--skip-existing`` run's: its run (:func:`new_run`), then the index.
RUN_FILE_NAME = "part-{run}-{index:05d}.parquet"
#: Either name: group 1 the run (absent in a first run's name), group 2 the index.
_FILE = re.compile(r"part-(?:(\d{8}T\d{6}Z)-)?(\d{5,})\.parquet$")
#: A run's name: its start, UTC, to the second (``RUN_FILE_NAME`` sorts the runs' files in the order they ran).
RUN_FORMAT = "%Y%m%dT%H%M%SZ"
#: ``--rows-per-file auto`` aims at files of about this many bytes (Athena reads 128 MiB splits well).
TARGET_FILE_BYTES = 128 * 2**20
#: ``auto``'s bounds: a file of fewer rows is all overhead; more rows, a long wait for the file to appear.
AUTO_ROWS = (1_000, 5_000_000)
#: Bytes a row costs besides the key and the task's columns (the error struct's nulls, Parquet's levels).
ROW_OVERHEAD_BYTES = 16


def file_key(prefix: str, index: int, run: str | None = None) -> str:
    """The key of the dataset's file ``index`` under ``prefix`` (which ends with ``/``), of ``run`` if given."""
    return prefix + (RUN_FILE_NAME.format(run=run, index=index) if run else FILE_NAME.format(index=index))


def file_id(key: str, prefix: str) -> tuple[str | None, int] | None:
    """``(run, index)`` of a dataset file's key under ``prefix`` (``run`` ``None`` for ``part-NNNNN.parquet``),
    else ``None``."""
    match = _FILE.fullmatch(key[len(prefix):]) if key.startswith(prefix) else None
    return (match.group(1), int(match.group(2))) if match else None


def file_index(key: str, prefix: str) -> int | None:
    """The index of a dataset file's key under ``prefix``, whichever run wrote it, else ``None``."""
    found = file_id(key, prefix)
    return found[1] if found else None


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
    rows = int(TARGET_FILE_BYTES // row)
    rows = min(max(rows, AUTO_ROWS[0]), AUTO_ROWS[1])
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

    @property
    def output_exists(self) -> bool:
        """Whether a dataset is there: files, ``_SUCCESS`` or a summary (a status or report alone is a run's)."""
        return bool(self.files) or any(key.endswith(("_SUCCESS", "_summary.json")) for key in self.own)

    def runs(self) -> list[str | None]:
        """The runs whose files are there, in the order they ran (``None``: the files of a run without a name)."""
        return list(dict.fromkeys(file_id(key, self.prefix)[0] for key in sorted(self.files)))

    def run_files(self, run: str | None) -> dict[int, tuple[str, int]]:
        """The files of ``run`` (``None``: ``part-NNNNN.parquet``) by index: ``(key, bytes)``."""
        out = {}
        for key, size in self.files.items():
            found_run, index = file_id(key, self.prefix)
            if found_run == run:
                out[index] = (key, size)
        return out


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
                       f"{found.foreign[0].rsplit('/', 1)[-1]!r}): a reader of the dataset would read "
                       f"{'it' if len(found.foreign) == 1 else 'them'} too. Choose an empty prefix, or move "
                       f"{'it' if len(found.foreign) == 1 else 'them'} away")


@dataclass
class DatasetPlan:
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


@dataclass(frozen=True)
class PlanInputs:
    """What a dataset's plan is made from besides the key list and the settings."""

    #: ``--rows-per-file auto``'s ``(rows, why)`` for this model and key list.
    auto_rows: tuple = (0, "")
    #: A ``--skip-existing`` run's :class:`mxjob.outputs.existing.Existing`: what the earlier files hold.
    existing: object = None


#: A plan's inputs when there are none (an output that is not a dataset).
NO_INPUTS = PlanInputs()


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


def fresh_plan(given, auto: tuple[int, str], keys, run: str | None = None, existing=None,
               rescore_errors: bool = False, skip_existing: bool | None = None) -> DatasetPlan:
    """A first run's dataset: its rows per file, and the digest of the keys its files will hold.

    ``run`` and ``existing``: a ``--skip-existing`` run's name (:func:`new_run`) and what the earlier
    files hold (:class:`mxjob.outputs.existing.Existing`). ``skip_existing``: whether the run adds to an output
    (default: whether it has a name, as a dataset's runs do).
    """
    rows, why = rows_setting(given, auto)
    return DatasetPlan(rows, why, keys_digest(file_keys(keys, existing)), run=run, existing=existing,
                       rescore_errors=rescore_errors,
                       skip_existing=run is not None if skip_existing is None else skip_existing)


def table_resume_plan(record: dict | None, given, auto: tuple[int, str], existing=None,
                      skip_existing: bool = False, rescore_errors: bool = False) -> DatasetPlan:
    """A resumed Iceberg table run's plan: the first attempt's name and rows per file (no files are kept by
    index: the run's files are committed and their keys left out before the plan, by
    :func:`mxjob.outputs.iceberg_run.settle`)."""
    record = record or {}
    if bool(record.get("skip_existing")) != skip_existing:
        raise JobError(skip_existing_mismatch(bool(record.get("skip_existing"))))
    if record.get("run") is None:
        raise JobError("cannot resume: the run being resumed did not write to an Iceberg table (its job.json names "
                       "no run); resume it with the output it was started with")
    if bool(record.get("rescore_errors")) != rescore_errors:
        started = "with" if record.get("rescore_errors") else "without"
        raise JobError(f"cannot resume: the run being resumed was started {started} --rescore-errors, and its key "
                       "list depends on it; resume it as it was started")
    rows, why = (int(record["rows_per_file"]), str(record.get("why") or "the first run's")) \
        if "rows_per_file" in record else rows_setting(given, auto)
    return DatasetPlan(rows, why, "", run=record["run"], existing=existing, skip_existing=skip_existing,
                       rescore_errors=rescore_errors)


def resume_plan(record: dict | None, given, auto: tuple[int, str], keys, found: Contents, existing=None,
                skip_existing: bool = False) -> DatasetPlan:
    """A resume's dataset: the first run's rows per file and name; its files kept if the key list is the same.

    A number given now that is not the first run's is refused: the files
    written so far have the first run's boundaries. So is a resume with or
    without ``--skip-existing`` of a run that was the other kind: its key
    list would be another. The caller deletes the run's files this plan does
    not keep (:attr:`DatasetPlan.keep`), before any new one appears; the
    earlier runs' files are never this plan's to keep or delete.
    """
    record = record or {}
    if bool(record.get("skip_existing")) != skip_existing:
        raise JobError(skip_existing_mismatch(bool(record.get("skip_existing"))))
    run = record.get("run")
    digest = keys_digest(file_keys(keys, existing))
    rescore_errors = bool(record.get("rescore_errors"))
    if "rows_per_file" not in record:
        rows, why = rows_setting(given, auto)
        return DatasetPlan(rows, why, digest, run=run, existing=existing, rescore_errors=rescore_errors,
                           skip_existing=skip_existing)
    rows = int(record["rows_per_file"])
    if isinstance(given, int) and given != rows:
        raise JobError(f"--rows-per-file {given}: the run being resumed cut its files at {rows:,} rows, and the "
                       f"files it wrote keep that; resume with --rows-per-file {rows} (or auto), or start again "
                       "with --overwrite")
    plan = DatasetPlan(rows, str(record.get("why") or "the first run's"), digest, run=run, existing=existing,
                       rescore_errors=rescore_errors, skip_existing=skip_existing)
    if record.get("keys_sha256") == digest:
        plan.keep = found.run_files(run)
    return plan


def skip_existing_mismatch(earlier: bool) -> str:
    """Why a resume is refused whose ``--skip-existing`` is not the run's it resumes (``earlier``: that run's)."""
    if earlier:
        return ("cannot resume: the run being resumed was a --skip-existing run (it adds its files beside the "
                "earlier runs'); resume it with --skip-existing, as it was started")
    return ("cannot resume: the run being resumed was not a --skip-existing run (it writes every key); resume it "
            "without --skip-existing, or add --overwrite instead of --resume to start again")


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
        differ = work_prefix.differences(earlier, fingerprint)
        if differ:
            raise JobError(f"--skip-existing: the rows in {uri} were made with other settings or files than this "
                           f"run's, and one dataset must not mix them: {'; '.join(differ)} (in "
                           f"{key.rsplit('/', 1)[-1]}). Run with the earlier settings, write to another prefix, or "
                           "replace the dataset with --overwrite instead of --skip-existing")


def success_body(files: list[dict], rows_per_file: int, run: str | None, prefix: str,
                 rewritten: list[dict] = ()) -> dict:
    """``_SUCCESS``: every file of the dataset (``{"key", "rows", "bytes"}``, every run's, in key order), the rows,
    and a section per run with the files it added; this ``run``'s also names the earlier files it rewrote."""
    runs: dict = {}
    for f in files:
        name = file_id(f["key"], prefix)[0]
        section = runs.setdefault(name, {"run": name, "files": [], "rows": 0})
        section["files"].append(f["key"])
        section["rows"] += f["rows"]
    runs.setdefault(run, {"run": run, "files": [], "rows": 0})
    if rewritten:
        runs[run]["rewrote"] = [{k: f[k] for k in ("key", "rows", "bytes", "replaced")} for f in rewritten]
    return {"files": files, "rows": sum(f["rows"] for f in files), "rows_per_file": rows_per_file,
            "runs": list(runs.values())}
