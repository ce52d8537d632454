"""The assembly while the Spark job runs (mxjob.assembly, merge.LiveRun), without Spark.

Parts are written by a thread of the test, as tasks would write them, while
the assembly follows the run: it merges them as they appear, gives the
output an assembly after the job would give, stops (and aborts its upload)
when the job fails, names a batch the job finished without, and falls back
to a merge after the job when the live one fails for another reason.
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from mxjob import durable, merge, partition, sinks
from mxjob.assembly import Assembly
from mxjob.s3 import access, writes
from tests.helpers import lines_part

BUCKET = "assembly-bucket"


@pytest.fixture(scope="module")
def s3(moto_buckets):
    return moto_buckets


def line(key: str, run: int) -> str:
    return json.dumps({"key": key, "predictions": [{"class_id": run, "probability": 0.5}]})


def write_part(work: durable.WorkPrefix, run: durable.Run, keys: list[str], index: int) -> None:
    """Batch ``index`` of ``run`` made durable, as its task makes it."""
    batch = keys[index * run.batch_size:(index + 1) * run.batch_size]
    work.client.put_object(Bucket=work.bucket, Key=partition.part_key(run.prefix, index),
                           Body=lines_part([line(k, run.number) for k in batch]))


class RecordingSink(sinks.JsonLinesSink):
    """The JSON Lines sink, noting when it first received rows."""

    def __init__(self, writer):
        super().__init__(writer)
        self.first_write: float | None = None
        self.aborted = False

    def write(self, batches) -> None:
        if self.first_write is None:
            self.first_write = time.monotonic()
        super().write(batches)

    def abort(self) -> None:
        self.aborted = True
        super().abort()


def merge_into(s3, work, keys, out_key, sinks: list):
    """An ``assemble(runs, live)`` for :class:`Assembly` that merges into ``out_key``; each sink made is kept."""
    def assemble(runs, live):
        sink = RecordingSink(writes.MultipartWriter(s3, BUCKET, out_key))
        sinks.append(sink)
        try:
            counts = merge.assemble(work, runs, keys, sink, live=live)
            sink.close()
        except BaseException:
            sink.abort()
            raise
        return counts
    return assemble


def read(s3, key: str) -> str:
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()


def test_the_assembly_follows_the_run_and_writes_what_an_assembly_after_it_writes(s3, monkeypatch):
    monkeypatch.setattr(merge, "WRITE_ROWS", 4)  # the sink gets rows a batch at a time, not 10,000 at a time
    keys = [f"img-{i:03d}.jpg" for i in range(40)]
    work = durable.WorkPrefix(s3, BUCKET, "live/out.jsonl")
    run = work.start_run(1, keys, 4, None)  # 10 batches
    sinks: list = []
    assembly = Assembly(merge_into(s3, work, keys, "live/out.jsonl", sinks), work, [run], during=True)
    assembly.live.poll_seconds = 0.05
    assembly.start()
    # Batches end out of order, as tasks on several executors do.
    for index in (1, 0, 2, 3, 5, 4, 6, 7, 8, 9):
        write_part(work, run, keys, index)
        time.sleep(0.05)
    job_ended = time.monotonic()
    counts = assembly.finish()
    live_text = read(s3, "live/out.jsonl")
    assert sinks[0].first_write is not None and sinks[0].first_write < job_ended  # rows merged during the run
    assert (counts.predicted, counts.parts_read) == (40, 10)
    # The same parts merged after the job give the same bytes.
    after: list = []
    again = Assembly(merge_into(s3, work, keys, "after/out.jsonl", after), work, [run], during=False)
    again.finish()
    assert read(s3, "after/out.jsonl") == live_text
    assert [json.loads(x)["key"] for x in live_text.splitlines()] == keys
    assert assembly.live.listings >= 2
    assert 0 <= assembly.live.left_at_finish < 10 and assembly.live.merged == 10  # what the tail had left to read


def test_a_resume_follows_the_new_run_and_merges_the_earlier_ones(s3):
    keys = [f"k{i:02d}" for i in range(12)]
    work = durable.WorkPrefix(s3, BUCKET, "resume/out.jsonl")
    first = work.start_run(1, keys, 3, None)
    for index in (0, 2):  # k00-k02 and k06-k08 durable; the driver died
        write_part(work, first, keys, index)
    todo = keys[3:6] + keys[9:]
    second = work.start_run(2, todo, 2, None)
    sinks: list = []
    assembly = Assembly(merge_into(s3, work, keys, "resume/out.jsonl", sinks), work, [*work.runs()[:1], second],
                        during=True)
    assembly.live.poll_seconds = 0.05
    assembly.start()
    for index in range(3):
        write_part(work, second, todo, index)
    counts = assembly.finish()
    rows = [json.loads(x) for x in read(s3, "resume/out.jsonl").splitlines()]
    assert [r["key"] for r in rows] == keys
    assert [r["predictions"][0]["class_id"] for r in rows] == [1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2]
    assert counts.parts_read == 5


def test_a_failed_job_cancels_the_assembly_which_aborts_its_upload(s3):
    keys = [f"c{i}" for i in range(8)]
    work = durable.WorkPrefix(s3, BUCKET, "cancel/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    sinks: list = []
    assembly = Assembly(merge_into(s3, work, keys, "cancel/out.jsonl", sinks), work, [run], during=True)
    assembly.live.poll_seconds = 0.05
    assembly.start()
    write_part(work, run, keys, 0)  # then the job fails: batches 1-3 never come
    time.sleep(0.3)
    assembly.cancel()
    assert sinks[0].aborted
    assert not access.object_exists(s3, BUCKET, "cancel/out.jsonl")
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix="cancel/").get("Uploads")


def test_a_job_that_finished_without_a_batch_names_it(s3):
    keys = [f"m{i}" for i in range(6)]
    work = durable.WorkPrefix(s3, BUCKET, "missing/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    write_part(work, run, keys, 0)
    write_part(work, run, keys, 2)
    assembly = Assembly(merge_into(s3, work, keys, "missing/out.jsonl", []), work, [run], during=True)
    assembly.live.poll_seconds = 0.05
    assembly.start()
    with pytest.raises(durable.ResumeError, match=r"batch 1 has no part under s3://assembly-bucket/missing/"):
        assembly.finish()
    assert not access.object_exists(s3, BUCKET, "missing/out.jsonl")


def test_a_live_assembly_that_fails_otherwise_is_done_again_after_the_job(s3):
    keys = [f"f{i}" for i in range(6)]
    work = durable.WorkPrefix(s3, BUCKET, "fallback/out.jsonl")
    run = work.start_run(1, keys, 3, None)
    sinks: list = []
    merge = merge_into(s3, work, keys, "fallback/out.jsonl", sinks)
    calls = []

    def flaky(runs, live):
        calls.append(live)
        if live is not None:
            raise ConnectionResetError("connection reset by peer")
        return merge(runs, live)

    assembly = Assembly(flaky, work, [run], during=True)
    assembly.start()
    for index in range(2):
        write_part(work, run, keys, index)
    counts = assembly.finish()
    assert calls[0] is assembly.live and calls[1] is None  # followed, failed, then merged after the job
    assert counts.predicted == 6
    assert [json.loads(x)["key"] for x in read(s3, "fallback/out.jsonl").splitlines()] == keys


def test_finish_before_the_last_part_is_listed_still_waits_for_nothing_more(s3):
    """The job's end wakes the assembly at once: it lists again instead of sleeping out its poll."""
    keys = [f"w{i}" for i in range(4)]
    work = durable.WorkPrefix(s3, BUCKET, "wake/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    assembly = Assembly(merge_into(s3, work, keys, "wake/out.jsonl", []), work, [run], during=True)
    assembly.live.poll_seconds = assembly.live.tail_poll_seconds = 30.0
    assembly.start()
    write_part(work, run, keys, 0)
    write_part(work, run, keys, 1)
    time.sleep(0.2)
    started = time.monotonic()
    assembly.finish()
    assert time.monotonic() - started < 5.0
    assert [json.loads(x)["key"] for x in read(s3, "wake/out.jsonl").splitlines()] == keys


def test_the_merge_lists_often_only_while_it_waits_for_one_of_the_last_batches(s3):
    keys = [f"t{i:02d}" for i in range(40)]
    work = durable.WorkPrefix(s3, BUCKET, "tail/out.jsonl")
    run = work.start_run(1, keys, 2, None)  # 20 batches: the last 8 are the tail
    live = merge.LiveRun(work, run, poll_seconds=30.0, tail_poll_seconds=0.05)
    assert live.tail_batches == 8

    def waiting_for(index: int) -> threading.Thread:
        thread = threading.Thread(target=live.ready, args=(index,), kwargs={"wait": True}, daemon=True)
        thread.start()
        time.sleep(0.3)  # it listed once, found nothing, and sleeps its poll
        write_part(work, run, keys, index)
        thread.join(timeout=3.0)
        return thread

    assert not waiting_for(15).is_alive()  # a tail batch: seen at its next listing, 0.05 s later
    early = waiting_for(3)
    assert early.is_alive()  # an early batch: the merge sleeps out its 30 s poll, whatever is written
    live.finish()  # the job's end wakes it at once
    early.join(timeout=3.0)
    assert not early.is_alive() and {3, 15} <= live.done


def test_an_upload_a_killed_driver_left_open_is_aborted_and_no_other(s3):
    work = durable.WorkPrefix(s3, BUCKET, "open/out.jsonl")
    mine = [s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
            for key in ("open/out.jsonl", "open/out.jsonl.parts/run-0001/plan.arrows")]
    other = s3.create_multipart_upload(Bucket=BUCKET, Key="open/out.jsonl.bak")["UploadId"]
    assert work.abort_uploads() == 2
    left = [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=BUCKET, Prefix="open/").get("Uploads", [])]
    assert left == [other] and not set(mine) & set(left)


def test_a_single_runs_parts_are_kept_whole_without_a_merge_row_by_row(s3, monkeypatch):
    keys = [f"p{i:03d}" for i in range(30)]
    work = durable.WorkPrefix(s3, BUCKET, "whole/out.jsonl")
    run = work.start_run(1, keys, 7, None)
    for index in range(run.batches):
        write_part(work, run, keys, index)

    def no_rows(parts):
        raise AssertionError("merged row by row")

    with monkeypatch.context() as patched:
        patched.setattr(merge, "_run_rows", no_rows)
        counts, text = assemble_after(s3, work, keys, "whole/out.jsonl")
    assert [json.loads(x)["key"] for x in text.splitlines()] == keys
    assert (counts.predicted, counts.dropped, counts.parts_read) == (30, 0, 5)


def test_a_part_that_is_not_the_listings_next_keys_goes_row_by_row_from_there(s3):
    scored = [f"q{i:02d}" for i in range(12)]
    work = durable.WorkPrefix(s3, BUCKET, "rows/out.jsonl")
    run = work.start_run(1, scored, 4, None)
    for index in range(run.batches):
        write_part(work, run, scored, index)
    listed = [k for k in scored if k != "q06"]  # q06 is no longer listed: its line is dropped
    counts, text = assemble_after(s3, work, listed, "rows/out.jsonl")
    assert [json.loads(x)["key"] for x in text.splitlines()] == listed
    assert (counts.predicted, counts.dropped) == (11, 1)
    with pytest.raises(durable.ResumeError, match=r"no line for key 'q99' .*\(1 keys without a line\)"):
        assemble_after(s3, work, [*scored, "q99"], "rows/missing.jsonl")


def assemble_after(s3, work, keys, out_key):
    sink = sinks.JsonLinesSink(writes.MultipartWriter(s3, BUCKET, out_key))
    try:
        counts = merge.assemble(work, work.runs(), keys, sink)
        sink.close()
    except BaseException:
        sink.abort()
        raise
    return counts, read(s3, out_key)
