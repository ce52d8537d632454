"""The job on a real YARN, as EMR runs it: ``spark-submit --master yarn --deploy-mode cluster``.

The local YARN (``make yarn-up``, :mod:`demo.yarn_local`) launches real
containers with YARN's physical-memory enforcement on. Each test submits the
packaged job the way ``make submit-yarn`` does (:mod:`demo.run_yarn`), with
the job config read from (moto) S3, and does to it what a cluster does to a
paying user's run: the driver dies inside the ApplicationMaster's container,
the application is killed through YARN, a node is lost, an executor outgrows
its container. Every run's output is compared, byte for byte, with one
uninterrupted run of the same job in client mode on ``local-cluster``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from demo import make_demo, run_yarn, yarn_local
from demo.s3proxy import S3Proxy
from tests.support.helpers import bucket_with_effnet, bucket_with_model, spark_submit

BUCKET = "yarn-mode"
EFFNET_BUCKET = "yarn-effnet"
IMAGES = 96
BATCH = 4

pytestmark = pytest.mark.yarn


@pytest.fixture(scope="module")
def local_yarn():
    """The local YARN with every node running (started, or reused and restarted if a node was stopped)."""
    was_running = yarn_local.read_state() is not None
    state = yarn_local.up(quiet=True)
    yield state
    if not was_running:
        yarn_local.down(quiet=True)


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    """The bucket: the demo model, IMAGES digit PNGs and an undecodable one, and the job config in S3."""
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    (_, _), (test_x, _) = make_demo.digits_split()
    keys = [f"imgs/{i:03d}.png" for i in range(IMAGES)]
    for i, key in enumerate(keys):
        s3.put_object(Bucket=BUCKET, Key=key, Body=make_demo.digit_png(test_x[i]))
    s3.put_object(Bucket=BUCKET, Key="imgs/zz-broken.png", Body=b"<html>not an image</html>")
    job = {"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/model/digits", "input_shape": "3,32,32",
           "std": "255,255,255", "batch_size": BATCH, "top_k": 2, "progress_seconds": 1, "max_errors": 5}
    s3.put_object(Bucket=BUCKET, Key="conf/job.yaml", Body=yaml.safe_dump(job).encode())
    return {"s3": s3, "endpoint": moto_endpoint, "keys": sorted([*keys, "imgs/zz-broken.png"])}


def job_args(output_key: str, *extra: str) -> list[str]:
    return ["--config", f"s3://{BUCKET}/conf/job.yaml", "--output", f"s3://{BUCKET}/{output_key}", *extra]


def read(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def summary_of(s3, key: str) -> dict:
    return json.loads(read(s3, f"{key}.summary.json"))


def status_of(s3, key: str) -> dict:
    return json.loads(read(s3, f"{key}.status.json"))


def durable_parts(s3, output_key: str, run: str = "") -> int:
    """Batches whose lines are durable: the part objects of every run under the output's work prefix, or of
    ``run`` alone (``"0001-"``: the first run's, whose folder is ``run-0001-RUNID/``)."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{output_key}.parts/run-{run}")
    return sum("/part-" in obj["Key"] for page in pages for obj in page.get("Contents", ()))


def open_uploads(s3, bucket: str = BUCKET) -> list:
    return s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])


class Submission:
    """A cluster-mode spark-submit of the job on the local YARN, running in the background."""

    def __init__(self, tmp_path: Path, endpoint: str, args: list[str], overrides: dict | None = None):
        self.log = tmp_path / "spark-submit.log"
        conf = run_yarn.yarn_spark_conf(overrides, env=run_yarn.container_env(True, endpoint))
        command = run_yarn.submit_command(args, conf, tmp_path / "spark-yarn.conf")
        env = run_yarn.submit_env(True, endpoint)
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(command, env=env, cwd=str(run_yarn.ROOT), stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self._app_id: str | None = None

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def app_id(self, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while self._app_id is None:
            match = run_yarn.SUBMITTED.search(self.output())
            if match:
                self._app_id = match.group(1)
            else:
                assert self.process.poll() is None, self.output()[-3000:]
                assert time.monotonic() < deadline, "YARN accepted no application in time"
                time.sleep(0.2)
        return self._app_id

    def wait(self, timeout: float = 400.0) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            raise AssertionError(f"spark-submit did not end in {timeout:.0f} s:\n{self.output()[-3000:]}") from None

    def logs(self) -> str:
        """Every container's stdout and stderr, for a failure's message."""
        return "\n".join(f"--- {path}\n{path.read_text(errors='replace')[-4000:]}"
                         for folder in yarn_local.container_log_dirs(self.app_id())
                         for path in (folder / "stdout", folder / "stderr") if path.exists())


def driver_process(app_id: str, attempt: int = 1) -> int | None:
    """The Python driver's pid inside the ApplicationMaster's container of ``attempt``, if it runs yet."""
    _, cluster, number = app_id.split("_")
    container = f"container_{cluster}_{number}_{attempt:02d}_000001"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"infer_main.py" not in cmdline or b"python" not in cmdline.split(b"\0")[0]:
                continue
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"CONTAINER_ID={container}\0".encode() in environ:
            return int(pid)
    return None


def wait_for_parts(s3, submission: Submission, output_key: str, at_least: int, timeout: float = 240.0,
                   run: str = "") -> int:
    deadline = time.monotonic() + timeout
    while (done := durable_parts(s3, output_key, run)) < at_least:
        assert submission.process.poll() is None, submission.output()[-3000:]
        assert time.monotonic() < deadline, f"only {done} parts durable in time:\n{submission.output()[-2000:]}"
        time.sleep(0.1)
    return done


def wait_for_stage(s3, submission: Submission, output_key: str, stage: str, timeout: float = 240.0) -> None:
    """Until the run's status file says the driver is at ``stage`` (the status's ``stage``)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(s3.exceptions.NoSuchKey):  # one PutObject: never half a document
            if status_of(s3, output_key).get("stage") == stage:
                return
        assert submission.process.poll() is None, submission.output()[-3000:]
        assert time.monotonic() < deadline, f"no {stage} stage in time:\n{submission.output()[-2000:]}"
        time.sleep(0.2)


@contextlib.contextmanager
def slow_run(world, tmp_path: Path, output_key: str, parts: int, run: str = ""):
    """The job through a 50 ms S3 proxy with one download thread, so that its batches become durable one by one;
    yields ``(submission, application id, parts durable)`` once ``parts`` are (of ``run``'s alone: see
    :func:`durable_parts`), and stops the proxy after the block."""
    with S3Proxy(world["endpoint"], latency=0.05) as proxy:
        submission = Submission(tmp_path, proxy.endpoint, job_args(output_key, "--io-threads", "1"))
        app_id = submission.app_id()
        yield submission, app_id, wait_for_parts(world["s3"], submission, output_key, parts, run=run)


@pytest.fixture(scope="module")
def reference(world):
    """The same job, uninterrupted, in client mode on local-cluster: the bytes every YARN run must give."""
    output_key = "ref/out.jsonl"
    job = yaml.safe_load(read(world["s3"], "conf/job.yaml"))
    args = [f"--{key.replace('_', '-')}={value}" for key, value in job.items()]
    result = spark_submit([*args, "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", world["endpoint"]])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return read(world["s3"], output_key)


@pytest.fixture(scope="module")
def cluster_run(local_yarn, world, tmp_path_factory):
    """One uninterrupted cluster-mode run: (exit code, application id, YARN's report, the submission)."""
    submission = Submission(tmp_path_factory.mktemp("yarn-run"), world["endpoint"], job_args("yarn/out.jsonl"))
    code = submission.wait()
    app_id = submission.app_id()
    return code, app_id, yarn_local.app_report(app_id), submission


@pytest.mark.stacks
def test_cluster_mode_output_equals_client_mode_byte_for_byte(world, reference, cluster_run):
    code, _, report, submission = cluster_run
    assert code == 0, submission.output()[-3000:] + submission.logs()
    assert (report["state"], report["final_status"], report["attempts"]) == ("FINISHED", "SUCCEEDED", "1")
    assert read(world["s3"], "yarn/out.jsonl") == reference
    assert [json.loads(line)["key"] for line in reference.decode().splitlines()] == world["keys"]


@pytest.mark.stacks
def test_summary_records_cluster_deploy_mode_and_the_application(world, cluster_run):
    _, app_id, _, _ = cluster_run
    spark = summary_of(world["s3"], "yarn/out.jsonl")["spark"]
    assert spark["master"] == "yarn"
    assert spark["deploy_mode"] == "cluster"
    assert spark["application_id"] == app_id
    assert spark["yarn_attempt"] == 1


def test_a_cluster_mode_run_with_nothing_to_score_succeeds_on_yarn(world, cluster_run, tmp_path):
    # --resume of the complete output: the driver needs no Spark job, but YARN's ApplicationMaster fails an
    # application whose driver never started a SparkContext ("User did not initialize spark context!").
    submission = Submission(tmp_path, world["endpoint"], job_args("yarn/out.jsonl", "--resume"))
    assert submission.wait() == 0, submission.output()[-3000:] + submission.logs()
    report = yarn_local.app_report(submission.app_id())
    assert (report["state"], report["final_status"], report["attempts"]) == ("FINISHED", "SUCCEEDED", "1")
    assert "already complete" in submission.logs()


def test_a_driver_busier_than_the_application_masters_wait_still_runs_on_yarn(local_yarn, world, reference,
                                                                               tmp_path):
    # YARN's ApplicationMaster fails the application when the driver has made no SparkContext within
    # spark.yarn.am.waitTime (100 s by default): on EMR a long listing or an --int8-exclude auto search (120 s)
    # did. The driver starts its SparkContext first, beside its listing, model check and sample; here those
    # take longer than a 12 s wait, through an S3 that answers in half a second until the driver is scoring.
    output_key = "yarn/slow-start.jsonl"
    with S3Proxy(world["endpoint"], latency=0.5) as proxy:
        submission = Submission(tmp_path, proxy.endpoint,
                                job_args(output_key, "--estimate-images", "48", "--io-threads", "2"),
                                overrides={"spark.yarn.am.waitTime": "12s"})
        wait_for_stage(world["s3"], submission, output_key, "scoring")
        proxy.latency = 0.0  # the tasks' GETs at S3's speed: the wait is what this test is about, not them
        code = submission.wait()
    assert code == 0, submission.output()[-3000:] + submission.logs()
    report = yarn_local.app_report(submission.app_id())
    assert (report["state"], report["final_status"], report["attempts"]) == ("FINISHED", "SUCCEEDED", "1")
    assert read(world["s3"], output_key) == reference
    seconds = summary_of(world["s3"], output_key)["seconds"]
    assert seconds["listing"] + seconds["model_check"] + seconds["plan"] > 12  # the driver's work before its job


def test_driver_killed_in_its_container_is_resumed_by_yarns_second_attempt(local_yarn, world, reference,
                                                                          tmp_path):
    output_key = "killed-driver/out.jsonl"
    batches = -(-len(world["keys"]) // BATCH)
    with slow_run(world, tmp_path, output_key, batches // 3) as (submission, app_id, at_kill):
        pid = driver_process(app_id)
        assert pid is not None, submission.output()[-2000:]
        os.kill(pid, signal.SIGKILL)
        code = submission.wait()
    assert code == 0, submission.output()[-3000:] + submission.logs()
    report = yarn_local.app_report(app_id)
    assert (report["state"], report["final_status"], report["attempts"]) == ("FINISHED", "SUCCEEDED", "2")
    assert read(world["s3"], output_key) == reference
    summary = summary_of(world["s3"], output_key)
    assert summary["spark"]["yarn_attempt"] == 2
    assert summary["resumed"] is True
    assert at_kill <= summary["reused"] < len(world["keys"])
    assert open_uploads(world["s3"]) == []


def test_application_killed_through_yarn_is_interrupted_and_resume_finishes_it(local_yarn, world, reference,
                                                                              tmp_path):
    output_key = "killed-app/out.jsonl"
    batches = -(-len(world["keys"]) // BATCH)
    with slow_run(world, tmp_path, output_key, batches // 3) as (submission, app_id, _):
        driver = driver_process(app_id)
        assert driver is not None, submission.output()[-2000:]
        # The yarn command, as on EMR's master.
        killed = subprocess.run([str(yarn_local.YARN_CLI), "application", "-kill", app_id], capture_output=True,
                                text=True, timeout=120, check=False)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        code = submission.wait()
        # YARN says KILLED, and spark-submit exits, as soon as it is asked; the driver's last words (the status,
        # the abort of its upload, the report) take until its SIGKILL at most (conf/emr.yaml gives it 10 s).
        deadline = time.monotonic() + 60
        while driver_process(app_id) == driver:
            assert time.monotonic() < deadline, "the killed driver still runs after 60 s"
            time.sleep(0.2)
    assert code != 0
    report = yarn_local.app_report(app_id)
    assert (report["state"], report["attempts"]) == ("KILLED", "1")
    status = status_of(world["s3"], output_key)
    assert status["state"] == "interrupted", status
    assert 'data-value="interrupted"' in read(world["s3"], f"{output_key}.report.html").decode()
    durable = durable_parts(world["s3"], output_key)
    assert 0 < durable < batches
    assert open_uploads(world["s3"]) == []

    resumed = Submission(tmp_path / "resume", world["endpoint"], job_args(output_key, "--resume"))
    assert resumed.wait() == 0, resumed.output()[-3000:] + resumed.logs()
    assert read(world["s3"], output_key) == reference
    summary = summary_of(world["s3"], output_key)
    assert summary["reused"] >= durable * BATCH - BATCH


def test_a_run_that_exits_3_fails_on_yarn_and_the_second_attempt_ends_as_the_first(local_yarn, world, tmp_path,
                                                                                    capsys):
    # More images failed than --max-errors allows: the output is whole, the exit code 3. YARN starts a
    # second attempt for any non-zero exit; it must neither say "already exists" nor score again.
    output_key = "too-many-errors/out.jsonl"
    submission = Submission(tmp_path, world["endpoint"], job_args(output_key, "--max-errors", "0"))
    assert submission.wait() != 0
    report = yarn_local.app_report(submission.app_id())
    assert (report["final_status"], report["attempts"]) == ("FAILED", "2")
    assert "exited with status 3" in report["diagnostics"]
    assert status_of(world["s3"], output_key)["exit_code"] == 3
    assert summary_of(world["s3"], output_key)["spark"]["yarn_attempt"] == 1
    assert "attempt 1 finished the run (exit code 3), so this attempt ends as it did" in submission.logs()
    # make submit-yarn's account of it: the job's own last word from each attempt's driver, not only YARN's.
    run_yarn.describe_application(submission.app_id())
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("== the job said")]
    assert [line.split(",")[0] for line in said] == ["== the job said (attempt 1", "== the job said (attempt 2"]
    assert "failed, more than --max-errors 0 allows" in said[0], said
    assert len(read(world["s3"], output_key).decode().splitlines()) == len(world["keys"])


def test_the_local_yarn_answers_as_emrs_does_on_its_web_ui_rest_api_and_yarn_command(local_yarn):
    web = f"http://{local_yarn.rm_web}"
    with urllib.request.urlopen(f"{web}/ws/v1/cluster/info", timeout=30) as answer:
        assert json.loads(answer.read())["state"] == "STARTED"
    with urllib.request.urlopen(f"{web}/cluster/apps", timeout=30) as answer:
        assert "All Applications" in answer.read().decode()
    conf = (yarn_local.CONF_DIR / "yarn-site.xml").read_text()
    assert f"<name>yarn.resourcemanager.webapp.address</name><value>{local_yarn.rm_web}</value>" in conf
    nodes = subprocess.run([str(yarn_local.YARN_CLI), "node", "-list"], capture_output=True, text=True,
                           timeout=120, check=False)
    assert nodes.returncode == 0 and nodes.stdout.count("RUNNING") == yarn_local.NODES, nodes.stdout + nodes.stderr


def yarn_applications() -> int:
    listed = subprocess.run([str(yarn_local.YARN_CLI), "application", "-list", "-appStates", "ALL"],
                            capture_output=True, text=True, timeout=120, check=True)
    return int(re.search(r"Total number of applications .*:(\d+)", listed.stdout).group(1))


def submit_yarn(*args: str) -> subprocess.Popen:
    """``make submit-yarn ARGS='...'`` (demo/run_yarn.py), in the background, its output piped."""
    return subprocess.Popen([sys.executable, "-m", "demo.run_yarn", *args], cwd=str(run_yarn.ROOT), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_submit_yarn_refuses_a_missing_config_in_seconds_and_sends_nothing_to_yarn(local_yarn, world):
    before = yarn_applications()
    config = f"s3://{BUCKET}/conf/no-such-job.yaml"
    refused = submit_yarn("--config", config, "--endpoint-url", world["endpoint"])
    out, _ = refused.communicate(timeout=120)
    assert refused.returncode == 2, out
    assert f"Error: cannot read --config {config}" in out
    assert "nothing was sent to YARN" in out
    assert "a local YARN" not in out  # checked before make submit-yarn starts (or looks for) the YARN
    assert yarn_applications() == before


def test_stopping_submit_yarn_kills_the_application_and_says_so(local_yarn, world):
    output_key = "stopped-submit/out.jsonl"
    with S3Proxy(world["endpoint"], latency=0.05) as proxy:
        submitted = submit_yarn(*job_args(output_key, "--io-threads", "1", "--endpoint-url", proxy.endpoint))
        lines = []
        for line in submitted.stdout:  # until YARN runs the job and a batch is durable
            lines.append(line)
            app = run_yarn.SUBMITTED.search(line)
            if app:
                break
        assert app, "".join(lines)
        deadline = time.monotonic() + 240
        while durable_parts(world["s3"], output_key) == 0:
            assert time.monotonic() < deadline, "no batch became durable"
            time.sleep(0.5)
        submitted.send_signal(signal.SIGTERM)  # what make does to its recipe when it is stopped
        out, _ = submitted.communicate(timeout=180)
    assert submitted.returncode == 128 + signal.SIGTERM, out
    assert f"killing YARN application {app.group(1)}" in out
    assert yarn_local.app_report(app.group(1))["state"] == "KILLED"
    deadline = time.monotonic() + 60
    while status_of(world["s3"], output_key)["state"] == "running":  # the driver writes it as YARN stops it
        assert time.monotonic() < deadline, status_of(world["s3"], output_key)
        time.sleep(0.5)
    assert status_of(world["s3"], output_key)["state"] == "interrupted"


@pytest.fixture(scope="module")
def effnet_world(moto_endpoint, tmp_path_factory):
    """The real pretrained EfficientNet-Lite0 and 64 real photos, with its recipe: a worker of a real model's size."""
    from demo import photos as images
    from demo import pretrained

    s3, _ = bucket_with_effnet(moto_endpoint, EFFNET_BUCKET, tmp_path_factory.mktemp("effnet"))
    for i, data in enumerate(images.photo_views(64, seed=5)):
        s3.put_object(Bucket=EFFNET_BUCKET, Key=f"photos/{i:03d}.jpg", Body=data)
    job = {"input": f"s3://{EFFNET_BUCKET}/photos/", "model": f"s3://{EFFNET_BUCKET}/model/effnet",
           "mean": pretrained.MEAN, "std": pretrained.STD, "batch_size": 16, "progress_seconds": 2}
    s3.put_object(Bucket=EFFNET_BUCKET, Key="conf/job.yaml", Body=yaml.safe_dump(job).encode())
    return {"s3": s3, "endpoint": moto_endpoint}


def effnet_args(output_key: str) -> list[str]:
    return ["--config", f"s3://{EFFNET_BUCKET}/conf/job.yaml", "--output", f"s3://{EFFNET_BUCKET}/{output_key}"]


@pytest.fixture(scope="module")
def memory_killed(local_yarn, effnet_world, tmp_path_factory):
    """A real model's run in containers too small for it: 528 MiB (YARN rounds it up to 544), less than the
    executor's JVM and a worker with the model loaded hold before their first forward pass, so every executor is
    killed (at 576 MiB one executor's container once stayed under its limit and finished the run).

    One application attempt: a second would only fail the same way.
    """
    submission = Submission(tmp_path_factory.mktemp("memory"), effnet_world["endpoint"],
                            effnet_args("memory/out.jsonl"), overrides={
        "spark.executor.memory": "512m", "spark.executor.memoryOverhead": "16m", "spark.yarn.maxAppAttempts": "1"})
    return submission.wait(), submission


@pytest.mark.real_model
def test_an_executor_over_its_memory_limit_is_killed_by_yarn_and_the_job_says_what_to_raise(effnet_world,
                                                                                            memory_killed):
    s3 = effnet_world["s3"]
    code, submission = memory_killed
    assert code != 0  # and it ended: no hang
    report = yarn_local.app_report(submission.app_id())
    assert (report["state"], report["final_status"]) == ("FINISHED", "FAILED")
    assert "Container killed by YARN for exceeding physical memory limits" in submission.logs()
    status = json.loads(s3.get_object(Bucket=EFFNET_BUCKET, Key="memory/out.jsonl.status.json")["Body"].read())
    # Killed as they loaded the model for the warm-up: the driver says so then, and starts no run to be killed again.
    assert (status["state"], status["stage"]) == ("failed", "model_check")
    message = status["message"]
    assert "YARN killed an executor's container for exceeding its memory limit" in message
    assert "of 544 MB" in message  # YARN's limit, as YARN rounded it
    assert "528 MiB (spark.executor.memory 512 MiB + spark.executor.memoryOverhead 16 MiB)" in message
    assert re.search(r"the driver, which loaded the same model for its check, peaked at [\d,]+ MiB", message), message
    assert re.search(r"Raise spark.executor.memoryOverhead to \d+m or more", message), message
    assert open_uploads(s3, EFFNET_BUCKET) == []


@pytest.mark.real_model
def test_the_documented_memory_settings_finish_it_with_a_real_model_in_forward_lanes(effnet_world, memory_killed,
                                                                                    tmp_path):
    # --resume of the killed run (which stopped before its plan: nothing of it to resume) with conf/emr.yaml's
    # settings as make run-yarn scales them
    # (run_yarn.LOCAL_MEMORY), and two MXNet threads per executor, so that each worker runs two
    # forward lanes, each with its own bound copy of the model: no container killed, no line lost.
    s3, output_key = effnet_world["s3"], "memory/out.jsonl"
    submission = Submission(tmp_path, effnet_world["endpoint"], [*effnet_args(output_key), "--resume"], overrides={
        "spark.executorEnv.OMP_NUM_THREADS": "2", "spark.executorEnv.MXNET_CPU_WORKER_NTHREADS": "2"})
    assert submission.wait() == 0, submission.output()[-3000:] + submission.logs()
    assert "Container killed" not in submission.logs()
    lines = s3.get_object(Bucket=EFFNET_BUCKET, Key=output_key)["Body"].read().decode().splitlines()
    keys = [json.loads(line)["key"] for line in lines]
    assert keys == [f"photos/{i:03d}.jpg" for i in range(64)]
    summary = json.loads(s3.get_object(Bucket=EFFNET_BUCKET, Key=f"{output_key}.summary.json")["Body"].read())
    assert summary["predicted"] == 64 and summary["resumed"] is False
    assert {worker["lanes"] for worker in summary["python_workers"].values()} == {2}
    fit = summary["spark"]["executor_container"]
    assert fit["limit_mib"] == 6144 and fit["memory_overhead_mib"] == 5120
    assert 0 < fit["python_worker_peak_rss_mib"] < fit["limit_mib"]
    assert fit["python_worker_peak_share_of_limit"] == pytest.approx(fit["python_worker_peak_rss_mib"] / 6144, abs=1e-3)


# Last: it leaves the local YARN one node short (the next module's local_yarn starts a whole one).
def test_a_lost_node_loses_no_line_and_doubles_none(local_yarn, world, reference, tmp_path):
    output_key = "lost-node/out.jsonl"
    # Three of the Spark job's own batches durable, so that its tasks are running on the node that goes: the
    # estimate's sample the run kept (run 2) is durable before the job starts.
    with slow_run(world, tmp_path, output_key, 3, run="0001-") as (submission, app_id, _):
        report = yarn_local.app_report(app_id)
        driver_node = report[f"container.container_{app_id[len('application_'):]}_01_000001.node"]
        executor_nodes = {value for key, value in report.items() if key.endswith(".node")} - {driver_node}
        assert executor_nodes, report
        [lost] = [node.index for node in yarn_local.read_state().nodes if node.node_id in executor_nodes]
        yarn_local.stop_node(lost)
        code = submission.wait()
    assert code == 0, submission.output()[-3000:] + submission.logs()
    assert read(world["s3"], output_key) == reference
    summary = summary_of(world["s3"], output_key)
    assert summary["lost_task_attempts"] >= 1
    assert re.search(r"lost|Container", submission.logs())
