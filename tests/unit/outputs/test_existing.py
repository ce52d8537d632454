"""``--skip-existing`` and ``--rescore-errors`` on a dataset output (mxjob/outputs/existing.py, dataset.py, sinks.py).

Without Spark: the filter on Arrow arrays (special characters, nothing there,
200,000 keys in ten files), the selection of error rows to score again, the refusals
(one output object, ``--overwrite``, a resume of the other kind, other
settings), each run's file names, earlier runs' files accepted where objects
the job did not write are refused, and the files of two runs read back on the
moto server: keys found, error rows rewritten in place, ``_SUCCESS``'s
sections. ``tests/integration/test_existing.py`` runs them through
spark-submit.
"""

from __future__ import annotations

import json

import click
import numpy as np
import pyarrow as pa
import pytest

from mxjob.core.errors import JobError
from mxjob.inputs import listing
from mxjob.options import config
from mxjob.outputs import claim, dataset, dataset_files, existing, parquet, work_prefix
from mxjob.reporting import record_fields, records
from mxjob.tasks import classify
from tests.support.existing_dataset import BUCKET, read_dataset

FINGERPRINT = {"task": "classify", "top_k": 2}
METADATA = parquet.provenance({"fingerprint": FINGERPRINT})


@pytest.fixture(scope="module")
def s3(moto_buckets):
    return moto_buckets


def rows_batch(keys: list[str], fail: frozenset = frozenset(), class_id: int = 1) -> pa.RecordBatch:
    """A classify record batch of the result model, one row per key; keys in ``fail`` are error rows."""

    made = classify.TASK.results()
    for key in keys:
        if key in fail:
            made.fail(key, {"stage": "decode", "type": "OSError", "message": "bad"})
        else:
            made.add(key, classify.prediction_entries([(class_id, f"c{class_id}", 0.5)]))
    return made.record_batch()


def listed(keys: list[str]) -> listing.Listing:
    return listing.Listing.build("b", keys, [1] * len(keys))


def config_for(output: str, endpoint: str | None = None, **flags) -> config.JobConfig:
    values = {"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/model/digits",
              "output": f"s3://{BUCKET}/{output}", **flags}
    if endpoint:
        values["endpoint_url"] = endpoint
    return config.resolve(config.merge_settings(values, {}))


# ----------------------------------------------------------------------------
# The filter, on Arrow arrays


def test_the_filter_marks_exactly_the_listed_keys_some_file_holds_special_characters_too():
    keys = sorted(["a b.jpg", "é/ü.jpg", "x\u00a0y.png", "k%2F.jpg", "日本/画像.jpg", "quote'\".jpg", "z.jpg"])
    marks = existing.KeyFilter(listed(keys).keys, group_keys=2)  # groups of two keys: several look-ups
    marks.add(pa.array(["é/ü.jpg", "not listed.jpg"]))
    marks.add(pa.array(["日本/画像.jpg"], pa.large_string()))
    marks.add(pa.array([], pa.string()))
    marks.add(pa.array(["quote'\".jpg", "a b.jpg"]))
    found = marks.finish()
    assert [k for k, hit in zip(keys, found) if hit] == sorted(["é/ü.jpg", "日本/画像.jpg", "quote'\".jpg", "a b.jpg"])
    new, rescore, owner = existing.select(listed(keys), found)
    assert new.keys.to_pylist() == ["k%2F.jpg", "x\u00a0y.png", "z.jpg"] and rescore is None and owner is None


def test_an_empty_dataset_leaves_every_key_to_score():
    images = listed(["a.jpg", "b.jpg"])
    found = existing.KeyFilter(images.keys).finish()
    assert not found.any()
    assert existing.select(images, found)[0].keys.to_pylist() == ["a.jpg", "b.jpg"]


def test_a_listing_against_a_dataset_of_many_files_keeps_exactly_the_keys_it_lacks():
    """How fast is measured, not asserted: ``make bench-scale`` (``--existing-keys``) prints the seconds."""
    n = 200_000
    keys = pa.array([f"photos/{i % 997:03d}/{i:08d}.jpg" for i in range(n)], pa.large_string())
    images = listing.Listing.build("b", keys, pa.array(np.ones(n, dtype=np.int64)))
    # What the dataset holds: every key but each 7th, in files of 20,000 keys, as a first run wrote them.
    sorted_keys = images.keys.combine_chunks()
    held = sorted_keys.filter(pa.array(np.arange(n) % 7 != 0)).cast(pa.string())
    marks = existing.KeyFilter(images.keys)
    for start in range(0, len(held), 20_000):
        marks.add(held.slice(start, 20_000))
    new, _, _ = existing.select(images, marks.finish())
    assert new.keys.combine_chunks().equals(sorted_keys.filter(pa.array(np.arange(n) % 7 == 0)))


def test_rescore_errors_selects_the_error_rows_keys_with_the_file_holding_each():
    images = listed(["a", "b", "c", "d", "e", "f"])
    found = np.array([True, True, True, True, False, False])  # a-d have a row, e and f are new
    errors = pa.array(["d", "b", "gone"])  # error rows in files 1, 0 and 1; "gone" is listed no more
    new, rescore, owner = existing.select(images, found, errors, np.array([1, 0, 1]))
    assert new.keys.to_pylist() == ["b", "d", "e", "f"]
    assert rescore.tolist() == [True, True, False, False] and owner.tolist() == [0, 1]


# ----------------------------------------------------------------------------
# Refusals before any work


@pytest.mark.parametrize("output", ["out.jsonl", "out.jsonl.gz", "out.parquet"])
def test_skip_existing_with_one_output_object_is_refused_saying_why(output):
    with pytest.raises(click.UsageError, match=r"--skip-existing adds rows to a Parquet dataset, a prefix ending in "
                                               r"'/'.*is one object, which every run writes whole"):
        config_for(output, skip_existing=True)


def test_skip_existing_with_overwrite_and_rescore_errors_alone_are_refused():
    with pytest.raises(click.UsageError, match=r"--skip-existing keeps the output's rows .* --overwrite replaces"):
        config_for("preds/", skip_existing=True, overwrite=True)
    with pytest.raises(click.UsageError, match=r"--rescore-errors .* give it with --skip-existing"):
        config_for("preds/", rescore_errors=True)
    assert config_for("preds/", skip_existing=True, rescore_errors=True, resume=True).skip_existing


def test_a_resume_of_the_other_kind_of_run_is_refused():
    found = dataset.Contents(prefix="p/")
    with pytest.raises(JobError, match=r"was a --skip-existing run .* resume it with --skip-existing"):
        dataset.resumed_layout({"rows_per_file": 2, "skip_existing": True, "run": "20260101T000000Z"}, "auto",
                            (5, ""), ["a"], found)
    with pytest.raises(JobError, match=r"was not a --skip-existing run"):
        dataset.resumed_layout({"rows_per_file": 2}, "auto", (5, ""), ["a"], found, skip_existing=True)


def test_rows_made_with_other_settings_are_not_added():
    dataset.check_fingerprints({json.dumps(FINGERPRINT, sort_keys=True): "p/part-00000.parquet"}, FINGERPRINT, "s3://b/p/")
    with pytest.raises(JobError, match=r"made with other settings .* top_k: 2 then, 5 now \(in part-00000.parquet\)"):
        dataset.check_fingerprints({json.dumps(FINGERPRINT): "p/part-00000.parquet"}, {**FINGERPRINT, "top_k": 5},
                                   "s3://b/p/")
    with pytest.raises(JobError, match=r"part-x.parquet in s3://b/p/ has no mxinfer.fingerprint"):
        dataset.check_fingerprints({None: "p/part-x.parquet"}, FINGERPRINT, "s3://b/p/")


# ----------------------------------------------------------------------------
# File names


def test_each_run_names_its_files_apart_and_later_than_every_earlier_run():
    assert dataset_files.file_key("p/", 3) == "p/part-00003.parquet"
    assert dataset_files.file_key("p/", 3, "20261126T071846Z") == "p/part-20261126T071846Z-00003.parquet"
    assert dataset_files.file_id("p/part-20261126T071846Z-00003.parquet", "p/") == ("20261126T071846Z", 3)
    assert dataset_files.file_id("p/part-00003.parquet", "p/") == (None, 3)
    assert dataset_files.file_id("p/part-2026-00003.parquet", "p/") is None
    found = dataset.Contents(files={"p/part-00000.parquet": 1, "p/part-20261126T071846Z-00000.parquet": 1},
                             prefix="p/")
    assert dataset.new_run(dataset.Contents(prefix="p/"), now=0) == "19700101T000000Z"
    # A clock behind the latest run's (or a second run within the same second): the next second after it.
    assert dataset.new_run(found, now=0) == "20261126T071847Z"
    later = dataset.new_run(found, now=1_900_000_000)
    assert later == "20300317T174640Z" and later > "20261126T071846Z"
    names = {dataset_files.file_key("p/", i, run) for run in (None, "20261126T071846Z", later) for i in range(3)}
    assert len(names) == 9
    assert found.runs() == [None, "20261126T071846Z"]
    assert found.run_files("20261126T071846Z") == {0: ("p/part-20261126T071846Z-00000.parquet", 1)}


def test_earlier_runs_files_are_the_dataset_and_other_objects_are_still_refused(s3):
    for key in ("both/part-00000.parquet", "both/part-20261126T071846Z-00000.parquet", "both/_SUCCESS"):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x")
    found = dataset.contents(s3, BUCKET, "both/")
    assert sorted(found.files) == ["both/part-00000.parquet", "both/part-20261126T071846Z-00000.parquet"]
    dataset.refuse_foreign(found, "s3://b/both/")  # no error: both runs' files are the job's
    cfg = config_for("both/", skip_existing=True)
    cfg.output.check(cfg, s3)  # neither refused as existing
    s3.put_object(Bucket=BUCKET, Key="both/part-2026-00000.parquet", Body=b"x")
    with pytest.raises(JobError, match=r"holds 1 object the job did not write \(for example "
                                       r"'both/part-2026-00000.parquet'\)"):
        cfg.output.check(cfg, s3)


# ----------------------------------------------------------------------------
# Two runs' files on S3


def write_files(s3, prefix: str, keys: list[str], rows_per_file: int, fail=frozenset(),
                appending=None) -> dataset_files.DatasetSink:
    sink = dataset_files.DatasetSink(s3, BUCKET, prefix, rows_per_file, METADATA, appending=appending)
    sink.write([rows_batch(keys, fail)])
    sink.close()
    return sink


def test_a_second_run_finds_the_first_runs_keys_and_adds_files_of_its_own(s3, moto_endpoint):
    first = [f"k{i:03d}" for i in range(0, 40, 2)]  # 20 keys, k019... odd ones come later
    write_files(s3, "two/", first, 8, fail=frozenset({"k004", "k030"}))
    cfg = config_for("two/", moto_endpoint, skip_existing=True)
    images = listed([f"k{i:03d}" for i in range(40)])
    found = dataset.find(cfg, s3, images)
    assert found.listed == 40 and found.in_output == 20 and found.skipped == 20 and found.rescored == 0
    assert found.new.keys.to_pylist() == [f"k{i:03d}" for i in range(1, 40, 2)]
    assert [(f.key, f.rows) for f in found.files] == [("two/part-00000.parquet", 8), ("two/part-00001.parquet", 8),
                                                      ("two/part-00002.parquet", 4)]
    assert found.fingerprints == {json.dumps(FINGERPRINT, sort_keys=True): "two/part-00000.parquet"}
    assert found.entry() == {"keys_in_output": 20, "skipped": 20, "rescored_errors": 0, "new_keys": 20,
                             "files_read": 3, "rows_read": 20, "seconds": round(found.seconds, 3)}
    record_fields.from_json(records.SummaryExisting, found.entry())

    layout = dataset.fresh_layout(8, (0, ""), found.new, dataset.new_run(dataset.contents(s3, BUCKET, "two/")), found)
    sink = write_files(s3, "two/", found.new.keys.to_pylist(), 8, appending=layout)
    assert [f["key"] for f in sink.files] == [f"two/part-{layout.run}-0000{i}.parquet" for i in range(3)]
    table = read_dataset(moto_endpoint, "two/")
    assert sorted(table.column("key").to_pylist()) == images.keys.to_pylist()  # each key once
    success = json.loads(s3.get_object(Bucket=BUCKET, Key="two/_SUCCESS")["Body"].read())
    assert success["rows"] == 40 and len(success["files"]) == 6
    assert [(r["run"], len(r["files"]), r["rows"]) for r in success["runs"]] == [(None, 3, 20), (layout.run, 3, 20)]
    assert dataset_files.summary_of(sink)["run"] == layout.run

    # Nothing new now; and a resume of the second run leaves its own files out of what exists.
    assert len(dataset.find(cfg, s3, images).new) == 0
    work = work_prefix.WorkPrefix(s3, BUCKET, "two/")
    work.write_job(FINGERPRINT, cfg.output_uri, layout.record())
    try:
        with pytest.raises(JobError, match=r"holds an earlier run's progress .* add --resume"):
            dataset.find(cfg, s3, images)
        again = dataset.find(config_for("two/", moto_endpoint, skip_existing=True, resume=True), s3, images)
        assert again.new.keys.to_pylist() == found.new.keys.to_pylist() and again.run == layout.run
        with pytest.raises(JobError, match=r"started without --rescore-errors"):
            dataset.find(config_for("two/", moto_endpoint, skip_existing=True, resume=True, rescore_errors=True),
                          s3, images)
    finally:
        work.remove()


def test_rescored_errors_replace_their_rows_in_the_earlier_files_in_place(s3, moto_endpoint):
    first = [f"r{i:02d}" for i in range(12)]
    write_files(s3, "rescore/", first, 5, fail=frozenset({"r01", "r07", "r08"}))
    cfg = config_for("rescore/", moto_endpoint, skip_existing=True, rescore_errors=True)
    images = listed([*first, "r12", "r13"])
    found = dataset.find(cfg, s3, images)
    assert found.new.keys.to_pylist() == ["r01", "r07", "r08", "r12", "r13"]
    assert found.rescored == 3 and found.skipped == 9 and found.owner.tolist() == [0, 1, 1]
    layout = dataset.fresh_layout(5, (0, ""), found.new, dataset.new_run(dataset.contents(s3, BUCKET, "rescore/")),
                              found, rescore_errors=True)
    assert layout.keys_sha256 == dataset.keys_digest(["r12", "r13"])  # the run's files hold only the new keys
    untouched = s3.head_object(Bucket=BUCKET, Key="rescore/part-00002.parquet")["ETag"]
    sink = dataset_files.DatasetSink(s3, BUCKET, "rescore/", 5, METADATA, appending=layout)
    sink.write([rows_batch(found.new.keys.to_pylist(), fail=frozenset({"r08"}), class_id=3)])
    sink.close()
    assert [f["key"] for f in sink.files] == [f"rescore/part-{layout.run}-00000.parquet"]
    assert [(f["key"], f["replaced"]) for f in sink.rewritten] == [("rescore/part-00000.parquet", 1),
                                                                   ("rescore/part-00001.parquet", 2)]
    assert s3.head_object(Bucket=BUCKET, Key="rescore/part-00002.parquet")["ETag"] == untouched
    table = read_dataset(moto_endpoint, "rescore/")
    rows = {row["key"]: row for row in table.to_pylist()}
    assert sorted(table.column("key").to_pylist()) == images.keys.to_pylist()  # each key once
    assert rows["r01"]["error"] is None and rows["r01"]["predictions"][0]["class_id"] == 3
    assert rows["r07"]["error"] is None and rows["r08"]["error"]["stage"] == "decode"  # failed again: its new row
    assert rows["r00"]["predictions"][0]["class_id"] == 1  # the rows beside them as they were
    rewritten = read_dataset(moto_endpoint, "rescore/part-00001.parquet")
    assert rewritten.column("key").to_pylist() == first[5:10]  # still its keys, in order
    assert rewritten.schema.metadata[b"mxinfer.fingerprint"] == METADATA["mxinfer.fingerprint"].encode()
    success = json.loads(s3.get_object(Bucket=BUCKET, Key="rescore/_SUCCESS")["Body"].read())
    assert [r["key"] for r in success["runs"][-1]["rewrote"]] == ["rescore/part-00000.parquet",
                                                                   "rescore/part-00001.parquet"]
    assert [f["bytes"] for f in success["files"]] == [
        s3.head_object(Bucket=BUCKET, Key=f["key"])["ContentLength"] for f in success["files"]]
    # What the next --rescore-errors run finds: only r08's error row is left.
    assert dataset.find(cfg, s3, images).new.keys.to_pylist() == ["r08"]


def test_a_skip_existing_plan_appends_where_a_plain_run_is_refused(s3, moto_endpoint):
    write_files(s3, "plan/", ["p0", "p1"], 8)
    images = listed(["p0", "p1", "p2"])
    with pytest.raises(JobError, match=r"already exists; add --skip-existing to score only the keys it lacks, or "
                                       r"--overwrite"):
        claim.claim_workload(config_for("plan/", moto_endpoint), s3, work_prefix.WorkPrefix(s3, BUCKET, "plan/"),
                           images, FINGERPRINT, dry=True)
    cfg = config_for("plan/", moto_endpoint, skip_existing=True)
    found = dataset.find(cfg, s3, images)
    work = work_prefix.WorkPrefix(s3, BUCKET, "plan/")
    workload = claim.claim_workload(cfg, s3, work, found.new, FINGERPRINT, dry=True,
                                    inputs=claim.WorkloadInputs((8, "given"), found))
    assert workload.todo.keys.to_pylist() == ["p2"] and workload.layout.run and not workload.resumed
    with pytest.raises(JobError, match=r"made with other settings"):
        claim.claim_workload(cfg, s3, work, found.new, {**FINGERPRINT, "top_k": 3},
                             dry=True, inputs=claim.WorkloadInputs((8, "given"), found))
