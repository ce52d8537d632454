"""--input-manifest through spark-submit: the whole job on a manifest of real images and missing keys.

The manifest's readers and their errors are tested without Spark in
``tests/unit/inputs/test_manifest.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import bucket_with_digits, spark_submit


@pytest.mark.spark
def test_a_manifest_job_writes_one_line_per_key_predictions_or_no_such_key(moto_endpoint, demo_dir, tmp_path):
    """Real small images and missing keys, in a manifest without sizes: exactly one line per named key."""
    bucket = "manifest-job"
    s3, real = bucket_with_digits(moto_endpoint, bucket, demo_dir / "model", 12)
    missing = [f"imgs/missing-{i}.png" for i in range(8)]
    path = tmp_path / "keys.txt"
    path.write_text("".join(f"s3://{bucket}/{key}\n" for key in [*missing, *real]))
    result = spark_submit(["--input-manifest", str(path), "--model", f"s3://{bucket}/model/digits",
                           "--output", f"s3://{bucket}/out/manifest.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--batch-size", "8", "--top-k", "2",
                           "--max-errors", "50%"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in
            s3.get_object(Bucket=bucket, Key="out/manifest.jsonl")["Body"].read().decode().splitlines()]
    assert [row["key"] for row in rows] == sorted(real + missing)
    for row in rows:
        if row["key"] in missing:
            assert row["error"]["stage"] == "download" and row["error"]["type"] == "NoSuchKey", row
        else:
            assert len(row["predictions"]) == 2, row
    summary = json.loads(s3.get_object(Bucket=bucket, Key="out/manifest.jsonl.summary.json")["Body"].read())
    assert summary["input"] == str(path)
    assert (summary["keys_listed"], summary["predicted"], summary["failed"]) == (20, 12, 8)
