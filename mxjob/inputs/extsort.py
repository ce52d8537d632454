"""Keys that do not fit in the driver's memory: sorted runs spilled to local disk, merged in key order.

Driver-only. A manifest of a hundred million keys takes about 5 GB once held
in Arrow and twice that while it is sorted. :class:`KeySorter` gathers the
keys as the manifest reader makes them; each time :data:`SPILL_BYTES` of
them are gathered it filters them (:func:`listing.keep_images`, the same
rule as :meth:`listing.Listing.build`), sorts and de-duplicates them
(:func:`listing.sorted_unique`) and writes them as a sorted *run* to a local
temporary file (Arrow IPC, zstd). :meth:`KeySorter.merge` then reads every
run a few thousand rows at a time and merges them in key order (see
:func:`merge_runs`), so memory holds one run being gathered or a window of
each run, never every key.

The merged keys go either into memory (a :class:`listing.Listing`, one copy
of the keys and never the sort's two) or into one more local file, a
:class:`SpilledListing`, which the dry run reads batch by batch to plan.
Either way the keys, their order and the plan written from them are the
ones :meth:`listing.Listing.build` gives for the same input.
"""

from __future__ import annotations

import bisect
import logging
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.inputs.batch_list import rebatch
from mxjob.inputs.listing import KEY_TYPE, UNKNOWN_SIZE, Listing, Skipped, keep_images, sorted_unique

log = logging.getLogger(__name__)

#: Arrow bytes of keys and sizes gathered before they are sorted and spilled as a run. Sorting a
#: run holds it about twice plus 8 bytes a key, so this bounds the reading's peak at about 300 MiB,
#: and a hundred million keys of 45 characters (61 bytes a key held) make about 50 runs.
SPILL_BYTES = 128 << 20
#: Rows of each run read at a time during the merge: 50 runs hold about 50 MiB between them.
MERGE_ROWS = 16_384
#: Rows per record batch of a :class:`SpilledListing`'s file: a key looked up decompresses one.
SPILLED_ROWS = 65_536
#: The environment variable naming where runs are spilled (else ``TMPDIR``, as :mod:`tempfile` reads it).
SPILL_DIR_ENV = "MXINFER_SPILL_DIR"
_SCHEMA = pa.schema([("key", KEY_TYPE), ("size", pa.int64())])
_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


@dataclass(frozen=True)
class Spill:
    """How keys too many to sort in memory are sorted out of core, and where the merged keys go.

    Attributes
    ----------
    run_bytes : int, optional
        Arrow bytes of keys gathered before a run is sorted and spilled:
        :data:`SPILL_BYTES` (read when used) by default.
    directory : str, optional
        Where runs are spilled: :func:`spill_dir` by default.
    in_memory : bool
        Whether keys sorted out of core are loaded into memory (one copy) or
        left in a local file (a :class:`SpilledListing`, for the dry run's plan).
    """

    run_bytes: int | None = None
    directory: str | None = None
    in_memory: bool = True


def spill_dir() -> str:
    """Where runs are spilled: ``$MXINFER_SPILL_DIR``, else the temporary directory (``$TMPDIR``, ``/tmp``)."""
    return os.environ.get(SPILL_DIR_ENV) or tempfile.gettempdir()


class KeySorter:
    """Gathers raw keys and sizes; spills them as sorted runs once they outgrow ``spill_bytes``.

    Until the first spill nothing is sorted: :meth:`columns` hands the keys
    back as read, for the in-memory :meth:`listing.Listing.build`. Once it
    has spilled, :meth:`merge`, :meth:`listing` or :meth:`spilled_listing`
    give the sorted, unique, filtered keys.

    Parameters
    ----------
    prefix, suffixes
        The filter (:func:`listing.keep_images`), applied to each run before it is spilled.
    spill_bytes : int
        Arrow bytes gathered before a run is sorted and spilled.
    directory : str, optional
        Where the runs' folder is made; :func:`spill_dir` by default.
    """

    def __init__(self, *, prefix: str = "", suffixes: Iterable[str] | None = None,
                 spill_bytes: int = SPILL_BYTES, directory: str | None = None):
        self.prefix, self.suffixes = prefix, None if suffixes is None else list(suffixes)
        self.spill_bytes, self.directory = spill_bytes, directory
        self._runs: list[str] = []
        self._folder: str | None = None
        self._cleanup = None
        self.reset()  # the keys gathered, their count, carried columns and what the filter skipped: none yet

    @property
    def spilled(self) -> bool:
        """Whether any run went to disk (then the keys are merged, not sorted in memory)."""
        return bool(self._runs)

    def add(self, keys: pa.Array, sizes: pa.Array, carried: dict | None = None) -> None:
        """Gather one chunk of keys (``large_string``) and their sizes (``int64``, null when unknown).

        ``carried``: the manifest's other columns for these keys, ``{name: string array}``, the
        same names in every chunk.
        """
        if carried:
            self.carried = list(carried)
        table = pa.table({"key": keys, "size": sizes, **(carried or {})}, schema=self._schema() if carried else _SCHEMA)
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        self.rows += table.num_rows
        if self._pending_bytes >= self.spill_bytes:
            self._spill()

    def columns(self) -> tuple[pa.ChunkedArray, ...]:
        """The gathered keys and sizes as read (nothing spilled yet), then each of :attr:`carried`; let go of here."""
        if self.spilled:
            raise RuntimeError("the keys were spilled: merge them instead")
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        return tuple(pa.chunked_array([c for t in pending for c in t[f.name].chunks], f.type) for f in self._schema())

    def reset(self) -> None:
        """Forget every key gathered or spilled (a manifest read again from its start)."""
        self._pending, self._pending_bytes, self.rows = [], 0, 0
        #: Names of the manifest's carried columns (strings, beside each key): they follow their keys through
        #: the runs and the merge, as through the in-memory sort.
        self.carried: list[str] = []
        #: What the filter dropped, by reason, across every run (the manifest's report).
        self.skipped = Skipped(self.prefix, self.suffixes)
        for path in self._runs:
            os.remove(path)
        self._runs = []

    def close(self) -> None:
        """Remove the runs' folder."""
        self.reset()
        if self._cleanup is not None:
            self._cleanup()
        self._folder = self._cleanup = None

    def _spill(self) -> None:
        if not self._pending:
            return
        table = pa.concat_tables(self._pending)
        self._pending, self._pending_bytes = [], 0
        table = table.set_column(1, "size", pc.fill_null(table["size"], UNKNOWN_SIZE))
        table = keep_images(table, prefix=self.prefix, suffixes=self.suffixes, skipped=self.skipped)
        holder = [table]
        del table  # sorted_unique lets go of each copy it replaces
        table = sorted_unique(holder)
        path = os.path.join(self._runs_folder(), f"run-{len(self._runs):05d}.arrows")
        # The carried columns, if any, are in the run beside their keys: the merge keeps each key's row whole.
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema, options=_OPTIONS) as writer:
            writer.write_table(table, max_chunksize=MERGE_ROWS)
        self._runs.append(path)
        log.debug("spilled run %d: %d keys to %s", len(self._runs), table.num_rows, path)
        del table
        pa.default_memory_pool().release_unused()

    def _runs_folder(self) -> str:
        if self._folder is None:
            self._folder = tempfile.mkdtemp(prefix="mxinfer-keys-", dir=self.directory or spill_dir())
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)
        return self._folder

    def merge(self, limit: int | None = None) -> Iterator[pa.Table]:
        """The sorted, unique, filtered keys as tables in key order, at most ``limit`` rows; spills what is left."""
        self._spill()
        log.info("merging %d sorted runs of %d keys in all (spilled under %s)", len(self._runs), self.rows,
                 self._folder)
        yield from _limited(merge_runs(self._runs), limit)

    def listing(self, bucket: str, limit: int | None = None) -> Listing:
        """The merged keys held in memory: one copy of them (the runs are removed)."""
        try:
            tables = list(self.merge(limit))
        finally:
            self.close()
        table = pa.concat_tables(tables) if tables else self._schema().empty_table()
        del tables
        pa.default_memory_pool().release_unused()
        return Listing(bucket, table)

    def _schema(self) -> pa.Schema:
        return pa.schema([*_SCHEMA, *(pa.field(name, pa.string()) for name in self.carried)])

    def spilled_listing(self, bucket: str, limit: int | None = None) -> SpilledListing:
        """The merged keys in one more local file, read a batch at a time (the runs are removed).

        The file holds keys and sizes only: the dry run that reads it plans, and never joins the
        carried columns; their names stay on the listing (:attr:`SpilledListing.carried`).
        """
        carried = list(self.carried)
        try:
            folder = self._runs_folder()
            tables = (table.select(["key", "size"]) for table in self.merge(limit))
            spilled = SpilledListing.write(bucket, os.path.join(folder, "sorted.arrow"), tables, folder)
            spilled.carried = carried
        except BaseException:
            self.close()
            raise
        self.reset()
        self._cleanup.detach()  # the folder is the listing's now: removed when it goes
        self._folder = self._cleanup = None
        return spilled


def _limited(tables: Iterator[pa.Table], limit: int | None) -> Iterator[pa.Table]:
    left = limit
    for table in tables:
        if left is not None and table.num_rows >= left:
            if left:
                yield table.slice(0, left)
            return
        if left is not None:
            left -= table.num_rows
        yield table


class _Run:
    """One sorted run being merged: its open file and the window of rows read and not yet merged."""

    def __init__(self, path: str):
        self.file = pa.OSFile(path)  # read, not memory-mapped: mapped pages would count in the RSS
        self.reader = pa.ipc.open_stream(self.file)
        self.window: pa.RecordBatch | None = None

    def fill(self) -> bool:
        """Read the next window if this one is used up; False once the run is done (its file is closed)."""
        while self.window is None or not self.window.num_rows:
            try:
                self.window = self.reader.read_next_batch()
            except StopIteration:
                self.file.close()
                return False
        return True

    @property
    def last(self) -> str:
        return self.window.column(0)[-1].as_py()

    def take_through(self, frontier: str) -> pa.RecordBatch | None:
        """Cut off the window's rows whose key is at most ``frontier``: they are sorted, so a bisection finds them."""
        column = self.window.column(0)
        if column[0].as_py() > frontier:
            return None
        if column[-1].as_py() <= frontier:
            cut = self.window.num_rows
        else:
            cut = bisect.bisect_right(_Keys(column), frontier)
        taken, self.window = self.window.slice(0, cut), self.window.slice(cut)
        return taken


class _Keys:
    """A string column as a sequence of Python strings, read one at a time (for :mod:`bisect`, whose ``key=``
    needs Python 3.10: EMR 7 runs 3.9)."""

    def __init__(self, column: pa.Array):
        self.column = column

    def __len__(self) -> int:
        return len(self.column)

    def __getitem__(self, index: int) -> str:
        return self.column[index].as_py()


def merge_runs(paths: list[str]) -> Iterator[pa.Table]:
    """The rows of sorted, unique runs in key order, one row per key (the larger size), as tables.

    Each step reads on from every run whose window is used up, takes the
    smallest of the windows' last keys as the frontier, and cuts from every
    window the rows up to it: every copy of a key up to the frontier is in
    those cuts (a run holds a key once, and in order), so sorting the cuts
    together (:func:`listing.sorted_unique`) gives the next stretch of the
    merged keys, and nothing after it can come before it. A run's window is
    used up at each step where its last key is the frontier, so the steps
    number about the windows read. When one run alone holds the stretch
    (runs of a mostly sorted manifest barely overlap), it is passed on as
    it is, without a copy.
    """
    runs = [run for run in map(_Run, paths) if run.fill()]
    while runs:
        frontier = min(run.last for run in runs)
        cuts = [cut for cut in (run.take_through(frontier) for run in runs) if cut is not None]
        if len(cuts) == 1:
            yield pa.Table.from_batches(cuts)
        else:
            yield sorted_unique([pa.Table.from_batches(cuts).combine_chunks()])
        runs = [run for run in runs if run.fill()]


class SpilledListing:
    """Sorted, unique keys and sizes in a local Arrow IPC file, read a record batch at a time.

    Answers what the dry run asks of a :class:`listing.Listing` without
    holding the keys: ``len``, iteration, ``listing[i]``, a slice (a
    :class:`listing.Listing` of those rows, in memory: keep it short),
    :meth:`tables` (for :func:`batch_list.write_batches`), :meth:`load` (all of
    it, in memory). Every batch of the file holds :data:`SPILLED_ROWS` rows
    (the last fewer), so row ``i`` is in batch ``i // SPILLED_ROWS``.
    """

    def __init__(self, bucket: str, path: str, rows: int, folder: str | None = None):
        self.bucket, self.path, self.rows = bucket, path, rows
        #: The names of the manifest's carried columns (their values are not in the file).
        self.carried: list[str] = []
        # The folder goes with the listing, or at the latest when the driver exits.
        self._cleanup = folder and weakref.finalize(self, shutil.rmtree, folder, ignore_errors=True)
        self._file = pa.OSFile(path)
        self._reader = pa.ipc.open_file(self._file)

    @classmethod
    def write(cls, bucket: str, path: str, tables: Iterable[pa.Table], folder: str | None = None) -> SpilledListing:
        """Write ``tables`` (sorted, unique) to ``path`` in batches of :data:`SPILLED_ROWS` rows.

        ``folder`` (holding ``path``) is removed with the listing.
        """
        rows = 0
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, _SCHEMA, options=_OPTIONS) as writer:
            for batch in rebatch(tables, SPILLED_ROWS):
                writer.write_batch(batch)
                rows += batch.num_rows
        return cls(bucket, path, rows, folder)

    def __len__(self) -> int:
        return self.rows

    def tables(self) -> Iterator[pa.Table]:
        """The keys in order, one table of :data:`SPILLED_ROWS` rows at a time."""
        for index in range(self._reader.num_record_batches):
            yield pa.Table.from_batches([self._reader.get_batch(index)])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for table in self.tables():
            yield from zip(table["key"].to_pylist(), table["size"].to_pylist())

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._rows(index)
        if index < 0:
            index += self.rows
        if not 0 <= index < self.rows:
            raise IndexError(f"index {index} out of range for {self.rows} keys")
        batch = self._reader.get_batch(index // SPILLED_ROWS)
        row = index % SPILLED_ROWS
        return batch.column(0)[row].as_py(), batch.column(1)[row].as_py()

    def _rows(self, index: slice) -> Listing:
        start, stop, step = index.indices(self.rows)
        if step != 1:
            raise ValueError("a SpilledListing slices with step 1 only")
        first, last = start // SPILLED_ROWS, max(start, stop - 1) // SPILLED_ROWS
        batches = [self._reader.get_batch(i) for i in range(first, min(last + 1, self._reader.num_record_batches))]
        table = pa.Table.from_batches(batches, _SCHEMA)
        return Listing(self.bucket, table.slice(start - first * SPILLED_ROWS, max(0, stop - start)))

    def num_batches(self, batch_size: int) -> int:
        """How many batches of ``batch_size`` the keys fill (the last one may be short)."""
        return -(-self.rows // batch_size)

    def load(self) -> Listing:
        """Every key in memory, as a :class:`listing.Listing` (one copy)."""
        tables = list(self.tables())
        return Listing(self.bucket, pa.concat_tables(tables) if tables else _SCHEMA.empty_table())

    def close(self) -> None:
        """Close the file and remove its folder."""
        self._file.close()
        if self._cleanup:
            self._cleanup()

    def __repr__(self) -> str:
        return f"SpilledListing(bucket={self.bucket!r}, keys={self.rows}, path={self.path!r})"
