"""A task of this file's own, registered as the built-in tasks are, and run through spark-submit with ``--plugin``.

The seam a new task goes through: :class:`MeanTask` below is the whole task
(its column, its scoring, its JSON line), registered with
``mxjob.tasks.register`` as a plug-in registers it: at import, when the job
loads this file on the driver (``--plugin``) and on the executors it ships it
to, so ``--task toy_mean`` works end to end. Imported by pytest, it is
registered only for the tests that ask for it (``registered``). The module
imports only what an executor has (no ``tests`` package), since the executors
import it too.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

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
if __name__ != "tests.unit.tasks.test_plugin_task":  # loaded by the job (--plugin): registered, as any plug-in is
    tasks.register(TASK)


@pytest.fixture
def registered():
    """The task registered for a test in this process, and taken back after it (the suite's registry stays the
    built-ins')."""
    tasks.register(TASK)
    yield TASK
    tasks.unregister(TASK.name)


def test_a_registered_task_is_offered_and_answers_for_its_rows(registered):
    assert "toy_mean" in tasks.names()
    assert tasks.get("toy_mean") is TASK
    rows = TASK.results()
    rows.add("b", 0.25)
    rows.fail("a", {"stage": "decode", "type": "OSError", "message": "bad"})
    batch = rows.record_batch()
    assert tasks.of_schema(batch.schema) is TASK
    assert TASK.json_lines(batch) == ['{"key": "a", "error": {"stage": "decode", "type": "OSError", "message": "bad"}}',
                                      '{"key": "b", "mean": 0.25}']
    assert TASK.parquet_schema(batch.schema).field("mean").type == pa.float32()


def test_the_command_line_takes_a_registered_task_and_refuses_an_unknown_one(registered, runner):
    import infer_main
    from mxjob.options import config

    options = {"input": "s3://b/i/", "model": "s3://b/m", "output": "s3://b/o.jsonl"}
    assert config.resolve(config.merge_settings({**options, "task": "toy_mean"}, {})).task == "toy_mean"
    result = runner.invoke(infer_main.main, [*(f"--{k}={v}" for k, v in options.items()), "--task", "toy_maen"])
    assert result.exit_code == 2
    assert "no task 'toy_maen' (did you mean toy_mean?)" in result.output


@pytest.mark.spark
def test_a_plugin_task_runs_end_to_end_through_spark_submit(moto_endpoint, demo_dir):
    import mxinfer
    from tests.support.helpers import bucket_with_digits, spark_submit

    s3, keys = bucket_with_digits(moto_endpoint, "plugin-task", demo_dir / "model", 6)
    result = spark_submit(["--input", "s3://plugin-task/imgs/", "--model", "s3://plugin-task/model/digits",
                           "--output", "s3://plugin-task/means.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4",
                           "--plugin", __file__, "--task", "toy_mean"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in
            s3.get_object(Bucket="plugin-task", Key="means.jsonl")["Body"].read().decode().splitlines()]
    assert [row["key"] for row in rows] == keys
    model = mxinfer.ImageClassifier(str(demo_dir / "model" / "digits"), (3, 32, 32), 4,
                                    preprocess=mxinfer.Preprocess((3, 32, 32), std=(255.0,)))
    arrays = model.to_array([s3.get_object(Bucket="plugin-task", Key=key)["Body"].read() for key in keys])
    expected = model.predict(arrays)[0].mean(axis=1)
    np.testing.assert_allclose([row["mean"] for row in rows], expected, rtol=1e-5, atol=1e-6)
    summary = json.loads(s3.get_object(Bucket="plugin-task", Key="means.jsonl.summary.json")["Body"].read())
    assert summary["options"]["task"] == "toy_mean" and summary["predicted"] == len(keys)
    assert "toy_mean" not in tasks.names()  # registered in the job's processes only
