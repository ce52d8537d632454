"""The output as a Parquet dataset: ``--output s3://BUCKET/PREFIX/`` (a trailing slash).

The prefix holds ``part-00000.parquet``, ``part-00001.parquet``, ... and, once
the job has ended, ``_SUCCESS`` (JSON: each file's key, rows and bytes) and
``_summary.json``; the job's own files (``_parts/``, ``_status.json``,
``_report.html``) start with an underscore, so readers skip them
(:mod:`mxjob.sidecar`). The assembly gives the rows in key order, one per
key, while the job runs (:mod:`mxjob.assembly`), and :class:`DatasetSink`
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
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from mxjob import merge
from mxjob.errors import JobError, plural
from mxjob.s3 import parallel_list
from mxjob.sidecar import NAMES, side_key

log = logging.getLogger(__name__)

#: A dataset file's name under the prefix: the file's index, at least 5 digits.
FILE_NAME = "part-{index:05d}.parquet"
_FILE = re.compile(r"part-(\d{5,})\.parquet$")
#: ``--rows-per-file auto`` aims at files of about this many bytes (Athena reads 128 MiB splits well).
TARGET_FILE_BYTES = 128 * 2**20
#: ``auto``'s bounds: a file of fewer rows is all overhead; more rows, a long wait for the file to appear.
AUTO_ROWS = (1_000, 5_000_000)
#: Bytes a row costs besides the key and the task's columns (the error struct's nulls, Parquet's levels).
ROW_OVERHEAD_BYTES = 16
#: Bytes per detection (class id, label, score, four coordinates) and detections per image ``auto`` assumes.
DETECTION_BYTES, TYPICAL_DETECTIONS = 40, 10
#: Bytes per top-k prediction (class id, probability, a label of about a dozen characters).
PREDICTION_BYTES = 24


def file_key(prefix: str, index: int) -> str:
    """The key of the dataset's file ``index`` under ``prefix`` (which ends with ``/``)."""
    return prefix + FILE_NAME.format(index=index)


def file_index(key: str, prefix: str) -> int | None:
    """The index of a dataset file's key under ``prefix``, else ``None``."""
    match = _FILE.fullmatch(key[len(prefix):]) if key.startswith(prefix) else None
    return int(match.group(1)) if match else None


def auto_rows_per_file(task: str, key_bytes: float, top_k: int, vector_values: int | None,
                       vector_itemsize: int) -> tuple[int, str]:
    """``(rows, why)``: rows per file for files of about :data:`TARGET_FILE_BYTES`, from a row's size.

    A row's size is estimated from what it holds, before compression: the
    key (``key_bytes``, the listing's mean), the task's columns (``top_k``
    predictions; ``vector_values`` values of ``vector_itemsize`` bytes; a
    typical number of detections) and a little overhead. It depends only on
    the key list and the settings, so a resume finds the same number in
    ``job.json``.
    """
    if task == "embed":
        task_bytes, what = (vector_values or 1) * vector_itemsize, f"{vector_values} values of {vector_itemsize} bytes"
    elif task == "detect":
        task_bytes, what = TYPICAL_DETECTIONS * DETECTION_BYTES + 8, f"about {TYPICAL_DETECTIONS} detections"
    else:
        task_bytes, what = top_k * PREDICTION_BYTES, f"{top_k} predictions"
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

    #: The dataset's files by index: ``(key, bytes)``.
    files: dict = field(default_factory=dict)
    #: The job's own files (``_SUCCESS``, ``_summary.json``, ``_status.json``, ``_report.html``).
    own: list = field(default_factory=list)
    #: Keys the job did not write.
    foreign: list = field(default_factory=list)

    @property
    def output_exists(self) -> bool:
        """Whether a dataset is there: files, ``_SUCCESS`` or a summary (a status or report alone is a run's)."""
        return bool(self.files) or any(key.endswith(("_SUCCESS", "_summary.json")) for key in self.own)


def contents(client, bucket: str, prefix: str) -> Contents:
    """List the dataset prefix: its files, the job's own files, and keys the job did not write."""
    work = side_key(prefix, "parts/")
    own_names = {side_key(prefix, name) for name in NAMES if not name.endswith("/")}
    found = Contents()
    for key, size in parallel_list.list_objects(client, bucket, prefix):
        if key.startswith(work):
            continue
        index = file_index(key, prefix)
        if index is not None:
            found.files[index] = (key, size)
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

    def record(self) -> dict:
        """What ``_parts/job.json`` keeps for a resume: rows per file and the key list's digest."""
        return {"rows_per_file": self.rows_per_file, "why": self.why, "keys_sha256": self.keys_sha256}


def rows_setting(given, auto: tuple[int, str]) -> tuple[int, str]:
    """``--rows-per-file`` as given (a number), or ``auto``'s ``(rows, why)``."""
    return (given, "--rows-per-file") if isinstance(given, int) else auto


def fresh_plan(given, auto: tuple[int, str], keys) -> DatasetPlan:
    """A first run's dataset: its rows per file, and the digest of its key list."""
    rows, why = rows_setting(given, auto)
    return DatasetPlan(rows, why, keys_digest(keys))


def resume_plan(record: dict | None, given, auto: tuple[int, str], keys, found: Contents) -> DatasetPlan:
    """A resume's dataset: the first run's rows per file; its files kept if the key list is the same.

    A number given now that is not the first run's is refused: the files
    written so far have the first run's boundaries. The caller deletes the
    files this plan does not keep (:attr:`DatasetPlan.keep`), before any new one appears.
    """
    digest = keys_digest(keys)
    if not record:
        rows, why = rows_setting(given, auto)
        return DatasetPlan(rows, why, digest)
    rows = int(record["rows_per_file"])
    if isinstance(given, int) and given != rows:
        raise JobError(f"--rows-per-file {given}: the run being resumed cut its files at {rows:,} rows, and the "
                       f"files it wrote keep that; resume with --rows-per-file {rows} (or auto), or start again "
                       "with --overwrite")
    plan = DatasetPlan(rows, str(record.get("why") or "the first run's"), digest)
    if record.get("keys_sha256") == digest:
        plan.keep = dict(found.files)
    return plan
