"""A failed Spark job is an interruption only when PySpark's own JVM handles say the JVM is stopping.

``mxjob.run.cluster.jvm_shutting_down`` asks spark-submit's JVM through PySpark's
private handles (``SparkContext._jvm``, ``SparkContext._jsc``). A handle that
``SparkContext.stop()`` dropped, or a JVM that no longer answers, makes the
failure an interruption (exit 143); an ``AttributeError`` from anything else,
the job itself or a changed PySpark, must surface as the job's failure (exit 1),
with a warning that names the private call when it was the question that
failed. Without Spark: a stand-in SparkContext with just what ``run_spark``
touches.
"""

from __future__ import annotations

import logging
import signal
import time
from types import SimpleNamespace

import pyspark
import pytest
from py4j.protocol import Py4JError

from mxjob.core import state
from mxjob.core.errors import JobError
from mxjob.options import config
from mxjob.run import cluster, rerun, signals


def jvm(in_shutdown=False, stopped=False):
    """A stand-in for Py4J's view of the JVM and the Java SparkContext: each answer a value or an exception."""
    def answer(value):
        def call():
            if isinstance(value, BaseException):
                raise value
            return value
        return call

    view = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(spark=SimpleNamespace(util=SimpleNamespace(
        ShutdownHookManager=SimpleNamespace(inShutdown=answer(in_shutdown)))))))
    java_context = SimpleNamespace(sc=lambda: SimpleNamespace(isStopped=answer(stopped)))
    return view, java_context


class FakeSparkContext:
    """Just what ``run_spark`` touches; its job raises ``failure`` after ``during_job`` ran."""

    version, master, applicationId = "3.5.7", "local[1]", "local-1"

    def __init__(self, failure: BaseException, during_job=lambda sc: None, **answers):
        self._jvm, self._jsc = jvm(**answers)
        self.failure, self.during_job, self.stopped = failure, during_job, False

    def getConf(self):
        conf = {"spark.master": "local[1]", "spark.app.name": "test"}
        return SimpleNamespace(getAll=lambda: list(conf.items()), get=conf.get)

    def setLogLevel(self, level):
        pass

    def setJobGroup(self, group, description):
        pass

    def addFile(self, path):
        pass

    def accumulator(self, value, param):
        return SimpleNamespace(value=value)

    def parallelize(self, spans, partitions):
        def total():
            self.during_job(self)
            raise self.failure

        return SimpleNamespace(mapPartitionsWithIndex=lambda score: SimpleNamespace(sum=total))

    def cancelAllJobs(self):
        pass

    def stop(self):
        self.stopped = True


@pytest.fixture
def run_on(monkeypatch):
    """``run_on(sc)``: ``cluster.run_spark`` on the stand-in ``sc``; returns what it raised."""
    monkeypatch.setattr(state.counters, "spark_contexts", 0)
    monkeypatch.setattr(rerun, "remember_conf", lambda conf: None)  # the process's resume command stays untouched
    monkeypatch.setattr(cluster, "executor_hosts", lambda sc: ["127.0.0.1"])  # no 30 s wait for executors
    cfg = config.resolve(config.merge_settings(
        {"input": "s3://in/p/", "model": "s3://m/r18", "output": "s3://out/o.jsonl"}, {}))
    run = SimpleNamespace(spans=[(0, 1)], batches=1, prefix="o.jsonl.parts/run-0001/", keys=1)

    def run_on(sc) -> BaseException:
        monkeypatch.setattr(pyspark.SparkContext, "getOrCreate", classmethod(lambda cls, conf=None: sc))
        with pytest.raises((JobError, signals.Interrupted)) as raised:
            cluster.run_spark(cfg, run, "plan-key")
        deadline = time.monotonic() + 5  # after a signal the stop goes on in a thread of its own
        while not sc.stopped and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sc.stopped  # released either way
        return raised.value

    return run_on


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == cluster.__name__ and r.levelno == logging.WARNING]


def test_an_attribute_error_of_the_job_itself_is_its_failure_not_an_interruption(run_on, caplog):
    failure = AttributeError("'NoneType' object has no attribute 'decode'")
    with caplog.at_level(logging.WARNING, logger=cluster.__name__):
        raised = run_on(FakeSparkContext(failure))
    assert isinstance(raised, JobError) and "'NoneType' object has no attribute 'decode'" in str(raised)
    assert raised.__cause__ is failure
    assert not warnings_of(caplog)  # the JVM answered: nothing to warn about


def test_an_unrelated_attribute_error_while_asking_the_jvm_is_not_an_interruption(run_on, caplog):
    # The question fails, but not because a handle is gone: e.g. a Py4J object of a changed PySpark.
    sc = FakeSparkContext(AttributeError("'Scoring' object has no attribute 'finish'"),
                          stopped=AttributeError("'JavaMember' object has no attribute 'isStopped'"))
    with caplog.at_level(logging.WARNING, logger=cluster.__name__):
        raised = run_on(sc)
    assert isinstance(raised, JobError), raised  # exit 1 with the job's own reason, not 143
    assert "'Scoring' object has no attribute 'finish'" in str(raised)
    [warning] = warnings_of(caplog)
    assert ("SparkContext._jsc.sc().isStopped()" in warning and "PySpark's private JVM handles" in warning
            and "failed with AttributeError: 'JavaMember' object has no attribute 'isStopped'" in warning)


def test_a_context_stopped_under_the_job_is_an_interruption(run_on):
    def stop(sc):
        sc._jsc = None  # what SparkContext.stop() does to its handle

    raised = run_on(FakeSparkContext(Py4JError("An error occurred while calling o31.sum"), during_job=stop))
    assert isinstance(raised, signals.Interrupted) and raised.signum == signal.SIGTERM  # exit 128 + 15 = 143
    assert str(raised) == signals.JVM_SHUTDOWN


@pytest.mark.parametrize(("answers", "interrupted"), [
    ({"in_shutdown": True}, True),
    ({"stopped": True}, True),
    ({}, False),
    # A JVM that went away mid-call: Py4J's bare error.
    ({"in_shutdown": Py4JError("An error occurred while calling z:org.apache.spark.util.ShutdownHookManager."
                               "inShutdown")}, True),
    # A JVM that answered it has no such class: a changed Spark, not a stopping one.
    ({"in_shutdown": Py4JError("org.apache.spark.util.ShutdownHookManager.inShutdown does not exist in the JVM")},
     False),
    ({"stopped": TypeError("'NoneType' object is not callable")}, False),
])
def test_only_the_jvms_own_signs_of_stopping_make_an_interruption(answers, interrupted, caplog):
    sc = FakeSparkContext(RuntimeError("job failed"), **answers)
    with caplog.at_level(logging.WARNING, logger=cluster.__name__):
        assert cluster.jvm_shutting_down(sc, RuntimeError("Job aborted")) is interrupted
    failed_question = any(isinstance(v, BaseException) for v in answers.values()) and not interrupted
    assert len(warnings_of(caplog)) == int(failed_question)


@pytest.mark.parametrize("handle", ["_jvm", "_jsc"])
def test_a_pyspark_without_a_private_jvm_handle_reports_the_failure_and_names_the_handle(handle, caplog):
    sc = FakeSparkContext(RuntimeError("job failed"))
    delattr(sc, handle)
    with caplog.at_level(logging.WARNING, logger=cluster.__name__):
        assert cluster.jvm_shutting_down(sc, RuntimeError("Job aborted")) is False
        assert cluster.jvm_shutting_down(sc, RuntimeError("SparkContext was shut down")) is True  # the text still says
    [warning] = warnings_of(caplog)
    assert f"PySpark {pyspark.__version__} has no SparkContext.{handle} (a private handle on its JVM)" in warning


def test_without_the_java_context_handle_the_executors_are_not_listed_and_the_warning_names_it(caplog):
    sc = FakeSparkContext(RuntimeError("unused"))
    del sc._jsc
    with caplog.at_level(logging.WARNING, logger=cluster.__name__):
        assert cluster.host_threads(sc, wait_seconds=0.1) is None  # workers size their threads without the plan
    [warning] = warnings_of(caplog)
    assert "through PySpark's private SparkContext._jsc" in warning and "has no SparkContext._jsc" in warning
