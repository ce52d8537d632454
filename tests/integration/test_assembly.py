"""The assembly following a real run: the job through spark-submit behind the counting proxy, per batch.

16 batches: one ranged GET of the plan and one PUT of its part per batch, the
merge reads each part once and lists the parts a handful of times at most;
the same job without the proxy writes the same bytes. The assembly itself is
tested without Spark in ``tests/unit/outputs/test_assembly.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.fault_proxy import FaultProxy
from tests.support.helpers import bucket_with_digits, spark_submit
from tests.support.request_log import RequestLog

#: A real run's merge lists the run's parts at most this often: on a lost notice, and at the job's end.
MAX_PART_LISTINGS = 3


@pytest.fixture(scope="module")
def digits(moto_endpoint, demo_dir):
    """A bucket of its own with the demo model and 64 held-out digits under ``imgs/``."""
    s3, keys = bucket_with_digits(moto_endpoint, LIVE_BUCKET, demo_dir / "model", 64)
    return {"s3": s3, "keys": keys, "endpoint": moto_endpoint}


LIVE_BUCKET = "live-assembly-bucket"


def digits_args(endpoint: str, output_key: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{LIVE_BUCKET}/imgs/", "--model", f"s3://{LIVE_BUCKET}/model/digits",
            "--output", f"s3://{LIVE_BUCKET}/{output_key}", "--endpoint-url", endpoint, "--input-shape", "3,32,32",
            "--std", "255", "--batch-size", "4", "--top-k", "2", "--estimate-images", "0", *extra]


@pytest.mark.spark
def test_a_real_runs_merge_follows_its_tasks_stats_with_a_handful_of_listings_and_writes_the_same_bytes(digits):
    """16 batches, the merge following them through the counting proxy; then the same job without the proxy: the
    same bytes, each key once and in order."""
    s3, batches = digits["s3"], len(digits["keys"]) // 4
    log = RequestLog("out/live.jsonl")
    with FaultProxy(digits["endpoint"], deny=log) as proxy:
        live = spark_submit(digits_args(proxy.endpoint, "out/live.jsonl"))
    assert live.returncode == 0, (live.stdout + live.stderr)[-3000:]
    again = spark_submit(digits_args(digits["endpoint"], "out/again.jsonl"))
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    print(f"\nrequests per batch of 4 images, {batches} batches: {log.per_batch(batches)}")
    live_bytes = s3.get_object(Bucket=LIVE_BUCKET, Key="out/live.jsonl")["Body"].read()
    assert live_bytes == s3.get_object(Bucket=LIVE_BUCKET, Key="out/again.jsonl")["Body"].read()
    assert [json.loads(line)["key"] for line in live_bytes.splitlines()] == sorted(digits["keys"])
    kinds = log.kinds
    assert kinds["image GET"] == len(digits["keys"])
    # One ranged GET of the plan and one PUT of its part per batch; the merge reads each part once.
    assert (kinds["plan GET"], kinds["part PUT"], kinds["part GET"]) == (batches, batches, batches)
    assert kinds["part LIST"] <= MAX_PART_LISTINGS, kinds
