"""The run report, the ETA, the status file and the closing lines: pure functions, and the page in chromium.

The browser tests need Debian's ``chromium`` (``make test`` installs it when
run as root); without it they are skipped, saying so. A real run's status,
``watch`` and report, through spark-submit: ``tests/integration/test_report.py``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest

from mxjob.executor.stats import StatsFold, TaskStats
from mxjob.options import config
from mxjob.outputs import merge, work_prefix
from mxjob.reporting import report, status, summary, watch
from mxjob.reporting.progress import Progress, Reporter, Tick, Ticks, estimate_remaining
from tests.support.report_page import CHARTS, assert_figures_match, assert_self_contained, check_in_browser, figures

T0 = 1_700_000_000.0


def task(i: int, executor: str, started: float, seconds: float, keys: int = 64, failed: int = 0,
         worker_task: int = 1) -> TaskStats:
    errors = {"download": 0, "decode": failed, "predict": 0}
    kinds = {"decode/UnidentifiedImageError": {"count": failed, "examples": [f"bad/{i}.jpg"]}} if failed else {}
    return TaskStats(partition=i, executor=executor, worker_pid=100, attempt=0, keys=keys, errors=errors,
                     seconds={"download": seconds * 3, "decode": seconds, "forward": seconds * 0.6,
                              "wait": seconds * 0.2, "write": seconds * 0.05, "task": seconds, "cpu": seconds},
                     s3_retries={"request": 0, "body": 0}, model_loads=1, started=started,
                     ended=started + seconds, threads=2, host={"cores": 4, "workers": 2}, worker_task=worker_task,
                     memory={"rss": (200 + worker_task) * 1024 * 1024, "max_rss": 300 * 1024 * 1024},
                     error_kinds=kinds, top1={"tabby cat": keys - failed - 1, "tiger cat": 1})


def fake_fold(tasks_per_executor: int = 40) -> StatsFold:
    """Two executors: a 5 s first task (model load), then 1 s tasks back to back."""
    fold = StatsFold()
    for e, name in enumerate(("host-a/11", "host-b/12")):
        t = T0 + e * 0.5
        for n in range(1, tasks_per_executor + 1):
            seconds = 5.0 if n == 1 else 1.0
            fold.add(task(e * 1000 + n, name, t, seconds, failed=int(n % 10 == 0), worker_task=n))
            t += seconds + 0.1
    return fold


def fake_summary(fold: StatsFold) -> dict:
    return {"keys_listed": fold.keys, "predicted": fold.keys - sum(fold.errors.values()),
            "failed": sum(fold.errors.values()), "elapsed_seconds": 75.0, "scored": fold.keys, "reused": 0,
            "errors_by_stage": dict(fold.errors), "output": "s3://b/out.jsonl", "seconds": {"spark": 52.0},
            "tasks": {"first_start": fold.first_start, "last_end": fold.last_end},
            "rates": {"images_per_second_spark": round(fold.keys / 52.0, 2)},
            "files": {"report": "s3://b/out.jsonl.report.html", "summary": "s3://b/out.jsonl.summary.json"}}


def fake_page(tmp_path: Path) -> tuple[Path, dict]:
    fold = fake_fold()
    ticks = Ticks()
    for k in range(1, 11):
        now = T0 + 5 * k
        part = StatsFold.of([])
        part.tasks, part.keys = min(80, 8 * k), min(fold.keys, 8 * k * 64)
        ticks.add(Tick(time=now, batches=part.tasks, keys=part.keys, failed=0, recent_rate=100.0,
                       eta_seconds=None if k < 3 else 50.0 - 5 * k + 4, predicted_end=None if k < 3 else T0 + 54))
    summ = fake_summary(fold)
    doc = status.status_document("succeeded", None, None, status.RunFacts(T0 - 20, {"output": "s3://b/out.jsonl"}),
                                 status.RunEnd(0))
    doc.update({"keys": {"done": fold.keys, "total": fold.keys}, "batches": {"done": 80, "total": 80}})
    page = report.render(report.view(fold, ticks.as_list(), doc, summ, {"options": {"batch_size": 64},
                                                                       "fingerprint": {"settings": "abc"}}))
    path = tmp_path / "out.jsonl.report.html"
    path.write_text(page)
    return path, summ


# ----------------------------------------------------------------------------
# The ETA


def simulate(executors: int, batches: int, load: float, per_task: float, ticks_every: float = 1.0):
    """A fake job: each executor loads the model in its first task, then runs tasks back to back.

    Yields ``(Progress, true seconds left)`` at each tick.
    """
    ends = sorted((load + n * per_task, e) for e in range(executors) for n in range(batches))[:batches]
    first_end = {e: load for e in range(executors)}
    finish = ends[-1][0]
    now = ticks_every
    while now < finish:
        done = [t for t, _ in ends if t <= now]
        warm = tuple(first_end[e] for e in range(executors) if first_end[e] <= now)
        yield Progress(now=now, batches_done=len(done), batches_total=batches, keys_done=len(done) * 64,
                       keys_total=batches * 64, first_start=0.0, warm_ends=warm, warm_keys=len(warm) * 64,
                       executors_expected=executors), finish - now
        now += ticks_every


def test_eta_is_estimating_until_every_executor_finished_a_task_and_5_percent_are_done():
    sequence = list(simulate(executors=4, batches=400, load=8.0, per_task=0.5))
    early = [eta for p, _ in sequence if p.now < 8.0 for eta in [estimate_remaining(p)]]
    assert early and all(eta is None for eta in early)
    first_known = next(p for p, _ in sequence if estimate_remaining(p) is not None)
    assert len(first_known.warm_ends) == 4
    assert first_known.batches_done >= 0.05 * 400 or first_known.now >= 30


def test_eta_once_known_is_within_a_factor_of_the_true_time_left():
    for p, truth in simulate(executors=4, batches=400, load=8.0, per_task=0.5):
        eta = estimate_remaining(p)
        if eta is not None and truth > 5:
            assert truth / 1.5 <= eta <= truth * 1.5, (p, eta, truth)


def test_eta_of_a_finished_job_is_zero_and_of_a_slow_start_is_estimating_before_30_s():
    done = Progress(now=9.0, batches_done=10, batches_total=10, keys_done=640, keys_total=640, first_start=0.0)
    assert estimate_remaining(done) == 0.0
    slow = Progress(now=20.0, batches_done=1, batches_total=100, keys_done=64, keys_total=6400, first_start=0.0,
                    warm_ends=(20.0,), warm_keys=64, executors_expected=1)
    assert estimate_remaining(slow) is None
    assert estimate_remaining(Progress(**{**slow.__dict__, "now": 31.0})) is not None


def test_a_job_shorter_than_the_first_tick_logs_one_progress_line_at_its_end(caplog):
    fold = fake_fold(3)
    reporter = Reporter(lambda: fold, batches=6, keys=fold.keys, every=15.0, executors=2)
    with caplog.at_level("INFO", logger="mxjob.reporting.progress"):
        reporter.tick(final=True)
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("progress: 6 of 6 batches done (100%)") and line.endswith("done")


# ----------------------------------------------------------------------------
# Timeline, status, closing lines


def test_the_timeline_stays_bounded_and_keeps_every_key():
    fold = StatsFold()
    for i in range(5000):  # 5000 tasks over ~14 hours
        fold.add(task(i, f"h/{i % 3}", T0 + i * 10.0, 1.0))
    series = fold.timeline.series()
    assert len(series["start"]) <= 240
    assert sum(sum(e["keys"]) for e in series["executors"].values()) == 5000 * 64


def test_status_document_says_state_progress_and_resume():
    p = Progress(now=T0 + 10, batches_done=5, batches_total=10, keys_done=320, keys_total=640, failed=2,
                 first_start=T0)
    tick = Tick(time=T0 + 10, batches=5, keys=320, failed=2, recent_rate=30.0, eta_seconds=10.0,
                predicted_end=T0 + 20)
    doc = status.status_document("running", p, tick, status.RunFacts(T0 - 5, {"output": "s3://b/o"},
                                                                      "spark-submit x --resume"))
    assert doc["batches"] == {"done": 5, "total": 10} and doc["keys"]["done"] == 320 and doc["errors"] == 2
    assert doc["images_per_second"] == 32.0 and doc["eta_seconds"] == 10.0
    assert doc["resume_command"] == "spark-submit x --resume" and re.match(r"\d{4}-\d\d-\d\dT", doc["started_iso"])
    with pytest.raises(ValueError, match="state must be one of"):
        status.status_document("done", p, tick, status.RunFacts(T0, {}))


def test_a_failed_status_put_warns_once_and_the_job_goes_on(caplog):
    class Refusing:
        def put_object(self, **_):
            raise PermissionError("AccessDenied")

    monitor = status.RunMonitor(Refusing(), "b", "out.jsonl", T0, None, {})
    with caplog.at_level("WARNING", logger="mxjob.reporting.status"):
        monitor.write("running")
        monitor.write("running")
    assert [r.getMessage() for r in caplog.records] == [
        "cannot write s3://b/out.jsonl.status.json (AccessDenied); the job goes on without live status"]


def test_closing_lines_name_counts_errors_rate_and_locations():
    summ = fake_summary(fake_fold())
    lines = summary.closing_lines(summ, 3)
    assert lines[0] == f"run finished: {summ['keys_listed']:,} keys, {summ['predicted']:,} predicted, 8 failed " \
                       "(decode 8); 0 reused from an earlier run"
    assert "images/s (keys scored / Spark job wall seconds)" in lines[1] and "wall time 1m15s" in lines[1]
    assert lines[3] == "report:  s3://b/out.jsonl.report.html (copy it here and open it in a browser)"
    assert lines[-1].startswith("exit 3: more images failed than --max-errors allows")



def test_the_summary_counts_and_names_the_keys_a_prefix_listing_skipped():
    cfg = config.resolve(config.merge_settings({"input": "s3://b/in/", "model": "s3://m/r",
                                                "output": "s3://b/o.jsonl"}, {}))
    skipped = {"count": 11, "why": "not ending in .jpg", "examples": [f"in/{i}.txt" for i in range(10)]}
    workload = work_prefix.Workload(runs=[], todo=[], number=1, resumed=False)
    made = summary.summarize(cfg, summary.RunOutcome(
        images=0, batches=0, fold=StatsFold(), counts=merge.AssemblyCounts(), elapsed=1.0, model_summary={},
        seconds={}, workload=workload, fingerprint={}, skipped_keys=skipped))
    assert made["skipped_keys"] == skipped
    # Listed and skipped beside each other, before the figures of the scoring.
    assert list(made)[list(made).index("keys_listed") + 1] == "skipped_keys"

def test_watch_prints_progress_and_exits_with_the_jobs_code():
    docs = iter([None, {"state": "running", "updated": 1, "elapsed_seconds": 1},
                 {"state": "running", "updated": 2, "keys": {"done": 64, "total": 128},
                  "batches": {"done": 1, "total": 2}, "errors": 0, "images_per_second": 12.5, "eta_seconds": None},
                 {"state": "interrupted", "updated": 3, "exit_code": 143, "keys": {"done": 64, "total": 128},
                  "batches": {"done": 1, "total": 2}, "report": "s3://b/r", "resume_command": "x --resume"}])

    class Client:
        class exceptions:  # boto3's shape
            NoSuchKey = KeyError

        def get_object(self, **_):
            doc = next(docs)
            if doc is None:
                raise KeyError("no")
            return {"Body": __import__("io").BytesIO(json.dumps(doc).encode())}

    out = []
    code = watch.watch(Client(), "b", "k", watch.Polling(0, 60, 60), echo=lambda s, err=False: out.append(s),
                       sleep=lambda _: None)
    assert code == 143
    assert out[0].startswith("no status at s3://b/k yet: waiting up to 60 s")  # the first read found none
    assert out[2] == "running: 1 of 2 batches, 64 of 128 images, 0 errors; 12.5 images/s; ETA estimating"
    assert out[-1] == "  resume with: x --resume"


# ----------------------------------------------------------------------------
# The page


def test_the_page_is_self_contained_and_has_every_chart(tmp_path):
    path, _ = fake_page(tmp_path)
    page = path.read_text()
    assert_self_contained(page)
    for chart in CHARTS:
        assert f'id="{chart}"' in page


def test_the_pages_figures_are_the_summarys(tmp_path):
    path, summ = fake_page(tmp_path)
    shown = figures(path.read_text())
    assert_figures_match(shown, summ)



def skipped_page(summ: dict | None) -> str:
    fold = fake_fold(2)
    doc = status.status_document("succeeded" if summ else "running", None, None,
                                 status.RunFacts(T0 - 20, {"output": "s3://b/out.jsonl"}), status.RunEnd(0))
    return report.render(report.view(fold, [], doc, summ, {}))


def test_the_page_counts_and_names_the_keys_the_input_skipped():
    summ = {**fake_summary(fake_fold(2)),
            "skipped_keys": {"count": 1234, "why": "not ending in .jpg", "examples": ["in/a.txt", "in/b.csv"]}}
    page = skipped_page(summ)
    assert figures(page)["summary.skipped_keys.count"] == "1234"
    assert re.search(r'<p id="skipped">Not scored: <span [^>]+>1,234</span> keys, not ending in \.jpg '
                     r"\(e\.g\. in/a\.txt, in/b\.csv\)\.</p>", page)
    # A manifest's skipped keys, by reason, on the same line.
    manifest = {"skipped": {"outside_input": {"count": 1, "why": "not under the input prefix 'in/'",
                                              "examples": ["x/c.jpg"]}}}
    page = skipped_page({**fake_summary(fake_fold(2)), "skipped_keys": None, "manifest": manifest})
    assert figures(page)["summary.manifest.skipped.outside_input.count"] == "1"
    assert "1</span> key, not under the input prefix &#x27;in/&#x27; (e.g. x/c.jpg)" in page
    assert '<p id="skipped">No key was skipped.</p>' in skipped_page(
        {**fake_summary(fake_fold(2)), "skipped_keys": {"count": 0, "why": "not ending in .jpg", "examples": []}})
    assert 'id="skipped"' not in skipped_page(None)  # counted once the run ends


def test_the_page_renders_in_headless_chromium(tmp_path):
    path, summ = fake_page(tmp_path)
    shot = check_in_browser(tmp_path, path, summ)
    shutil.copy(shot, Path("/tmp/report-fake.png"))


# ----------------------------------------------------------------------------
# What a person reads: which rate, which seconds, what "other" is, words and badges


def x_labels(svg: str) -> list[str]:
    """The time or task labels along a chart's x axis (the tick texts on the axis' baseline)."""
    return re.findall(rf'<text class="tick" x="[\d.]+" y="{report.HEIGHT - report.PAD_B + 16}" '
                      r'text-anchor="\w+">([^<]*)</text>', svg)


def one_executor_fold(tasks: int, keys: int = 64, failed: int = 0) -> StatsFold:
    fold = StatsFold()
    for n in range(1, tasks + 1):
        fold.add(task(n, "host-a/11", T0 + 2 * n, 1.0, keys=keys, failed=failed, worker_task=n))
    return fold


def test_the_headline_rate_says_it_is_keys_scored_over_the_spark_jobs_seconds(tmp_path):
    page = fake_page(tmp_path)[0].read_text()
    assert (f'<p class="note" id="rate-what">images/s: '
            f'{report._esc(summary.RATES["images_per_second_spark"])}.</p>') in page


def test_the_closing_lines_name_each_rate_they_show():
    summ = fake_summary(fake_fold())
    summ["rates"]["images_per_second_elapsed"] = 68.27
    assert summary.closing_lines(summ, 0)[1] == (
        "wall time 1m15s (Spark job 52s); 98.5 images/s (keys scored / Spark job wall seconds), "
        "68.3 over the whole run (keys scored / elapsed seconds)")


def test_the_throughput_chart_says_its_rate_is_per_interval(tmp_path):
    page = fake_page(tmp_path)[0].read_text()
    assert ">images/s in each 1 s interval</text>" in page
    assert ('<p class="note" id="throughput-what">Each point: keys whose task ended in that 1 s interval / 1 s. '
            "It can peak well above the headline&#x27;s images/s, which is over the whole Spark job.</p>") in page


def test_a_run_whose_tasks_ended_in_one_interval_has_no_throughput_chart_and_says_why():
    v = report.view(one_executor_fold(1), [],
                    status.status_document("succeeded", None, None, status.RunFacts(T0, {}), status.RunEnd(0)),
                    None, {})
    assert report.throughput_chart(v) == (
        '<p class="empty" id="chart-throughput">Every task ended within one 1 s interval: images/s over time '
        "needs two.</p>")


def test_download_and_decode_say_they_are_summed_over_the_download_threads_and_other_is_named(tmp_path):
    page = fake_page(tmp_path)[0].read_text()
    assert ("<h3>On the download threads: download and decode are summed over each task&#x27;s download threads, "
            "so they overlap the above and can exceed the task&#x27;s seconds</h3>") in page
    assert ('<p class="note" id="time-what">other: time in the task not in forward, wait or write (setting up the '
            "worker&#x27;s threads and S3 client, reading the batch&#x27;s keys, loading the model in a worker&#x27;s "
            "first task or finding it cached, building the results). between tasks: from the executor&#x27;s first "
            "task&#x27;s start to its last one&#x27;s end, the time outside its tasks (Spark scheduling each task, "
            "shipping it and its batch to the Python worker, taking back its result; a new Python worker&#x27;s "
            "start). The workers table&#x27;s idle s between tasks is the same, per Python worker.</p>") in page


def test_an_embed_run_does_not_blame_missing_labels_on_an_output_handler():
    assert report.labels_chart({"top1": [], "options": {"task": "embed"}}) == (
        '<p class="empty" id="chart-labels">No top-1 labels: an embed run writes vectors, not labels.</p>')


def test_a_run_too_short_for_two_ticks_says_so_instead_of_an_empty_progress_chart():
    doc = status.status_document("succeeded", None, None, status.RunFacts(T0, {"output": "s3://b/o"}),
                                 status.RunEnd(0))
    one_tick = [{"time": T0 + 1, "keys": 5, "batches": 1, "failed": 0, "recent_rate": 5.0, "eta_seconds": None,
                 "predicted_end": None}]
    chart = report.progress_chart({"ticks": one_tick, "status": doc})
    assert chart.startswith('<p class="empty" id="chart-progress">The run took 1 progress tick: too short')
    assert "<svg" not in chart


def test_the_memory_charts_task_labels_never_crowd_each_other():
    """Two workers whose last tasks are 200 and 219: the ticks keep 1 and the last, and drop what would overlap."""
    ticks = report.spaced([math.log10(n) for n in (1, 2, 5, 10, 20, 50, 100, 200, 219)])
    shown = [round(10 ** t) for t in ticks]
    assert shown[0] == 1 and shown[-1] == 219 and 200 not in shown
    gaps = [b - a for a, b in zip(ticks, ticks[1:])]
    assert min(gaps) >= report.MIN_TICK_GAP * (ticks[-1] - ticks[0])
    assert report.spaced([0.0, 1.0]) == [0.0, 1.0]


def test_one_image_is_one_image_not_1_images():
    chart = report.labels_chart({"top1": [("tabby cat", 1)], "options": {}})
    assert ">1 image</text>" in chart and "1 images" not in chart


def test_a_resumed_runs_report_says_how_many_keys_it_reused():
    fold = one_executor_fold(10, keys=1)
    doc = status.status_document("succeeded", None, None, status.RunFacts(T0, {"output": "s3://b/o"}),
                                 status.RunEnd(0))
    resumed = report.render(report.view(fold, [], doc, {**fake_summary(fold), "reused": 816}, {}))
    assert 'reused from the run before' in resumed and ">816<" in resumed
    fresh = report.render(report.view(fold, [], doc, {**fake_summary(fold), "reused": 0}, {}))
    assert "reused from the run before" not in fresh


def test_a_succeeded_run_with_failed_images_says_so_beside_its_badge():
    fold = one_executor_fold(10, keys=1)
    summ = {**fake_summary(fold), "keys_listed": 10, "predicted": 4, "failed": 6}
    doc = status.status_document("succeeded", None, None, status.RunFacts(T0, {"output": "s3://b/o"}),
                                 status.RunEnd(0))
    page = report.render(report.view(fold, [], doc, summ, {}))
    assert ('<span class="state succeeded-with-errors" id="state" data-value="succeeded">succeeded with errors'
            '</span> <a class="state-errors" href="#errors">6 of 10 images failed</a></h1>') in page
    assert ".succeeded-with-errors{background:#CC79A7}" in report.STYLE
    too_many = status.status_document("succeeded", None, None, status.RunFacts(T0, {"output": "s3://b/o"}),
                                      status.RunEnd(3))
    page = report.render(report.view(fold, [], too_many, summ, {}))
    assert ('<span class="state failed" id="state" data-value="succeeded">too many errors (exit 3)</span> '
            '<a class="state-errors" href="#errors">6 of 10 images failed, more than --max-errors allows</a>') in page
    assert "succeeded with errors" not in page
    clean = report.render(report.view(fold, [], doc, {**summ, "predicted": 10, "failed": 0}, {}))
    assert '<span class="state succeeded" id="state" data-value="succeeded">succeeded</span></h1>' in clean


def test_no_eta_is_shown_as_made_once_every_batch_was_done():
    # A one-batch run: its only tick comes after the batch ended, and says 0 s left.
    ticks = [{"time": T0 + 9, "batches": 1, "keys": 64, "failed": 0, "recent_rate": 7.0, "eta_seconds": 0.0,
              "predicted_end": T0 + 9}]
    doc = status.status_document("succeeded", None, None, status.RunFacts(T0, {}), status.RunEnd(0))
    doc.update({"keys": {"done": 64, "total": 64}, "batches": {"done": 1, "total": 1}})
    v = report.view(one_executor_fold(1), ticks, doc, fake_summary(one_executor_fold(1)), {})
    assert report.finish_line(v) == ""
    assert report.eta_chart(v) == ('<p class="empty" id="chart-eta">No ETA was made before every batch was '
                                   "done.</p>")


def test_time_labels_along_a_chart_are_never_repeated():
    chart = report.line_chart("c", [("a", [T0, T0 + 2], [1.0, 2.0], "#000")], "y")
    assert x_labels(chart) == [report._clock(T0), report._clock(T0 + 1), report._clock(T0 + 2)]


def test_the_memory_chart_names_the_tasks_it_has():
    v = report.view(one_executor_fold(7), [],
                    status.status_document("running", None, None, status.RunFacts(T0, {}), status.RunEnd(0)),
                    None, {})
    assert x_labels(report.memory_chart(v)) == ["task 1", "task 2", "task 5", "task 7"]


def test_a_running_jobs_eta_card_shows_no_eta_once_every_batch_is_done():
    doc = status.status_document("running", None, None, status.RunFacts(T0, {}))
    doc.update({"keys": {"done": 64, "total": 64}, "batches": {"done": 1, "total": 1}, "eta_seconds": 0.0})
    cards = report.headline(report.view(one_executor_fold(1), [], doc, None, {}))
    assert '<div class="figure" data-field="status.eta_seconds" data-value="0.0">every batch done</div>' in cards


@pytest.mark.parametrize("state", ["running", "failed"])
def test_a_run_before_its_first_task_says_none_finished_yet_or_at_all(state):
    # A run that failed at its model check, or is still listing: no plan, no task, no tick.
    end = status.RUNNING if state == "running" else status.RunEnd(1, message="model: no such layer")
    doc = status.status_document(state, None, None, status.RunFacts(T0, {"output": "s3://b/o.jsonl"}), end,
                                 stage="model_check")
    page = report.render(report.view(StatsFold(), [], doc, None, {}))
    cards = dict(re.findall(r'data-field="(status\.(?:keys|batches)\.done)" data-value="[^"]*">([^<]*)<', page))
    assert cards == {"status.keys.done": "-", "status.batches.done": "-"}
    places = dict(re.findall(r'<p class="empty" id="(chart-(?:throughput|time|memory|eta))">([^<]*)</p>', page))
    if state == "running":
        assert places == {"chart-throughput": "No task has finished yet.", "chart-time": "No task has finished yet.",
                          "chart-memory": "No task has finished yet.",
                          "chart-eta": "No ETA yet: the job is still estimating."}
    else:
        assert places == {"chart-throughput": "No task finished: the run failed before its first.",
                          "chart-time": "No task finished: the run failed before its first.",
                          "chart-memory": "No task finished: the run failed before its first.",
                          "chart-eta": "No ETA was made: the run failed before the job had one."}
        assert " yet" not in re.sub(r"<[^>]+>", " ", page.split("<h2>Settings</h2>")[0])
        assert ('<p class="why" id="why"><b>Failed</b> (stage <code>model_check</code>): model: no such layer</p>'
                in page)
