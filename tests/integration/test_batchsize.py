"""``--batch-size auto`` through spark-submit: a real run says its batch and why, in its log and its summary.

The choice, its bounds, the option and the driver's measurement are tested
without Spark in ``tests/unit/planning/test_batchsize.py``.
"""

from __future__ import annotations

import pytest

from mxjob.planning import estimate


@pytest.mark.spark
def test_a_run_with_auto_says_its_batch_and_why_in_the_log_and_the_summary(moto_endpoint, demo_dir):
    """The demo on local-cluster[2,1,1024]: 60 images for 2 executors leave room for one micro-batch a task."""
    import json

    from tests.support.helpers import bucket_with_model, spark_submit

    bucket = "auto-batch"
    s3 = bucket_with_model(moto_endpoint, bucket, demo_dir / "model")
    pngs = sorted((demo_dir / "images").rglob("*.png"))[:60]
    for path in pngs:
        s3.put_object(Bucket=bucket, Key=f"imgs/{path.parent.name}/{path.name}", Body=path.read_bytes())
    result = spark_submit(["--input", f"s3://{bucket}/imgs/", "--model", f"s3://{bucket}/model/digits",
                           "--output", f"s3://{bucket}/out/auto.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--estimate-images", "8"])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads(s3.get_object(Bucket=bucket, Key="out/auto.jsonl.summary.json")["Body"].read())
    choice = summary["batch_size_choice"]
    # 60 // (4 waves x 2 executors) = 7, under the micro-batch: one micro-batch of 16 a task, 4 tasks.
    assert summary["batch_size"] == choice["chosen"] == 16 and choice["requested"] == "auto"
    assert summary["batches"] == 4 and summary["predicted"] == 60
    assert choice["per_image_seconds"] > 0 and choice["task_overhead_seconds"] == estimate.TASK_OVERHEAD_SECONDS
    assert "2 executors get 4 batches each: 60 / 8 images" in choice["why"]
    assert "batch size 16: capped so that 2 executors get 4 batches each" in result.stdout + result.stderr
