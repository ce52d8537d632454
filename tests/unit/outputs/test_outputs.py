"""Every task's rows, error rows among them, in every output: JSON Lines (plain and ``.gz``), Parquet, a dataset.

Without Spark: a run's parts, as the tasks write them, go through the
driver's assembly into each sink, and the output is read back as its
readers read it (``json``, ``gzip``, ``pyarrow.parquet``): every row present,
the error rows with their error, the scored rows with their values.
"""

from __future__ import annotations

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mxjob import tasks
from mxjob.executor import partition
from mxjob.inputs import listing
from mxjob.options.config import merge_settings, resolve
from mxjob.outputs import dataset_files, jsonl, merge, parquet, work_prefix
from mxjob.run import scoring
from mxjob.s3 import writes
from mxjob.tasks import classify, detect
from tests.support.helpers import part_of

BUCKET = "outputs-bucket"
ERROR = {"stage": "decode", "type": "UnidentifiedImageError", "message": "cannot identify image file"}
#: Keys of one run, two batches of three; the failed images are in both, one the first row of its batch.
KEYS = [f"imgs/{i}.jpg" for i in range(6)]
FAILED = {"imgs/1.jpg", "imgs/3.jpg"}
BATCH = 3
#: Numbers a float32 holds exactly, so each output gives back the very values the task made.
SCORED = {
    "classify": (classify.prediction_entries([(3, "cat", 0.75), (5, None, 0.25)]),
                 {"predictions": [{"class_id": 3, "label": "cat", "probability": 0.75},
                                  {"class_id": 5, "probability": 0.25}]},
                 {"predictions": [{"class_id": 3, "label": "cat", "probability": 0.75},
                                  {"class_id": 5, "label": None, "probability": 0.25}]}),
    "embed": ([0.5, -0.25, 1.0, 2.0], {"embedding": [0.5, -0.25, 1.0, 2.0]}, {"embedding": [0.5, -0.25, 1.0, 2.0]}),
    "detect": (([640, 480], detect.detection_entries([(7, "cat", 0.875, [12.0, 30.5, 410.0, 388.0])])),
               {"image_size": [640, 480], "detections": [{"class_id": 7, "label": "cat", "score": 0.875,
                                                         "box": [12, 30.5, 410, 388]}]},
               {"image_size": [640, 480], "detections": [{"class_id": 7, "label": "cat", "score": 0.875,
                                                         "box": [12.0, 30.5, 410.0, 388.0]}]}),
}
#: The task's columns, null in an error row of the Parquet view.
COLUMNS = {"classify": ("predictions",), "embed": ("embedding",), "detect": ("image_size", "detections")}


@pytest.fixture(scope="module")
def s3(moto_buckets):
    return moto_buckets


def task_schema(task: str) -> pa.Schema:
    return tasks.get(task).schema(dimension=4) if task == "embed" else tasks.get(task).schema()


def durable_run(s3, task: str, name: str, json_lines: bool) -> work_prefix.WorkPrefix:
    """A run of ``task`` over :data:`KEYS` whose every batch is durable, its parts as a task writes them."""
    work = work_prefix.WorkPrefix(s3, BUCKET, f"{name}.work")
    run = work.start_run(1, KEYS, BATCH, None)
    value = SCORED[task][0]
    for index in range(len(KEYS) // BATCH):
        made = tasks.get(task).results(task_schema(task))
        for key in KEYS[index * BATCH:(index + 1) * BATCH]:
            if key in FAILED:
                made.fail(key, ERROR)
            else:
                made.add(key, value)
        s3.put_object(Bucket=BUCKET, Key=partition.part_key(run.prefix, index),
                      Body=part_of(made.record_batch(), lines=json_lines))
    return work


def assembled(work: work_prefix.WorkPrefix, sink) -> merge.AssemblyCounts:
    counts = merge.assemble(work, work.runs(), KEYS, sink)
    sink.close()
    return counts


def read(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def json_lines_output(s3, task: str) -> list[dict]:
    work = durable_run(s3, task, f"{task}/out.jsonl", json_lines=True)
    assembled(work, jsonl.JsonLinesSink(writes.MultipartWriter(s3, BUCKET, f"{task}/out.jsonl")))
    return [json.loads(line) for line in read(s3, f"{task}/out.jsonl").decode().splitlines()]


def parquet_output(s3, task: str) -> list[dict]:
    work = durable_run(s3, task, f"{task}/out.parquet", json_lines=False)
    assembled(work, parquet.ParquetSink(writes.MultipartWriter(s3, BUCKET, f"{task}/out.parquet"), {}))
    return pq.read_table(io.BytesIO(read(s3, f"{task}/out.parquet"))).to_pylist()


def dataset_output(s3, task: str) -> list[dict]:
    """Files of 4 rows: the first starts with the run's first row, each holds a failed image."""
    work = durable_run(s3, task, f"{task}/ds/", json_lines=False)
    sink = dataset_files.DatasetSink(s3, BUCKET, f"{task}/ds/", 4, {})
    assembled(work, sink)
    assert [f["rows"] for f in sink.files] == [4, 2]
    return pa.concat_tables([pq.read_table(io.BytesIO(read(s3, f["key"]))) for f in sink.files]).to_pylist()


def expected_json(task: str) -> list[dict]:
    members = SCORED[task][1]
    return [{"key": key, "error": ERROR} if key in FAILED else {"key": key, **members} for key in KEYS]


def expected_parquet(task: str) -> list[dict]:
    columns = SCORED[task][2]
    nulls = dict.fromkeys(COLUMNS[task])
    return [{"key": key, **nulls, "error": ERROR} if key in FAILED else {"key": key, **columns, "error": None}
            for key in KEYS]


@pytest.mark.parametrize("task", ["classify", "embed", "detect"])
def test_json_lines_hold_every_tasks_rows_with_the_error_rows(s3, task):
    assert json_lines_output(s3, task) == expected_json(task)


@pytest.mark.parametrize("task", ["classify", "embed", "detect"])
def test_a_parquet_object_holds_every_tasks_rows_with_the_error_rows(s3, task):
    """An error row's null vector, image size or box list must not stop pyarrow's Parquet writer at the close."""
    assert parquet_output(s3, task) == expected_parquet(task)


@pytest.mark.parametrize("task", ["classify", "embed", "detect"])
def test_a_parquet_dataset_holds_every_tasks_rows_with_the_error_rows(s3, task):
    assert dataset_output(s3, task) == expected_parquet(task)


# ----------------------------------------------------------------------------
# A .gz JSON Lines output


def job_config(s3, output_key: str):
    endpoint = s3.meta.endpoint_url
    return resolve(merge_settings({"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/m",
                                   "output": f"s3://{BUCKET}/{output_key}", "endpoint_url": endpoint}, {}))


@pytest.mark.parametrize("task", ["classify", "embed", "detect"])
def test_a_gz_output_is_the_json_lines_of_the_same_run_gzipped(s3, task, monkeypatch):
    monkeypatch.setattr(merge, "WRITE_ROWS", 2)  # the lines reach the sink in several writes, as in a long run
    work = durable_run(s3, task, f"gz-{task}/out", json_lines=True)
    images = listing.Listing.build(BUCKET, KEYS, [1] * len(KEYS))
    for key in (f"gz-{task}/out.jsonl", f"gz-{task}/out.jsonl.gz"):
        scoring.assemble_output(job_config(s3, key), s3, work, images)
    plain = read(s3, f"gz-{task}/out.jsonl")
    assert [json.loads(line) for line in plain.decode().splitlines()] == expected_json(task)
    assert gzip.decompress(read(s3, f"gz-{task}/out.jsonl.gz")) == plain
    head = s3.head_object(Bucket=BUCKET, Key=f"gz-{task}/out.jsonl.gz")
    # No Content-Encoding: S3 and browsers would otherwise hand over the decompressed bytes under a .gz name.
    assert head["ContentType"] == "application/gzip" and "ContentEncoding" not in head
    assert s3.head_object(Bucket=BUCKET, Key=f"gz-{task}/out.jsonl")["ContentType"] == "application/x-ndjson"
