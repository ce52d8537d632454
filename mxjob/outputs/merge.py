"""The merge: every run's durable parts, in key order and each key once, into an output sink.

:func:`assemble` reads only each part's ``key`` column to choose the rows
(a k-way merge over the runs' sorted parts), then writes the chosen rows a
slice of a part at a time into an output's sink (:meth:`mxjob.outputs.Output.sink`). With a
:class:`LiveRun` it follows a run's batches while Spark makes them durable
(:mod:`mxjob.outputs.assembly` holds the thread), so the output's tail is all that is
left when the Spark job ends. Runs on the driver only.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import repeat

import pyarrow as pa

from mxjob.executor.partition import part_key
from mxjob.inputs import listing
from mxjob.outputs.work_prefix import PART_PATTERN, ResumeError, Run, WorkPrefix
from mxjob.results import part_format
from mxjob.s3 import object_reader, parallel_list, reads

#: Rows the assembly gathers before writing them out (JSON Lines); Parquet writes a row group at a time.
WRITE_ROWS = 10_000
#: Parts the assembly reads at once, shared among the runs it merges (each run keeps at least two in flight),
#: so that the merge seldom waits for a GET.
READ_THREADS = 16
#: Seconds the live merge waits for one batch, once tasks have begun to end, before it lists the run's parts
#: in case that batch's notice was lost (:class:`LiveRun`).
HEARTBEAT_SECONDS = 5.0
#: The longest the live merge goes between such listings while it waits (each one that finds nothing new doubles it).
MAX_HEARTBEAT_SECONDS = 60.0


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
    #: The output's entry in the summary (:meth:`mxjob.outputs.Output.summary_entry`: a dataset's files, a table's
    #: commits), under its ``summary_field``.
    entry: dict | None = None
    #: Seconds the sink's close took: the last upload's end (last part, CompleteMultipartUpload).
    close_seconds: float = 0.0


class AssemblyCancelled(Exception):
    """The Spark job failed or was interrupted: the assembly that followed it stops, and writes nothing."""


class LiveRun:
    """Which batches of the run Spark is scoring are durable, for the assembly that follows the run.

    The merge is told, not left to look: a task writes its part before its
    stats leave the executor, and when the driver's accumulator server
    applies them (:class:`mxjob.executor.stats.StatsAccumulator`) it hands the task's
    batch to :meth:`durable` (through :data:`mxjob.core.state.durable_batches`,
    keyed by :attr:`key`), so the merge reads exactly the parts it is told
    about, with no listing. Listing the run's parts is the fallback for a
    notice that never came (Spark logs and drops an accumulator update it
    fails to apply): once notices come, the merge lists after waiting
    ``heartbeat_seconds`` for one batch, then half as often after each
    listing that found only parts it had been told about, down to once every
    :data:`MAX_HEARTBEAT_SECONDS`; and once the job has finished, for a batch
    no notice named, before calling it missing. The driver calls
    :meth:`finish` once the Spark job has succeeded (every batch is durable,
    and every notice applied, then) and :meth:`cancel` if it failed or was
    interrupted. One thread (the assembly's) asks; any thread may tell,
    finish or cancel.
    """

    def __init__(self, work: WorkPrefix, run: Run, heartbeat_seconds: float = HEARTBEAT_SECONDS):
        self.work, self.run = work, run
        self.heartbeat_seconds = heartbeat_seconds
        self.done: set[int] = set()
        #: Listings of the run's parts made: none when every notice came before the merge needed its batch.
        self.listings = 0
        #: Batches the tasks' stats announced, and those only a listing found (their notice never came).
        self.notices, self.found_by_listing = 0, 0
        #: Parts of the run the merge has read; at :meth:`finish`, those it had yet to read (the tail's work).
        self.merged, self.left_at_finish = 0, None
        self._finished = self._cancelled = False
        self._changed = threading.Condition()
        self._interval = heartbeat_seconds
        self._listed = float("-inf")

    @property
    def key(self) -> tuple[str, str]:
        """The run as its tasks' stats name it (``StatsAccumulator.run``): its bucket and parts prefix."""
        return self.work.bucket, self.run.prefix

    def durable(self, batches: Iterable[int]) -> None:
        """Tasks of these batches have ended with their parts written: the merge may read them."""
        with self._changed:
            before = len(self.done)
            self.done.update(batches)
            self.notices += len(self.done) - before
            self._changed.notify_all()

    def finish(self) -> None:
        """The Spark job succeeded: every batch is durable, so a part still missing is an error, not a wait."""
        with self._changed:
            self.left_at_finish = self.run.batches - self.merged
            self._finished = True
            self._changed.notify_all()

    def cancel(self) -> None:
        """The Spark job failed or was interrupted: the assembly raises :class:`AssemblyCancelled`."""
        with self._changed:
            self._cancelled = True
            self._changed.notify_all()

    def ready(self, index: int, wait: bool = False) -> bool:
        """Whether batch ``index``'s part is durable; with ``wait``, wait until it is (or raise).

        Without ``wait`` it never lists. Raises :class:`AssemblyCancelled`
        after :meth:`cancel`, and :class:`ResumeError` if the job finished
        without the part.
        """
        waiting_since = time.monotonic()
        while True:
            with self._changed:
                # Before every part, so that a cancel stops a merge that has all it needs.
                if self._cancelled:
                    raise AssemblyCancelled(f"the assembly of {self.run.prefix} stopped: the Spark job did not finish")
                if index in self.done:
                    return True
                if not wait:
                    return False
                finished = self._finished  # read before the listing: a part listed after it was set is not missed
                if not finished:
                    # No heartbeat before the first notice: until a task has ended, there is no part to find.
                    due = max(waiting_since, self._listed) + self._interval - time.monotonic()
                    if not self.notices or due > 0:
                        self._changed.wait(due if self.notices else None)
                        continue
            self._list(index)
            if index in self.done:
                return True
            if finished:
                raise ResumeError(f"the Spark job finished, but batch {index} has no part under "
                                  f"s3://{self.work.bucket}/{self.run.prefix}")

    def _list(self, frontier: int) -> None:
        """Add the parts listed from batch ``frontier`` on (every earlier one is known durable)."""
        after = part_key(self.run.prefix, frontier - 1) if frontier else None
        listed = set()
        for key, _ in parallel_list.list_objects(self.work.client, self.work.bucket, self.run.prefix + "part-", after):
            match = PART_PATTERN.search(key)
            if match:
                listed.add(int(match.group(1)))
        with self._changed:
            unannounced = len(listed - self.done)
            self.done.update(listed)
            self.found_by_listing += unannounced
            self.listings += 1
            self._listed = time.monotonic()
            # A part no notice named: notices are being lost, so the next look comes soon; else later and later.
            self._interval = (self.heartbeat_seconds if unannounced
                              else min(2 * self._interval, max(self.heartbeat_seconds, MAX_HEARTBEAT_SECONDS)))


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
        return reads.read_object(work.client, work.bucket, key)

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
        yield part_format.read_part(data)


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
        #: A sink that commits on a clock (an Iceberg table's) says when it wants the rows held so far.
        self.due = getattr(sink, "due", None)

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
        if self.rows >= WRITE_ROWS or (self.due is not None and self.due()):
            self.flush()  # a whole part: what a commit that is due takes

    def _start(self, batch: pa.RecordBatch, row: int) -> None:
        """A new slice, at ``row`` of ``batch``; every part must hold the same columns.

        A sink's commit that is due takes the rows held so far when the merge
        moves on to another part: at part boundaries, never a row at a time.
        """
        if self.due is not None and self.last is not None and self.last[0] is not batch and self.due():
            self.flush()
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
            slices.append(part_format.carry(piece, carried))  # also takes a part's OBJECT_METADATA out
            self.written += piece.num_rows
            failed = piece.num_rows - piece.column("error").null_count
            self.counts.failed += failed
            self.counts.predicted += piece.num_rows - failed
        self.sink.write(slices)
        self.pieces, self.last, self.rows = [], None, 0


def assemble(work: WorkPrefix, runs: Sequence[Run], keys, sink, reader: object_reader.ObjectReader | None = None,
             carried: pa.Table | None = None, live: LiveRun | None = None) -> AssemblyCounts:
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
    :class:`object_reader.ObjectReader`) the parts are read through it: one GET a
    batch, about half botocore's CPU each, which is most of the driver's CPU
    here at ten million keys. ``carried`` (columns aligned with ``keys``, a
    row per key) is appended to each row (:func:`part_format.carry`): the
    manifest's carried columns, the objects' etag and size.

    With ``live`` (a :class:`LiveRun` of one of ``runs``), that run is the one
    Spark is scoring: the merge follows it as its batches become durable,
    so the sink receives rows while the job runs, and what is left when the
    job ends is the tail.
    """
    counts = AssemblyCounts()
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="assemble") as pool:
        window = max(2, READ_THREADS // max(1, len(runs)))

        def follow(run: Run) -> LiveRun | None:
            return live if live is not None and run.number == live.run.number else None

        parts = [_run_parts(work, run, pool, window, counts, reader, follow(run))
                 for run in runs if run.done or follow(run)]
        selection = _Selection(sink, counts, carried)
        position = 0
        if len(parts) == 1:  # one run (no resume): its parts are in key order already
            parts, position = _whole_parts(parts[0], key_column(keys), selection)
        streams = [_run_rows(p) for p in parts]
        merged = heapq.merge(*streams, key=lambda item: item[0])
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
            raise ResumeError(f"no line for key {want!r} under {work.uri} ({len(keys) - position} keys without a line)")
        selection.flush()
    return counts


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
