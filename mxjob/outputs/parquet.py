"""One Parquet object: ``--output s3://BUCKET/KEY.parquet`` (or any key with ``--output-format parquet``).

The rows in key order, a row group at a time (:class:`ParquetSink`, which a
dataset's and a table's files are written with too), through one multipart
upload completed only when whole. The file's key-value metadata holds the
run's fingerprint and task (:func:`provenance`).
"""

from __future__ import annotations

import io
import json
from typing import ClassVar

import pyarrow as pa
import pyarrow.parquet as pq

from mxjob import tasks
from mxjob.outputs.base import ObjectOutput
from mxjob.results import parquet_view
from mxjob.s3 import writes

#: Rows per Parquet row group: about 5-10 MiB of top-5 predictions, small enough
#: for the driver to hold one while it writes it, large enough for Athena scans.
PARQUET_ROW_GROUP = 100_000
#: ... and at most this many bytes of Arrow data held for one: 100,000 rows of 1,280-value float32
#: embeddings would be 500 MiB of the driver's memory.
PARQUET_ROW_GROUP_BYTES = 64 * 2**20
#: The Content-Type of a Parquet file.
PARQUET_TYPE = "application/vnd.apache.parquet"


class ParquetOutput(ObjectOutput):
    """One Parquet object, a row per image."""

    kind = "parquet"
    format = "parquet"
    form = "s3://BUCKET/KEY.parquet"
    suffixes: ClassVar[tuple] = (".parquet",)

    @property
    def content_type(self) -> str:
        return PARQUET_TYPE

    def sink(self, cfg, client, work, workload) -> ParquetSink:
        return ParquetSink(self.writer(client), metadata=provenance(work.read_job()))


def provenance(job: dict | None) -> dict[str, str]:
    """A Parquet file's key-value metadata from ``job.json``: the run's fingerprint, and its task.

    The fingerprint holds the model files' SHA-256, the task and its settings
    (output layer, ...), the preprocessing recipe and the precision.
    """
    if not job:
        return {}
    fingerprint_ = job.get("fingerprint") or {}
    return {"mxinfer.fingerprint": json.dumps(fingerprint_, sort_keys=True),
            "mxinfer.task": str(fingerprint_.get("task", "classify"))}


class ParquetSink:
    """The output as Parquet, one row per key, written row group by row group.

    The schema is the Parquet view of the parts' (their task's,
    :meth:`mxjob.tasks.Task.parquet_schema`), known from the first rows
    written; ``metadata`` (:func:`provenance`) goes to the file's key-value
    metadata. A run always has rows (the listing refuses an input without
    keys): a sink closed without any raises ``ValueError``.
    """

    def __init__(self, writer: writes.MultipartWriter, metadata: dict[str, str] | None = None):
        self.writer, self.metadata = writer, metadata
        self.schema: pa.Schema | None = None
        self._file = _WriterFile(writer)
        self._parquet: pq.ParquetWriter | None = None
        self._pending: list[pa.RecordBatch] = []
        self._rows = self._bytes = 0

    def write(self, batches: list[pa.RecordBatch]) -> None:
        for batch in batches:
            if self.schema is None:
                self.schema = tasks.of_schema(batch.schema).parquet_schema(batch.schema, self.metadata)
                self._parquet = pq.ParquetWriter(self._file, self.schema, compression="zstd")
            converted = parquet_view.parquet_batch(batch, self.schema)
            self._pending.append(converted)
            self._rows += converted.num_rows
            self._bytes += converted.nbytes
        if self._rows >= PARQUET_ROW_GROUP or self._bytes >= PARQUET_ROW_GROUP_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending, self.schema).combine_chunks()
        self._parquet.write_table(table, row_group_size=PARQUET_ROW_GROUP)
        self._pending, self._rows, self._bytes = [], 0, 0

    def close(self) -> None:
        self._flush()
        if self._parquet is None:
            raise ValueError("no row was written: a Parquet file holds at least one")
        self._parquet.close()
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


class _WriterFile(io.RawIOBase):
    """A write-only file over a :class:`writes.MultipartWriter`, for ``pq.ParquetWriter``."""

    def __init__(self, writer: writes.MultipartWriter):
        super().__init__()
        self.writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.writer.write(bytes(data))
        return len(data)

    def tell(self) -> int:
        return self.writer.bytes_written

    def close(self) -> None:  # the sink completes the upload; pyarrow only closes its side
        super().close()
