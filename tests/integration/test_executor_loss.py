"""Lost executors and speculation on local-cluster: one line per key, and the summary counts the lost attempts.

What a spot interruption does to a run: the executor's JVM (not just a Python
worker) dies mid-run. Each test runs a few hundred demo images through
spark-submit on ``local-cluster[3,1,1024]``, with a handler that sleeps in
every image so that tasks are in flight when the kill comes, SIGKILLs one
(then two) ``CoarseGrainedExecutorBackend`` JVMs once some parts are durable,
and lets the job finish on its own: Spark reruns the lost tasks on the other
executors, and local-cluster's Master starts new executors in place of the
dead ones. Speculation runs a second copy of a slow batch; both copies write
the same part key, so the output still has each key once. Spark never copies
a task to a host where an attempt of it runs, and local-cluster's executors
share one host, so the speculation test runs on a standalone cluster of two
workers on two loopback addresses, and checks in Spark's event log that the
copy ran, on the other host.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pyspark
import pytest

from demo import make_demo
from demo.run_local import spark_env, spark_submit_command
from tests.support import event_logs
from tests.support.helpers import ROOT, bucket_with_model

BUCKET = "executor-loss"
IMAGES = 240
BATCH = 8
MASTER = "local-cluster[3,1,1024]"
#: Seconds each image sleeps in the handler: a batch takes about 0.4 s, so tasks are in flight at any moment.
SLOW = 0.05

HANDLER = """
import io
import time

import numpy as np
from PIL import Image


def input_handler(key, data):
    from pyspark import TaskContext

    task = TaskContext.get()
    # Speculation's test slows the first attempt of one batch a lot, so a second copy starts and wins.
    if "{slow_key}" and key == "{slow_key}" and task is not None and task.attemptNumber() == 0:
        time.sleep({slow_seconds})
    time.sleep({delay})
    image = Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32))
    return np.asarray(image, np.float32).transpose(2, 0, 1)
"""

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir, tmp_path_factory):
    """The bucket: the demo model and IMAGES digit PNGs; the keys, sorted."""
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    (_, _), (test_x, _) = make_demo.digits_split()
    keys = [f"imgs/{i:03d}.png" for i in range(IMAGES)]
    for i, key in enumerate(keys):
        s3.put_object(Bucket=BUCKET, Key=key, Body=make_demo.digit_png(test_x[i % len(test_x)]))
    return {"s3": s3, "endpoint": moto_endpoint, "keys": keys, "work": tmp_path_factory.mktemp("loss")}


def handler_file(world, name: str, slow_key: str = "", slow_seconds: float = 0.0) -> str:
    path = world["work"] / f"{name}.py"
    path.write_text(HANDLER.format(slow_key=slow_key, slow_seconds=slow_seconds, delay=SLOW))
    return str(path)


def start(world, output_key: str, handler: str, *conf: str, master: str = MASTER) -> subprocess.Popen:
    """spark-submit of the job on ``master``, in a session of its own, with extra ``--conf`` settings."""
    command = spark_submit_command(
        ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
         "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", world["endpoint"],
         "--input-shape", "3,32,32", "--std", "255", "--batch-size", str(BATCH), "--top-k", "1",
         "--handler", handler, "--progress-seconds", "1"], master)
    for setting in reversed(conf):
        command[3:3] = ["--conf", setting]
    return subprocess.Popen(command, env=spark_env(), cwd=str(ROOT), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def durable_parts(s3, output_key: str) -> int:
    return s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.parts/")["KeyCount"]


def executor_jvms(process: subprocess.Popen) -> list[psutil.Process]:
    """The executors' JVMs among the spark-submit process's descendants (local-cluster's Workers start them)."""
    found = []
    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            if "CoarseGrainedExecutorBackend" in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            continue
    return found


def kill_executors_when_durable(world, process: subprocess.Popen, output_key: str, parts: int, count: int) -> list:
    """Once ``parts`` parts are durable, SIGKILL ``count`` executor JVMs at once; their PIDs."""
    deadline = time.monotonic() + 120
    while durable_parts(world["s3"], output_key) < parts or len(executor_jvms(process)) < 3:
        assert process.poll() is None, process.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the job made no durable part in time"
        time.sleep(0.2)
    victims = executor_jvms(process)[:count]
    for victim in victims:
        victim.kill()  # SIGKILL: the JVM and its Python workers' sockets go at once, as on a reclaimed node
    return [victim.pid for victim in victims]


def finish(world, process: subprocess.Popen, output_key: str) -> tuple[list[dict], dict]:
    """Wait for the job to end on its own; its output's lines and its summary."""
    output, _ = process.communicate(timeout=240)
    assert process.returncode == 0, output[-4000:]
    s3 = world["s3"]
    lines = s3.get_object(Bucket=BUCKET, Key=output_key)["Body"].read().decode().splitlines()
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{output_key}.summary.json")["Body"].read())
    return [json.loads(line) for line in lines], summary


def assert_one_prediction_per_key(world, rows: list[dict], summary: dict) -> None:
    assert [row["key"] for row in rows] == world["keys"]  # sorted, each key once
    assert all(len(row["predictions"]) == 1 for row in rows)
    assert (summary["keys_listed"], summary["predicted"], summary["failed"]) == (IMAGES, IMAGES, 0)
    assert summary["assembly"]["lines_dropped"] == 0


# The undisturbed control (nothing lost or retried, stats counted once) is
# tests/integration/test_job.py's test_summary_reports_counts_timing_model_and_options, and one executor killed
# is tests/integration/test_faults.py's
# test_a_killed_worker_or_executor_changes_nothing_in_the_output[executor] (the output byte for byte): runs of their
# own here cost CI 37 and 44 s.
@pytest.mark.parametrize("killed", [2], ids=["two-of-three"])
def test_a_run_that_loses_executors_finishes_with_one_line_per_key(world, killed):
    output_key = f"lost-{killed}/out.jsonl"
    started = time.monotonic()
    process = start(world, output_key, handler_file(world, f"slow_{killed}"))
    try:
        victims = kill_executors_when_durable(world, process, output_key, parts=4, count=killed)
        rows, summary = finish(world, process, output_key)
    finally:
        if process.poll() is None:
            process.kill()
    seconds = time.monotonic() - started
    assert len(victims) == killed
    assert_one_prediction_per_key(world, rows, summary)
    print(f"\n{killed} of 3 executors killed: {summary['lost_task_attempts']} task attempts lost, "
          f"{summary['retried_batches']} batches from a retried task, {len(summary['executors'])} executors ran "
          f"batches; spark-submit {seconds:.1f} s, Spark job {summary['seconds']['spark']:.1f} s")
    # Each batch's stats are counted once, on the executor whose attempt succeeded: a lost attempt's never.
    # (Whether local-cluster's replacement executors get a batch depends on how fast this host starts a JVM,
    # so the count of executors is printed above, not asserted.)
    assert sum(executor["batches"] for executor in summary["executors"].values()) == IMAGES // BATCH
    assert sum(executor["images"] for executor in summary["executors"].values()) == IMAGES
    # Each killed executor had one task in flight (one core each), unless it was between tasks.
    assert 1 <= summary["lost_task_attempts"] <= killed
    assert summary["retried_batches"] >= 1


#: The standalone cluster's workers: one core each, on loopback addresses of their own (see ``two_hosts``).
WORKER_HOSTS = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def two_hosts(tmp_path_factory):
    """A Spark standalone cluster whose two workers are on two hosts: ``spark://127.0.0.1:PORT``.

    Spark never starts a speculative copy of a task on a host where an attempt
    of it runs (``TaskSetManager.dequeueSpeculativeTask``: ``!hasAttemptOnHost``),
    and every executor of ``local-cluster`` is on the one host: there a slow
    task is never copied. Linux answers on all of 127.0.0.0/8, so a worker on
    127.0.0.2 and one on 127.0.0.3 are two hosts to the scheduler.
    """
    logs = tmp_path_factory.mktemp("standalone")
    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = spark_env()
    processes = [subprocess.Popen([str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", "0"],
                                  env={**env, "SPARK_LOCAL_IP": "127.0.0.1"}, stdout=open(logs / "master.log", "w"),
                                  stderr=subprocess.STDOUT)]
    master_log = logs / "master.log"
    try:
        wait_for(master_log, "I have been elected leader", processes[0])
        for host in WORKER_HOSTS:
            processes.append(subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", "--host", host, "--cores", "1",
                 "--memory", "1g", "--webui-port", "0", f"spark://127.0.0.1:{port}"],
                env={**env, "SPARK_LOCAL_IP": host}, stdout=open(logs / f"worker-{host}.log", "w"),
                stderr=subprocess.STDOUT))
        for host in WORKER_HOSTS:
            wait_for(master_log, f"Registering worker {host}:", processes[0])
        yield f"spark://127.0.0.1:{port}"
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)


def wait_for(log: Path, text: str, process: subprocess.Popen, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while text not in log.read_text(errors="replace"):
        assert process.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.2)


def task_starts(events: Path) -> list[dict]:
    """Each ``SparkListenerTaskStart``'s task info in Spark's event logs under ``events``."""
    return [event["Task Info"] for event in event_logs.events(events) if event.get("Event") == "SparkListenerTaskStart"]


def test_a_speculative_copy_of_a_slow_batch_never_doubles_a_line(world, two_hosts, tmp_path):
    """Speculation on, one batch slow on its first attempt: Spark copies it to the other host, the copy wins."""
    output_key = "speculation/out.jsonl"
    slow = world["keys"][BATCH * 5]  # the first key of batch 5
    events = tmp_path / "events"
    events.mkdir()
    process = start(world, output_key, handler_file(world, "slow_once", slow_key=slow, slow_seconds=30),
                    "spark.speculation=true", "spark.speculation.multiplier=2", "spark.speculation.quantile=0.5",
                    "spark.speculation.minTaskRuntime=1s", "spark.speculation.interval=200ms",
                    # Spark 3.4+ speculates only a task slow on its input rate by default; this one reads none.
                    "spark.speculation.efficiency.enabled=false",
                    "spark.eventLog.enabled=true", f"spark.eventLog.dir=file://{events}",
                    "spark.cores.max=2", master=two_hosts)
    started = time.monotonic()
    rows, summary = finish(world, process, output_key)
    seconds = time.monotonic() - started
    assert_one_prediction_per_key(world, rows, summary)
    copies = [info for info in task_starts(events) if info["Speculative"]]
    # A copy of batch 5 ran, on the other host than its first attempt, and the job did not wait out the slow one.
    assert [info["Index"] for info in copies] == [5], copies
    first = [info for info in task_starts(events) if info["Index"] == 5 and not info["Speculative"]]
    assert {info["Host"] for info in first} != {copies[0]["Host"]}
    assert seconds < 30 + 20
    # The attempt that lost the race is killed, which Spark does not count as a failed attempt.
    assert summary["lost_task_attempts"] == 0
    print(f"\nspeculation: batch 5's copy started on {copies[0]['Host']} (first attempt on "
          f"{first[0]['Host']}); job {seconds:.1f} s with a 30 s slow first attempt; {len(rows)} lines, one per key")
