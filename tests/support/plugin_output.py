"""An output of this file's own, registered as the built-in outputs are: the plug-in output tests' ``--plugin`` file.

The seam a new kind of output goes through: :class:`CsvOutput` below is the
whole output (what ``--output`` it claims, its sink), registered with
``mxjob.outputs.register``, as a plug-in registers it: at import, when the
job loads this file on the driver (``--plugin``) before it resolves
``--output``, so ``--output s3://BUCKET/KEY.csv`` writes it end to end
(``tests/integration/test_plugin_output.py``). Imported by pytest, it is
registered only for the tests that ask for it (``tests/unit/outputs/test_plugin_output.py``).
The module imports only what an executor has (no ``tests`` package): the job
ships a plug-in to the executors too.
"""

from __future__ import annotations

import csv
import io
from typing import ClassVar

import pyarrow as pa

from mxjob import outputs


class CsvSink:
    """``key,class_id,label``: each row's top class, empty for an error row."""

    def __init__(self, writer):
        self.writer = writer
        self.writer.write(b"key,class_id,label\n")

    def write(self, batches: list[pa.RecordBatch]) -> None:
        text = io.StringIO()
        rows = csv.writer(text, lineterminator="\n")
        for batch in batches:
            for key, predictions in zip(batch.column("key").to_pylist(), batch.column("predictions").to_pylist()):
                top = predictions[0] if predictions else {"class_id": "", "label": ""}
                rows.writerow([key, top["class_id"], top["label"] or ""])
        self.writer.write(text.getvalue().encode("utf-8"))

    def close(self) -> None:
        self.writer.close()

    def abort(self) -> None:
        self.writer.abort()


class CsvOutput(outputs.ObjectOutput):
    """One CSV object of each image's top-1 class (classify's rows)."""

    kind = "csv_top1"
    format = "parquet"  # the tasks need not render JSON lines for it
    form = "s3://BUCKET/KEY.csv"
    suffixes: ClassVar[tuple] = (".csv",)

    @property
    def content_type(self) -> str:
        return "text/csv"

    def sink(self, cfg, client, work, plan) -> CsvSink:
        return CsvSink(self.writer(client))


if __name__ != "tests.support.plugin_output":  # loaded by the job (--plugin): registered, as any plug-in is
    outputs.register(CsvOutput)
