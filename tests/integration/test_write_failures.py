"""S3 failing while the output is written, through spark-submit and the fault proxy: one ``Error:`` line naming the
S3 call and the resume command, never a traceback; nothing published; ``--resume`` then finishes the run. A clean-up
that fails after the output is published is a warning, and the run's exit code stands."""

from __future__ import annotations

import json

import pytest

from tests.support.fault_proxy import FaultProxy, Faults
from tests.support.helpers import bucket_with_digits, spark_submit

pytestmark = pytest.mark.spark

BUCKET = "write-faults"
IMAGES = 12


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    s3, _ = bucket_with_digits(moto_endpoint, BUCKET, demo_dir / "model", IMAGES)
    return {"s3": s3, "endpoint": moto_endpoint}


def job_args(endpoint: str, output_key: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
            "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", endpoint, "--input-shape", "3,32,32",
            "--std", "255", "--batch-size", "4", "--s3-max-attempts", "2", *extra]


@pytest.mark.parametrize(("call", "method", "marker"), [
    ("UploadPart", "PUT", "partNumber="),
    ("CompleteMultipartUpload", "POST", "uploadId="),
])
def test_a_persistent_failure_writing_the_output_is_one_line_and_resume_finishes(world, call, method, marker):
    s3, output_key = world["s3"], f"{call.lower()}/preds.jsonl"
    faults = Faults(rate=1.0, kinds=("internal",), methods=(method,),
                    key_filter=lambda m, path: path.startswith(f"/{BUCKET}/{output_key}?") and marker in path)
    with FaultProxy(world["endpoint"], faults=faults) as proxy:
        failed = spark_submit(job_args(proxy.endpoint, output_key))
    text = failed.stdout + failed.stderr
    assert failed.returncode == 1, text[-3000:]
    errors = [line for line in text.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, text[-3000:]
    assert f"writing s3://{BUCKET}/{output_key} failed: S3 {call}:" in errors[0]
    assert "resume with:" in errors[0] and "--resume" in errors[0]
    assert "Traceback" not in text
    written = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=output_key).get("Contents", [])]
    assert output_key not in written and any(".parts/" in key for key in written)  # durable batches, no output
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.summary.json")
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix=output_key).get("Uploads")
    resumed = spark_submit(job_args(world["endpoint"], output_key, "--resume"))
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    body = s3.get_object(Bucket=BUCKET, Key=output_key)["Body"].read().decode()
    assert len(body.splitlines()) == IMAGES


def test_a_cleanup_refused_after_the_output_is_published_is_a_warning_and_the_run_succeeds(world):
    s3, output_key = world["s3"], "cleanup/preds.jsonl"
    faults = Faults(rate=1.0, kinds=("internal",), methods=("POST", "DELETE"),
                    key_filter=lambda m, path: (path.split("?")[0].rstrip("/") == f"/{BUCKET}" and "delete" in path)
                    or (m == "DELETE" and path.startswith(f"/{BUCKET}/{output_key}.parts/")))
    with FaultProxy(world["endpoint"], faults=faults) as proxy:
        result = spark_submit(job_args(proxy.endpoint, output_key))
    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert "the output is complete, but the work prefix" in text and "aws s3 rm --recursive" in text
    assert len(s3.get_object(Bucket=BUCKET, Key=output_key)["Body"].read().decode().splitlines()) == IMAGES
    status = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{output_key}.status.json")["Body"].read())
    assert status["state"] == "succeeded" and status["exit_code"] == 0
