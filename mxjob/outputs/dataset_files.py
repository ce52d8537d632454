"""A Parquet dataset's files: their names, the sink that writes them (:class:`DatasetSink`), and ``_SUCCESS``.

File ``i`` of a run holds rows ``i * R`` to ``(i + 1) * R - 1`` of the run's
sorted key list (``R``: ``--rows-per-file``), as ``part-NNNNN.parquet``, or
``part-<run>-NNNNN.parquet`` for a ``--skip-existing`` run
(:mod:`mxjob.outputs.dataset` says what a dataset is). Each is one multipart
upload, completed when the file has its rows, so it appears whole.
"""

from __future__ import annotations

import io
import json
import os
import re
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mxjob.outputs.base import side_key
from mxjob.outputs.parquet import PARQUET_ROW_GROUP, PARQUET_TYPE, ParquetSink, _WriterFile
from mxjob.results import parquet_view
from mxjob.s3 import reads, writes

#: A dataset file's name under the prefix: the file's index, at least 5 digits.
FILE_NAME = "part-{index:05d}.parquet"
#: ... and a ``--skip-existing`` run's: its run (:func:`new_run`), then the index.
RUN_FILE_NAME = "part-{run}-{index:05d}.parquet"
#: Either name: group 1 the run (absent in a first run's name), group 2 the index.
_FILE = re.compile(r"part-(?:(\d{8}T\d{6}Z)-)?(\d{5,})\.parquet$")

def file_key(prefix: str, index: int, run: str | None = None) -> str:
    """The key of the dataset's file ``index`` under ``prefix`` (which ends with ``/``), of ``run`` if given."""
    return prefix + (RUN_FILE_NAME.format(run=run, index=index) if run else FILE_NAME.format(index=index))


def file_id(key: str, prefix: str) -> tuple[str | None, int] | None:
    """``(run, index)`` of a dataset file's key under ``prefix`` (``run`` ``None`` for ``part-NNNNN.parquet``),
    else ``None``."""
    match = _FILE.fullmatch(key[len(prefix):]) if key.startswith(prefix) else None
    return (match.group(1), int(match.group(2))) if match else None


class DatasetSink:
    """The assembly's rows, in key order, cut into files of ``rows_per_file`` rows under ``prefix``.

    Same interface as :class:`ParquetSink` (``write``, ``close``,
    ``abort``); each file is a :class:`ParquetSink` of its own over a
    multipart upload, completed when the file has its rows, so it appears
    whole. Files in ``keep`` (index to ``(key, bytes)``: an interrupted run's,
    over the same key list) are not written again; their rows are only
    counted. :meth:`close` writes the last file and ``_SUCCESS``.

    A ``--skip-existing`` run (``appending``: its :class:`mxjob.outputs.dataset.DatasetLayout`)
    names its files after the layout's ``run`` (``part-<run>-NNNNN.parquet``)
    and writes no empty file; the layout's ``existing``
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
                 keep: dict | None = None, appending=None):
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
        body = success_body(earlier + [{k: f[k] for k in ("key", "rows", "bytes")} for f in self.files],
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


def success_body(files: list[dict], rows_per_file: int, run: str | None, prefix: str,
                 rewritten: list[dict] = ()) -> dict:
    """``_SUCCESS``: every file of the dataset (``{"key", "rows", "bytes"}``, every run's, in key order), the rows,
    and a section per run with the files it added; this ``run``'s also names the earlier files it rewrote."""
    runs: dict = {}
    for f in files:
        name = file_id(f["key"], prefix)[0]
        section = runs.setdefault(name, {"run": name, "files": [], "rows": 0})
        section["files"].append(f["key"])
        section["rows"] += f["rows"]
    runs.setdefault(run, {"run": run, "files": [], "rows": 0})
    if rewritten:
        runs[run]["rewrote"] = [{k: f[k] for k in ("key", "rows", "bytes", "replaced")} for f in rewritten]
    return {"files": files, "rows": sum(f["rows"] for f in files), "rows_per_file": rows_per_file,
            "runs": list(runs.values())}
