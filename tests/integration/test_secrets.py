"""No credential in anything the job writes or logs (mxjob/core/secrets.py), through spark-submit.

A password in ``--endpoint-url`` (``http://user:secret@host``: botocore and moto take it), a session token and
a secret key in the environment, at ``--log-level DEBUG``, with Spark's event log on: one run that succeeds and
one that fails (its status then holds the resume command). Every line the runs printed, every object they wrote
and the event log are searched for each secret.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from demo.run_local import spark_env, spark_submit_command
from tests.support.event_logs import event_logs
from tests.support.helpers import ROOT, bucket_with_digits

pytestmark = [pytest.mark.spark, pytest.mark.stacks]

BUCKET = "secrets-job"
PASSWORD = "PwInTheUri7731"
TOKEN = "SessionTokenSecret9924"
SECRET_KEY = "SecretAccessKey5517"
SECRETS = (PASSWORD, TOKEN, SECRET_KEY)


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir, tmp_path_factory):
    s3, _ = bucket_with_digits(moto_endpoint, BUCKET, demo_dir / "model", 8)
    s3.put_object(Bucket=BUCKET, Key="imgs/broken.png", Body=b"not a png")
    events = tmp_path_factory.mktemp("events")
    endpoint = moto_endpoint.replace("://", f"://mxuser:{PASSWORD}@")
    env = {"AWS_SESSION_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    runs = [run(endpoint, "ok/preds.jsonl", env, events), run(endpoint, "failed/preds.jsonl", env, events,
                                                               "--model", f"s3://{BUCKET}/model/missing")]
    return {"s3": s3, "runs": runs, "events": events}


def run(endpoint: str, output_key: str, env: dict, events, *extra: str) -> subprocess.CompletedProcess:
    args = ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits", "--output",
            f"s3://{BUCKET}/{output_key}", "--endpoint-url", endpoint, "--input-shape", "3,32,32", "--std", "255",
            "--batch-size", "4", "--max-errors", "1", "--log-level", "DEBUG", *extra]
    command = spark_submit_command(args)
    at = command.index("--py-files")
    command[at:at] = ["--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir=file://{events}"]
    return subprocess.run(command, env=spark_env(env), cwd=str(ROOT), capture_output=True, text=True, timeout=600,
                          check=False)


def test_the_runs_did_what_they_should(world):
    ok, failed = world["runs"]
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    assert failed.returncode == 1, (failed.stdout + failed.stderr)[-3000:]
    assert "model file missing" in failed.stdout + failed.stderr


def test_no_secret_in_any_line_the_runs_printed(world):
    assert "DEBUG mxjob" in world["runs"][0].stdout + world["runs"][0].stderr  # the job did log at DEBUG
    for result in world["runs"]:
        text = result.stdout + result.stderr
        for secret in SECRETS:
            assert secret not in text, [line for line in text.splitlines() if secret in line][:3]


def test_no_secret_in_any_object_the_runs_wrote(world):
    s3 = world["s3"]
    written = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])
               if o["Key"].startswith(("ok/", "failed/"))]
    assert {"ok/preds.jsonl", "ok/preds.jsonl.summary.json", "ok/preds.jsonl.report.html",
            "failed/preds.jsonl.status.json", "failed/preds.jsonl.report.html"} <= set(written)
    status = s3.get_object(Bucket=BUCKET, Key="failed/preds.jsonl.status.json")["Body"].read().decode()
    assert "resume_command" in status and "REDACTED@" in status  # the resume command names the endpoint, masked
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key="ok/preds.jsonl.summary.json")["Body"].read())
    assert summary["options"]["endpoint_url"].startswith("http://REDACTED@127.0.0.1:")
    for key in written:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode("utf-8", "replace")
        for secret in SECRETS:
            assert secret not in body, (key, secret)


def test_no_secret_in_sparks_event_log(world):
    logs = event_logs(world["events"])  # plain (Spark 3.5) or rolled and zstd-compressed (Spark 4), decompressed
    assert logs, "no event log written"
    # Proof the search read events, not compressed bytes: the runs' Spark environment is there.
    assert any("SparkListenerEnvironmentUpdate" in text for text in logs.values()), list(logs)
    for path, text in logs.items():
        for secret in SECRETS:
            assert secret not in text, (path.name, secret)
