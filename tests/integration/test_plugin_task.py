"""A plug-in task end to end through spark-submit: ``--plugin tests/support/plugin_task.py --task toy_mean``.

The job loads the file on the driver and on the executors, which score with
its task; this process's registry never sees it. The registry and the command
line are tested without Spark in ``tests/unit/tasks/test_plugin_task.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from mxjob import tasks
from tests.support import plugin_task


@pytest.mark.spark
def test_a_plugin_task_runs_end_to_end_through_spark_submit(moto_endpoint, demo_dir):
    from tests.support.helpers import bucket_with_digits, digits_classifier, spark_submit

    s3, keys = bucket_with_digits(moto_endpoint, "plugin-task", demo_dir / "model", 6)
    result = spark_submit(["--input", "s3://plugin-task/imgs/", "--model", "s3://plugin-task/model/digits",
                           "--output", "s3://plugin-task/means.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4",
                           "--plugin", plugin_task.__file__, "--task", "toy_mean"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in
            s3.get_object(Bucket="plugin-task", Key="means.jsonl")["Body"].read().decode().splitlines()]
    assert [row["key"] for row in rows] == keys
    model = digits_classifier(demo_dir / "model", 4)
    arrays = model.to_array([s3.get_object(Bucket="plugin-task", Key=key)["Body"].read() for key in keys])
    expected = model.predict(arrays)[0].mean(axis=1)
    np.testing.assert_allclose([row["mean"] for row in rows], expected, rtol=1e-5, atol=1e-6)
    summary = json.loads(s3.get_object(Bucket="plugin-task", Key="means.jsonl.summary.json")["Body"].read())
    assert summary["options"]["task"] == "toy_mean" and summary["predicted"] == len(keys)
    assert "toy_mean" not in tasks.names()  # registered in the job's processes only
