"""``python -m mxjob.watch`` without AWS credentials: one line for real S3, moto's keys for a local server."""

from __future__ import annotations

import json
import os

import pytest

from mxjob import state, watch
from mxjob.errors import EXIT_USAGE

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
    # A client an earlier test cached (with the fake keys) would hide the missing credentials.
    monkeypatch.setattr(state, "s3_clients", state.ProcessCache("S3 clients", state.MAX_S3_CLIENTS))


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
    assert result.stdout.splitlines()[0] == "succeeded: no batch has been scored yet (3s since the start); exit 0"


@pytest.mark.parametrize(("endpoint", "loopback"), [
    ("http://127.0.0.1:5000", True), ("http://localhost:5000", True), ("https://[::1]:9000", True),
    ("https://s3.us-east-1.amazonaws.com", False), ("http://127.0.0.1.example.com", False), (None, False)])
def test_loopback_endpoints_are_the_ones_on_this_machine(endpoint, loopback):
    assert watch.is_loopback(endpoint) is loopback
