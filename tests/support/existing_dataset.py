"""The ``--skip-existing`` tests' bucket, and a dataset in it read as a reader sees it (pyarrow.dataset).

Used by ``tests/unit/outputs/test_existing.py`` (two runs' files written
without Spark) and ``tests/integration/test_existing.py`` (the runs through
spark-submit).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

BUCKET = "existing-bucket"


def read_dataset(endpoint: str, prefix: str) -> pa.Table:
    fs = pafs.S3FileSystem(endpoint_override=endpoint, access_key="testing", secret_key="testing",
                           region="us-east-1", scheme="http")
    return ds.dataset(f"{BUCKET}/{prefix}", format="parquet", filesystem=fs).to_table()
