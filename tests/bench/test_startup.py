"""``make bench-startup`` (bench/startup.py): each step's end read from the process tree, the driver's log and the
summary, and the printout. Fast: made-up runs."""

from __future__ import annotations

import datetime

import pytest

from bench import startup
from mxjob.run import warm_up

STARTED = datetime.datetime(2026, 11, 29, 10, 0, 0).timestamp()
LOG = "\n".join([
    "26/11/29 10:00:01 INFO SparkContext: Running Spark version 3.5.7",
    "2026-11-29 10:00:03,250 INFO botocore.credentials: Found credentials in environment variables.",
    "2026-11-29 10:00:03,750 INFO mxjob.s3.parallel_list: listed s3://bench/peers/n64/: 64 keys in 0.5s (1 call, "
    "up to 16 at once)",
    "2026-11-29 10:00:09,000 INFO mxjob.run.spark_start: the executors' Python workers loaded the model in 4.5 s, "
    "while the driver planned",
    "2026-11-29 10:00:09,001 INFO mxjob.run.warm_up: an executor checked the model and measured the estimate's "
    "sample on 16 images as it warmed up (MXNet's import 1.5 s, the model's load 0.5 s, the first forward pass 1.0 s, "
    "the sample's timed pass 0.75 s); the driver loads no MXNet", ""])
SUMMARY = {"tasks": {"first_start": STARTED + 9.5},
           "python_workers": {"h/1/2": {"first_task": {"ended": STARTED + 11.0}},
                              "h/1/3": {"first_task": {"ended": STARTED + 10.5}}}}
PROCESSES = {"Python driver": STARTED + 1.5, "executor JVMs": STARTED + 4.0, "Python workers": STARTED + 5.25}


def test_a_log_lines_local_time_is_read_to_the_millisecond():
    assert startup.log_time("2026-11-29 10:00:03,750") == pytest.approx(STARTED + 3.75)


def test_each_group_starts_with_its_first_process_and_a_process_without_a_group_counts_for_none():
    seen = {(11, 5.0): ("executor JVMs", 1.0), (12, 4.0): ("executor JVMs", 2.0), (13, 3.0): (None, 0.1),
            (14, 6.0): ("Python workers", 3.0)}
    assert startup.first_started(seen) == {"executor JVMs": 4.0, "Python workers": 6.0}


def test_each_step_ends_where_the_tree_the_log_and_the_summary_put_it():
    at = startup.marks(STARTED, PROCESSES, LOG, SUMMARY)
    # The warm-up's steps go back from its end (9.0) by the checking task's split: 0.75, 1.0, 0.5, 1.5 s.
    assert at == pytest.approx({"python_driver": 1.5, "listing_began": 3.25, "listing_ended": 3.75,
                                "executor_jvm": 4.0, "python_worker": 5.25, "warm_up_began": 5.25,
                                "mxnet_imported": 6.75, "model_read": 7.25, "first_pass": 8.25, "model_loaded": 9.0,
                                "first_batch": 9.5, "first_durable": 10.5})
    assert list(at) == [name for name, _ in startup.STEPS]


def test_a_step_the_run_did_not_show_is_unknown_not_zero():
    at = startup.marks(STARTED, {}, "no job lines\n", {})
    assert set(at.values()) == {None}
    # A warm-up that measured no sample reports no split: its end alone is known.
    unsplit = startup.marks(STARTED, PROCESSES, LOG.replace("as it warmed up (", "as it warmed up; ("), SUMMARY)
    assert unsplit["model_loaded"] == pytest.approx(9.0)
    assert [unsplit[name] for name in ("warm_up_began", "mxnet_imported", "model_read", "first_pass")] == [None] * 4


def test_the_split_is_read_in_the_words_the_driver_logs_it():
    line = "as it warmed up" + warm_up.split_words({"mxnet_import": 2.31, "model_load": 0.6, "first_pass": 2.0,
                                                    "sample": 1.7})
    assert [float(x) for x in startup.SPLIT.search(line).groups()] == [2.3, 0.6, 2.0, 1.7]


def test_the_printout_gives_each_steps_end_its_own_seconds_and_share_and_the_cpu():
    runs = [{"marks": startup.marks(STARTED, PROCESSES, LOG, SUMMARY), "wall": 14.0,
             "cpu": {"driver JVM": 3.0, "Python workers": 6.0}},
            {"marks": {**startup.marks(STARTED, PROCESSES, LOG, SUMMARY), "model_loaded": None}, "wall": 16.0,
             "cpu": {"driver JVM": 5.0, "Python workers": 8.0}}]
    text = startup.report({"cpu": "Test CPU", "images": 64, "model": "m", "runs": runs})
    assert "CPU: Test CPU; 64 JPEGs, m" in text and "medians of 2 run(s)" in text
    assert "| the listing | 3.75 s | 0.50 s | 5% |" in text
    assert "| the estimate's sample, timed (to the warm-up job's end: the executors loaded the model) | 9.00 s | " \
           "0.75 s | 7% |" in text  # one run's line: the other run did not show it
    assert "| MXNet's import, on the executor | 6.75 s | 1.50 s | 14% |" in text
    assert "| the first batch: its images read, decoded, scored, its part written | 10.50 s | 1.00 s | 10% |" in text
    assert "The whole job: 15.0 s" in text and "(medians): Python workers 7.0, driver JVM 4.0." in text  # GROUPS order


def test_steps_are_printed_in_the_order_they_ended_each_adding_what_came_after_the_one_before():
    # Spark's executor JVM started before the listing ended: it comes first, and the listing adds the rest.
    early = {**startup.marks(STARTED, PROCESSES, LOG, SUMMARY), "executor_jvm": 3.5, "first_batch": None}
    text = startup.report({"cpu": "c", "images": 1, "model": "m", "runs": [{"marks": early, "wall": 1.0, "cpu": {}}]})
    lines = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| step")]
    assert [line.split(" | ")[0][2:] for line in lines][2:4] == ["the SparkContext, and the first executor's JVM "
                                                                "starting", "the listing"]
    assert "| the listing | 3.75 s | 0.25 s | 2% |" in text
    assert lines[-1].startswith("| the plan and the run's Spark job, to its first task | n/a |")
