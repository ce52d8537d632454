"""The result model: one Arrow record batch per batch of images, one schema per task.

A task (``mxjob.partition.score_partition``) makes its batch's results as
one record batch (:class:`Results`), sorted by key, and makes it durable as
one part: an Arrow IPC file with zstd buffers (:func:`write_part`). The
driver's assembly reads the parts back (:func:`read_part`) and merges them
by their ``key`` column; the outputs are views of the same batches:

- JSON Lines: :func:`json_lines` (one line per row, the job's documented format);
- Parquet: :func:`parquet_schema` and :func:`parquet_batch` (a few casts, no parsing);
- Athena: :func:`athena_ddl`, the ``CREATE EXTERNAL TABLE`` that reads the Parquet output;
- the DataFrame UDF: :func:`udf_rows`, and its Spark type from :func:`schema`;
- the library's and the dry run's Python objects: :func:`objects`.

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
writes fixed-size lists as plain lists (:func:`parquet_schema` says why).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.errors import error_object

#: The part format; in the fingerprint (``durable.fingerprint``), so a resume never mixes formats.
FORMAT = "arrow-ipc-stream.zst/1"
#: The kinds of result: the tasks, and ``custom`` (a classify run with an ``output_handler``).
KINDS = ("classify", "custom", "embed", "detect")
_KIND = b"mxinfer.kind"
_FORMAT = b"mxinfer.format"

KEY = pa.field("key", pa.string())
ERROR = pa.struct([("stage", pa.string()), ("type", pa.string()), ("message", pa.string())])
PREDICTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("probability", pa.float64())])
#: The Parquet output's prediction: probability as float32 (Athena's ``float``).
PARQUET_PREDICTION = pa.struct([("class_id", pa.int32()), ("label", pa.string()), ("probability", pa.float32())])
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
    :meth:`fail` takes a failed key's error object (``mxjob.errors.error_object``).
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


# ----------------------------------------------------------------------------
# Parts: the durable form of a batch

#: A part's column after the result model's: each row's JSON line (:func:`json_lines` of the row's own columns),
#: made by the task when the output is JSON Lines. The driver then writes JSON Lines by joining it, at the CPU
#: cost of the gzip lines it replaces, where rendering a million rows itself would cost it ten times that. For
#: Parquet the task leaves it null (:func:`write_part`): the same schema, so a resume may mix both kinds of
#: part, and :func:`json_lines` renders a null line from the typed columns. Nothing ever reads a value out of it.
LINE = pa.field("json_line", pa.string())


#: A part's columns after :data:`LINE` under ``--with-object-metadata``: each object's ETag and length as the
#: task's GET read them (null where the download failed). The assembly's :func:`carry` puts them in place of
#: the key list's: a manifest names no ETag, may give no size, and may be older than the objects.
OBJECT_METADATA = pa.schema([pa.field("etag", pa.string()), pa.field("size", pa.int64())])


def object_metadata(keys: Iterable[str], seen: dict) -> pa.RecordBatch:
    """:data:`OBJECT_METADATA` for ``keys`` from ``seen`` (``{key: (etag, size)}``; a key not in it: nulls)."""
    etags, sizes = [], []
    for key in keys:
        etag, size = seen.get(key, (None, None))
        etags.append(etag)
        sizes.append(size)
    return pa.RecordBatch.from_arrays([pa.array(etags, pa.string()), pa.array(sizes, pa.int64())],
                                      schema=OBJECT_METADATA)


def write_part(batch: pa.RecordBatch, lines: bool = True, metadata: pa.RecordBatch | None = None) -> bytes:
    """``batch`` and its JSON lines (:data:`LINE`) as one Arrow IPC stream in one zstd frame.

    What a task PUTs under ``OUTPUT.parts/``; :func:`read_part` reads it.
    One frame, not Arrow's per-buffer compression: a part is small (a batch),
    and decompressing each of its twenty-odd buffers apart costs the driver
    five times as much.

    Parameters
    ----------
    batch : pyarrow.RecordBatch
        The batch's results (:meth:`Results.record_batch`).
    lines : bool
        Render each row's JSON line into :data:`LINE` (the output is JSON
        Lines); false leaves the column null (Parquet, which never reads it):
        :func:`json_lines` renders the same text from the typed columns
        should a JSON Lines output ever take the part.
    metadata : pyarrow.RecordBatch, optional
        The rows' :data:`OBJECT_METADATA` (:func:`object_metadata`), appended after the line.
    """
    text = pa.array(json_lines(batch), pa.string()) if lines else pa.nulls(batch.num_rows, pa.string())
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


#: Names a carried column cannot take: every kind's own columns, the part's line, and ``--with-object-metadata``'s.
RESERVED = frozenset({"key", "error", "predictions", "embedding", "detections", "image_size", "result", LINE.name,
                      "etag", "size", "bucket"})
#: Characters ``json.dumps`` escapes in a string besides ``"`` and ``\\`` (with ``ensure_ascii=False``).
_CONTROL = r"[\x00-\x1f]"


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
        batch = batch.set_column(index, LINE, _with_members(batch.column(index), carried))
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


def _with_members(lines: pa.Array, carried: pa.RecordBatch) -> pa.Array:
    """Each line with ``carried``'s row appended as members before its closing brace (a null line stays null)."""
    if not carried.num_columns:
        return lines
    members = [pa.scalar(", " + _dumps(name) + ": ", pa.string()) for name in carried.schema.names]
    texts = [_json_values(column) for column in carried.columns]
    return pc.binary_join_element_wise(pc.utf8_slice_codeunits(lines, 0, -1),
                                       *[piece for pair in zip(members, texts) for piece in pair],
                                       pa.scalar("}", pa.string()), "")


def _json_values(column: pa.Array) -> pa.Array:
    """Each value as JSON text (``json.dumps`` with ``ensure_ascii=False``): strings quoted, numbers, ``null``."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = column.cast(pa.string())
        if pc.any(pc.match_substring_regex(text, _CONTROL)).as_py():  # rare: json escapes them, Python does it
            text = pa.array([None if v is None else _dumps(v)[1:-1] for v in text.to_pylist()], pa.string())
        else:
            text = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
        text = pc.binary_join_element_wise(pa.scalar('"', pa.string()), text, pa.scalar('"', pa.string()), "")
    else:
        text = pc.cast(column, pa.string())
    return pc.fill_null(text, "null")


def model_columns(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` without a part's :data:`LINE` column: the result model alone."""
    index = batch.schema.get_field_index(LINE.name)
    return batch if index < 0 else batch.drop_columns([LINE.name])


# ----------------------------------------------------------------------------
# Views: JSON Lines


def _dumps(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def json_lines(batch: pa.RecordBatch) -> list[str]:
    """The JSON line of each row, in row order: ``{"key": K, ...the task's members}`` or ``{"key": K, "error": {...}}``.

    Written without building each row's objects: a row's text is joined from
    its columns' values, numbers as Python (float64) or Arrow (float32, the
    shortest text that reads back the same float32) write them.
    """
    index = batch.schema.get_field_index(LINE.name)
    if index >= 0:  # a part's rows
        if batch.column(index).null_count == 0:  # the task wrote their lines already
            return batch.column(index).to_pylist()
        # A part written without lines (write_part): the lines from the model's columns, then the carried ones.
        model = pa.RecordBatch.from_arrays(batch.columns[:index], schema=_leading(batch.schema, index))
        carried = pa.RecordBatch.from_arrays(batch.columns[index + 1:],
                                             schema=pa.schema(list(batch.schema)[index + 1:]))
        return _with_members(pa.array(json_lines(model), pa.string()), carried).to_pylist()
    kind = kind_of(batch.schema)
    keys = [_dumps(k) for k in batch.column("key").to_pylist()]
    errors = batch.column("error")
    bodies = _BODIES[kind](batch)
    lines = []
    error_rows = errors.to_pylist() if errors.null_count < len(errors) else None
    for i, (key, body) in enumerate(zip(keys, bodies)):
        if body is None:
            error = error_rows[i] if error_rows is not None else None
            body = ', "error": ' + _dumps(error) + "}" if error is not None else "}"
        lines.append('{"key": ' + key + body)
    return lines


def _leading(schema_: pa.Schema, count: int) -> pa.Schema:
    """The first ``count`` fields of ``schema_``, with its metadata (the kind)."""
    return pa.schema(list(schema_)[:count], metadata=schema_.metadata)


@functools.lru_cache(maxsize=65_536)  # the model's classes: their text is made once per worker
def _entry_head(class_id: int, label: str | None) -> str:
    """``{"class_id": C, "label": L, `` as ``json.dumps`` writes it (no label member without one)."""
    return f'{{"class_id": {class_id}, ' + (f'"label": {_dumps(label)}, ' if label is not None else "")


@functools.lru_cache(maxsize=65_536)
def _prediction_head(class_id: int, label: str | None) -> str:
    """``{"class_id": C, "label": L, "probability": ``: a prediction's text up to its probability."""
    return _entry_head(class_id, label) + '"probability": '


def _classify_bodies(batch: pa.RecordBatch) -> list[str | None]:
    """``, "predictions": [...]}`` per row (``None`` for a row without predictions); no label member without labels."""
    column = batch.column("predictions")
    offsets = column.offsets.to_numpy()
    start, stop = int(offsets[0]), int(offsets[-1])
    entries = column.values.slice(start, stop - start)
    class_ids = entries.field("class_id").to_pylist()
    labels = entries.field("label").to_pylist()
    probabilities = entries.field("probability").to_pylist()
    texts = [_prediction_head(c, label) + repr(p) + "}" for c, label, p in zip(class_ids, labels, probabilities)]
    valid = column.is_valid().to_pylist()
    return [', "predictions": [' + ", ".join(texts[a - start:b - start]) + "]}" if ok else None
            for ok, a, b in zip(valid, offsets[:-1].tolist(), offsets[1:].tolist())]


def _custom_bodies(batch: pa.RecordBatch) -> list[str | None]:
    """The output_handler's JSON object after the key, as the task wrote it (``{}`` gives ``{"key": K}``)."""
    return [None if text is None else (", " + text[1:] if text != "{}" else "}")
            for text in batch.column("result").to_pylist()]


def _number_lists(array: pa.Array) -> list[str]:
    """Each list of numbers as ``a, b, c``: Arrow's shortest text per number, joined in C++."""
    as_list = pc.cast(array, pa.list_(array.type.value_type)) if pa.types.is_fixed_size_list(array.type) else array
    value_type = as_list.type.value_type
    if pa.types.is_float16(value_type):  # Arrow writes no half floats as text: the float32 of the same value
        as_list = pc.cast(as_list, pa.list_(pa.float32()))
    return pc.binary_join(pc.cast(as_list, pa.list_(pa.string())), ", ").to_pylist()


def _embed_bodies(batch: pa.RecordBatch) -> list[str | None]:
    return [None if text is None else ', "embedding": [' + text + "]}"
            for text in _number_lists(batch.column("embedding"))]


def _detect_bodies(batch: pa.RecordBatch) -> list[str | None]:
    sizes = batch.column("image_size")
    detections = batch.column("detections")
    offsets = detections.offsets.to_numpy()
    start, stop = int(offsets[0]), int(offsets[-1])
    entries = detections.values.slice(start, stop - start)
    scores = pc.cast(entries.field("score"), pa.string()).to_pylist()
    boxes = _number_lists(entries.field("box"))
    labels = entries.field("label").to_pylist()
    texts = [_entry_head(c, label) + f'"score": {score}, "box": [{box}]}}'
             for c, label, score, box in zip(entries.field("class_id").to_pylist(), labels, scores, boxes)]
    out = []
    for size, a, b in zip(sizes.to_pylist(), offsets[:-1].tolist(), offsets[1:].tolist()):
        out.append(None if size is None else f', "image_size": [{size[0]}, {size[1]}], "detections": ['
                   + ", ".join(texts[a - start:b - start]) + "]}")
    return out


_BODIES = {"classify": _classify_bodies, "custom": _custom_bodies, "embed": _embed_bodies,
           "detect": _detect_bodies}


def objects(batch: pa.RecordBatch) -> list[dict]:
    """Each row as the object its JSON line holds (:func:`json_lines`, read back): the dry run's sample."""
    return [json.loads(line) for line in json_lines(batch)]


# ----------------------------------------------------------------------------
# Views: Parquet


def parquet_schema(part_schema: pa.Schema, metadata: dict[str, str] | None = None) -> pa.Schema:
    """The Parquet output's schema for parts of ``part_schema``: probability as float32; ``metadata`` added.

    The columns are the parts' (``key``, the task's, ``error``, and
    ``result`` for an ``output_handler``); Athena, Glue and Spark read them as
    they are. Fixed-size lists (``embedding``, ``image_size``, ``box``) are
    written as plain lists, which Parquet stores the same way: pyarrow up to
    at least 20 cannot read a fixed-size list back from Parquet once one row
    is null (an error row), so a file of one failed image would be unreadable
    to pyarrow and pandas. ``metadata`` (the run's provenance) goes to the
    file's key-value metadata.
    """
    fields = [pa.field("predictions", pa.list_(PARQUET_PREDICTION)) if f.name == "predictions"
              else f.with_type(_variable_lists(f.type)) for f in part_schema if f.name != LINE.name]
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


# ----------------------------------------------------------------------------
# Views: the DataFrame UDF


def udf_rows(batch: pa.RecordBatch) -> list[tuple[list[dict] | None, dict | None]]:
    """Per row of a classify batch, ``(predictions, error)`` as :func:`mxjob.udf.model_udf` returns them."""
    return list(zip(batch.column("predictions").to_pylist(), batch.column("error").to_pylist()))


def udf_schema(kind: str = "classify") -> pa.Schema:
    """The UDF's struct: the kind's columns less ``key``."""
    full = schema(kind)
    return pa.schema([f for f in full if f.name != "key"])


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


# ----------------------------------------------------------------------------
# Views: an Athena table over the Parquet output

#: Athena's DDL keywords (its "reserved keywords to escape in DDL statements"): a name among them needs backticks.
ATHENA_RESERVED = frozenset("""
    all alter and array as authorization between bigint binary boolean both by case cashe cast char column conf
    constraint commit create cross cube current current_date current_timestamp cursor database date dayofweek
    decimal delete describe distinct div double drop else end exchange exists extended external extract false fetch
    float floor following for foreign from full function grant group grouping having if import in inner insert int
    integer intersect interval into is join lateral left less like local macro map more none not null numeric of on
    only or order out outer over partialscan partition percent preceding precision preserve primary procedure range
    reads reduce regexp references revoke right rlike rollback rollup row rows select set smallint start table
    tablesample then time timestamp to transform trigger true truncate unbounded union uniquejoin update user using
    utc_timestamp values varchar views when where window with
""".split())
#: Arrow's scalar types as Athena's (Hive DDL) column types.
_ATHENA_SCALARS = {pa.string(): "string", pa.large_string(): "string", pa.int8(): "tinyint", pa.int16(): "smallint",
                   pa.int32(): "int", pa.int64(): "bigint", pa.float32(): "float", pa.float64(): "double",
                   pa.bool_(): "boolean", pa.binary(): "binary", pa.large_binary(): "binary"}
#: Why a half-float column gets no table: pyarrow writes it as Parquet's FLOAT16 logical type
#: (2-byte FIXED_LEN_BYTE_ARRAY), which Athena's Trino engine refuses and Spark 3.5's Parquet reader cannot open.
_FLOAT16_REFUSAL = ("float16 is written as Parquet's FLOAT16 logical type, which Athena (and Spark 3.5) cannot "
                    "read: leave --embedding-dtype at float32 for a table")


def athena_type(type_: pa.DataType, column: str) -> str:
    """The Athena (Hive DDL) type of an Arrow type as the job writes it to Parquet.

    Lists of any kind (``list``, ``large_list``, ``fixed_size_list``) are
    ``array<...>``; structs ``struct<name:type,...>``. A type Athena cannot
    read, or that has no mapping here, raises ``ValueError`` naming ``column``.
    """
    if type_ in _ATHENA_SCALARS:
        return _ATHENA_SCALARS[type_]
    if pa.types.is_float16(type_):
        raise ValueError(f"column {column}: {_FLOAT16_REFUSAL}")
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return f"array<{athena_type(type_.value_type, column)}>"
    if pa.types.is_struct(type_):
        members = [f"{athena_name(field.name)}:{athena_type(field.type, f'{column}.{field.name}')}"
                   for field in type_]
        return f"struct<{','.join(members)}>"
    raise ValueError(f"column {column}: Arrow type {type_} has no Athena type here")


def athena_name(name: str) -> str:
    """``name`` as an Athena DDL identifier: in backticks when it is a DDL keyword or not letters, digits and ``_``."""
    if "`" in name or not name:
        raise ValueError(f"{name!r} cannot be an Athena name (empty, or holds a backtick)")
    plain = name.isascii() and name[0].isalpha() and all(c.isalnum() or c == "_" for c in name)
    return name if plain and name.lower() not in ATHENA_RESERVED else f"`{name}`"


def athena_ddl(schema_: pa.Schema, table: str, location: str) -> str:
    """The ``CREATE EXTERNAL TABLE`` statement that lets Athena read Parquet files of ``schema_``.

    Parameters
    ----------
    schema_ : pyarrow.Schema
        The Parquet output's schema: :func:`parquet_schema`, or ``pq.read_schema`` of an output file.
    table : str
        The table, ``name`` or ``database.name``.
    location : str
        The S3 folder that holds the Parquet files and nothing else Athena would read:
        ``s3://bucket/prefix/``, with its trailing slash.

    Returns
    -------
    str
        One statement: every column in the schema's order, each with its Athena type,
        ``STORED AS PARQUET`` and ``LOCATION``. No compression property: it is for
        writing, and each Parquet column chunk names its own codec.

    Raises
    ------
    ValueError
        A column of a type Athena cannot read (``float16``) or that has no mapping,
        two names Athena would take as one (it lower-cases them), or a location
        that is not an S3 folder.

    Examples
    --------
    >>> print(athena_ddl(pa.schema([("key", pa.string())]), "photos", "s3://b/p/"))
    CREATE EXTERNAL TABLE photos (
      key string
    )
    STORED AS PARQUET
    LOCATION 's3://b/p/';
    """
    if not (location.startswith("s3://") and location.endswith("/") and len(location) > len("s3://") + 1) \
            or "'" in location:
        raise ValueError(f"LOCATION must be an S3 folder, s3://bucket/prefix/ with a trailing slash: {location!r}")
    seen: dict[str, str] = {}
    for name in schema_.names:
        if name.lower() in seen:
            raise ValueError(f"columns {seen[name.lower()]} and {name}: Athena lower-cases names, so they clash")
        seen[name.lower()] = name
    columns = [f"  {athena_name(field.name)} {athena_type(field.type, field.name)}" for field in schema_]
    name = ".".join(athena_name(part) for part in table.split("."))
    return (f"CREATE EXTERNAL TABLE {name} (\n" + ",\n".join(columns) + "\n)\nSTORED AS PARQUET\n"
            f"LOCATION '{location}';")
