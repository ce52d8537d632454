"""The executors' image reader, :class:`ObjectReader`, and its lean fast path (``--s3-reader lean``).

Under ``lean`` it costs less CPU per GET than botocore's ``get_object``:
:class:`ObjectReader` signs and sends a plain GET itself and hands every
answer but a plain one (an error, a redirect, a checksum to verify) back to
botocore on the same client, so retries, errors and credentials stay
botocore's. Its requests are signed by botocore's public ``S3SigV4Auth``
and sent through the client's HTTP session, which botocore keeps in a
private attribute (``client._endpoint.http_session``): where that is
missing, :meth:`ObjectReader.unavailable` says so, the reader warns once and
every GET is botocore's ``get_object``.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import os
import re
import threading
import zlib
from xml.etree import ElementTree

import botocore.auth
import botocore.awsrequest
import botocore.exceptions
import botocore.utils

from mxjob.core import constants, state
from mxjob.s3.clients import S3_MAX_ATTEMPTS, S3_POOL_CONNECTIONS, cached_client, s3_client
from mxjob.s3.reads import BODY_READ_ERRORS, IOStats, _etag, _short_body, read_object, too_large

#: ``Authorization`` of a SigV4 request to S3; the group is the signing region.
_SIGV4_SCOPE = re.compile(r"^AWS4-HMAC-SHA256 Credential=[^/]+/\d{8}/([^/]+)/s3/aws4_request")

log = logging.getLogger(__name__)


#: Answers the lean path raises as botocore would (never retried by botocore's
#: standard mode); every other answer goes to botocore.
_FINAL_ERRORS = {404: None, 403: ("AccessDenied", "InvalidObjectState", "AllAccessDisabled")}


#: Response checksums the lean path checks, in botocore's order of preference.
_CHECKSUMS = {
    "crc32": lambda data: zlib.crc32(data).to_bytes(4, "big"),
    "sha1": lambda data: hashlib.sha1(data).digest(),
    "sha256": lambda data: hashlib.sha256(data).digest(),
}


class _Retry(Exception):
    """The lean GET failed in a way botocore retries; ``body`` marks a short or broken body."""

    def __init__(self, cause: BaseException, body: bool = False):
        super().__init__(str(cause))
        self.cause, self.body = cause, body


class ObjectReader:
    """Whole-object GETs at less than half the CPU of botocore's ``get_object`` (docs/performance.md).

    botocore's ``get_object`` runs event hooks, endpoint rules, response
    parsing and per-call bookkeeping on every request; on an executor that
    shares its cores with the model, that is CPU the model does not get. So
    botocore makes the first successful GET of each bucket, and the reader
    learns from the request botocore sent where the bucket's objects live
    (scheme, host and path, whatever the endpoint, addressing style or region
    redirect) and which region signs for them. Later GETs are signed with the
    client's own credentials by botocore's public SigV4 signer
    (``S3SigV4Auth``, see :func:`_signed_get`) and sent through the client's
    own HTTP session (its connection pool, proxies, CA bundle and timeouts).

    The lean path accepts only a plain answer: a 200 whose body is whole and
    matches its CRC32, SHA-1 or SHA-256 checksum when S3 sends one. A 404, or
    a 403 for access or an archived object, raises the error botocore raises
    (``NoSuchKey``, ``AccessDenied``, ``InvalidObjectState``). Anything else
    (throttling, a 5xx, a redirect, a broken connection, a short body) goes to
    botocore, through :func:`read_object`, with the attempts that are left, so
    retries, their bound and the errors are botocore's on both paths.

    With ``lean``, the reader registers a ``before-send.s3.GetObject`` hook on
    ``client``, so ``client`` must be the reader's own: :func:`s3_reader`
    gives it one that :func:`s3_client` never hands out.
    """

    def __init__(self, client, credentials, max_attempts: int, retry_client, lean: bool = True):
        self.client, self.credentials, self.max_attempts = client, credentials, max_attempts
        self.lean = lean
        self._retry_client = retry_client
        # A private attribute of botocore's client, with no public way to the same session: checked
        # by unavailable(), which turns the lean path off when it is missing.
        self._http = getattr(getattr(client, "_endpoint", None), "http_session", None)
        self._learned: dict[str, tuple[str, str, str | None]] = {}
        self._fallback_logged: set[str] = set()
        self._lock = threading.Lock()
        self._sent = threading.local()
        #: False when turned off (``lean=False``), without credentials to sign with (unsigned access) or without
        #: botocore's HTTP session; decided once, as none of them changes.
        self.enabled = lean and self.unavailable() is None
        if self.enabled:
            client.meta.events.register("before-send.s3.GetObject", self._remember_request)
        elif lean:
            # Once per process and settings (s3_reader caches the reader): the job goes on, on botocore.
            log.warning("--s3-reader lean is not available here (%s); every GET goes through botocore's "
                        "get_object, at about 1.3 ms more CPU each", self.unavailable())

    def unavailable(self) -> str | None:
        """Why the lean path cannot serve this client (``None``: it can, or it was turned off)."""
        if not self.lean:
            return None
        if self.credentials is None:
            return "no credentials to sign with: unsigned access"
        if self._http is None:
            return (f"botocore {botocore.__version__} has no client._endpoint.http_session, the private "
                    "attribute the lean path sends through")
        return None

    def _remember_request(self, request, **_):
        self._sent.request = request  # returning None lets botocore send it

    def _learn(self, bucket: str, key: str) -> None:
        request = getattr(self._sent, "request", None)
        self._sent.request = None
        if request is None:
            return
        quoted = botocore.utils.percent_encode(key, safe="/~")
        scope = _SIGV4_SCOPE.match(_text(request.headers.get("Authorization")))
        url = request.url
        if scope is None or "?" in url or not url.endswith(quoted):
            # Not a plain SigV4 GET of the key: the bucket stays on botocore until one is. Said once per bucket.
            if bucket not in self._fallback_logged:
                self._fallback_logged.add(bucket)
                log.info("s3://%s/%s: botocore's request is not a plain SigV4 GET of the key; this bucket's GETs "
                         "stay on botocore until one is", bucket, key)
            return
        with self._lock:
            self._learned[bucket] = (url[: len(url) - len(quoted)], scope.group(1),
                                     _text(request.headers.get("User-Agent")) or None)

    def read(self, bucket: str, key: str, stats: IOStats | None = None, max_bytes: int | None = None,
             seen: dict | None = None) -> bytes:
        """The object's bytes; raises what :func:`read_object` raises (``max_bytes`` and ``seen`` as there)."""
        learned = self._learned.get(bucket) if self.enabled else None
        if learned is None:
            data = read_object(self.client, bucket, key, stats=stats, max_bytes=max_bytes, seen=seen)
            if self.enabled:
                self._learn(bucket, key)
            return data
        try:
            return self._get(learned, key, max_bytes, seen)
        except _Retry as retry:
            if self.max_attempts <= 1:
                raise retry.cause from None
            if stats is not None:
                stats.add(body_retries=int(retry.body), request_retries=int(not retry.body))
            log.debug("s3://%s/%s: lean GET failed (%s); retrying through botocore", bucket, key, retry.cause)
            return read_object(self._retry_client(), bucket, key, stats=stats, max_bytes=max_bytes, seen=seen)

    def _get(self, learned: tuple[str, str, str | None], key: str, max_bytes: int | None = None,
             seen: dict | None = None) -> bytes:
        base, region, user_agent = learned
        quoted = botocore.utils.percent_encode(key, safe="/~")
        request = _signed_get(self.credentials.get_frozen_credentials(), region, base + quoted, user_agent)
        try:
            response = self._http.send(request.prepare())
            length = response.headers.get("Content-Length")
            if response.status_code == 200 and max_bytes is not None and length and int(length) > max_bytes:
                response.raw.close()  # drop the connection instead of reading the body
                response.raw.release_conn()
                raise too_large(int(length), max_bytes)
            data = response.content
        except (botocore.exceptions.BotoCoreError, *BODY_READ_ERRORS) as exc:  # refused, reset, timed out, cut
            raise _Retry(exc, body=isinstance(exc, BODY_READ_ERRORS)) from None
        if response.status_code != 200:
            raise self._error(response)
        short = _short_body(data, response.headers.get("Content-Length"))
        if short is not None:
            raise _Retry(short, body=True)
        self._check_checksum(response.headers, data)
        if seen is not None:
            seen["etag"] = _etag(response.headers.get("ETag"))
        return data

    def _error(self, response) -> Exception:
        """The modeled ClientError for a final answer; a :class:`_Retry` for one botocore should handle."""
        status, headers = response.status_code, response.headers
        code, message = _error_code(response.content)
        code = code or str(status)
        error = {"Error": {"Code": code, "Message": message or http.client.responses.get(status, "")},
                 "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": dict(headers.items()),
                                      "RequestId": headers.get("x-amz-request-id"),
                                      "HostId": headers.get("x-amz-id-2"), "RetryAttempts": 0}}
        exc = self.client.exceptions.from_code(code)(error, "GetObject")
        final = status in _FINAL_ERRORS and (_FINAL_ERRORS[status] is None or code in _FINAL_ERRORS[status])
        return exc if final else _Retry(exc)

    @staticmethod
    def _check_checksum(headers, data: bytes) -> None:
        for algorithm, digest in _CHECKSUMS.items():
            expected = headers.get(f"x-amz-checksum-{algorithm}")
            if expected is None or "-" in expected:  # "-N": a multipart upload's checksum of checksums
                continue
            if digest(data) != base64.b64decode(expected):
                raise _Retry(botocore.exceptions.FlexibleChecksumError(
                    error_msg=f"Expected {algorithm} checksum {expected} did not match the body's"), body=True)
            return


def _signed_get(credentials, region: str, url: str, user_agent: str | None) -> botocore.awsrequest.AWSRequest:
    """The lean path's GET of ``url``, signed as botocore signs ``get_object``'s (public ``S3SigV4Auth``).

    A hand-written signer saved too little CPU a GET to be worth a second
    SigV4 implementation (docs/performance.md, "Figures behind the code").
    """
    headers = {"x-amz-checksum-mode": "ENABLED"}  # botocore's get_object asks for the object's checksum too
    if user_agent:
        headers["User-Agent"] = user_agent
    # stream_output: the body stays unread until the status and Content-Length are checked.
    request = botocore.awsrequest.AWSRequest(method="GET", url=url, headers=headers, stream_output=True)
    botocore.auth.S3SigV4Auth(credentials, "s3", region).add_auth(request)
    return request


def _text(value) -> str:
    """A header value as text (botocore's prepared requests hold bytes)."""
    return value.decode("latin-1") if isinstance(value, bytes) else value or ""


def _error_code(body: bytes) -> tuple[str | None, str | None]:
    """``(Code, Message)`` of an S3 XML error body, or Nones."""
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError:
        return None, None
    return root.findtext("Code"), root.findtext("Message")


#: ``--s3-reader`` choices (declared in :mod:`mxjob.core.constants`).
S3_READERS = constants.S3_READERS


def s3_reader(endpoint_url: str | None = None, region: str | None = None, max_attempts: int = S3_MAX_ATTEMPTS,
              max_pool_connections: int = S3_POOL_CONNECTIONS, kind: str = S3_READERS[0]) -> ObjectReader:
    """Return this process's :class:`ObjectReader` for these settings, creating it once.

    ``kind="lean"`` reads through a client of the reader's own (cached apart
    from :func:`s3_client`'s, see :func:`cached_client`), since its lean path
    registers a ``before-send`` hook on it. ``kind="botocore"`` turns the lean
    path off: every GET is botocore's own ``get_object`` (more CPU each) on
    :func:`s3_client`'s plain client, no hook of ours anywhere, for an
    endpoint or a credential provider the lean path does not serve as you
    need.
    """
    if kind not in S3_READERS:
        raise ValueError(f"s3 reader {kind!r}: choose one of {', '.join(S3_READERS)}")
    lean = kind == "lean"
    client, credentials = cached_client(endpoint_url, region, max_attempts, max_pool_connections,
                                        purpose="lean reader" if lean else "plain")

    def retry_client():
        # A plain client: the lean path's failures go to botocore, not back through the hook.
        return s3_client(endpoint_url, region, max_attempts=max_attempts - 1, max_pool_connections=max_pool_connections)

    def make() -> ObjectReader:
        return ObjectReader(client, credentials, max_attempts, retry_client, lean=lean)

    return state.s3_readers.get((endpoint_url, region, max_attempts, max_pool_connections, kind, os.getpid()), make)

