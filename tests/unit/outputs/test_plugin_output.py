"""An output of this file's own, registered as the built-in outputs are, and run through spark-submit with ``--plugin``.

The seam a new kind of output goes through: :class:`CsvOutput` below is the
whole output (what ``--output`` it claims, its sink), registered with
``mxjob.outputs.register``, as a plug-in registers it: at import, when the
job loads this file on the driver (``--plugin``) before it resolves
``--output``, so ``--output s3://BUCKET/KEY.csv`` writes it end to end.
Imported by pytest, it is registered only for the tests that ask for it. The module imports
only what an executor has (no ``tests`` package): the job ships a plug-in to
the executors too.
"""

from __future__ import annotations

import csv
import io
import json
from typing import ClassVar

import pyarrow as pa
import pytest

from mxjob import outputs


class CsvSink:
    """``key,class_id,label``: each row's top class, empty for an error row."""

    def __init__(self, writer):
        self.writer = writer
        self.writer.write(b"key,class_id,label\n")

    def write(self, batches: list[pa.RecordBatch]) -> None:
        text = io.StringIO()
        rows = csv.writer(text, lineterminator="\n")
        for batch in batches:
            for key, predictions in zip(batch.column("key").to_pylist(), batch.column("predictions").to_pylist()):
                top = predictions[0] if predictions else {"class_id": "", "label": ""}
                rows.writerow([key, top["class_id"], top["label"] or ""])
        self.writer.write(text.getvalue().encode("utf-8"))

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


class CsvOutput(outputs.ObjectOutput):
    """One CSV object of each image's top-1 class (classify's rows)."""

    kind = "csv_top1"
    format = "parquet"  # the tasks need not render JSON lines for it
    form = "s3://BUCKET/KEY.csv"
    described = "a CSV of each image's top-1 class (a test's output)"
    suffixes: ClassVar[tuple] = (".csv",)

    @property
    def content_type(self) -> str:
        return "text/csv"

    def sink(self, cfg, client, work, plan) -> CsvSink:
        return CsvSink(self.writer(client))


if __name__ != "tests.unit.outputs.test_plugin_output":  # loaded by the job (--plugin): registered, as any plug-in is
    outputs.register(CsvOutput)


@pytest.fixture
def registered():
    """The output registered for a test in this process, and taken back after it."""
    outputs.register(CsvOutput)
    yield CsvOutput
    outputs.unregister(CsvOutput)


def test_a_registered_output_claims_its_uris_first_and_leaves_the_rest_to_the_built_ins(registered):
    assert outputs.kinds()[0] is CsvOutput
    assert outputs.kind_of("s3://b/top.csv") is CsvOutput
    assert outputs.kind_of("s3://b/top.jsonl") is outputs.JsonLinesOutput
    assert outputs.kind_of("s3://b/p/") is outputs.DatasetOutput


def test_the_command_line_resolves_a_registered_outputs_uri_to_it(registered):
    from mxjob.options import config

    cfg = config.resolve(config.merge_settings({"input": "s3://b/i/", "model": "s3://b/m", "output": "s3://b/t.csv"},
                                               {}))
    assert isinstance(cfg.output, CsvOutput) and cfg.output_format == "parquet"
    assert cfg.summary_key == "t.csv.summary.json" and cfg.job_spec().json_lines is False


@pytest.mark.spark
def test_a_plugin_output_is_written_end_to_end_through_spark_submit(moto_endpoint, demo_dir):
    from tests.support.helpers import bucket_with_digits, spark_submit

    s3, keys = bucket_with_digits(moto_endpoint, "plugin-output", demo_dir / "model", 6)
    s3.put_object(Bucket="plugin-output", Key="imgs/broken.png", Body=b"not an image")
    common = ["--input", "s3://plugin-output/imgs/", "--model", "s3://plugin-output/model/digits", "--endpoint-url",
              moto_endpoint, "--input-shape", "3,32,32", "--std", "255", "--batch-size", "4", "--top-k", "1",
              "--max-errors", "1"]
    result = spark_submit([*common, "--output", "s3://plugin-output/top.csv", "--plugin", __file__])
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
