"""--handler end to end: the detector job through spark-submit on local-cluster, the handler given as s3://.

The executors import the shipped handler once per Python worker and write its
boxes, which equal the handler's run in this process on a plain Predictor;
the handler's errors are rows of their stage. The handlers, ``score_partition``
and the driver's checks are tested without Spark in
``tests/unit/model/test_handlers.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.support import detector_handler
from tests.support.detector_handler import BUCKET, assert_same_boxes, expected_boxes
from tests.support.helpers import spark_submit

# The fixtures shared with tests/unit/model/test_handlers.py, bound here for pytest to find.
detector = detector_handler.detector
boxes_handler = detector_handler.boxes_handler
world = detector_handler.world


@pytest.fixture(scope="module")
def boxes_run(world):
    result = spark_submit([*world["args"], "--output", f"s3://{BUCKET}/out/boxes.jsonl", "--max-errors", "3"])
    s3 = world["s3"]
    lines = s3.get_object(Bucket=BUCKET, Key="out/boxes.jsonl")["Body"].read().decode().splitlines()
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key="out/boxes.jsonl.summary.json")["Body"].read())
    return result, [json.loads(line) for line in lines], summary


@pytest.mark.spark
def test_detector_job_writes_boxes_from_the_shipped_handler(boxes_run, world, detector, boxes_handler):
    result, rows, summary = boxes_run
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert [row["key"] for row in rows] == sorted(world["objects"])
    good = [f"imgs/{i}.png" for i in range(6)]
    want = expected_boxes(detector, boxes_handler, world["objects"], good)
    by_key = {row["key"]: row for row in rows}
    for key in good:
        assert "predictions" not in by_key[key]
        assert_same_boxes(by_key[key], want[key])
        worker = by_key[key]["worker"]
        assert "mxinfer-handler-" not in worker["file"]  # the executor's copy, not the driver's download
        assert worker["imports"] == 1  # imported once per Python worker, however many batches it ran
    assert by_key["imgs/reject.png"]["error"]["stage"] == "decode"
    assert by_key["imgs/garbage.png"]["error"]["stage"] == "decode"
    assert by_key["imgs/explode.png"]["error"]["stage"] == "predict"
    assert summary["errors_by_stage"] == {"download": 0, "decode": 2, "predict": 1}
    assert summary["predicted"] == 6 and summary["failed"] == 3
    assert summary["options"]["handler"] == f"s3://{BUCKET}/code/boxes.py"
    assert summary["model"]["head_op"] == "_contrib_MultiBoxDetection"
