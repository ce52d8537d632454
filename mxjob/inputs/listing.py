"""The job's key list: held compactly in Arrow columns, listed from S3 in parallel.

The driver holds the listing; executors import this module only to read
their batch's keys from the run's batch list (:func:`read_batch`). At ten million
keys a Python list of ``(key, size)`` tuples costs more than 150 bytes a key;
a :class:`Listing` keeps the keys in one Arrow ``large_string`` column and the
sizes in an ``int64`` column (about the key's own bytes plus 16), sorted and
deduplicated, and hands out batches as zero-copy slices.

:func:`list_prefix` lists one prefix with many ``ListObjectsV2`` calls in
flight: it splits the key range still to list at boundary strings and lists
each part from its ``StartAfter``, so a prefix of a million keys costs about
``pages / concurrency`` round trips instead of ``pages``. :mod:`manifest`
builds a :class:`Listing` from a manifest file instead.

:func:`write_batches` writes the keys a run scores as one Arrow IPC stream with
one record batch per job batch, and returns each batch's byte span. Spark
then parallelizes only those spans (a few bytes per batch, not the keys), and
each task reads its batch's keys with one ranged GET: neither the driver's
Python nor its JVM holds the keys twice, however many there are.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core import constants
from mxjob.s3.parallel_list import KEY_TYPE

log = logging.getLogger(__name__)

#: Keys the job scores unless --suffixes says otherwise: the image formats Pillow decodes.
DEFAULT_SUFFIXES = constants.DEFAULT.suffixes
#: The size of an object whose size the manifest did not give.
UNKNOWN_SIZE = -1
#: Rows of the sorted listing taken at once (a chunk of the sorted columns).
_TAKE_ROWS = 1 << 20
#: Keys handed out per step while iterating (bounds the Python objects alive at once).
_ITER_CHUNK = 65_536


class Listing:
    """Sorted, unique image keys of one bucket and their sizes, in Arrow columns.

    Behaves as a read-only sequence of ``(key, size)`` tuples: ``len``,
    iteration, ``listing[i]``, and ``listing[a:b]``, which returns another
    :class:`Listing` that shares the memory (no copy). ``size`` is
    :data:`UNKNOWN_SIZE` (-1) when a manifest did not give it.

    Parameters
    ----------
    bucket : str
        The bucket every key is in.
    table : pyarrow.Table
        Columns ``key`` (``large_string``) and ``size`` (``int64``), already
        sorted and unique; use :meth:`build` to make one from raw columns.

    Examples
    --------
    >>> images = Listing.build("b", ["x/2.jpg", "x/1.JPG", "x/a.txt", "x/1.JPG"], [5, 3, 1, 3], suffixes=[".jpg"])
    >>> len(images), images[0], list(images[1:])
    (2, ('x/1.JPG', 3), [('x/2.jpg', 5)])
    """

    __slots__ = ("bucket", "manifest", "skipped_keys", "table")

    def __init__(self, bucket: str, table: pa.Table):
        self.bucket, self.table = bucket, table
        #: From ``--input-manifest``: what its filtering step kept and skipped (:class:`Skipped`).
        self.manifest: dict | None = None
        #: From a prefix: the keys under it without one of the suffixes (:meth:`Skipped.entry`).
        self.skipped_keys: dict | None = None

    @classmethod
    def build(  # noqa: PLR0913 - keyword-only filter options with defaults; callers name the few they use
            cls, bucket: str, keys, sizes=None, *, prefix: str = "", suffixes: Iterable[str] | None = None,
            limit: int | None = None, skipped: Skipped | None = None, carried: dict | None = None) -> Listing:
        """Filter, sort, deduplicate and limit raw key and size columns (and the columns carried beside them).

        Parameters
        ----------
        bucket : str
            The keys' bucket.
        keys : sequence of str, or pyarrow (Chunked)Array of strings
            Object keys, in any order, possibly repeated.
        sizes : sequence of int, pyarrow array, or None
            Sizes in bytes, aligned with ``keys``; None or null means unknown.
        prefix : str
            Keep only keys that start with it.
        suffixes : iterable of str, optional
            Keep only keys ending with one of these, case-insensitive (a
            missing leading dot is added; :func:`keep_images`).
        limit : int, optional
            Keep only the first ``limit`` keys, in sorted order.
        skipped : Skipped, optional
            Counts the keys the filter drops, by reason (a manifest's report).
        carried : dict of str to string columns, optional
            A manifest's columns beyond ``bucket,key,size``, aligned with
            ``keys``: they follow their key through the sort (:attr:`carried`).

        Returns
        -------
        Listing
            Sorted by key in code point order (S3's listing order); for a
            key given twice, the larger size wins.
        """
        # Each step drops its input as soon as it has its output: at ten million keys the
        # driver's peak is a few copies of the key column, so every copy counts.
        table = pa.table({"key": _as_column(keys, KEY_TYPE), "size": _as_column(sizes, pa.int64())
                          if sizes is not None else pa.nulls(len(keys), pa.int64()),
                          **{name: _as_column(column, pa.string()) for name, column in (carried or {}).items()}})
        del keys, sizes, carried
        table = table.set_column(1, "size", pc.fill_null(table["size"], UNKNOWN_SIZE))
        table = keep_images(table, prefix=prefix, suffixes=suffixes, skipped=skipped)
        # Arrow compares strings by their UTF-8 bytes, which is code point order: S3's and Python's.
        # A listing or an inventory comes sorted and unique: then nothing is copied.
        holder = [table]
        del table  # the holder is the only reference: sorted_unique lets go of each copy it replaces
        table = sorted_unique(holder)
        if limit is not None:
            table = table.slice(0, limit)
        pa.default_memory_pool().release_unused()  # give the freed copies back to the system
        return cls(bucket, table)

    @property
    def keys(self) -> pa.ChunkedArray:
        return self.table["key"]

    @property
    def sizes(self) -> pa.ChunkedArray:
        return self.table["size"]

    @property
    def carried(self) -> list[str]:
        """The names of the columns carried beside the keys (a CSV manifest's columns beyond ``bucket,key,size``)."""
        return self.table.column_names[2:]

    @property
    def nbytes(self) -> int:
        """Bytes of Arrow memory the columns of this listing reference."""
        return self.table.nbytes

    def tables(self) -> Iterator[pa.Table]:
        """The keys in order as tables of ``key`` and ``size``, one a chunk (what :func:`write_batches` reads).

        A chunk at a time: slicing a table of many chunks (a listing merged
        from sorted runs has one per 16,384 keys) costs a step per chunk.
        """
        for batch in self.table.to_batches():
            yield pa.Table.from_batches([batch])

    def __len__(self) -> int:
        return self.table.num_rows

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for start in range(0, len(self), _ITER_CHUNK):
            chunk = self.table.slice(start, _ITER_CHUNK)
            yield from zip(chunk["key"].to_pylist(), chunk["size"].to_pylist())

    def __getitem__(self, index):
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                raise ValueError("a Listing slices with step 1 only")
            return Listing(self.bucket, self.table.slice(start, max(0, stop - start)))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} keys")
        return self.table["key"][index].as_py(), self.table["size"][index].as_py()

    def filter(self, mask) -> Listing:
        """The keys where ``mask`` (a boolean Arrow array or list, one per key) is true."""
        return Listing(self.bucket, self.table.filter(mask))

    def num_batches(self, batch_size: int) -> int:
        """How many batches of ``batch_size`` the keys fill (the last one may be short)."""
        return -(-len(self) // batch_size)

    def __repr__(self) -> str:
        return f"Listing(bucket={self.bucket!r}, keys={len(self)})"


def suffix_pattern(suffixes: Iterable[str]) -> str:
    """The regular expression of keys ending in one of ``suffixes`` (match it ignoring case); ``jpg`` is ``.jpg``."""
    wanted = sorted({s.lower() if s.startswith(".") else "." + s.lower() for s in suffixes})
    return "(" + "|".join(re.escape(s) for s in wanted) + ")$"


#: S3's longest key, in UTF-8 bytes: a longer manifest line names no object.
MAX_KEY_BYTES = 1024


class Skipped:
    """What a filter dropped, by reason, with a few example keys each: no listed key is dropped silently.

    ``outside_input``: not under the input prefix; ``not_image``: under it,
    but without one of the suffixes. :meth:`report` is the ``skipped`` entry
    of a manifest's summary, :meth:`entry` a prefix's ``skipped_keys``. The
    examples are the first in key order, so a parallel listing, whose pages
    come back in any order, names the same ones every run.
    """

    #: Example keys kept per reason.
    SHOWN = 10

    def __init__(self, prefix: str = "", suffixes: Iterable[str] | None = None):
        self.why = {"outside_input": f"not under the input prefix {prefix!r}",
                    "not_image": f"not ending in {' '.join(sorted(suffixes or ()))}",
                    "too_long": f"longer than S3's {MAX_KEY_BYTES:,}-byte limit on a key: no object can have it"}
        self.counts = dict.fromkeys(self.why, 0)
        self.examples: dict[str, list] = {reason: [] for reason in self.why}

    def add(self, reason: str, keys, mask) -> None:
        """Count the keys where ``mask`` is true as skipped for ``reason``, keeping the first examples."""
        count = pc.sum(mask).as_py() or 0
        if not count:
            return
        self.counts[reason] += count
        dropped = keys.filter(mask)
        # The first few in key order, found without sorting every dropped key.
        first = pc.select_k_unstable(dropped, k=min(self.SHOWN, len(dropped)), sort_keys=[("key", "ascending")])
        shown = [_shown(key) for key in dropped.take(first).to_pylist()]
        self.examples[reason] = sorted(self.examples[reason] + shown)[:self.SHOWN]

    def entry(self, reason: str) -> dict:
        """``{"count", "why", "examples"}`` of one reason, even if it skipped nothing."""
        return {"count": self.counts[reason], "why": self.why[reason], "examples": sorted(self.examples[reason])}

    def report(self) -> dict:
        """``{reason: entry}`` (:meth:`entry`) for the reasons that skipped anything."""
        return {reason: self.entry(reason) for reason, count in self.counts.items() if count}


def _shown(key: str) -> str:
    """A key as an example in the summary: whole, or its first characters and its length when it is huge."""
    size = len(key.encode("utf-8"))
    return key if size <= MAX_KEY_BYTES else f"{key[:80]}... ({size:,} bytes)"


def keep_images(table: pa.Table, *, prefix: str = "", suffixes: Iterable[str] | None = None,
                skipped: Skipped | None = None) -> pa.Table:
    """The filtering step: the rows of ``table`` whose key starts with ``prefix`` and ends with one of ``suffixes``.

    Suffixes compare case-insensitively with the end of the key, a missing
    leading dot added; ``None`` keeps every suffix. The
    in-memory :meth:`Listing.build` and the out-of-core sort
    (:mod:`mxjob.inputs.extsort`) both filter here, so both keep the same keys, and
    ``skipped`` counts what both drop.
    """
    keys = table["key"]
    too_long = pc.greater(pc.binary_length(keys), MAX_KEY_BYTES)
    fits = None if not pc.any(too_long).as_py() else pc.invert(too_long)  # a manifest's line, never a listed key
    inside = pc.starts_with(keys, prefix) if prefix else None
    image = pc.match_substring_regex(keys, suffix_pattern(suffixes), ignore_case=True) if suffixes is not None else None
    if skipped is not None:
        if fits is not None:
            skipped.add("too_long", keys, too_long)
        if inside is not None:
            skipped.add("outside_input", keys, _both(pc.invert(inside), fits))
        if image is not None:
            skipped.add("not_image", keys, _both(_both(pc.invert(image), inside), fits))
    masks = [m for m in (fits, inside, image) if m is not None]
    mask = functools.reduce(pc.and_, masks) if masks else None
    if mask is None or pc.all(mask).as_py():  # usually every key is an image: then no copy
        return table
    return table.filter(mask)


def _both(mask, other):
    """``mask`` and ``other``, where a ``None`` stands for everything."""
    return mask if other is None else pc.and_(mask, other)


def sorted_unique(holder: list) -> pa.Table:
    """The table in ``holder`` (taken out of it) sorted by key in code point order, one row per key.

    For a key given twice the larger size wins. A table that is already
    strictly increasing is returned as it is (no copy); otherwise see
    :func:`_sorted_unique` for the memory it takes. The caller passes the
    table in a one-item list and keeps no other reference, so that each copy
    is let go of as soon as the next exists.
    """
    table = holder.pop()
    if table.num_rows > 1 and not _strictly_increasing(table["key"]):
        holder.append(table)
        del table
        return _sorted_unique(holder)
    return table


def _sorted_unique(holder: list) -> pa.Table:
    """The table in ``holder`` (taken out of it) sorted by key, larger size first, then one row per key.

    At most two copies of the columns are alive at once.

    pyarrow's ``sort_by`` on a table of many chunks joins them before taking
    the sorted order, so the chunks, the joined copy and the sorted one are
    alive at once. Joined here first (the chunks go as the caller let go of
    them), then taken a slice of :data:`_TAKE_ROWS` at a time: the peak is the
    joined columns, the sorted ones and the order (8 bytes a key).
    """
    table = holder.pop().combine_chunks()
    pa.default_memory_pool().release_unused()  # the chunks' pages, before the sorted copy is made
    order = pc.sort_indices(table, sort_keys=[("key", "ascending"), ("size", "descending")])
    pieces = [table.take(order.slice(start, _TAKE_ROWS)) for start in range(0, len(order), _TAKE_ROWS)]
    del table, order
    table = pa.concat_tables(pieces)  # the pieces become the chunks: no copy
    del pieces
    column = table["key"]
    repeated = pc.equal(column[1:], column[:-1])
    if pc.any(repeated).as_py():
        keep = pa.concat_arrays([pa.array([True]), *pc.invert(repeated).chunks])
        table = table.filter(keep)
    return table


def _strictly_increasing(column: pa.ChunkedArray) -> bool:
    """Whether every value is less than the next, compared chunk by chunk (without joining the chunks)."""
    last = None
    for chunk in column.chunks:
        if not len(chunk):
            continue
        if last is not None and not last < chunk[0].as_py():
            return False
        if len(chunk) > 1 and not pc.all(pc.less(chunk[:-1], chunk[1:])).as_py():
            return False
        last = chunk[-1].as_py()
    return True


def _as_column(values, kind: pa.DataType) -> pa.ChunkedArray:
    if not isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pa.array(list(values), kind)
    values = values.cast(kind) if values.type != kind else values
    return values if isinstance(values, pa.ChunkedArray) else pa.chunked_array([values], kind)


# ----------------------------------------------------------------------------
# A run's batch list: the keys it scores, read back one batch at a time


# ----------------------------------------------------------------------------
# Listing a prefix: sequential or in parallel


