"""The result model: one Arrow record batch per batch of images, one schema per task.

A task (``mxjob.executor.partition.score_partition``) makes its batch's results as
one record batch (:class:`Results`), sorted by key, and makes it durable as
one part (:mod:`mxjob.results.part_format`); the driver's assembly reads the parts back and
merges them by their ``key`` column. The outputs are views of the same
batches, each in its own module:

- JSON Lines: :mod:`mxjob.results.jsonl_view` (one line per row, the job's documented format);
- Parquet: :mod:`mxjob.results.parquet_view` (a few casts, no parsing);
- Athena: :mod:`mxjob.results.athena_table`, the ``CREATE EXTERNAL TABLE`` that reads the Parquet output;
- the DataFrame UDF: :mod:`mxjob.executor.udf`;
- the library's and the dry run's Python objects: :func:`mxjob.results.jsonl_view.objects`.

The schema (:func:`schema`) is ``key``, the task's columns, then ``error``
(``struct<stage, type, message>``, null when the image was scored)::

    classify  predictions list<struct<class_id int32, label string, probability float64>>
    custom    predictions (always null), error, then result string: an output_handler's JSON object
    embed     embedding fixed_size_list<float32 or float16>[D]
    detect    image_size fixed_size_list<int32>[2],
              detections list<struct<class_id int32, label string, score float32, box fixed_size_list<float32>[4]>>

The kind and this module's format version are in the schema's metadata, so a
part says what it holds. ``probability`` is float64 holding the job's value
(6 significant digits, ``float(f"{p:.6g}")``): JSON Lines writes exactly that
number, and the Parquet view casts it to float32 as it always has; it also
writes fixed-size lists as plain lists (:func:`mxjob.results.parquet_view.parquet_schema`
says why). The columns a part holds after the model's (:data:`LINE`,
:data:`OBJECT_METADATA`) and the names a carried column cannot take
(:data:`RESERVED`) are declared here too; :func:`error_kinds` and
:func:`top_labels` count a batch for the tasks' stats.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core.errors import error_object

#: The part format; in the fingerprint (``durable.fingerprint``), so a resume never mixes formats.
FORMAT = "arrow-ipc-stream.zst/1"
#: The kinds of result: the tasks, and ``custom`` (a classify run with an ``output_handler``).
KINDS = ("classify", "custom", "embed", "detect")
_KIND = b"mxinfer.kind"
_FORMAT = b"mxinfer.format"

KEY = pa.field("key", pa.string())
ERROR = pa.struct([("stage", pa.string()), ("type", pa.string()), ("message", pa.string())])
PREDICTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("probability", pa.float64())])
BOX = pa.list_(pa.float32(), 4)
DETECTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("score", pa.float32()), ("box", BOX)])
IMAGE_SIZE = pa.list_(pa.int32(), 2)
_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}
#: What each column of :func:`schema` holds, for a reader of the output (``docs/output.md`` is made from it).
MEANINGS = {
    "key": "the image's key in the input bucket; rows are sorted by it",
    "predictions": "the top `--top-k` classes, highest probability first (ties: lower class id first); "
                   "`label` is null without labels; null for an error row",
    "embedding": "the layer's output as one vector of D numbers (unit length with `--normalize`); "
                 "null for an error row",
    "image_size": "`[W, H]` of the image as its EXIF orientation shows it; null for an error row",
    "detections": "boxes scoring at least `--min-score`, best first, at most `--max-detections`; "
                  "`box` is `[xmin, ymin, xmax, ymax]` in pixels of that upright image; `label` is null "
                  "without labels; null for an error row",
    "error": "why the image has no result: `stage` (`download`, `decode` or `predict`), the exception's `type` "
             "and `message`; null for a scored row",
    "result": "the `output_handler`'s JSON object (with a `--handler` that has one)",
}


def schema(kind: str, *, dimension: int | None = None, dtype: str = "float32") -> pa.Schema:
    """The record batch schema of ``kind`` (one of :data:`KINDS`).

    Parameters
    ----------
    kind : str
        ``classify``, ``custom``, ``embed`` or ``detect``.
    dimension : int, optional
        ``embed``: the vectors' length ``D``.
    dtype : str
        ``embed``: ``float32`` or ``float16``.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind in ("classify", "custom"):
        columns = [pa.field("predictions", pa.list_(PREDICTION))]
    elif kind == "embed":
        if not dimension or dimension < 1:
            raise ValueError(f"an embedding needs a dimension of at least 1, got {dimension}")
        columns = [pa.field("embedding", pa.list_(_DTYPES[dtype], int(dimension)))]
    else:
        columns = [pa.field("image_size", IMAGE_SIZE), pa.field("detections", pa.list_(DETECTION))]
    fields = [KEY, *columns, pa.field("error", ERROR)]
    if kind == "custom":
        fields.append(pa.field("result", pa.string()))
    return pa.schema(fields, metadata={_KIND: kind.encode(), _FORMAT: FORMAT.encode()})


def kind_of(schema_: pa.Schema) -> str:
    """The kind a schema of :func:`schema` holds."""
    return (schema_.metadata or {}).get(_KIND, b"").decode() or "classify"


# ----------------------------------------------------------------------------
# The columns a part holds after the model's (mxjob.results.part_format), and the names a carried column cannot take

#: A part's column after the result model's: each row's JSON line (:func:`jsonl_view.json_lines` of the row's own
#: columns), made by the task when the output is JSON Lines. The driver then writes JSON Lines by joining it, at the
#: CPU cost of the gzip lines it replaces, where rendering a million rows itself would cost it ten times that. For
#: Parquet the task leaves it null (:func:`part_format.write_part`): the same schema, so a resume may mix both
#: kinds of part, and :func:`jsonl_view.json_lines` renders a null line from the typed columns. Nothing ever reads
#: a value out of it.
LINE = pa.field("json_line", pa.string())

#: A part's columns after :data:`LINE` under ``--with-object-metadata``: each object's ETag and length as the
#: task's GET read them (null where the download failed). The assembly's :func:`part_format.carry` puts them in
#: place of the key list's: a manifest names no ETag, may give no size, and may be older than the objects.
OBJECT_METADATA = pa.schema([pa.field("etag", pa.string()), pa.field("size", pa.int64())])

#: Names a carried column cannot take: every kind's own columns, the part's line, and ``--with-object-metadata``'s.
RESERVED = frozenset({"key", "error", "predictions", "embedding", "detections", "image_size", "result", LINE.name,
                      "etag", "size", "bucket"})


# ----------------------------------------------------------------------------
# Making a batch


def prediction_entries(labelled: Iterable[tuple[int, str | None, float]]) -> list[dict]:
    """Top-k ``(class_id, label, probability)`` as the ``predictions`` column's rows: the job's 6 significant digits."""
    return [{"class_id": c, "label": label, "probability": float(f"{p:.6g}")} for c, label, p in labelled]


def detection_entries(detections: Iterable[tuple]) -> list[dict]:
    """``(class_id, label, score, box)`` tuples (``ObjectDetector.detect``) as the ``detections`` column's rows."""
    return [{"class_id": c, "label": label, "score": score, "box": list(box)} for c, label, score, box in detections]


class Results:
    """One batch's results, key by key, then one record batch (:meth:`record_batch`).

    :meth:`add` takes a scored key's value, as the kind has it: classify, the
    :func:`prediction_entries`; embed, a vector; detect, ``(image_size,
    detection_entries)``; custom, ``(result JSON or None, error or None)``.
    :meth:`fail` takes a failed key's error object (``mxjob.core.errors.error_object``).
    """

    def __init__(self, schema_: pa.Schema):
        self.schema = schema_
        self.kind = kind_of(schema_)
        self._rows: list[tuple] = []
        self.errors = 0

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, key: str, value) -> None:
        if self.kind == "custom":
            result, error = value
            self.errors += error is not None
            self._rows.append((key, result, error))
        else:
            self._rows.append((key, value, None))

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
        keys = [row[0] for row in rows]
        values = [row[1] for row in rows]
        errors = pa.array([row[2] for row in rows], ERROR)
        columns = [pa.array(keys, pa.string()), *_value_columns(self.schema, self.kind, values), errors]
        if self.kind == "custom":
            columns.append(pa.array(values, pa.string()))
        return pa.RecordBatch.from_arrays(columns, schema=self.schema)


def _value_columns(schema_: pa.Schema, kind: str, values: list) -> list[pa.Array]:
    if kind == "custom":
        return [pa.nulls(len(values), schema_.field("predictions").type)]
    if kind == "classify":
        return [pa.array(values, schema_.field("predictions").type)]
    if kind == "embed":
        return [_vectors(values, schema_.field("embedding").type)]
    sizes = pa.array([v[0] if v is not None else None for v in values], IMAGE_SIZE)
    detections = pa.array([v[1] if v is not None else None for v in values], pa.list_(DETECTION))
    return [sizes, detections]


def _vectors(values: list, type_: pa.FixedSizeListType) -> pa.Array:
    """Vectors (``None`` for a failed row) as one fixed-size list array, built from one numpy block."""
    size, dtype = type_.list_size, type_.value_type.to_pandas_dtype()
    block = np.zeros((len(values), size), dtype)
    missing = np.zeros(len(values), bool)
    for i, value in enumerate(values):
        if value is None:
            missing[i] = True
        else:
            block[i] = value
    return pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), size, mask=pa.array(missing))


def custom_value(text: str, obj: dict) -> tuple[str | None, dict | None]:
    """An ``output_handler``'s object (``obj``, written as ``text`` without its key) as a ``custom`` row's value.

    An ``error`` member shaped as the job's error object (stage, type, message,
    in that order) fills the ``error`` column too; an object of nothing else
    is that error alone, as a failed key's row.
    """
    error = obj.get("error")
    fits = isinstance(error, dict) and list(error) == ["stage", "type", "message"] and all(
        isinstance(v, str) for v in error.values())
    if not fits:
        return text, None
    return (None if list(obj) == ["error"] else text), error


# ----------------------------------------------------------------------------
# Counting a batch: the tasks' stats (the run report's errors and top-1 labels)


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


def top_labels(batch: pa.RecordBatch) -> dict[str, int]:
    """How often each class came first in the batch's ``predictions`` (its label, else its id); ``{}`` without them."""
    if "predictions" not in batch.schema.names:
        return {}
    predictions = batch.column("predictions")
    predictions = predictions.filter(pc.greater(pc.list_value_length(predictions), 0))
    counts: dict[str, int] = {}
    if len(predictions):
        first = pc.list_element(predictions, 0)  # one struct array: its fields as columns, no dict per row
        for label, class_id in zip(first.field("label").to_pylist(), first.field("class_id").to_pylist()):
            name = str(label if label is not None else class_id)
            counts[name] = counts.get(name, 0) + 1
    return counts
