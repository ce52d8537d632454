"""GETs: whole objects with retries of a body cut off midway, any URI read whole."""

from __future__ import annotations

import http.client
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import botocore.exceptions
import urllib3.exceptions

from mxjob.s3.clients import s3_client
from mxjob.s3.uris import is_s3_uri, parse_s3_uri

log = logging.getLogger(__name__)


# Errors raised while *reading a response body*. botocore retries a request
# that fails before the body starts, but not a body cut off in the middle,
# so read_object retries these itself.
BODY_READ_ERRORS = (botocore.exceptions.IncompleteReadError, botocore.exceptions.ReadTimeoutError,
                    botocore.exceptions.ResponseStreamingError, botocore.exceptions.ConnectionClosedError,
                    urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError, http.client.IncompleteRead,
                    ConnectionError)


class ObjectTooLargeError(ValueError):
    """An object over ``max_object_bytes``: refused from its listed size or its ``Content-Length``, never read."""


def too_large(size: int, max_bytes: int) -> ObjectTooLargeError:
    """The error for an object of ``size`` bytes over ``max_bytes``."""
    return ObjectTooLargeError(f"object is {size} bytes, over max_object_bytes={max_bytes}")


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


def read_object(  # noqa: PLR0913 - public as utils.read_object: a client, bucket and key, then optional settings
        client, bucket: str, key: str, attempts: int = 4, stats: IOStats | None = None,
        max_bytes: int | None = None, byte_range: tuple[int, int] | None = None, seen: dict | None = None) -> bytes:
    """Download one object into memory, retrying a body read cut off midway.

    botocore retries failed requests by itself (see :func:`s3_client`); a
    connection that breaks while the body streams surfaces here instead, so
    the whole GET is repeated, up to ``attempts`` times, with a short backoff.
    Non-transient errors (``NoSuchKey``, ``AccessDenied``, ...) raise at once.
    With ``max_bytes``, an object whose ``Content-Length`` is larger raises
    :class:`ObjectTooLargeError` before its body is read (for keys from a
    manifest without sizes). ``byte_range`` is ``(offset, length)``: those
    bytes of the object only. ``seen``, a dict, gets the object's ``"etag"``
    (quotes stripped; ``None`` if S3 sent none) from the GET that returned it.
    """
    stats = IOStats() if stats is None else stats
    extra = {} if byte_range is None else {"Range": f"bytes={byte_range[0]}-{byte_range[0] + byte_range[1] - 1}"}
    for attempt in range(1, attempts + 1):
        try:
            response = client.get_object(Bucket=bucket, Key=key, **extra)
        except botocore.exceptions.ClientError as exc:  # botocore's retries count even when they all failed
            stats.add(request_retries=_retry_attempts(exc.response))
            raise
        stats.add(request_retries=_retry_attempts(response))
        data, broken = _read_body(response, max_bytes)
        if broken is None:
            if seen is not None:
                seen["etag"] = _etag(response.get("ETag"))
            return data
        if attempt == attempts:
            raise broken
        stats.add(body_retries=1)
        if not isinstance(broken, botocore.exceptions.IncompleteReadError):
            log.warning("s3://%s/%s: body read failed (attempt %d of %d); retrying", bucket, key, attempt, attempts)
            time.sleep(min(2.0, 0.1 * 2**attempt))
    raise AssertionError("unreachable")  # pragma: no cover


def _read_body(response: dict, max_bytes: int | None) -> tuple[bytes | None, Exception | None]:
    """``(data, None)``, or ``(None, error)`` for a body that broke or came short (the GET is worth repeating).

    An object larger than ``max_bytes`` raises :class:`ObjectTooLargeError`, its body unread.
    """
    body = response["Body"]
    length = response.get("ContentLength")
    if max_bytes is not None and length is not None and int(length) > max_bytes:
        body.close()  # drops the connection rather than reading the body to reuse it
        raise too_large(int(length), max_bytes)
    try:
        data = body.read()
    except BODY_READ_ERRORS as exc:
        return None, exc
    finally:
        body.close()
    short = _short_body(data, length)
    return (None, short) if short is not None else (data, None)


def _etag(value) -> str | None:
    """An ETag header's value without its quotes, as a listing's ``ETag`` after ``strip('"')``."""
    return value.strip('"') if value else None


def _retry_attempts(response: dict) -> int:
    """The retries botocore made for a response (or a ClientError's ``response``)."""
    return response.get("ResponseMetadata", {}).get("RetryAttempts", 0)


def _short_body(data: bytes, content_length) -> botocore.exceptions.IncompleteReadError | None:
    """The error for a body that is not its Content-Length, else ``None``.

    A proxy or a broken connection can end a body early without an exception;
    never hand a short image to the decoder.
    """
    if content_length is None or len(data) == int(content_length):
        return None
    return botocore.exceptions.IncompleteReadError(actual_bytes=len(data), expected_bytes=int(content_length))


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


