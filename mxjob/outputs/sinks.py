"""The output sinks: where the merged rows are written, all three here.

:class:`JsonLinesSink` (``.jsonl``, ``.jsonl.gz``) and :class:`ParquetSink`
write one object through one multipart upload, completed only when whole;
:class:`DatasetSink` cuts the rows into Parquet files under a prefix, each
completed when it has its rows. Each has ``write``, ``close`` and
``abort``: a failed run leaves nothing partial. Runs on the driver only.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import zlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mxjob import tasks
from mxjob.outputs import dataset
from mxjob.outputs.dataset import file_key
from mxjob.outputs.sidecar import side_key
from mxjob.results import parquet_view, results
from mxjob.s3 import reads, writes

#: Rows per Parquet row group: about 5-10 MiB of top-5 predictions, small enough
#: for the driver to hold one while it writes it, large enough for Athena scans.
PARQUET_ROW_GROUP = 100_000


#: ... and at most this many bytes of Arrow data held for one: 100,000 rows of 1,280-value float32
#: embeddings would be 500 MiB of the driver's memory.
PARQUET_ROW_GROUP_BYTES = 64 * 2**20


def output_format(requested: str | None, key: str) -> str:
    """``requested``, else ``parquet`` for a key ending in ``.parquet``, else ``jsonl``."""
    if requested:
        return requested
    return "parquet" if key.lower().endswith(".parquet") else "jsonl"


def is_gzip(key: str) -> bool:
    """Whether an output key names a gzip file (it ends in ``.gz``): JSON Lines are then written gzipped."""
    return key.lower().endswith(".gz")


def content_type(fmt: str, key: str) -> str:
    """The output object's Content-Type: Parquet, gzip (a ``.gz`` key) or JSON Lines.

    A ``.gz`` object is ``application/gzip`` with no Content-Encoding: with
    ``Content-Encoding: gzip``, S3's and browsers' downloads would hand over
    the decompressed text under the ``.gz`` name, while Athena, Spark and
    pandas choose gzip by the suffix and would fail on it.
    """
    if fmt == "parquet":
        return "application/vnd.apache.parquet"
    return "application/gzip" if is_gzip(key) else "application/x-ndjson"


#: zlib's level for a ``.gz`` JSON Lines output: gzip's own. Measured on one core here: top-5 classify lines
#: shrink to 13% at about 120 MB/s (level 9: 28 MB/s for 1% less), 1,280-value embeddings to 40% at about
#: 16 MB/s, which is why Parquet is the output for vectors. zlib lets go of the GIL while it compresses.
GZIP_LEVEL = 6


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
        self._write("".join(line + "\n" for line in lines).encode("utf-8"))

    def _write(self, data: bytes) -> None:
        self.writer.write(self._deflate.compress(data) if self._deflate is not None else data)

    def close(self) -> None:
        if self._deflate is not None:
            self.writer.write(self._deflate.flush())  # the member's last block and its CRC-32 and length
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


#: The Parquet output's error column (the result model's, :data:`results.ERROR`).
ERROR = results.ERROR


def provenance(job: dict | None) -> dict[str, str]:
    """The Parquet file's key-value metadata from ``job.json``: the run's fingerprint, and its task.

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


class DatasetSink:
    """The assembly's rows, in key order, cut into files of ``rows_per_file`` rows under ``prefix``.

    Same interface as :class:`ParquetSink` (``write``, ``close``,
    ``abort``); each file is a :class:`ParquetSink` of its own over a
    multipart upload, completed when the file has its rows, so it appears
    whole. Files in ``keep`` (index to ``(key, bytes)``: an interrupted run's,
    over the same key list) are not written again; their rows are only
    counted. :meth:`close` writes the last file and ``_SUCCESS``.

    A ``--skip-existing`` run (``appending``: its :class:`dataset.DatasetPlan`)
    names its files after the plan's ``run`` (``part-<run>-NNNNN.parquet``)
    and writes no empty file; the plan's ``existing``
    (:class:`mxjob.outputs.existing.Existing`) lists the earlier runs' files for
    ``_SUCCESS``. With ``--rescore-errors``, the rows of the keys whose earlier
    row was an error (``existing.rescore``, one flag per row written, in
    order) go not into this run's files but into the earlier files that hold
    those error rows: :meth:`close` replaces each such file, under its own
    key, with its rows and the new ones (:func:`rewrite_file`), once this
    run's files are complete. An S3 object is replaced at once, so a reader
    sees a rescored key's error row or its new row, never both and never
    neither.
    """

    def __init__(self, client, bucket: str, prefix: str, rows_per_file: int, metadata: dict | None = None,
                 keep: dict | None = None, appending: dataset.DatasetPlan | None = None):
        self.client, self.bucket, self.prefix, self.rows_per_file = client, bucket, prefix, rows_per_file
        self.metadata, self.keep = metadata, dict(keep or {})
        self.run = appending.run if appending is not None else None
        self.existing = existing = appending.existing if appending is not None else None
        #: Each file of the dataset, in order: ``{"key", "rows", "bytes", "kept"}``.
        self.files: list[dict] = []
        #: The earlier files :meth:`close` rewrote: ``{"key", "rows", "bytes", "replaced"}``.
        self.rewritten: list[dict] = []
        self._index, self._rows = 0, 0
        self._file: ParquetSink | None = None
        rescore = getattr(existing, "rescore", None)
        self._rescore = rescore if rescore is not None and rescore.any() else None
        self._position = 0  # rows received: the next row's flag in _rescore
        self._rescored: _Spill | None = None

    def write(self, batches: list[pa.RecordBatch]) -> None:
        """Rows of the result model, in key order, continuing the previous call's."""
        for batch in batches:
            if self._rescore is not None:
                batch = self._set_aside_rescored(batch)
            while batch.num_rows:
                room = self.rows_per_file - self._rows
                piece, batch = batch.slice(0, room), batch.slice(room)
                self._add(piece)

    def _set_aside_rescored(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` for this run's files; the rescored ones go to a local file until :meth:`close`."""
        flags = self._rescore[self._position:self._position + batch.num_rows]
        self._position += batch.num_rows
        if not flags.any():
            return batch
        if self._rescored is None:
            self._rescored = _Spill()
        self._rescored.add(batch.filter(pa.array(flags)))
        return batch.filter(pa.array(~flags))

    def _add(self, piece: pa.RecordBatch) -> None:
        if self._index not in self.keep:
            self._open_file().write([piece])
        self._rows += piece.num_rows
        if self._rows == self.rows_per_file:
            self._end_file()

    def _open_file(self) -> ParquetSink:
        """The file being written: a Parquet sink over a multipart upload, opened at its first row."""
        if self._file is None:
            writer = writes.MultipartWriter(self.client, self.bucket, file_key(self.prefix, self._index, self.run),
                                           content_type=PARQUET_TYPE)
            self._file = ParquetSink(writer, self.metadata)
        return self._file

    def _end_file(self) -> None:
        if self._index in self.keep:
            key, size = self.keep[self._index]
            self.files.append({"key": key, "rows": self._rows, "bytes": size, "kept": True})
        else:
            self._file.close()  # the file appears now, whole
            self.files.append({"key": self._file.writer.key, "rows": self._rows,
                               "bytes": self._file.writer.bytes_written, "kept": False})
            self._file = None
        self._index, self._rows = self._index + 1, 0

    def close(self) -> None:
        """End the last file, rewrite the earlier files that held rescored keys' error rows, then write
        ``_SUCCESS``: every run's files, with their keys, rows and bytes."""
        if self._rows:  # (a run has rows: the listing refuses an input without keys, and a run that adds to a
            self._end_file()  # dataset scores at least one new key)
        stale = [key for index, (key, _) in self.keep.items() if index >= self._index]
        if stale:  # cannot happen over the same key list; kept out of the dataset if it does
            writes.delete_objects(self.client, self.bucket, stale)
        if self._rescored is not None:
            self._rewrite(self._rescored.table())
        rewritten = {f["key"]: f for f in self.rewritten}
        earlier = [{"key": f.key, "rows": f.rows, "bytes": rewritten[f.key]["bytes"] if f.key in rewritten else f.bytes}
                   for f in getattr(self.existing, "files", ())]
        body = dataset.success_body(earlier + [{k: f[k] for k in ("key", "rows", "bytes")} for f in self.files],
                                    self.rows_per_file, self.run, self.prefix, self.rewritten)
        writes.put_text(self.client, self.bucket, side_key(self.prefix, "SUCCESS"), json.dumps(body, indent=1) + "\n")

    def _rewrite(self, rows: pa.Table) -> None:
        """Put each rescored row into the earlier file that holds its key's error row, one file at a time."""
        owner = self.existing.owner
        if len(owner) != rows.num_rows:
            raise ValueError(f"{rows.num_rows} rescored rows for {len(owner)} keys to rescore")
        order = np.argsort(owner, kind="stable")  # by file, each file's rows in key order
        starts = np.flatnonzero(np.diff(owner[order], prepend=-1))
        for start, stop in zip(starts, [*starts[1:], len(order)]):
            target = self.existing.files[owner[order[start]]]
            size = rewrite_file(self.client, self.bucket, target.key, rows.take(pa.array(order[start:stop])))
            self.rewritten.append({"key": target.key, "rows": target.rows, "bytes": size,
                                   "replaced": int(stop - start)})

    def abort(self) -> None:
        """Abort the file being written; the files already complete stay (each is whole)."""
        if self._file is not None:
            self._file.abort()
            self._file = None
        if self._rescored is not None:
            self._rescored.close()


#: The Content-Type of a dataset's files.
PARQUET_TYPE = "application/vnd.apache.parquet"


def rewrite_file(client, bucket: str, key: str, rows: pa.Table) -> int:
    """Replace the Parquet file ``key`` by itself with ``rows`` (the result model's) in place of its rows of the
    same keys; return its new size in bytes.

    The file keeps its schema and key-value metadata, its rows stay in key
    order, and every key it held stays in it once. It is read whole (a
    dataset's file is about 128 MiB) and written back under the same key
    through one multipart upload: S3 replaces the object when the upload
    completes, so a reader opening it gets the old file or the new one.
    """
    old = pq.read_table(io.BytesIO(reads.read_object(client, bucket, key)))
    new = pa.Table.from_batches([parquet_view.parquet_batch(batch, old.schema) for batch in rows.to_batches()],
                                old.schema)
    kept = old.filter(pc.invert(pc.is_in(old["key"], value_set=new["key"].combine_chunks())))
    merged = pa.concat_tables([kept, new])
    merged = merged.take(pc.sort_indices(merged["key"]))
    writer = writes.MultipartWriter(client, bucket, key, content_type=PARQUET_TYPE)
    try:
        with pq.ParquetWriter(_WriterFile(writer), old.schema, compression="zstd") as parquet:
            parquet.write_table(merged, row_group_size=PARQUET_ROW_GROUP)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    return writer.bytes_written


class _Spill:
    """Record batches set aside on local disk (an Arrow IPC file), read back at once, memory-mapped."""

    def __init__(self):
        handle, self.path = tempfile.mkstemp(prefix="mxinfer-rescored-", suffix=".arrow")
        os.close(handle)
        self._writer: pa.ipc.RecordBatchFileWriter | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        if self._writer is None:
            self._writer = pa.ipc.new_file(self.path, batch.schema)
        self._writer.write_batch(batch)

    def table(self) -> pa.Table:
        """Every batch added, as one table over the mapped file (deleted: the mapping keeps its pages)."""
        self._writer.close()
        try:
            return pa.ipc.open_file(pa.memory_map(self.path)).read_all()
        finally:
            os.unlink(self.path)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if os.path.exists(self.path):
            os.unlink(self.path)


def summary_of(sink: DatasetSink) -> dict:
    """The summary's ``dataset`` entry: this run's files (written, and kept from its interrupted attempt), rows
    per file; for a ``--skip-existing`` run, its name and the earlier files it rewrote."""
    out = {"files": len(sink.files), "rows_per_file": sink.rows_per_file,
           "kept_from_an_earlier_run": sum(1 for f in sink.files if f["kept"]),
           "bytes": sum(f["bytes"] for f in sink.files),
           "first": sink.files[0]["key"] if sink.files else None,
           "last": sink.files[-1]["key"] if sink.files else None}
    if sink.run is not None:
        out.update(run=sink.run, files_rewritten=len(sink.rewritten))
    return out
