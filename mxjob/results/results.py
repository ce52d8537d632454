"""The result model: one Arrow record batch per batch of images, ``key``, the task's columns, then ``error``.

A task (``mxjob.executor.partition.score_partition``) makes its batch's
results as one record batch (:class:`Results`), sorted by key, and makes it
durable as one part (:mod:`mxjob.results.part_format`); the driver's assembly
reads the parts back and merges them by their ``key`` column. The outputs are
views of the same batches: JSON Lines (:mod:`mxjob.results.jsonl_view`),
Parquet (:mod:`mxjob.results.parquet_view`), the Athena table over it
(:mod:`mxjob.results.athena_table`), the DataFrame UDF and the library's
Python objects.

The columns between ``key`` and ``error`` (``struct<stage, type, message>``,
null when the image was scored) are the task's (:mod:`mxjob.tasks`): the
task's name and this module's format version are in the schema's metadata,
so a part says what it holds. The columns a part holds after the model's
(:data:`LINE`, :data:`OBJECT_METADATA`) and the names a carried column cannot
take (:data:`RESERVED`) are declared here too; :func:`error_kinds` counts a
batch's failures for the tasks' stats.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core.errors import error_object

#: The part format; in the fingerprint (``durable.fingerprint``), so a resume never mixes formats.
FORMAT = "arrow-ipc-stream.zst/1"
_KIND = b"mxinfer.kind"
_FORMAT = b"mxinfer.format"

KEY = pa.field("key", pa.string())
ERROR = pa.struct([("stage", pa.string()), ("type", pa.string()), ("message", pa.string())])
#: What the columns every task's rows have hold, for a reader of the output (``docs/output.md`` is made from it).
MEANINGS = {
    "key": "the image's key in the input bucket; rows are sorted by it",
    "error": "why the image has no result: `stage` (`download`, `decode` or `predict`), the exception's `type` "
             "and `message`; null for a scored row",
}


def schema(kind: str, columns: Sequence[pa.Field], after_error: Sequence[pa.Field] = ()) -> pa.Schema:
    """The record batch schema of the task ``kind``: ``key``, its ``columns``, ``error``, then ``after_error``."""
    return pa.schema([KEY, *columns, pa.field("error", ERROR), *after_error],
                     metadata={_KIND: kind.encode(), _FORMAT: FORMAT.encode()})


def kind_of(schema_: pa.Schema) -> str:
    """The task a schema of :func:`schema` holds the rows of."""
    return (schema_.metadata or {}).get(_KIND, b"").decode() or "classify"


# ----------------------------------------------------------------------------
# The columns a part holds after the model's (mxjob.results.part_format), and the names a carried column cannot take

#: A part's column after the result model's: each row's JSON line (the task's view of the row's own columns), made by
#: the task when the output is JSON Lines. The driver then writes JSON Lines by joining it, at the CPU cost of the
#: gzip lines it replaces, where rendering a million rows itself would cost it ten times that. For Parquet the task
#: leaves it null (:func:`part_format.write_part`): the same schema, so a resume may mix both kinds of part, and
#: :func:`jsonl_view.json_lines` renders a null line from the typed columns. Nothing ever reads a value out of it.
LINE = pa.field("json_line", pa.string())

#: A part's columns after :data:`LINE` under ``--with-object-metadata``: each object's ETag and length as the
#: task's GET read them (null where the download failed). The assembly's :func:`part_format.carry` puts them in
#: place of the key list's: a manifest names no ETag, may give no size, and may be older than the objects.
OBJECT_METADATA = pa.schema([pa.field("etag", pa.string()), pa.field("size", pa.int64())])

#: Names a carried column cannot take: the key, the error, the part's line, ``--with-object-metadata``'s, and every
#: registered task's columns, lower-cased (``mxjob.tasks.register`` adds them).
RESERVED: set[str] = {"key", "error", LINE.name, "etag", "size", "bucket"}


# ----------------------------------------------------------------------------
# Making a batch


class Results:
    """One batch's results, key by key, then one record batch (:meth:`record_batch`) of ``schema``.

    :meth:`add` takes a scored key's value as its task makes it (and, for a
    task whose value may carry its own error, that error); :meth:`fail` a
    failed key's error object (``mxjob.core.errors.error_object``). ``arrays``
    turns the rows' values into the task's columns (``Task.arrays``).
    """

    def __init__(self, schema_: pa.Schema, arrays: Callable[[pa.Schema, list], list[pa.Array]]):
        self.schema = schema_
        self.arrays = arrays
        self._rows: list[tuple] = []
        self.errors = 0

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, key: str, value, error: dict | None = None) -> None:
        self.errors += error is not None
        self._rows.append((key, value, error))

    def fail(self, key: str, error: dict) -> None:
        self.errors += 1
        self._rows.append((key, None, error))

    def fail_stage(self, key: str, stage: str, exc: BaseException) -> None:
        """:meth:`fail` with the error object of ``exc`` at ``stage``."""
        self.fail(key, error_object(stage, exc))

    def extend(self, other: Results) -> None:
        """Add ``other``'s rows (of the same schema) and errors: one micro-batch scored apart, on a forward lane."""
        self._rows.extend(other._rows)
        self.errors += other.errors

    def skip(self, key: str) -> None:
        """A row with neither a value nor an error (the UDF's null image)."""
        self._rows.append((key, None, None))

    def record_batch(self, sort: bool = True) -> pa.RecordBatch:
        """The rows as one record batch of :attr:`schema`, sorted by key unless ``sort`` is false."""
        rows = sorted(self._rows, key=lambda row: row[0]) if sort else self._rows
        keys = pa.array([row[0] for row in rows], pa.string())
        errors = pa.array([row[2] for row in rows], ERROR)
        values = self.arrays(self.schema, [row[1] for row in rows])
        error_at = self.schema.get_field_index("error")
        columns = [keys, *values[:error_at - 1], errors, *values[error_at - 1:]]
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


# ----------------------------------------------------------------------------
# Counting a batch: the tasks' stats (the run report's errors)


def error_kinds(batch: pa.RecordBatch, examples: int) -> dict:
    """The batch's failed keys by ``stage/type``: ``{"count": n, "examples": [key, ...]}`` (the run report's table)."""
    error = batch.column("error")
    if error.null_count == len(error):
        return {}
    failed = pc.is_valid(error)
    errors = error.filter(failed)
    kinds: dict[str, dict] = {}
    for key, stage, kind in zip(batch.column("key").filter(failed).to_pylist(), errors.field("stage").to_pylist(),
                                errors.field("type").to_pylist()):
        entry = kinds.setdefault(f"{stage}/{kind}", {"count": 0, "examples": []})
        entry["count"] += 1
        if len(entry["examples"]) < examples:
            entry["examples"].append(key)
    return kinds
