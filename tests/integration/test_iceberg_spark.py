"""A second reader of the job's Iceberg tables: Spark with Iceberg's Java library (demo/iceberg_spark.py).

pyiceberg writes a table as the job does (its Parquet sink's files, two
commits with ``commit_files``) into a SQL catalog on SQLite with its data on
the session's moto S3; the stack's Spark (3.5 or 4.0) with its ``iceberg-spark-runtime``, Iceberg's
JDBC catalog on the same SQLite file and ``S3FileIO`` reads it back. The two
agree on the rows, the keys, the error rows and the history, and Spark reads
an error row's ``predictions`` as the null the file holds. The jars come
from Maven Central at first use (``.iceberg-jars/3.5/`` or ``4.0/``).
"""

from __future__ import annotations

import shutil
import sqlite3
import time

import pytest

from demo import iceberg_spark
from mxjob.outputs import iceberg_catalog

BUCKET = "iceberg-spark-bucket"
IDENT = "preds.digits"
CATALOG = "sparkcheck"

pytestmark = [pytest.mark.spark, pytest.mark.stacks]


@pytest.fixture
def written(monkeypatch, tmp_path, moto_buckets, moto_endpoint):
    """The sample table written by pyiceberg: (its table, the catalog's SQLite file, the warehouse)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYICEBERG_HOME", raising=False)
    catalog_db = tmp_path / "catalog.db"
    warehouse = f"s3://{BUCKET}/warehouse/{tmp_path.name}"
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{CATALOG.upper()}__URI", f"sqlite:///{catalog_db}")
    monkeypatch.setenv(f"PYICEBERG_CATALOG__{CATALOG.upper()}__WAREHOUSE", warehouse)
    catalog = iceberg_catalog.load_catalog(CATALOG, endpoint_url=moto_endpoint)
    table = iceberg_spark.write_sample_table(catalog, moto_buckets, IDENT)
    return table, catalog_db, warehouse


def test_spark_reads_the_same_keys_errors_and_snapshots_as_pyiceberg(written, moto_endpoint):
    if not iceberg_spark.jars_present() and shutil.which("mvn") is None:
        pytest.skip("Maven (mvn) is not on PATH: it fetches Iceberg's jars into .iceberg-jars/ (apt-get install maven)")
    table, catalog_db, warehouse = written
    with sqlite3.connect(catalog_db) as db:
        catalog_before = list(db.iterdump())

    started = time.monotonic()
    # No catalog name given: the reader takes pyiceberg's from the SQLite file, as the Java catalog must match it.
    spark = iceberg_spark.spark_read(str(catalog_db), warehouse, moto_endpoint, IDENT, keys=True)
    print(f"Spark's read took {time.monotonic() - started:.1f} s")

    every = iceberg_catalog.existing_keys(table.refresh()).to_pylist()
    scored = iceberg_catalog.existing_keys(table, with_errors=False).to_pylist()
    written_keys = sorted(k for files in iceberg_spark.SAMPLE_COMMITS for keys, _ in files for k in keys)
    failed_keys = sorted(k for files in iceberg_spark.SAMPLE_COMMITS for _, fail in files for k in fail)
    assert sorted(every) == written_keys and sorted(set(every) - set(scored)) == failed_keys
    assert spark["catalog"] == CATALOG
    assert (spark["rows"], spark["distinct_keys"], spark["error_rows"]) == (len(every), len(set(every)),
                                                                           len(every) - len(scored))
    assert spark["keys"] == sorted(set(every))
    assert spark["error_keys"] == failed_keys
    assert spark["keys_sha256"] == iceberg_spark.keys_digest(written_keys)

    commits = iceberg_catalog.snapshot_summaries(table)
    assert [(s["snapshot_id"], s["operation"], s["run_id"], s["commit_id"], s["added_files"], s["added_records"])
            for s in spark["snapshots"]] == [
        (c.snapshot_id, c.operation, c.run_id, c.commit_id, c.added_files, c.added_records) for c in commits]
    assert [s["commit_id"] for s in spark["snapshots"]] == ["r1:0-1", "r1:2"]

    # The files hold null predictions on the error rows: Spark reads the null, pyiceberg 0.10 an empty list.
    assert spark["null_keys"] == {"predictions": failed_keys, "error": sorted(set(written_keys) - set(failed_keys)),
                                  "product_id": []}
    error_row = table.scan(row_filter=f"key == '{failed_keys[0]}'").to_arrow().to_pylist()[0]
    assert error_row["predictions"] == []

    # The Java JDBC catalog read pyiceberg's SQLite catalog as it was: no table, column or row added or changed.
    with sqlite3.connect(catalog_db) as db:
        assert list(db.iterdump()) == catalog_before
