"""Durable progress: the work prefix beside the output, ``--resume``, and the final assembly.

A run never holds its results in the driver. Each executor writes its batch's
results to S3 as soon as it has scored them (``mxjob.partition.score_partition``), under
a *work prefix* that belongs to the output object::

    OUTPUT.parts/job.json                        what every row depends on (the fingerprint)
    OUTPUT.parts/run-0001/run.json               one run's plan: batch size, batch count, keys, app id
    OUTPUT.parts/run-0001/plan.arrows            that run's keys in batch order, a record batch per batch
    OUTPUT.parts/run-0001/part-00000012.arrows.zst  batch 12's results: one record batch sorted by key
                                                    (mxjob.results: an Arrow IPC stream in a zstd frame)

:func:`assemble` merges the runs' parts into the output object (key order,
each key once, one multipart upload that is completed only when whole),
while Spark scores the batches (:class:`LiveRun`, :mod:`mxjob.assembly`) or
after; once every listed key has its row, the work prefix is removed. The merge
reads each part's ``key`` column and nothing else of a row; the output is
written a slice of a part at a time, as JSON Lines or Parquet (views of the
one result model, :mod:`mxjob.results`). A driver that dies before then
leaves the parts; ``--resume`` plans only the keys that have no row yet
(:func:`remaining_keys`) as a new run, and the assembly merges the old
runs' parts with the new one's, so the output is the one an uninterrupted
run would have written.

This module runs on the driver only. It lists and reads S3 through the
client it is given.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import itertools
import json
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import repeat

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import utils
from mxjob import listing, results
from mxjob.partition import part_key
from mxjob.settings import OUTPUT_FORMATS  # noqa: F401 - durable.OUTPUT_FORMATS: the formats it writes
from mxjob.sidecar import side_key

#: The JSON Lines and Parquet output formats; ``.parquet`` keys default to the latter.
#: Rows per Parquet row group: about 5-10 MiB of top-5 predictions, small enough
#: for the driver to hold one while it writes it, large enough for Athena scans.
PARQUET_ROW_GROUP = 100_000
#: ... and at most this many bytes of Arrow data held for one: 100,000 rows of 1,280-value float32
#: embeddings would be 500 MiB of the driver's memory.
PARQUET_ROW_GROUP_BYTES = 64 * 2**20
#: A run's keys in batch order (:func:`listing.write_plan`), beside its ``run.json``.
PLAN_NAME = "plan.arrows"
_RUN = re.compile(r"run-(\d{4,})/(.+)$")
_PART = re.compile(r"part-(\d{8})\.arrows\.zst$")
#: Rows the assembly gathers before writing them out (JSON Lines); Parquet writes a row group at a time.
WRITE_ROWS = 10_000


class ResumeError(Exception):
    """The work prefix and this run do not fit together; the message says what to do."""


def output_format(requested: str | None, key: str) -> str:
    """``requested``, else ``parquet`` for a key ending in ``.parquet``, else ``jsonl``."""
    if requested:
        return requested
    return "parquet" if key.lower().endswith(".parquet") else "jsonl"


def is_gzip(key: str) -> bool:
    """Whether an output key names a gzip file (it ends in ``.gz``): JSON Lines are then written gzipped."""
    return key.lower().endswith(".gz")


def content_type(fmt: str, key: str) -> str:
    """The output object's Content-Type: Parquet, gzip (a ``.gz`` key) or JSON Lines.

    A ``.gz`` object is ``application/gzip`` with no Content-Encoding: with
    ``Content-Encoding: gzip``, S3's and browsers' downloads would hand over
    the decompressed text under the ``.gz`` name, while Athena, Spark and
    pandas choose gzip by the suffix and would fail on it.
    """
    if fmt == "parquet":
        return "application/vnd.apache.parquet"
    return "application/gzip" if is_gzip(key) else "application/x-ndjson"


def fingerprint(settings: dict, files: dict[str, bytes | None]) -> dict:
    """What every line of the output depends on: the settings as given, and files by SHA-256.

    Two runs whose fingerprints are equal write the same row for the same
    image, so their parts may be merged into one output. ``part_format`` is
    the parts' format (:data:`results.FORMAT`): a resume never reads parts of another.
    """
    digests = {name: (hashlib.sha256(data).hexdigest() if data is not None else None)
               for name, data in files.items()}
    return {**{k: _plain(v) for k, v in settings.items()}, **digests, "part_format": results.FORMAT}


def _plain(value):
    """The value as JSON gives it back (tuples as lists), so a fingerprint equals its own round trip."""
    return json.loads(json.dumps(value))


#: The fingerprint's file entries (compared by digest, named as files in messages).
_FILES = ("model_symbol", "model_params", "labels", "handler", "int8_params")


def differences(earlier: dict, now: dict) -> list[str]:
    """One phrase per fingerprint entry that differs, e.g. ``top_k: 3 then, 5 now``."""
    out = []
    for name in sorted(set(earlier) | set(now)):
        before, after = earlier.get(name), now.get(name)
        if before != after:
            if name in _FILES:
                out.append(f"{name} (a different file: sha256 {str(before)[:12]} then, {str(after)[:12]} now)")
            else:
                out.append(f"{name}: {json.dumps(before)} then, {json.dumps(after)} now")
    return out


@dataclass(frozen=True)
class Run:
    """One run recorded under the work prefix: its plan and which of its batches are durable."""

    number: int
    prefix: str
    batch_size: int
    batches: int
    keys: int
    application: str | None
    done: frozenset = field(default_factory=frozenset)
    #: ``(offset, length)`` of each batch in the run's plan; known to the run that wrote it only.
    spans: tuple = ()


@dataclass
class Plan:
    """What this run does: the earlier runs it reuses and the keys it scores (a :class:`listing.Listing`)."""

    runs: list
    todo: listing.Listing
    number: int
    resumed: bool
    #: For a dataset output: its :class:`mxjob.dataset.DatasetPlan`.
    dataset: object = None


class WorkPrefix:
    """The work prefix of one output object: what earlier runs made durable, and the next run's plan."""

    def __init__(self, client, bucket: str, output_key: str):
        self.client, self.bucket, self.output_key = client, bucket, output_key
        self.prefix = side_key(output_key, "parts/")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _objects(self, prefix: str) -> list[tuple[str, int]]:
        return list(utils.list_objects(self.client, self.bucket, prefix))

    def exists(self) -> bool:
        """Whether anything is under the work prefix."""
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        return bool(page.get("KeyCount"))

    def read_job(self) -> dict | None:
        """``job.json`` (the fingerprint the first run recorded), or ``None``."""
        try:
            return json.loads(utils.read_object(self.client, self.bucket, self.prefix + "job.json"))
        except self.client.exceptions.NoSuchKey:
            return None

    def write_job(self, fingerprint_: dict, output_uri: str, dataset: dict | None = None) -> None:
        """Record the fingerprint (and a dataset output's rows per file and key list digest) for resumes."""
        body = {"output": output_uri, "created": time.time(), "fingerprint": fingerprint_}
        if dataset is not None:
            body["dataset"] = dataset
        utils.put_text(self.client, self.bucket, self.prefix + "job.json", json.dumps(body, indent=2) + "\n")

    def runs(self) -> list[Run]:
        """Every recorded run, oldest first, with the batches each made durable."""
        files: dict[int, dict[str, str]] = {}
        for key, _ in self._objects(self.prefix + "run-"):
            match = _RUN.match(key[len(self.prefix):])
            if match:
                files.setdefault(int(match.group(1)), {})[match.group(2)] = key
        runs = []
        for number in sorted(files):
            names = files[number]
            if "run.json" not in names:
                continue  # the driver died while starting this run: it scored nothing
            meta = json.loads(utils.read_object(self.client, self.bucket, names["run.json"]))
            done = frozenset(int(m.group(1)) for m in map(_PART.match, names) if m)
            runs.append(Run(number=number, prefix=self.run_prefix(number), batch_size=meta["batch_size"],
                            batches=meta["batches"], keys=meta["keys"], application=meta.get("application"),
                            done=done))
        return runs

    def run_prefix(self, number: int) -> str:
        return f"{self.prefix}run-{number:04d}/"

    def plan_key(self, run: Run) -> str:
        """The key of ``run``'s plan (its keys in batch order) in the output bucket."""
        return run.prefix + PLAN_NAME

    def run_batches(self, run: Run) -> Iterator[pa.RecordBatch]:
        """The keys (and sizes) of ``run``, one record batch per batch of the run, streamed from its plan."""
        body = self.client.get_object(Bucket=self.bucket, Key=self.plan_key(run))["Body"]
        try:
            yield from listing.read_plan(body)
        finally:
            body.close()

    def run_keys(self, run: Run) -> pa.ChunkedArray:
        """The keys of ``run`` in batch order."""
        return pa.chunked_array([batch.column(0) for batch in self.run_batches(run)], listing.KEY_TYPE)

    def start_run(self, number: int, keys, batch_size: int, application: str | None) -> Run:
        """Record run ``number``'s plan before any of its batches is scored.

        ``keys`` (a :class:`listing.Listing`, or key strings) in batch order
        stream into ``plan.arrows`` (:func:`listing.write_plan`); the returned
        run's ``spans`` say where each batch is in it, for the tasks.
        """
        if not isinstance(keys, listing.Listing):
            keys = list(keys)
            keys = listing.Listing(self.bucket, pa.table({"key": pa.array(keys, listing.KEY_TYPE),
                                                          "size": pa.array([listing.UNKNOWN_SIZE] * len(keys),
                                                                           pa.int64())}))
        prefix = self.run_prefix(number)
        with utils.MultipartWriter(self.client, self.bucket, prefix + PLAN_NAME,
                                   content_type="application/vnd.apache.arrow.stream") as writer:
            spans = listing.write_plan(keys, batch_size, writer.write)
        meta = {"batch_size": batch_size, "batches": len(spans), "keys": len(keys), "application": application,
                "started": time.time()}
        # run.json last: a run without it never started, and resume ignores it.
        utils.put_text(self.client, self.bucket, prefix + "run.json", json.dumps(meta) + "\n")
        return Run(number=number, prefix=prefix, batch_size=batch_size, batches=len(spans), keys=len(keys),
                   application=application, spans=tuple(spans))

    def abort_uploads(self) -> int:
        """Abort the uploads an earlier driver left open (the output's, a plan's); return how many."""
        return utils.abort_uploads(self.client, self.bucket, self.output_key,
                                   lambda key: key == self.output_key or key.startswith(self.prefix))

    def remove(self) -> int:
        """Delete everything under the work prefix; return how many objects were deleted."""
        return utils.delete_objects(self.client, self.bucket, [key for key, _ in self._objects(self.prefix)])


def remaining_keys(work: WorkPrefix, runs: Sequence[Run], keys) -> pa.Array:
    """For each of ``keys`` (a :class:`listing.Listing`, or key strings), whether it still needs scoring.

    A boolean Arrow array: true where no earlier run made the key's line
    durable. Only the durable batches' keys are read, one run's plan at a time.
    """
    column = keys.keys if isinstance(keys, listing.Listing) else pa.array(list(keys), listing.KEY_TYPE)
    done = [chunk for run in runs if run.done for chunk in _done_keys(work, run)]
    if not done:
        return pa.array(np.ones(len(column), dtype=bool))
    scored = pc.is_in(column, value_set=pa.concat_arrays(done))
    return pc.invert(scored.combine_chunks() if isinstance(scored, pa.ChunkedArray) else scored)


def _done_keys(work: WorkPrefix, run: Run) -> list[pa.Array]:
    return [batch.column(0) for index, batch in enumerate(work.run_batches(run)) if index in run.done]


# ----------------------------------------------------------------------------
# Assembly


@dataclass
class AssemblyCounts:
    """What the assembly wrote and from where."""

    predicted: int = 0
    failed: int = 0
    #: Lines whose key is no longer in the job's key list (the input changed between runs).
    dropped: int = 0
    #: Lines of a key that an earlier run had already made durable (kept: the earlier one).
    superseded: int = 0
    parts_read: int = 0
    bytes_read: int = 0
    #: A dataset output's files (:func:`mxjob.dataset.summary_of`), for the summary.
    dataset: dict | None = None
    #: Seconds the sink's close took: the last upload's end (last part, CompleteMultipartUpload).
    close_seconds: float = 0.0


class AssemblyCancelled(Exception):
    """The Spark job failed or was interrupted: the assembly that followed it stops, and writes nothing."""


class LiveRun:
    """Which batches of the run Spark is scoring are durable, for the assembly that follows the run.

    The assembly merges batch ``i``'s part as soon as its task has written it:
    the run's parts are listed from the first one the assembly still lacks
    (``StartAfter``), at most every ``poll_seconds``, so a listing returns
    only the parts written since, and those that finished ahead of it. Once
    the merge waits for one of the run's last batches (:meth:`tail_batches`),
    it lists every ``tail_poll_seconds`` instead: the last part is merged
    soon after it is written, at the cost of a few more small listings. The
    driver calls :meth:`finish` once the Spark job has succeeded (every batch
    is durable then) and :meth:`cancel` if it failed or was interrupted. One
    thread (the assembly's) asks; any thread may finish or cancel.
    """

    def __init__(self, work: WorkPrefix, run: Run, poll_seconds: float = 0.5, tail_poll_seconds: float = 0.05):
        self.work, self.run = work, run
        self.poll_seconds, self.tail_poll_seconds = poll_seconds, tail_poll_seconds
        self.done: set[int] = set()
        #: Listings made (a merge that followed the run listed more than once).
        self.listings = 0
        #: Parts of the run the merge has read; at :meth:`finish`, those it had yet to read (the tail's work).
        self.merged, self.left_at_finish = 0, None
        self._finished = self._cancelled = False
        self._wake = threading.Event()
        self._listed = float("-inf")

    @property
    def tail_batches(self) -> int:
        """The run's last batches, which the merge waits for polling every ``tail_poll_seconds``: 1% of them, at
        least 8 (about the last wave of tasks on a cluster of up to a hundred cores per 10,000 batches)."""
        return max(8, self.run.batches // 100)

    def finish(self) -> None:
        """The Spark job succeeded: every batch is durable, so a part still missing is an error, not a wait."""
        self.left_at_finish = self.run.batches - self.merged
        self._finished = True
        self._wake.set()

    def cancel(self) -> None:
        """The Spark job failed or was interrupted: the assembly raises :class:`AssemblyCancelled`."""
        self._cancelled = True
        self._wake.set()

    def ready(self, index: int, wait: bool = False) -> bool:
        """Whether batch ``index``'s part is durable; with ``wait``, wait until it is (or raise).

        Without ``wait`` it lists again only if the last listing is
        ``poll_seconds`` old. Raises :class:`AssemblyCancelled` after
        :meth:`cancel`, and :class:`ResumeError` if the job finished without
        the part.
        """
        self._stop_if_cancelled()  # before every part, so that a cancel stops a merge that has all it needs
        if index in self.done:
            return True
        if not wait:
            if time.monotonic() - self._listed >= self.poll_seconds:
                self._list(index)
            return index in self.done
        while True:
            finished = self._finished  # read before the listing: a part listed after it was set is not missed
            self._list(index)
            if index in self.done:
                return True
            if finished:
                raise ResumeError(f"the Spark job finished, but batch {index} has no part under "
                                  f"s3://{self.work.bucket}/{self.run.prefix}")
            tail = index >= self.run.batches - self.tail_batches
            self._wake.wait(self.tail_poll_seconds if tail else self.poll_seconds)
            self._wake.clear()
            self._stop_if_cancelled()

    def _stop_if_cancelled(self) -> None:
        if self._cancelled:
            raise AssemblyCancelled(f"the assembly of {self.run.prefix} stopped: the Spark job did not finish")

    def _list(self, frontier: int) -> None:
        """Add the parts listed from batch ``frontier`` on (every earlier one is known durable)."""
        after = part_key(self.run.prefix, frontier - 1) if frontier else None
        for key, _ in utils.list_objects(self.work.client, self.work.bucket, self.run.prefix + "part-", after):
            match = _PART.search(key)
            if match:
                self.done.add(int(match.group(1)))
        self._listed = time.monotonic()
        self.listings += 1


def _run_parts(work: WorkPrefix, run: Run, pool: ThreadPoolExecutor, window: int,
               counts: AssemblyCounts, reader=None, live: LiveRun | None = None) -> Iterator[pa.RecordBatch]:
    """The record batch of every durable part of ``run``, in batch order (so in key order), ``window`` read ahead.

    With ``live`` (the run Spark is scoring now), every batch of the run, each
    as soon as it is durable: the window fills with the parts already
    written, and the stream waits only when it has nothing else to give.
    """
    def fetch(index: int) -> bytes:
        key = part_key(run.prefix, index)
        if reader is not None:
            return reader.read(work.bucket, key)
        return utils.read_object(work.client, work.bucket, key)

    pending: deque = deque()
    indices = iter(range(run.batches) if live is not None else sorted(run.done))
    upcoming = next(indices, None)
    while upcoming is not None or pending:
        while upcoming is not None and len(pending) < window and (
                live is None or live.ready(upcoming, wait=not pending)):
            pending.append(pool.submit(fetch, upcoming))
            upcoming = next(indices, None)
        data = pending.popleft().result()
        counts.parts_read += 1
        if live is not None:
            live.merged += 1
        counts.bytes_read += len(data)
        yield results.read_part(data)


def _run_rows(parts: Iterator[pa.RecordBatch]) -> Iterator[tuple[str, int, pa.RecordBatch]]:
    """``(key, row, batch)`` of every row of ``parts``: the key column is all the merge reads."""
    for batch in parts:
        yield from zip(batch.column("key").to_pylist(), range(batch.num_rows), repeat(batch))


class _Selection:
    """The rows the merge keeps, as slices of the parts they are in, written out ``WRITE_ROWS`` at a time."""

    def __init__(self, sink, counts: AssemblyCounts, carried: pa.Table | None = None):
        self.sink, self.counts = sink, counts
        #: Columns carried to every row, one row per key in key order: row ``i`` kept is key ``i``.
        self.carried, self.written = carried, 0
        self.schema: pa.Schema | None = None
        self.pieces: list[list] = []  # [batch, start, stop]
        self.last: list | None = None
        self.rows = 0

    def keep(self, batch: pa.RecordBatch, row: int) -> None:
        last = self.last
        if last is not None and last[0] is batch and last[2] == row:
            last[2] += 1  # the common case: the next row of the same part
        else:
            self._start(batch, row)
        self.rows += 1
        if self.rows >= WRITE_ROWS:
            self.flush()

    def keep_rows(self, batch: pa.RecordBatch, start: int, stop: int) -> None:
        """Keep rows ``start`` to ``stop - 1`` of ``batch`` (a whole part, in the common case) as one slice."""
        self._start(batch, start)
        self.last[2] = stop
        self.rows += stop - start
        if self.rows >= WRITE_ROWS:
            self.flush()

    def _start(self, batch: pa.RecordBatch, row: int) -> None:
        """A new slice, at ``row`` of ``batch``; every part must hold the same columns."""
        if self.schema is None:
            self.schema = batch.schema
        elif batch.schema is not self.schema and batch.schema != self.schema:
            raise ResumeError("the parts hold results of different shapes (task, columns or vector length); "
                              "start again with --overwrite")
        self.last = [batch, row, row + 1]
        self.pieces.append(self.last)

    def flush(self) -> None:
        if not self.pieces:
            return
        slices = []
        for batch, start, stop in self.pieces:
            piece = batch.slice(start, stop - start)
            # The merge keeps exactly one row per key of the listing, in its order: the carried
            # columns' rows for these slices are the next ones, no lookup by key needed.
            carried = None if self.carried is None else self.carried.slice(self.written, piece.num_rows)
            slices.append(results.carry(piece, carried))  # also takes a part's OBJECT_METADATA out
            self.written += piece.num_rows
        for piece in slices:
            failed = piece.num_rows - piece.column("error").null_count
            self.counts.failed += failed
            self.counts.predicted += piece.num_rows - failed
        self.sink.write(slices)
        self.pieces, self.last, self.rows = [], None, 0


def assemble(work: WorkPrefix, runs: Sequence[Run], keys, sink, threads: int = 16,
             reader: utils.ObjectReader | None = None, carried: pa.Table | None = None,
             live: LiveRun | None = None) -> AssemblyCounts:
    """Merge the runs' durable rows into ``sink`` in key order, exactly one row per key of ``keys``.

    ``keys`` is this job's sorted key list (a :class:`listing.Listing`, or key
    strings), read a chunk at a time. Each run's parts, read in batch
    order, are sorted by key (its plan was), so a heap merge of the runs'
    ``key`` columns gives every row in key order while holding only a window
    of parts per run; the rows kept go to ``sink.write`` as slices of their
    parts (:class:`_Selection`), never as Python objects. A key of ``keys``
    without a row raises ``ResumeError``: nothing is written then (the
    caller aborts the sink). A key that two runs scored gets the earlier
    run's row only (``heapq.merge`` is stable). With ``reader`` (a
    :class:`utils.ObjectReader`) the parts are read through it: one GET a
    batch, about half botocore's CPU each, which is most of the driver's CPU
    here at ten million keys. ``carried`` (columns aligned with ``keys``, a
    row per key) is appended to each row (:func:`results.carry`): the
    manifest's carried columns, the objects' etag and size.

    With ``live`` (a :class:`LiveRun` of one of ``runs``), that run is the one
    Spark is scoring: the merge follows it as its batches become durable,
    so the sink receives rows while the job runs, and what is left when the
    job ends is the tail.
    """
    counts = AssemblyCounts()
    with ThreadPoolExecutor(threads, thread_name_prefix="assemble") as pool:
        window = max(2, threads // max(1, len(runs)))

        def follow(run: Run) -> LiveRun | None:
            return live if live is not None and run.number == live.run.number else None

        parts = [_run_parts(work, run, pool, window, counts, reader, follow(run))
                 for run in runs if run.done or follow(run)]
        selection = _Selection(sink, counts, carried)
        position = 0
        if len(parts) == 1:  # one run (no resume): its parts are in key order already
            parts, position = _whole_parts(parts[0], key_column(keys), selection)
        streams = [_run_rows(p) for p in parts]
        merged = (streams[0] if len(streams) == 1 else
                  heapq.merge(*streams, key=lambda item: item[0]) if streams else iter(()))
        expected = iter_keys(keys, position)
        want = next(expected, None)
        last = None
        for key, row, batch in merged:
            if key == last:
                # Two runs scored this key (a late task of an earlier run wrote its part after the
                # resume planned): both rows come from the same fingerprint; the earlier run's is kept.
                counts.superseded += 1
                continue
            if want is not None and want < key:
                raise ResumeError(f"no line for key {want!r} under {work.uri}")
            if want == key:
                position += 1
                last = key
                want = next(expected, None)
                selection.keep(batch, row)
            else:
                counts.dropped += 1
        if want is not None:
            raise ResumeError(f"no line for key {want!r} under {work.uri} "
                              f"({len(keys) - position} keys without a line)")
        selection.flush()
    return counts


# ----------------------------------------------------------------------------
# Output formats


#: zlib's level for a ``.gz`` JSON Lines output: gzip's own. Measured on one core here: top-5 classify lines
#: shrink to 13% at about 120 MB/s (level 9: 28 MB/s for 1% less), 1,280-value embeddings to 40% at about
#: 16 MB/s, which is why Parquet is the output for vectors. zlib lets go of the GIL while it compresses.
GZIP_LEVEL = 6


class JsonLinesSink:
    """The output as JSON Lines: each row's line (:func:`results.json_lines`).

    With ``gzip`` (an output key ending in ``.gz``), the lines are one gzip
    member, compressed as they are written: the object is what ``gzip`` makes
    of the text a plain ``.jsonl`` output holds.
    """

    def __init__(self, writer: utils.MultipartWriter, gzip: bool = False):
        self.writer = writer
        # wbits 16 + 15: a gzip header and trailer around the deflate stream (zlib's default window).
        self._deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if gzip else None

    def write(self, batches: list[pa.RecordBatch]) -> None:
        """Rows of the result model, as their lines."""
        self.write_lines([line for batch in batches for line in results.json_lines(batch)])

    def write_lines(self, lines: list[str]) -> None:
        self._write("".join(line + "\n" for line in lines).encode("utf-8"))

    def _write(self, data: bytes) -> None:
        self.writer.write(self._deflate.compress(data) if self._deflate is not None else data)

    def close(self) -> None:
        if self._deflate is not None:
            self.writer.write(self._deflate.flush())  # the member's last block and its CRC-32 and length
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


#: The Parquet output's error column (the result model's, :data:`results.ERROR`).
ERROR = results.ERROR


def provenance(job: dict | None) -> dict[str, str]:
    """The Parquet file's key-value metadata from ``job.json``: the run's fingerprint, and its task.

    The fingerprint holds the model files' SHA-256, the task and its settings
    (output layer, ...), the preprocessing recipe and the precision.
    """
    if not job:
        return {}
    fingerprint_ = job.get("fingerprint") or {}
    return {"mxinfer.fingerprint": json.dumps(fingerprint_, sort_keys=True),
            "mxinfer.task": str(fingerprint_.get("task", "classify"))}


class ParquetSink:
    """The output as Parquet, one row per key, written row group by row group.

    The schema is the parts' (:func:`results.parquet_schema`), known from
    the first rows written; ``metadata`` (:func:`provenance`) goes to the
    file's key-value metadata.
    """

    def __init__(self, writer: utils.MultipartWriter, metadata: dict[str, str] | None = None):
        self.writer, self.metadata = writer, metadata
        self.schema: pa.Schema | None = None
        self._file = _WriterFile(writer)
        self._parquet: pq.ParquetWriter | None = None
        self._pending: list[pa.RecordBatch] = []
        self._rows = self._bytes = 0

    def write(self, batches: list[pa.RecordBatch]) -> None:
        for batch in batches:
            if self.schema is None:
                self.schema = results.parquet_schema(batch.schema, self.metadata)
                self._parquet = pq.ParquetWriter(self._file, self.schema, compression="zstd")
            converted = results.parquet_batch(batch, self.schema)
            self._pending.append(converted)
            self._rows += converted.num_rows
            self._bytes += converted.nbytes
        if self._rows >= PARQUET_ROW_GROUP or self._bytes >= PARQUET_ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending, self.schema).combine_chunks()
        self._parquet.write_table(table, row_group_size=PARQUET_ROW_GROUP)
        self._pending, self._rows, self._bytes = [], 0, 0

    def close(self) -> None:
        self._flush()
        if self._parquet is None:  # no row at all: an empty file of the classify columns
            self.schema = results.parquet_schema(results.schema("classify"), self.metadata)
            self._parquet = pq.ParquetWriter(self._file, self.schema, compression="zstd")
        self._parquet.close()
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


class _WriterFile(io.RawIOBase):
    """A write-only file over a :class:`utils.MultipartWriter`, for ``pq.ParquetWriter``."""

    def __init__(self, writer: utils.MultipartWriter):
        super().__init__()
        self.writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.writer.write(bytes(data))
        return len(data)

    def tell(self) -> int:
        return self.writer.bytes_written

    def close(self) -> None:  # the sink completes the upload; pyarrow only closes its side
        super().close()


def iter_keys(items, start: int = 0) -> Iterator[str]:
    """The keys of a :class:`listing.Listing` (from its Arrow column, a chunk at a time), or of key strings.

    From the ``start``-th key on.
    """
    if isinstance(items, listing.Listing):
        column = items.keys
        for first in range(start, len(column), 65_536):
            yield from column.slice(first, 65_536).to_pylist()
    else:
        yield from itertools.islice(items, start, None)


def key_column(items) -> pa.ChunkedArray:
    """The keys of a :class:`listing.Listing`, or of key strings, as one Arrow column."""
    if isinstance(items, listing.Listing):
        return items.keys
    return pa.chunked_array([pa.array(list(items), listing.KEY_TYPE)], listing.KEY_TYPE)


def _whole_parts(parts: Iterator[pa.RecordBatch], column: pa.ChunkedArray,
                 selection: _Selection) -> tuple[list, int]:
    """Keep each part whole while its keys are exactly the listing's next ones; ``(the rest, keys kept)``.

    A run's parts usually are: then the merge costs no Python per row, only
    an Arrow comparison per part. That matters twice on the driver: at ten
    million keys the per-row merge was most of its 32 s of assembly CPU, and
    while the job runs the assembly's thread shares the GIL with the
    acknowledgements Spark's scheduler waits for on every task's
    accumulator update. The first part that differs (a key no longer listed,
    one missing) and every part after it go through the merge row by row.
    """
    position = 0
    for batch in parts:
        if not _next_keys(batch, column, position):
            return [itertools.chain([batch], parts)], position
        selection.keep_rows(batch, 0, batch.num_rows)
        position += batch.num_rows
    return [], position


def _next_keys(batch: pa.RecordBatch, column: pa.ChunkedArray, position: int) -> bool:
    """Whether ``batch``'s keys are ``column``'s from ``position`` on, in order."""
    rows = batch.num_rows
    if position + rows > len(column):
        return False
    expected = column.slice(position, rows).combine_chunks()
    return batch.column("key").cast(expected.type).equals(expected)
