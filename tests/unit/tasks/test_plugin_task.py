"""The plug-in task of ``tests/support/plugin_task.py`` (``toy_mean``) in this process, without Spark.

Registered for a test in this process (``registered``) and taken back after
it: the registry offers it and answers for its rows, and the command line
takes it. ``tests/integration/test_plugin_task.py`` runs it end to end through
spark-submit with ``--plugin``.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from mxjob import tasks
from tests.support.plugin_task import TASK


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
