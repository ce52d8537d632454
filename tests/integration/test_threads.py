"""Threads that fit the node by default: the original's shape, one executor with one core, no thread settings."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.helpers import bucket_with_model, spark_submit

BUCKET = "threads-bucket"


@pytest.mark.spark
def test_one_single_core_executor_uses_every_core_of_its_host(moto_endpoint, demo_dir):
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    for path in sorted((demo_dir / "images").rglob("*.png"))[:8]:
        s3.put_object(Bucket=BUCKET, Key=f"imgs/{path.parent.name}/{path.name}", Body=path.read_bytes())
    # spark-local.conf sets spark.executor.cores=1 and no OMP_NUM_THREADS, so Spark
    # hands the worker OMP_NUM_THREADS=1; the job must see through it.
    result = spark_submit(["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
                           "--output", f"s3://{BUCKET}/out/p.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4"],
                          master="local-cluster[1,1,1024]")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key="out/p.jsonl.summary.json")["Body"].read())
    assert {w["threads"] for w in summary["python_workers"].values()} == {os.cpu_count()}
    assert summary["threads"]["warnings"] == []
    [host] = summary["threads"]["hosts"].values()
    assert host == {"cores": os.cpu_count(), "executors": 1, "threads": os.cpu_count()}
