"""The status while a real run runs, ``watch`` following it, and its report: one run through spark-submit.

On local-cluster, behind a proxy slow enough to read the status mid-run: every
status the run wrote is declared, ``watch`` exits with the job's code, the
closing lines are the run's last words, and the report's page is
self-contained, shows the summary's figures and renders in headless chromium.
The ETA, the status, the closing lines and pages of fake runs are tested
without Spark in ``tests/unit/reporting/test_report.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from mxjob.reporting import record_fields, records
from tests.support.report_page import assert_figures_match, assert_self_contained, check_in_browser, figures

SPARK_BUCKET = "report-bucket"
SPARK_IMAGES = 40


@pytest.mark.spark
def test_status_watch_and_report_of_a_real_run(tmp_path, moto_endpoint, demo_dir):
    import os
    import sys
    import time

    from demo import make_demo
    from demo.s3proxy import S3Proxy
    from tests.support.helpers import bucket_with_model, start_spark_submit

    s3 = bucket_with_model(moto_endpoint, SPARK_BUCKET, demo_dir / "model")
    (_, _), (test_x, _) = make_demo.digits_split()
    for i in range(SPARK_IMAGES):
        s3.put_object(Bucket=SPARK_BUCKET, Key=f"imgs/{i:03d}.png", Body=make_demo.digit_png(test_x[i]))
    s3.put_object(Bucket=SPARK_BUCKET, Key="imgs/bad.png", Body=b"<html>no</html>")
    output = f"s3://{SPARK_BUCKET}/out/run.jsonl"
    with S3Proxy(moto_endpoint, latency=0.05) as proxy:  # slow enough to read the status mid-run
        process = start_spark_submit([
            "--input", f"s3://{SPARK_BUCKET}/imgs/", "--model", f"s3://{SPARK_BUCKET}/model/digits",
            "--output", output, "--endpoint-url", proxy.endpoint, "--input-shape", "3,32,32", "--std", "255",
            "--batch-size", "2", "--io-threads", "1", "--progress-seconds", "1", "--max-errors", "5"])
        watcher = subprocess.Popen([sys.executable, "-m", "mxjob.reporting.watch", output, "--endpoint-url",
                                    moto_endpoint, "--every", "0.5"], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ}, cwd=str(Path(__file__).resolve().parents[2]))
        seen = []
        deadline = time.time() + 300
        while process.poll() is None and time.time() < deadline:
            try:
                seen.append(json.loads(s3.get_object(Bucket=SPARK_BUCKET, Key="out/run.jsonl.status.json")["Body"]
                                       .read()))
            except s3.exceptions.NoSuchKey:
                pass
            time.sleep(0.3)
        log, _ = process.communicate(timeout=120)
    watched, _ = watcher.communicate(timeout=120)
    assert process.returncode == 0, log[-3000:]
    running = [d for d in seen if d["state"] == "running" and "keys" in d]
    assert any(d["batches"]["done"] < d["batches"]["total"] for d in running), seen[-3:]
    # spark_submit_command is make submit's line: the status says to resume with make submit, whole.
    assert all(d["resume_command"].startswith("make submit ARGS=") and d["resume_command"].endswith("--resume'")
               for d in running)
    final = json.loads(s3.get_object(Bucket=SPARK_BUCKET, Key="out/run.jsonl.status.json")["Body"].read())
    assert (final["state"], final["exit_code"], final["keys"]["done"]) == ("succeeded", 0, SPARK_IMAGES + 1)
    for doc in [*seen, final]:  # every status the run wrote, before its plan and after: the declared fields
        record_fields.from_json(records.Status, doc)
    assert watcher.returncode == 0, watched
    assert re.search(r"running: \d+ of 21 batches", watched) and "succeeded: 21 of 21 batches" in watched
    # The closing lines are the run's last words.
    assert re.search(r"run finished: 41 keys, 40 predicted, 1 failed \(decode 1\)", log)
    assert "images/s (keys scored / Spark job wall seconds)" in log and "report:  s3://report-bucket/out/run" in log
    summ = json.loads(s3.get_object(Bucket=SPARK_BUCKET, Key="out/run.jsonl.summary.json")["Body"].read())
    record_fields.from_json(records.Summary, summ)  # docs/output.md's table: every field declared, typed, none missing
    assert summ["rates"]["what"]["images_per_second_spark"].startswith("keys the Spark job scored / seconds of "
                                                                       "the Spark job")
    assert (summ["scored"], summ["batches"]) == (41, 21)
    page = tmp_path / "run.report.html"
    page.write_bytes(s3.get_object(Bucket=SPARK_BUCKET, Key="out/run.jsonl.report.html")["Body"].read())
    text = page.read_text()
    assert_self_contained(text)
    assert_figures_match(figures(text), summ)
    assert 'data-field="errors.decode/UnidentifiedImageError" data-value="1"' in text
    shot = check_in_browser(tmp_path, page, summ)
    shutil.copy(shot, Path("/tmp/report-real.png"))
