"""A signal to one process of the driver, the Python driver or spark-submit's JVM, interrupts the run.

Through spark-submit on local-cluster, slowed down by a proxy adding latency
to every S3 request: once the first batch is durable, SIGTERM goes to one
process only (not the process group, which tests/integration/test_resume.py signals). The
job must stop within seconds, with one line that says "Interrupted" and how
to resume, not "failed".
"""

from __future__ import annotations

import json
import os
import signal
import time

import psutil
import pytest

from demo import make_demo
from demo.s3proxy import S3Proxy
from mxjob.run import signals
from tests.support.helpers import bucket_with_model, start_spark_submit

pytestmark = pytest.mark.spark

BUCKET = "signal-bucket"
IMAGES = 40
BATCH = 2
BATCHES = IMAGES // BATCH


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    (_, _), (test_x, _) = make_demo.digits_split()
    for i in range(IMAGES):
        s3.put_object(Bucket=BUCKET, Key=f"imgs/{i:03d}.png", Body=make_demo.digit_png(test_x[i]))
    return {"s3": s3, "endpoint": moto_endpoint}


def parts(s3, output_key: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.parts/run-0001-")
    return [obj["Key"] for obj in listing.get("Contents", []) if "/part-" in obj["Key"]]


def python_driver(jvm: psutil.Process) -> psutil.Process:
    """The Python driver: the child of spark-submit's JVM that runs infer_main.py (executors are children too)."""
    found = []
    for child in jvm.children():
        try:
            cmdline = child.cmdline()
        except psutil.Error:  # an executor's short-lived helper, gone meanwhile
            continue
        if cmdline and "python" in os.path.basename(cmdline[0]) and "infer_main.py" in " ".join(cmdline):
            found.append(child)
    [driver] = found
    return driver


def signal_once_durable(world, output_key: str, target: str):
    """Start the job, send SIGTERM to ``target`` ("python" or "jvm") once a batch is durable.

    Returns (seconds from the signal to the end, exit code, output).
    """
    with S3Proxy(world["endpoint"], latency=0.2) as proxy:
        process = start_spark_submit([
            "--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
            "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", proxy.endpoint, "--input-shape", "3,32,32",
            "--std", "255", "--batch-size", str(BATCH), "--io-threads", "1", "--progress-seconds", "1"])
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None and not parts(world["s3"], output_key):
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()[0][-3000:]
        jvm = psutil.Process(process.pid)
        victim = python_driver(jvm) if target == "python" else jvm
        victim.send_signal(signal.SIGTERM)
        signalled = time.time()
        output, _ = process.communicate(timeout=120)
        return time.time() - signalled, process.returncode, output


def assert_interrupted(world, output_key: str, seconds: float, code: int, output: str, how: str) -> str:
    interrupted = [line for line in output.splitlines() if line.startswith("Interrupted by")]
    assert len(interrupted) == 1 and interrupted[0].startswith(f"Interrupted by {how}: "), output[-3000:]
    assert seconds < 20, f"the job went on for {seconds:.0f} s after the signal"
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "Error:" not in output and "job failed" not in output and "Traceback" not in output, output[-3000:]
    assert "\tat org.apache" not in output, output[-3000:]  # no JVM stack traces either
    done = len(parts(world["s3"], output_key))
    assert 0 < done < BATCHES
    assert f"{done} of {BATCHES} batches of this run are durable under s3://{BUCKET}/{output_key}.parts/" \
        in interrupted[0]
    assert interrupted[0].endswith("--resume'")  # make submit ARGS='... --resume'
    return interrupted[0]


def test_sigterm_to_the_python_driver_alone_cancels_the_spark_job_within_seconds(world):
    seconds, code, output = signal_once_durable(world, "python/out.jsonl", "python")
    line = assert_interrupted(world, "python/out.jsonl", seconds, code, output, "SIGTERM")
    # The run was started by spark-submit with make submit's settings: make submit resumes it.
    assert "Resume with: make submit ARGS='--input s3://signal-bucket/imgs/ " in line, line


@pytest.mark.stacks
def test_sigterm_to_the_spark_submit_jvm_alone_is_an_interruption_not_a_failure(world):
    seconds, code, output = signal_once_durable(world, "jvm/out.jsonl", "jvm")
    what = str(signals.Interrupted(signal.SIGTERM, "a shutdown of spark-submit's JVM (SIGTERM or Ctrl-C to it)"))
    assert_interrupted(world, "jvm/out.jsonl", seconds, code, output, what)
    assert "SparkContext was shut down" not in output


def test_sigterm_to_the_spark_submit_jvm_alone_before_any_spark_job_leaves_the_run_interrupted(world):
    # While the driver lists and checks the model (no Spark job yet, so no Spark call notices the JVM going):
    # the Python driver sees its parent gone and stops as interrupted, rather than leaving "running" behind.
    output_key = "jvm-early/out.jsonl"
    with S3Proxy(world["endpoint"], latency=1.0) as proxy:
        process = start_spark_submit([
            "--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
            "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", proxy.endpoint, "--input-shape", "3,32,32",
            "--std", "255", "--batch-size", str(BATCH), "--progress-seconds", "1"])
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None and "Contents" not in world["s3"].list_objects_v2(
                Bucket=BUCKET, Prefix=f"{output_key}.status.json"):
            time.sleep(0.1)
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert not world["s3"].list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.parts/run-").get("Contents")
        driver = python_driver(psutil.Process(process.pid))
        psutil.Process(process.pid).send_signal(signal.SIGTERM)
        signalled = time.time()
        output, _ = process.communicate(timeout=120)
        driver.wait(timeout=60)
        seconds = time.time() - signalled
    interrupted = [line for line in output.splitlines() if line.startswith("Interrupted by")]
    assert interrupted and interrupted[0].startswith(f"Interrupted by {signals.JVM_SHUTDOWN}: "), output[-3000:]
    assert "Error:" not in output and "Traceback" not in output, output[-3000:]
    status = json.loads(world["s3"].get_object(Bucket=BUCKET, Key=f"{output_key}.status.json")["Body"].read())
    assert status["state"] == "interrupted", status
    assert seconds < 30, f"the driver went on for {seconds:.0f} s after its JVM"
