"""The job's key list: held compactly in Arrow columns, listed from S3 in parallel.

The driver holds the listing; executors import this module only to read
their batch's keys from the run's plan (:func:`read_plan_batch`). At ten million
keys a Python list of ``(key, size)`` tuples costs more than 150 bytes a key;
a :class:`Listing` keeps the keys in one Arrow ``large_string`` column and the
sizes in an ``int64`` column (about the key's own bytes plus 16), sorted and
deduplicated, and hands out batches as zero-copy slices.

:func:`list_prefix` lists one prefix with many ``ListObjectsV2`` calls in
flight: it splits the key range still to list at boundary strings and lists
each part from its ``StartAfter``, so a prefix of a million keys costs about
``pages / concurrency`` round trips instead of ``pages``. :mod:`manifest`
builds a :class:`Listing` from a manifest file instead.

:func:`write_plan` writes the keys a run scores as one Arrow IPC stream with
one record batch per job batch, and returns each batch's byte span. Spark
then parallelizes only those spans (a few bytes per batch, not the keys), and
each task reads its batch's keys with one ranged GET: neither the driver's
Python nor its JVM holds the keys twice, however many there are.
"""

from __future__ import annotations

import io
import logging
import os
import re
import string
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from xml.etree import ElementTree

import boto3
import botocore
import botocore.config
import botocore.handlers
import botocore.parsers
import botocore.session
import pyarrow as pa
import pyarrow.compute as pc
from botocore.compat import unquote_str

import utils
from mxjob import settings, state

log = logging.getLogger(__name__)

#: Keys the job scores unless --suffixes says otherwise: the image formats Pillow decodes.
DEFAULT_SUFFIXES = settings.DEFAULT.suffixes
#: ListObjectsV2 calls in flight (``--list-concurrency``).
LIST_CONCURRENCY = settings.DEFAULT.list_concurrency
#: Arrow type of the key column: 64-bit offsets, so fifty million keys of 60
#: bytes (3 GB of text) still fit one column.
KEY_TYPE = pa.large_string()
#: The size of an object whose size the manifest did not give.
UNKNOWN_SIZE = -1
#: Rows of the sorted listing taken at once (a chunk of the sorted columns).
_TAKE_ROWS = 1 << 20
#: Keys handed out per step while iterating (bounds the Python objects alive at once).
_ITER_CHUNK = 65_536
#: Characters the range splitter cuts at: S3's "safe" key characters in code point order.
#: Any key is still listed (ranges cover everything); these only decide where ranges end.
_CUT_CHARS = "".join(sorted(set(string.digits + string.ascii_letters + "!-_.*'()/")))
#: A run's plan: one Arrow record batch per job batch (see :func:`write_plan`).
PLAN_SCHEMA = pa.schema([("key", KEY_TYPE), ("size", pa.int64())])


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
    def build(cls, bucket: str, keys, sizes=None, *, prefix: str = "", suffixes: Iterable[str] | None = None,
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
        """The keys in order as tables of ``key`` and ``size``, one a chunk (what :func:`write_plan` reads).

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

    def batch(self, index: int, batch_size: int) -> Listing:
        """Batch ``index`` (from 0) of ``batch_size`` keys: a zero-copy slice, shorter at the end."""
        return self[index * batch_size: (index + 1) * batch_size]

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
                    "not_image": f"not ending in {' '.join(sorted(suffixes or ()))}"}
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
        self.examples[reason] = sorted(self.examples[reason] + dropped.take(first).to_pylist())[:self.SHOWN]

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def entry(self, reason: str) -> dict:
        """``{"count", "why", "examples"}`` of one reason, even if it skipped nothing."""
        return {"count": self.counts[reason], "why": self.why[reason], "examples": sorted(self.examples[reason])}

    def report(self) -> dict:
        """``{reason: entry}`` (:meth:`entry`) for the reasons that skipped anything."""
        return {reason: self.entry(reason) for reason, count in self.counts.items() if count}


def keep_images(table: pa.Table, *, prefix: str = "", suffixes: Iterable[str] | None = None,
                skipped: Skipped | None = None) -> pa.Table:
    """The filtering step: the rows of ``table`` whose key starts with ``prefix`` and ends with one of ``suffixes``.

    Suffixes compare case-insensitively with the end of the key, a missing
    leading dot added; ``None`` keeps every suffix. The
    in-memory :meth:`Listing.build` and the out-of-core sort
    (:mod:`mxjob.extsort`) both filter here, so both keep the same keys, and
    ``skipped`` counts what both drop.
    """
    keys = table["key"]
    inside = pc.starts_with(keys, prefix) if prefix else None
    image = pc.match_substring_regex(keys, suffix_pattern(suffixes), ignore_case=True) if suffixes is not None else None
    if skipped is not None:
        if inside is not None:
            skipped.add("outside_input", keys, pc.invert(inside))
        if image is not None:
            skipped.add("not_image", keys, pc.invert(image) if inside is None else pc.and_(inside, pc.invert(image)))
    masks = [m for m in (inside, image) if m is not None]
    if not masks:
        return table
    mask = masks[0] if len(masks) == 1 else pc.and_(*masks)
    if pc.all(mask).as_py():  # usually every key is an image: then no copy
        return table
    return table.filter(mask)


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
    if isinstance(values, pa.ChunkedArray):
        return values.cast(kind) if values.type != kind else values
    if isinstance(values, pa.Array):
        return pa.chunked_array([values.cast(kind) if values.type != kind else values], kind)
    return pa.chunked_array([pa.array(list(values), kind)], kind)


# ----------------------------------------------------------------------------
# A run's plan: the keys it scores, read back one batch at a time


class _CountingFile(io.RawIOBase):
    """A write-only file that hands every write to ``sink`` and counts the bytes (its ``tell``)."""

    def __init__(self, sink):
        super().__init__()
        self.sink, self.position = sink, 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = bytes(data)
        self.sink(data)
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position


def write_plan(keys: Listing, batch_size: int, sink) -> list[tuple[int, int]]:
    """Write ``keys`` as an Arrow IPC stream of one record batch per job batch; return each batch's span.

    Parameters
    ----------
    keys : Listing or extsort.SpilledListing
        The keys of the run, in batch order (read through its ``tables()``).
    batch_size : int
        Keys per batch: batch ``i`` holds rows ``i * batch_size`` onwards.
    sink : callable
        Called with each piece of the stream (``bytes``), in order: for
        example a :class:`utils.MultipartWriter`'s ``write``, so the plan
        streams to S3 without ever being whole in memory.

    Returns
    -------
    list of (int, int)
        ``(offset, length)`` in the stream of each batch's message: what
        :func:`read_plan_batch` decodes after a ranged GET. Buffers are zstd
        compressed per batch, so a batch reads alone.
    """
    out = _CountingFile(sink)
    spans = []
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(out, PLAN_SCHEMA, options=options) as writer:
        # The plan holds keys and sizes only: carried columns stay on the driver, for the assembly.
        for batch in rebatch((table.select(PLAN_SCHEMA.names) for table in keys.tables()), batch_size):
            before = out.tell()
            writer.write_batch(batch.cast(PLAN_SCHEMA))
            spans.append((before, out.tell() - before))
    return spans


def rebatch(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``tables`` (in order) as record batches of exactly ``rows`` rows, the last one shorter.

    Each batch's columns are copied into buffers of their own, exactly its
    rows' bytes, whatever chunks the tables came in: the IPC writer writes a
    sliced string column's data up to 64 bytes past the slice's end (its
    alignment), so a slice's bytes in a plan would depend on the keys after
    it in memory. Copied, the same rows give the same bytes, whether the
    keys were held in memory or streamed from sorted runs on disk. Holds at
    most one input table and one batch besides.
    """
    pending = None
    for table in tables:
        pending = table if pending is None or not pending.num_rows else pa.concat_tables([pending, table])
        while pending.num_rows >= rows:
            yield _compact(pending.slice(0, rows))
            pending = pending.slice(rows)
    if pending is not None and pending.num_rows:
        yield _compact(pending)


def _compact(table: pa.Table) -> pa.RecordBatch:
    """``table``'s rows as one record batch of new, exactly sized buffers (``concat_arrays`` always copies)."""
    return pa.RecordBatch.from_arrays([pa.concat_arrays(column.chunks) for column in table.columns],
                                      schema=table.schema)


def read_plan_batch(data: bytes) -> list[tuple[str, int]]:
    """The ``(key, size)`` pairs of one batch (the bytes of a span :func:`write_plan` returned).

    The first batch's span also holds the stream's schema message, which is skipped.
    """
    for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(data)):
        if message.type == "record batch":
            batch = pa.ipc.read_record_batch(message, PLAN_SCHEMA)
            return list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
    raise ValueError(f"no record batch in {len(data)} bytes of a plan")


def read_plan(source) -> Iterator[pa.RecordBatch]:
    """Every batch of a plan stream (``bytes`` or a readable file, such as a GET's body), in order."""
    yield from pa.ipc.open_stream(source)


# ----------------------------------------------------------------------------
# Listing a prefix: sequential or in parallel


def list_client(endpoint_url: str | None = None, region: str | None = None,
                max_attempts: int = utils.S3_MAX_ATTEMPTS, max_pool_connections: int = utils.S3_POOL_CONNECTIONS,
                kind: str = settings.DEFAULT.s3_reader):
    """A new S3 client for :func:`list_prefix`, configured as :func:`utils.s3_client`'s.

    ``kind`` is the job's ``--s3-reader``. ``"botocore"`` gives a plain boto3
    client: botocore's own parser, nothing of ours hooked in. ``"lean"``
    gives a client whose ``ListObjectsV2`` pages cost a tenth of the CPU:
    botocore turns each of a page's 1,000 objects into a dict of six parsed
    fields (``LastModified`` through dateutil), 170 ms of the driver's CPU a
    page on the benchmark's machine (``bench/listing.py``), so a parallel
    listing runs out of CPU (one core: the GIL) long before it runs out of S3.
    The job needs only keys and sizes, so this client reads them from the XML
    itself in a ``before-parse`` hook (a regular expression over the
    url-encoded keys; ElementTree for any other page) and gives botocore the
    page without its ``Contents``: 6 to 11 ms a page there. The keys and
    sizes come back as ``response["KeysAndSizes"]``. Signing, retries,
    errors and the check for a cut-off page stay botocore's.

    The lean client leans on botocore internals (:func:`lean_listing_unavailable`
    says which). When this botocore lacks them, ``"lean"`` gives the plain
    client instead and logs why, once per process: the listing is the same,
    only slower.
    """
    if kind not in utils.S3_READERS:
        raise ValueError(f"s3 reader {kind!r}: choose one of {', '.join(utils.S3_READERS)}")
    config = utils.client_config(max_attempts, max_pool_connections)
    if kind == "lean":
        reason = lean_listing_unavailable()
        if reason is None:
            return _lean_list_client(endpoint_url, region, config)
        _warn_fallback(reason)
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)


def lean_listing_unavailable() -> str | None:
    """Why this botocore cannot serve the lean listing client (``None``: it can).

    The lean client moves botocore's check of 200 answers
    (``botocore.handlers._handle_200_error``, a private name) after its own
    ``before-parse`` hook, and sets the parser factory's defaults of its
    session. Without either, its hook would save nothing or could not be set
    up as tested, so the plain client is used.
    """
    check = getattr(botocore.handlers, "_handle_200_error", None)
    if not callable(check):
        return f"botocore {botocore.__version__} has no botocore.handlers._handle_200_error to run after its hook"
    if not callable(getattr(botocore.parsers.ResponseParserFactory, "set_parser_defaults", None)):
        return f"botocore {botocore.__version__} has no ResponseParserFactory.set_parser_defaults"
    return None


_fallback_lock = threading.Lock()


def _warn_fallback(reason: str) -> None:
    """Say once per process why ``--s3-reader lean`` lists through botocore's own parser."""
    with _fallback_lock:
        if state.counters.listing_fallback is not None:
            return
        state.counters.listing_fallback = reason
    log.warning("--s3-reader lean: the lean listing is not available (%s); listing with botocore's own "
                "ListObjectsV2 parser instead (the same keys, at about ten times the driver's CPU a page)", reason)


def _lean_list_client(endpoint_url: str | None, region: str | None, config: botocore.config.Config):
    """The lean listing client (see :func:`list_client`); only once :func:`lean_listing_unavailable` said yes."""
    session = botocore.session.get_session()
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    client = boto3.session.Session(botocore_session=session).client(
        "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)
    # botocore checks every 200 answer for an embedded error or a cut-off document by parsing all
    # of it, which costs as much as the hook. Moved after the hook (on its own event name, where
    # the order is the order of registration), it checks what the hook leaves: the page without
    # its Contents.
    check = botocore.handlers._handle_200_error
    client.meta.events.unregister("before-parse.s3.*", check)
    client.meta.events.register("before-parse.s3.*", _keys_and_sizes)
    client.meta.events.register("before-parse.s3.*", check)
    return client


_S3_XML = "{http://s3.amazonaws.com/doc/2006-03-01/}"
_CONTENTS = re.compile(rb"<Contents>.*?</Contents>", re.S)
#: A key and the size after it in one <Contents> (S3 writes Key first, Size later): a url-encoded
#: key has no "<" or "&", so nothing in it needs unescaping.
_KEY_SIZE = re.compile(rb"<Contents>\s*<Key>([^<&]*)</Key>.*?<Size>(\d+)</Size>", re.S)
_URL_ENCODED = b"<EncodingType>url</EncodingType>"


def _keys_and_sizes(response_dict, customized_response_dict, operation_model=None, **_) -> None:
    """``before-parse`` hook of the lean listing client: take a page's keys and sizes out of its XML.

    See :func:`list_client`; never registered under ``--s3-reader botocore``.
    """
    body = response_dict.get("body")
    if operation_model is not None and operation_model.name != "ListObjectsV2":
        return
    if response_dict.get("status_code") != 200 or not body:
        return  # errors are botocore's to parse
    found = _KEY_SIZE.findall(body) if _URL_ENCODED in body else None
    if found is not None and len(found) == body.count(b"<Contents>"):
        # botocore asks for url-encoded keys (encoding-type=url, so that any key survives XML)
        # and decodes them after parsing; these bypass that, so they are decoded here as it would.
        keys = [unquote_str(key.decode("utf-8")) if b"%" in key or b"+" in key else key.decode("utf-8")
                for key, _ in found]
        sizes = [int(size) for _, size in found]
    else:  # not the layout the expression knows: ElementTree reads any
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            return  # a cut-off or broken page: botocore's check makes it a retried 500
        items = root.iterfind(_S3_XML + "Contents")
        pairs = [(item.findtext(_S3_XML + "Key"), int(item.findtext(_S3_XML + "Size"))) for item in items]
        if root.findtext(_S3_XML + "EncodingType") == "url":
            pairs = [(unquote_str(key), size) for key, size in pairs]
        keys, sizes = [key for key, _ in pairs], [size for _, size in pairs]
    customized_response_dict["KeysAndSizes"] = (keys, sizes)
    # S3 writes the Contents one after the other: cut them out in one slice, not a search.
    first, last = body.find(b"<Contents>"), body.rfind(b"</Contents>")
    rest = body[:first] + body[last + len(b"</Contents>"):] if first >= 0 else body
    response_dict["body"] = rest if b"<Contents>" not in rest else _CONTENTS.sub(b"", rest)


def list_prefix(client, bucket: str, prefix: str, concurrency: int = LIST_CONCURRENCY, *, page_size: int = 1000,
                progress_every: int = 100_000, etags: bool = False) -> tuple[pa.ChunkedArray, ...]:
    """Every key under ``prefix`` and its size, with up to ``concurrency`` list calls in flight.

    The key range left to list starts as everything after ``prefix``. Each
    call lists one page of a range from its ``StartAfter``; when the page is
    full and list slots are idle, the rest of the range is cut at boundary
    strings into as many parts as there are idle slots, each listed on its
    own. Cuts are made at the first character where the range's last listed
    key and its end differ, at characters common in keys (digits, letters,
    ``/-_.``), one character deeper when there is no room: a part that holds
    no key costs one call, and a part with keys is cut again on its first
    page. Parts never overlap and cover the whole range, so the result is the
    same as sequential listing's, whatever the keys are.

    Parameters
    ----------
    client : botocore S3 client
        Its ``max_pool_connections`` should be at least ``concurrency``.
    bucket, prefix : str
        What to list.
    concurrency : int
        List calls in flight at most; 1 lists page after page.
    page_size : int
        ``MaxKeys`` per call (S3 returns at most 1,000).
    progress_every : int
        Log a progress line each time this many more keys are listed.
    etags : bool
        Also return each object's ETag (without its quotes): needs a client
        of botocore's own parser (``list_client(kind="botocore")``), since the
        lean one reads keys and sizes only.

    Returns
    -------
    tuple of pyarrow.ChunkedArray
        Keys (``large_string``) and their sizes (``int64``), in pages in the
        order they came back: :meth:`Listing.build` sorts them; then the
        ETags (``string``) with ``etags``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    started = time.monotonic()
    # (start_after, end): list keys > start_after and <= end; None is open.
    pending: deque = deque([(None, None)])
    pages: list[tuple] = []
    calls = listed = 0
    next_report = progress_every
    with ThreadPoolExecutor(concurrency, thread_name_prefix="list") as pool:
        running: dict = {}
        try:
            while pending or running:
                while pending and len(running) < concurrency:
                    span = pending.popleft()
                    running[pool.submit(_list_page, client, bucket, prefix, span, page_size, etags)] = span
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    span = running.pop(future)
                    keys, sizes, tags, last, more = future.result()
                    calls += 1
                    if len(keys):
                        pages.append((keys, sizes, tags))
                        listed += len(keys)
                    if more:
                        idle = concurrency - len(running) - len(pending)
                        pending.extend(split_range(prefix, last, span[1], max(1, idle)))
                if listed >= next_report:
                    log.info("listing s3://%s/%s: %d keys so far, %d calls, %d in flight, %.0f keys/s",
                             bucket, prefix, listed, calls, len(running), listed / (time.monotonic() - started))
                    next_report = (listed // progress_every + 1) * progress_every
        except BaseException:
            for future in running:
                future.cancel()
            raise
    log.info("listed s3://%s/%s: %d keys in %.1fs (%d calls, up to %d at once)",
             bucket, prefix, listed, time.monotonic() - started, calls, concurrency)
    columns = (pa.chunked_array([page[0] for page in pages], KEY_TYPE),
               pa.chunked_array([page[1] for page in pages], pa.int64()))
    return (*columns, pa.chunked_array([page[2] for page in pages], pa.string())) if etags else columns


def _list_page(client, bucket: str, prefix: str, span: tuple, page_size: int, etags: bool = False):
    """One ``ListObjectsV2`` page of ``span``: ``(keys, sizes, etags or None, last key, more to list)``."""
    start_after, end = span
    if start_after is not None and end is not None:
        # Every key between two strings starts with their common prefix: asking for it keeps
        # S3 from returning (and the client from reading) keys past the end of the range.
        prefix = max(prefix, os.path.commonprefix([start_after, end]), key=len)
    kwargs = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page_size}
    if start_after is not None:
        kwargs["StartAfter"] = start_after
    response = client.list_objects_v2(**kwargs)
    tags = None
    if "KeysAndSizes" in response:  # the lean list_client
        if etags:
            raise ValueError("the lean listing client reads no ETags: list with list_client(kind='botocore')")
        keys, sizes = response["KeysAndSizes"]
    else:
        contents = response.get("Contents", ())
        keys = [obj["Key"] for obj in contents]
        sizes = [int(obj["Size"]) for obj in contents]
        if etags:
            tags = [obj["ETag"].strip('"') if obj.get("ETag") is not None else None for obj in contents]
    more = bool(response.get("IsTruncated")) and bool(keys)
    if end is not None and keys and keys[-1] >= end:
        # The page reached the range's end (and maybe ran into the next range): keep this range's keys.
        cut = next((i for i, key in enumerate(keys) if key > end), len(keys))
        keys, sizes, more = keys[:cut], sizes[:cut], False
        tags = tags[:cut] if tags is not None else None
    return (pa.array(keys, KEY_TYPE), pa.array(sizes, pa.int64()), pa.array(tags, pa.string()) if etags else None,
            keys[-1] if keys else None, more)


def split_range(prefix: str, last: str, end: str | None, parts: int) -> list[tuple[str, str | None]]:
    """Cut the range ``(last, end]`` into at most ``parts`` ranges that cover it exactly.

    Parameters
    ----------
    prefix : str
        The listed prefix: cuts are made after it.
    last : str
        The last key listed so far; the range starts after it.
    end : str or None
        The range's last possible key (inclusive); None for the prefix's end.
    parts : int
        How many ranges at most.

    Returns
    -------
    list of (str, str or None)
        ``(start_after, end)`` ranges, in order; consecutive ranges share a boundary.

    Examples
    --------
    >>> split_range("p/", "p/a9", None, 3)
    [('p/a9', 'p/j'), ('p/j', 'p/r'), ('p/r', None)]
    """
    cuts = _cuts(prefix, last, end, parts - 1) if parts > 1 else []
    edges = [last, *cuts, end]
    return list(zip(edges[:-1], edges[1:]))


def _cuts(prefix: str, last: str, end: str | None, count: int) -> list[str]:
    """Up to ``count`` strings strictly between ``last`` and ``end``, in order."""
    position = len(prefix)
    if end is not None:  # the first character where they differ (end > last, so end has one there)
        while position < min(len(last), len(end)) and last[position] == end[position]:
            position += 1
    base = last[:position]
    floor = last[position] if position < len(last) else ""
    ceiling = end[position] if end is not None else None
    while True:
        # Every base + c with floor < c < ceiling is above last and below end.
        choices = [c for c in _CUT_CHARS if c > floor and (ceiling is None or c < ceiling)]
        if choices:
            break
        if floor:
            # No room here (last "p/a", end "p/b"): below end is every longer string that starts
            # with last's next character, so cut one character deeper, above last only.
            base, position = last[: position + 1], position + 1
            floor, ceiling = (last[position] if position < len(last) else ""), None
        else:
            # last ends here and end's character leaves no room below it: follow end one deeper.
            base, position = end[: position + 1], position + 1
            if position >= len(end):
                return []
            floor, ceiling = "", end[position]
    # Keys number their files and folders: after a digit the next key most likely has a digit
    # there too, after a letter a letter. Cut at those first, spread over the rest.
    kind = _kind(floor)
    alike = [c for c in choices if _kind(c) == kind]
    picked = _spread(alike, count) if len(alike) >= count else alike + _spread(
        [c for c in choices if _kind(c) != kind], count - len(alike))
    return [base + c for c in sorted(picked)]


def _kind(char: str) -> int:
    return 0 if char.isdigit() else 1 if char.islower() else 2 if char.isupper() else 3


def _spread(choices: list[str], count: int) -> list[str]:
    """``count`` of ``choices`` (in order), evenly spaced."""
    if count <= 0 or not choices:
        return []
    step = len(choices) / (count + 1)
    return sorted({choices[min(len(choices) - 1, int(step * (i + 1)))] for i in range(count)})
