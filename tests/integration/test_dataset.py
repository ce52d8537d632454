"""A Parquet dataset output through spark-submit: read while the job runs, after a SIGKILL, and after --resume.

A dataset read with pyarrow.dataset while the job runs and after its driver
is SIGKILLed sees whole rows only and no key twice; ``--resume`` finishes it,
keeping the files already written, and its rows equal the single Parquet
object's. The sink, the refusals and a dry run are tested without Spark in
``tests/unit/outputs/test_dataset.py``.
"""

from __future__ import annotations

import io
import json
import os
import signal
import time

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from demo.s3proxy import S3Proxy
from mxjob.reporting import record_fields, records
from mxjob.s3 import parallel_list
from tests.support import dataset_job
from tests.support.dataset_job import BUCKET, ROWS_PER_FILE, job_args
from tests.support.helpers import spark_submit, start_spark_submit

# The fixtures shared with tests/unit/outputs/test_dataset.py, bound here for pytest to find.
s3 = dataset_job.s3
world = dataset_job.world


def read_dataset(endpoint: str, prefix: str) -> pa.Table:
    """The dataset as a reader sees it now: pyarrow.dataset over the prefix (hidden ``_`` names skipped)."""
    fs = pafs.S3FileSystem(endpoint_override=endpoint, access_key="testing", secret_key="testing",
                           region="us-east-1", scheme="http")
    return ds.dataset(f"{BUCKET}/{prefix}", format="parquet", filesystem=fs).to_table()


def assert_whole_rows_once(table: pa.Table, keys: list[str]) -> None:
    got = table.column("key").to_pylist()
    assert len(got) == len(set(got)), "a key twice"
    assert set(got) <= set(keys)
    assert got == keys[:len(got)]  # files are whole and in key order: a prefix of the key list


@pytest.mark.spark
def test_a_dataset_read_while_running_after_a_kill_and_after_resume(s3, world):
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    with S3Proxy(world["endpoint"], latency=0.05) as proxy:
        process = start_spark_submit(job_args(proxy.endpoint, "live/", "--io-threads", "1"))
        seen, deadline = [], time.time() + 300
        while time.time() < deadline and process.poll() is None:
            files = [k for k, _ in parallel_list.list_objects(s3, BUCKET, "live/part-")]
            if files and not seen:
                seen.append(read_dataset(world["endpoint"], "live/"))  # while the job runs
            if len(files) >= 2:
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        process.communicate(timeout=120)
    assert seen and 0 < seen[0].num_rows < len(world["keys"])
    assert_whole_rows_once(seen[0], world["keys"])
    after_kill = read_dataset(world["endpoint"], "live/")
    assert_whole_rows_once(after_kill, world["keys"])
    assert after_kill.num_rows % ROWS_PER_FILE == 0 and after_kill.num_rows >= 2 * ROWS_PER_FILE
    kept = {k: s3.head_object(Bucket=BUCKET, Key=k)["ETag"]
            for k, _ in parallel_list.list_objects(s3, BUCKET, "live/part-")}

    result = spark_submit(job_args(world["endpoint"], "live/", "--resume"))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    final = read_dataset(world["endpoint"], "live/")
    assert final.column("key").to_pylist() == world["keys"]
    assert {k: s3.head_object(Bucket=BUCKET, Key=k)["ETag"] for k in kept} == kept  # not written again
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key="live/_summary.json")["Body"].read())
    record_fields.from_json(records.Summary, summary)  # a resumed dataset run's: its dataset entry too
    assert summary["resumed"] is True and summary["dataset"]["kept_from_an_earlier_run"] == len(kept)
    assert summary["dataset"]["files"] == -(-len(world["keys"]) // ROWS_PER_FILE)
    success = json.loads(s3.get_object(Bucket=BUCKET, Key="live/_SUCCESS")["Body"].read())
    assert success["rows"] == len(world["keys"])
    assert not list(parallel_list.list_objects(s3, BUCKET, "live/_parts/"))

    # The same job to one Parquet object: the same rows.
    single = spark_submit(job_args(world["endpoint"], "one.parquet"))
    assert single.returncode == 0, (single.stdout + single.stderr)[-3000:]
    one = pq.read_table(io.BytesIO(s3.get_object(Bucket=BUCKET, Key="one.parquet")["Body"].read()))
    assert final.select(one.column_names).to_pylist() == one.to_pylist()
    assert final.filter(pa.compute.is_valid(final.column("error"))).column("key").to_pylist() == ["imgs/bad.png"]
