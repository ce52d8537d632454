"""Carried columns through spark-submit: one CSV manifest job with the demo model and ``--with-object-metadata``.

Every line carries the manifest's columns and the ETag and size the tasks'
GETs read. The readers, the refusals and the assembly are tested without
Spark in ``tests/unit/results/test_carry.py``.
"""

from __future__ import annotations

import json

import pytest

from tests.support.helpers import bucket_with_digits, spark_submit


@pytest.mark.spark
def test_a_csv_manifest_job_carries_its_columns_to_every_line(moto_endpoint, demo_dir, tmp_path):
    bucket = "carry-job"
    s3, keys = bucket_with_digits(moto_endpoint, bucket, demo_dir / "model", 6)
    path = tmp_path / "keys.csv"
    path.write_text("bucket,key,size,product_id,shop\n"
                    + "".join(f"{bucket},{key},,p-{i},s{i % 2}\n" for i, key in reversed(list(enumerate(keys)))))
    result = spark_submit(["--input-manifest", str(path), "--model", f"s3://{bucket}/model/digits",
                           "--output", f"s3://{bucket}/out/carried.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4", "--top-k", "1",
                           "--with-object-metadata"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in
            s3.get_object(Bucket=bucket, Key="out/carried.jsonl")["Body"].read().decode().splitlines()]
    assert [row["key"] for row in rows] == keys
    assert [(row["product_id"], row["shop"]) for row in rows] == [(f"p-{i}", f"s{i % 2}") for i in range(6)]
    assert all(list(row)[:2] == ["key", "predictions"] and len(row["predictions"]) == 1 for row in rows)
    # Named by neither the manifest nor a listing: the GETs that scored the images told them.
    heads = [s3.head_object(Bucket=bucket, Key=key) for key in keys]
    assert [(row["etag"], row["size"]) for row in rows] == [
        (head["ETag"].strip('"'), head["ContentLength"]) for head in heads]
