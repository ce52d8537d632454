"""One JSON Lines object: ``--output s3://BUCKET/KEY.jsonl`` (``.json``, ``.ndjson``; ``.jsonl.gz`` gzipped).

One line per image, in key order (:meth:`mxjob.tasks.Task.json_lines`), written
through one multipart upload completed only when whole. The kind a key with
no suffix gets, unless ``--output-format parquet`` says otherwise.
"""

from __future__ import annotations

import zlib
from typing import ClassVar

import pyarrow as pa

from mxjob import tasks
from mxjob.outputs.base import ObjectOutput
from mxjob.s3 import writes

#: zlib's level for a ``.gz`` JSON Lines output: gzip's own. Measured on one core here: top-5 classify lines
#: shrink to 13% at about 120 MB/s (level 9: 28 MB/s for 1% less), 1,280-value embeddings to 40% at about
#: 16 MB/s, which is why Parquet is the output for vectors. zlib lets go of the GIL while it compresses.
GZIP_LEVEL = 6


def is_gzip(key: str) -> bool:
    """Whether an output key names a gzip file (it ends in ``.gz``): JSON Lines are then written gzipped."""
    return key.lower().endswith(".gz")


class JsonLinesOutput(ObjectOutput):
    """JSON Lines, one line per image."""

    kind = "jsonl"
    format = "jsonl"
    form = "s3://BUCKET/KEY.jsonl"
    suffixes: ClassVar[tuple] = (".jsonl", ".json", ".jsonl.gz", ".ndjson")

    @classmethod
    def claims(cls, uri: str, requested_format: str | None) -> bool:
        """Any object another kind does not claim: a key with no suffix is JSON Lines."""
        return super().claims(uri, requested_format) or (requested_format is None and uri.startswith("s3://")
                                                         and not uri.endswith("/"))

    @property
    def content_type(self) -> str:
        """``application/gzip`` for a ``.gz`` key, with no Content-Encoding: with ``Content-Encoding: gzip``, S3's
        and browsers' downloads would hand over the decompressed text under the ``.gz`` name, while Athena, Spark
        and pandas choose gzip by the suffix and would fail on it."""
        return "application/gzip" if is_gzip(self.key) else "application/x-ndjson"

    def sink(self, cfg, client, work, workload) -> JsonLinesSink:
        return JsonLinesSink(self.writer(client), gzip=is_gzip(self.key))


class JsonLinesSink:
    """The output as JSON Lines: each row's line (:meth:`mxjob.tasks.Task.json_lines`).

    With ``gzip`` (an output key ending in ``.gz``), the lines are one gzip
    member, compressed as they are written: the object is what ``gzip`` makes
    of the text a plain ``.jsonl`` output holds.
    """

    def __init__(self, writer: writes.MultipartWriter, gzip: bool = False):
        self.writer = writer
        # wbits 16 + 15: a gzip header and trailer around the deflate stream (zlib's default window).
        self._deflate = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if gzip else None

    def write(self, batches: list[pa.RecordBatch]) -> None:
        """Rows of the result model, as their lines (the task's, :meth:`mxjob.tasks.Task.json_lines`)."""
        self.write_lines([line for batch in batches for line in tasks.of_schema(batch.schema).json_lines(batch)])

    def write_lines(self, lines: list[str]) -> None:
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        self.writer.write(self._deflate.compress(data) if self._deflate is not None else data)

    def close(self) -> None:
        if self._deflate is not None:
            self.writer.write(self._deflate.flush())  # the member's last block and its CRC-32 and length
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()
