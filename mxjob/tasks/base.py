"""A task: what the model makes of an image, and everything that follows from it, in one object.

Each task is a :class:`Task` in a module of its own (:mod:`mxjob.tasks.classify`,
``embed``, ``detect``, and ``custom``: classify's lines written by an
``output_handler``): the model class it binds, how an image is decoded for it,
how a micro-batch becomes rows, the columns those rows fill and their JSON
and Parquet views, the bytes a row takes, its options, its checks on the
driver and what the report says of it. The rest of the job asks the run's
task (:func:`get`, :meth:`Task.with_handlers`) and never compares a task's
name. :func:`register` is how a task joins: the built-ins call it as they are
imported, and so can a ``--plugin`` file's task.

Adding a task is a module here with its :class:`Task` registered, its import
in ``mxjob/tasks/__init__.py``, and its tests.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pyarrow as pa

from mxjob.model.handlers import HandlerError, Handlers
from mxjob.model.predictor import Predictor
from mxjob.model.preprocess import Preprocess, decode_image
from mxjob.results import jsonl_view, parquet_view, part_format, results


@dataclass(frozen=True)
class TaskOption:
    """One option of one task, as plain values: the executors and the library import no option table.

    :mod:`mxjob.options.settings` makes each the command line's and the
    YAML's option, refused with another task and in the fingerprint of its
    task's runs. ``kind``: ``count`` (a whole number of at least
    ``minimum``), ``number`` (a finite number from ``minimum`` to
    ``maximum``), ``choice`` (one of ``choices``), ``flag`` or ``text``.
    ``to``: ``executor`` (a ``JobSpec`` field the task reads as ``job.<name>``)
    or ``model`` (a ``ModelSpec`` field).
    """

    name: str
    flag: str
    help: str
    default: Any = None
    kind: str = "count"
    minimum: float = 1
    maximum: float | None = None
    choices: tuple = ()
    to: str = "executor"
    metavar: str | None = None
    show_default: str | None = None


class Task:
    """One task. A subclass sets the class attributes and implements :meth:`columns`, :meth:`score`,
    :meth:`arrays` and :meth:`json_bodies`; every other method has the default most tasks want."""

    #: ``--task``'s value, and the kind the schema's metadata names.
    name: ClassVar[str] = ""
    #: One line for ``--help``'s list of tasks; empty for a task ``--task`` does not offer (``custom``).
    summary: ClassVar[str] = ""
    #: The task's own options (:class:`TaskOption`), after ``--task`` in ``--help``.
    options: ClassVar[tuple] = ()
    #: The model class it binds: a :class:`Predictor` or a subclass.
    model_class: ClassVar[type] = Predictor
    #: Whether a ``--handler``'s ``input_handler`` may replace the job's decoding.
    takes_input_handler: ClassVar[bool] = True
    #: What each of its columns holds, for the output's readers (``docs/output.md``).
    meanings: ClassVar[dict] = {}
    #: Its columns' Parquet types where they are not the result model's (:func:`parquet_view.parquet_schema`).
    parquet_types: ClassVar[dict] = {}
    #: The keyword arguments of :meth:`columns` for an example of its rows (any gives the same column names).
    example_shape: ClassVar[dict] = {}
    #: ``docs/output.md``'s parts for it: ``(part name, the shape of :meth:`columns`, an Athena table, its location)``.
    doc_examples: ClassVar[tuple] = ()
    #: What the report says where its chart of top-1 labels would be, when the task makes none.
    no_labels: ClassVar[str] = "No top-1 labels: an output handler wrote the lines, or no image was predicted."

    # --- the rows' columns

    def columns(self, **shape) -> list[pa.Field]:
        """The columns between ``key`` and ``error``; ``shape``: what :meth:`shape` finds (an embedding's length)."""
        raise NotImplementedError

    def after_error(self) -> list[pa.Field]:
        """Columns after ``error`` (an ``output_handler``'s ``result``)."""
        return []

    def shape(self, job, model) -> dict:
        """The keyword arguments of :meth:`columns` for this run's ``job`` (a JobSpec) and loaded ``model``."""
        return {}

    def schema(self, **shape) -> pa.Schema:
        """The record batch schema of its rows (:func:`results.schema`)."""
        return results.schema(self.name, self.columns(**shape), self.after_error())

    def result_schema(self, job, model) -> pa.Schema:
        """The schema of this run's rows: :meth:`schema` at the run's :meth:`shape`."""
        return self.schema(**self.shape(job, model))

    def results(self, schema: pa.Schema | None = None) -> results.Results:
        """An empty batch of its rows (:class:`results.Results`), of ``schema`` (default: :meth:`schema`)."""
        return results.Results(schema if schema is not None else self.schema(), self.arrays)

    def arrays(self, schema: pa.Schema, values: list) -> list[pa.Array]:
        """The columns (all but ``key`` and ``error``, in order) of rows whose values are ``values``
        (``None`` for a failed row)."""
        raise NotImplementedError

    # --- scoring, on the executors and in the library

    def decode(self, data: bytes, preprocess: Preprocess):
        """An image's encoded bytes as the input :meth:`score` takes: the job's recipe, :func:`decode_image`."""
        return decode_image(data, preprocess)

    def score(self, model, keys: Sequence[str], inputs: list, job, out: results.Results) -> None:
        """One forward pass over ``inputs`` (one per key), a row per key into ``out``; failures are ``predict``
        errors (:func:`forward_or_fail`)."""
        raise NotImplementedError

    def with_handlers(self, handlers: Handlers | None) -> Task:
        """The task that serves a run with a ``--handler``'s ``handlers``: this one, or refused (:class:`HandlerError`).

        An ``output_handler`` replaces classify's top-k only (classify then
        answers with the ``custom`` task).
        """
        if handlers is not None and handlers.output_handler is not None:
            raise HandlerError(f"an output_handler replaces --task classify's top-k; --task {self.name} takes none")
        if handlers is not None and handlers.input_handler is not None and not self.takes_input_handler:
            raise HandlerError(f"--task {self.name} maps its results back through the job's own decoding; it takes "
                               "no input_handler")
        return self

    # --- its views

    def json_bodies(self, batch: pa.RecordBatch) -> list[str | None]:
        """Each row's JSON members after its key: ``, "name": value}``; ``None`` for a row without a value
        (:func:`jsonl_view.json_lines` writes its error)."""
        raise NotImplementedError

    def json_lines(self, batch: pa.RecordBatch) -> list[str]:
        """Each row's JSON line (:func:`jsonl_view.json_lines`)."""
        return jsonl_view.json_lines(batch, self.json_bodies)

    def objects(self, batch: pa.RecordBatch) -> list[dict]:
        """Each row as the object its JSON line holds (the dry run's sample)."""
        return jsonl_view.objects(batch, self.json_bodies)

    def write_part(self, batch: pa.RecordBatch, lines: bool, metadata: pa.RecordBatch | None = None) -> bytes:
        """A batch's part (:func:`part_format.write_part`), its JSON lines rendered when ``lines``."""
        return part_format.write_part(batch, self.json_bodies if lines else None, metadata)

    def parquet_schema(self, part_schema: pa.Schema, metadata: dict | None = None) -> pa.Schema:
        """The Parquet view's schema of its parts (:func:`parquet_view.parquet_schema`)."""
        return parquet_view.parquet_schema(part_schema, metadata, self.parquet_types)

    def top_labels(self, batch: pa.RecordBatch) -> dict[str, int]:
        """How often each label came first in ``batch``, for the report; ``{}`` for a task that makes no labels."""
        return {}

    # --- on the driver

    def row_bytes(self, settings, model_summary: dict) -> tuple[float, str]:
        """``(bytes, what)``: a row's task columns before compression (``--rows-per-file auto``), and in words.

        ``settings`` has the run's options as attributes; ``model_summary`` is
        the loaded model's (``Predictor.model_summary``).
        """
        return 64.0, "a value"

    def check(self, settings, facts) -> None:
        """Refuse (``ValueError`` with what to change) settings the loaded model cannot serve; ``facts`` is
        ``mxjob.executor.model_check.ModelFacts``."""

    def warnings(self, settings, parquet: bool) -> list[str]:
        """Lines to warn the user with before the run (``parquet``: the output is Parquet)."""
        return []

    def checked_spec(self, model_spec, facts):
        """The ``ModelSpec`` the executors load once the driver's check found ``facts`` (an embedding's layer)."""
        return model_spec

    def model_found_by_check(self, model_spec) -> bool:
        """Whether the driver's check of the model changes what the executors load (an embedding's layer, found):
        then they load it only after the check."""
        return False


def forward_or_fail(forward, keys: Sequence[str], out: results.Results):
    """``forward()``, or ``None`` after failing every key with its exception (a ``predict`` error)."""
    try:
        return forward()
    except Exception as exc:  # noqa: BLE001 - a failed forward marks its images, other batches go on
        for key in keys:
            out.fail_stage(key, "predict", exc)
        return None


# ----------------------------------------------------------------------------
# The registry


_TASKS: dict[str, Task] = {}


def register(task: Task) -> Task:
    """Add ``task`` under its name, replacing one of that name; returns it (``TASK = register(MyTask())``)."""
    if not task.name or not task.name.replace("_", "").isalnum():
        raise ValueError(f"a task's name is letters, digits and _, got {task.name!r}")
    _TASKS[task.name] = task
    # A manifest's carried column may take none of its columns' names.
    results.RESERVED.update(name.lower() for name in task.schema(**task.example_shape).names)
    return task


def unregister(name: str) -> None:
    """Take the task ``name`` out of the registry (a test's, once it is done with it)."""
    _TASKS.pop(name, None)


def get(name: str) -> Task:
    """The task ``name``; one not registered raises ``ValueError`` naming those that are."""
    try:
        return _TASKS[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), list(_TASKS), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ValueError(f"no task {name!r}{hint}; the tasks are {', '.join(names())}") from None


def names() -> tuple[str, ...]:
    """The tasks ``--task`` takes, in the order they were registered."""
    return tuple(name for name, task in _TASKS.items() if task.summary)


def every() -> tuple[Task, ...]:
    """Every registered task, ``custom`` among them."""
    return tuple(_TASKS.values())


def of_schema(schema: pa.Schema) -> Task:
    """The task whose rows a part's ``schema`` holds (its metadata names it)."""
    return get(results.kind_of(schema))
