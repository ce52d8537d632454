"""The generated parts of ``docs/output.md`` and ``docs/configuration.md``: each task's Parquet columns and its
Athena table, and the fields of the run's summary, status file and dry-run plan.

Each part is made from the tasks (their schemas, Parquet views, meanings and
:attr:`mxjob.tasks.Task.doc_examples`) and :func:`mxjob.results.athena_table.athena_ddl`,
or from the records' declarations (:func:`mxjob.reporting.record_fields.field_table`), so the
pages cannot drift from what the job writes. It sits in the page between two marker comments::

    <!-- generated: embed (make docs; tests/unit/reporting/test_output_docs.py keeps it equal) -->
    ...
    <!-- end generated: embed -->

``make docs`` rewrites what is between them (``python -m mxjob.reporting.output_docs ROOT``);
the text around them is written by hand.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from mxjob import tasks
from mxjob.reporting import record_fields, records
from mxjob.results import athena_table, results

#: The page the Parquet parts go into, relative to the checkout.
PAGE = os.path.join("docs", "output.md")
#: The page that describes ``--dry-run``, where the plan's fields go.
CONFIG_PAGE = os.path.join("docs", "configuration.md")
#: The record tables of each page: ``(part name, record)``.
RECORD_PARTS = {
    PAGE: (("summary-fields", records.Summary), ("status-fields", records.Status)),
    CONFIG_PAGE: (("plan-fields", records.Plan),),
}


@dataclass(frozen=True)
class Example:
    """One generated part: a task's Parquet schema, and the Athena table an example reads it into."""

    name: str
    schema: pa.Schema
    table: str
    location: str
    meanings: dict


def examples() -> list[Example]:
    """The parts of the page, in its order: each task's (:attr:`mxjob.tasks.Task.doc_examples`)."""
    return [Example(name, task.parquet_schema(task.schema(**shape)), table, location,
                    {**results.MEANINGS, **task.meanings})
            for task in map(tasks.get, tasks.names()) for name, shape, table, location in task.doc_examples]


def arrow_text(type_: pa.DataType) -> str:
    """An Arrow type as the docs write it: ``list<struct<class_id: int32, ...>>``, ``fixed_size_list<float32>[4]``."""
    if pa.types.is_fixed_size_list(type_):
        return f"fixed_size_list<{arrow_text(type_.value_type)}>[{type_.list_size}]"
    if pa.types.is_list(type_) or pa.types.is_large_list(type_):
        return f"list<{arrow_text(type_.value_type)}>"
    if pa.types.is_struct(type_):
        return "struct<" + ", ".join(f"{f.name}: {arrow_text(f.type)}" for f in type_) + ">"
    return {"float": "float32", "halffloat": "float16", "double": "float64"}.get(str(type_), str(type_))


def part(example: Example) -> str:
    """The Markdown of one part: the columns (name, Arrow type, Athena type, meaning), then the table's DDL."""
    rows = ["| column | Arrow (Parquet) type | Athena type | what it holds |", "|---|---|---|---|"]
    for field in example.schema:
        try:
            athena = f"`{athena_table.athena_type(field.type, field.name)}`"
        except ValueError:
            athena = "none (below)"
        rows.append(f"| `{field.name}` | `{arrow_text(field.type)}` | {athena} | {example.meanings[field.name]} |")
    try:
        table = "```sql\n" + athena_table.athena_ddl(example.schema, example.table, example.location) + "\n```"
    except ValueError as exc:
        table = f"No Athena table: {exc}."
    return "\n".join(rows) + "\n\n" + table


def _fill(page: str, where: str, name: str, text: str) -> str:
    """``page`` (the file ``where``) with ``text`` between the markers of part ``name``; ValueError without them."""
    begin = f"<!-- generated: {name} (make docs; tests/unit/reporting/test_output_docs.py keeps it equal) -->"
    end = f"<!-- end generated: {name} -->"
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(page):
        raise ValueError(f"{where} lacks the markers of the generated part {name!r}: {begin}")
    return pattern.sub(lambda _: f"{begin}\n{text}\n{end}", page, count=1)


def render(page: str, where: str = PAGE) -> str:
    """``page``, the text of the file ``where`` (:data:`PAGE` or :data:`CONFIG_PAGE`), with every part between
    its markers made anew; a part whose markers are missing raises ValueError."""
    if where == PAGE:
        for example in examples():
            page = _fill(page, where, example.name, part(example))
    for name, record in RECORD_PARTS[where]:
        page = _fill(page, where, name, record_fields.field_table(record))
    return page


if __name__ == "__main__":  # python -m mxjob.reporting.output_docs ROOT: rewrite the generated parts (make docs)
    import sys

    root = sys.argv[1] if len(sys.argv) > 1 else "."
    for where in (PAGE, CONFIG_PAGE):
        path = os.path.join(root, where)
        Path(path).write_text(render(Path(path).read_text(encoding="utf-8"), where), encoding="utf-8")
        print(f"wrote {path}")
