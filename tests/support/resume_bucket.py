"""The ``--resume`` tests' bucket, the client that created it, and what is in it: open uploads, an object's bytes.

Used by ``tests/unit/outputs/test_resume.py`` (the work prefix, the assembly
and the refusals, without Spark) and ``tests/integration/test_resume.py``
(the runs through spark-submit). A test module that binds :func:`s3` imports
:data:`BUCKET` too: ``moto_buckets`` creates the test module's ``BUCKET``.
"""

from __future__ import annotations

import pytest

BUCKET = "resume-bucket"


@pytest.fixture(scope="module")
def s3(moto_buckets):
    """The session's client, with BUCKET created."""
    return moto_buckets


def open_uploads(s3) -> list:
    return s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])


def read(s3, key: str) -> bytes:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
