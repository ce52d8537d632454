"""How a record is declared, written and read: fields with a JSON type and a one-line meaning, in frozen dataclasses.

A field is *required* (always in the document; its value may still be
``null`` where its type is ``Optional``) or *optional* (left out of the
document when its value is :data:`ABSENT`). :func:`to_json` writes a record;
:func:`from_json` checks a document read back (field names, types, required
or optional) and raises a ``ValueError`` naming the bad field;
:func:`field_rows` and :func:`field_table` give the tables ``make docs``
writes (:mod:`mxjob.reporting.output_docs`). :mod:`mxjob.reporting.records`
declares the records.

Standard library only: ``python -m mxjob.reporting.watch`` runs where neither Spark nor MXNet is installed.
"""

import dataclasses
import typing
from typing import Any, Optional


class _Absent:
    """The value of an optional field that the document leaves out (``None`` is written as ``null``)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:  # `value or default` treats a field left out as it treats None
        return False


#: An optional field's value when its key is not written.
ABSENT: Any = _Absent()


def required(doc: str) -> Any:
    """A field every document has (``doc``: its meaning, one line, for the docs' table)."""
    return dataclasses.field(default=ABSENT, metadata={"doc": doc, "when": None})


def optional(doc: str, when: str) -> Any:
    """A field written only ``when`` (words for the docs' table); otherwise :data:`ABSENT`, its key left out."""
    return dataclasses.field(default=ABSENT, metadata={"doc": doc, "when": when})


def choice(doc: str, choices: tuple) -> Any:
    """A required string field that is one of ``choices`` (``doc`` names each: tests/unit/reporting/test_records.py
    checks it)."""
    return dataclasses.field(default=ABSENT, metadata={"doc": doc, "when": None, "choices": choices})


# Every field defaults to ABSENT, so that an optional field may sit between required ones in JSON order
# (dataclasses on Python 3.9 have no kw_only); from_json, not the constructor, says what is missing.
record = dataclasses.dataclass(frozen=True)


def to_json(value: Any) -> Any:
    """``value`` as JSON-ready data: a record as a dict in field order without its :data:`ABSENT` fields."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)
                if getattr(value, f.name) is not ABSENT}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def from_json(cls: type, doc: Any) -> Any:
    """``doc`` (a parsed JSON document) as a ``cls`` record, checked against its declaration.

    Raises
    ------
    ValueError
        Naming the first bad field by its path (``tasks.seconds``, ``python_workers.NAME.cpu``): a required
        field missing, a field the record does not declare, or a value of the wrong type or not one of its
        choices.
    """
    return _load(cls, doc, getattr(cls, "record_name", cls.__name__), "")


def _non_null(tp: Any) -> Any:
    """``X`` of ``Optional[X]`` (the only unions a record declares); any other type as it is."""
    if typing.get_origin(tp) is typing.Union:
        [tp] = [a for a in typing.get_args(tp) if a is not type(None)]
    return tp


def _load(tp: Any, value: Any, name: str, path: str) -> Any:
    if value is None and typing.get_origin(tp) is typing.Union:  # Optional[X]
        return None
    tp = _non_null(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return _load_record(tp, value, name, path)
    if origin is dict:
        _expect(isinstance(value, dict), "an object", value, name, path)
        return {k: _load(args[1], v, name, _join(path, k)) for k, v in value.items()}
    if origin is list:
        _expect(isinstance(value, list), "an array", value, name, path)
        return [_load(args[0], v, name, f"{path}[{i}]") for i, v in enumerate(value)]
    _check_scalar(tp, value, name, path)
    return value


def _check_scalar(tp: Any, value: Any, name: str, path: str) -> None:
    if tp is Any:
        return
    # bool is an int in Python, not in JSON: a count of True is a wrong document.
    if tp is float:
        _expect(isinstance(value, (int, float)) and not isinstance(value, bool), "a number", value, name, path)
    elif tp is int:
        _expect(isinstance(value, int) and not isinstance(value, bool), "an integer", value, name, path)
    else:
        _expect(isinstance(value, tp), JSON_TYPES[tp][1], value, name, path)


def _load_record(cls: type, value: Any, name: str, path: str) -> Any:
    _expect(isinstance(value, dict), "an object", value, name, path)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in value:
        if key not in fields:
            raise ValueError(f"{name}: unknown field {_join(path, key)!r}")
    hints, made = typing.get_type_hints(cls), {}
    for key, f in fields.items():
        where = _join(path, key)
        if key not in value:
            if f.metadata["when"] is None:
                raise ValueError(f"{name}: required field {where!r} is missing")
            continue
        made[key] = _load(hints[key], value[key], name, where)
        choices = f.metadata.get("choices")
        if choices and value[key] not in choices:
            raise ValueError(f"{name}: field {where!r} must be one of {', '.join(choices)}, got {value[key]!r}")
    return cls(**made)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _expect(ok: bool, wanted: str, value: Any, name: str, path: str) -> None:
    if not ok:
        raise ValueError(f"{name}: field {path or '(the document)'!r} must be {wanted}, got {value!r} "
                         f"({type(value).__name__})")


#: A Python type's JSON name in the docs, and how a message names it.
JSON_TYPES = {str: ("string", "a string"), int: ("integer", "an integer"), float: ("number", "a number"),
              bool: ("boolean", "a boolean")}


def type_text(tp: Any) -> str:
    """A field's type as the docs write it: ``integer``, ``number or null``, ``object of Host``, ``array of string``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return "any"
    if origin is typing.Union:
        return f"{type_text(_non_null(tp))} or null"
    if dataclasses.is_dataclass(tp):
        return "object"
    if origin is dict:  # a JSON object whose keys are names (executors, hosts), not fields
        return "object" if args[1] is Any else f"map to {type_text(args[1])}"
    if origin is list:
        return f"array of {type_text(args[0])}"
    return JSON_TYPES[tp][0]


def field_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(dotted name, type, when it is there, meaning)`` of every field of ``cls`` and of the records in it, in
    document order; a map's entries are named ``*`` (``executors.*.batches``)."""
    rows, hints = [], typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name, tp = f"{prefix}{f.name}", hints[f.name]
        rows.append((name, type_text(tp), f.metadata["when"] or "always", f.metadata["doc"]))
        inner = _record_in(tp)
        if inner is not None:
            rows += field_rows(inner[0], f"{name}{inner[1]}.")
    return rows


def _record_in(tp: Any) -> Optional[tuple]:
    """``(record, "" or ".*")``: the record a field holds, itself or as a map's values; else ``None``."""
    tp = _non_null(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return tp, ""
    if origin is dict and dataclasses.is_dataclass(args[1]):
        return args[1], ".*"
    return None


def field_table(cls: type) -> str:
    """The Markdown table of :func:`field_rows`."""
    lines = ["| field | type | present | meaning |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {tp} | {when} | {doc} |" for name, tp, when, doc in field_rows(cls)]
    return "\n".join(lines)
