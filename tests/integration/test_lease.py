"""Two runs on one output, through spark-submit: the second is refused with no effect on the first, a run whose lease
another takes stops and publishes nothing, and a dead run's expired lease is taken over (mxjob/outputs/lease.py).

Run A scores 40 demo digits two at a time through a proxy that adds latency to every S3 request, so it is still
scoring when run B starts. B runs in this process (it is refused before it would start Spark).
"""

from __future__ import annotations

import io
import json
import time

import pyarrow.parquet as pq
import pytest

import infer_main
from demo.s3proxy import S3Proxy
from mxjob.outputs import iceberg_catalog, iceberg_run
from mxjob.outputs import lease as leases
from tests.support.helpers import bucket_with_digits, spark_submit, start_spark_submit

pytestmark = pytest.mark.spark

BUCKET = "lease-job"
IMAGES = 40
BATCH = 2


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    s3, _ = bucket_with_digits(moto_endpoint, BUCKET, demo_dir / "model", IMAGES)
    return {"s3": s3, "endpoint": moto_endpoint}


def job_args(endpoint: str, output: str, *extra: str) -> list[str]:
    """The job's options; ``output`` a key in the bucket, or a whole URI (``s3://...``, ``iceberg://...``)."""
    uri = output if "://" in output else f"s3://{BUCKET}/{output}"
    return ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
            "--output", uri, "--endpoint-url", endpoint, "--input-shape", "3,32,32",
            "--std", "255", "--batch-size", str(BATCH), "--io-threads", "1", "--progress-seconds", "1", *extra]


def wait_for_a_part(s3, work: str, process) -> None:
    """Until run 1 made a batch durable under ``work``, an output's work prefix (an object's: its key)."""
    prefix = f"{work}.parts/run-0001-" if not work.endswith("/") else f"{work}run-0001-"
    deadline = time.time() + 300
    while time.time() < deadline and process.poll() is None:
        listing = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
        if any("/part-" in obj["Key"] for obj in listing):
            return
        time.sleep(0.1)
    raise AssertionError(process.communicate()[0][-3000:] if process.poll() is not None else "no part in 300 s")


def rows(s3, output_key: str) -> list[dict]:
    body = s3.get_object(Bucket=BUCKET, Key=output_key)["Body"].read().decode()
    return [json.loads(line) for line in body.splitlines()]


def open_uploads(s3) -> list:
    return s3.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])


#: The three kinds of output: where each keeps its status and lease, and how its rows are read back.
OUTPUTS = {
    "jsonl": {"output": "two/preds.jsonl", "home": "two/preds.jsonl."},
    "dataset": {"output": "two-ds/", "home": "two-ds/_"},
    "table": {"output": "iceberg://leasecat/preds.two", "home": "warehouse/preds.db/_mxinfer/two/_"},
}


@pytest.fixture
def catalog(tmp_path, monkeypatch):
    """A SQL catalog whose warehouse is the bucket, for the spark-submit run and for this process's refused runs."""
    env = {"PYICEBERG_CATALOG__LEASECAT__URI": f"sqlite:///{tmp_path}/catalog.db",
           "PYICEBERG_CATALOG__LEASECAT__WAREHOUSE": f"s3://{BUCKET}/warehouse"}
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PYICEBERG_HOME", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    iceberg_run.state.catalogs.clear()
    return env


def output_rows(world, kind: str) -> list[dict]:
    s3, output = world["s3"], OUTPUTS[kind]["output"]
    if kind == "jsonl":
        return rows(s3, output)
    if kind == "dataset":
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=output)["Contents"]
                if o["Key"].endswith(".parquet")]
        return [row for key in keys for row in pq.read_table(io.BytesIO(
            s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())).to_pylist()]
    table = iceberg_catalog.load_catalog("leasecat", endpoint_url=world["endpoint"]).load_table("preds.two")
    return table.scan().to_arrow().to_pylist()


@pytest.mark.parametrize("kind", list(OUTPUTS))
def test_a_second_run_started_while_the_first_scores_is_refused_and_the_first_finishes_alone(world, stderr_runner,
                                                                                            catalog, kind):
    s3, output, home = world["s3"], OUTPUTS[kind]["output"], OUTPUTS[kind]["home"]
    uri = output if kind == "table" else f"s3://{BUCKET}/{output}"
    with S3Proxy(world["endpoint"], latency=0.2) as proxy:
        first = start_spark_submit(job_args(proxy.endpoint, uri, "--top-k", "2"), extra_env=catalog)
        wait_for_a_part(s3, f"{home}parts/" if kind != "jsonl" else output, first)
        status_before = s3.get_object(Bucket=BUCKET, Key=f"{home}status.json")["Body"].read()
        refusals = {}
        for flags in (("--overwrite", "--top-k", "3"), ("--resume", "--top-k", "3"), ("--skip-existing",),
                      ("--top-k", "2")):
            if (kind, flags[0]) in (("table", "--overwrite"), ("jsonl", "--skip-existing")):
                continue  # a table is added to, never overwritten; an object is not added to: usage errors
            result = stderr_runner.invoke(infer_main.main, job_args(world["endpoint"], uri, *flags))
            refusals[flags] = (result.exit_code, result.stderr)
        status_after = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{home}status.json")["Body"].read())
        output_text, _ = first.communicate(timeout=300)
    for flags, (code, stderr) in refusals.items():
        assert code == 1, (flags, stderr)
        assert "is being written by another run" in stderr and "This run wrote nothing" in stderr, (flags, stderr)
    assert first.returncode == 0, output_text[-3000:]
    # The first run's status all along: the refused runs wrote none of their own.
    assert status_after["started"] == json.loads(status_before)["started"]
    assert status_after["state"] in ("running", "succeeded")
    final = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{home}status.json")["Body"].read())
    assert final["state"] == "succeeded" and final["exit_code"] == 0
    lines = output_rows(world, kind)
    assert len(lines) == IMAGES and {len(line["predictions"]) for line in lines} == {2}  # one run's settings
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{home}summary.json")["Body"].read())
    assert summary["options"]["top_k"] == 2
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{home}lease.json").get("KeyCount") == 0  # released
    assert not open_uploads(s3)


def test_a_run_whose_lease_is_taken_over_stops_and_publishes_nothing(world):
    s3, output_key = world["s3"], "lost/preds.jsonl"
    lease_key = f"{output_key}.lease.json"
    with S3Proxy(world["endpoint"], latency=0.2) as proxy:
        run = start_spark_submit(job_args(proxy.endpoint, output_key))
        wait_for_a_part(s3, output_key, run)
        # Another run takes the lease over (as it would after the first hung past its expiry).
        other = leases.Lease(s3, BUCKET, lease_key, leases.holder_facts("other-run", "x", None, 1))
        s3.delete_object(Bucket=BUCKET, Key=lease_key)
        other.take(resume=True, output_uri="x")
        theirs = b'{"state": "running", "note": "the other run\'s"}\n'
        s3.put_object(Bucket=BUCKET, Key=f"{output_key}.status.json", Body=theirs)
        output, _ = run.communicate(timeout=300)
    assert run.returncode == 1, output[-3000:]
    [error] = [line for line in output.splitlines() if line.startswith("Error:")]
    assert "lost its lease on the output" in error and "publishes nothing" in error and "--resume" not in error
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.summary.json").get("KeyCount") == 0
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix="lost/").get("Contents", [])]
    assert output_key not in keys  # never published
    assert s3.get_object(Bucket=BUCKET, Key=f"{output_key}.status.json")["Body"].read() == theirs
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=lease_key)["Body"].read())["run_id"] == "other-run"
    assert not open_uploads(s3)
    other.release()


def test_a_dead_runs_expired_lease_is_taken_over_by_the_next_run(world):
    s3, output_key = world["s3"], "dead/preds.jsonl"
    dead = leases.Lease(s3, BUCKET, f"{output_key}.lease.json", leases.holder_facts("dead-run", "x", None, 1),
                        seconds=0.1)
    dead.take(resume=False, output_uri="x")
    time.sleep(0.2)
    result = spark_submit(job_args(world["endpoint"], output_key))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "took over the lease" in result.stderr + result.stdout and "run dead-run" in result.stderr + result.stdout
    assert len(rows(s3, output_key)) == IMAGES
    assert s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{output_key}.lease.json").get("KeyCount") == 0
