"""``python -m mxjob.reporting.watch``: without AWS credentials (one line for real S3, moto's keys for a local server),
and on the statuses a run writes before its plan (running, and failed with the job's code)."""

from __future__ import annotations

import io
import json
import os

import pytest

from mxjob.core import state
from mxjob.core.errors import EXIT_FAILED, EXIT_USAGE, JobError
from mxjob.options import config
from mxjob.reporting import status, watch
from mxjob.run import driver
from tests.support.helpers import put_fake_model

BUCKET = "watch-bucket"


@pytest.fixture
def no_credentials(monkeypatch, tmp_path):
    """No credentials anywhere boto3 looks: no AWS_* variables, no config files, no instance role."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # A client or session an earlier test cached (with the fake keys) would hide the missing credentials.
    monkeypatch.setattr(state, "s3_clients", state.ProcessCache("S3 clients", state.MAX_S3_CLIENTS))
    monkeypatch.setattr(state, "s3_sessions", state.ProcessCache("S3 sessions", 1))


def test_watch_without_credentials_against_real_s3_says_so_in_one_line(no_credentials, stderr_runner):
    result = stderr_runner.invoke(watch.main, [f"s3://{BUCKET}/out/p.jsonl", "--region", "us-east-1",
                                               "--endpoint-url", "https://s3.us-east-1.amazonaws.com"])
    assert result.exit_code == EXIT_USAGE, result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "no AWS credentials" in lines[0] and "AWS_ACCESS_KEY_ID" in lines[0]
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_watch_against_a_local_server_without_credentials_uses_its_fake_keys(moto_endpoint, moto_buckets,
                                                                           no_credentials, stderr_runner):
    status = {"state": "succeeded", "exit_code": 0, "elapsed_seconds": 3, "report": "s3://r/p.report.html"}
    moto_buckets.put_object(Bucket=BUCKET, Key="local/p.jsonl.status.json", Body=json.dumps(status).encode())
    result = stderr_runner.invoke(watch.main, [f"s3://{BUCKET}/local/p.jsonl", "--endpoint-url", moto_endpoint])
    assert result.exit_code == 0, (result.stderr, result.exception)
    assert result.stdout.splitlines()[0] == "succeeded: no batch was scored (3s since the start); exit 0"


@pytest.mark.parametrize(("endpoint", "loopback"), [
    ("http://127.0.0.1:5000", True), ("http://localhost:5000", True), ("https://[::1]:9000", True),
    ("https://s3.us-east-1.amazonaws.com", False), ("http://127.0.0.1.example.com", False), (None, False)])
def test_loopback_endpoints_are_the_ones_on_this_machine(endpoint, loopback):
    assert watch.is_loopback(endpoint) is loopback


def test_watch_exits_at_once_with_the_code_of_a_run_that_failed_before_its_plan(moto_endpoint, moto_buckets):
    put_fake_model(moto_buckets, BUCKET)  # only looked for (HEAD): the runs here end before loading it
    cfg = config.resolve(config.merge_settings({
        "input": f"s3://{BUCKET}/no-images/", "model": f"s3://{BUCKET}/model/fake",
        "output": f"s3://{BUCKET}/failed/p.jsonl", "endpoint_url": moto_endpoint}, {}))
    with pytest.raises(JobError, match="no images under"):
        driver.run_job(cfg)

    def no_sleep(_):
        raise AssertionError("watch waited for a status that is final")

    out = []
    code = watch.watch(moto_buckets, *watch.status_location(cfg.output_uri),
                       watch.Polling(every=5, wait_seconds=0, stale_seconds=60),
                       echo=lambda line, err=False: out.append(line), sleep=no_sleep)
    assert code == EXIT_FAILED
    assert out[0].startswith("failed (listing): no batch was scored (") and out[0].endswith("; exit 1")
    assert out[1].startswith(f"  no images under s3://{BUCKET}/no-images/")


def test_watch_takes_the_status_written_before_the_plan_for_a_running_job():
    started = 1_700_000_000.0
    run = status.RunFacts(started, {}, "x --resume")
    docs = iter([status.status_document("running", None, None, run, stage="listing"),
                 status.status_document("failed", None, None, run, status.RunEnd(EXIT_FAILED, "model: no such layer"),
                                        stage="model_check")])

    class Client:
        class exceptions:  # boto3's shape
            NoSuchKey = KeyError

        def get_object(self, **_):
            return {"Body": io.BytesIO(json.dumps(next(docs)).encode())}

    out = []
    code = watch.watch(Client(), "b", "k", watch.Polling(0, 60, 60), echo=lambda line, err=False: out.append(line),
                       sleep=lambda _: None)
    assert code == EXIT_FAILED  # the job's, read from the second status: the first did not end the watch
    assert out[0].startswith("running (listing): no batch has been scored yet")
    assert out[1].startswith("failed (model_check): no batch was scored (") and out[1].endswith("; exit 1")
    assert out[2] == "  model: no such layer"


def test_watch_says_at_once_that_there_is_no_status_yet_and_what_it_waits_for():
    """A mistyped output must not look like a job that is starting for the whole wait."""
    class Client:
        class exceptions:  # boto3's shape
            NoSuchKey = KeyError

        def get_object(self, **_):
            raise KeyError("NoSuchKey")

    out, clock = [], iter([0.0, 0.0, 1.0, 2.0, 100.0, 100.0])
    code = watch.watch(Client(), "b", "typo.jsonl.status.json", watch.Polling(1, 60, 60),
                       echo=lambda line, err=False: out.append(line), sleep=lambda _: None, clock=lambda: next(clock))
    assert code == watch.EXIT_NO_STATUS
    assert out[0].startswith("no status at s3://b/typo.jsonl.status.json yet: waiting up to 60 s")
    assert "check the output's spelling" in out[0]
    assert out[1].startswith("no status at s3://b/typo.jsonl.status.json after 60 s") and len(out) == 2


@pytest.mark.parametrize(("doc", "code", "last"), [
    ({"state": "failed", "exit_code": 3}, 3, "exit 3: more images failed than --max-errors allows"),
    ({"state": "interrupted", "exit_code": 143}, 143, "exit 143: interrupted by SIGTERM"),
])
def test_watch_prints_the_jobs_code_as_its_last_line_when_it_is_not_0(moto_endpoint, moto_buckets, stderr_runner,
                                                                      doc, code, last):
    # make watch exits 2 for any failure: the code the job ended with must not be lost behind it.
    status_doc = {**doc, "elapsed_seconds": 3, "report": "s3://r/p.report.html", "resume_command": "x --resume"}
    moto_buckets.put_object(Bucket=BUCKET, Key=f"code-{code}/p.jsonl.status.json",
                            Body=json.dumps(status_doc).encode())
    result = stderr_runner.invoke(watch.main, [f"s3://{BUCKET}/code-{code}/p.jsonl", "--endpoint-url", moto_endpoint])
    assert result.exit_code == code, (result.stderr, result.exception)
    assert result.stderr.splitlines()[-1] == last


def test_watch_prints_no_code_line_for_a_job_that_succeeded(moto_endpoint, moto_buckets, stderr_runner):
    moto_buckets.put_object(Bucket=BUCKET, Key="code-0/p.jsonl.status.json",
                            Body=json.dumps({"state": "succeeded", "exit_code": 0, "elapsed_seconds": 3}).encode())
    result = stderr_runner.invoke(watch.main, [f"s3://{BUCKET}/code-0/p.jsonl", "--endpoint-url", moto_endpoint])
    assert result.exit_code == 0 and result.stderr == ""
