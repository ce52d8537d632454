"""Where the results go: one :class:`Output` per kind of destination, resolved once from ``--output``
(:mod:`mxjob.outputs.base` says what an output is), and what every kind shares: the work prefix, the merge, the
fingerprint, and a run's claim on the output.

Importing this package registers the built-in kinds: JSON Lines, Parquet, a
Parquet dataset and an Iceberg table; :func:`register` adds another (a
``--plugin`` file's), which :func:`resolve` asks first.
"""

from mxjob.outputs.base import (
    ObjectOutput,
    Output,
    OutputError,
    kind_of,
    kinds,
    register,
    resolve,
    side_key,
    unregister,
)
from mxjob.outputs.dataset import DatasetOutput
from mxjob.outputs.iceberg import IcebergOutput
from mxjob.outputs.jsonl import JsonLinesOutput
from mxjob.outputs.parquet import ParquetOutput

for _kind in (JsonLinesOutput, ParquetOutput, DatasetOutput, IcebergOutput):  # the last registered is asked first
    register(_kind)

__all__ = ["DatasetOutput", "IcebergOutput", "JsonLinesOutput", "ObjectOutput", "Output", "OutputError",
           "ParquetOutput", "kind_of", "kinds", "register", "resolve", "side_key", "unregister"]
