"""Whether an object exists, whether the output may be written (checked before any expensive work), and why not."""

from __future__ import annotations

import logging
import uuid

import botocore.exceptions

from mxjob.s3.clients import S3_ERRORS

log = logging.getLogger(__name__)


def object_exists(client, bucket: str, key: str) -> bool:
    """Whether ``s3://bucket/key`` exists; errors other than "not found" raise."""
    try:
        client.head_object(Bucket=bucket, Key=key)
    except botocore.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


class OutputNotWritableError(Exception):
    """The job may not write its output key; the message says which permission, bucket or endpoint to fix."""


def unreachable(client, exc: BaseException) -> str | None:
    """What to check when ``exc`` (or an exception it was raised from) never reached S3; else ``None``.

    A connection refused, timed out, or to a host whose name does not
    resolve is botocore's ``ConnectionError``; the bucket and the
    permissions were never asked about, so a message naming them sends the
    user the wrong way. Any other error is S3's answer (NoSuchBucket,
    AccessDenied), which the caller's message explains.
    """
    while exc is not None and not isinstance(exc, botocore.exceptions.ConnectionError):
        exc = exc.__cause__
    if exc is None:
        return None
    return (f"the S3 endpoint {client.meta.endpoint_url} cannot be reached ({_reason(exc)}); check --endpoint-url "
            f"(or the AWS_ENDPOINT_URL_S3 and AWS_ENDPOINT_URL variables), that the endpoint is up, and the network "
            f"between this host and it")


def _reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name if it has none."""
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def check_writable(client, bucket: str, key: str) -> None:
    """Prove that ``key`` in ``bucket`` may be written, leaving nothing behind.

    Writes an empty probe object next to ``key`` (``KEY.write-check-<random>``,
    so it never touches an existing output) and deletes it. The dry run calls
    this so that it fails where the real run would; the real run may call it
    before any Spark work.

    Parameters
    ----------
    client : botocore S3 client
    bucket, key : str
        The output object the job will write.

    Raises
    ------
    OutputNotWritableError
        The probe could not be written (no such bucket, access denied,
        endpoint unreachable), with the cause and what the job needs.
    """
    probe = f"{key}.write-check-{uuid.uuid4().hex[:12]}"
    try:
        client.put_object(Bucket=bucket, Key=probe, Body=b"")
    except S3_ERRORS as exc:  # NoSuchBucket, AccessDenied, endpoint unreachable
        why = unreachable(client, exc) or (f"{_reason(exc)}; the job needs an existing bucket and s3:PutObject on "
                                           f"the output key")
        raise OutputNotWritableError(f"cannot write s3://{bucket}/{key}: {why}") from exc
    try:
        client.delete_object(Bucket=bucket, Key=probe)
    except S3_ERRORS as exc:  # the check passed; only the clean-up failed (no s3:DeleteObject)
        log.warning("could write s3://%s/%s but not delete the probe object s3://%s/%s (%s); delete it by hand",
                    bucket, key, bucket, probe, exc)
