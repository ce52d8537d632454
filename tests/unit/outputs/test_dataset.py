"""A Parquet dataset as the output (mxjob.outputs.dataset, mxjob.outputs.base): ``--output s3://BUCKET/PREFIX/``.

Without Spark: the keys beside an output, the sink's files (boundaries,
rows, schema and metadata equal to one Parquet object's, ``_SUCCESS``, an
abort leaves no file), the key list's digest, ``auto``'s rows per file, the
resume plan, the refusals, where ``watch`` finds the status, and a dry run's
plan. ``tests/integration/test_dataset.py`` runs the job through spark-submit:
a dataset read while the job runs, after its driver is SIGKILLed and after
``--resume``.
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mxjob import tasks
from mxjob.core.errors import JobError
from mxjob.options import config
from mxjob.outputs import dataset, dataset_files, parquet
from mxjob.outputs.base import is_prefix as is_dataset
from mxjob.outputs.base import output_of, side_key
from mxjob.reporting import record_fields, records
from mxjob.s3 import access, parallel_list, uris, writes
from mxjob.tasks import classify
from tests.support import dataset_job
from tests.support.dataset_job import BUCKET, ROWS_PER_FILE, job_args

# The fixtures shared with tests/integration/test_dataset.py, bound here for pytest to find.
s3 = dataset_job.s3
world = dataset_job.world

BASE = {"input": "s3://in/p/", "model": "s3://m/r"}


def rows_batch(keys: list[str], fail: set = frozenset()) -> pa.RecordBatch:
    """A classify record batch of the result model, one row per key; keys in ``fail`` are error rows."""
    made = classify.TASK.results()
    for i, key in enumerate(keys):
        if key in fail:
            made.fail(key, {"stage": "decode", "type": "OSError", "message": "bad"})
        else:
            made.add(key, classify.prediction_entries([(i % 7, f"c{i % 7}", 0.5)]))
    return made.record_batch()


# ----------------------------------------------------------------------------
# Keys beside the output


def test_the_keys_beside_an_object_and_a_dataset():
    assert [side_key("a/out.jsonl", n) for n in ("parts/", "summary.json", "status.json", "report.html")] == [
        "a/out.jsonl.parts/", "a/out.jsonl.summary.json", "a/out.jsonl.status.json", "a/out.jsonl.report.html"]
    assert [side_key("a/p/", n) for n in ("parts/", "summary.json", "status.json", "report.html", "SUCCESS")] == [
        "a/p/_parts/", "a/p/_summary.json", "a/p/_status.json", "a/p/_report.html", "a/p/_SUCCESS"]
    assert is_dataset("a/p/") and not is_dataset("a/p.parquet")
    with pytest.raises(ValueError, match="has no _SUCCESS"):
        side_key("a/out.jsonl", "SUCCESS")
    assert output_of("a/p/_status.json") == "a/p/" and output_of("a/out.jsonl.status.json") == "a/out.jsonl"


def test_a_trailing_slash_is_a_parquet_dataset_and_json_lines_there_is_refused():
    cfg = config.resolve(config.merge_settings({**BASE, "output": "s3://o/preds/"}, {}))
    assert cfg.output.kind == "dataset" and cfg.output_format == "parquet" and cfg.summary_key == "preds/_summary.json"
    with pytest.raises(click.UsageError, match=r"an output ending in '/' .* is a Parquet dataset"):
        config.resolve(config.merge_settings({**BASE, "output": "s3://o/preds/", "output_format": "jsonl"}, {}))


# ----------------------------------------------------------------------------
# The sink


def parquet_object(s3, key: str, batches: list[pa.RecordBatch], metadata: dict) -> pa.Table:
    """The same rows through the single-object Parquet sink."""
    sink = parquet.ParquetSink(writes.MultipartWriter(s3, BUCKET, key), metadata)
    sink.write(batches)
    sink.close()
    return pq.read_table(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()))


def read_file(s3, key: str) -> pa.Table:
    return pq.read_table(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()))


def test_the_sink_cuts_files_at_rows_per_file_each_like_the_single_object(s3):
    keys = [f"k{i:03d}" for i in range(23)]
    batches = [rows_batch(keys[:5], fail={"k003"}), rows_batch(keys[5:17]), rows_batch(keys[17:])]
    metadata = {"mxinfer.fingerprint": '{"task": "classify"}', "mxinfer.task": "classify"}
    sink = dataset_files.DatasetSink(s3, BUCKET, "sink/", 10, metadata)
    sink.write(batches[:2])
    assert [f["rows"] for f in sink.files] == [10]  # the first file is whole and visible before the end
    assert access.object_exists(s3, BUCKET, "sink/part-00000.parquet")
    sink.write(batches[2:])
    sink.close()
    assert [(f["key"], f["rows"]) for f in sink.files] == [
        ("sink/part-00000.parquet", 10), ("sink/part-00001.parquet", 10), ("sink/part-00002.parquet", 3)]
    whole = parquet_object(s3, "sink-one.parquet", batches, metadata)
    files = [read_file(s3, f["key"]) for f in sink.files]
    assert pa.concat_tables(files).equals(whole)
    assert all(f.schema.metadata[b"mxinfer.task"] == b"classify" for f in files)
    success = json.loads(s3.get_object(Bucket=BUCKET, Key="sink/_SUCCESS")["Body"].read())
    assert success["rows"] == 23 and [f["key"] for f in success["files"]] == [f["key"] for f in sink.files]
    assert [f["bytes"] for f in success["files"]] == [
        s3.head_object(Bucket=BUCKET, Key=f["key"])["ContentLength"] for f in sink.files]


def test_an_aborted_sink_leaves_its_whole_files_and_no_partial_one(s3):
    keys = [f"a{i:02d}" for i in range(15)]
    sink = dataset_files.DatasetSink(s3, BUCKET, "abort/", 10, {})
    sink.write([rows_batch(keys)])
    sink.abort()
    listed = [k for k, _ in parallel_list.list_objects(s3, BUCKET, "abort/")]
    assert listed == ["abort/part-00000.parquet"]
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix="abort/").get("Uploads")


def test_files_an_earlier_run_completed_are_kept_and_not_written_again(s3):
    keys = [f"r{i:02d}" for i in range(25)]
    first = dataset_files.DatasetSink(s3, BUCKET, "keep/", 10, {})
    first.write([rows_batch(keys[:12])])
    first.abort()  # the driver died: file 0 is whole
    before = s3.head_object(Bucket=BUCKET, Key="keep/part-00000.parquet")
    found = dataset.contents(s3, BUCKET, "keep/")
    layout = dataset.resumed_layout({"rows_per_file": 10, "keys_sha256": dataset.keys_digest(keys)}, "auto",
                               (999, "auto"), keys, found)
    assert layout.rows_per_file == 10 and set(layout.keep) == {0}
    again = dataset_files.DatasetSink(s3, BUCKET, "keep/", layout.rows_per_file, {}, layout.keep)
    again.write([rows_batch(keys)])
    again.close()
    after = s3.head_object(Bucket=BUCKET, Key="keep/part-00000.parquet")
    assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])
    assert [f["kept"] for f in again.files] == [True, False, False]
    assert pa.concat_tables([read_file(s3, f["key"]) for f in again.files]).column("key").to_pylist() == keys


def test_a_changed_key_list_keeps_nothing_and_another_rows_per_file_is_refused():
    keys = ["a", "b", "c"]
    found = dataset.Contents(files={"p/part-00000.parquet": 10}, prefix="p/")
    record = {"rows_per_file": 2, "keys_sha256": dataset.keys_digest(keys)}
    assert dataset.resumed_layout(record, "auto", (5, ""), ["a", "b", "c", "d"], found).keep == {}
    assert dataset.resumed_layout(record, 2, (5, ""), keys, found).keep == {0: ("p/part-00000.parquet", 10)}
    with pytest.raises(JobError, match=r"cut its files at 2 rows.*resume with --rows-per-file 2"):
        dataset.resumed_layout(record, 3, (5, ""), keys, found)


def test_the_key_digest_ignores_chunking_and_sees_every_key():
    from mxjob.inputs import listing

    keys = [f"img/{i}.jpg" for i in range(50)] + ["é/ü.jpg"]
    one = dataset.keys_digest(keys)
    table = pa.table({"key": pa.chunked_array([pa.array(keys[:7], listing.KEY_TYPE),
                                               pa.array(keys[7:], listing.KEY_TYPE)]),
                      "size": pa.array([1] * len(keys), pa.int64())})
    chunked = listing.Listing("b", table)
    sliced = listing.Listing("b", pa.table({"key": pa.array(["x", *keys], listing.KEY_TYPE).slice(1),
                                            "size": pa.array([1] * len(keys), pa.int64())}))
    assert dataset.keys_digest(chunked) == one == dataset.keys_digest(sliced)
    assert dataset.keys_digest([*keys[:-1], "é/ü.jpeg"]) != one
    assert dataset.keys_digest(["ab", "c"]) != dataset.keys_digest(["a", "bc"])


def test_auto_rows_per_file_follow_the_rows_size():
    summary = {"outputs": {"flatten0_output": [1280]}}
    rows = {name: dataset.auto_rows_per_file(40, *tasks.get(task).row_bytes(SimpleNamespace(**settings), summary))
            for name, task, settings in (("embed", "embed", {"embedding_dtype": "float32"}),
                                         ("half", "embed", {"embedding_dtype": "float16"}),
                                         ("classify", "classify", {"top_k": 5}),
                                         ("detect", "detect", {}))}
    assert rows["embed"][0] == 128 * 2**20 // (40 + 1280 * 4 + dataset.ROW_OVERHEAD_BYTES) // 1000 * 1000
    assert rows["embed"][0] < rows["half"][0] < rows["classify"][0] <= dataset.AUTO_ROWS[1]
    assert rows["detect"][0] < rows["classify"][0]
    assert "1280 values of 4 bytes" in rows["embed"][1] and "2 bytes" in rows["half"][1]
    assert "5 predictions" in rows["classify"][1] and "about 10 detections" in rows["detect"][1]
    assert dataset.auto_rows_per_file(40, 10**8 * 4, "a huge vector")[0] == dataset.AUTO_ROWS[0]


def test_the_parquet_sink_bounds_a_row_group_in_bytes(s3, monkeypatch):
    monkeypatch.setattr(parquet, "PARQUET_ROW_GROUP_BYTES", 1)  # every write is a row group of its own
    keys = [f"g{i}" for i in range(6)]
    sink = parquet.ParquetSink(writes.MultipartWriter(s3, BUCKET, "groups.parquet"), {})
    for start in range(0, 6, 2):
        sink.write([rows_batch(keys[start:start + 2])])
    sink.close()
    meta = pq.ParquetFile(io.BytesIO(s3.get_object(Bucket=BUCKET, Key="groups.parquet")["Body"].read())).metadata
    assert meta.num_row_groups == 3 and meta.num_rows == 6


# ----------------------------------------------------------------------------
# Refusals before any listing


def dataset_config(prefix: str, *flags: str) -> config.JobConfig:
    values = {"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/model/digits",
              "output": f"s3://{BUCKET}/{prefix}", **{f: True for f in flags}}
    return config.resolve(config.merge_settings(values, {}))


def test_objects_the_job_did_not_write_are_refused_whatever_the_flags(s3):
    s3.put_object(Bucket=BUCKET, Key="foreign/notes.txt", Body=b"mine")
    for flags in ((), ("overwrite",), ("resume",)):
        with pytest.raises(JobError, match=r"holds 1 object the job did not write \(for example 'foreign/notes.txt'\)"):
            cfg = dataset_config("foreign/", *flags)
            cfg.output.check(cfg, s3)


def test_an_existing_dataset_is_refused_without_overwrite(s3):
    s3.put_object(Bucket=BUCKET, Key="done/part-00000.parquet", Body=b"x")
    with pytest.raises(JobError, match=r"s3://dataset-bucket/done/ \(or its summary\) already exists; add "
                                       r"--skip-existing to score only the keys it lacks, or --overwrite to replace"):
        cfg = dataset_config("done/")
        cfg.output.check(cfg, s3)
    s3.put_object(Bucket=BUCKET, Key="status-only/_status.json", Body=b"{}")
    cfg = dataset_config("status-only/")
    cfg.output.check(cfg, s3)  # a status alone is no output


# ----------------------------------------------------------------------------
# The status's location, and a dry run


def test_watch_finds_the_status_of_an_object_and_of_a_dataset():
    from mxjob.reporting import watch

    assert watch.status_location("s3://b/out/p.jsonl") == ("b", "out/p.jsonl.status.json")
    assert watch.status_location("s3://b/out/p.jsonl.status.json") == ("b", "out/p.jsonl.status.json")
    assert watch.status_location("s3://b/classes/") == ("b", "classes/_status.json")
    assert watch.status_location("s3://b/classes/_status.json") == ("b", "classes/_status.json")
    with pytest.raises(uris.S3UriError, match="names no output"):
        watch.status_location("s3://b/")


def test_a_dry_run_of_a_dataset_says_its_rows_per_file_and_files(world, stderr_runner):
    import infer_main

    result = stderr_runner.invoke(infer_main.main, [*job_args(world["endpoint"], "dry/"), "--dry-run"])
    assert result.exit_code == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    record_fields.from_json(records.Plan, plan)  # its dataset entry too
    assert plan["dataset"] == {"rows_per_file": ROWS_PER_FILE, "why": "--rows-per-file",
                               "files": -(-len(world["keys"]) // ROWS_PER_FILE), "files_kept": 0}
    auto = stderr_runner.invoke(infer_main.main, [*job_args(world["endpoint"], "dry/"), "--dry-run",
                                                  "--rows-per-file", "auto"])
    assert auto.exit_code == 0, auto.stderr[-2000:]
    # auto: from these keys' mean length and --top-k 2, as the driver's check measured them
    mean_key = sum(len(k.encode()) for k in world["keys"]) / len(world["keys"])
    expected, why = dataset.auto_rows_per_file(mean_key, *classify.TASK.row_bytes(SimpleNamespace(top_k=2), {}))
    assert json.loads(auto.stdout.strip().splitlines()[-1])["dataset"] == {
        "rows_per_file": expected, "why": why, "files": 1, "files_kept": 0}
