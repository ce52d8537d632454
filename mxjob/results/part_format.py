"""The part: one batch's results made durable, as a task PUTs it under ``OUTPUT.parts/`` and the assembly reads it.

A part is the batch's record batch (:mod:`mxjob.results.results`), then its rows'
JSON lines (:data:`mxjob.results.results.LINE`) and, under ``--with-object-metadata``,
the objects' ETags and sizes (:data:`mxjob.results.results.OBJECT_METADATA`), as one
Arrow IPC stream in one zstd frame (:func:`write_part`, :func:`read_part`).
The assembly appends the key list's carried columns to a part's rows
(:func:`carry`).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.results.jsonl_view import Bodies, json_lines, with_members
from mxjob.results.results import LINE, OBJECT_METADATA


def object_metadata(keys: Iterable[str], seen: dict) -> pa.RecordBatch:
    """:data:`OBJECT_METADATA` for ``keys`` from ``seen`` (``{key: (etag, size)}``; a key not in it: nulls)."""
    pairs = [seen.get(key, (None, None)) for key in keys]
    return pa.RecordBatch.from_arrays([pa.array([etag for etag, _ in pairs], pa.string()),
                                       pa.array([size for _, size in pairs], pa.int64())], schema=OBJECT_METADATA)


def write_part(batch: pa.RecordBatch, bodies: Bodies | None = None, metadata: pa.RecordBatch | None = None) -> bytes:
    """``batch`` and its JSON lines (:data:`LINE`) as one Arrow IPC stream in one zstd frame.

    What a task PUTs under ``OUTPUT.parts/``; :func:`read_part` reads it.
    One frame, not Arrow's per-buffer compression: a part is small (a batch),
    and decompressing each of its twenty-odd buffers apart costs the driver
    five times as much.

    Parameters
    ----------
    batch : pyarrow.RecordBatch
        The batch's results (:meth:`results.Results.record_batch`).
    bodies : callable, optional
        The task's JSON members of each row (``Task.json_bodies``): each row's
        JSON line is rendered into :data:`LINE` (the output is JSON Lines).
        ``None`` leaves the column null (Parquet, which never reads it):
        :func:`json_lines` renders the same text from the typed columns
        should a JSON Lines output ever take the part.
    metadata : pyarrow.RecordBatch, optional
        The rows' :data:`OBJECT_METADATA` (:func:`object_metadata`), appended after the line.
    """
    text = pa.array(json_lines(batch, bodies), pa.string()) if bodies else pa.nulls(batch.num_rows, pa.string())
    batch = batch.append_column(LINE, text)
    if metadata is not None:
        for field, column in zip(metadata.schema, metadata.columns):
            batch = batch.append_column(field, column)
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, "zstd") as compressed, pa.ipc.new_stream(compressed, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def read_part(data: bytes) -> pa.RecordBatch:
    """The record batch of a part (:func:`write_part`): the result model's columns, :data:`LINE`, and any
    :data:`OBJECT_METADATA`."""
    reader = pa.ipc.open_stream(pa.CompressedInputStream(pa.BufferReader(data), "zstd"))
    batches = list(reader)
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, reader.schema).combine_chunks().to_batches()[0]


def carry(batch: pa.RecordBatch, carried: pa.Table | pa.RecordBatch | None) -> pa.RecordBatch:
    """``batch`` with ``carried``'s columns (its rows' own, aligned) appended after the result's.

    A part's JSON line (:data:`LINE`) gets them as members after the task's,
    ``{"key": K, "predictions": [...], "product_id": "..."}``: strings as
    JSON strings, numbers as numbers, null as ``null``; in Arrow compute, a
    column at a time. The Parquet view takes the columns as they are.

    A part's :data:`OBJECT_METADATA` leaves ``batch`` and takes the place of
    ``carried``'s ``etag`` and ``size`` where the GET saw them (the key
    list's values stay for an object whose download failed). ``carried``
    ``None``: nothing is appended, and a part's metadata is dropped.
    """
    batch, seen = _split_object_metadata(batch)
    if carried is None:
        return batch
    if isinstance(carried, pa.Table):
        carried = carried.combine_chunks().to_batches()[0] if carried.num_rows else \
            pa.RecordBatch.from_pylist([], carried.schema)
    for name in carried.schema.names:
        if name in batch.schema.names:
            raise ValueError(f"a carried column's name is the result's own: {name}")
    if seen is not None:
        for field in OBJECT_METADATA:
            at = carried.schema.get_field_index(field.name)
            if at >= 0:
                column = pc.coalesce(seen.column(field.name), carried.column(at).cast(field.type))
                carried = carried.set_column(at, field, column)
    index = batch.schema.get_field_index(LINE.name)
    if index >= 0:  # a null line stays null: json_lines renders it, the carried members with it
        batch = batch.set_column(index, LINE, with_members(batch.column(index), carried))
    for field, column in zip(carried.schema, carried.columns):
        batch = batch.append_column(field, column)
    return batch


def _split_object_metadata(batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.RecordBatch | None]:
    """``(batch without its part's OBJECT_METADATA, those columns)``; ``(batch, None)`` for a part without them."""
    index = batch.schema.get_field_index(LINE.name)
    if index < 0 or index == batch.num_columns - 1:
        return batch, None
    names = batch.schema.names[index + 1:]
    if names != OBJECT_METADATA.names:
        return batch, None  # carried already: the columns after the line are the job's own
    seen = pa.RecordBatch.from_arrays(batch.columns[index + 1:], schema=OBJECT_METADATA)
    return batch.drop_columns(names), seen
