"""Durable progress: the work prefix beside the output, its runs and parts, and what a resume still has to score.

A run never holds its results in the driver. Each executor writes its batch's
results to S3 as soon as it has scored them (``mxjob.executor.partition.score_partition``), under
a *work prefix* that belongs to the output object::

    OUTPUT.parts/job.json                        what every row depends on (the fingerprint)
    OUTPUT.parts/run-0001-RUNID/run.json         one run's record: batch size, batch count, keys, app id
    OUTPUT.parts/run-0001-RUNID/batches.arrows      that run's keys in batch order, a record batch per batch
    OUTPUT.parts/run-0001-RUNID/part-00000012.arrows.zst  batch 12's results: one record batch sorted by key
                                                    (mxjob.results.results: an Arrow IPC stream in a zstd frame)
    OUTPUT.parts/run-0002-RUNID/...              a resume's (RUNID: the driver's run id in the lease)

:mod:`mxjob.outputs.merge` merges the runs' parts into the output (:meth:`mxjob.outputs.Output.sink`)
while Spark scores the batches or after; once every listed key has its row,
the work prefix is removed. A driver that dies before then leaves the parts;
``--resume`` plans only the keys that have no row yet (:func:`remaining_keys`)
as a new run, and the merge reads the old runs' parts with the new one's, so
the output is the one an uninterrupted run would have written.

This module runs on the driver only. It lists and reads S3 through the
client it is given.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mxjob.inputs import batch_list, listing
from mxjob.outputs.base import side_key
from mxjob.s3 import parallel_list, reads, writes

#: A run's keys in batch order (:func:`batch_list.write_batches`), beside its ``run.json``.
BATCHES_NAME = "batches.arrows"
#: A run's folder: its number, then (since the lease) the run id of the driver that made it, so that the late
#: writes of a run whose lease was taken (an executor still finishing a batch) land in a folder of their own, which
#: the next run ignores once its run.json is gone, instead of in the next run's own folder of the same number.
_RUN = re.compile(r"(run-(\d{4,})(?:-[0-9a-z]+)?)/(.+)$")
PART_PATTERN = re.compile(r"part-(\d{8})\.arrows\.zst$")


class ResumeError(Exception):
    """The work prefix and this run do not fit together; the message says what to do."""


@dataclass(frozen=True)
class Run:
    """One run recorded under the work prefix: its record and which of its batches are durable."""

    number: int
    prefix: str
    batch_size: int
    batches: int
    keys: int
    application: str | None
    done: frozenset = field(default_factory=frozenset)
    #: ``(offset, length)`` of each batch in the run's batch list; known to the run that wrote it only.
    spans: tuple = ()


@dataclass
class Workload:
    """What this run does: the earlier runs it reuses and the keys it scores (a :class:`listing.Listing`)."""

    runs: list
    todo: listing.Listing
    number: int
    resumed: bool
    #: For a dataset or a table: its files (a :class:`mxjob.outputs.dataset.DatasetLayout`).
    layout: object = None


class WorkPrefix:
    """The work prefix of one output object: what earlier runs made durable, and the next run's workload."""

    def __init__(self, client, bucket: str, output_key: str):
        self.client, self.bucket, self.output_key = client, bucket, output_key
        self.prefix = side_key(output_key, "parts/")

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _objects(self, prefix: str) -> list[tuple[str, int]]:
        return list(parallel_list.list_objects(self.client, self.bucket, prefix))

    def exists(self) -> bool:
        """Whether anything is under the work prefix."""
        page = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix, MaxKeys=1)
        return bool(page.get("KeyCount"))

    def read_job(self) -> dict | None:
        """``job.json`` (the fingerprint the first run recorded), or ``None``."""
        try:
            return json.loads(reads.read_object(self.client, self.bucket, self.prefix + "job.json"))
        except self.client.exceptions.NoSuchKey:
            return None

    def write_job(self, fingerprint_: dict, output_uri: str, dataset: dict | None = None) -> None:
        """Record the fingerprint (and a dataset output's rows per file and key list digest) for resumes."""
        body = {"output": output_uri, "created": time.time(), "fingerprint": fingerprint_}
        if dataset is not None:
            body["dataset"] = dataset
        writes.put_text(self.client, self.bucket, self.prefix + "job.json", json.dumps(body, indent=2) + "\n")

    def runs(self) -> list[Run]:
        """Every recorded run, oldest first, with the batches each made durable."""
        files: dict[tuple[int, str], dict[str, str]] = {}
        for key, _ in self._objects(self.prefix + "run-"):
            match = _RUN.match(key[len(self.prefix):])
            if match:
                files.setdefault((int(match.group(2)), match.group(1)), {})[match.group(3)] = key
        runs = []
        for number, folder in sorted(files):
            names = files[number, folder]
            if "run.json" not in names:
                continue  # the driver died while starting this run, or it was removed under a late writer
            meta = json.loads(reads.read_object(self.client, self.bucket, names["run.json"]))
            done = frozenset(int(m.group(1)) for m in map(PART_PATTERN.match, names) if m)
            runs.append(Run(number=number, prefix=f"{self.prefix}{folder}/", batch_size=meta["batch_size"], done=done,
                            batches=meta["batches"], keys=meta["keys"], application=meta.get("application")))
        return runs

    def batches_key(self, run: Run) -> str:
        """The key of ``run``'s batch list (its keys in batch order) in the output bucket."""
        return run.prefix + BATCHES_NAME

    def run_batches(self, run: Run) -> Iterator[pa.RecordBatch]:
        """The keys (and sizes) of ``run``, one record batch per batch of the run, streamed from its batch list."""
        body = self.client.get_object(Bucket=self.bucket, Key=self.batches_key(run))["Body"]
        try:
            yield from pa.ipc.open_stream(body)
        finally:
            body.close()

    def start_run(self, number: int, keys, batch_size: int, application: str | None, run_id: str | None = None) -> Run:
        """Record run ``number`` and its batch list before any of its batches is scored, in ``run-NNNN-RUN_ID/``.

        ``keys`` (a :class:`listing.Listing`, or key strings) in batch order
        stream into ``batches.arrows`` (:func:`batch_list.write_batches`); the returned
        run's ``spans`` say where each batch is in it, for the tasks.
        ``batch_size``: keys per batch.
        """
        if not isinstance(keys, listing.Listing):
            keys = list(keys)
            keys = listing.Listing(self.bucket, pa.table({"key": pa.array(keys, listing.KEY_TYPE),
                                                          "size": pa.array([listing.UNKNOWN_SIZE] * len(keys),
                                                                           pa.int64())}))
        prefix = f"{self.prefix}run-{number:04d}{'-' + run_id if run_id else ''}/"
        with writes.MultipartWriter(self.client, self.bucket, prefix + BATCHES_NAME,
                                   content_type="application/vnd.apache.arrow.stream", lazy=True) as writer:
            spans = batch_list.write_batches(keys, batch_size, writer.write)
        meta = {"batch_size": batch_size, "batches": len(spans), "keys": len(keys), "application": application,
                "started": time.time()}
        # run.json last: a run without it never started, and resume ignores it.
        writes.put_text(self.client, self.bucket, prefix + "run.json", json.dumps(meta) + "\n")
        return Run(number=number, prefix=prefix, batch_size=batch_size, batches=len(spans), keys=len(keys),
                   application=application, spans=tuple(spans))

    def abort_uploads(self, also: Callable[[str], bool] | None = None) -> int:
        """Abort the uploads an earlier driver left open (the output's, a batch list's, and those ``also`` accepts under
        the output's key: a dataset's files); return how many."""
        return writes.abort_uploads(self.client, self.bucket, self.output_key, lambda key: (
            key == self.output_key or key.startswith(self.prefix) or (also is not None and also(key))))

    def remove(self) -> int:
        """Delete everything under the work prefix; return how many objects were deleted."""
        return writes.delete_objects(self.client, self.bucket, [key for key, _ in self._objects(self.prefix)])


def remaining_keys(work: WorkPrefix, runs: Sequence[Run], keys) -> pa.Array:
    """For each of ``keys`` (a :class:`listing.Listing`, or key strings), whether it still needs scoring.

    A boolean Arrow array: true where no earlier run made the key's line
    durable. Only the durable batches' keys are read, one run's batch list at a time.
    """
    column = keys.keys if isinstance(keys, listing.Listing) else pa.array(list(keys), listing.KEY_TYPE)
    done = [chunk for run in runs if run.done for chunk in _done_keys(work, run)]
    if not done:
        return pa.array(np.ones(len(column), dtype=bool))
    scored = pc.is_in(column, value_set=pa.concat_arrays(done))
    return pc.invert(scored.combine_chunks() if isinstance(scored, pa.ChunkedArray) else scored)


def _done_keys(work: WorkPrefix, run: Run) -> list[pa.Array]:
    return [batch.column(0) for index, batch in enumerate(work.run_batches(run)) if index in run.done]


# ----------------------------------------------------------------------------
# Assembly


# ----------------------------------------------------------------------------
# Output formats


