"""Carried columns: a CSV manifest's columns beyond bucket,key[,size], and --with-object-metadata's etag and size.

Without Spark: the manifest readers keep the columns beside their keys, the
refusals (a name the output already has, more than three columns without a
header), a manifest sorted out of core, the assembly appends them to
JSON Lines and Parquet rows from fake parts, the ETags and sizes the tasks'
GETs read (carried in their parts) and the listing's, and the fingerprint.
``tests/integration/test_carry.py`` runs one manifest job through spark-submit.
"""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mxjob.executor import partition
from mxjob.inputs import batch_list, extsort, listing, manifest, manifest_text
from mxjob.options.config import merge_settings, resolve
from mxjob.outputs import fingerprint, jsonl, merge, parquet, work_prefix
from mxjob.run import keys
from mxjob.s3 import parallel_list, writes
from tests.support.helpers import lines_part

BUCKET = "carry-bucket"
SUFFIXES = (".jpg",)
HEADER = "bucket,key,size,product_id,shop\n"
# (key, size, product_id, shop), not in key order; a quote, a backslash, a comma and non-ASCII in the values.
ROWS = [("photos/c.jpg", 30, 'p-"3"', "shop\\c"), ("photos/a.jpg", 10, "p-1", "café, Paris"),
        ("photos/b.jpg", 20, "p-2", "")]


@pytest.fixture(scope="module")
def s3(moto_buckets):
    """The session's client, with BUCKET created."""
    return moto_buckets


def csv_text(rows=ROWS) -> str:
    def quoted(text: str) -> str:
        return '"' + text.replace('"', '""') + '"'

    return HEADER + "".join(f"{BUCKET},{key},{size},{quoted(pid)},{quoted(shop)}\n" for key, size, pid, shop in rows)


def carried_rows(images: listing.Listing) -> list[tuple]:
    table = images.table
    return list(zip(table["key"].to_pylist(), table["size"].to_pylist(), table["product_id"].to_pylist(),
                    table["shop"].to_pylist()))


# --- the manifest


@pytest.mark.parametrize("reader", ["fast", "python"])
def test_a_csv_manifests_columns_beyond_bucket_key_size_follow_their_keys(tmp_path, monkeypatch, reader):
    if reader == "python":
        def doubt(*_):
            raise manifest_text._Doubt("forced")
        monkeypatch.setattr(manifest_text, "_fast_csv", doubt)
    path = tmp_path / "keys.csv"
    path.write_text(csv_text())
    images = manifest.read_manifest(str(path), suffixes=SUFFIXES)
    assert images.carried == ["product_id", "shop"]
    assert carried_rows(images) == sorted(ROWS)
    assert list(images) == [(key, size) for key, size, *_ in sorted(ROWS)]  # the listing's own view is unchanged


def test_a_header_without_size_carries_every_column_after_the_key(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text(f"Bucket,Key,sku\n{BUCKET},photos/b.jpg,2\n{BUCKET},photos/a.jpg,1\n")
    images = manifest.read_manifest(str(path), suffixes=SUFFIXES)
    assert images.carried == ["sku"]
    assert list(images) == [("photos/a.jpg", -1), ("photos/b.jpg", -1)]
    assert images.table["sku"].to_pylist() == ["1", "2"]


def test_the_plan_holds_keys_and_sizes_only(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text(csv_text())
    images = manifest.read_manifest(str(path), suffixes=SUFFIXES)
    out = io.BytesIO()
    batch_list.write_batches(images, 2, out.write)
    schemas = [batch.schema for batch in pa.ipc.open_stream(out.getvalue())]
    assert schemas == [batch_list.BATCHES_SCHEMA] * 2


@pytest.mark.parametrize("name", ["predictions", "error", "Key", "etag", "size"])
def test_a_carried_column_named_as_an_output_column_is_refused(tmp_path, name):
    path = tmp_path / "keys.csv"
    path.write_text(f"bucket,key,size,{name}\n{BUCKET},photos/a.jpg,1,x\n")
    with pytest.raises(manifest.ManifestError, match=rf"header row cannot name the columns carried to the output: "
                                                     rf"{name}: the output's own name .*rename them"):
        manifest.read_manifest(str(path), suffixes=SUFFIXES)


@pytest.mark.parametrize(("text", "message"), [
    (f"bucket,key,size,id,id\n{BUCKET},photos/a.jpg,1,x,y\n", "id named more than once"),
    (f"{BUCKET},photos/a.jpg,1,p-1\n{BUCKET},photos/b.jpg,2,p-2\n",
     r"rows have 4 fields, but only bucket,key\[,size\] are read without a header row; .* bucket,key,size,product_id"),
], ids=["repeated-name", "four-columns-no-header"])
def test_a_repeated_carried_name_or_extra_columns_without_a_header_are_refused(tmp_path, text, message):
    path = tmp_path / "keys.csv"
    path.write_text(text)
    with pytest.raises(manifest.ManifestError, match=message):
        manifest.read_manifest(str(path), suffixes=SUFFIXES)


def test_a_row_with_another_count_of_fields_than_the_header_is_named(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text(HEADER + f"{BUCKET},photos/a.jpg,1,p-1,s\n{BUCKET},photos/b.jpg,2,p-2\n")
    with pytest.raises(manifest.ManifestError, match="line 3: 4 fields, expected 5, as the header names"):
        manifest.read_manifest(str(path), suffixes=SUFFIXES)


def test_carried_columns_follow_their_keys_through_a_sort_out_of_core(tmp_path, caplog):
    # Shuffled, with repeated keys (the larger size wins, its columns with it) and keys the filter drops.
    import random

    rows = [(f"photos/{i:05d}.jpg", i, f"p-{i}", f"s{i % 3}") for i in range(3000)]
    rows += [(f"photos/{i:05d}.jpg", i + 100_000, f"again-{i}", "") for i in range(0, 3000, 7)]
    rows += [(f"photos/{i:05d}.txt", i, f"t-{i}", "x") for i in range(50)]
    random.Random(5).shuffle(rows)
    path = tmp_path / "keys.csv"
    path.write_text(csv_text(rows))
    in_memory = manifest.read_manifest(str(path), suffixes=SUFFIXES)
    with caplog.at_level("INFO", logger="mxjob.inputs.manifest"):
        spilled = manifest.read_manifest(str(path), suffixes=SUFFIXES, spill=extsort.Spill(4096))
    assert "sorted out of core" in caplog.text
    assert spilled.carried == in_memory.carried == ["product_id", "shop"]
    assert spilled.table.combine_chunks().equals(in_memory.table.combine_chunks())
    assert carried_rows(spilled)[7] == ("photos/00007.jpg", 100_007, "again-7", "")
    assert len(spilled) == 3000
    # The dry run's listing on disk keeps the names (for the plan) and not the values.
    planned = manifest.read_manifest(str(path), suffixes=SUFFIXES, spill=extsort.Spill(4096, in_memory=False))
    assert planned.carried == ["product_id", "shop"] and len(planned) == 3000
    assert planned.load().table.column_names == ["key", "size"]


# --- the assembly


def carried_run(s3, output_key: str, rendered=(True, True), seen: dict | None = None,
                ) -> tuple[work_prefix.WorkPrefix, list[str]]:
    """A finished run of fake parts (two batches) for ROWS' keys, as executors leave it.

    ``seen``: the objects' ``(etag, size)`` by key, carried in the parts as --with-object-metadata's tasks do.

    ``rendered``: per part, whether its task wrote its lines (a JSON Lines job's) or left them null (Parquet's).
    """
    work = work_prefix.WorkPrefix(s3, BUCKET, output_key)
    keys = sorted(key for key, *_ in ROWS)
    run = work.start_run(1, keys, 2, None)
    for index in range(2):
        lines = [json.dumps({"key": k, "predictions": [{"class_id": 7, "probability": 0.5}]})
                 if k != "photos/b.jpg" else
                 json.dumps({"key": k, "error": {"stage": "decode", "type": "OSError", "message": "broken"}})
                 for k in keys[index * 2:(index + 1) * 2]]
        s3.put_object(Bucket=BUCKET, Key=partition.part_key(run.prefix, index),
                      Body=lines_part(lines, rendered=rendered[index], seen=seen))
    return work, keys


def config(*args: str, **options) -> object:
    values = {"input": f"s3://{BUCKET}/in/", "model": f"s3://{BUCKET}/m", "output": f"s3://{BUCKET}/out.jsonl",
              **options}
    for flag in args:
        values[flag.lstrip("-").replace("-", "_")] = True
    return resolve(merge_settings(values, {}))


def assembled(s3, work, images, cfg, sink_kind: str, out_key: str) -> bytes:
    writer = writes.MultipartWriter(s3, BUCKET, out_key)
    sink = parquet.ParquetSink(writer) if sink_kind == "parquet" else jsonl.JsonLinesSink(writer)
    merge.assemble(work, work.runs(), images, sink, carried=keys.carried_columns(cfg, images))
    sink.close()
    return s3.get_object(Bucket=BUCKET, Key=out_key)["Body"].read()


@pytest.fixture()
def images(tmp_path):
    path = tmp_path / "keys.csv"
    path.write_text(csv_text())
    return manifest.read_manifest(str(path), suffixes=SUFFIXES)


def test_carried_columns_follow_every_json_line_after_the_tasks_members(s3, images):
    work, _ = carried_run(s3, "jsonl/out.jsonl")
    text = assembled(s3, work, images, config(), "jsonl", "jsonl/out.jsonl").decode()
    assert text.splitlines() == [
        '{"key": "photos/a.jpg", "predictions": [{"class_id": 7, "probability": 0.5}], "product_id": "p-1", '
        '"shop": "café, Paris"}',
        '{"key": "photos/b.jpg", "error": {"stage": "decode", "type": "OSError", "message": "broken"}, '
        '"product_id": "p-2", "shop": ""}',
        '{"key": "photos/c.jpg", "predictions": [{"class_id": 7, "probability": 0.5}], "product_id": "p-\\"3\\"", '
        '"shop": "shop\\\\c"}',
    ]
    assert [json.loads(line)["product_id"] for line in text.splitlines()] == ["p-1", "p-2", 'p-"3"']


@pytest.mark.parametrize("rendered", [(False, False), (True, False)], ids=["no part", "one part of two"])
def test_parts_without_lines_give_the_same_json_lines_bytes_with_their_carried_columns(s3, images, rendered):
    # A Parquet job's parts hold no lines; a resume that writes JSON Lines renders them from the typed columns.
    work, _ = carried_run(s3, "with/out.jsonl")
    want = assembled(s3, work, images, config(), "jsonl", "with/out.jsonl")
    work, _ = carried_run(s3, "without/out.jsonl", rendered)
    assert assembled(s3, work, images, config(), "jsonl", "without/out.jsonl") == want


def test_carried_columns_are_string_columns_of_every_parquet_row(s3, images):
    work, keys = carried_run(s3, "pq/out.parquet")
    table = pq.read_table(io.BytesIO(assembled(s3, work, images, config(), "parquet", "pq/out.parquet")))
    assert table.column_names == ["key", "predictions", "error", "product_id", "shop"]
    assert table.schema.field("product_id").type == pa.string()
    assert table["key"].to_pylist() == keys
    assert list(zip(table["product_id"].to_pylist(), table["shop"].to_pylist())) == [
        ("p-1", "café, Paris"), ("p-2", ""), ('p-"3"', "shop\\c")]


def test_with_object_metadata_adds_etag_and_size(s3, images):
    work, _ = carried_run(s3, "meta/out.jsonl")
    cfg = config("--with-object-metadata")
    rows = [json.loads(line) for line in assembled(s3, work, images, cfg, "jsonl", "meta/out.jsonl").splitlines()]
    assert [list(row)[-4:] for row in rows] == [["product_id", "shop", "etag", "size"]] * 3
    # a manifest names no ETag: null; its sizes are the manifest's
    assert [(row["etag"], row["size"]) for row in rows] == [(None, 10), (None, 20), (None, 30)]


# What the tasks' GETs read; photos/b.jpg's download failed (no GET to tell), so the manifest's size stays.
GOT = {"photos/a.jpg": ("etag-a", 11), "photos/c.jpg": ("etag-c", 33)}


@pytest.mark.parametrize("rendered", [(True, True), (False, True)], ids=["lines", "a part without lines"])
def test_the_etag_and_size_the_tasks_gets_read_reach_every_json_line(s3, images, rendered):
    work, _ = carried_run(s3, "got/out.jsonl", rendered, seen=GOT)
    cfg = config("--with-object-metadata")
    rows = [json.loads(line) for line in assembled(s3, work, images, cfg, "jsonl", "got/out.jsonl").splitlines()]
    assert [list(row)[-4:] for row in rows] == [["product_id", "shop", "etag", "size"]] * 3
    assert [(row["key"], row["etag"], row["size"]) for row in rows] == [
        ("photos/a.jpg", "etag-a", 11), ("photos/b.jpg", None, 20), ("photos/c.jpg", "etag-c", 33)]


def test_the_etag_and_size_the_tasks_gets_read_reach_every_parquet_row(s3, images):
    work, _ = carried_run(s3, "got/out.parquet", seen=GOT)
    cfg = config("--with-object-metadata")
    table = pq.read_table(io.BytesIO(assembled(s3, work, images, cfg, "parquet", "got/out.parquet")))
    assert table.column_names == ["key", "predictions", "error", "product_id", "shop", "etag", "size"]
    assert table.schema.field("etag").type == pa.string() and table.schema.field("size").type == pa.int64()
    assert table["etag"].to_pylist() == ["etag-a", None, "etag-c"]
    assert table["size"].to_pylist() == [11, 20, 33]


def test_a_parts_object_metadata_never_reaches_an_output_that_did_not_ask_for_it(s3):
    work, keys = carried_run(s3, "plain/out.parquet", seen=GOT)
    plain = listing.Listing.build(BUCKET, keys, [10, 20, 30])
    table = pq.read_table(io.BytesIO(assembled(s3, work, plain, config(), "parquet", "plain/out.parquet")))
    assert table.column_names == ["key", "predictions", "error"]


def test_a_listed_prefix_gives_each_objects_etag(s3):
    bodies = {"list/a.jpg": b"a", "list/b.jpg": b"bb", "list/notes.txt": b"x"}
    for key, body in bodies.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    listed, sizes, etags = parallel_list.list_prefix(s3, BUCKET, "list/", 2, etags=True)
    images = listing.Listing.build(BUCKET, listed, sizes, suffixes=SUFFIXES, carried={"etag": etags})
    cfg = config("--with-object-metadata")
    columns = keys.carried_columns(cfg, images)
    expected = [s3.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"') for key in ("list/a.jpg", "list/b.jpg")]
    assert columns.column_names == ["etag", "size"]
    assert columns["etag"].to_pylist() == expected
    assert columns["size"].to_pylist() == [1, 2]
    assert fingerprint.carried_names(cfg, images) == ["etag", "size"]


def test_without_carried_columns_nothing_is_appended(s3):
    plain = listing.Listing.build(BUCKET, ["photos/a.jpg"], [1])
    assert fingerprint.carried_names(config(), plain) == []
    assert keys.carried_columns(config(), plain) is None


# --- the fingerprint


def test_the_fingerprint_differs_with_carried_columns_and_with_object_metadata(monkeypatch, images):
    plain = listing.Listing.build(BUCKET, ["photos/a.jpg"], [1])
    monkeypatch.setattr(fingerprint, "fingerprint", lambda values, files: values)  # the settings part alone
    classifier = type("Fake", (), {"labels": None})()
    monkeypatch.setattr(type(config().model), "read", lambda self, uri: b"model")
    cfg, with_meta = config(), config("--with-object-metadata")
    without = fingerprint.job_fingerprint(cfg, classifier, fingerprint.carried_names(cfg, plain))
    carried = fingerprint.job_fingerprint(cfg, classifier, fingerprint.carried_names(cfg, images))
    metadata = fingerprint.job_fingerprint(with_meta, classifier, fingerprint.carried_names(with_meta, plain))
    assert "carried" not in without and "with_object_metadata" not in without  # as every run before them
    assert carried["carried"] == ["product_id", "shop"]
    assert metadata["carried"] == ["etag", "size"] and metadata["with_object_metadata"] is True
    assert len({json.dumps(f, sort_keys=True) for f in (without, carried, metadata)}) == 3
    assert fingerprint.differences(without, carried) == ['carried: null then, ["product_id", "shop"] now']
