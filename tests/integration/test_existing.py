"""``--skip-existing`` and ``--rescore-errors`` on a dataset output, through spark-submit.

200 images, then 50 more with ``--skip-existing`` (exactly the 50 scored,
every key once, rows equal to one run over the 250), then a run with nothing
new and its dry run; a ``--skip-existing`` run killed part-way, then resumed;
and ``--rescore-errors`` replacing an error row in the file that held it. The
filter, the refusals and two runs' files are tested without Spark in
``tests/unit/outputs/test_existing.py``.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from demo import make_demo
from demo.s3proxy import S3Proxy
from mxjob.reporting import record_fields, records, report
from mxjob.s3 import parallel_list
from tests.support.existing_dataset import BUCKET, read_dataset
from tests.support.helpers import bucket_with_model, put_digits, spark_submit, start_spark_submit

BATCH = 32
ROWS_PER_FILE = 64


def job_args(endpoint: str, output: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits", "--output",
            f"s3://{BUCKET}/{output}", "--endpoint-url", endpoint, "--input-shape", "3,32,32", "--std", "255",
            "--batch-size", str(BATCH), "--top-k", "2", "--progress-seconds", "1", "--max-errors", "1",
            "--rows-per-file", str(ROWS_PER_FILE), *extra]


def part_files(s3, prefix: str) -> dict[str, str]:
    """The dataset's files under ``prefix`` and their ETags."""
    return {key: s3.head_object(Bucket=BUCKET, Key=key)["ETag"]
            for key, _ in parallel_list.list_objects(s3, BUCKET, prefix + "part-")}


def summary_of(s3, prefix: str) -> dict:
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}_summary.json")["Body"].read())
    record_fields.from_json(records.Summary, summary)
    return summary


def ok(result) -> str:
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def incremental(moto_endpoint, demo_dir):
    """A dataset over 200 keys (199 digits and a file that is no PNG), then 50 digits more with --skip-existing,
    then a run with nothing new; and one run over the 250 to another prefix."""
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    keys = put_digits(s3, BUCKET, 0, 199)
    s3.put_object(Bucket=BUCKET, Key="imgs/bad.png", Body=b"not a png")
    ok(spark_submit(job_args(moto_endpoint, "inc/")))
    first = part_files(s3, "inc/")
    keys = sorted([*keys, "imgs/bad.png", *put_digits(s3, BUCKET, 199, 50)])
    second_log = ok(spark_submit(job_args(moto_endpoint, "inc/", "--skip-existing")))
    second = summary_of(s3, "inc/")
    after_second = part_files(s3, "inc/")
    third = spark_submit(job_args(moto_endpoint, "inc/", "--skip-existing"))
    ok(spark_submit(job_args(moto_endpoint, "fresh/")))
    return {"s3": s3, "endpoint": moto_endpoint, "keys": keys, "first": first, "second": second,
            "second_log": second_log, "after_second": after_second, "third": third}


def dataset_rows(endpoint: str, prefix: str) -> list[dict]:
    """Every row of the dataset as a reader sees it, sorted by key (rows carry no run-specific column)."""
    return sorted(read_dataset(endpoint, prefix).to_pylist(), key=lambda row: row["key"])


@pytest.mark.spark
def test_fifty_new_images_are_scored_alone_and_the_dataset_equals_one_run_over_all(incremental):
    world, s3 = incremental, incremental["s3"]
    second = world["second"]
    assert second["scored"] == 50 and second["predicted"] + second["failed"] == 50 and second["failed"] == 0
    assert second["keys_listed"] == 250 and second["reused"] == 0
    assert second["existing"]["skipped"] == 200 and second["existing"]["new_keys"] == 50
    assert second["existing"]["files_read"] == len(world["first"]) == -(-200 // ROWS_PER_FILE)
    assert second["batches"] == -(-50 // BATCH)
    assert "200 of 250 listed keys have a row" in world["second_log"]
    run = second["dataset"]["run"]
    added = {k: e for k, e in world["after_second"].items() if k not in world["first"]}
    assert sorted(added) == [f"inc/part-{run}-00000.parquet"] and second["dataset"]["files"] == 1
    assert {k: world["after_second"][k] for k in world["first"]} == world["first"]  # the first run's, untouched
    rows = dataset_rows(world["endpoint"], "inc/")
    assert [row["key"] for row in rows] == world["keys"]  # every key once
    assert rows == dataset_rows(world["endpoint"], "fresh/")  # as one run over all 250 wrote them
    success = json.loads(s3.get_object(Bucket=BUCKET, Key="inc/_SUCCESS")["Body"].read())
    assert [(r["run"], len(r["files"]), r["rows"]) for r in success["runs"]] == [
        (None, len(world["first"]), 200), (run, 1, 50)]
    assert not list(parallel_list.list_objects(s3, BUCKET, "inc/_parts/"))


@pytest.mark.spark
def test_a_run_with_nothing_new_scores_nothing_and_adds_no_file(incremental):
    world, s3 = incremental, incremental["s3"]
    log_text = ok(world["third"])
    assert "nothing new to score: all 250 listed keys have a row" in log_text
    assert part_files(s3, "inc/") == world["after_second"]  # no file added, none rewritten
    summary = summary_of(s3, "inc/")
    assert summary["scored"] == 0 and summary["spark"] is None and summary["keys_listed"] == 250
    assert summary["existing"]["skipped"] == 250 and "dataset" not in summary
    assert summary["seconds"]["model_check"] == 0  # ended after the listing: no model loaded
    status = json.loads(s3.get_object(Bucket=BUCKET, Key="inc/_status.json")["Body"].read())
    assert (status["state"], status["exit_code"]) == ("succeeded", 0)
    assert report.headline({"summary": summary, "status": status}).count('data-field="summary.existing.skipped" '
                                                                        'data-value="250"') == 1


def dry_plan(runner, endpoint: str, output: str) -> dict:
    """The plan a --skip-existing dry run prints (in this process: no Spark), checked against its schema."""
    import infer_main

    result = runner.invoke(infer_main.main, [*job_args(endpoint, output, "--skip-existing"), "--dry-run"])
    assert result.exit_code == 0, result.stderr[-2000:]
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    record_fields.from_json(records.Plan, plan)
    return plan


@pytest.mark.spark
def test_a_dry_run_says_how_many_keys_exist_and_how_many_are_new(incremental, stderr_runner):
    plan = dry_plan(stderr_runner, incremental["endpoint"], "inc/")
    assert (plan["images"], plan["to_score"], plan["batches"]) == (250, 0, 0)
    assert plan["existing"]["keys_in_output"] == 250 and plan["existing"]["new_keys"] == 0
    assert plan["first_key"] == "imgs/000.png"  # nothing new: the sample is the first key listed
    assert part_files(incremental["s3"], "inc/") == incremental["after_second"]  # a dry run writes nothing


@pytest.mark.spark
def test_a_skip_existing_run_killed_part_way_is_finished_by_resume(incremental, stderr_runner):
    world, s3 = incremental, incremental["s3"]
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    earlier = part_files(s3, "fresh/")
    keys = sorted([*world["keys"], *put_digits(s3, BUCKET, 249, 60)])
    plan = dry_plan(stderr_runner, world["endpoint"], "fresh/")
    assert (plan["images"], plan["to_score"], plan["existing"]["skipped"]) == (310, 60, 250)
    args = job_args(world["endpoint"], "fresh/", "--skip-existing", "--rows-per-file", "16", "--batch-size", "8")
    with S3Proxy(world["endpoint"], latency=0.05) as proxy:
        process = start_spark_submit([*job_args(proxy.endpoint, "fresh/", "--skip-existing", "--io-threads", "1"),
                                      "--rows-per-file", "16", "--batch-size", "8"])
        deadline = time.time() + 300
        while time.time() < deadline and process.poll() is None:
            if len(list(parallel_list.list_objects(s3, BUCKET, "fresh/part-2"))) >= 2:  # this run's files
                os.killpg(process.pid, signal.SIGKILL)
                break
            time.sleep(0.05)
        output, _ = process.communicate(timeout=120)
    killed = {k: e for k, e in part_files(s3, "fresh/").items() if k not in earlier}
    assert len(killed) >= 2, f"the run ended before it could be killed part-way: {output[-3000:]}"
    between = dataset_rows(world["endpoint"], "fresh/")
    assert len({row["key"] for row in between}) == len(between)  # never a key twice, killed or not
    assert {k: e for k, e in part_files(s3, "fresh/").items() if k in earlier} == earlier

    ok(spark_submit([*args, "--resume"]))
    rows = dataset_rows(world["endpoint"], "fresh/")
    assert [row["key"] for row in rows] == keys  # every key once
    after = part_files(s3, "fresh/")
    assert {k: after[k] for k in earlier} == earlier and {k: after[k] for k in killed} == killed
    summary = summary_of(s3, "fresh/")
    assert summary["existing"]["skipped"] == 250 and summary["resumed"] is True
    assert summary["scored"] + summary["reused"] == 60 and summary["reused"] >= 32
    assert summary["dataset"]["kept_from_an_earlier_run"] == len(killed)


@pytest.mark.spark
def test_rescore_errors_through_spark_submit_replaces_the_error_row_in_its_file(incremental):
    """After the other tests: imgs/bad.png becomes a real PNG; --rescore-errors scores it again (with any key the
    dataset lacks), and its new row takes the error row's place in the earlier file that held it."""
    world, s3 = incremental, incremental["s3"]
    (_, _), (test_x, _) = make_demo.digits_split()
    s3.put_object(Bucket=BUCKET, Key="imgs/bad.png", Body=make_demo.digit_png(test_x[0]))
    before = {row["key"]: row for row in dataset_rows(world["endpoint"], "inc/")}
    assert before["imgs/bad.png"]["error"] is not None
    listed = sorted(key for key, _ in parallel_list.list_objects(s3, BUCKET, "imgs/"))
    ok(spark_submit(job_args(world["endpoint"], "inc/", "--skip-existing", "--rescore-errors")))
    summary = summary_of(s3, "inc/")
    new = len(set(listed) - set(before))
    assert summary["existing"]["rescored_errors"] == 1 and summary["scored"] == new + 1
    rows = dataset_rows(world["endpoint"], "inc/")
    assert [row["key"] for row in rows] == listed  # every key once, the rescored one too
    fixed = next(row for row in rows if row["key"] == "imgs/bad.png")
    assert fixed["error"] is None and fixed["predictions"]
    success = json.loads(s3.get_object(Bucket=BUCKET, Key="inc/_SUCCESS")["Body"].read())
    [rewrote] = success["runs"][-1]["rewrote"]
    assert rewrote["key"] in world["first"] and rewrote["replaced"] == 1  # the first run's file, in place
