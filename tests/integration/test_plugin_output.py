"""A plug-in output end to end through spark-submit: ``--plugin tests/support/plugin_output.py`` writes a CSV of top-1.

The job loads the file on the driver before it resolves ``--output
s3://BUCKET/KEY.csv``; the CSV's rows are the JSON Lines output's top
classes. The registry and the command line are tested without Spark in
``tests/unit/outputs/test_plugin_output.py``.
"""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.support import plugin_output


@pytest.mark.spark
def test_a_plugin_output_is_written_end_to_end_through_spark_submit(moto_endpoint, demo_dir):
    from tests.support.helpers import bucket_with_digits, spark_submit

    s3, keys = bucket_with_digits(moto_endpoint, "plugin-output", demo_dir / "model", 6)
    s3.put_object(Bucket="plugin-output", Key="imgs/broken.png", Body=b"not an image")
    common = ["--input", "s3://plugin-output/imgs/", "--model", "s3://plugin-output/model/digits", "--endpoint-url",
              moto_endpoint, "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4", "--top-k", "1",
              "--max-errors", "1"]
    result = spark_submit([*common, "--output", "s3://plugin-output/top.csv", "--plugin", plugin_output.__file__])
    assert result.returncode == 0, result.stderr[-3000:]
    result = spark_submit([*common, "--output", "s3://plugin-output/top.jsonl"])
    assert result.returncode == 0, result.stderr[-3000:]
    table = s3.get_object(Bucket="plugin-output", Key="top.csv")
    assert table["ContentType"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(table["Body"].read().decode())))
    lines = [json.loads(line) for line in
             s3.get_object(Bucket="plugin-output", Key="top.jsonl")["Body"].read().decode().splitlines()]
    assert [row["key"] for row in rows] == [line["key"] for line in lines] == sorted([*keys, "imgs/broken.png"])
    for row, line in zip(rows, lines):
        if "error" in line:
            assert row["class_id"] == row["label"] == ""
        else:
            assert int(row["class_id"]) == line["predictions"][0]["class_id"]
            assert row["label"] == (line["predictions"][0]["label"] or "")
    summary = json.loads(s3.get_object(Bucket="plugin-output", Key="top.csv.summary.json")["Body"].read())
    assert summary["options"]["output_kind"] == "csv_top1" and summary["failed"] == 1
