"""The ``--existing-keys N`` row of ``make bench-scale``: a dataset that already holds N keys, then new ones.

``--skip-existing`` (:mod:`mxjob.outputs.existing`) reads the key column of every
file under the output's prefix and leaves those keys out of the run. To
measure that at ten million keys without scoring them first, the bench writes
the earlier run's dataset itself, in the job's own layout: the rows the fake
scorer would have made (:data:`bench.fake_daemon.FAKE_PREDICTIONS`), in key
order, through the job's own sink (:class:`mxjob.outputs.dataset_files.DatasetSink`:
``part-NNNNN.parquet`` of ``rows_per_file`` rows, zstd, its row groups, one
multipart upload a file, ``_SUCCESS``), with the ``mxinfer.fingerprint`` of a
real run of the job (:func:`provenance`), so that the run's fingerprint check
(:func:`mxjob.outputs.dataset.check_fingerprints`) passes as it would after a real
first run. The manifest then lists those keys and 1% more
(:func:`layout`), spread evenly through it, as new images in many folders.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.fake_daemon import FAKE_PREDICTIONS
from mxjob.outputs import dataset_files
from mxjob.tasks import classify

#: One new key for this many existing ones: the manifest lists 1% more keys than the dataset holds.
EXISTING_PER_NEW = 100
#: Rows handed to the sink at a time (the job's assembly hands it a part's rows at a time).
BATCH_ROWS = 65_536


def layout(existing: int) -> tuple[int, np.ndarray]:
    """``(keys in the manifest, positions of the new ones)`` for a dataset of ``existing`` keys.

    One new key per :data:`EXISTING_PER_NEW` existing (at least one), evenly
    spread: the ``j``-th new key (from 1) is at ``ceil(j * total / new) - 1``,
    so the last key listed is new.
    """
    if existing < 1:
        raise ValueError(f"existing keys: {existing}; give at least 1")
    new = -(-existing // EXISTING_PER_NEW)
    total = existing + new
    j = np.arange(1, new + 1, dtype=np.int64)
    return total, (j * total + new - 1) // new - 1


def provenance(body: bytes) -> dict[str, str]:
    """The ``mxinfer.*`` key-value metadata of a dataset file the job wrote (its fingerprint and task)."""
    metadata = pq.ParquetFile(io.BytesIO(body)).schema_arrow.metadata or {}
    return {k.decode(): v.decode() for k, v in metadata.items() if k.startswith(b"mxinfer.")}


def fake_rows() -> pa.RecordBatch:
    """One classify row of the result model with the fake scorer's predictions (its key empty)."""
    made = classify.TASK.results()
    made.add("", [{"label": None, **p} for p in FAKE_PREDICTIONS])
    return made.record_batch()


def write_dataset(client, bucket: str, prefix: str, keys: Iterable[str], rows_per_file: int,
                  metadata: dict[str, str]) -> list[dict]:
    """A first run's dataset under ``prefix`` holding ``keys`` (in the job's order), as the job writes it.

    Every row is the fake scorer's; ``metadata`` goes into each file (:func:`provenance`).
    Returns the files (``{"key", "rows", "bytes", "kept"}``), as ``_SUCCESS`` lists them.
    """
    template = fake_rows()
    sink = dataset_files.DatasetSink(client, bucket, prefix, rows_per_file, metadata)
    pending: list[str] = []

    def flush() -> None:
        batch = template.take(pa.array(np.zeros(len(pending), dtype=np.int64)))
        columns = [pa.array(pending, pa.string()) if f.name == "key" else batch.column(i)
                   for i, f in enumerate(batch.schema)]
        sink.write([pa.RecordBatch.from_arrays(columns, schema=batch.schema)])
        pending.clear()

    try:
        for key in keys:
            pending.append(key)
            if len(pending) == BATCH_ROWS:
                flush()
        if pending:
            flush()
        sink.close()
    except BaseException:
        sink.abort()
        raise
    return sink.files
