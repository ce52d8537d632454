"""The SparkContext started early, in a thread of its own, while the driver lists, checks and plans.

Creating a SparkContext takes seconds (its scheduler, then the executors'
launch: YARN containers, or local-cluster's processes), and the driver's own
work before its first Spark job takes seconds to hours: the listing, the
model's check, int8's quantization, the sample for the estimate. Started once
the run has claimed its output and found the model's files
(:class:`SparkStart`, ``mxjob.run.warm_up.early_spark``), the two overlap. In
cluster mode it is more than speed: YARN's ApplicationMaster waits
``spark.yarn.am.waitTime`` (100 s by default) for the driver's SparkContext
and fails the application when there is none by then, so a long listing or an
``--int8-exclude auto`` search (120 s by default) failed the EMR step.

Once the model the executors will load is known, :meth:`SparkStart.warm`
runs a small job of its own, one task per executor, that loads it into each
executor's Python worker (:func:`mxjob.executor.partition.warm_worker`): MXNet's
import and the model's load then overlap with the driver's sample and plan
instead of delaying the first batch. Python workers are reused between tasks
(``spark.python.worker.reuse``, Spark's default), so the run's tasks find the
model in their worker's cache. Spark's FIFO scheduler launches an earlier
job's tasks first, so the run's job waits for the warm-up's to be submitted
(:meth:`SparkStart.before_run`; both wait for the same executors to
register): a run's job that came first left the warm-up queued behind it,
its tasks loading the model themselves, and the warm-up killed by the stop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mxjob.core import state
from mxjob.core.errors import spark_failure_reason
from mxjob.core.secrets import spark_redaction_regex

log = logging.getLogger(__name__)

#: The warm-up job's group: a job of its own, never counted among the run's tasks.
WARM_GROUP = "mxinfer-warm-up"
#: Seconds the run's job waits for the warm-up's to reach Spark's scheduler once the warm-up is about to submit
#: it (a few Py4J calls: the function pickled, the RDD made), or to be about to once the run's job is ready.
SUBMIT_WAIT_SECONDS = 5.0


class SparkStart:
    """A SparkContext being created in a daemon thread from now on; :meth:`context` waits for it and re-raises its
    failure.

    Parameters
    ----------
    app_name : str
        ``--app-name``.
    spark_conf : dict, optional
        Settings on top of spark-submit's (the tests' and the bench's).
    """

    def __init__(self, app_name: str, spark_conf: dict | None = None):
        self.started = time.monotonic()
        self._sc = None
        self._error: BaseException | None = None
        self._ready = threading.Event()
        # Held while the warm-up reads the context and sets its job group;
        # stop() takes it to say "stopping".
        self._lock = threading.Lock()
        self._stopping = False
        self._warming: threading.Thread | None = None
        # Set by the warm-up once it is about to submit its job, or will submit none.
        self._submitting = threading.Event()
        self._run_began = False
        #: What each warm-up task returned, once its job ended; ``None`` until then, or when it failed.
        self.reports: list | None = None
        #: Why the warm-up's job failed (Spark's exception, as text), once it has; ``None`` otherwise.
        self.failure: str | None = None
        threading.Thread(target=self._start, args=(app_name, dict(spark_conf or {})), name="spark-start",
                         daemon=True).start()

    def _start(self, app_name: str, spark_conf: dict) -> None:
        from pyspark import SparkConf, SparkContext

        try:
            conf = SparkConf().setAppName(app_name).setAll(spark_conf.items())
            # The UI and the event log mask a value holding a URI's password (the driver's command line's).
            conf.set("spark.redaction.regex", spark_redaction_regex(conf.get("spark.redaction.regex", None)))
            self._sc = SparkContext.getOrCreate(conf)
            state.counters.spark_contexts += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised in the driver's thread by context()
            self._error = exc
        finally:
            self._ready.set()

    def head_start(self) -> float:
        """Seconds since Spark began starting: what comes off the estimate's start-up."""
        return time.monotonic() - self.started

    def context(self):
        """The SparkContext, once created; its creation's exception if it failed."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._sc

    def warm(self, job_for: Callable, warm_task: Callable) -> None:
        """Run the warm-up job in a thread of its own once the SparkContext exists.

        ``job_for(sc)`` returns ``(job, tasks)``: the run's ``JobSpec`` as the
        executors will get it, and how many tasks (one per executor);
        ``warm_task(index, tasks, job)`` runs on each, and what it returns is in
        :attr:`reports` (:meth:`wait_reports`). A warm-up that fails is
        logged and forgotten: the run's own tasks load the model as before,
        and report its failure as before.
        """
        self._warming = threading.Thread(target=self._warm, args=(job_for, warm_task), name="spark-warm-up",
                                         daemon=True)
        self._warming.start()

    def _warm(self, job_for: Callable, warm_task: Callable) -> None:
        started = time.monotonic()
        try:
            sc = self.context()
            with self._lock:
                if self._stopping:  # the run ended first (a failed listing, nothing new): nothing to warm
                    return
                job, tasks = job_for(sc)
                if self._run_began:  # the run's job went without it (before_run waited its longest)
                    log.debug("no warm-up: the run's tasks load the model")
                    return
                sc.setJobGroup(WARM_GROUP, f"load the model in {tasks} executors' Python workers",
                               interruptOnCancel=True)
                self._submitting.set()
            self.reports = sc.parallelize(range(tasks), tasks).mapPartitions(
                lambda _rows, j=job, n=tasks: [warm_task(_partition_id(), n, j)]).collect()
            if not any(getattr(report, "failure", None) for report in self.reports):  # else the driver says why
                log.info("the executors' Python workers loaded the model in %.1f s, while the driver planned",
                         time.monotonic() - started)
        except Exception as exc:  # noqa: BLE001 - an optimisation: the run's tasks load the model themselves
            if self._stopping:  # cancelled by stop(), or its context stopped under it: the run has ended
                log.debug("the warm-up ended with the run: %s", spark_failure_reason(exc))
            else:
                self.failure = str(exc)
                log.info("warming the executors up did not finish (%s); the run's first tasks load the model",
                         spark_failure_reason(exc))
        finally:
            self._submitting.set()

    def wait_reports(self, poll_seconds: float = 0.2) -> list | None:
        """Wait for the warm-up's job to end: what its tasks returned, or ``None`` (none started, or it failed).

        Waits in steps of ``poll_seconds``, between which the main thread runs
        its signal handlers (a SIGTERM must not wait for the executors).
        """
        warming = self._warming
        while warming is not None and warming.is_alive():
            warming.join(poll_seconds)
        return self.reports

    def before_run(self, sc, wait_seconds: float = SUBMIT_WAIT_SECONDS) -> None:
        """Just before the run's own job: let a warm-up's job reach Spark's scheduler first.

        Spark's FIFO scheduler launches the tasks of the job submitted first
        first: the warm-up's then load the model once per executor and the
        run's find it. Both threads wait for the executors to register
        (:func:`mxjob.run.cluster.host_threads`), so this waits milliseconds, for
        the warm-up's few Py4J calls (Spark's public status tracker tells
        when its job exists), and at most ``wait_seconds`` for each step; a
        warm-up that has not begun to submit by then submits nothing.
        """
        warming = self._warming
        if warming is None:
            return
        self._submitting.wait(wait_seconds)
        with self._lock:  # from here a warm-up that has not begun to submit submits nothing
            self._run_began = True
        if self._submitting.is_set():
            tracker = sc.statusTracker()
            deadline = time.monotonic() + wait_seconds
            while (warming.is_alive() and not tracker.getJobIdsForGroup(WARM_GROUP)
                   and time.monotonic() < deadline):
                time.sleep(0.01)

    def run_ended(self) -> None:
        """The run's job has ended: a warm-up still running (a one-batch run can outpace its second task) ends
        with the SparkContext's stop, and says so only at debug level."""
        with self._lock:
            self._stopping = True

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the SparkContext once it exists (``timeout`` at most): a run that needed no Spark job, or failed
        before it. In cluster mode YARN's ApplicationMaster then reports the application by the driver's exit
        code; after the run's own job (stopped already), this does nothing."""
        with self._lock:  # a warm-up between its context and its job group finishes that first
            self._stopping = True
        self._ready.wait(timeout)
        if self._sc is not None:
            try:
                self._sc.cancelJobGroup(WARM_GROUP)
                self._sc.stop()
            except Exception as exc:  # noqa: BLE001 - the JVM may be gone already
                log.debug("stopping Spark: %s", exc)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0
