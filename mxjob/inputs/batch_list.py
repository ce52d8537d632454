"""The run's batch list: its keys in batch order, one Arrow record batch per batch, read by the executors.

The driver writes it once under the work prefix (:func:`write_batches`); each
Spark partition holds one ``(offset, length)`` span, and its task reads
that batch's keys with one ranged GET (:func:`read_batch`), so the
driver never ships key lists through Spark.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from mxjob.s3.parallel_list import KEY_TYPE

if TYPE_CHECKING:  # the driver's key list: the executors read a batch list, never a Listing
    from mxjob.inputs.listing import Listing

log = logging.getLogger(__name__)


#: A run's batch list: one Arrow record batch per job batch (see :func:`write_batches`).
BATCHES_SCHEMA = pa.schema([("key", KEY_TYPE), ("size", pa.int64())])


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


def write_batches(keys: Listing, batch_size: int, sink) -> list[tuple[int, int]]:
    """Write ``keys`` as an Arrow IPC stream of one record batch per job batch; return each batch's span.

    Parameters
    ----------
    keys : Listing or extsort.SpilledListing
        The keys of the run, in batch order (read through its ``tables()``).
    batch_size : int
        Keys per batch: batch ``i`` holds rows ``i * batch_size`` onwards.
    sink : callable
        Called with each piece of the stream (``bytes``), in order: for
        example a :class:`writes.MultipartWriter`'s ``write``, so the batch list
        streams to S3 without ever being whole in memory.

    Returns
    -------
    list of (int, int)
        ``(offset, length)`` in the stream of each batch's message: what
        :func:`read_batch` decodes after a ranged GET. Buffers are zstd
        compressed per batch, so a batch reads alone.
    """
    out = _CountingFile(sink)
    spans = []
    with pa.ipc.new_stream(out, BATCHES_SCHEMA, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        # The batch list holds keys and sizes only: carried columns stay on the driver, for the assembly.
        for batch in rebatch((table.select(BATCHES_SCHEMA.names) for table in keys.tables()), batch_size):
            before = out.tell()
            writer.write_batch(batch.cast(BATCHES_SCHEMA))
            spans.append((before, out.tell() - before))
    return spans


def rebatch(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.RecordBatch]:
    """The rows of ``tables`` (in order) as record batches of exactly ``rows`` rows, the last one shorter.

    Each batch's columns are copied into buffers of their own, exactly its
    rows' bytes, whatever chunks the tables came in: the IPC writer writes a
    sliced string column's data up to 64 bytes past the slice's end (its
    alignment), so a slice's bytes in a batch list would depend on the keys after
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


def read_batch(data: bytes) -> list[tuple[str, int]]:
    """The ``(key, size)`` pairs of one batch (the bytes of a span :func:`write_batches` returned).

    The first batch's span also holds the stream's schema message, which is skipped.
    """
    for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(data)):
        if message.type == "record batch":
            batch = pa.ipc.read_record_batch(message, BATCHES_SCHEMA)
            return list(zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()))
    raise ValueError(f"no record batch in {len(data)} bytes of a batch list")
