"""Unit tests for :mod:`mxjob.run.container_memory` (an executor's YARN container and the advice when YARN kills
one), for :func:`mxjob.run.warm_up.killed_for_memory` (the warm-up's executors killed so) and for
:func:`mxjob.outputs.claim.finished_by_this_application` (a later YARN attempt ending as the earlier one did)."""

from __future__ import annotations

import io
import json
import re
import types

import pytest

from mxjob.outputs.claim import finished_by_this_application
from mxjob.reporting.status import status_key
from mxjob.run.container_memory import (
    JVM_BEYOND_HEAP_MIB,
    MIB,
    ExecutorContainer,
    fit,
    killed_message,
    size_mib,
    suggested_overhead_mib,
)
from mxjob.run.warm_up import killed_for_memory

#: The reason Spark gives when YARN kills an executor's container for its memory (a container of 640 MiB).
KILLED_REASON = (
    "Job aborted due to stage failure: Task 1 in stage 0.0 failed 4 times, most recent failure: Lost task 1.3 in "
    "stage 0.0 (TID 7) (localhost executor 8): ExecutorLostFailure (executor 8 exited caused by one of the running "
    "tasks) Reason: Container killed by YARN for exceeding physical memory limits. 685.1 MB of 640 MB physical "
    "memory used. Consider boosting spark.executor.memoryOverhead."
)

#: 512 MiB of heap + 128 MiB of overhead: the 640 MiB container of KILLED_REASON.
SMALL = ExecutorContainer(memory_mib=512, overhead_mib=128, pyspark_mib=0, overhead_set=True)


# --- size_mib ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("4g", 4096),
    ("1536m", 1536),
    ("512", 512),
    ("1.0 GB", 1024),
    ("640 MB", 640),
    ("2048k", 2),
])
def test_size_mib_reads_spark_and_yarn_sizes_in_mib(text, expected):
    assert size_mib(text) == expected


def test_size_mib_rejects_a_value_that_is_not_a_size_naming_it():
    with pytest.raises(ValueError, match=r"not a memory size: 'lots'"):
        size_mib("lots")


# --- ExecutorContainer.from_conf --------------------------------------------------------------------------------


def test_from_conf_is_none_off_yarn():
    assert ExecutorContainer.from_conf({"spark.master": "local-cluster[2,1,1024]",
                                        "spark.executor.memory": "4g"}) is None


def test_from_conf_adds_the_overhead_set_to_the_heap():
    container = ExecutorContainer.from_conf({"spark.master": "yarn", "spark.executor.memory": "4g",
                                             "spark.executor.memoryOverhead": "16g"})
    assert container.limit_mib == 20480
    assert container.overhead_mib == 16384
    assert container.overhead_set is True


@pytest.mark.parametrize(("memory", "overhead"), [
    ("1g", 384),  # 10% of 1024 is 102.4: Spark's floor of 384 MiB
    ("8g", 819),  # 10% of 8192 is 819.2
])
def test_from_conf_without_an_overhead_uses_sparks_default(memory, overhead):
    container = ExecutorContainer.from_conf({"spark.master": "yarn", "spark.executor.memory": memory})
    assert container.overhead_mib == overhead
    assert container.limit_mib == size_mib(memory) + overhead
    assert container.overhead_set is False


def test_from_conf_applies_the_overhead_factor_when_set():
    container = ExecutorContainer.from_conf({"spark.master": "yarn", "spark.executor.memory": "8g",
                                             "spark.executor.memoryOverheadFactor": "0.2"})
    assert container.overhead_mib == 1638  # 20% of 8192 is 1638.4


def test_from_conf_adds_pyspark_memory_to_the_limit():
    container = ExecutorContainer.from_conf({"spark.master": "yarn", "spark.executor.memory": "4g",
                                             "spark.executor.memoryOverhead": "1g",
                                             "spark.executor.pyspark.memory": "2g"})
    assert container.pyspark_mib == 2048
    assert container.limit_mib == 4096 + 1024 + 2048


def test_describe_names_each_setting_and_the_limit():
    text = ExecutorContainer(memory_mib=4096, overhead_mib=1024, pyspark_mib=2048, overhead_set=True).describe()
    assert text.startswith("7168 MiB (")
    assert "spark.executor.memory 4096 MiB" in text
    assert "spark.executor.memoryOverhead 1024 MiB" in text
    assert "spark.executor.pyspark.memory 2048 MiB" in text
    assert "Spark's default" not in text


def test_describe_says_sparks_default_when_the_overhead_is_not_set():
    container = ExecutorContainer.from_conf({"spark.master": "yarn", "spark.executor.memory": "1g"})
    text = container.describe()
    assert "spark.executor.memoryOverhead 384 MiB (Spark's default" in text
    assert "spark.executor.pyspark.memory" not in text


# --- fit --------------------------------------------------------------------------------------------------------


def test_fit_reports_the_highest_worker_peak_and_its_share_of_the_limit():
    container = ExecutorContainer(memory_mib=1024, overhead_mib=1024, pyspark_mib=0, overhead_set=True)
    result = fit(container, {"a": {"max_rss": 800 * MIB}, "b": {"max_rss": 900 * MIB}, "c": {}})
    assert result["limit_mib"] == 2048
    assert result["python_worker_peak_rss_mib"] == 900.0
    assert result["python_worker_peak_share_of_limit"] == round(900 / 2048, 3) == 0.439


def test_fit_without_any_measured_worker_has_no_peak_nor_share():
    result = fit(SMALL, {"a": {}, "b": {"max_rss": None}})
    assert result["python_worker_peak_rss_mib"] is None
    assert result["python_worker_peak_share_of_limit"] is None
    assert result["limit_mib"] == 640


# --- suggested_overhead_mib -------------------------------------------------------------------------------------


def test_suggested_overhead_covers_a_worker_peak_beside_a_full_jvm():
    # max(810.1, 846 + 512 + 256 = 1614) * 1.25 = 2017.5; minus the heap 512: 1505.5; up to 256s: 6 * 256 = 1536;
    # twice the overhead (128) is less.
    container = ExecutorContainer(memory_mib=512, overhead_mib=64, pyspark_mib=0, overhead_set=True)
    assert JVM_BEYOND_HEAP_MIB == 256
    assert suggested_overhead_mib(container, 810.1, 846) == 1536


def test_suggested_overhead_covers_what_the_killed_container_used():
    # max(7000, 100 + 4096 + 256 = 4452) * 1.25 = 8750; minus 4096: 4654; up to 256s: 19 * 256 = 4864 (> 2 * 1024).
    container = ExecutorContainer(memory_mib=4096, overhead_mib=1024, pyspark_mib=0, overhead_set=True)
    assert suggested_overhead_mib(container, 7000, 100) == 4864


def test_suggested_overhead_counts_pyspark_memory_as_part_of_the_limit():
    # max(3000, 0 + 1024 + 256) * 1.25 = 3750; minus heap 1024 and pyspark 1024: 1702; up to 256s: 7 * 256 = 1792.
    container = ExecutorContainer(memory_mib=1024, overhead_mib=384, pyspark_mib=1024, overhead_set=True)
    assert suggested_overhead_mib(container, 3000, None) == 1792


def test_suggested_overhead_is_at_least_twice_the_current_one():
    # max(700, 512 + 256 = 768) * 1.25 = 960; minus 512: 448 -> 512; but twice the overhead, 4096, is more.
    container = ExecutorContainer(memory_mib=512, overhead_mib=2048, pyspark_mib=0, overhead_set=True)
    assert suggested_overhead_mib(container, 700, None) == 4096


@pytest.mark.parametrize(("memory", "overhead", "pyspark", "used", "peak"), [
    (512, 64, 0, 810.1, 846),
    (4096, 1024, 0, 7000, 100),
    (1024, 384, 1024, 3000, None),
    (8192, 819, 0, 9100.5, 2500.3),
])
def test_suggested_overhead_is_a_multiple_of_256_with_a_quarter_of_headroom(memory, overhead, pyspark, used, peak):
    container = ExecutorContainer(memory_mib=memory, overhead_mib=overhead, pyspark_mib=pyspark, overhead_set=True)
    suggested = suggested_overhead_mib(container, used, peak)
    assert suggested % 256 == 0
    assert suggested >= 2 * overhead
    assert memory + pyspark + suggested >= 1.25 * max(used, (peak or 0) + memory + JVM_BEYOND_HEAP_MIB)


# --- killed_message ---------------------------------------------------------------------------------------------


def test_killed_message_is_none_for_another_failure():
    reason = ("Job aborted due to stage failure: Task 0 in stage 1.0 failed 4 times, most recent failure: "
              "java.io.IOException: No space left on device")
    assert killed_message(reason, SMALL, {"a": {"max_rss": 300 * MIB}}, 400.0) is None


def test_killed_message_names_the_usage_the_container_the_workers_peak_and_the_overhead_to_set():
    workers = {"a": {"max_rss": 300 * MIB}, "b": {}}
    message = killed_message(KILLED_REASON, SMALL, workers, 600.0)
    assert "685.1 MB used of 640 MB" in message
    assert SMALL.describe() in message
    assert "The Python workers' measured peak RSS was 300 MiB" in message
    assert "No task finished" not in message
    # max(685.1, 300 + 512 + 256 = 1068) * 1.25 = 1335; minus 512: 823; up to 256s: 1024 (> 2 * 128).
    assert suggested_overhead_mib(SMALL, 685.1, 300) == 1024
    assert "Raise spark.executor.memoryOverhead to 1024m or more" in message


def test_killed_message_uses_the_drivers_peak_when_no_task_finished():
    message = killed_message(KILLED_REASON, SMALL, {"a": {}}, 600.0)
    assert "No task finished" in message
    assert "peaked at 600 MiB" in message
    assert "measured peak RSS" not in message
    # max(685.1, 600 + 512 + 256 = 1368) * 1.25 = 1710; minus 512: 1198; up to 256s: 5 * 256 = 1280.
    assert suggested_overhead_mib(SMALL, 685.1, 600.0) == 1280
    assert "Raise spark.executor.memoryOverhead to 1280m or more" in message


def test_killed_message_without_a_container_suggests_raising_the_overhead_without_a_number():
    message = killed_message(KILLED_REASON, None, {"a": {"max_rss": 300 * MIB}}, None)
    assert "685.1 MB used of 640 MB" in message
    assert "Raise spark.executor.memoryOverhead" in message
    assert re.search(r"memoryOverhead to \d+m", message) is None


# --- finished_by_this_application -------------------------------------------------------------------------------

APP = "application_1795664432297_0003"
ATTEMPT_2 = "container_1795664432297_0003_02_000001"


class FakeS3:
    """Just ``get_object`` over a dict of ``(bucket, key) -> document``; a missing object raises KeyError."""

    def __init__(self, objects: dict):
        self.objects = objects

    def get_object(self, *, Bucket: str, Key: str) -> dict:
        return {"Body": io.BytesIO(json.dumps(self.objects[(Bucket, Key)]).encode())}


CFG = types.SimpleNamespace(output_bucket="out", output_key="runs/scores.jsonl",
                            summary_key="runs/scores.jsonl.summary.json")


def finished_run(application_id: str = APP, exit_code: int | None = 3) -> FakeS3:
    """The output's summary (of ``application_id``) and status (with ``exit_code``), as a finished attempt left them."""
    return FakeS3({("out", CFG.summary_key): {"spark": {"application_id": application_id}},
                   ("out", status_key(CFG.output_key)): {"state": "finished", "exit_code": exit_code}})


def test_finished_by_this_application_returns_the_earlier_attempts_exit_code(monkeypatch):
    monkeypatch.setenv("CONTAINER_ID", ATTEMPT_2)
    assert finished_by_this_application(CFG, finished_run()) == 3


def test_finished_by_this_application_is_none_for_another_applications_output(monkeypatch):
    monkeypatch.setenv("CONTAINER_ID", ATTEMPT_2)
    assert finished_by_this_application(CFG, finished_run("application_1795664432297_0002")) is None


def test_finished_by_this_application_is_none_in_the_first_attempt(monkeypatch):
    monkeypatch.setenv("CONTAINER_ID", "container_1795664432297_0003_01_000001")
    assert finished_by_this_application(CFG, finished_run()) is None


def test_finished_by_this_application_is_none_outside_yarn(monkeypatch):
    monkeypatch.delenv("CONTAINER_ID", raising=False)
    assert finished_by_this_application(CFG, finished_run()) is None


def test_finished_by_this_application_is_none_without_a_summary(monkeypatch):
    monkeypatch.setenv("CONTAINER_ID", ATTEMPT_2)
    client = finished_run()
    del client.objects[("out", CFG.summary_key)]
    assert finished_by_this_application(CFG, client) is None


def test_finished_by_this_application_is_none_when_the_status_has_no_exit_code(monkeypatch):
    monkeypatch.setenv("CONTAINER_ID", ATTEMPT_2)
    assert finished_by_this_application(CFG, finished_run(exit_code=None)) is None


# --- warm_up.killed_for_memory: the warm-up's executors killed for their memory -----------------------------------


class _Conf:
    def getAll(self):  # SparkConf's name
        return [("spark.master", "yarn"), ("spark.executor.memory", "512m"), ("spark.executor.memoryOverhead", "128m")]


def warmed(failure: str | None):
    """A SparkStart as the driver finds it after its warm-up: its context's conf, and why its job failed."""
    return types.SimpleNamespace(failure=failure, context=lambda: types.SimpleNamespace(getConf=_Conf))


def test_a_warm_up_killed_by_yarn_for_memory_is_the_runs_failure_with_the_container_and_what_to_raise():
    message = killed_for_memory(warmed(KILLED_REASON))
    assert message.startswith("YARN killed an executor's container for exceeding its memory limit (685.1 MB used "
                              "of 640 MB)")
    assert "640 MiB (spark.executor.memory 512 MiB + spark.executor.memoryOverhead 128 MiB)" in message
    assert "the driver, which loaded the same model for its check, peaked at" in message
    assert re.search(r"Raise spark.executor.memoryOverhead to \d+m or more", message)


@pytest.mark.parametrize("failure", [None, "Job aborted due to stage failure: Task 0 failed 4 times: ValueError: x"])
def test_a_warm_up_that_failed_otherwise_or_not_at_all_leaves_the_run_to_go_on(failure):
    assert killed_for_memory(warmed(failure)) is None
    assert killed_for_memory(None) is None
