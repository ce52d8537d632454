"""Uploads and deletes: multipart uploads completed only when whole, small PUTs, deletes, open uploads aborted."""

from __future__ import annotations

from collections.abc import Callable, Iterable

#: S3 refuses multipart parts under 5 MiB (except the last one).
MIN_PART_BYTES = 5 * 1024 * 1024


#: S3's largest part.
MAX_PART_BYTES = 5 * 1024 ** 3


def delete_objects(client, bucket: str, keys: Iterable[str]) -> int:
    """Delete ``keys`` in DeleteObjects calls of 1,000 (S3's most a call); return how many.

    A key S3 could not delete raises ``OSError`` naming it.
    """
    keys = list(keys)
    for start in range(0, len(keys), 1000):
        chunk = keys[start:start + 1000]
        response = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in chunk], "Quiet": True})
        if response.get("Errors"):
            error = response["Errors"][0]
            raise OSError(f"cannot delete s3://{bucket}/{error['Key']}: {error.get('Message')}")
    return len(keys)


def abort_uploads(client, bucket: str, prefix: str, mine: Callable[[str], bool]) -> int:
    """Abort the incomplete multipart uploads under ``prefix`` whose key ``mine`` accepts; return how many.

    A driver killed (SIGKILL, a lost node) while it wrote the output leaves
    its upload open: never visible, but S3 bills its parts until it is
    aborted. The run that resumes or overwrites that output aborts it.
    """
    aborted = 0
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        for upload in page.get("Uploads", ()):
            if mine(upload["Key"]):
                client.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
                aborted += 1
    return aborted


class MultipartWriter:
    """Stream bytes to one S3 object through a multipart upload.

    The object appears only when :meth:`close` completes the upload, so a
    reader never sees half a file; on any error (or :meth:`abort`) the upload
    is aborted and no parts are left behind. Memory holds one part at most.
    Creating the upload is itself a check that the job may write the key, which
    is why the driver opens the writer before it starts any Spark work.
    ``lazy``: the upload is created with its first part instead, and an object
    that never fills one is written with one PUT at :meth:`close` (one request
    where an upload takes three: the run's plan, a few kB for a small run).

    Examples
    --------
    >>> with MultipartWriter(client, "bucket", "out/predictions.jsonl") as out:  # doctest: +SKIP
    ...     out.write(b'{"key": "a.jpg"}\\n')
    """

    #: The part size doubles after every this many parts: S3 takes at most 10,000 parts in an upload, and
    #: parts of 5 MiB would stop an object at 50 GB (a hundred million embeddings as JSON Lines are more).
    PARTS_PER_SIZE = 1000

    def __init__(self, client, bucket: str, key: str, part_bytes: int = 8 * MIN_PART_BYTES // 5,
                 content_type: str = "application/x-ndjson", lazy: bool = False):
        if part_bytes < MIN_PART_BYTES:
            raise ValueError(f"part_bytes must be at least {MIN_PART_BYTES} (S3's minimum part size)")
        self.client, self.bucket, self.key, self.part_bytes = client, bucket, key, part_bytes
        self.content_type = content_type
        self._buffer = bytearray()
        self._parts: list[dict] = []
        self.bytes_written = 0
        self.upload_id = None if lazy else self._create()

    def _create(self) -> str:
        upload = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.key, ContentType=self.content_type)
        return upload["UploadId"]

    def write(self, data: bytes) -> None:
        self._buffer += data
        self.bytes_written += len(data)
        while len(self._buffer) >= self.part_bytes:
            self._upload_part(bytes(self._buffer[: self.part_bytes]))
            del self._buffer[: self.part_bytes]

    def _upload_part(self, data: bytes) -> None:
        if self.upload_id is None:  # lazy: the first part creates the upload
            self.upload_id = self._create()
        number = len(self._parts) + 1
        response = self.client.upload_part(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                           PartNumber=number, Body=data)
        self._parts.append({"ETag": response["ETag"], "PartNumber": number})
        if number % self.PARTS_PER_SIZE == 0:
            self.part_bytes = min(2 * self.part_bytes, MAX_PART_BYTES)

    def close(self) -> None:
        """Upload what is buffered and complete the upload: the object appears now."""
        if self.upload_id is None and not self._parts:  # lazy, and under one part: one PUT
            self.client.put_object(Bucket=self.bucket, Key=self.key, Body=bytes(self._buffer),
                                   ContentType=self.content_type)
            self._buffer.clear()
            return
        if self._buffer or not self._parts:
            self._upload_part(bytes(self._buffer))
            self._buffer.clear()
        self.client.complete_multipart_upload(Bucket=self.bucket, Key=self.key, UploadId=self.upload_id,
                                              MultipartUpload={"Parts": self._parts})
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
