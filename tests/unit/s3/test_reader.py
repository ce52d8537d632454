"""object_reader.ObjectReader: the executors' lean GET path, against the moto server behind the fault proxy.

botocore makes a bucket's first GET and the reader makes the rest itself;
what comes back (bytes, errors, retries and their bound) must be what
botocore's own ``get_object`` gives.
"""

from __future__ import annotations

import base64
import datetime
import logging
import zlib
from unittest import mock

import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.exceptions
import botocore.utils
import pytest

from demo.s3local import free_port
from mxjob.options import config
from mxjob.s3 import clients, object_reader, reads
from tests.support.fault_proxy import FaultProxy, Faults

BUCKET = "reader-bucket"
BODIES = {f"r/{name}": bytes([i]) * (1000 + 997 * i) for i, name in enumerate(
    ["a.jpg", "b.jpg", "c d.jpg", "ü/é+%.jpg", "e.jpg"])}


@pytest.fixture(scope="module")
def bucket(moto_buckets):
    s3 = moto_buckets
    for key, body in BODIES.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    s3.put_object(Bucket=BUCKET, Key="r/archived.jpg", Body=b"cold", StorageClass="GLACIER")
    s3.put_object(Bucket=BUCKET, Key="r/crc.jpg", Body=b"checked" * 100, ChecksumAlgorithm="CRC32")
    return s3


def fresh_reader(endpoint: str, max_attempts: int = clients.S3_MAX_ATTEMPTS) -> object_reader.ObjectReader:
    """A reader that has learned nothing yet (the cached one may have), on a client of its own as s3_reader's."""
    client, credentials = clients.cached_client(endpoint, None, max_attempts, clients.S3_POOL_CONNECTIONS,
                                              purpose="test reader")
    retry = lambda: clients.s3_client(endpoint, max_attempts=max_attempts - 1)  # noqa: E731
    return object_reader.ObjectReader(client, credentials, max_attempts, retry)


def seen(proxy: FaultProxy) -> int:
    """Requests that reached the proxy, denied ones included."""
    return proxy.counts["requests"]


def botocore_sends(client) -> list:
    sent: list = []
    client.meta.events.register("before-send.s3.GetObject", lambda request, **_: sent.append(request.url))
    return sent


def test_botocore_makes_the_first_get_of_a_bucket_and_the_reader_the_rest(bucket, moto_endpoint):
    with FaultProxy(moto_endpoint) as proxy:
        reader = fresh_reader(proxy.endpoint)
        assert reader.enabled
        sent = botocore_sends(reader.client)
        got = {key: reader.read(BUCKET, key) for key in BODIES}
    assert got == BODIES  # keys with spaces, non-ASCII, '+' and '%' included
    assert len(sent) == 1
    assert proxy.counts["requests"] == len(BODIES)  # one request each, no retries


def test_a_checksummed_object_is_checked_and_read(bucket, moto_endpoint):
    reader = fresh_reader(moto_endpoint)
    reader.read(BUCKET, "r/a.jpg")  # learn the bucket
    assert reader.read(BUCKET, "r/crc.jpg") == b"checked" * 100
    head = bucket.head_object(Bucket=BUCKET, Key="r/crc.jpg", ChecksumMode="ENABLED")
    assert head["ChecksumCRC32"] == base64.b64encode(zlib.crc32(b"checked" * 100).to_bytes(4, "big")).decode()


def test_a_body_that_does_not_match_its_checksum_is_refused():
    good = b"pixels"
    header = base64.b64encode(zlib.crc32(good).to_bytes(4, "big")).decode()
    object_reader.ObjectReader._check_checksum({"x-amz-checksum-crc32": header}, good)
    # composite: not checked
    object_reader.ObjectReader._check_checksum({"x-amz-checksum-crc32": header + "-3"}, b"other")
    with pytest.raises(object_reader._Retry, match=r"Expected crc32 checksum \S+ did not match the body's") as raised:
        object_reader.ObjectReader._check_checksum({"x-amz-checksum-crc32": header}, b"pixelz")
    assert raised.value.body and isinstance(raised.value.cause, botocore.exceptions.FlexibleChecksumError)


@pytest.mark.parametrize("key, code", [("r/missing.jpg", "NoSuchKey"), ("r/denied.jpg", "AccessDenied"),
                                       ("r/archived.jpg", "InvalidObjectState")])
def test_final_errors_are_botocores_own_and_not_retried(bucket, moto_endpoint, key, code):
    with FaultProxy(moto_endpoint, deny=lambda method, path: "denied" in path) as proxy:
        reader = fresh_reader(proxy.endpoint)
        reader.read(BUCKET, "r/a.jpg")
        before = seen(proxy)
        with pytest.raises(botocore.exceptions.ClientError, match=rf"\({code}\) when calling the GetObject") as lean:
            reader.read(BUCKET, key)
        assert seen(proxy) == before + 1
        with pytest.raises(botocore.exceptions.ClientError, match=rf"\({code}\) when calling the GetObject") as full:
            reads.read_object(reader.client, BUCKET, key)
    assert lean.value.response["Error"]["Code"] == code
    assert type(lean.value) is type(full.value)
    assert str(lean.value) == str(full.value)


@pytest.mark.parametrize("attempts", [1, 3])
def test_throttling_goes_to_botocore_with_the_attempts_left(bucket, moto_endpoint, attempts):
    throttled = lambda method, path: path.endswith("/r/b.jpg")  # noqa: E731
    with FaultProxy(moto_endpoint, faults=Faults(rate=1.0, kinds=("slowdown",), key_filter=throttled)) as proxy:
        reader = fresh_reader(proxy.endpoint, max_attempts=attempts)
        reader.read(BUCKET, "r/a.jpg")
        stats = reads.IOStats()
        with pytest.raises(botocore.exceptions.ClientError, match="SlowDown"):
            reader.read(BUCKET, "r/b.jpg", stats=stats)
    assert proxy.counts["slowdown"] == attempts  # the lean try counts as the first attempt
    assert stats.request_retries == attempts - 1


def test_resets_and_cut_bodies_are_read_again_and_counted(bucket, moto_endpoint):
    with FaultProxy(moto_endpoint, faults=Faults(rate=0.5, kinds=("reset", "cut"), seed=1,
                                              key_filter=lambda method, path: not path.endswith("/r/a.jpg"))) as proxy:
        reader = fresh_reader(proxy.endpoint, max_attempts=8)
        reader.read(BUCKET, "r/a.jpg")
        stats = reads.IOStats()
        got = {key: reader.read(BUCKET, key, stats=stats) for key in BODIES}
    assert got == BODIES
    assert proxy.counts["reset"] >= 1 and proxy.counts["cut"] >= 1, proxy.counts
    assert stats.request_retries + stats.body_retries >= proxy.counts["reset"] + proxy.counts["cut"]


def test_a_refused_connection_goes_to_botocore_too(bucket, moto_endpoint):
    reader = fresh_reader(moto_endpoint, max_attempts=2)
    reader.read(BUCKET, "r/a.jpg")
    base, region, agent = reader._learned[BUCKET]
    # Nothing listens on this port: the lean GET is refused, botocore then reads from moto.
    reader._learned[BUCKET] = (base.replace(moto_endpoint, f"http://127.0.0.1:{free_port()}"), region, agent)
    stats = reads.IOStats()
    assert reader.read(BUCKET, "r/b.jpg", stats=stats) == BODIES["r/b.jpg"]
    assert stats.request_retries == 1


def test_without_credentials_every_get_is_botocores_and_the_fallback_is_logged_once(bucket, moto_endpoint, caplog):
    client = clients.s3_client(moto_endpoint)
    with caplog.at_level(logging.WARNING, logger=object_reader.__name__):
        reader = object_reader.ObjectReader(client, None, 5, lambda: client)
    assert not reader.enabled and reader.unavailable() == "no credentials to sign with: unsigned access"
    [warning] = [r.getMessage() for r in caplog.records if "--s3-reader lean is not available" in r.getMessage()]
    assert "unsigned access" in warning and "botocore's get_object" in warning
    sent = botocore_sends(client)
    assert [reader.read(BUCKET, key) for key in ("r/a.jpg", "r/b.jpg")] == [BODIES["r/a.jpg"], BODIES["r/b.jpg"]]
    assert len(sent) == 2


class WithoutEndpoint:
    """A botocore client as one whose private ``_endpoint`` is gone (a renamed internal); the rest is the client's."""

    def __init__(self, client):
        self.client = client

    def __getattr__(self, name: str):
        if name == "_endpoint":
            raise AttributeError(name)
        return getattr(self.client, name)


def test_a_client_without_botocores_private_http_session_reads_through_get_object_and_says_so_once(
        bucket, moto_endpoint, caplog):
    client, credentials = clients.cached_client(moto_endpoint, None, clients.S3_MAX_ATTEMPTS,
                                                clients.S3_POOL_CONNECTIONS, purpose="test reader")
    with caplog.at_level(logging.WARNING, logger=object_reader.__name__):
        reader = object_reader.ObjectReader(WithoutEndpoint(client), credentials, 5, lambda: client)
        sent = botocore_sends(client)
        keys = ("r/a.jpg", "r/c d.jpg", "r/ü/é+%.jpg", "r/a.jpg")
        assert [reader.read(BUCKET, key) for key in keys] == [BODIES[key] for key in keys]
    assert not reader.enabled and "client._endpoint.http_session" in reader.unavailable()
    assert len(sent) == len(keys)  # every GET is botocore's get_object
    [warning] = [r.getMessage() for r in caplog.records if r.name == object_reader.__name__]
    assert (f"(botocore {botocore.__version__} has no client._endpoint.http_session, the private attribute "
            "the lean path sends through)" in warning and "every GET goes through botocore's get_object" in warning)
    turned_off = object_reader.ObjectReader(client, credentials, 5, lambda: client, lean=False)
    assert not turned_off.enabled and turned_off.unavailable() is None  # off by choice: nothing to warn about


def test_the_botocore_reader_sends_every_get_through_get_object(bucket, moto_endpoint):
    reader = object_reader.s3_reader(moto_endpoint, max_attempts=2, kind="botocore")
    assert not reader.enabled and reader is not object_reader.s3_reader(moto_endpoint, max_attempts=2)
    sent = botocore_sends(reader.client)
    keys = ("r/a.jpg", "r/b.jpg", "r/a.jpg")
    assert [reader.read(BUCKET, key) for key in keys] == [BODIES[key] for key in keys]
    assert len(sent) == 3
    with pytest.raises(ValueError, match="choose one of lean, botocore"):
        object_reader.s3_reader(moto_endpoint, kind="fast")


def test_s3_reader_option_reaches_the_executors_job_spec():
    base = {"input": "s3://b/in/", "model": "s3://b/m", "output": "s3://b/o.jsonl"}
    assert config.resolve(config.merge_settings(base, {})).job_spec().s3_reader == "lean"
    chosen = config.resolve(config.merge_settings({**base, "s3_reader": "botocore"}, {}))
    assert chosen.job_spec().s3_reader == "botocore"


def test_s3_reader_is_one_per_process_and_settings(moto_endpoint):
    reader = object_reader.s3_reader
    assert reader(moto_endpoint, max_attempts=4) is reader(moto_endpoint, max_attempts=4)
    assert reader(moto_endpoint, max_attempts=4) is not reader(moto_endpoint, max_attempts=3)


def test_an_object_over_max_bytes_is_refused_from_its_content_length_on_both_paths(bucket, moto_endpoint,
                                                                                      monkeypatch):
    big = BODIES["r/e.jpg"]  # the largest body; r/a.jpg is the smallest
    with FaultProxy(moto_endpoint) as proxy:
        reader = fresh_reader(proxy.endpoint)
        with pytest.raises(reads.ObjectTooLargeError, match=f"object is {len(big)} bytes, over max_object_bytes=1500"):
            reader.read(BUCKET, "r/e.jpg", max_bytes=1500)  # botocore's GET (the bucket's first)
        assert reader.read(BUCKET, "r/a.jpg", max_bytes=1500) == BODIES["r/a.jpg"]  # at the limit: read
        assert BUCKET in reader._learned
        before = seen(proxy)
        with monkeypatch.context() as patch:  # the lean path must refuse before it touches the body
            patch.setattr(botocore.awsrequest.AWSResponse, "content",
                          property(lambda self: pytest.fail("the body of a too-large object was read")))
            with pytest.raises(reads.ObjectTooLargeError, match=f"object is {len(big)} bytes"):
                reader.read(BUCKET, "r/e.jpg", max_bytes=1500)
        assert seen(proxy) == before + 1  # refused, not retried through botocore
        assert reader.read(BUCKET, "r/e.jpg", max_bytes=len(big)) == big  # the connection pool still works


# ----------------------------------------------------------------------------
# The lean path's signing: botocore's public S3SigV4Auth, outside botocore's get_object


def test_a_lean_get_is_signed_as_botocores_get_object_and_moto_serves_it(bucket, moto_endpoint):
    reader = fresh_reader(moto_endpoint)
    through_botocore: list = []  # every GET that went through botocore's whole get_object
    reader.client.meta.events.register("before-send.s3.GetObject",
                                       lambda request, **_: through_botocore.append(request))
    key = "r/ü/é+%.jpg"
    with mock.patch("botocore.auth.get_current_datetime", return_value=datetime.datetime(2026, 11, 23, 23, 59, 59)):
        assert reader.read(BUCKET, key) == BODIES[key]  # botocore's GET: the reader learns the bucket from it
        base, region, agent = reader._learned[BUCKET]
        url = base + botocore.utils.percent_encode(key, safe="/~")
        lean = object_reader._signed_get(reader.credentials.get_frozen_credentials(), region, url, agent).prepare()
    [botocores] = through_botocore
    # Every header botocore signed and sent, Authorization included; amz-sdk-* are its per-call retry
    # headers, added after signing.
    assert lean.url == botocores.url
    signed = {name: object_reader._text(value) for name, value in botocores.headers.items()
              if not name.startswith("amz-sdk-")}
    assert {name: object_reader._text(value) for name, value in lean.headers.items()} == signed
    response = reader._http.send(lean)
    assert response.status_code == 200 and response.content == BODIES[key]
    # The reader's own GETs are signed that way and never go through botocore's get_object.
    assert [reader.read(BUCKET, k) for k in ("r/a.jpg", "r/c d.jpg")] == [BODIES["r/a.jpg"], BODIES["r/c d.jpg"]]
    assert len(through_botocore) == 1


@pytest.mark.parametrize("kind", ["lean", "botocore"])
def test_both_paths_tell_the_etag_of_the_object_they_read(bucket, moto_endpoint, kind):
    reader = fresh_reader(moto_endpoint) if kind == "lean" else object_reader.s3_reader(moto_endpoint, kind="botocore")
    reader.read(BUCKET, "r/a.jpg")  # the lean reader learns the bucket on botocore's GET
    for key in ("r/b.jpg", "r/c d.jpg"):
        told: dict = {}
        assert reader.read(BUCKET, key, seen=told) == BODIES[key]
        assert told == {"etag": bucket.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"')}
    assert reader.enabled == (kind == "lean")  # the second GET went the path named


@pytest.mark.parametrize("kind", ["lean", "botocore"])
def test_the_proxy_answers_kept_objects_from_memory_as_moto_did(bucket, moto_endpoint, kind):
    # The benchmark's stand-in: the image GETs cost moto nothing. The objects are deleted
    # upstream once kept, so only the proxy's memory can answer their whole-object GETs.
    kept = {"held/a.jpg": b"\xff\xd8kept" * 300, "held/ü é+%.jpg": b"second" * 50}
    for key, body in kept.items():
        bucket.put_object(Bucket=BUCKET, Key=key, Body=body, ChecksumAlgorithm="CRC32")
    etags = {key: bucket.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"') for key in kept}
    with FaultProxy(moto_endpoint) as proxy:
        assert proxy.keep_in_memory(bucket, BUCKET, kept) == sum(map(len, kept.values()))
        for key in kept:
            bucket.delete_object(Bucket=BUCKET, Key=key)
        reader = (fresh_reader(proxy.endpoint) if kind == "lean"
                  else object_reader.s3_reader(proxy.endpoint, kind="botocore"))
        for key, body in kept.items():
            told: dict = {}
            assert reader.read(BUCKET, key, seen=told) == body
            assert told == {"etag": etags[key]}
        assert reader.enabled == (kind == "lean")
        # A ranged GET is not the whole object: it goes to moto, which no longer has it.
        with pytest.raises(botocore.exceptions.ClientError, match="NoSuchKey"):
            reads.read_object(reader.client, BUCKET, "held/a.jpg", byte_range=(0, 10))
