"""The status file beside the output is the run's from the moment the run may write the output
(mxjob/reporting/status.py).

Against the session's moto server, without Spark: each run here fails
before its plan, where the model's files are only looked for (HEAD), so
two empty objects stand in for the model.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

import infer_main
from mxjob.core.errors import EXIT_FAILED, JobError
from mxjob.executor.stats import StatsFold
from mxjob.outputs import work_prefix
from mxjob.reporting import record_fields, records, report, status, watch
from mxjob.reporting.progress import Progress, Tick
from mxjob.run.signals import Interrupted
from mxjob.s3 import parallel_list
from tests.support.helpers import put_fake_model

BUCKET = "status-bucket"
MODEL = f"s3://{BUCKET}/model/fake"

#: The earlier run's last word: what an output that exists has beside it.
EARLIER = {"state": "succeeded", "exit_code": 0, "updated": 1.0, "elapsed_seconds": 30.0,
           "keys": {"done": 5, "total": 5}, "batches": {"done": 1, "total": 1}}


@pytest.fixture(scope="module")
def world(moto_buckets):
    """The fake model and one image (never read: the runs here end before the model is loaded)."""
    put_fake_model(moto_buckets, BUCKET)
    moto_buckets.put_object(Bucket=BUCKET, Key="imgs/0.png", Body=b"not read")
    return moto_buckets


def finished_output(s3, prefix: str) -> bytes:
    """An output under ``prefix`` as a run that succeeded left it; returns its status's bytes."""
    body = (json.dumps(EARLIER, indent=1) + "\n").encode()
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl", Body=b'{"key": "imgs/0.png"}\n')
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.summary.json", Body=b"{}\n")
    s3.put_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.status.json", Body=body)
    return body


def read_status(s3, prefix: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.status.json")["Body"].read())


def run(runner, endpoint: str, prefix: str, *args: str, model: str = MODEL, image_prefix: str = "imgs/"):
    return runner.invoke(infer_main.main, ["--endpoint-url", endpoint, "--model", model,
                                           "--input", f"s3://{BUCKET}/{image_prefix}",
                                           "--output", f"s3://{BUCKET}/{prefix}/out.jsonl", *args])


def test_a_run_that_fails_before_its_plan_leaves_a_failed_status_with_the_reason(world, moto_endpoint,
                                                                                 stderr_runner):
    result = run(stderr_runner, moto_endpoint, "empty", image_prefix="nothing/")
    assert result.exit_code == EXIT_FAILED, result.stderr
    doc = read_status(world, "empty")
    record_fields.from_json(records.Status, doc)  # a run's last status before its plan: the declared fields
    assert doc["state"] == "failed" and doc["exit_code"] == EXIT_FAILED
    assert doc["message"].startswith(f"no images under s3://{BUCKET}/nothing/")
    assert doc["stage"] == "listing"  # where it failed
    assert "keys" not in doc and "batches" not in doc  # nothing was planned, so no counts
    assert doc["resume_command"]  # as a failed run's status always does
    # The report beside it says the same run's state.
    page = world.get_object(Bucket=BUCKET, Key="empty/out.jsonl.report.html")["Body"].read().decode()
    assert "failed" in page


@pytest.mark.parametrize(("prefix", "args", "code", "said"), [
    ("kept-refused", (), EXIT_FAILED, "already exists; add --overwrite"),
    ("kept-resume", ("--resume", "--model", f"s3://{BUCKET}/model/missing"), 0, None),
    ("kept-dry", ("--overwrite", "--dry-run", "--model", f"s3://{BUCKET}/model/missing"), EXIT_FAILED,
     "model file missing"),
], ids=["existing-output-refused", "resume-of-a-complete-output", "dry-run"])
def test_a_run_that_may_not_replace_the_output_leaves_the_earlier_status_untouched(world, moto_endpoint,
                                                                                  stderr_runner, prefix, args,
                                                                                  code, said):
    # A refused output's status is the run's that wrote it; a --resume of a complete output has nothing to
    # resume and ends at once, before even the model's check; a dry run leaves nothing behind.
    before = finished_output(world, prefix)
    result = run(stderr_runner, moto_endpoint, prefix, *args)
    assert result.exit_code == code, result.stderr
    assert said is None or said in result.stderr  # a complete output's resume logs, and prints no Error line
    assert world.get_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.status.json")["Body"].read() == before
    assert "Contents" not in world.list_objects_v2(Bucket=BUCKET, Prefix=f"{prefix}/out.jsonl.report.html")


def test_an_overwrite_that_fails_on_the_model_replaces_the_earlier_succeeded_status(world, moto_endpoint,
                                                                                   stderr_runner):
    finished_output(world, "rerun-model")
    result = run(stderr_runner, moto_endpoint, "rerun-model", "--overwrite", model=f"s3://{BUCKET}/model/missing")
    assert result.exit_code == EXIT_FAILED, result.stderr
    doc = read_status(world, "rerun-model")
    assert doc["state"] == "failed" and doc["exit_code"] == EXIT_FAILED
    assert doc["message"].startswith(f"model file missing: s3://{BUCKET}/model/missing-symbol.json")
    # The output itself is left as it was: the model check comes before anything is removed.
    assert world.get_object(Bucket=BUCKET, Key="rerun-model/out.jsonl")["Body"].read() == b'{"key": "imgs/0.png"}\n'


def stop_the_listing(world, prefix: str, monkeypatch) -> list:
    """The statuses the listing finds (it reads the status, then fails)."""
    seen = []

    def listing_that_reads_the_status(*args, **kwargs):
        seen.append(read_status(world, prefix))
        raise OSError("the listing stops here")

    monkeypatch.setattr(parallel_list, "list_prefix", listing_that_reads_the_status)
    return seen


def test_the_status_says_this_run_is_running_before_it_lists(world, moto_endpoint, stderr_runner, monkeypatch):
    prefix = "rerun-listing"
    finished_output(world, prefix)
    seen = stop_the_listing(world, prefix, monkeypatch)
    before = time.time()
    result = run(stderr_runner, moto_endpoint, prefix, "--overwrite")
    assert result.exit_code == EXIT_FAILED, result.stderr
    [early] = seen
    assert early["state"] == "running" and early["stage"] == "listing"
    assert "keys" not in early and "batches" not in early and "exit_code" not in early
    assert early["started"] >= before - 1 and early["started_iso"]  # this run's start, not the earlier run's
    assert watch.describe(early).startswith("running (listing): no batch has been scored yet")
    final = read_status(world, prefix)
    assert final["state"] == "failed" and "the listing stops here" in final["message"]


def test_a_resume_leaves_the_stopped_runs_status_until_its_plan_is_accepted(world, moto_endpoint, stderr_runner,
                                                                          monkeypatch):
    """A resume that is refused (changed settings) or fails before its plan must not replace the stopped run's
    status, report and resume command: they still say how to resume it."""
    prefix = "resume-listing"
    earlier = finished_output(world, prefix)
    world.delete_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.summary.json")
    world.delete_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl")
    world.put_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.parts/job.json", Body=b"{}")
    seen = stop_the_listing(world, prefix, monkeypatch)
    result = run(stderr_runner, moto_endpoint, prefix, "--resume")
    assert result.exit_code == EXIT_FAILED, result.stderr
    assert "the listing stops here" in result.stderr
    assert [json.dumps(doc, indent=1) + "\n" for doc in seen] == [earlier.decode()]
    assert world.get_object(Bucket=BUCKET, Key=f"{prefix}/out.jsonl.status.json")["Body"].read() == earlier


def test_the_early_status_is_running_with_no_counts():
    doc = status.status_document("running", None, None, status.RunFacts(1_700_000_000.0, {"output": "s3://b/o"},
                                                                        "x --resume"), stage="listing")
    assert doc["state"] == "running" and doc["stage"] == "listing" and doc["resume_command"] == "x --resume"
    assert not {"keys", "batches", "errors", "eta_seconds", "exit_code"} & set(doc)
    with pytest.raises(ValueError, match="stage must be one of"):
        status.status_document("running", None, None, status.RunFacts(1_700_000_000.0, {}), stage="lunch")


class Recording:
    """An S3 client that keeps each status it is given: ``(state, stage)`` in order."""

    def __init__(self):
        self.states: list[tuple] = []
        self.docs: list[dict] = []

    def put_object(self, Key, Body, **_):  # boto3's argument names
        if Key.endswith(".status.json"):
            doc = json.loads(Body)
            self.states.append((doc["state"], doc.get("stage")))
            self.docs.append(doc)


def test_a_claimed_status_is_refreshed_without_ticks_until_the_last_word(monkeypatch):
    # A listing or an int8 search of many minutes has no progress tick; watch gives up on a status that stops.
    monkeypatch.setattr(status, "STATUS_SECONDS", 0.1)
    client = Recording()
    monitor = status.RunMonitor(client, "b", "out.jsonl", time.time(), None, {})
    monitor.claim("listing")
    deadline = time.time() + 10
    while len(client.states) < 3 and time.time() < deadline:
        time.sleep(0.05)
    assert client.states[:3] == [("running", "listing")] * 3
    monitor.ended(JobError("no images under s3://b/in/"))
    written = len(client.states)
    time.sleep(0.3)  # three heartbeats' time: none may follow the last word
    monitor.close()
    assert len(client.states) == written and client.states[-1] == ("failed", "listing")


def test_an_unclaimed_monitor_leaves_the_status_to_the_run_that_wrote_it():
    client = Recording()
    monitor = status.RunMonitor(client, "b", "out.jsonl", time.time(), None, {})
    monitor.ended(JobError("s3://b/out.jsonl (or its summary) already exists; add --overwrite to replace it"))
    monitor.close()
    assert client.states == []


class Work:
    """A work prefix (:class:`work_prefix.WorkPrefix`'s ``runs``) whose run has ``done`` of its 40 batches durable, and
    its estimate's sample, kept as the run numbered after it (two batches, both durable)."""

    uri = "s3://b/out.jsonl.parts/"

    def __init__(self, done: int | None):
        self.done = done

    def runs(self) -> list:
        if self.done is None:
            raise OSError("S3 is gone")
        return [work_prefix.Run(number=1, prefix="p/", batch_size=4, batches=40, keys=160, application=None,
                                done=frozenset(range(self.done)))]


def ticked_monitor(client) -> status.RunMonitor:
    """A claimed monitor whose last progress tick said 25 of 40 batches done, with an ETA."""
    now = time.time()
    monitor = status.RunMonitor(client, "b", "out.jsonl", now - 60, "x --resume", {})
    monitor.claim("planning")
    p = Progress(now=now, batches_done=25, batches_total=40, keys_done=100, keys_total=160, first_start=now - 50)
    monitor.on_tick(StatsFold(), p, Tick(time=now, batches=25, keys=100, failed=0, recent_rate=2.0,
                                         eta_seconds=30.0, predicted_end=now + 30))
    return monitor


@pytest.mark.parametrize(("exc", "state"), [(Interrupted(signal.SIGTERM), "interrupted"),
                                            (JobError("executor lost"), "failed")])
def test_a_stopped_runs_last_status_has_the_durable_batches_of_that_moment_and_no_eta(exc, state):
    # Batches go on becoming durable after the last tick (25 here) until Spark stops: the work prefix says 32.
    client = Recording()
    monitor = ticked_monitor(client)
    assert client.docs[-1]["eta_seconds"] == 30.0  # while running, the tick's ETA
    exc.work = Work(32)  # as driver.checked_run attaches it
    monitor.ended(exc)
    monitor.close()
    doc = client.docs[-1]
    assert doc["state"] == state and doc["batches"] == {"done": 32, "total": 40}
    assert doc["keys"] == {"done": 128, "total": 160}  # the same 32 batches' keys, 4 each, not the tick's 100
    assert doc.get("eta_seconds") is None and doc.get("predicted_end_iso") is None
    assert "ETA" not in watch.describe(doc) and "32 of 40 batches, 128 of 160 images" in watch.describe(doc)
    assert report.eta_shown(doc) == f"none: the run {state}"  # never "estimating" for a run that stopped


def test_a_stopped_run_whose_work_prefix_cannot_be_read_keeps_the_ticks_count():
    client = Recording()
    monitor = ticked_monitor(client)
    exc = JobError("executor lost")
    exc.work = Work(None)  # the last word is best-effort, as every status write is
    monitor.ended(exc)
    monitor.close()
    doc = client.docs[-1]
    assert doc["state"] == "failed" and doc["batches"] == {"done": 25, "total": 40}
    assert doc.get("eta_seconds") is None
