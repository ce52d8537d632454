"""The JSON Lines view of the result model: each row of a record batch as its JSON line.

``{"key": K, ...the task's members}`` or ``{"key": K, "error": {...}}``, the
job's documented output format (:func:`json_lines`), joined from the
columns' values without building each row's objects. A task renders its
part's lines (:func:`mxjob.results.part_format.write_part`), and the assembly adds
the key list's carried columns to them as members (:func:`with_members`).
:func:`objects` reads the lines back as the library's and the dry run's
Python objects.
"""

from __future__ import annotations

import functools
import json

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.results.results import LINE, kind_of

#: Characters ``json.dumps`` escapes in a string besides ``"`` and ``\\`` (with ``ensure_ascii=False``).
_CONTROL = r"[\x00-\x1f]"


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
        return with_members(pa.array(json_lines(model), pa.string()), carried).to_pylist()
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


def with_members(lines: pa.Array, carried: pa.RecordBatch) -> pa.Array:
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
