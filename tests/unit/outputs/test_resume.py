"""Durable progress and --resume (docs/claim.md).

Without Spark: the work prefix, the assembly's merge of runs, and the abort of
the output upload on a real SIGTERM. Through spark-submit on local-cluster: a
driver SIGKILLed once a third of the batches are durable, then ``--resume``,
gives byte for byte the output of an uninterrupted run; a run over existing
progress, or a resume with other settings, is refused; SIGTERM prints the
resume command and leaves no open upload; Parquet output equals JSON Lines.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

import infer_main
from demo import make_demo
from demo.s3proxy import S3Proxy
from mxjob.core import errors
from mxjob.executor import partition
from mxjob.inputs import listing
from mxjob.options.config import JobConfig, merge_settings, resolve
from mxjob.outputs import claim, fingerprint, jsonl, merge, work_prefix
from mxjob.run import scoring, signals
from mxjob.s3 import access, writes
from tests.support.helpers import bucket_with_model, lines_part, part_lines, spark_submit, start_spark_submit

BUCKET = "resume-bucket"


def line(key: str, class_id: int = 1) -> str:
    return json.dumps({"key": key, "predictions": [{"class_id": class_id, "probability": 0.5}]}, ensure_ascii=False)


def write_run(work: work_prefix.WorkPrefix, number: int, keys: list[str], batch: int, done: list[int]) -> None:
    """A run as the driver and executors leave it: plan, then the parts of the ``done`` batches."""
    run = work.start_run(number, keys, batch, None)
    for index in done:
        body = lines_part([line(k, number) for k in keys[index * batch:(index + 1) * batch]])
        work.client.put_object(Bucket=work.bucket, Key=partition.part_key(run.prefix, index), Body=body)


@pytest.fixture(scope="module")
def s3(moto_buckets):
    """The session's client, with BUCKET created."""
    return moto_buckets


def open_uploads(s3) -> list:
    return s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])


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


# --- Through spark-submit on local-cluster

IMAGES = 24
BATCH = 2


@pytest.fixture(scope="module")
def world(s3, moto_endpoint, demo_dir):
    bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    (_, _), (test_x, _) = make_demo.digits_split()
    keys = []
    for i in range(IMAGES):
        key = f"imgs/{i:03d}.png"
        s3.put_object(Bucket=BUCKET, Key=key, Body=make_demo.digit_png(test_x[i]))
        keys.append(key)
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="JPEG")
    s3.put_object(Bucket=BUCKET, Key="imgs/bad-empty.jpg", Body=b"")
    s3.put_object(Bucket=BUCKET, Key="imgs/bad-html.jpg", Body=b"<html>no</html>")
    keys += ["imgs/bad-empty.jpg", "imgs/bad-html.jpg"]
    return {"keys": sorted(keys), "endpoint": moto_endpoint}


def job_args(endpoint: str, output_key: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
            "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", endpoint, "--input-shape", "3,32,32",
            "--std", "255", "--batch-size", str(BATCH), "--top-k", "2", "--progress-seconds", "1", "--max-errors", "2",
            *extra]


def read(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def summary_of(s3, key: str) -> dict:
    return json.loads(read(s3, f"{key}.summary.json"))


@pytest.fixture(scope="module")
def reference(s3, world):
    """One uninterrupted run: the bytes every resumed run must reproduce."""
    started = time.time()
    result = spark_submit(job_args(world["endpoint"], "ref/out.jsonl"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return {"bytes": read(s3, "ref/out.jsonl"), "seconds": time.time() - started}


def parts(s3, output_key: str, run: int = 1) -> list[str]:
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.parts/run-{run:04d}-")
    return [obj["Key"] for obj in listing.get("Contents", []) if "/part-" in obj["Key"]]


def python_workers() -> list[psutil.Process]:
    return [child for proc in psutil.process_iter(["cmdline"])
            if "pyspark.daemon" in " ".join(proc.info["cmdline"] or []) for child in proc.children()]


def run_until(s3, world, output_key: str, at_least: int, sig: int, kill_a_worker: bool = False):
    """Run slowly (0.1 s per S3 request, one download thread); send ``sig`` to the driver's process
    group once ``at_least`` batches are durable. Returns (finished process, output, parts at the signal).
    """
    with S3Proxy(world["endpoint"], latency=0.1) as proxy:
        process = start_spark_submit(job_args(proxy.endpoint, output_key, "--io-threads", "1"))
        killed_worker = False
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None:
            done = parts(s3, output_key)
            if kill_a_worker and not killed_worker and done:
                for proc in python_workers():
                    proc.send_signal(signal.SIGKILL)
                    killed_worker = True
            if len(done) >= at_least:
                os.killpg(process.pid, sig)
                break
            time.sleep(0.05)
        output, _ = process.communicate(timeout=120)
    assert not kill_a_worker or killed_worker
    assert len(done) >= at_least, output[-3000:]
    return process, output, done


def resumed_keys(s3, output_key: str) -> int:
    """Lines durable under every run: the killed run's batches, and the estimate's sample it kept (run 2)."""
    return sum(len(part_lines(read(s3, key))) for run in (1, 2) for key in parts(s3, output_key, run))


@pytest.mark.spark
# Only with a worker killed first (a superset of the driver alone): a run of the driver-only case cost CI 64 s,
# and tests/unit/outputs/test_dataset.py kills the driver's process group mid-run and resumes too.
@pytest.mark.parametrize("kill_a_worker", [True], ids=["worker-then-driver"])
def test_a_driver_killed_after_a_third_resumes_to_the_uninterrupted_output(s3, world, reference, kill_a_worker,
                                                                           runner):
    output_key = f"kill-{int(kill_a_worker)}/out.jsonl"
    batches = -(-len(world["keys"]) // BATCH)
    started = time.time()
    process, _, at_kill = run_until(s3, world, output_key, -(-batches // 3), signal.SIGKILL, kill_a_worker)
    first_seconds = time.time() - started
    assert process.returncode == -signal.SIGKILL
    assert not access.object_exists(s3, BUCKET, output_key)
    durable_after_kill = parts(s3, output_key)
    assert set(at_kill) <= set(durable_after_kill)
    lines_durable = resumed_keys(s3, output_key)

    # The progress is not silently thrown away, and a different model or top-k never mixes in.
    plain = runner.invoke(infer_main.main, job_args(world["endpoint"], output_key))
    assert plain.exit_code == 1 and "holds an earlier run's progress" in plain.output
    assert "add --resume to finish it, or --overwrite" in plain.output
    other_k = runner.invoke(infer_main.main, job_args(world["endpoint"], output_key, "--resume", "--top-k", "3"))
    assert other_k.exit_code == 1 and "top_k: 2 then, 3 now" in other_k.output
    other_model = runner.invoke(infer_main.main, [*job_args(world["endpoint"], output_key, "--resume"),
                                                  "--model", f"s3://{BUCKET}/model/digits_softmax"])
    assert other_model.exit_code == 1 and "model_symbol (a different file" in other_model.output
    assert parts(s3, output_key) == durable_after_kill and not access.object_exists(s3, BUCKET, output_key)

    started = time.time()
    result = spark_submit(job_args(world["endpoint"], output_key, "--resume"))
    resume_seconds = time.time() - started
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert read(s3, output_key) == reference["bytes"]
    summary = summary_of(s3, output_key)
    assert summary["reused"] == lines_durable >= len(at_kill) * BATCH
    assert summary["scored"] + summary["reused"] == len(world["keys"]) == summary["keys_listed"]
    assert summary["resumed"] is True and summary["runs"] == 2
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.parts/")["KeyCount"] == 0
    # The killed driver's open upload of the output (its merge followed the run) was aborted by the resume.
    assert not [u for u in open_uploads(s3) if u["Key"].startswith(output_key)]
    print(f"\nkill/resume ({'worker, then ' if kill_a_worker else ''}driver): {batches} batches, "
          f"{len(at_kill)} durable when the kill was sent, {len(durable_after_kill)} after; "
          f"reused {summary['reused']}, scored {summary['scored']}; first run {first_seconds:.1f} s (0.1 s S3 "
          f"latency), resume {resume_seconds:.1f} s, uninterrupted {reference['seconds']:.1f} s")


@pytest.mark.spark
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_prints_the_resume_command_and_leaves_the_parts_and_no_upload(s3, world, sig):
    """SIGTERM (YARN, ``kill``) or SIGINT (Ctrl-C) to the driver's process group, as a terminal sends it."""
    output_key = f"signal-{sig.name}/out.jsonl"
    process, output, at_signal = run_until(s3, world, output_key, 3, sig)
    interrupted = [x for x in output.splitlines() if x.startswith("Interrupted by")]
    assert len(interrupted) == 1 and interrupted[0].startswith(f"Interrupted by {sig.name}: "), output[-3000:]
    assert process.returncode != 0
    assert f"durable under s3://resume-bucket/{output_key}.parts/" in interrupted[0]
    assert interrupted[0].endswith("--resume'") and "Resume with: make submit ARGS='--input " in interrupted[0]
    assert "Traceback" not in output
    assert len(parts(s3, output_key)) >= len(at_signal) and open_uploads(s3) == []
    assert not access.object_exists(s3, BUCKET, output_key)


@pytest.mark.spark
def test_parquet_output_equals_the_json_lines_row_for_row(s3, world, reference):
    result = spark_submit(job_args(world["endpoint"], "ref/out.parquet"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = pq.read_table(io.BytesIO(read(s3, "ref/out.parquet")))
    assert table.schema.names == ["key", "predictions", "error"]
    predictions = table.schema.field("predictions").type
    assert isinstance(predictions, pa.ListType) and predictions.value_type == pa.struct(
        [("class_id", pa.int32()), ("label", pa.string()), ("probability", pa.float32())])
    assert table.schema.field("error").type == pa.struct(
        [("stage", pa.string()), ("type", pa.string()), ("message", pa.string())])
    rows = table.to_pylist()
    expected = [json.loads(x) for x in reference["bytes"].decode().splitlines()]
    assert len(rows) == len(expected) == len(world["keys"])
    errors = 0
    for row, want in zip(rows, expected):
        assert row["key"] == want["key"]
        if "error" in want:
            errors += 1
            assert row["error"] == want["error"] and row["predictions"] is None
        else:
            assert row["error"] is None
            assert [(p["class_id"], p["label"]) for p in row["predictions"]] == [
                (p["class_id"], p.get("label")) for p in want["predictions"]]
            assert [p["probability"] for p in row["predictions"]] == pytest.approx(
                [p["probability"] for p in want["predictions"]], rel=1e-6)
    assert errors == 2
    assert summary_of(s3, "ref/out.parquet")["output_format"] == "parquet"


def test_the_same_undecodable_image_gives_the_same_error_line_in_every_run():
    def failure() -> str:
        try:
            Image.open(io.BytesIO(b"<html>no</html>"))
        except Exception as exc:  # noqa: BLE001 - whatever Pillow raises is the line's content
            return errors.error_line("k.jpg", "decode", exc)
        raise AssertionError("Pillow opened HTML")

    first, second = failure(), failure()
    assert first == second and "object at 0x" not in first and "cannot identify image file" in first
