"""An Iceberg table as the output (mxjob.outputs.iceberg_catalog), without Spark.

A SQL catalog on SQLite in the test's tmp_path, configured as a pyiceberg
user would (``PYICEBERG_CATALOG__TEST__...`` environment variables), with its
warehouse on the session's moto S3. The data files are written by the job's
own Parquet writer (:class:`mxjob.outputs.parquet.ParquetSink` over a multipart
upload), then committed: the table read back equals the rows written, a
commit id is committed once however often it is retried (after a crash on
either side of the commit, or beside a concurrent writer), and the keys
already in the table come back with and without their error rows.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.exceptions import CommitFailedException

from mxjob.outputs import iceberg, iceberg_catalog
from mxjob.outputs.iceberg import TableUriError
from mxjob.outputs.iceberg_catalog import TableMismatchError
from mxjob.results import parquet_view
from mxjob.tasks import classify, embed
from tests.support.helpers import parquet_of, upload_data_file

BUCKET = "iceberg-bucket"
IDENT = "preds.digits"
FINGERPRINT = {"task": "classify", "top_k": 5, "model_params": "ab" * 32, "preprocess": {"size": 28}}
SCHEMA = parquet_of(classify.TASK.schema())


@pytest.fixture(scope="module")
def s3(moto_buckets):
    return moto_buckets


@pytest.fixture
def env(monkeypatch, tmp_path, s3):
    """The ``test`` catalog in environment variables only: no .pyiceberg.yaml of the machine's is read."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYICEBERG_HOME", raising=False)
    monkeypatch.setenv("PYICEBERG_CATALOG__TEST__URI", f"sqlite:///{tmp_path}/catalog.db")
    # One warehouse per test in the module's bucket: no test reads another's files.
    monkeypatch.setenv("PYICEBERG_CATALOG__TEST__WAREHOUSE", f"s3://{BUCKET}/warehouse/{tmp_path.name}")
    return tmp_path


@pytest.fixture
def catalog(env, moto_endpoint):
    return iceberg_catalog.load_catalog("test", endpoint_url=moto_endpoint)


@pytest.fixture
def table(catalog):
    return iceberg_catalog.open_table(catalog, IDENT, SCHEMA, FINGERPRINT)


def rows_batch(keys: list[str], fail: frozenset = frozenset()) -> pa.RecordBatch:
    """A classify record batch of the result model; keys in ``fail`` are error rows."""
    made = classify.TASK.results()
    for i, key in enumerate(keys):
        if key in fail:
            made.fail(key, {"stage": "decode", "type": "OSError", "message": f"bad {key}"})
        else:
            made.add(key, classify.prediction_entries([(i % 7, f"c{i % 7}", 0.25 + i / 100), (9, None, 0.125)]))
    return made.record_batch()


def written_rows(*batches: pa.RecordBatch) -> list[dict]:
    """The rows as the Parquet view writes them (probability as float32), sorted by key."""
    rows = [row for b in batches for row in pa.Table.from_batches([parquet_view.parquet_batch(b, SCHEMA)]).to_pylist()]
    return sorted(rows, key=lambda row: row["key"])


def table_rows(table) -> list[dict]:
    return sorted(table.refresh().scan().to_arrow().to_pylist(), key=lambda row: row["key"])


def key_set(array: pa.ChunkedArray) -> list[str]:
    return sorted(array.to_pylist())


# ----------------------------------------------------------------------------
# The URI


@pytest.mark.parametrize("uri, expected", [
    ("iceberg://glue/analytics.predictions", ("glue", "analytics", "predictions")),
    ("iceberg://local/a.b.table_1", ("local", "a.b", "table_1")),
])
def test_parse_table_uri_gives_catalog_namespace_and_table(uri, expected):
    assert iceberg.parse_table_uri(uri) == expected


@pytest.mark.parametrize("uri, message", [
    ("s3://bucket/prefix/", r"not an Iceberg table URI; expected iceberg://CATALOG/NAMESPACE\.TABLE"),
    ("iceberg:///ns.table", r"names no catalog; .*PYICEBERG_CATALOG__<NAME>__URI"),
    ("iceberg://glue", r"names no table; expected iceberg://glue/NAMESPACE\.TABLE"),
    ("iceberg://glue/", r"names no table"),
    ("iceberg://glue/predictions", r"names no namespace; write iceberg://glue/NAMESPACE\.predictions, "
                                   r"e\.g\. iceberg://glue/default\.predictions"),
    ("iceberg://glue/ns/predictions", r"with a dot, not a slash: iceberg://glue/ns\.predictions"),
    ("iceberg://glue/.predictions", r"an empty name between its dots"),
    ("iceberg://glue/ns.", r"an empty name between its dots"),
    ("iceberg://glue/a..t", r"an empty name between its dots"),
    ("iceberg://glue/ns.t?x=1", r"holds '\?'"),
])
def test_parse_table_uri_refuses_a_malformed_uri_saying_what_to_write(uri, message):
    with pytest.raises(TableUriError, match=message):
        iceberg.parse_table_uri(uri)


# ----------------------------------------------------------------------------
# The catalog


def test_the_catalog_comes_from_the_environment_with_the_jobs_endpoint(catalog, env, moto_endpoint):
    assert catalog.name == "test"
    assert catalog.properties["uri"] == f"sqlite:///{env}/catalog.db"
    # The job's endpoint and (boto3's) region, so pyiceberg's PyArrow FileIO writes to the job's S3.
    assert (catalog.properties["s3.endpoint"], catalog.properties["s3.region"]) == (moto_endpoint, "us-east-1")


def test_the_catalogs_own_endpoint_and_region_are_kept(env, monkeypatch, moto_endpoint):
    monkeypatch.setenv("PYICEBERG_CATALOG__TEST__S3__ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("PYICEBERG_CATALOG__TEST__S3__REGION", "eu-west-3")
    loaded = iceberg_catalog.load_catalog("test", endpoint_url=moto_endpoint, region="us-east-1")
    assert (loaded.properties["s3.endpoint"], loaded.properties["s3.region"]) == ("http://127.0.0.1:1", "eu-west-3")


def test_without_an_endpoint_the_catalogs_properties_are_pyicebergs_alone(env):
    loaded = iceberg_catalog.load_catalog("test", region="eu-west-3")
    assert "s3.endpoint" not in loaded.properties and "s3.region" not in loaded.properties


def test_the_catalog_comes_from_pyiceberg_yaml(env, monkeypatch, moto_endpoint):
    monkeypatch.delenv("PYICEBERG_CATALOG__TEST__URI")
    monkeypatch.delenv("PYICEBERG_CATALOG__TEST__WAREHOUSE")
    (env / ".pyiceberg.yaml").write_text(
        f"catalog:\n  fromfile:\n    uri: sqlite:///{env}/file.db\n    warehouse: s3://{BUCKET}/warehouse/{env.name}\n")
    monkeypatch.setenv("PYICEBERG_HOME", str(env))
    loaded = iceberg_catalog.load_catalog("fromfile", endpoint_url=moto_endpoint)
    assert (loaded.name, loaded.properties["uri"]) == ("fromfile", f"sqlite:///{env}/file.db")


def test_an_unknown_catalog_is_refused_naming_both_ways_to_configure_it(env):
    with pytest.raises(ValueError, match=r"no pyiceberg catalog named 'nope' is configured.*\.pyiceberg\.yaml.*"
                                         r"PYICEBERG_CATALOG__NOPE__URI=.*spark\.yarn\.appMasterEnv\."):
        iceberg_catalog.load_catalog("nope")


# ----------------------------------------------------------------------------
# The table: created, reopened, refused


def test_the_table_is_created_with_the_schema_and_the_fingerprint(table, catalog, env):
    assert catalog.list_namespaces() == [("preds",)]
    assert table.location().startswith(f"s3://{BUCKET}/warehouse/{env.name}/")
    assert [f.name for f in table.schema().fields] == ["key", "predictions", "error"]
    assert str(table.schema().find_field("predictions.element.probability").field_type) == "float"
    assert json.loads(table.properties[iceberg_catalog.FINGERPRINT]) == FINGERPRINT
    assert table.current_snapshot() is None  # no row yet, no snapshot


def test_the_same_run_reopens_the_table_as_it_is(table, catalog):
    again = iceberg_catalog.open_table(catalog, IDENT, SCHEMA, dict(reversed(list(FINGERPRINT.items()))))
    assert (again.metadata.table_uuid, again.metadata_location) == (table.metadata.table_uuid, table.metadata_location)


def test_a_table_of_other_columns_is_refused_with_what_differs(table, catalog):
    vectors = parquet_of(embed.TASK.schema(dimension=4))
    with pytest.raises(TableMismatchError, match=r"other columns than this run writes: predictions is in the "
                                                 r"table, not in this run's rows; embedding \(list<float>\) is in "
                                                 r"this run's rows, not in the table\. .*another table "
                                                 r"\(iceberg://test/preds\.NEW_TABLE\)"):
        iceberg_catalog.open_table(catalog, IDENT, vectors, FINGERPRINT)
    # The part's own schema: probability as float64, not the Parquet view's float32.
    with pytest.raises(TableMismatchError, match=r"predictions: list<struct<.*probability: float>> in the table, "
                                                 r"list<struct<.*probability: double>> in this run's rows"):
        iceberg_catalog.open_table(catalog, IDENT, classify.TASK.schema(), FINGERPRINT, accept_other_fingerprint=True)


def test_a_table_of_another_fingerprint_is_refused_unless_accepted(table, catalog):
    other = {**FINGERPRINT, "top_k": 3}
    with pytest.raises(TableMismatchError, match=r"rows of another model or settings: top_k: 5 then, 3 now\. Write "
                                                 r"to another table .* or add to this one anyway with "
                                                 r"--accept-other-fingerprint"):
        iceberg_catalog.open_table(catalog, IDENT, SCHEMA, other, override_hint="--accept-other-fingerprint")
    accepted = iceberg_catalog.open_table(catalog, IDENT, SCHEMA, other, accept_other_fingerprint=True)
    assert accepted.metadata.table_uuid == table.metadata.table_uuid
    # The table keeps the fingerprint it was made with: the next such run needs the override too.
    assert json.loads(accepted.properties[iceberg_catalog.FINGERPRINT]) == FINGERPRINT


def test_a_table_this_job_did_not_create_is_refused_unless_accepted(catalog):
    catalog.create_namespace("preds")
    catalog.create_table(IDENT, schema=pa.schema(list(SCHEMA)))
    with pytest.raises(TableMismatchError, match=r"has no mxinfer\.fingerprint property: this job did not create it"):
        iceberg_catalog.open_table(catalog, IDENT, SCHEMA, FINGERPRINT)
    assert iceberg_catalog.open_table(catalog, IDENT, SCHEMA, FINGERPRINT, accept_other_fingerprint=True)


def test_float16_embeddings_cannot_make_a_table(catalog):
    half = parquet_of(embed.TASK.schema(dimension=4, dtype="float16"))
    with pytest.raises(ValueError, match=r"cannot hold these columns: .*embedding.*leave --embedding-dtype at float32"):
        iceberg_catalog.open_table(catalog, IDENT, half, FINGERPRINT)
    assert catalog.list_namespaces() == []  # refused before anything was created


# ----------------------------------------------------------------------------
# Data files and commits


def test_data_files_go_under_the_tables_data_path(table):
    path = iceberg_catalog.data_file_path(table, "r1", 7)
    assert path == f"{table.location()}/data/mxinfer-r1-00007.parquet"
    with pytest.raises(ValueError, match=r"run id 'a/b' must be letters, digits"):
        iceberg_catalog.data_file_path(table, "a/b", 0)


def test_files_are_committed_in_one_snapshot_and_read_back_as_written(table, s3):
    batches = [rows_batch(["a.png", "b.png", "c.png"], fail=frozenset({"b.png"})), rows_batch(["d.png", "e.png"])]
    paths = [iceberg_catalog.data_file_path(table, "r1", i) for i in range(2)]
    for path, batch in zip(paths, batches):
        upload_data_file(s3, path, batch, FINGERPRINT)

    commit = iceberg_catalog.commit_files(table, paths, "r1", "r1:0-1")

    assert commit == iceberg_catalog.snapshot_summaries(table)[-1]
    assert (len(table.snapshots()), commit.run_id, commit.commit_id) == (1, "r1", "r1:0-1")
    assert (commit.operation, commit.added_files, commit.added_records) == ("append", 2, 5)
    expected = written_rows(*batches)
    # pyiceberg 0.10 reads a null list<struct> back as [] (apache/iceberg-python#3833): b.png's predictions.
    assert table_rows(table) == [{**row, "predictions": row["predictions"] or []} for row in expected]
    # The files the table references hold the null, as Spark, Athena and pyarrow read it.
    files = sorted(task.file.file_path for task in table.scan().plan_files())
    assert files == paths
    fs = table.io.fs_by_scheme("s3", None)
    on_disk = pa.concat_tables([pq.read_table(p.removeprefix("s3://"), filesystem=fs) for p in files])
    assert sorted(on_disk.to_pylist(), key=lambda row: row["key"]) == expected


def test_the_same_commit_id_again_commits_nothing(table, s3):
    path = iceberg_catalog.data_file_path(table, "r1", 0)
    upload_data_file(s3, path, rows_batch(["a.png", "b.png"]), FINGERPRINT)
    first = iceberg_catalog.commit_files(table, [path], "r1", "r1:0")

    assert iceberg_catalog.commit_files(table, [path], "r1", "r1:0") is None
    assert [s.snapshot_id for s in table.refresh().snapshots()] == [first.snapshot_id]
    assert len(table_rows(table)) == 2


def test_two_commit_ids_make_two_snapshots_with_their_summaries(table, s3):
    for i, keys in enumerate((["a.png", "b.png"], ["c.png"])):
        path = iceberg_catalog.data_file_path(table, "r1", i)
        upload_data_file(s3, path, rows_batch(keys), FINGERPRINT)
        iceberg_catalog.commit_files(table, [path], "r1", f"r1:{i}")
    path = iceberg_catalog.data_file_path(table, "r2", 0)
    upload_data_file(s3, path, rows_batch(["d.png"]), FINGERPRINT)
    iceberg_catalog.commit_files(table, [path], "r2", "r2:0")

    summaries = iceberg_catalog.snapshot_summaries(table)
    assert [(c.run_id, c.commit_id, c.added_files, c.added_records) for c in summaries] == [
        ("r1", "r1:0", 1, 2), ("r1", "r1:1", 1, 1), ("r2", "r2:0", 1, 1)]
    assert len({c.snapshot_id for c in summaries}) == 3
    assert iceberg_catalog.committed_ids(table, "r1") == ["r1:0", "r1:1"]
    assert iceberg_catalog.committed_ids(table, "r3") == []


def test_a_crash_between_upload_and_commit_is_committed_once_by_the_next_driver(table, s3, env, moto_endpoint):
    paths = [iceberg_catalog.data_file_path(table, "r1", i) for i in range(2)]
    for i, path in enumerate(paths):
        upload_data_file(s3, path, rows_batch([f"k{i}-{j}.png" for j in range(3)]), FINGERPRINT)
    # The driver dies here: files uploaded, nothing committed. The next one loads everything afresh.
    catalog = iceberg_catalog.load_catalog("test", endpoint_url=moto_endpoint)
    again = iceberg_catalog.open_table(catalog, IDENT, SCHEMA, FINGERPRINT)
    assert iceberg_catalog.committed_ids(again, "r1") == []

    commit = iceberg_catalog.commit_files(again, paths, "r1", "r1:0-1")
    # ... and a third, after a crash past the commit, commits nothing.
    third = iceberg_catalog.open_table(iceberg_catalog.load_catalog("test", endpoint_url=moto_endpoint), IDENT, SCHEMA,
                                     FINGERPRINT)
    assert iceberg_catalog.commit_files(third, paths, "r1", "r1:0-1") is None

    assert commit.added_records == 6
    assert [c.commit_id for c in iceberg_catalog.snapshot_summaries(third.refresh())] == ["r1:0-1"]
    assert len(table_rows(third)) == 6


def interleave(monkeypatch, table, commit) -> list:
    """Make ``commit()`` run right after the table's first refresh, as another writer would; return the calls."""
    refresh, calls = table.refresh, []

    def refresh_then_another_writer_commits():
        refresh()
        if not calls:
            calls.append(commit())
        return table

    monkeypatch.setattr(table, "refresh", refresh_then_another_writer_commits)
    monkeypatch.setattr(iceberg_catalog, "COMMIT_RETRY_SECONDS", 0)
    return calls


def test_a_concurrent_commit_is_retried_after_reading_the_history_again(table, catalog, s3, monkeypatch, caplog):
    theirs, ours = (iceberg_catalog.data_file_path(table, run, 0) for run in ("other", "r1"))
    upload_data_file(s3, theirs, rows_batch(["x.png"]), FINGERPRINT)
    upload_data_file(s3, ours, rows_batch(["a.png", "b.png"]), FINGERPRINT)
    other = catalog.load_table(IDENT)
    calls = interleave(monkeypatch, table, lambda: iceberg_catalog.commit_files(other, [theirs], "other", "other:0"))

    commit = iceberg_catalog.commit_files(table, [ours], "r1", "r1:0")

    assert len(calls) == 1 and commit is not None
    assert [r.getMessage().split(" (")[0] for r in caplog.records if r.levelname == "WARNING"] == [
        "commit r1:0 to preds.digits conflicted"]
    assert [c.commit_id for c in iceberg_catalog.snapshot_summaries(table)] == ["other:0", "r1:0"]
    assert [row["key"] for row in table_rows(table)] == ["a.png", "b.png", "x.png"]


def test_a_twin_that_commits_the_same_id_first_leaves_nothing_to_commit(table, catalog, s3, monkeypatch):
    path = iceberg_catalog.data_file_path(table, "r1", 0)
    upload_data_file(s3, path, rows_batch(["a.png", "b.png"]), FINGERPRINT)
    twin = catalog.load_table(IDENT)
    interleave(monkeypatch, table, lambda: iceberg_catalog.commit_files(twin, [path], "r1", "r1:0"))

    assert iceberg_catalog.commit_files(table, [path], "r1", "r1:0") is None
    assert [c.commit_id for c in iceberg_catalog.snapshot_summaries(table)] == ["r1:0"]
    assert len(table_rows(table)) == 2


def test_a_commit_that_keeps_conflicting_gives_up_after_its_attempts(table, s3, monkeypatch):
    path = iceberg_catalog.data_file_path(table, "r1", 0)
    upload_data_file(s3, path, rows_batch(["a.png"]), FINGERPRINT)
    attempts = []

    def conflicting(*args, **kwargs):
        attempts.append(args)
        raise CommitFailedException("branch main has changed")

    monkeypatch.setattr(table, "add_files", conflicting)
    monkeypatch.setattr(iceberg_catalog, "COMMIT_RETRY_SECONDS", 0)
    with pytest.raises(CommitFailedException, match="branch main has changed"):
        iceberg_catalog.commit_files(table, [path], "r1", "r1:0")
    assert len(attempts) == iceberg_catalog.COMMIT_ATTEMPTS


def test_files_outside_the_tables_data_path_are_refused(table, s3):
    stray = f"s3://{BUCKET}/out.parts/r1/file.parquet"
    upload_data_file(s3, stray, rows_batch(["a.png"]), FINGERPRINT)
    with pytest.raises(ValueError, match=r"is not under the table's data path s3://.*/data/: write the data files "
                                         r"where data_file_path\(\) says"):
        iceberg_catalog.commit_files(table, [stray], "r1", "r1:0")
    assert table.refresh().snapshots() == []


def test_a_file_in_the_table_under_another_commit_id_is_refused(table, s3):
    path = iceberg_catalog.data_file_path(table, "r1", 0)
    upload_data_file(s3, path, rows_batch(["a.png"]), FINGERPRINT)
    iceberg_catalog.commit_files(table, [path], "r1", "r1:0")
    with pytest.raises(ValueError, match=r"Cannot add files that are already referenced by table"):
        iceberg_catalog.commit_files(table, [path], "r1", "r1:other")
    assert len(table.refresh().snapshots()) == 1


# ----------------------------------------------------------------------------
# The keys already in the table


def test_existing_keys_with_and_without_their_error_rows(table, s3):
    assert len(iceberg_catalog.existing_keys(table)) == 0  # no snapshot yet
    for i, (keys, fail) in enumerate(((["a.png", "b.png", "c.png"], {"b.png"}), (["d.png", "e.png"], {"e.png"}))):
        path = iceberg_catalog.data_file_path(table, "r1", i)
        upload_data_file(s3, path, rows_batch(keys, fail=frozenset(fail)), FINGERPRINT)
        iceberg_catalog.commit_files(table, [path], "r1", f"r1:{i}")

    every = iceberg_catalog.existing_keys(table)
    scored = iceberg_catalog.existing_keys(table, with_errors=False)

    assert isinstance(every, pa.ChunkedArray) and every.type == pa.large_string()
    assert key_set(every) == ["a.png", "b.png", "c.png", "d.png", "e.png"]
    assert key_set(scored) == ["a.png", "c.png", "d.png"]


def test_existing_keys_names_a_missing_column(table):
    with pytest.raises(ValueError, match=r"has no image_key column \(its columns: key, predictions, error\)"):
        iceberg_catalog.existing_keys(table, "image_key")
