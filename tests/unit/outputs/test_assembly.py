"""The assembly while the Spark job runs (mxjob.outputs.assembly, merge.LiveRun), without Spark.

Parts are written by a thread of the test, and each task's stats applied as
the driver's accumulator server applies them, while the assembly follows the
run: it merges each part it is told of without listing, finds a part whose
notice was lost by listing, gives the output an assembly after the job would
give, stops (and aborts its upload) when the job fails, names a batch the job
finished without, and falls back to a merge after the job when the live one
fails for another reason. ``tests/integration/test_assembly.py`` runs the job
through spark-submit behind the proxy and counts its requests per batch.
"""

from __future__ import annotations

import json
import pickle
import threading
import time

import pytest

from mxjob.core import state
from mxjob.executor import partition
from mxjob.executor.stats import StatsAccumulator, StatsFold
from mxjob.outputs import jsonl, merge, work_prefix
from mxjob.outputs.assembly import Assembly
from mxjob.s3 import access, writes
from tests.support.fault_proxy import FaultProxy
from tests.support.helpers import lines_part, make_s3_client
from tests.support.request_log import RequestLog

BUCKET = "assembly-bucket"


@pytest.fixture(scope="module")
def s3(moto_buckets):
    return moto_buckets


def line(key: str, run: int) -> str:
    return json.dumps({"key": key, "predictions": [{"class_id": run, "probability": 0.5}]})


def write_part(work: work_prefix.WorkPrefix, run: work_prefix.Run, keys: list[str], index: int) -> None:
    """Batch ``index`` of ``run`` made durable, as its task makes it."""
    batch = keys[index * run.batch_size:(index + 1) * run.batch_size]
    work.client.put_object(Bucket=work.bucket, Key=partition.part_key(run.prefix, index),
                           Body=lines_part([line(k, run.number) for k in batch]))


def task_stats(param: StatsAccumulator, index: int) -> StatsFold:
    """The fold a task of batch ``index`` sends the driver: ``score_into`` adds the task's stats to the zero fold
    through the copy of ``param`` the task unpickled (PySpark pickles the accumulator's param with the task)."""
    on_executor = pickle.loads(pickle.dumps(param))
    fold = StatsFold()
    fold.tasks, fold.finished_batches = 1, [index]
    return on_executor.addInPlace(on_executor.zero(fold), fold)


def task_ends(work: work_prefix.WorkPrefix, run: work_prefix.Run, keys: list[str], index: int) -> None:
    """Batch ``index``'s task ends: its part is written, then the driver's accumulator server applies its stats."""
    write_part(work, run, keys, index)
    param = StatsAccumulator((work.bucket, run.prefix))
    param.addInPlace(StatsFold(), task_stats(param, index))


class RecordingSink(jsonl.JsonLinesSink):
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
    work = work_prefix.WorkPrefix(s3, BUCKET, "live/out.jsonl")
    run = work.start_run(1, keys, 4, None)  # 10 batches
    sinks: list = []
    assembly = Assembly(merge_into(s3, work, keys, "live/out.jsonl", sinks), work, [run], during=True)
    assembly.start()
    # Batches end out of order, as tasks on several executors do.
    for index in (1, 0, 2, 3, 5, 4, 6, 7, 8, 9):
        task_ends(work, run, keys, index)
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
    # Told of every batch, the merge never listed the run's parts.
    assert (assembly.live.listings, assembly.live.notices, assembly.live.found_by_listing) == (0, 10, 0)
    assert 0 <= assembly.live.left_at_finish < 10 and assembly.live.merged == 10  # what the tail had left to read
    assert assembly.live.key not in state.durable_batches  # the finished run is no longer followed


def test_a_resume_follows_the_new_run_and_merges_the_earlier_ones(s3):
    keys = [f"k{i:02d}" for i in range(12)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "resume/out.jsonl")
    first = work.start_run(1, keys, 3, None)
    for index in (0, 2):  # k00-k02 and k06-k08 durable; the driver died
        write_part(work, first, keys, index)
    todo = keys[3:6] + keys[9:]
    second = work.start_run(2, todo, 2, None)
    sinks: list = []
    assembly = Assembly(merge_into(s3, work, keys, "resume/out.jsonl", sinks), work, [*work.runs()[:1], second],
                        during=True)
    assembly.start()
    for index in range(3):
        task_ends(work, second, todo, index)
    counts = assembly.finish()
    rows = [json.loads(x) for x in read(s3, "resume/out.jsonl").splitlines()]
    assert [r["key"] for r in rows] == keys
    assert [r["predictions"][0]["class_id"] for r in rows] == [1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2]
    assert counts.parts_read == 5


def test_a_late_part_of_a_run_whose_output_was_taken_over_never_lands_in_the_next_runs_folder(s3):
    keys = [f"t{i}" for i in range(6)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "taken/out.jsonl")
    old = work.start_run(1, keys, 2, None, run_id="0ld0ld0ld0ld")
    write_part(work, old, keys, 0)
    work.remove()  # the run that took the expired lease over with --overwrite starts again: its run 1
    new = work.start_run(1, keys, 2, None, run_id="4ew4ew4ew4ew")
    write_part(work, old, keys, 1)  # an executor of the old run, still finishing its batch
    assert (old.prefix, new.prefix) == ("taken/out.jsonl.parts/run-0001-0ld0ld0ld0ld/",
                                        "taken/out.jsonl.parts/run-0001-4ew4ew4ew4ew/")
    [found] = work.runs()  # the old run's folder has no run.json any more: not a run
    assert (found.prefix, found.done) == (new.prefix, frozenset())
    write_part(work, new, keys, 2)
    second = work.start_run(2, keys[:4], 2, None, run_id="r3sum3r3sum3")  # a resume of it, later
    assert [(run.number, run.prefix, run.done) for run in work.runs()] == [
        (1, new.prefix, frozenset({2})), (2, second.prefix, frozenset())]


def test_a_failed_job_cancels_the_assembly_which_aborts_its_upload(s3):
    keys = [f"c{i}" for i in range(8)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "cancel/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    sinks: list = []
    assembly = Assembly(merge_into(s3, work, keys, "cancel/out.jsonl", sinks), work, [run], during=True)
    assembly.start()
    task_ends(work, run, keys, 0)  # then the job fails: batches 1-3 never come
    time.sleep(0.3)
    started = time.monotonic()
    assembly.cancel()
    assert time.monotonic() - started < 5.0  # the cancel wakes the waiting merge at once
    assert sinks[0].aborted
    assert not access.object_exists(s3, BUCKET, "cancel/out.jsonl")
    assert not s3.list_multipart_uploads(Bucket=BUCKET, Prefix="cancel/").get("Uploads")
    assert assembly.live.key not in state.durable_batches


def test_a_job_that_finished_without_a_batch_names_it(s3):
    keys = [f"m{i}" for i in range(6)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "missing/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    write_part(work, run, keys, 0)
    write_part(work, run, keys, 2)
    assembly = Assembly(merge_into(s3, work, keys, "missing/out.jsonl", []), work, [run], during=True)
    assembly.start()
    with pytest.raises(work_prefix.ResumeError, match=r"batch 1 has no part under s3://assembly-bucket/missing/"):
        assembly.finish()
    assert not access.object_exists(s3, BUCKET, "missing/out.jsonl")


def test_a_live_assembly_that_fails_otherwise_is_done_again_after_the_job(s3):
    keys = [f"f{i}" for i in range(6)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "fallback/out.jsonl")
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


def test_finish_wakes_a_merge_whose_notices_never_came_and_one_listing_finds_the_parts(s3):
    """Every notice lost (no heartbeat before the first): the job's end wakes the merge, which lists once."""
    keys = [f"w{i}" for i in range(4)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "wake/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    assembly = Assembly(merge_into(s3, work, keys, "wake/out.jsonl", []), work, [run], during=True)
    assembly.start()
    write_part(work, run, keys, 0)
    write_part(work, run, keys, 1)
    time.sleep(0.2)
    assert assembly.live.listings == 0  # no notice yet: no task has ended as far as the merge knows
    started = time.monotonic()
    assembly.finish()
    assert time.monotonic() - started < 5.0
    assert [json.loads(x)["key"] for x in read(s3, "wake/out.jsonl").splitlines()] == keys
    assert (assembly.live.listings, assembly.live.found_by_listing) == (1, 2)


def waiting_for(live: merge.LiveRun, index: int) -> tuple[threading.Thread, dict]:
    """The merge's thread, waiting for batch ``index``; the dict gets its answer or its error."""
    outcome: dict = {}

    def wait():
        try:
            outcome["ready"] = live.ready(index, wait=True)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread, outcome


def test_the_merge_reads_a_part_it_is_told_of_and_lists_nothing(s3, moto_endpoint):
    keys = [f"n{i:02d}" for i in range(8)]
    log = RequestLog("told/out.jsonl")
    with FaultProxy(moto_endpoint, deny=log) as proxy:
        work = work_prefix.WorkPrefix(make_s3_client(proxy.endpoint), BUCKET, "told/out.jsonl")
        run = work.start_run(1, keys, 2, None)
        assembly = Assembly(merge_into(s3, work, keys, "told/out.jsonl", []), work, [run], during=True)
        assembly.start()
        for index in range(run.batches):
            task_ends(work, run, keys, index)
        assembly.finish()
    assert [json.loads(x)["key"] for x in read(s3, "told/out.jsonl").splitlines()] == keys
    assert log.kinds["part LIST"] == 0 and log.kinds["part GET"] == run.batches == log.kinds["part PUT"]
    assert (assembly.live.listings, assembly.live.found_by_listing, assembly.live.notices) == (0, 0, 4)


def test_a_part_whose_notice_was_lost_is_found_by_the_heartbeat_which_then_slows_down(s3):
    keys = [f"h{i:02d}" for i in range(8)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "heartbeat/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    live = merge.LiveRun(work, run, heartbeat_seconds=0.2)
    state.durable_batches.listen(live.key, live.durable)
    try:
        task_ends(work, run, keys, 0)
        write_part(work, run, keys, 1)  # its task's stats never reach the driver
        task_ends(work, run, keys, 2)
        assert live.ready(0) and live.ready(2) and not live.ready(1)  # without waiting, nothing is listed
        assert live.listings == 0
        started = time.monotonic()
        assert live.ready(1, wait=True)
        assert 0.2 <= time.monotonic() - started < 3.0 and (live.listings, live.found_by_listing) == (1, 1)
        # Batch 3's task is slow: listings that find nothing new come further apart (0.2 s into the wait, 0.6, 1.4).
        thread, outcome = waiting_for(live, 3)
        time.sleep(1.0)
        assert live.listings == 3
        task_ends(work, run, keys, 3)  # its notice wakes the merge at once
        thread.join(timeout=3.0)
        assert outcome == {"ready": True} and live.listings == 3
    finally:
        state.durable_batches.forget(live.key, live.durable)


def test_cancel_and_finish_wake_a_waiting_merge(s3):
    keys = [f"e{i:02d}" for i in range(6)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "end/out.jsonl")
    run = work.start_run(1, keys, 2, None)
    live = merge.LiveRun(work, run, heartbeat_seconds=30.0)
    live.durable([0])
    cancelled, outcome = waiting_for(live, 1)
    time.sleep(0.2)
    live.cancel()
    cancelled.join(timeout=3.0)
    assert isinstance(outcome["error"], merge.AssemblyCancelled)
    live = merge.LiveRun(work, run, heartbeat_seconds=30.0)
    live.durable([0])
    finished, outcome = waiting_for(live, 1)
    time.sleep(0.2)
    live.finish()  # batch 1 has no part: one listing says so
    finished.join(timeout=3.0)
    assert isinstance(outcome["error"], work_prefix.ResumeError) and live.listings == 1


def test_only_the_drivers_accumulator_tells_and_its_fold_keeps_no_batches():
    told: list = []
    key = ("bucket", "out.jsonl.parts/run-0001/")
    state.durable_batches.listen(key, told.append)
    try:
        driver = StatsAccumulator(key)
        # A task's copy (unpickled, as PySpark ships it) folds the task's stats and tells nobody, even in a
        # process where the run is followed.
        sent = task_stats(driver, 5)
        assert told == [] and sent.finished_batches == [5]
        total = driver.addInPlace(StatsFold(), sent)
        total = driver.addInPlace(total, task_stats(driver, 6))
        assert told == [[5], [6]] and total.finished_batches == [] and total.tasks == 2
    finally:
        state.durable_batches.forget(key, told.append)
    assert key not in state.durable_batches


def test_an_upload_a_killed_driver_left_open_is_aborted_and_no_other(s3):
    work = work_prefix.WorkPrefix(s3, BUCKET, "open/out.jsonl")
    mine = [s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
            for key in ("open/out.jsonl", "open/out.jsonl.parts/run-0001/batches.arrows")]
    other = s3.create_multipart_upload(Bucket=BUCKET, Key="open/out.jsonl.bak")["UploadId"]
    assert work.abort_uploads() == 2
    left = [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=BUCKET, Prefix="open/").get("Uploads", [])]
    assert left == [other] and not set(mine) & set(left)


def test_a_dataset_file_a_killed_driver_was_writing_is_aborted_with_the_work_prefixs(s3):
    from mxjob.options import config
    from mxjob.outputs import claim

    cfg = config.resolve(config.merge_settings({"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/m/d",
                                                "output": f"s3://{BUCKET}/ds/"}, {}))
    work = work_prefix.WorkPrefix(s3, BUCKET, "ds/")
    mine = [s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
            for key in ("ds/part-00003.parquet", "ds/part-20261126T101500Z-00001.parquet")]
    other = s3.create_multipart_upload(Bucket=BUCKET, Key="ds/notes.txt")["UploadId"]
    claim.abort_left_uploads(work, cfg.output)
    left = [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=BUCKET, Prefix="ds/").get("Uploads", [])]
    assert left == [other] and not set(mine) & set(left)


def test_a_single_runs_parts_are_kept_whole_without_a_merge_row_by_row(s3, monkeypatch):
    keys = [f"p{i:03d}" for i in range(30)]
    work = work_prefix.WorkPrefix(s3, BUCKET, "whole/out.jsonl")
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
    work = work_prefix.WorkPrefix(s3, BUCKET, "rows/out.jsonl")
    run = work.start_run(1, scored, 4, None)
    for index in range(run.batches):
        write_part(work, run, scored, index)
    listed = [k for k in scored if k != "q06"]  # q06 is no longer listed: its line is dropped
    counts, text = assemble_after(s3, work, listed, "rows/out.jsonl")
    assert [json.loads(x)["key"] for x in text.splitlines()] == listed
    assert (counts.predicted, counts.dropped) == (11, 1)
    with pytest.raises(work_prefix.ResumeError, match=r"no line for key 'q99' .*\(1 keys without a line\)"):
        assemble_after(s3, work, [*scored, "q99"], "rows/missing.jsonl")


def assemble_after(s3, work, keys, out_key):
    sink = jsonl.JsonLinesSink(writes.MultipartWriter(s3, BUCKET, out_key))
    try:
        counts = merge.assemble(work, work.runs(), keys, sink)
        sink.close()
    except BaseException:
        sink.abort()
        raise
    return counts, read(s3, out_key)
