"""The dataset tests' bucket: 96 demo digits and a file that is no PNG, the demo model, and the job's arguments.

``tests/unit/outputs/test_dataset.py`` dry-runs the job on it (and writes its
sinks' files in the bucket), ``tests/integration/test_dataset.py`` runs it
through spark-submit, kills it and resumes it. A test module that binds
:func:`s3` imports :data:`BUCKET` too: ``moto_buckets`` creates the test
module's ``BUCKET``.
"""

from __future__ import annotations

import pytest

from tests.support.helpers import bucket_with_digits

BUCKET = "dataset-bucket"


@pytest.fixture(scope="module")
def s3(moto_buckets):
    return moto_buckets


IMAGES = 96
BATCH = 8
ROWS_PER_FILE = 16


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    s3, keys = bucket_with_digits(moto_endpoint, BUCKET, demo_dir / "model", IMAGES)
    s3.put_object(Bucket=BUCKET, Key="imgs/bad.png", Body=b"not a png")
    return {"endpoint": moto_endpoint, "keys": sorted([*keys, "imgs/bad.png"])}


def job_args(endpoint: str, output: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits", "--output",
            f"s3://{BUCKET}/{output}", "--endpoint-url", endpoint, "--input-shape", "3,32,32", "--std", "255",
            "--batch-size", str(BATCH), "--top-k", "2", "--progress-seconds", "1", "--max-errors", "1",
            "--rows-per-file", str(ROWS_PER_FILE), *extra]
