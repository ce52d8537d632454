"""The Parquet view of the result model: the Parquet output's schema and rows, from the parts' record batches.

A few casts and no parsing (:func:`parquet_schema`, :func:`parquet_batch`):
fixed-size lists as plain lists, null lists emptied for pyarrow's Parquet
writer, and a task's own types where it has them (classify's probability as
float32, Athena's ``float``). The Parquet sink
(:class:`mxjob.outputs.parquet.ParquetSink`) writes them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.results.results import LINE


def parquet_schema(part_schema: pa.Schema, metadata: dict[str, str] | None = None,
                   types: dict[str, pa.DataType] | None = None) -> pa.Schema:
    """The Parquet output's schema for parts of ``part_schema``: ``types`` (the task's) for their columns; ``metadata``
    added.

    The columns are the parts' (``key``, the task's, ``error``); Athena, Glue
    and Spark read them as they are. Fixed-size lists (``embedding``, ``image_size``, ``box``) are
    written as plain lists, which Parquet stores the same way: pyarrow up to
    at least 20 cannot read a fixed-size list back from Parquet once one row
    is null (an error row), so a file of one failed image would be unreadable
    to pyarrow and pandas. ``metadata`` (the run's provenance) goes to the
    file's key-value metadata.
    """
    types = types or {}
    fields = [f.with_type(types[f.name] if f.name in types else _variable_lists(f.type))
              for f in part_schema if f.name != LINE.name]
    return pa.schema(fields, metadata={k.encode(): v.encode() for k, v in (metadata or {}).items()} or None)


def _variable_lists(type_: pa.DataType) -> pa.DataType:
    """``type_`` with every fixed-size list, at any depth, a plain list of the same values."""
    if pa.types.is_fixed_size_list(type_) or pa.types.is_list(type_):
        return pa.list_(_variable_lists(type_.value_type))
    if pa.types.is_struct(type_):
        return pa.struct([field.with_type(_variable_lists(field.type)) for field in type_])
    return type_


def parquet_batch(batch: pa.RecordBatch, parquet_schema_: pa.Schema) -> pa.RecordBatch:
    """A part's rows as rows of the Parquet output (:func:`parquet_schema`)."""
    columns = [_empty_null_lists(batch.column(f.name).cast(f.type)) if batch.schema.field(f.name).type != f.type
               else batch.column(f.name) for f in parquet_schema_]
    return pa.RecordBatch.from_arrays(columns, schema=parquet_schema_)


def _empty_null_lists(array: pa.Array) -> pa.Array:
    """``array`` with every null list, at any depth, holding no values.

    A fixed-size list keeps D values behind a null row (an error row's
    ``embedding``, ``image_size``), and its cast to a plain list keeps them
    too; pyarrow's Parquet writer refuses a null list over values ("Lists
    with non-zero length null components are not supported"), so one error
    row would stop the output at its close.
    """
    if pa.types.is_list(array.type):
        lengths = pc.fill_null(pc.list_value_length(array), 0).to_numpy()
        offsets = np.zeros(len(array) + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        # flatten() skips a null row's values and honours the array's offset: exactly the rows' lengths.
        return pa.ListArray.from_arrays(pa.array(offsets), _empty_null_lists(array.flatten()), type=array.type,
                                        mask=_null_mask(array))
    if pa.types.is_struct(array.type):
        children = [_empty_null_lists(array.field(i)) for i in range(array.type.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(array.type), mask=_null_mask(array))
    return array


def _null_mask(array: pa.Array) -> pa.Array | None:
    """True where ``array`` is null, for ``from_arrays``; ``None`` without nulls."""
    return array.is_null() if array.null_count else None
