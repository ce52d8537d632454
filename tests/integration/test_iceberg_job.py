"""``--output iceberg://CATALOG/NAMESPACE.TABLE`` through the whole job (mxjob/outputs/iceberg_run.py,
iceberg_catalog.py).

A SQL catalog on SQLite (in the test's folder, configured by
``PYICEBERG_CATALOG__JOBCAT__*`` variables as a user would), its tables' files
on the session's moto S3. Without Spark: the command line's refusals and the
table's home. Through spark-submit: 200 images into a new table committed a
batch at a time, read back with pyiceberg and compared row by row with the
JSON Lines output of the same job; 50 more with ``--skip-existing`` (exactly
those scored), then nothing new; a plain run refused; a driver SIGKILLed
after some commits, then ``--resume`` (every key once, one commit per file
set, no file twice); a driver killed while it committed a file it had
uploaded, then ``--resume`` (that file committed once); other columns and
another fingerprint refused before Spark starts.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter

import click
import numpy as np
import pytest

from demo import make_demo
from mxjob.core.errors import JobError
from mxjob.options import config
from mxjob.outputs import iceberg_catalog, iceberg_run, merge
from mxjob.reporting import record_fields, records
from mxjob.s3 import parallel_list
from mxjob.tasks import classify
from tests.support.fault_proxy import FaultProxy
from tests.support.helpers import (
    bucket_with_model,
    make_s3_client,
    put_digits,
    put_fake_model,
    spark_submit,
    start_spark_submit,
)

BUCKET = "iceberg-job"
CATALOG = "jobcat"
BATCH = 32


@pytest.fixture(scope="module")
def catalog_env(tmp_path_factory):
    """The catalog's variables, as a user sets them: spark-submit's driver inherits them, and this process reads
    the tables with them."""
    folder = tmp_path_factory.mktemp("catalog")
    env = {f"PYICEBERG_CATALOG__{CATALOG.upper()}__URI": f"sqlite:///{folder}/catalog.db",
           f"PYICEBERG_CATALOG__{CATALOG.upper()}__WAREHOUSE": f"s3://{BUCKET}/warehouse"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        yield env


@pytest.fixture
def in_env(monkeypatch, catalog_env, tmp_path):
    """This process sees the catalog too (no .pyiceberg.yaml of the machine's is read)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PYICEBERG_HOME", raising=False)
    for name, value in catalog_env.items():
        monkeypatch.setenv(name, value)
    iceberg_run.state.catalogs.clear()


def job_args(endpoint: str, output: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits", "--output", output,
            "--endpoint-url", endpoint, "--input-shape", "3,32,32", "--std", "255", "--batch-size", str(BATCH),
            "--top-k", "2", "--progress-seconds", "1", "--max-errors", "1", *extra]


def table_uri(name: str) -> str:
    return f"iceberg://{CATALOG}/preds.{name}"


def load(endpoint: str, name: str):
    return iceberg_catalog.load_catalog(CATALOG, endpoint_url=endpoint).load_table(f"preds.{name}")


def ok(result) -> str:
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return result.stdout + result.stderr


def home_summary(s3, endpoint: str, name: str) -> dict:
    bucket, prefix = iceberg_run.home_of(load(endpoint, name).location())
    summary = json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}_summary.json")["Body"].read())
    record_fields.from_json(records.Summary, summary)
    return summary


def table_rows(endpoint: str, name: str) -> list[dict]:
    return sorted(load(endpoint, name).scan().to_arrow().to_pylist(), key=lambda row: row["key"])


# ----------------------------------------------------------------------------
# The command line


def resolve(**flags) -> config.JobConfig:
    values = {"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/model/digits", **flags}
    return config.resolve(config.merge_settings(values, {}))


def test_a_table_output_is_parquet_its_home_found_by_the_driver():
    cfg = resolve(output=table_uri("t"))
    assert cfg.output.kind == "iceberg" and cfg.output.cuts_files and cfg.output.adds_rows
    assert (cfg.output_format, cfg.output_bucket, cfg.output_key, cfg.output_uri) == (
        "parquet", None, None, table_uri("t"))


@pytest.mark.parametrize(("flags", "message"), [
    ({"overwrite": True}, r"--overwrite does not apply to an Iceberg table.*iceberg://jobcat/preds\.NEW_TABLE"),
    ({"output_format": "jsonl"}, r"an Iceberg table holds Parquet files"),
])
def test_what_a_table_cannot_do_is_refused_saying_what_to_do(flags, message):
    with pytest.raises(click.UsageError, match=message):
        resolve(output=table_uri("t"), **flags)


def test_a_bad_table_uri_and_a_table_only_option_elsewhere_are_refused():
    with pytest.raises(click.UsageError, match=r"--output: .*names no namespace"):
        resolve(output=f"iceberg://{CATALOG}/t")
    with pytest.raises(click.UsageError, match=r"--accept-other-fingerprint applies to an Iceberg table output only"):
        resolve(output=f"s3://{BUCKET}/o.jsonl", accept_other_fingerprint=True)


def test_the_home_is_beside_the_tables_location_not_under_it():
    assert iceberg_run.home_of("s3://b/wh/preds.db/digits") == ("b", "wh/preds.db/_mxinfer/digits/")
    assert iceberg_run.home_of("s3a://b/digits/") == ("b", "_mxinfer/digits/")
    with pytest.raises(JobError, match=r"not on S3"):
        iceberg_run.home_of("file:///tmp/wh/digits")


def test_an_unconfigured_catalog_is_named_with_how_to_configure_it(in_env, moto_endpoint):
    cfg = resolve(output="iceberg://nosuch/preds.t", endpoint_url=moto_endpoint)
    with pytest.raises(JobError, match=r"no pyiceberg catalog named 'nosuch'.*PYICEBERG_CATALOG__NOSUCH__URI"):
        iceberg_run.locate(cfg)


def test_watch_finds_a_tables_status_through_its_catalog(in_env, moto_endpoint, runner):
    from mxjob.reporting import watch

    assert watch.status_location(table_uri("fresh"), moto_endpoint, None) == (
        BUCKET, "warehouse/preds.db/_mxinfer/fresh/_status.json")
    result = runner.invoke(watch.main, ["iceberg://nosuch/preds.t", "--endpoint-url", moto_endpoint])
    assert result.exit_code == 2 and "no pyiceberg catalog named 'nosuch'" in result.output


def test_a_new_tables_home_follows_the_catalogs_warehouse(in_env, moto_endpoint):
    cfg = resolve(output=table_uri("fresh"), endpoint_url=moto_endpoint)
    located = cfg.output.locate(cfg)
    assert (located.bucket, located.key) == (BUCKET, "warehouse/preds.db/_mxinfer/fresh/")


def test_a_table_with_a_live_lease_in_its_home_refuses_another_run_before_any_work(in_env, moto_endpoint,
                                                                                    stderr_runner):
    """The lease is beside the runs' home (the table's own optimistic commits still stand): a second run on the
    table is refused before it writes anything there."""
    import infer_main
    from mxjob.outputs import lease as leases

    s3 = make_s3_client(moto_endpoint)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    put_fake_model(s3, BUCKET)
    home = "warehouse/preds.db/_mxinfer/leased/"
    holder = leases.holder_facts("table-run", table_uri("leased"), None, 1)
    live = leases.Lease(s3, BUCKET, f"{home}_lease.json", holder)
    live.take(resume=False, output_uri=table_uri("leased"))
    before = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="warehouse/").get("Contents", [])}
    result = stderr_runner.invoke(infer_main.main, [
        "--endpoint-url", moto_endpoint, "--model", f"s3://{BUCKET}/model/fake", "--input", f"s3://{BUCKET}/imgs/",
        "--output", table_uri("leased"), "--resume"])
    assert result.exit_code == 1, result.stderr
    assert f"{table_uri('leased')} is being written by another run: run table-run" in result.stderr
    assert {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="warehouse/").get("Contents", [])} == before
    live.release()


# ----------------------------------------------------------------------------
# The sink and its commits, without Spark


def test_a_sink_that_commits_on_a_clock_gets_whole_parts_never_a_row_at_a_time():
    class Clocked:
        """A sink whose commit is always due, as --commit-seconds 0 makes a table's."""

        def __init__(self):
            self.writes = []

        def due(self) -> bool:
            return True

        def write(self, batches) -> None:
            self.writes.append([key for b in batches for key in b.column("key").to_pylist()])

    sink = Clocked()
    selection = merge._Selection(sink, merge.AssemblyCounts())
    first, second = rows_batch(["a", "b", "c"]), rows_batch(["d", "e"])
    for row in range(3):  # the merge of several runs keeps rows one at a time
        selection.keep(first, row)
    for row in range(2):
        selection.keep(second, row)
    selection.flush()
    selection.keep_rows(rows_batch(["f", "g"]), 0, 2)  # a whole part: handed over at once
    assert sink.writes == [["a", "b", "c"], ["d", "e"], ["f", "g"]]


def rows_batch(keys: list[str]):
    made = classify.TASK.results()
    for key in keys:
        made.add(key, classify.prediction_entries([(1, "one", 0.5)]))
    return made.record_batch()


@pytest.fixture
def sink_table(in_env, moto_endpoint, request):
    from tests.support.helpers import make_s3_client

    client = make_s3_client(moto_endpoint)
    if BUCKET not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    catalog = iceberg_catalog.load_catalog(CATALOG, endpoint_url=moto_endpoint)
    name = f"preds.sink_{request.node.name[5:30]}"
    schema = iceberg_run.table_schema(classify.TASK.schema())
    return client, iceberg_catalog.open_table(catalog, name, schema, {"task": "classify"})


def test_files_are_cut_at_rows_per_file_and_committed_together_at_close(sink_table):
    client, table = sink_table
    sink = iceberg_run.TableSink(client, table, iceberg_run.RunFiles("r1", rows_per_file=2), commit_seconds=3600)
    sink.write([rows_batch(["a", "b", "c"])])
    sink.write([rows_batch(["d", "e"])])
    assert not iceberg_catalog.snapshot_summaries(table)  # not due: nothing committed yet
    sink.close()
    [commit] = iceberg_catalog.snapshot_summaries(table)
    assert (commit.commit_id, commit.added_files, commit.added_records) == ("r1/00000-00002", 3, 5)
    assert sorted(r["key"] for r in table.scan().to_arrow().to_pylist()) == ["a", "b", "c", "d", "e"]
    assert iceberg_run.committed_indices(table, "r1") == {0, 1, 2}


def test_a_due_commit_ends_the_file_and_an_abort_leaves_whole_files_for_the_next_attempt(sink_table):
    client, table = sink_table
    sink = iceberg_run.TableSink(client, table, iceberg_run.RunFiles("r2", rows_per_file=100), commit_seconds=0)
    sink.write([rows_batch(["a", "b"])])  # due at once: its own file, its own commit
    sink.commit_seconds = 3600
    sink.write([rows_batch(["c"])])
    sink.write([rows_batch(["d", "e"])])  # not due: the file stays open
    sink._end_file()  # whole, as a driver killed before its commit leaves it
    sink.write([rows_batch(["f"])])
    sink.abort()  # the open file's upload is aborted
    table.refresh()
    assert [c.commit_id for c in iceberg_catalog.snapshot_summaries(table)] == ["r2/00000-00000"]
    files = iceberg_run.run_files(client, table, "r2")
    assert sorted(files) == [0, 1] and iceberg_run.committed_indices(table, "r2") == {0}


def test_rescored_keys_new_rows_replace_their_error_rows_in_one_commit_other_nulls_kept(sink_table):
    import pyarrow.parquet as pq

    client, table = sink_table
    first = rows_batch(["a"])
    failed = classify.TASK.results()
    for key in ("b", "c"):
        failed.fail(key, {"stage": "decode", "type": "OSError", "message": "bad"})
    sink = iceberg_run.TableSink(client, table, iceberg_run.RunFiles("r3", rows_per_file=100), commit_seconds=3600)
    sink.write([first, failed.record_batch()])
    sink.close()
    flags = np.array([True, False])  # b is rescored, d is new
    later = iceberg_run.TableSink(client, table, iceberg_run.RunFiles("r4", rows_per_file=100, rescore=flags),
                                   commit_seconds=3600)
    later.write([rows_batch(["b", "d"])])
    later.close()
    assert later.commits.replaced == 1
    rows = {r["key"]: r for r in table.scan().to_arrow().to_pylist()}
    assert sorted(rows) == ["a", "b", "c", "d"]  # every key once
    assert rows["b"]["error"] is None and rows["c"]["error"]["message"] == "bad"
    history = iceberg_catalog.snapshot_summaries(table)
    assert [c.commit_id for c in history] == ["r3/00000-00000", "r4/00000-00000"]
    assert history[-1].operation == "overwrite"
    # the copy of r3's file, written without b's error row, keeps c's null list as null (pyiceberg reads it as [])
    copies = [p for p in table.inspect.files().column("file_path").to_pylist() if "-rewrite-" in p]
    [copy] = copies
    with table.io.new_input(copy).open() as handle:
        kept = pq.read_table(handle)
    assert kept.column("key").to_pylist() == ["a", "c"] and kept.column("predictions").null_count == 1
    assert iceberg_catalog.commit_files(table, [copy], "r4", "r4/00000-00000", replace_errors_of=["c"]) is None


# ----------------------------------------------------------------------------
# Through spark-submit


@pytest.fixture(scope="module")
def runs(moto_endpoint, demo_dir, catalog_env):
    """200 keys (199 digits and a file that is no PNG) into a new table, committed a batch at a time, and the same
    job to JSON Lines; then 50 digits more with --skip-existing, a run with nothing new, and a plain run."""
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    keys = put_digits(s3, BUCKET, 0, 199)
    s3.put_object(Bucket=BUCKET, Key="imgs/bad.png", Body=b"not a png")
    env = dict(catalog_env)
    first_log = ok(spark_submit(job_args(moto_endpoint, table_uri("digits"), "--commit-seconds", "0"),
                                extra_env=env))
    first = home_summary(s3, moto_endpoint, "digits")
    ok(spark_submit(job_args(moto_endpoint, f"s3://{BUCKET}/same.jsonl"), extra_env=env))
    rows_after_first = table_rows(moto_endpoint, "digits")
    history_after_first = iceberg_catalog.snapshot_summaries(load(moto_endpoint, "digits"))
    keys = sorted([*keys, "imgs/bad.png", *put_digits(s3, BUCKET, 199, 50)])
    second_log = ok(spark_submit(job_args(moto_endpoint, table_uri("digits"), "--skip-existing"), extra_env=env))
    second = home_summary(s3, moto_endpoint, "digits")
    third = spark_submit(job_args(moto_endpoint, table_uri("digits"), "--skip-existing"), extra_env=env)
    plain = spark_submit(job_args(moto_endpoint, table_uri("digits")), extra_env=env)
    return {"s3": s3, "endpoint": moto_endpoint, "env": env, "keys": keys, "first": first, "first_log": first_log,
            "rows_after_first": rows_after_first, "history_after_first": history_after_first,
            "second": second, "second_log": second_log, "third": third, "plain": plain}


def jsonl_rows(s3, key: str) -> list[dict]:
    lines = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda row: row["key"])


@pytest.mark.spark
def test_the_table_holds_the_same_rows_as_the_json_lines_of_the_same_job(runs):
    rows, lines = runs["rows_after_first"], jsonl_rows(runs["s3"], "same.jsonl")
    assert [row["key"] for row in rows] == [line["key"] for line in lines] and len(rows) == 200
    for row, line in zip(rows, lines):
        if line.get("error"):
            assert (row["error"]["message"], row["error"]["stage"]) == (line["error"]["message"],
                                                                        line["error"]["stage"])
            # pyiceberg 0.10 reads the file's null list back as [] (apache/iceberg-python#3833)
            assert row["predictions"] in (None, [])
        else:
            assert row["error"] is None
            assert [(p["class_id"], p["label"]) for p in row["predictions"]] == [
                (p["class_id"], p["label"]) for p in line["predictions"]]
            assert [p["probability"] for p in row["predictions"]] == pytest.approx(
                [p["probability"] for p in line["predictions"]], abs=1e-6)


@pytest.mark.spark
def test_each_commit_of_the_first_run_carries_its_run_id_once(runs):
    first, history = runs["first"], runs["history_after_first"]
    table = first["table"]
    ours = [c for c in history if c.run_id == table["run"]]
    assert [c.snapshot_id for c in ours] == table["snapshot_ids"] and len(ours) == table["commits"]
    assert table["commits"] >= -(-200 // BATCH)  # --commit-seconds 0: a commit for every batch merged
    assert len({c.commit_id for c in ours}) == len(ours)
    assert sum(c.added_records for c in ours) == table["rows"] == 200
    assert sum(c.added_files for c in ours) == table["files"]
    assert first["predicted"] == 199 and first["failed"] == 1 and first["output"] == table_uri("digits")


@pytest.mark.spark
def test_fifty_new_images_alone_are_scored_into_the_table_then_nothing(runs):
    second = runs["second"]
    assert second["scored"] == 50 and second["keys_listed"] == 250
    assert second["existing"]["skipped"] == 200 and second["existing"]["new_keys"] == 50
    assert second["existing"]["rows_read"] == 200
    rows = table_rows(runs["endpoint"], "digits")
    assert [row["key"] for row in rows] == runs["keys"]  # every key once
    log_text = ok(runs["third"])
    assert "nothing new to score: all 250 listed keys have a row" in log_text
    assert len(table_rows(runs["endpoint"], "digits")) == 250


@pytest.mark.spark
def test_spark_with_icebergs_own_runtime_reads_the_jobs_table_as_pyiceberg_does(runs, catalog_env):
    """An independent reader: the stack's Spark (3.5 or 4.0) with its iceberg-spark-runtime, through a JDBC catalog
    over the same SQLite file (demo/iceberg_spark.py, make iceberg-spark), counts the same keys and error rows and
    the same commits."""
    from demo import iceberg_spark

    uri = catalog_env[f"PYICEBERG_CATALOG__{CATALOG.upper()}__URI"]
    seen = iceberg_spark.spark_read(uri[len("sqlite:///"):], f"s3://{BUCKET}/warehouse", runs["endpoint"],
                                    "preds.digits", keys=True)
    table = load(runs["endpoint"], "digits")
    keys = iceberg_catalog.existing_keys(table).to_pylist()
    scored = set(iceberg_catalog.existing_keys(table, with_errors=False).to_pylist())
    assert (seen["rows"], seen["distinct_keys"]) == (len(keys), len(set(keys))) == (250, 250)
    assert seen["keys"] == sorted(keys) and seen["error_keys"] == sorted(set(keys) - scored) == ["imgs/bad.png"]
    ours = [(c.snapshot_id, c.run_id, c.commit_id) for c in iceberg_catalog.snapshot_summaries(table)]
    assert [(s["snapshot_id"], s["run_id"], s["commit_id"]) for s in seen["snapshots"]] == ours
    assert seen["null_keys"]["predictions"] == ["imgs/bad.png"]  # the error row's null list, as written


@pytest.mark.spark
def test_a_run_that_would_write_every_key_again_is_refused(runs):
    plain = runs["plain"]
    assert plain.returncode == 1, (plain.stdout + plain.stderr)[-3000:]
    assert "holds 250 rows already" in plain.stdout + plain.stderr and "--skip-existing" in plain.stdout + plain.stderr


@pytest.mark.spark
def test_a_driver_killed_after_some_commits_is_finished_by_resume_every_key_once(runs):
    endpoint, env = runs["endpoint"], runs["env"]
    args = ["--commit-seconds", "0", "--io-threads", "1"]
    with FaultProxy(endpoint, latency=0.05) as proxy:
        process = start_spark_submit([*job_args(proxy.endpoint, table_uri("killed")), *args], extra_env=env)
        deadline, commits = time.time() + 300, []
        while time.time() < deadline and process.poll() is None:
            try:
                commits = iceberg_catalog.snapshot_summaries(load(endpoint, "killed"))
            except Exception:  # noqa: BLE001 - not created yet
                commits = []
            if len(commits) >= 2:
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.1)
        output, _ = process.communicate(timeout=120)
    assert len(commits) >= 2, f"the run ended before it could be killed part-way: {output[-3000:]}"
    killed_rows = table_rows(endpoint, "killed")
    assert 0 < len(killed_rows) < 250 and len({r["key"] for r in killed_rows}) == len(killed_rows)
    ok(spark_submit([*job_args(endpoint, table_uri("killed")), *args, "--resume"], extra_env=env))
    rows = table_rows(endpoint, "killed")
    assert [row["key"] for row in rows] == runs["keys"]  # every key once
    table = load(endpoint, "killed")
    history = [c for c in iceberg_catalog.snapshot_summaries(table) if c.run_id]
    assert len({c.run_id for c in history}) == 1 and len({c.commit_id for c in history}) == len(history)
    files = table.inspect.files().column("file_path").to_pylist()
    assert len(files) == len(set(files)) == sum(c.added_files for c in history)
    summary = home_summary(runs["s3"], endpoint, "killed")
    assert summary["resumed"] is True and summary["table"]["resumed"]["run"] == history[0].run_id
    bucket, folder = iceberg_run.data_path(table).split("://", 1)[1].split("/", 1)
    assert not runs["s3"].list_multipart_uploads(Bucket=bucket, Prefix=folder).get("Uploads")  # none left open


@pytest.mark.spark
def test_a_file_uploaded_but_not_committed_when_the_driver_died_is_committed_once_on_resume(runs):
    endpoint, env, s3 = runs["endpoint"], runs["env"], runs["s3"]
    uploaded, holding, release = threading.Event(), threading.Event(), threading.Event()

    def hold_commit(method: str, path: str) -> bool:
        """Let the run's data files through; hold the first metadata write after one (its commit) until killed."""
        if "/between/data/mxinfer-" in path:
            uploaded.set()
        elif uploaded.is_set() and method in ("PUT", "POST") and "/between/metadata/" in path:
            holding.set()
            release.wait(120)
            return True
        return False

    with FaultProxy(endpoint, deny=hold_commit) as proxy:
        process = start_spark_submit([*job_args(proxy.endpoint, table_uri("between")), "--commit-seconds", "0"],
                                     extra_env=env)
        held = holding.wait(300)
        if held:
            os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate(timeout=120)
        release.set()
    assert held, f"the run never reached a commit: {output[-3000:]}"
    table = load(endpoint, "between")
    assert not table.scan().to_arrow().num_rows  # killed before its first commit
    data = iceberg_run.data_path(table)
    bucket, folder = data.split("://", 1)[1].split("/", 1)
    left = [key for key, _ in parallel_list.list_objects(s3, bucket, folder + "/mxinfer-")]
    assert left, "no data file was uploaded before the kill"
    ok(spark_submit([*job_args(endpoint, table_uri("between")), "--commit-seconds", "0", "--resume"], extra_env=env))
    summary = home_summary(s3, endpoint, "between")
    assert summary["table"]["resumed"]["files_committed_on_resume"] == len(left)
    table = load(endpoint, "between")
    files = table.inspect.files().column("file_path").to_pylist()
    assert Counter(files).most_common(1)[0][1] == 1
    assert all(f"s3://{bucket}/{key}" in files for key in left)  # the same files, committed once
    assert [row["key"] for row in table_rows(endpoint, "between")] == runs["keys"]


@pytest.mark.spark
def test_another_fingerprint_is_refused_before_spark_unless_accepted(runs):
    endpoint, env, s3 = runs["endpoint"], runs["env"], runs["s3"]
    (_, _), (test_x, _) = make_demo.digits_split()
    for i in range(4):
        s3.put_object(Bucket=BUCKET, Key=f"more/{i}.png", Body=make_demo.digit_png(test_x[i]))
    more = ["--input", f"s3://{BUCKET}/more/"]
    ok(spark_submit([*job_args(endpoint, table_uri("fp")), *more], extra_env=env))
    for i in range(4, 6):  # new keys: the next run has work to do, and its model is checked
        s3.put_object(Bucket=BUCKET, Key=f"more/{i}.png", Body=make_demo.digit_png(test_x[i]))
    refused = spark_submit([*job_args(endpoint, table_uri("fp")), *more, "--skip-existing", "--top-k", "3"],
                           extra_env=env)
    text = refused.stdout + refused.stderr
    assert refused.returncode == 1 and "holds rows of another model or settings" in text, text[-3000:]
    assert "top_k" in text and "--accept-other-fingerprint" in text
    assert "Running Spark version" not in text  # refused before Spark started
    other = spark_submit([*job_args(endpoint, table_uri("fp")), *more, "--skip-existing", "--with-object-metadata"],
                         extra_env=env)
    text = other.stdout + other.stderr
    assert other.returncode == 1 and "has other columns than this run writes" in text, text[-3000:]
    assert "etag" in text and "Running Spark version" not in text
    ok(spark_submit([*job_args(endpoint, table_uri("fp")), *more, "--skip-existing", "--top-k", "3",
                     "--accept-other-fingerprint"], extra_env=env))
    assert [row["key"] for row in table_rows(endpoint, "fp")] == [f"more/{i}.png" for i in range(6)]


@pytest.mark.spark
def test_rescore_errors_replaces_the_error_row_of_a_key_scored_again(runs):
    """Last: imgs/bad.png becomes a real PNG; --rescore-errors scores it again, and its new row replaces the error
    row in the same commit."""
    endpoint, env, s3 = runs["endpoint"], runs["env"], runs["s3"]
    (_, _), (test_x, _) = make_demo.digits_split()
    s3.put_object(Bucket=BUCKET, Key="imgs/bad.png", Body=make_demo.digit_png(test_x[0]))
    ok(spark_submit(job_args(endpoint, table_uri("digits"), "--skip-existing", "--rescore-errors"), extra_env=env))
    summary = home_summary(s3, endpoint, "digits")
    assert summary["scored"] == 1 and summary["existing"]["rescored_errors"] == 1
    assert summary["table"]["error_rows_replaced"] == 1
    rows = table_rows(endpoint, "digits")
    assert [row["key"] for row in rows] == runs["keys"]  # every key once
    fixed = next(row for row in rows if row["key"] == "imgs/bad.png")
    assert fixed["error"] is None and fixed["predictions"]
