"""``make iceberg-spark``: Spark reads the job's Iceberg table through Iceberg's own Java library, a second reader.

The job writes its Iceberg tables with pyiceberg (``mxjob.outputs.iceberg_catalog``):
Parquet files of its own writer, committed with ``add_files`` into a SQL
catalog. This module reads such a table with another implementation of
every part of that: Spark 3.5 (the pyspark of ``.venv``) with Iceberg's
``iceberg-spark-runtime`` jar, Iceberg's Java JDBC catalog on the same
SQLite file (through ``sqlite-jdbc``) and Iceberg's ``S3FileIO`` (the
``iceberg-aws-bundle`` jar) on the same S3. It counts the rows, the
distinct keys and the error rows, hashes the sorted keys, and reads the
table's history with each snapshot's ``mxinfer.run-id`` and
``mxinfer.commit-id``.

The jars (``iceberg/pom.xml``) are fetched from Maven Central into the
ignored ``.iceberg-jars/SPARK_LINE/`` (3.5 or 4.0: the stack's) at first use,
with ``mvn``; Spark needs ``java`` (17). The Java catalog reads pyiceberg's SQLite file as it is: pyiceberg
writes the V0 layout of the JDBC catalog's tables (no ``iceberg_type``
column), which Iceberg's ``JdbcCatalog`` reads when ``jdbc.schema-version``
is V0, its default; V1 would add that column to the file. The reader also
sets ``jdbc.init-catalog-tables=false``, so it never creates anything in it.
The JDBC catalog's name must be the one pyiceberg wrote in the rows'
``catalog_name``: it is read from the file unless ``--catalog-name`` says.

    python -m demo.iceberg_spark --catalog-db PATH --warehouse s3://BUCKET/warehouse \\
        --endpoint-url URL --table NAMESPACE.TABLE [--catalog-name NAME] [--keys]
    python -m demo.iceberg_spark --self-check

``--self-check`` (what ``make iceberg-spark`` runs) starts moto, writes a
small table with the job's own functions in two commits, reads it with
pyiceberg and with Spark, prints both views side by side and exits 1 on
any difference.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
POM = ROOT / "iceberg" / "pom.xml"
#: Iceberg's Spark runtime for each Spark line the stacks run (Makefile STACK): its Scala version is Spark's.
RUNTIMES = {"3.5": "3.5_2.12", "4.0": "4.0_2.13"}


def spark_line() -> str:
    """The installed pyspark's ``MAJOR.MINOR`` (3.5 on the EMR 7 stack, 4.0 on EMR 8's)."""
    import pyspark

    return ".".join(pyspark.__version__.split(".")[:2])


#: The jars for this stack's Spark, a folder per Spark line: switching stacks never hands Spark the other's runtime.
JARS = ROOT / ".iceberg-jars" / spark_line()
#: The jars of the last fetch, one file name a line: newer than the pom, they are the pom's.
JAR_LIST = JARS / "jars.txt"
KEY_COLUMN, ERROR_COLUMN = "key", "error"
#: What both readers must agree on; everything else in a view is for the eye.
COMPARED = ("rows", "distinct_keys", "error_rows", "keys_sha256", "error_keys_sha256", "snapshots")
#: Iceberg's default region when the environment names none (moto takes any).
FALLBACK_REGION = "us-east-1"
#: How long the Spark read may take before spark_read gives up: a cold JVM and the jars' classes load in ~15 s.
READ_TIMEOUT = 300


class ReaderError(RuntimeError):
    """The Spark reader cannot run: the message says what to install or fix."""


# ----------------------------------------------------------------------------
# The jars


def jars_present() -> bool:
    """Whether ``.iceberg-jars/`` holds the jars of the current ``iceberg/pom.xml``."""
    if not JAR_LIST.exists() or JAR_LIST.stat().st_mtime < POM.stat().st_mtime:
        return False
    listed = JAR_LIST.read_text().split()
    return bool(listed) and all((JARS / name).is_file() for name in listed)


def fetch_jars() -> list[str]:
    """The jars Spark needs, fetched with Maven into ``.iceberg-jars/`` when missing or older than the pom.

    Returns
    -------
    list of str
        The jars' absolute paths.

    Raises
    ------
    ReaderError
        ``mvn`` is not on PATH, or Maven failed (its output's tail is in the message).
    """
    if jars_present():
        return [str(JARS / name) for name in JAR_LIST.read_text().split()]
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ReaderError("Maven (mvn) is not on PATH: install it (apt-get install maven) to fetch Iceberg's jars "
                          f"(iceberg/pom.xml) into {JARS.relative_to(ROOT)}/")
    _java()  # Maven runs on Java too: say so before its own less clear message
    print(f"== fetching Iceberg's jars from Maven Central into {JARS.relative_to(ROOT)}/ (first use only)",
          file=sys.stderr, flush=True)
    JARS.mkdir(parents=True, exist_ok=True)
    for stale in JARS.glob("*.jar"):  # an older pom's versions
        stale.unlink()
    runtime = RUNTIMES.get(spark_line())
    if runtime is None:
        raise ReaderError(f"no Iceberg runtime is known for Spark {spark_line()}: the stacks run Spark "
                          f"{' and '.join(RUNTIMES)} (RUNTIMES in demo/iceberg_spark.py)")
    m2 = JARS / "m2"
    command = [mvn, "-q", "-B", "-f", str(POM), f"-Dspark.runtime={runtime}", f"-Djars.dir={JARS}",
               f"-Dmaven.repo.local={m2}", "dependency:copy-dependencies"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ReaderError(f"Maven could not fetch Iceberg's jars (exit {done.returncode}; {' '.join(command)}):\n"
                          f"{(done.stdout + done.stderr)[-3000:]}")
    jars = sorted(str(path) for path in JARS.glob("*.jar"))
    if not jars:
        raise ReaderError(f"Maven copied no jar into {JARS} ({' '.join(command)})")
    # Maven's own cache holds a second copy of every jar (140 MB): the copies are all the reader needs.
    shutil.rmtree(m2, ignore_errors=True)
    JAR_LIST.write_text("".join(f"{Path(jar).name}\n" for jar in jars))
    return jars


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home and (Path(home) / "bin" / "java").exists() else shutil.which("java")
    if java is None:
        raise ReaderError("Java is not on PATH (nor in JAVA_HOME): Spark 3.5 needs a Java 17 runtime "
                          "(apt-get install openjdk-17-jre-headless)")
    return java


# ----------------------------------------------------------------------------
# The catalog's name, the keys' digest


def catalog_name_in(catalog_db: str | os.PathLike, identifier: str) -> str:
    """The ``catalog_name`` pyiceberg's SQL catalog wrote for ``identifier`` in the SQLite file ``catalog_db``.

    Raises
    ------
    ReaderError
        The file has no such table, or several catalogs name it (then ``--catalog-name`` chooses).
    """
    namespace, _, table = identifier.rpartition(".")
    path = Path(catalog_db)
    if not path.is_file():
        raise ReaderError(f"no SQLite catalog file at {path}")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        try:
            names = [row[0] for row in db.execute(
                "SELECT DISTINCT catalog_name FROM iceberg_tables WHERE table_namespace = ? AND table_name = ?",
                (namespace, table))]
        except sqlite3.OperationalError as exc:
            raise ReaderError(f"{path} is not an Iceberg SQL catalog ({exc})") from exc
    if not names:
        raise ReaderError(f"{path} holds no table {identifier}")
    if len(names) > 1:
        raise ReaderError(f"{path} holds {identifier} in the catalogs {', '.join(sorted(names))}: "
                          "choose one with --catalog-name")
    return names[0]


def keys_digest(sorted_keys: Iterable[str]) -> str:
    """SHA-256 of the keys, each followed by a newline, in the order given (sort them first)."""
    digest = hashlib.sha256()
    for key in sorted_keys:
        digest.update(key.encode() + b"\n")
    return digest.hexdigest()


# ----------------------------------------------------------------------------
# Spark's view


def spark_read(catalog_db: str, warehouse: str, endpoint_url: str, identifier: str, *,
               catalog_name: str | None = None, keys: bool = False) -> dict:
    """Read ``identifier`` with Spark and Iceberg's Java library; what it holds, as a JSON-ready dict.

    Spark runs in a child process (``python -m demo.iceberg_spark``), so its
    JVM ends with the read and takes this process's pyspark state with it.

    Parameters
    ----------
    catalog_db : str
        The SQLite file of pyiceberg's SQL catalog (its ``sqlite:///PATH``).
    warehouse : str
        The catalog's warehouse, ``s3://BUCKET/PREFIX``.
    endpoint_url : str
        The S3 endpoint (moto, MinIO); the credentials and region are the
        environment's ``AWS_*`` variables.
    identifier : str
        ``NAMESPACE.TABLE``.
    catalog_name : str, optional
        The pyiceberg catalog's name; read from ``catalog_db`` when not given.
    keys : bool
        Also give the sorted keys and error rows' keys as lists.

    Returns
    -------
    dict
        ``rows``, ``distinct_keys``, ``error_rows``, ``keys_sha256`` (of the
        sorted distinct keys), ``error_keys_sha256`` (of the error rows' keys,
        sorted, one per row), ``snapshots`` (the current history, oldest
        first: ``snapshot_id``, ``operation``, ``run_id``, ``commit_id``,
        ``added_files``, ``added_records``), ``nulls`` (each column's null
        count), ``catalog``, ``table``, ``jars``; when asked, ``keys``,
        ``error_keys`` and ``null_keys`` (each column's keys whose value is
        null).

    Raises
    ------
    ReaderError
        ``mvn`` or ``java`` is missing, the jars cannot be fetched, or the
        read failed (the child's output's tail is in the message).
    """
    fetch_jars()
    _java()
    name = catalog_name or catalog_name_in(catalog_db, identifier)
    with tempfile.TemporaryDirectory(prefix="iceberg-spark-") as work:
        result = Path(work) / "result.json"
        command = [sys.executable, "-m", "demo.iceberg_spark", "--catalog-db", str(catalog_db), "--warehouse",
                   warehouse, "--endpoint-url", endpoint_url, "--table", identifier, "--catalog-name", name,
                   "--result-file", str(result)] + (["--keys"] if keys else [])
        try:
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=READ_TIMEOUT,
                                  check=False)
        except subprocess.TimeoutExpired as exc:
            raise ReaderError(f"Spark's read of {identifier} took over {READ_TIMEOUT} s:\n"
                              f"{_text(exc.stderr)[-3000:]}") from exc
        if done.returncode != 0 or not result.exists():
            raise ReaderError(f"Spark could not read {name}.{identifier} (exit {done.returncode}):\n"
                              f"{(done.stdout + done.stderr)[-4000:]}")
        return json.loads(result.read_text())


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _quoted(*parts: str) -> str:
    return ".".join("`" + part.replace("`", "``") + "`" for part in parts)


def _read_here(catalog_db: str, warehouse: str, endpoint_url: str, identifier: str, catalog_name: str,
               keys: bool) -> dict:
    """:func:`spark_read`'s work, in this process: a local Spark session with the jars and a JDBC catalog."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    jars = fetch_jars()
    _java()
    prefix = f"spark.sql.catalog.{catalog_name}"
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or FALLBACK_REGION
    catalog = {
        "": "org.apache.iceberg.spark.SparkCatalog",
        ".catalog-impl": "org.apache.iceberg.jdbc.JdbcCatalog",
        ".uri": f"jdbc:sqlite:{Path(catalog_db).resolve()}",
        # pyiceberg's tables have the V0 columns: V0 reads them as they are, V1 would ALTER the file.
        ".jdbc.schema-version": "V0",
        # A reader creates nothing: the catalog's two tables are pyiceberg's already.
        ".jdbc.init-catalog-tables": "false",
        ".warehouse": warehouse,
        ".io-impl": "org.apache.iceberg.aws.s3.S3FileIO",
        ".s3.endpoint": endpoint_url,
        # moto (and MinIO) serve buckets under the path, not as a host name.
        ".s3.path-style-access": "true",
        ".client.region": region,
    }
    for variable, option in (("AWS_ACCESS_KEY_ID", ".s3.access-key-id"),
                             ("AWS_SECRET_ACCESS_KEY", ".s3.secret-access-key"),
                             ("AWS_SESSION_TOKEN", ".s3.session-token")):
        if os.environ.get(variable):
            catalog[option] = os.environ[variable]
    # Spark's driver and block manager on the loopback, whatever the host name resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = (SparkSession.builder.master("local[1]").appName("iceberg-spark reader")
               .config("spark.jars", ",".join(jars))
               .config("spark.driver.memory", "1g")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               # One core, a few thousand rows at most in a check: one shuffle partition, not 200.
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.sql.session.timeZone", "UTC"))
    for suffix, value in catalog.items():
        builder = builder.config(prefix + suffix, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    try:
        namespace, _, table_name = identifier.rpartition(".")
        parts = (catalog_name, *namespace.split("."), table_name)
        table = spark.table(_quoted(*parts))
        columns = [c for c in table.columns if c != KEY_COLUMN]
        counts = table.agg(
            F.count(F.lit(1)).alias("rows"),
            F.countDistinct(KEY_COLUMN).alias("distinct_keys"),
            F.count(F.when(F.col(ERROR_COLUMN).isNotNull(), 1)).alias("error_rows"),
            *[(F.count(F.lit(1)) - F.count(F.col(c))).alias(f"null:{c}") for c in columns]).first()
        # Spark orders strings by their UTF-8 bytes, which is Python's code-point order: the same digest.
        distinct = [row[0] for row in table.select(KEY_COLUMN).distinct().orderBy(KEY_COLUMN).toLocalIterator()]
        error_keys = [row[0] for row in table.where(F.col(ERROR_COLUMN).isNotNull()).select(KEY_COLUMN)
                      .orderBy(KEY_COLUMN).toLocalIterator()]
        null_keys = _null_keys(table, columns) if keys else None
        snapshots = _spark_history(spark, _quoted(*parts))
    finally:
        spark.stop()
    view = {"catalog": catalog_name, "table": identifier, "rows": counts["rows"],
            "distinct_keys": counts["distinct_keys"], "error_rows": counts["error_rows"],
            "keys_sha256": keys_digest(distinct), "error_keys_sha256": keys_digest(error_keys),
            "snapshots": snapshots, "nulls": {c: counts[f"null:{c}"] for c in columns},
            "jars": [Path(j).name for j in jars]}
    if keys:
        view.update(keys=distinct, error_keys=error_keys, null_keys=null_keys)
    return view


def _null_keys(table, columns: list[str]) -> dict[str, list[str]]:
    """Each column's keys whose value is null, sorted: one pass over the rows that have a null."""
    from functools import reduce

    from pyspark.sql import functions as F

    found: dict[str, list[str]] = {c: [] for c in columns}
    if not columns:
        return found
    nulls = [F.col(c).isNull().alias(c) for c in columns]
    any_null = reduce(lambda a, b: a | b, [F.col(c).isNull() for c in columns])
    for row in table.where(any_null).select(KEY_COLUMN, *nulls).orderBy(KEY_COLUMN).toLocalIterator():
        for c in columns:
            if row[c]:
                found[c].append(row[KEY_COLUMN])
    return found


def _spark_history(spark, table: str) -> list[dict]:
    """The table's current history, oldest first, from its ``snapshots`` and ``history`` metadata tables.

    The current snapshot's ancestors, as ``iceberg_catalog.snapshot_summaries``
    gives them: the history's ``is_current_ancestor`` rows, walked from the
    current snapshot back through ``parent_id``.
    """
    ancestors = {row.snapshot_id for row in spark.sql(
        f"SELECT snapshot_id FROM {table}.history WHERE is_current_ancestor").collect()}
    rows = {row.snapshot_id: row for row in spark.sql(
        f"SELECT snapshot_id, parent_id, operation, summary FROM {table}.snapshots").collect()
        if row.snapshot_id in ancestors}
    parents = {row.parent_id for row in rows.values()}
    current = [i for i in rows if i not in parents]
    chain = []
    at = current[0] if current else None
    while at in rows:
        chain.append(rows[at])
        at = rows[at].parent_id
    return [_snapshot(row.snapshot_id, row.operation, dict(row.summary or {})) for row in reversed(chain)]


def _snapshot(snapshot_id: int, operation: str, summary: dict) -> dict:
    return {"snapshot_id": snapshot_id, "operation": operation, "run_id": summary.get("mxinfer.run-id"),
            "commit_id": summary.get("mxinfer.commit-id"), "added_files": int(summary.get("added-data-files", 0)),
            "added_records": int(summary.get("added-records", 0))}


# ----------------------------------------------------------------------------
# pyiceberg's view, and the self-check


def pyiceberg_view(table, *, keys: bool = False) -> dict:
    """What pyiceberg reads in ``table``, in :func:`spark_read`'s shape (without ``nulls``).

    From ``iceberg_catalog.existing_keys`` (with and without the error rows)
    and ``iceberg_catalog.snapshot_summaries``, after a refresh.
    """
    from mxjob.outputs import iceberg_catalog

    table.refresh()
    every = iceberg_catalog.existing_keys(table, KEY_COLUMN).to_pylist()
    scored = iceberg_catalog.existing_keys(table, KEY_COLUMN, with_errors=False).to_pylist()
    # The error rows' keys, one per row: a key may have a scored row and an error row (a rescored error).
    error_keys = sorted((collections.Counter(every) - collections.Counter(scored)).elements())
    distinct = sorted(set(every))
    view = {"table": ".".join(table.name()[-2:]), "rows": len(every), "distinct_keys": len(distinct),
            "error_rows": len(error_keys), "keys_sha256": keys_digest(distinct),
            "error_keys_sha256": keys_digest(error_keys),
            "snapshots": [_snapshot(c.snapshot_id, c.operation, {
                "mxinfer.run-id": c.run_id, "mxinfer.commit-id": c.commit_id,
                "added-data-files": c.added_files, "added-records": c.added_records})
                for c in iceberg_catalog.snapshot_summaries(table)]}
    if keys:
        view.update(keys=distinct, error_keys=error_keys)
    return view


def differences(pyiceberg: dict, spark: dict) -> list[str]:
    """The :data:`COMPARED` fields on which the two views differ, one line each."""
    return [f"{field}: pyiceberg {pyiceberg.get(field)!r}, Spark {spark.get(field)!r}"
            for field in COMPARED if pyiceberg.get(field) != spark.get(field)]


#: The self-check's table: a fingerprint as the job records one, and its files' rows, two commits of them.
SAMPLE_FINGERPRINT = {"task": "classify", "top_k": 2, "model_params": "ab" * 32, "preprocess": {"size": 28}}
SAMPLE_COMMITS = (
    [(["a.png", "b.png", "c.png"], {"b.png"}), (["d.png", "e.png"], set())],
    [(["f.png", "g.png"], {"g.png"})],
)


def sample_batch(keys: list[str], fail: set[str]):
    """A classify record batch of the job's result model, ``fail``'s keys error rows, and a carried column."""
    import pyarrow as pa

    from mxjob.results import part_format
    from mxjob.tasks import classify

    made = classify.TASK.results()
    for i, key in enumerate(keys):
        if key in fail:
            made.fail(key, {"stage": "decode", "type": "OSError", "message": f"cannot identify image {key}"})
        else:
            made.add(key, classify.prediction_entries([(i % 7, f"c{i % 7}", 0.5 + i / 100), (9, None, 0.125)]))
    batch = made.record_batch()
    # A column of the key list the job carries into its rows (--carry-columns): ours, not Iceberg's.
    carried = pa.table({"product_id": [f"p-{key.split('.')[0]}" for key in batch.column(KEY_COLUMN).to_pylist()]})
    return part_format.carry(batch, carried)


def write_sample_table(catalog, s3, identifier: str, commits=SAMPLE_COMMITS, run_id: str = "r1"):
    """Create ``identifier`` and commit ``commits``' files in order, one snapshot each, as the job does.

    Each file is written by the job's Parquet sink over a multipart upload at
    ``iceberg_catalog.data_file_path`` and committed with ``commit_files``
    (commit id ``RUN:FIRST-LAST`` of the files' indices). Returns the table.
    """
    from mxjob.outputs import iceberg_catalog, parquet
    from mxjob.results import parquet_view
    from mxjob.s3 import uris, writes

    first = sample_batch(*commits[0][0])
    table = iceberg_catalog.open_table(catalog, identifier, parquet_view.parquet_schema(first.schema),
                                     SAMPLE_FINGERPRINT)
    index = 0
    for files in commits:
        paths = []
        for keys, fail in files:
            path = iceberg_catalog.data_file_path(table, run_id, index)
            bucket, key = uris.parse_s3_uri(path, need_key=True)
            writer = writes.MultipartWriter(s3, bucket, key, content_type="application/vnd.apache.parquet")
            sink = parquet.ParquetSink(writer, parquet.provenance({"fingerprint": SAMPLE_FINGERPRINT}))
            sink.write([sample_batch(keys, set(fail))])
            sink.close()
            paths.append(path)
            index += 1
        first_index = index - len(paths)
        span = f"{first_index}-{index - 1}" if len(paths) > 1 else f"{first_index}"
        iceberg_catalog.commit_files(table, paths, run_id, f"{run_id}:{span}")
    return table


def self_check() -> int:
    """``make iceberg-spark``: moto, a SQLite catalog, a two-commit table, pyiceberg's and Spark's views compared."""
    import boto3

    from demo.s3local import FAKE_AWS_ENV, moto_server
    from mxjob.outputs import iceberg_catalog

    fetch_jars()  # before moto starts: a missing mvn or java is said at once
    _java()
    os.environ.update(FAKE_AWS_ENV)
    catalog_name, bucket, identifier = "mxcheck", "iceberg-check", "preds.digits"
    with tempfile.TemporaryDirectory(prefix="iceberg-spark-check-") as work, \
            moto_server(Path(work) / "moto.log") as endpoint:
        catalog_db = Path(work) / "catalog.db"
        warehouse = f"s3://{bucket}/warehouse"
        variable = f"PYICEBERG_CATALOG__{catalog_name.upper()}"
        os.environ[f"{variable}__URI"] = f"sqlite:///{catalog_db}"
        os.environ[f"{variable}__WAREHOUSE"] = warehouse
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"])
        s3.create_bucket(Bucket=bucket)
        catalog = iceberg_catalog.load_catalog(catalog_name, endpoint_url=endpoint)
        print(f"== pyiceberg writes {catalog_name}/{identifier} (SQLite catalog {catalog_db}, moto {endpoint}): "
              f"{sum(len(files) for files in SAMPLE_COMMITS)} Parquet files in {len(SAMPLE_COMMITS)} commits",
              flush=True)
        table = write_sample_table(catalog, s3, identifier)
        mine = pyiceberg_view(table)
        print("== Spark reads it (local[1], Iceberg's JDBC catalog and S3FileIO)", flush=True)
        theirs = spark_read(str(catalog_db), warehouse, endpoint, identifier)
    print(f"   jars: {', '.join(theirs['jars'])}")
    print(f"   {'':18} {'pyiceberg':>12} {'Spark':>12}")
    for field in ("rows", "distinct_keys", "error_rows"):
        print(f"   {field:18} {mine[field]:>12} {theirs[field]:>12}")
    for field in ("keys_sha256", "error_keys_sha256"):
        print(f"   {field:18} {mine[field][:12]:>12} {theirs[field][:12]:>12}")
    for label, view in (("pyiceberg", mine), ("Spark", theirs)):
        for snapshot in view["snapshots"]:
            print(f"   {label:9} snapshot {snapshot['snapshot_id']} {snapshot['operation']} run "
                  f"{snapshot['run_id']} commit {snapshot['commit_id']}: {snapshot['added_files']} files, "
                  f"{snapshot['added_records']} rows")
    print(f"   Spark's nulls: {json.dumps(theirs['nulls'])} (an error row's predictions are null in the files)")
    problems = differences(mine, theirs)
    if theirs["nulls"].get("predictions") != theirs["error_rows"]:
        problems.append(f"Spark reads {theirs['nulls'].get('predictions')} null predictions, not one per error row "
                        f"({theirs['error_rows']})")
    if problems:
        for problem in problems:
            print(f"!! {problem}", file=sys.stderr)
        return 1
    print("== the same table in both readers")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo.iceberg_spark", description=__doc__.split("\n\n")[0])
    parser.add_argument("--self-check", action="store_true",
                        help="write a small table with pyiceberg on a moto S3 and compare Spark's read of it")
    parser.add_argument("--catalog-db", help="the SQLite file of pyiceberg's SQL catalog")
    parser.add_argument("--warehouse", help="the catalog's warehouse, s3://BUCKET/PREFIX")
    parser.add_argument("--endpoint-url", help="the S3 endpoint (moto, MinIO); credentials from AWS_* variables")
    parser.add_argument("--table", help="NAMESPACE.TABLE")
    parser.add_argument("--catalog-name", help="the pyiceberg catalog's name (default: the one in --catalog-db)")
    parser.add_argument("--keys", action="store_true",
                        help="also print the sorted keys, the error rows' keys and each column's null keys")
    # spark_read's child writes its result to a file: stdout is shared with Spark's own output.
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        if args.self_check:
            return self_check()
        missing = [f"--{name.replace('_', '-')}" for name in ("catalog_db", "warehouse", "endpoint_url", "table")
                   if not getattr(args, name)]
        if missing:
            parser.error(f"give {', '.join(missing)} (or --self-check)")
        if "." not in args.table.strip("."):
            parser.error(f"--table {args.table!r} is not NAMESPACE.TABLE")
        name = args.catalog_name or catalog_name_in(args.catalog_db, args.table)
        view = _read_here(args.catalog_db, args.warehouse, args.endpoint_url, args.table, name, args.keys)
    except ReaderError as exc:
        print(f"!! {exc}", file=sys.stderr)
        return 1
    text = json.dumps(view, indent=2)
    if args.result_file:
        Path(args.result_file).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
