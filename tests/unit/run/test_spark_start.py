"""SparkStart's warm-up against a run that ends first: it stays quiet and never touches a stopped context.

A run that fails at its listing (or finds nothing new) stops the SparkContext
started early while the warm-up thread may be reading it: the user then saw
two lines about PySpark internals ("cannot list the executors...", "warming
the executors up did not finish ('NoneType' object has no attribute
'setJobGroup')") beside the run's one error. A fake context stands in for
Spark here; tests/integration/test_job.py runs the real one.
"""

from __future__ import annotations

import logging
import threading

import pytest

from mxjob.run import cluster, spark_start
from mxjob.run.spark_start import SparkStart


class FakeContext:
    def __init__(self):
        self.calls: list[str] = []
        self.stopped = False
        self.submitted = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def setJobGroup(self, group, description, interruptOnCancel=False):
        assert not self.stopped, "setJobGroup on a stopped context"
        self.calls.append("setJobGroup")

    def parallelize(self, data, slices):
        if self.stopped:  # what PySpark raises once stop() dropped its handles
            raise AttributeError("'NoneType' object has no attribute 'sc'")
        self.calls.append("parallelize")
        return self

    def mapPartitions(self, function):
        self.function = function
        return self

    def collect(self):
        self.calls.append("job")
        self.submitted.set()
        self.release.wait(10)  # a real job runs until its tasks end
        return list(self.function(iter([])))

    def statusTracker(self):
        return self

    def getJobIdsForGroup(self, group):
        return [0] if group == spark_start.WARM_GROUP and self.submitted.is_set() else []

    def cancelJobGroup(self, group):
        self.calls.append("cancel")

    def stop(self):
        self.stopped = True
        self.calls.append("stop")


@pytest.fixture
def fake(monkeypatch):
    context = FakeContext()

    def start(self, app_name, conf):
        self._sc = context
        self._ready.set()

    monkeypatch.setattr(SparkStart, "_start", start)
    return context


def test_a_warm_up_after_the_run_stopped_spark_does_nothing_and_says_nothing(fake, caplog):
    start = SparkStart("app")
    start.stop()
    asked = []
    with caplog.at_level(logging.DEBUG, logger=spark_start.__name__):
        start._warm(lambda sc: asked.append(sc) or ("job", 2), lambda index, tasks, job: None)
    assert asked == [] and fake.calls == ["cancel", "stop"]
    assert caplog.records == []


def test_a_stop_waits_for_a_warm_up_reading_the_context_and_its_end_is_only_a_debug_line(fake, caplog):
    start = SparkStart("app")
    inside, release = threading.Event(), threading.Event()

    def job_for(sc):
        inside.set()
        release.wait(10)
        return "job", 2

    stopper = threading.Thread(target=start.stop)
    with caplog.at_level(logging.DEBUG, logger=spark_start.__name__):
        warmer = threading.Thread(target=start._warm, args=(job_for, lambda index, tasks, job: None))
        warmer.start()
        assert inside.wait(10)
        stopper.start()
        stopper.join(0.3)
        assert stopper.is_alive() and not fake.stopped  # the stop waits while the warm-up reads the context
        release.set()
        stopper.join(10)
        warmer.join(10)
    # The group was set before the stop, never on a stopped context (FakeContext asserts that); its job ran
    # before the stop or failed on the stopped context, which is a debug line, not the user's business.
    assert fake.calls[0] == "setJobGroup" and fake.calls.index("stop") > 0
    assert not any("did not finish" in r.getMessage() for r in caplog.records)
    assert all(r.levelno == logging.DEBUG or "loaded the model" in r.getMessage() for r in caplog.records)


def test_a_warm_up_that_fails_on_its_own_says_the_run_loads_the_model_itself(fake, caplog):
    start = SparkStart("app")

    def job_for(sc):
        raise OSError("executor lost")

    with caplog.at_level(logging.INFO, logger=spark_start.__name__):
        start._warm(job_for, lambda index, tasks, job: None)
    assert [r.getMessage() for r in caplog.records] == [
        "warming the executors up did not finish (executor lost); the run's first tasks load the model"]


def test_the_context_starts_at_once_and_the_head_start_counts_from_there(fake):
    start = SparkStart("app")
    assert start.context() is fake and start.head_start() > 0.0
    assert fake.calls.count("stop") == 0
    start.stop()
    assert fake.calls.count("stop") == 1


def test_the_runs_job_waits_for_the_warm_ups_job_to_reach_the_scheduler(fake):
    # Spark's FIFO scheduler launches the job submitted first first: the warm-up's tasks load the model, the
    # run's find it. A run's job that went first left the warm-up queued behind it and killed by the stop.
    fake.release.clear()
    start = SparkStart("app")
    ready, pickling = threading.Event(), threading.Event()

    def job_for(sc):
        ready.set()
        return "job", 2

    original = fake.parallelize

    def slow_parallelize(data, slices):  # the warm-up's Py4J calls before its job exists
        pickling.set()
        threading.Event().wait(0.3)
        return original(data, slices)

    fake.parallelize = slow_parallelize
    start.warm(job_for, lambda index, tasks, job: None)
    assert pickling.wait(10)
    start.before_run(fake)
    assert fake.submitted.is_set() and fake.calls[-1] == "job"
    fake.release.set()


def test_a_warm_up_not_yet_submitting_when_the_run_begins_submits_nothing(fake, caplog):
    start = SparkStart("app")
    start._warming = threading.Thread(target=lambda: None)  # a warm-up thread not yet at its job
    start._warming.start()
    start.before_run(fake, wait_seconds=0.05)
    with caplog.at_level(logging.DEBUG, logger=spark_start.__name__):
        start._warm(lambda sc: ("job", 2), lambda index, tasks, job: None)
    assert "job" not in fake.calls and "setJobGroup" not in fake.calls
    assert [r.getMessage() for r in caplog.records] == ["no warm-up: the run's tasks load the model"]


def test_a_warm_up_ending_after_the_runs_job_is_only_a_debug_line(fake, caplog):
    # A one-batch run can end while the warm-up's second task still loads: the stop then kills the warm-up.
    start = SparkStart("app")

    def killed_by_the_stop():
        start.run_ended()
        raise OSError("Job 1 cancelled because SparkContext was shut down")

    fake.collect = killed_by_the_stop
    with caplog.at_level(logging.DEBUG, logger=spark_start.__name__):
        start._warm(lambda sc: ("job", 2), lambda index, tasks, job: None)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "the warm-up ended with the run: Job 1 cancelled because SparkContext was shut down")]


def test_before_run_without_a_warm_up_waits_for_nothing(fake):
    start = SparkStart("app")
    start.before_run(fake, wait_seconds=30)  # returns at once: no warm-up was started
    assert fake.calls == []


# --- the SparkContext's stop after the run's job (mxjob.run.cluster.SparkStop)


class BlockingServer:
    """PySpark's accumulator server as far as its stop goes: its shutdown waits for its handler's next look."""

    def __init__(self):
        self.begun, self.release, self.done = threading.Event(), threading.Event(), threading.Event()

    def shutdown(self):
        self.begun.set()
        self.release.wait(10)  # the handler's poll: up to a second in PySpark
        self.done.set()


class StoppingContext:
    """What SparkContext.stop does: the JVM's context, then the accumulator server's shutdown, waited for."""

    def __init__(self, server: bool = True):
        self.stopped = threading.Event()
        if server:
            self._accumulatorServer = BlockingServer()

    def stop(self):
        server = getattr(self, "_accumulatorServer", None)
        if server is not None:
            server.shutdown()
        self.stopped.set()


def test_after_the_runs_job_the_stop_does_not_wait_for_the_accumulator_servers_poll():
    sc = StoppingContext()
    server = sc._accumulatorServer
    stopping = cluster.SparkStop(sc, job_ended=True)
    assert sc.stopped.wait(10) and stopping.wait(10) is not None  # stopped while the server still polls
    assert server.begun.is_set() and not server.done.is_set()
    server.release.set()
    assert server.done.wait(10)  # and the server shut down in the background after all


def test_after_a_failure_or_a_signal_the_stop_is_pysparks_own():
    # Tasks of a failed job may still report: the stop then waits for the server, as PySpark's does.
    sc = StoppingContext()
    stopping = cluster.SparkStop(sc)
    assert not sc.stopped.wait(0.3)
    sc._accumulatorServer.release.set()
    assert stopping.wait(10) is not None and sc.stopped.is_set()


def test_a_pyspark_without_the_private_server_handle_stops_as_its_public_stop_does(caplog):
    sc = StoppingContext(server=False)
    with caplog.at_level(logging.DEBUG, logger=cluster.__name__):
        assert cluster.release_accumulator_server(sc) is False
        assert cluster.SparkStop(sc, job_ended=True).wait(10) is not None
    assert sc.stopped.is_set()
    assert "PySpark has no SparkContext._accumulatorServer.shutdown" in caplog.text
