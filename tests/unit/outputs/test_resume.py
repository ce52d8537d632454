"""Durable progress and --resume (docs/claim.md), without Spark.

The work prefix, the assembly's merge of runs, the settings' differences, the
abort of the output upload on a real SIGTERM, the refusal of an existing
output, a second YARN attempt, the resume command, and the same error line
for an undecodable image in every run. ``tests/integration/test_resume.py``
kills and resumes real runs through spark-submit on local-cluster.
"""

from __future__ import annotations

import io
import json
import os
import signal

import pytest
from PIL import Image

import infer_main
from mxjob.core import errors
from mxjob.executor import partition
from mxjob.inputs import listing
from mxjob.options.config import JobConfig, merge_settings, resolve
from mxjob.outputs import claim, fingerprint, jsonl, merge, work_prefix
from mxjob.run import scoring, signals
from mxjob.s3 import access, writes
from tests.support import resume_bucket
from tests.support.helpers import lines_part
from tests.support.resume_bucket import BUCKET, open_uploads, read

# The fixture shared with tests/integration/test_resume.py, bound here for pytest to find.
s3 = resume_bucket.s3


def line(key: str, class_id: int = 1) -> str:
    return json.dumps({"key": key, "predictions": [{"class_id": class_id, "probability": 0.5}]}, ensure_ascii=False)


def write_run(work: work_prefix.WorkPrefix, number: int, keys: list[str], batch: int, done: list[int]) -> None:
    """A run as the driver and executors leave it: plan, then the parts of the ``done`` batches."""
    run = work.start_run(number, keys, batch, None)
    for index in done:
        body = lines_part([line(k, number) for k in keys[index * batch:(index + 1) * batch]])
        work.client.put_object(Bucket=work.bucket, Key=partition.part_key(run.prefix, index), Body=body)


def assemble_to(s3, work, keys, out_key) -> tuple[merge.AssemblyCounts, str]:
    sink = jsonl.JsonLinesSink(writes.MultipartWriter(s3, BUCKET, out_key))
    counts = merge.assemble(work, work.runs(), keys, sink)
    sink.close()
    return counts, s3.get_object(Bucket=BUCKET, Key=out_key)["Body"].read().decode()


def test_assembly_merges_two_runs_in_key_order_with_one_line_per_key(s3):
    work = work_prefix.WorkPrefix(s3, BUCKET, "merge/out.jsonl")
    keys = sorted(["a.jpg", "b.jpg", "c.jpg", "d.jpg", "é.jpg", "f.jpg", "g.jpg"])  # "é" sorts after "g"
    write_run(work, 1, keys, 2, done=[0, 2])  # a b, f g durable; c d and é were not
    write_run(work, 2, ["c.jpg", "d.jpg", "é.jpg"], 1, done=[0, 1, 2])
    counts, text = assemble_to(s3, work, keys, "merge/out.jsonl")
    rows = [json.loads(x) for x in text.splitlines()]
    assert [r["key"] for r in rows] == keys
    # Each line came from the run that scored it (class_id = run number here).
    assert [r["predictions"][0]["class_id"] for r in rows] == [1, 1, 2, 2, 1, 1, 2]
    assert (counts.predicted, counts.failed, counts.dropped, counts.parts_read) == (7, 0, 0, 5)


def test_assembly_refuses_a_key_without_a_line_and_leaves_no_object_or_upload(s3):
    work = work_prefix.WorkPrefix(s3, BUCKET, "gap/out.jsonl")
    keys = ["a", "b", "c", "d"]
    write_run(work, 1, keys, 2, done=[0])
    sink = jsonl.JsonLinesSink(writes.MultipartWriter(s3, BUCKET, "gap/out.jsonl"))
    with pytest.raises(work_prefix.ResumeError, match=r"no line for key 'c'.*\(2 keys without a line\)"):
        merge.assemble(work, work.runs(), keys, sink)
    sink.abort()
    assert not access.object_exists(s3, BUCKET, "gap/out.jsonl") and open_uploads(s3) == []


def test_a_key_two_runs_scored_gets_the_earlier_runs_line_once(s3):
    work = work_prefix.WorkPrefix(s3, BUCKET, "twice/out.jsonl")
    write_run(work, 1, ["a", "b", "c", "d"], 2, done=[0, 1])  # c, d became durable after the resume planned
    write_run(work, 2, ["c", "d"], 2, done=[0])
    counts, text = assemble_to(s3, work, ["a", "b", "c", "d"], "twice/out.jsonl")
    rows = [json.loads(x) for x in text.splitlines()]
    assert [(r["key"], r["predictions"][0]["class_id"]) for r in rows] == [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    assert counts.superseded == 2


def test_lines_of_keys_no_longer_listed_are_dropped_and_counted(s3):
    work = work_prefix.WorkPrefix(s3, BUCKET, "drop/out.jsonl")
    write_run(work, 1, ["a", "b", "c"], 3, done=[0])
    counts, text = assemble_to(s3, work, ["a", "c"], "drop/out.jsonl")
    assert [json.loads(x)["key"] for x in text.splitlines()] == ["a", "c"] and counts.dropped == 1


def test_remaining_keys_are_those_outside_every_durable_batch(s3):
    work = work_prefix.WorkPrefix(s3, BUCKET, "remain/out.jsonl")
    keys = [f"k{i:02d}" for i in range(10)]
    write_run(work, 1, keys, 3, done=[1, 3])  # k03-k05 and k09
    write_run(work, 2, ["k00", "k01", "k02"], 3, done=[])
    listed = [*keys, "new"]
    keep = work_prefix.remaining_keys(work, work.runs(), listed).to_pylist()
    assert [k for k, needed in zip(listed, keep) if needed] == ["k00", "k01", "k02", "k06", "k07", "k08",
                                                                          "new"]


def test_differences_name_each_changed_setting_and_file():
    before = fingerprint.fingerprint({"top_k": 2, "preprocess": {"input_shape": (3, 32, 32), "mean": (0.0,)}},
                                 {"model_params": b"a"})
    after = fingerprint.fingerprint({"top_k": 3, "preprocess": {"input_shape": [3, 32, 32], "mean": [0.0]}},
                                {"model_params": b"b"})
    assert fingerprint.differences(json.loads(json.dumps(before)), before) == []  # as read back from job.json
    found = fingerprint.differences(json.loads(json.dumps(before)), after)
    assert len(found) == 2
    assert found[0].startswith("model_params (a different file: sha256 ") and found[1] == "top_k: 2 then, 3 now"


def test_sigterm_during_the_assembly_aborts_the_upload_and_keeps_the_parts(s3, monkeypatch):
    work = work_prefix.WorkPrefix(s3, BUCKET, "term/out.jsonl")
    keys = [f"k{i:03d}" for i in range(50)]
    write_run(work, 1, keys, 10, done=[0, 1, 2, 3, 4])
    cfg = resolve(merge_settings(
        {"input": f"s3://{BUCKET}/in/", "model": f"s3://{BUCKET}/m", "output": f"s3://{BUCKET}/term/out.jsonl"}, {}))
    writes = []
    real_write = jsonl.JsonLinesSink.write_lines

    def write_then_signal(self, lines):
        real_write(self, lines)
        writes.append(len(lines))
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, through the driver's real handler

    monkeypatch.setattr(jsonl.JsonLinesSink, "write_lines", write_then_signal)
    monkeypatch.setattr(merge, "assemble", lambda w, runs, k, sink, **_: [sink.write_lines([line(x)]) for x in k])
    previous = signal.signal(signal.SIGTERM, signals.raise_interrupted)
    try:
        with pytest.raises(signals.Interrupted, match="SIGTERM"):
            scoring.assemble_output(cfg, s3, work, [(k, 1) for k in keys])
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signals.received.clear()
    assert writes == [1]  # the upload was open and had data when the signal came
    assert open_uploads(s3) == [] and not access.object_exists(s3, BUCKET, "term/out.jsonl")
    assert sorted(work.runs()[0].done) == [0, 1, 2, 3, 4]


def config(output_key: str, *args: str) -> JobConfig:
    options = {"input": f"s3://{BUCKET}/in/", "model": f"s3://{BUCKET}/m", "output": f"s3://{BUCKET}/{output_key}"}
    for flag in args:
        options[flag.lstrip("-")] = True
    return resolve(merge_settings(options, {}))


def test_an_existing_output_is_refused_and_left_untouched_unless_overwrite(s3):
    s3.put_object(Bucket=BUCKET, Key="done/out.jsonl", Body=b"yesterday's results\n")
    work = work_prefix.WorkPrefix(s3, BUCKET, "done/out.jsonl")
    images = listing.Listing.build(BUCKET, ["in/a.jpg"], [1])
    with pytest.raises(errors.JobError, match=r"s3://resume-bucket/done/out.jsonl \(or its summary\) already "
                                                  r"exists; add --overwrite to replace it"):
        claim.claim_workload(config("done/out.jsonl"), s3, work, images, {"top_k": 2})
    assert read(s3, "done/out.jsonl") == b"yesterday's results\n" and not work.exists()
    plan = claim.claim_workload(config("done/out.jsonl", "--overwrite"), s3, work, images, {"top_k": 2})
    assert plan.todo is images and work.read_job()["fingerprint"] == {"top_k": 2}
    # --resume of a finished output (no work prefix left) has nothing to do.
    work.remove()
    with pytest.raises(claim.Completed, match=r"s3://resume-bucket/done/out\.jsonl"):
        claim.claim_workload(config("done/out.jsonl", "--resume"), s3, work, images, {"top_k": 2})


def test_a_second_yarn_attempt_of_the_same_application_resumes_by_itself(s3, monkeypatch):
    work = work_prefix.WorkPrefix(s3, BUCKET, "yarn/out.jsonl")
    keys = ["a", "b", "c", "d"]
    work.write_job({"top_k": 2}, "s3://resume-bucket/yarn/out.jsonl")
    run = work.start_run(1, keys, 2, "application_1700000000000_0007")
    s3.put_object(Bucket=BUCKET, Key=partition.part_key(run.prefix, 0), Body=lines_part([]))
    images = listing.Listing.build(BUCKET, keys, [1] * len(keys))
    monkeypatch.setenv("CONTAINER_ID", "container_e05_1700000000000_0007_02_000001")
    plan = claim.claim_workload(config("yarn/out.jsonl"), s3, work, images, {"top_k": 2})
    assert plan.resumed and [k for k, _ in plan.todo] == ["c", "d"] and plan.number == 2
    # Attempt 2 of another application never takes this work over.
    monkeypatch.setenv("CONTAINER_ID", "container_e05_1700000000000_0008_02_000001")
    with pytest.raises(errors.JobError, match="holds an earlier run's progress"):
        claim.claim_workload(config("yarn/out.jsonl"), s3, work, images, {"top_k": 2})


def test_yarn_attempt_is_read_from_the_container_id(monkeypatch):
    monkeypatch.setenv("CONTAINER_ID", "container_e17_1410901177871_0031_02_000001")
    assert claim.yarn_attempt() == ("application_1410901177871_0031", 2)
    monkeypatch.setenv("CONTAINER_ID", "container_1410901177871_0031_01_000001")
    assert claim.yarn_attempt() == ("application_1410901177871_0031", 1)
    monkeypatch.delenv("CONTAINER_ID")
    assert claim.yarn_attempt() == (None, 1)


def test_resume_command_adds_resume_and_drops_overwrite():
    command = infer_main.resume_command(["/x/infer_main.py", "--output", "s3://b/o k.jsonl", "--overwrite"])
    # Outside spark-submit nothing says its options: a shell comment after the line says what to repeat.
    line, _, note = command.partition("  # ")
    assert line.endswith("infer_main.py --output 's3://b/o k.jsonl' --resume") and "with --resume added" in note


def test_the_same_undecodable_image_gives_the_same_error_line_in_every_run():
    def failure() -> str:
        try:
            Image.open(io.BytesIO(b"<html>no</html>"))
        except Exception as exc:  # noqa: BLE001 - whatever Pillow raises is the line's content
            return json.dumps(errors.error_object("decode", exc))
        raise AssertionError("Pillow opened HTML")

    first, second = failure(), failure()
    assert first == second and "object at 0x" not in first and "cannot identify image file" in first
