"""``--skip-existing``: the keys a dataset output holds already, and the listed keys left to score.

:func:`find` reads the ``key`` column (and, for ``--rescore-errors``, whether
``error`` is null) of every file under the output's prefix, once, and marks the listed keys that have a row there
(:class:`KeyFilter`). What is left of the listing is the run's key list; the
rest of the job runs over it as over any listing, and the dataset sink adds
its files beside the earlier ones (:class:`mxjob.outputs.dataset_files.DatasetSink`). A resume
of such a run leaves its own files out of what "exists", so that it plans the
keys its first attempt planned and the work prefix's durable batches finish
them.

Memory: a file's keys are sorted (the sink writes them in key order), so a
group of files covers a range of the sorted listing. The keys of about
:data:`GROUP_KEYS` existing rows at a time are held, and the listing's keys in
their range are looked up among them with ``pyarrow.compute.is_in``: ten
million existing keys never sit in the driver at once, as Arrow arrays or
otherwise. The marks are one byte per listed key.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from mxjob.inputs import extsort, listing

log = logging.getLogger(__name__)

#: Existing keys looked up at once (or one file's, if more): about 25 MiB of keys of 40 bytes, and about twice
#: that for ``is_in``'s hash table of them.
GROUP_KEYS = 1 << 19
#: Keys read at once from a file: a file is read a row group at a time (the job writes row groups of 100,000
#: rows), in batches of this many keys, one file after another. pyarrow.dataset's scanner, reading several files
#: and batches ahead, held up to 450 MiB of decoded keys beyond the listing at ten million existing keys (files
#: of 1.8 million) while the look-ups caught up; read this way, 150 MiB, for 1.5 s more (6.0 -> 7.5 s, moto).
BATCH_ROWS = 32_768


@dataclass
class EarlierFile:
    """One file of an earlier run, as :func:`find` read it."""

    key: str
    bytes: int
    rows: int = 0


@dataclass
class Existing:
    """What a ``--skip-existing`` run found in the output, and the keys it scores.

    Attributes
    ----------
    listed : int
        Keys listed.
    new : listing.Listing
        The keys this run scores: those listed without a row in the output, and with ``--rescore-errors`` those
        whose row is an error.
    in_output : int
        Listed keys with a row in the output.
    rescore : numpy.ndarray or None
        One flag per key of ``new``: its row in the output is an error (``--rescore-errors``); ``None`` without.
    owner : numpy.ndarray or None
        For each flagged key, in order: the index in ``files`` of the file that holds its error row.
    files : list of EarlierFile
        The earlier runs' files, in key order (a resumed run's own files are not among them).
    fingerprints : dict
        Each ``mxinfer.fingerprint`` the files hold (``None`` for a file without one) to a file that holds it.
    sample : listing.Listing
        The first key listed (a dry run with nothing new scores it).
    run : str or None
        The run this one resumes (:func:`resumed_run`), whose own files are not among ``files``.
    seconds : float
        Reading the files and filtering the listing.
    """

    listed: int
    new: listing.Listing
    in_output: int = 0
    rescore: np.ndarray | None = None
    owner: np.ndarray | None = None
    files: list = field(default_factory=list)
    fingerprints: dict = field(default_factory=dict)
    sample: listing.Listing | None = None
    run: str | None = None
    seconds: float = 0.0
    #: An Iceberg table's data files and rows read (a dataset's are counted from ``files``).
    table_files: int | None = None
    table_rows: int | None = None

    @property
    def rescored(self) -> int:
        """Keys scored again because their row is an error."""
        return int(self.rescore.sum()) if self.rescore is not None else 0

    @property
    def skipped(self) -> int:
        """Listed keys not scored: their row in the output stands."""
        return self.in_output - self.rescored

    def entry(self) -> dict:
        """The summary's and the dry run's ``existing`` entry."""
        return {"keys_in_output": self.in_output, "skipped": self.skipped, "rescored_errors": self.rescored,
                "new_keys": len(self.new) - self.rescored,
                "files_read": len(self.files) if self.table_files is None else self.table_files,
                "rows_read": sum(f.rows for f in self.files) if self.table_rows is None else self.table_rows,
                "seconds": round(self.seconds, 3)}


# ----------------------------------------------------------------------------
# The filter, on Arrow arrays


class KeyFilter:
    """Marks the keys of a sorted key column that some file holds, fed one file's keys at a time.

    ``add`` takes each file's keys (any order, any string type) and
    gathers them in groups of at most :data:`GROUP_KEYS` keys (or one
    file's). Each group is looked up: the listing's keys between the group's
    least and greatest key (two comparisons over the column find that range)
    are searched for among the group's with ``pyarrow.compute.is_in``. A
    group of one run's consecutive files covers only its own range; a run
    whose keys spread over the whole listing costs a pass over it per group.
    """

    def __init__(self, keys: pa.ChunkedArray, group_keys: int = GROUP_KEYS):
        self.keys, self.group_keys = keys, group_keys
        #: One flag per key of ``keys``: some file holds it.
        self.found = np.zeros(len(keys), dtype=bool)
        self._pending: list[pa.Array] = []
        self._rows = 0

    def add(self, file_keys: pa.Array) -> None:
        if not len(file_keys):
            return
        if self._rows + len(file_keys) > self.group_keys:  # a group is at most group_keys, or one file
            self._look_up()
        self._pending.append(file_keys.cast(listing.KEY_TYPE))
        self._rows += len(file_keys)
        if self._rows >= self.group_keys:
            self._look_up()

    def finish(self) -> np.ndarray:
        """The flags, once every file's keys have been added."""
        self._look_up()
        return self.found

    def _look_up(self) -> None:
        if not self._pending:
            return
        values = pa.concat_arrays(self._pending)
        self._pending, self._rows = [], 0
        least, greatest = pc.min_max(values).values()
        start = int(pc.sum(pc.less(self.keys, least)).as_py() or 0)
        stop = len(self.keys) - int(pc.sum(pc.greater(self.keys, greatest)).as_py() or 0)
        if stop <= start:
            return
        hits = pc.is_in(self.keys.slice(start, stop - start), value_set=values)
        self.found[start:stop] |= np.asarray(hits, dtype=bool)
        del values, hits
        pa.default_memory_pool().release_unused()  # the group's and the hash table's pages, before the next group


def select(images: listing.Listing, found: np.ndarray, error_keys: pa.Array | None = None,
           error_owner: np.ndarray | None = None) -> tuple[listing.Listing, np.ndarray | None, np.ndarray | None]:
    """``(keys to score, rescore flags, owners)``: the listed keys not ``found``, and with ``error_keys`` (the
    output's keys whose row is an error, sorted or not) those too, flagged, each with its file (``error_owner``)."""
    if error_keys is None or not len(error_keys):
        return (images.filter(pa.array(~found)) if found.any() else images), None, None
    error_keys = error_keys.cast(listing.KEY_TYPE)
    failed = np.asarray(pc.is_in(images.keys, value_set=error_keys), dtype=bool)
    todo = ~found | failed
    new = images.filter(pa.array(todo))
    rescore = failed[todo]
    where = pc.index_in(new.keys.filter(pa.array(rescore)), value_set=error_keys)
    owner = np.asarray(error_owner)[np.asarray(where)]
    return new, rescore, owner


def in_memory(images: listing.Listing) -> tuple[listing.Listing, listing.Listing | None]:
    """``(images, sample)``: the listing in memory (a spilled one loaded), and its first key alone, which a dry run
    with nothing new scores (``None`` without keys)."""
    if isinstance(images, extsort.SpilledListing):
        images = images.load()
    first = images[0] if len(images) else None
    return images, listing.Listing.build(images.bucket, [first[0]], [first[1]]) if first else None


# ----------------------------------------------------------------------------
# Reading the output's files


def output_filesystem(cfg) -> pafs.S3FileSystem:
    """A pyarrow S3 filesystem for the output: the job's endpoint, region and attempts; the default credentials."""
    options = {"retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=cfg.s3_max_attempts)}
    if cfg.endpoint_url:
        parsed = urllib.parse.urlparse(cfg.endpoint_url)
        options.update(endpoint_override=parsed.netloc or parsed.path, scheme=parsed.scheme or "https",
                       region=cfg.region or "us-east-1")
    else:
        options["region"] = cfg.region or _bucket_region(cfg.output_bucket)
    return pafs.S3FileSystem(**{k: v for k, v in options.items() if v is not None})


def _bucket_region(bucket: str) -> str | None:
    try:
        return pafs.resolve_s3_region(bucket)
    except (OSError, ValueError) as exc:  # no HEAD on the bucket: the SDK's own region chain decides
        log.debug("no region for %s: %s", bucket, exc)
        return None


def read_keys(fs: pafs.FileSystem, bucket: str, files: list[EarlierFile],
              with_errors: bool) -> Iterator[tuple[str, pa.Array, pa.Array | None, str | None]]:
    """``(file key, keys, error rows' keys or None, the file's mxinfer.fingerprint)``, a batch of a file at a time.

    Each file in turn, its ``key`` column (and ``error``) a row group at a time, in batches of
    :data:`BATCH_ROWS`: a HEAD, the file's footer, then its columns' chunks, as ranged GETs. A batch at a time, never a
    whole file's column, and nothing read ahead: at ten million keys in files of 1.8 million, a file's keys
    made whole, or a scanner's read-ahead, were most of the driver's peak over its listing.
    """
    columns = ["key", "error"] if with_errors else ["key"]
    for f in files:
        with fs.open_input_file(f"{bucket}/{f.key}") as handle:  # a HEAD a file: a few per million keys
            parquet = pq.ParquetFile(handle, pre_buffer=False)
            found = (parquet.schema_arrow.metadata or {}).get(b"mxinfer.fingerprint")
            fingerprint = found.decode() if found else None
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=columns, use_threads=False):
                if batch.num_rows:
                    errors = batch.column(0).filter(pc.is_valid(batch.column(1))) if with_errors else None
                    yield f.key, batch.column(0), errors, fingerprint


# ----------------------------------------------------------------------------
# The run's step
