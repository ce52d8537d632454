"""A task of this file's own, registered as the built-in tasks are: the ``--plugin`` file of the plug-in task tests.

The seam a new task goes through: :class:`MeanTask` below is the whole task
(its column, its scoring, its JSON line), registered with
``mxjob.tasks.register`` as a plug-in registers it: at import, when the job
loads this file on the driver (``--plugin``) and on the executors it ships it
to, so ``--task toy_mean`` works end to end (``tests/integration/test_plugin_task.py``).
Imported by pytest, it is registered only for the tests that ask for it
(``tests/unit/tasks/test_plugin_task.py``'s ``registered``). The module imports
only what an executor has (no ``tests`` package), since the executors import it too.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from mxjob import tasks
from mxjob.results import jsonl_view
from mxjob.tasks.base import Task, forward_or_fail


class MeanTask(Task):
    """One float per image: the mean of the model's first output (a toy, but a whole task)."""

    name = "toy_mean"
    summary = "the mean of the model's first output per image (a test's task)"

    def columns(self) -> list[pa.Field]:
        return [pa.field("mean", pa.float32())]

    def arrays(self, schema: pa.Schema, values: list) -> list[pa.Array]:
        return [pa.array(values, pa.float32())]

    def score(self, model, keys, inputs, job, out) -> None:
        outputs = forward_or_fail(lambda: model.predict(np.stack(inputs))[0], keys, out)
        if outputs is None:
            return
        for key, row in zip(keys, outputs):
            out.add(key, float(np.float32(row.mean())))

    def json_bodies(self, batch: pa.RecordBatch) -> list[str | None]:
        return [None if value is None else f', "mean": {jsonl_view.dumps(value)}}}'
                for value in batch.column("mean").to_pylist()]


TASK = MeanTask()
if __name__ != "tests.support.plugin_task":  # loaded by the job (--plugin): registered, as any plug-in is
    tasks.register(TASK)
