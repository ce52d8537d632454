"""S3 helpers: URIs, paginated listing, suffix filter, retried body reads, atomic multipart upload."""

from __future__ import annotations

import io

import boto3
import botocore.config
import botocore.exceptions
import pytest
from moto import mock_aws

from mxjob.s3 import access, parallel_list, reads, uris, writes


@pytest.fixture
def s3_mock():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bkt")
        yield client


@pytest.mark.parametrize("uri, expected", [
    ("s3://bucket/a/b.jpg", ("bucket", "a/b.jpg")),
    ("s3://bucket", ("bucket", "")),
    ("s3a://bucket/p/", ("bucket", "p/")),
])
def test_parse_s3_uri(uri, expected):
    assert uris.parse_s3_uri(uri) == expected


@pytest.mark.parametrize("uri, need_key", [("http://x/y", False), ("s3:///key", False), ("s3://b/", True)])
def test_parse_s3_uri_rejects(uri, need_key):
    with pytest.raises(uris.S3UriError, match="s3://BUCKET/KEY"):
        uris.parse_s3_uri(uri, need_key=need_key)


def test_listing_follows_pages_past_1000_keys(s3_mock):
    for i in range(1234):
        s3_mock.put_object(Bucket="bkt", Key=f"p/{i:05d}.jpg", Body=b"x" * (i % 7))
    s3_mock.put_object(Bucket="bkt", Key="other/0.jpg", Body=b"")
    listed = list(parallel_list.list_objects(s3_mock, "bkt", "p/"))
    assert len(listed) == 1234
    assert listed[5] == ("p/00005.jpg", 5)


def test_listing_an_empty_prefix_yields_nothing(s3_mock):
    assert list(parallel_list.list_objects(s3_mock, "bkt", "nothing-here/")) == []


class FlakyBody:
    def __init__(self, data: bytes, fail: bool):
        self.data, self.fail = data, fail

    def read(self):
        if self.fail:
            raise botocore.exceptions.ResponseStreamingError(error="connection reset mid-body")
        return self.data

    def close(self):
        pass


class FlakyClient:
    """get_object whose first ``failures`` bodies break while streaming."""

    def __init__(self, data: bytes, failures: int):
        self.data, self.failures, self.calls = data, failures, 0

    def get_object(self, Bucket, Key):
        self.calls += 1
        fail = self.calls <= self.failures
        return {"Body": FlakyBody(self.data, fail), "ContentLength": len(self.data),
                "ResponseMetadata": {"RetryAttempts": 1}}


def test_read_object_retries_a_body_cut_off_midway_and_counts_it():
    client = FlakyClient(b"image bytes", failures=2)
    stats = reads.IOStats()
    assert reads.read_object(client, "bkt", "k", attempts=3, stats=stats) == b"image bytes"
    assert client.calls == 3
    assert stats.body_retries == 2
    assert stats.request_retries == 3  # botocore's own retries, from the response metadata


class UnreadBody(FlakyBody):
    """A body that must not be read; remembers being closed."""

    closed = False

    def read(self):
        raise AssertionError("the body of a too-large object was read")

    def close(self):
        self.closed = True


def test_read_object_refuses_an_object_over_max_bytes_before_reading_its_body():
    body = UnreadBody(b"", fail=False)
    client = FlakyClient(b"x" * 10, failures=0)
    client.get_object = lambda Bucket, Key: {"Body": body, "ContentLength": 5_000_001}
    with pytest.raises(reads.ObjectTooLargeError, match="object is 5000001 bytes, over max_object_bytes=5000000"):
        reads.read_object(client, "bkt", "k", max_bytes=5_000_000)
    assert body.closed
    assert reads.read_object(FlakyClient(b"x" * 10, failures=0), "bkt", "k", max_bytes=10) == b"x" * 10


def test_read_object_gives_up_after_its_attempts():
    client = FlakyClient(b"x", failures=5)
    with pytest.raises(botocore.exceptions.ResponseStreamingError, match="connection reset mid-body"):
        reads.read_object(client, "bkt", "k", attempts=2)
    assert client.calls == 2


def test_read_object_raises_no_such_key_at_once(s3_mock):
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchKey"):
        reads.read_object(s3_mock, "bkt", "missing.jpg")


def test_read_uri_reads_s3_paths_and_file_uris(s3_mock, tmp_path):
    s3_mock.put_object(Bucket="bkt", Key="m/x.txt", Body=b"from s3")
    (tmp_path / "x.txt").write_bytes(b"from disk")
    assert reads.read_uri("s3://bkt/m/x.txt", s3_mock) == b"from s3"
    assert reads.read_uri(str(tmp_path / "x.txt")) == b"from disk"
    assert reads.read_uri(f"file://{tmp_path / 'x.txt'}") == b"from disk"
    with pytest.raises(FileNotFoundError, match=r"s3://bkt/m/absent\.txt does not exist"):
        reads.read_uri("s3://bkt/m/absent.txt", s3_mock)
    with pytest.raises(FileNotFoundError, match=r"No such file or directory: .*absent\.txt"):
        reads.read_uri(str(tmp_path / "absent.txt"))


def test_multipart_writer_streams_parts_and_the_object_appears_only_on_close(s3_mock):
    writer = writes.MultipartWriter(s3_mock, "bkt", "out/p.jsonl", part_bytes=writes.MIN_PART_BYTES)
    chunk = b"x" * (1024 * 1024)
    for _ in range(11):
        writer.write(chunk)
    assert len(writer._parts) == 2  # 10 MiB uploaded as it came, 1 MiB still buffered
    assert "Contents" not in s3_mock.list_objects_v2(Bucket="bkt", Prefix="out/")
    writer.close()
    body = s3_mock.get_object(Bucket="bkt", Key="out/p.jsonl")["Body"].read()
    assert body == chunk * 11


def test_multipart_writer_doubles_its_part_size_so_ten_thousand_parts_hold_any_object(s3_mock, monkeypatch):
    monkeypatch.setattr(writes.MultipartWriter, "PARTS_PER_SIZE", 2)  # S3 takes 10,000 parts; here every 2 double
    writer = writes.MultipartWriter(s3_mock, "bkt", "out/grow.jsonl", part_bytes=writes.MIN_PART_BYTES)
    chunk = b"y" * (1024 * 1024)
    for _ in range(31):
        writer.write(chunk)
    sizes = [s3_mock.list_parts(Bucket="bkt", Key="out/grow.jsonl", UploadId=writer.upload_id)["Parts"][i]["Size"]
             for i in range(len(writer._parts))]
    mib = 1024 * 1024
    assert sizes == [5 * mib, 5 * mib, 10 * mib, 10 * mib]  # 30 MiB in 4 parts, 1 MiB buffered
    writer.close()
    assert s3_mock.get_object(Bucket="bkt", Key="out/grow.jsonl")["Body"].read() == chunk * 31


def test_multipart_writer_aborts_on_error_leaving_no_object_and_no_parts(s3_mock):
    with pytest.raises(RuntimeError, match="the job failed"):
        with writes.MultipartWriter(s3_mock, "bkt", "out/p.jsonl") as writer:
            writer.write(b"partial\n")
            raise RuntimeError("the job failed")
    assert "Contents" not in s3_mock.list_objects_v2(Bucket="bkt", Prefix="out/")
    assert s3_mock.list_multipart_uploads(Bucket="bkt").get("Uploads", []) == []


def test_a_lazy_writer_puts_an_object_under_one_part_in_one_request_and_streams_a_larger_one(s3_mock):
    calls = []
    s3_mock.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
    with writes.MultipartWriter(s3_mock, "bkt", "out/small.arrows", content_type="x/small", lazy=True) as writer:
        writer.write(b"a few kB of plan")
        assert "Contents" not in s3_mock.list_objects_v2(Bucket="bkt", Prefix="out/")
    assert calls[-1] == "PutObject" and "CreateMultipartUpload" not in calls
    small = s3_mock.get_object(Bucket="bkt", Key="out/small.arrows")
    assert small["Body"].read() == b"a few kB of plan" and small["ContentType"] == "x/small"
    calls.clear()
    chunk = b"z" * (1024 * 1024)
    with writes.MultipartWriter(s3_mock, "bkt", "out/large.arrows", part_bytes=writes.MIN_PART_BYTES,
                                lazy=True) as writer:
        for _ in range(6):
            writer.write(chunk)
    assert calls[0] == "CreateMultipartUpload" and calls.count("UploadPart") == 2 and "PutObject" not in calls
    assert s3_mock.get_object(Bucket="bkt", Key="out/large.arrows")["Body"].read() == chunk * 6
    with pytest.raises(RuntimeError, match="failed"):  # failed before its first part: nothing to abort, no object
        with writes.MultipartWriter(s3_mock, "bkt", "out/failed.arrows", lazy=True) as writer:
            writer.write(b"partial")
            raise RuntimeError("failed")
    assert "Contents" not in s3_mock.list_objects_v2(Bucket="bkt", Prefix="out/failed")
    assert s3_mock.list_multipart_uploads(Bucket="bkt").get("Uploads", []) == []


def test_multipart_writer_needs_a_writable_bucket(s3_mock):
    with pytest.raises(botocore.exceptions.ClientError, match="NoSuchBucket"):
        writes.MultipartWriter(s3_mock, "no-such-bucket", "k")


def test_sibling_uri():
    assert uris.sibling_uri("s3://b/models/r18-symbol.json", "synset.txt") == "s3://b/models/synset.txt"
    assert uris.sibling_uri("r18-symbol.json", "synset.txt") == "synset.txt"


def test_put_text_round_trips(s3_mock):
    writes.put_text(s3_mock, "bkt", "s.json", '{"a": 1}')
    assert io.BytesIO(s3_mock.get_object(Bucket="bkt", Key="s.json")["Body"].read()).read() == b'{"a": 1}'


def test_check_writable_writes_a_probe_beside_the_key_and_leaves_nothing(s3_mock):
    s3_mock.put_object(Bucket="bkt", Key="out/p.jsonl", Body=b"an earlier output")
    written = []
    s3_mock.meta.events.register("provide-client-params.s3.PutObject",
                                 lambda params, **_: written.append(params["Key"]))
    access.check_writable(s3_mock, "bkt", "out/p.jsonl")
    [probe] = written
    assert probe.startswith("out/p.jsonl.write-check-")
    keys = [obj["Key"] for obj in s3_mock.list_objects_v2(Bucket="bkt")["Contents"]]
    assert keys == ["out/p.jsonl"]  # the probe is gone and the existing object untouched
    assert s3_mock.get_object(Bucket="bkt", Key="out/p.jsonl")["Body"].read() == b"an earlier output"


def test_check_writable_names_the_output_and_the_cause(s3_mock):
    with pytest.raises(access.OutputNotWritableError, match=r"cannot write s3://nope/k\.jsonl: .*NoSuchBucket"):
        access.check_writable(s3_mock, "nope", "k.jsonl")


#: A loopback port nothing listens on (discard): every connection is refused at once.
DOWN_ENDPOINT = "http://127.0.0.1:9"


def test_check_writable_names_the_endpoint_it_cannot_reach_not_the_permissions():
    client = boto3.client("s3", endpoint_url=DOWN_ENDPOINT, region_name="us-east-1",
                          config=botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=1))
    with pytest.raises(access.OutputNotWritableError) as refused:
        access.check_writable(client, "bkt", "k.jsonl")
    message = str(refused.value)
    assert message.startswith(f"cannot write s3://bkt/k.jsonl: the S3 endpoint {DOWN_ENDPOINT} cannot be reached")
    assert "--endpoint-url" in message and "AWS_ENDPOINT_URL" in message
    assert "s3:PutObject" not in message and "existing bucket" not in message


def test_check_writable_passes_when_only_the_clean_up_is_refused(s3_mock, caplog):
    def refuse(**_):
        raise botocore.exceptions.ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "DeleteObject")

    s3_mock.meta.events.register("before-call.s3.DeleteObject", refuse)
    access.check_writable(s3_mock, "bkt", "k.jsonl")
    assert "delete it by hand" in caplog.text
