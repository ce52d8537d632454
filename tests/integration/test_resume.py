"""Durable progress and --resume (docs/claim.md) through spark-submit on local-cluster.

A driver SIGKILLed once a third of the batches are durable, then
``--resume``, gives byte for byte the output of an uninterrupted run; a run
over existing progress, or a resume with other settings, is refused; SIGTERM
prints the resume command and leaves no open upload; Parquet output equals
JSON Lines. The work prefix, the assembly and the refusals are tested without
Spark in ``tests/unit/outputs/test_resume.py``.
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
from mxjob.s3 import access
from tests.support import resume_bucket
from tests.support.helpers import bucket_with_model, part_lines, spark_submit, start_spark_submit
from tests.support.resume_bucket import BUCKET, open_uploads, read

# The fixture shared with tests/unit/outputs/test_resume.py, bound here for pytest to find.
s3 = resume_bucket.s3

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
# and tests/integration/test_dataset.py kills the driver's process group mid-run and resumes too.
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
