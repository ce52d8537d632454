"""The output's lease (mxjob.outputs.lease) on the moto server: taken once with If-None-Match, renewed with If-Match,
refused while live, taken over once expired or by the same YARN application, lost when another takes it; and the job
refused by another run's live lease before it writes anything, whatever the flags and the kind of output.

The job's runs here end before their plan (a fake model, never loaded); tests/integration/test_lease.py runs two
real jobs at once through spark-submit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import infer_main
from mxjob.core.errors import EXIT_FAILED
from mxjob.outputs import lease as leases
from tests.support.helpers import put_fake_model

BUCKET = "lease-bucket"


def a_lease(s3, key: str, run_id: str, application: str | None = None, seconds: float = leases.LEASE_SECONDS):
    holder = leases.holder_facts(run_id, f"s3://{BUCKET}/out.jsonl", application, 2 if application else 1)
    return leases.Lease(s3, BUCKET, key, holder, seconds=seconds)


def held_by(s3, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def test_the_first_run_takes_the_lease_and_names_itself(moto_buckets):
    first = a_lease(moto_buckets, "a/out.jsonl.lease.json", "first")
    first.take(resume=False, output_uri="s3://b/out.jsonl")
    doc = held_by(moto_buckets, "a/out.jsonl.lease.json")
    assert doc["run_id"] == "first" and doc["host"] and doc["pid"] > 0
    assert doc["expires"] - doc["renewed"] == pytest.approx(leases.LEASE_SECONDS)


def test_a_second_run_is_refused_with_whose_lease_it_is_and_what_to_do(moto_buckets):
    key = "b/out.jsonl.lease.json"
    first = a_lease(moto_buckets, key, "first")
    first.take(resume=False, output_uri="s3://b/out.jsonl")
    second = a_lease(moto_buckets, key, "second")
    with pytest.raises(leases.LeaseHeld) as refused:
        second.take(resume=False, output_uri="s3://b/out.jsonl")
    message = str(refused.value)
    assert "run first on host" in message and "This run wrote nothing" in message
    assert "make watch OUTPUT=s3://b/out.jsonl" in message
    assert "--overwrite" not in message  # the advice that broke the live run is gone
    with pytest.raises(leases.LeaseHeld, match=r"expires in \d+ s without renewal, and --resume then takes it over"):
        second.take(resume=True, output_uri="s3://b/out.jsonl")
    assert held_by(moto_buckets, key)["run_id"] == "first"  # the refused run changed nothing
    first.check()  # and the first run's lease is still its own


def test_an_expired_lease_is_taken_over_and_its_old_holder_stops(moto_buckets):
    key = "c/out.jsonl.lease.json"
    dead = a_lease(moto_buckets, key, "dead", seconds=0.5)
    dead.take(resume=False, output_uri="s3://b/out.jsonl")
    time.sleep(0.6)
    nxt = a_lease(moto_buckets, key, "next")
    nxt.take(resume=True, output_uri="s3://b/out.jsonl")
    assert held_by(moto_buckets, key)["run_id"] == "next"
    assert dead.renew() is False and "taken over or deleted" in dead.lost and "run next" in dead.lost
    with pytest.raises(leases.LeaseLost, match="publishes nothing"):
        dead.check()
    dead.release()  # no longer its own: the next run's lease stays
    assert held_by(moto_buckets, key)["run_id"] == "next"


def test_of_two_runs_taking_over_an_expired_lease_at_once_exactly_one_holds_it(moto_buckets):
    key = "d/out.jsonl.lease.json"
    dead = a_lease(moto_buckets, key, "dead", seconds=0.2)
    dead.take(resume=False, output_uri="s3://b/out.jsonl")
    time.sleep(0.3)
    racers = {name: a_lease(moto_buckets, key, name) for name in ("x", "y")}

    def take(racer):
        try:
            racer.take(resume=True, output_uri="s3://b/out.jsonl")
        except leases.LeaseHeld:
            racer.lost = "refused"

    threads = [threading.Thread(target=take, args=(racer,)) for racer in racers.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    holding = []
    for name, racer in racers.items():
        try:
            racer.check()
            holding.append(name)
        except leases.LeaseLost:
            pass
    assert holding == [held_by(moto_buckets, key)["run_id"]]


def test_a_lease_whose_process_on_this_host_is_gone_is_taken_over_at_once(moto_buckets):
    key = "h/out.jsonl.lease.json"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = a_lease(moto_buckets, key, "killed")
    dead.holder["pid"] = int(gone.stdout)  # a driver SIGKILLed a moment ago, its lease fresh
    dead.take(resume=False, output_uri="s3://b/out.jsonl")
    alive = a_lease(moto_buckets, "h2/out.jsonl.lease.json", "alive")
    alive.holder["pid"] = os.getppid()  # a live process on this host: its lease stands
    alive.take(resume=False, output_uri="s3://b/out.jsonl")
    nxt = a_lease(moto_buckets, key, "next")
    nxt.take(resume=True, output_uri="s3://b/out.jsonl")
    assert held_by(moto_buckets, key)["run_id"] == "next"
    with pytest.raises(leases.LeaseHeld):
        a_lease(moto_buckets, "h2/out.jsonl.lease.json", "other").take(resume=True, output_uri="s3://b/out.jsonl")


def test_yarns_next_attempt_takes_over_its_own_applications_lease_at_once(moto_buckets):
    key = "e/out.jsonl.lease.json"
    first = a_lease(moto_buckets, key, "attempt-1", application="application_1_0007")
    first.take(resume=False, output_uri="s3://b/out.jsonl")
    other = a_lease(moto_buckets, key, "other", application="application_1_0008")
    with pytest.raises(leases.LeaseHeld):
        other.take(resume=True, output_uri="s3://b/out.jsonl")
    second = a_lease(moto_buckets, key, "attempt-2", application="application_1_0007")
    second.take(resume=False, output_uri="s3://b/out.jsonl")
    assert held_by(moto_buckets, key)["run_id"] == "attempt-2"


def test_renewal_moves_the_expiry_and_release_deletes_only_its_own(moto_buckets):
    key = "f/out.jsonl.lease.json"
    mine = a_lease(moto_buckets, key, "mine")
    mine.take(resume=False, output_uri="s3://b/out.jsonl")
    before = held_by(moto_buckets, key)["expires"]
    time.sleep(0.05)
    assert mine.renew() is True and mine.renewals == 1
    assert held_by(moto_buckets, key)["expires"] > before
    mine.check()
    mine.release()
    assert "Contents" not in moto_buckets.list_objects_v2(Bucket=BUCKET, Prefix="f/")


def test_the_heartbeat_renews_until_stopped(moto_buckets):
    key = "g/out.jsonl.lease.json"
    mine = a_lease(moto_buckets, key, "mine")
    mine.take(resume=False, output_uri="s3://b/out.jsonl")
    mine.keep_renewed(every=0.05)
    time.sleep(0.4)
    mine.release()
    assert mine.renewals >= 2
    assert "Contents" not in moto_buckets.list_objects_v2(Bucket=BUCKET, Prefix="g/")


# ----------------------------------------------------------------------------
# The job, refused by a live lease


@pytest.fixture(scope="module")
def world(moto_buckets):
    """A fake model (looked for, never loaded), one image, and per output an earlier run's files and a live lease."""
    put_fake_model(moto_buckets, BUCKET)
    moto_buckets.put_object(Bucket=BUCKET, Key="imgs/0.png", Body=b"not read")
    return moto_buckets


def everything(s3, prefix: str) -> dict[str, bytes]:
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: s3.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in listed}


def live_run_on(s3, output: str, lease_key: str) -> None:
    """What a live run has written so far: its status, its progress, and its lease, renewed a moment ago."""
    home = lease_key.rsplit("lease.json", 1)[0]
    s3.put_object(Bucket=BUCKET, Key=f"{home}status.json", Body=b'{"state": "running"}\n')
    s3.put_object(Bucket=BUCKET, Key=f"{home}parts/job.json", Body=b"{}")
    s3.delete_object(Bucket=BUCKET, Key=lease_key)  # the last test's
    live = a_lease(s3, lease_key, "live-run")
    live.take(resume=False, output_uri=output)


@pytest.mark.parametrize(("output", "lease_key"), [
    ("two/out.jsonl", "two/out.jsonl.lease.json"),
    ("two-set/", "two-set/_lease.json"),
])
@pytest.mark.parametrize("flags", [(), ("--overwrite", "--top-k", "3"), ("--resume",), ("--skip-existing",),
                                   ("--dry-run",)])
def test_a_run_on_a_leased_output_is_refused_before_it_writes_anything(world, moto_endpoint, stderr_runner, output,
                                                                       lease_key, flags):
    if "--skip-existing" in flags and not output.endswith("/"):
        flags = ("--resume",)  # --skip-existing adds rows to a dataset only
    uri = f"s3://{BUCKET}/{output}"
    prefix = output.rstrip("/").rsplit("/", 1)[0] + "/"
    live_run_on(world, uri, lease_key)
    before = everything(world, prefix)
    result = stderr_runner.invoke(infer_main.main, [
        "--endpoint-url", moto_endpoint, "--model", f"s3://{BUCKET}/model/fake", "--input", f"s3://{BUCKET}/imgs/",
        "--output", uri, *flags])
    assert result.exit_code == EXIT_FAILED, result.stderr
    error = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and f"{uri} is being written by another run: run live-run on host" in error[0]
    assert "make watch OUTPUT=" in error[0] and "--overwrite" not in error[0]
    if "--resume" in flags:
        assert "without renewal, and --resume then takes it over" in error[0]
    assert "listing" not in result.stderr.lower()  # refused before the listing
    assert everything(world, prefix) == before  # no status, report, lease or work written, nothing removed
