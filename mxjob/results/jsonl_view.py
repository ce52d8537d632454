"""The JSON Lines view of the result model: each row of a record batch as its JSON line.

``{"key": K, ...the task's members}`` or ``{"key": K, "error": {...}}``, the
job's documented output format (:func:`json_lines`), joined from the
columns' values without building each row's objects: a task writes the
members of its rows (its ``json_bodies``, with :func:`dumps`,
:func:`class_head` and :func:`number_lists`), this module the rest. A task
renders its part's lines (:func:`mxjob.results.part_format.write_part`), and
the assembly adds the key list's carried columns to them as members
(:func:`with_members`). :func:`objects` reads the lines back as the library's
and the dry run's Python objects.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.results.results import LINE

#: A task's members of each row after its key (``, "predictions": [...]}``), ``None`` for a row without a value.
Bodies = Callable[[pa.RecordBatch], list]
#: Characters ``json.dumps`` escapes in a string besides ``"`` and ``\\`` (with ``ensure_ascii=False``).
_CONTROL = r"[\x00-\x1f]"


def dumps(value) -> str:
    """``value`` as a line holds it: ``json.dumps`` with UTF-8 text as it is (``ensure_ascii=False``)."""
    return json.dumps(value, ensure_ascii=False)


def json_lines(batch: pa.RecordBatch, bodies: Bodies) -> list[str]:
    """The JSON line of each row, in row order: ``{"key": K, ...the task's members}`` or ``{"key": K, "error": {...}}``.

    Written without building each row's objects: a row's text is joined from
    its columns' values (``bodies``: the task's members), numbers as Python
    (float64) or Arrow (float32, the shortest text that reads back the same
    float32) write them.
    """
    index = batch.schema.get_field_index(LINE.name)
    if index >= 0:  # a part's rows
        if batch.column(index).null_count == 0:  # the task wrote their lines already
            return batch.column(index).to_pylist()
        # A part written without lines (write_part): the lines from the model's columns, then the carried ones.
        model, carried = batch.select(range(index)), batch.select(range(index + 1, batch.num_columns))
        return with_members(pa.array(json_lines(model, bodies), pa.string()), carried).to_pylist()
    keys = [dumps(k) for k in batch.column("key").to_pylist()]
    errors = batch.column("error")
    lines = []
    error_rows = errors.to_pylist() if errors.null_count < len(errors) else [None] * len(errors)
    for key, body, error in zip(keys, bodies(batch), error_rows):
        if body is None:
            body = ', "error": ' + dumps(error) + "}" if error is not None else "}"
        lines.append('{"key": ' + key + body)
    return lines


@functools.lru_cache(maxsize=65_536)  # the model's classes: their text is made once per worker
def class_head(class_id: int, label: str | None) -> str:
    """``{"class_id": C, "label": L, `` as ``json.dumps`` writes it (no label member without one)."""
    return f'{{"class_id": {class_id}, ' + (f'"label": {dumps(label)}, ' if label is not None else "")


def number_lists(array: pa.Array) -> list[str]:
    """Each list of numbers as ``a, b, c``: Arrow's shortest text per number, joined in C++."""
    as_list = pc.cast(array, pa.list_(array.type.value_type)) if pa.types.is_fixed_size_list(array.type) else array
    value_type = as_list.type.value_type
    if pa.types.is_float16(value_type):  # Arrow writes no half floats as text: the float32 of the same value
        as_list = pc.cast(as_list, pa.list_(pa.float32()))
    return pc.binary_join(pc.cast(as_list, pa.list_(pa.string())), ", ").to_pylist()


def objects(batch: pa.RecordBatch, bodies: Bodies) -> list[dict]:
    """Each row as the object its JSON line holds (:func:`json_lines`, read back): the dry run's sample."""
    return [json.loads(line) for line in json_lines(batch, bodies)]


def with_members(lines: pa.Array, carried: pa.RecordBatch) -> pa.Array:
    """Each line with ``carried``'s row appended as members before its closing brace (a null line stays null)."""
    if not carried.num_columns:
        return lines
    members = [pa.scalar(", " + dumps(name) + ": ", pa.string()) for name in carried.schema.names]
    texts = [_json_values(column) for column in carried.columns]
    return pc.binary_join_element_wise(pc.utf8_slice_codeunits(lines, 0, -1),
                                       *[piece for pair in zip(members, texts) for piece in pair],
                                       pa.scalar("}", pa.string()), "")


def _json_values(column: pa.Array) -> pa.Array:
    """Each value as JSON text (``json.dumps`` with ``ensure_ascii=False``): strings quoted, numbers, ``null``."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        text = column.cast(pa.string())
        if pc.any(pc.match_substring_regex(text, _CONTROL)).as_py():  # rare: json escapes them, Python does it
            text = pa.array([None if v is None else dumps(v)[1:-1] for v in text.to_pylist()], pa.string())
        else:
            text = pc.replace_substring(pc.replace_substring(text, "\\", "\\\\"), '"', '\\"')
        text = pc.binary_join_element_wise(pa.scalar('"', pa.string()), text, pa.scalar('"', pa.string()), "")
    else:
        text = pc.cast(column, pa.string())
    return pc.fill_null(text, "null")
