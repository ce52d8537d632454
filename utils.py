"""S3 and URI I/O shared by the driver and the executors.

Every function takes its boto3 client as an argument (or builds one through
:func:`s3_client`, which caches one client per process and endpoint), uses
paginators for listings, and raises on failure: callers decide whether a
failure becomes an error line or fails the job. Credentials always come from
boto3's default chain (the instance role on EMR); nothing here accepts keys.
"""

from __future__ import annotations

import http.client
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import boto3
import botocore.config
import botocore.exceptions
import urllib3.exceptions

log = logging.getLogger(__name__)

#: S3 refuses multipart parts under 5 MiB (except the last one).
MIN_PART_BYTES = 5 * 1024 * 1024

# Errors raised while *reading a response body*. botocore retries a request
# that fails before the body starts, but not a body cut off in the middle,
# so read_object retries these itself.
BODY_READ_ERRORS = (
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.ConnectionClosedError,
    urllib3.exceptions.ProtocolError,
    urllib3.exceptions.ReadTimeoutError,
    http.client.IncompleteRead,
    ConnectionError,
)


class S3UriError(ValueError):
    """An s3:// URI that cannot be split into bucket and key."""


def parse_s3_uri(uri: str, *, need_key: bool = False) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``.

    Parameters
    ----------
    uri : str
        The URI; ``s3a://`` and ``s3n://`` are accepted as on EMR.
    need_key : bool
        Refuse a URI without a key (an output object needs one).

    Returns
    -------
    tuple of str
        The bucket and the key (possibly empty: a whole-bucket prefix).

    Examples
    --------
    >>> parse_s3_uri("s3://photos/2024/cat.jpg")
    ('photos', '2024/cat.jpg')
    """
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("s3", "s3a", "s3n") or not parsed.netloc:
        raise S3UriError(f"{uri!r} is not an S3 URI; expected s3://BUCKET/KEY")
    key = parsed.path.lstrip("/")
    if need_key and (not key or key.endswith("/")):
        raise S3UriError(f"{uri!r} names no object; expected s3://BUCKET/KEY")
    return parsed.netloc, key


_clients: dict[tuple, object] = {}
_clients_lock = threading.Lock()


def s3_client(
    endpoint_url: str | None = None,
    region: str | None = None,
    max_attempts: int = 5,
    max_pool_connections: int = 32,
    read_timeout: float = 60.0,
):
    """Return this process's S3 client for these settings, creating it once.

    boto3 clients are thread safe (sessions are not), so one client serves
    every download thread of a Python worker; creating one per task would cost
    a credential look-up each time. Retries use botocore's ``standard`` mode
    (exponential backoff with jitter on throttling, 5xx and connection errors)
    with a bounded number of attempts.
    """
    cache_key = (endpoint_url, region, max_attempts, max_pool_connections, read_timeout, os.getpid())
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            config = botocore.config.Config(
                retries={"mode": "standard", "total_max_attempts": max_attempts},  # first try included
                max_pool_connections=max_pool_connections,
                connect_timeout=10,
                read_timeout=read_timeout,
            )
            session = boto3.session.Session()
            client = session.client(
                "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config
            )
            _clients[cache_key] = client
        return client


def list_objects(client, bucket: str, prefix: str) -> Iterator[tuple[str, int]]:
    """Yield ``(key, size)`` for every object under ``prefix``, page by page.

    An empty prefix yields nothing (a page without ``Contents`` is normal).
    """
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", ()):
            yield obj["Key"], int(obj["Size"])


def keep_suffixes(objects: Iterable[tuple[str, int]], suffixes: Iterable[str]) -> list[tuple[str, int]]:
    """Keep objects whose key ends with one of ``suffixes`` (case-insensitive)."""
    wanted = tuple(s.lower() if s.startswith(".") else "." + s.lower() for s in suffixes)
    return [(key, size) for key, size in objects if key.lower().endswith(wanted)]


@dataclass
class IOStats:
    """Counts one worker's S3 retries; plain ints so it pickles and sums."""

    request_retries: int = 0
    body_retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, request_retries: int = 0, body_retries: int = 0) -> None:
        with self.lock:
            self.request_retries += request_retries
            self.body_retries += body_retries


def read_object(client, bucket: str, key: str, attempts: int = 4, stats: IOStats | None = None) -> bytes:
    """Download one object into memory, retrying a body read cut off midway.

    botocore retries failed requests by itself (see :func:`s3_client`); a
    connection that breaks while the body streams surfaces here instead, so
    the whole GET is repeated, up to ``attempts`` times, with a short backoff.
    Non-transient errors (``NoSuchKey``, ``AccessDenied``, ...) raise at once.
    """
    for attempt in range(1, attempts + 1):
        response = client.get_object(Bucket=bucket, Key=key)
        retried = response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        if stats is not None and retried:
            stats.add(request_retries=retried)
        body = response["Body"]
        try:
            data = body.read()
        except BODY_READ_ERRORS:
            if attempt == attempts:
                raise
            if stats is not None:
                stats.add(body_retries=1)
            log.warning("s3://%s/%s: body read failed (attempt %d of %d); retrying", bucket, key, attempt, attempts)
            time.sleep(min(2.0, 0.1 * 2**attempt))
            continue
        finally:
            body.close()
        expected = response.get("ContentLength")
        if expected is not None and len(data) != expected:
            # A proxy or a broken connection can end a body early without an
            # exception; never hand a short image to the decoder.
            if attempt == attempts:
                raise botocore.exceptions.IncompleteReadError(actual_bytes=len(data), expected_bytes=expected)
            if stats is not None:
                stats.add(body_retries=1)
            continue
        return data
    raise AssertionError("unreachable")  # pragma: no cover


def is_s3_uri(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://", "s3n://"))


def read_uri(uri: str, client=None) -> bytes:
    """Read a whole file named by an ``s3://``, ``http(s)://``, ``file://`` URI or a path.

    Raises ``FileNotFoundError`` when the object does not exist, whatever the
    scheme, so callers can treat optional files (``synset.txt``) uniformly.
    """
    if is_s3_uri(uri):
        bucket, key = parse_s3_uri(uri, need_key=True)
        client = client or s3_client()
        try:
            return read_object(client, bucket, key)
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise FileNotFoundError(f"{uri} does not exist") from exc
            raise
    if uri.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(uri, timeout=60) as response:
                return response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise FileNotFoundError(f"{uri} does not exist (HTTP 404)") from exc
            raise
    path = urllib.parse.urlparse(uri).path if uri.startswith("file://") else uri
    with open(path, "rb") as handle:
        return handle.read()


def sibling_uri(uri: str, name: str) -> str:
    """The URI of ``name`` in the same folder as ``uri`` (for ``synset.txt``)."""
    head, _, _ = uri.rpartition("/")
    return f"{head}/{name}" if head else name


class MultipartWriter:
    """Stream bytes to one S3 object through a multipart upload.

    The object appears only when :meth:`close` completes the upload, so a
    reader never sees half a file; on any error (or :meth:`abort`) the upload
    is aborted and no parts are left behind. Memory holds one part at most.
    Creating the upload is itself a check that the job may write the key, which
    is why the driver opens the writer before it starts any Spark work.

    Examples
    --------
    >>> with MultipartWriter(client, "bucket", "out/predictions.jsonl") as out:  # doctest: +SKIP
    ...     out.write(b'{"key": "a.jpg"}\\n')
    """

    def __init__(self, client, bucket: str, key: str, part_bytes: int = 8 * MIN_PART_BYTES // 5,
                 content_type: str = "application/x-ndjson"):
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"part_bytes must be at least {MIN_PART_BYTES} (S3's minimum part size)")
        self.client, self.bucket, self.key, self.part_bytes = client, bucket, key, part_bytes
        self._buffer = bytearray()
        self._parts: list[dict] = []
        self.bytes_written = 0
        self.upload_id = client.create_multipart_upload(
            Bucket=bucket, Key=key, ContentType=content_type
        )["UploadId"]

    def write(self, data: bytes) -> None:
        self._buffer += data
        self.bytes_written += len(data)
        while len(self._buffer) >= self.part_bytes:
            self._upload_part(bytes(self._buffer[: self.part_bytes]))
            del self._buffer[: self.part_bytes]

    def _upload_part(self, data: bytes) -> None:
        number = len(self._parts) + 1
        response = self.client.upload_part(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id, PartNumber=number, Body=data
        )
        self._parts.append({"ETag": response["ETag"], "PartNumber": number})

    def close(self) -> None:
        """Upload what is buffered and complete the upload: the object appears now."""
        if self._buffer or not self._parts:
            self._upload_part(bytes(self._buffer))
            self._buffer.clear()
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self.upload_id = None

    def abort(self) -> None:
        """Abort the upload: no object, no orphaned parts."""
        if self.upload_id is None:
            return
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id)
        finally:
            self.upload_id = None

    def __enter__(self) -> MultipartWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def put_text(client, bucket: str, key: str, text: str, content_type: str = "application/json") -> None:
    """Write a small text object in one request."""
    client.put_object(Bucket=bucket, Key=key, Body=text.encode("utf-8"), ContentType=content_type)
