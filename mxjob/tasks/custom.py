"""``custom``: a classify run whose lines a ``--handler``'s ``output_handler`` writes.

Not a ``--task`` of its own: classify answers with it when the handler has an
``output_handler`` (:meth:`ClassifyTask.with_handlers`). The rows keep
classify's columns, ``predictions`` always null, with the handler's JSON
object after ``error`` in ``result``; a handler's object may carry an error of
the job's shape, which fills ``error`` too (:func:`custom_value`).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa

from mxjob.model.handlers import HandlerError, Handlers
from mxjob.tasks.base import Task, forward_or_fail
from mxjob.tasks.classify import PREDICTION


def custom_value(text: str, obj: dict) -> tuple[str | None, dict | None]:
    """An ``output_handler``'s object (``obj``, written as ``text`` without its key) as ``(result, error)``.

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


class CustomTask(Task):
    """The ``output_handler``'s JSON object per image (``result``): the registered one renders rows; the one
    :meth:`with_handlers` makes holds the handlers that score them."""

    name = "custom"
    meanings: ClassVar[dict] = {"result": "the `output_handler`'s JSON object (with a `--handler` that has one)"}

    def __init__(self, handlers: Handlers | None = None):
        self.handlers = handlers

    def columns(self) -> list[pa.Field]:
        return [pa.field("predictions", pa.list_(PREDICTION))]

    def after_error(self) -> list[pa.Field]:
        return [pa.field("result", pa.string())]

    def arrays(self, schema: pa.Schema, values: list) -> list[pa.Array]:
        return [pa.nulls(len(values), schema.field("predictions").type), pa.array(values, pa.string())]

    def score(self, model, keys, inputs, job, out) -> None:
        outputs = forward_or_fail(lambda: model.predict(np.stack(inputs)), keys, out)
        if outputs is None:
            return
        for i, key in enumerate(keys):
            try:
                text, obj = self.handlers.output_json(key, [o[i] for o in outputs])
                out.add(key, *custom_value(text, obj))
            except Exception as exc:  # noqa: BLE001 - the user's code failing on one key fails that key
                out.fail_stage(key, "predict", exc)

    def with_handlers(self, handlers: Handlers | None) -> Task:
        """This task with ``handlers``, whose ``output_handler`` makes each row."""
        if handlers is None or handlers.output_handler is None:
            raise HandlerError("the custom task takes a --handler with an output_handler")
        return CustomTask(handlers)

    def json_bodies(self, batch: pa.RecordBatch) -> list[str | None]:
        """The output_handler's JSON object after the key, as the task wrote it (``{}`` gives ``{"key": K}``)."""
        return [None if text is None else (", " + text[1:] if text != "{}" else "}")
                for text in batch.column("result").to_pylist()]


#: The task (``mxjob/tasks/__init__.py`` registers it).
TASK = CustomTask()
