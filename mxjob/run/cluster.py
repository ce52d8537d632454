"""The Spark side of the driver: the job over the run's batches, executors' threads, progress lines."""

from __future__ import annotations

import functools
import logging
import os
import platform
import signal
import threading
import time
from collections import Counter
from dataclasses import replace

from mxjob.core import state
from mxjob.core.errors import JobError, first_line, plural, spark_failure_reason
from mxjob.executor.partition import score_into
from mxjob.executor.stats import StatsAccumulator, StatsFold
from mxjob.model.worker import HostThreads
from mxjob.options.config import JobConfig
from mxjob.outputs import work_prefix
from mxjob.reporting.progress import Reporter
from mxjob.run import container_memory, rerun, signals
from mxjob.run.container_memory import ExecutorContainer
from mxjob.run.spark_start import SparkStart

log = logging.getLogger(__name__)


class SparkStop:
    """The SparkContext stopping in a thread of its own: the driver's last steps need not wait for it.

    Stopping releases the executors (YARN containers, local-cluster's
    processes) and takes about a second; the assembly's tail, the summary
    and the clean-up run meanwhile, and :meth:`wait` joins it before the
    driver exits.
    """

    def __init__(self, sc, context: dict | None = None, job_ended: bool = False):
        #: Seconds the stop took, once it has.
        self.seconds: float | None = None
        #: Where the job ran (:func:`context_info`), for the summary.
        self.context = context or {}
        self._thread = threading.Thread(target=self._stop, args=(sc, job_ended), name="spark-stop", daemon=True)
        self._thread.start()

    def _stop(self, sc, job_ended: bool) -> None:
        started = time.monotonic()
        if job_ended:  # every task's accumulator update is in: its server can go first
            release_accumulator_server(sc)
        stop_context(sc)
        self.seconds = time.monotonic() - started

    def wait(self, timeout: float = 120.0) -> float | None:
        """Wait for the stop (up to ``timeout``); return its seconds, ``None`` if it has not ended."""
        self._thread.join(timeout)
        return self.seconds


def context_info(sc) -> dict:
    """Where the job ran: Spark's and the driver's Python's versions (the stack: EMR 7 or 8), Spark's master, deploy
    mode (``cluster``: the driver in YARN's AM container), app id."""
    return {"version": sc.version, "python": platform.python_version(), "master": sc.master,
            "deploy_mode": sc.getConf().get("spark.submit.deployMode", "client"), "application_id": sc.applicationId}


def satisfy_application_master() -> None:
    """In YARN's ApplicationMaster (cluster mode), start and stop a SparkContext if this driver started none.

    The ApplicationMaster waits for the driver's SparkContext and reports the
    application FAILED ("User did not initialize spark context!"), then tries
    it again, when the driver ends without one, even with exit code 0: a run
    with nothing to score (a ``--resume`` of a complete output, a ``--dry-run``)
    would fail its EMR step. ``CONTAINER_ID`` is set in YARN's containers only,
    and only the ApplicationMaster's runs the job's driver.
    """
    if state.counters.spark_contexts or not os.environ.get("CONTAINER_ID"):
        return
    from pyspark import SparkConf, SparkContext

    log.info("no Spark job was needed; starting and stopping Spark so that YARN's ApplicationMaster reports success")
    stop_context(SparkContext.getOrCreate(SparkConf()))


#: PySpark's private handle on its accumulator server (``SparkContext._accumulatorServer``), the one internal
#: :func:`release_accumulator_server` uses; without it, ``SparkContext.stop`` stops the server as before.
ACCUMULATOR_SERVER = "_accumulatorServer"


def release_accumulator_server(sc) -> bool:
    """Shut PySpark's accumulator server down in the background, so that ``sc.stop()`` does not wait for it.

    ``SparkContext.stop`` stops the JVM's context (0.2 s here), then shuts
    the accumulator server down and waits: its connection handler looks for
    the shutdown once a second (``pyspark/accumulators.py``), so about 0.8 s
    more at the end of every run, the driver waiting. Here the shutdown runs
    in a daemon thread of its own, and this server's ``shutdown`` (the
    instance's, not PySpark's class) becomes a no-op for ``stop`` to call.
    Only once the run's job has ended, when no task has an update left to
    send. Through the private :data:`ACCUMULATOR_SERVER`; a PySpark without
    it (another version) stops both in turn, as its public ``stop`` does.
    Whether the server was released.
    """
    server = getattr(sc, ACCUMULATOR_SERVER, None)
    shutdown = getattr(server, "shutdown", None)
    if not callable(shutdown):
        log.debug("PySpark has no SparkContext.%s.shutdown: the accumulator server stops after the JVM's context",
                  ACCUMULATOR_SERVER)
        return False
    threading.Thread(target=shutdown, name="accumulator-server-stop", daemon=True).start()
    server.shutdown = lambda: None  # begun above: SparkContext.stop goes on without waiting for it
    return True


def stop_context(sc) -> None:
    """Stop the SparkContext; after a signal the JVM may be gone already."""
    try:
        sc.stop()
    except Exception as exc:  # noqa: BLE001 - nothing left to stop
        log.debug("stopping Spark: %s", exc)


def ship_files(sc, job) -> None:
    """The driver's local files the executors read by name (``SparkFiles.get``): the ``--handler``'s and the
    ``--plugin`` files' copies (:mod:`mxjob.core.plugins`), and the int8 checkpoint (``ModelSpec.read``)."""
    for path in ([job.handler] if job.handler else []) + list(job.plugins) + job.model.shipped_files():
        sc.addFile(path)


def run_spark(cfg: JobConfig, run: work_prefix.Run, batches_key: str, start: SparkStart | None = None,
              on_tick=None, ticks=None) -> tuple[StatsFold, SparkStop]:
    """Score one partition per batch of ``run`` on the cluster; return the tasks' stats, folded, and the stop.

    Each partition holds one ``(offset, length)`` span of the run's batch list
    (``batches_key``): the task reads its keys from there and writes its lines
    under the run's prefix (:func:`part_key`). The keys never pass
    through Py4J, and nothing but an accumulator of stats comes back here.
    ``start`` is the SparkContext the driver started early (:class:`SparkStart`); without it one
    starts now. ``on_tick`` and ``ticks`` go to the progress thread (:class:`mxjob.reporting.progress.Reporter`).
    After a job that succeeded, the SparkContext stops in the background
    (:class:`SparkStop`, for the caller to wait on); after one that failed,
    before this returns.
    """
    start = start or SparkStart(cfg.app_name)
    sc = start.context()
    main_thread = threading.current_thread() is threading.main_thread()
    if signal.getsignal(signal.SIGTERM) is signals.raise_interrupted and main_thread:
        # PySpark's SparkContext puts its own SIGINT handler in (cancel the jobs, then
        # KeyboardInterrupt, with Py4J's stacks): Ctrl-C must end as SIGTERM does.
        signal.signal(signal.SIGINT, signals.raise_interrupted)
    sc.setLogLevel("WARN")
    conf = dict(sc.getConf().getAll())
    rerun.remember_conf(conf)  # for the resume command, if the run does not finish
    context = context_info(sc)
    container = ExecutorContainer.from_conf(conf)
    log.info("Spark %s, master %s (%s deploy mode), app %s: %s", context["version"], context["master"],
             context["deploy_mode"], context["application_id"], plural(run.batches, "partition"))
    rdd = sc.parallelize(run.spans, run.batches)
    job = replace(cfg.job_spec(), output_bucket=cfg.output_bucket, parts_prefix=run.prefix, batches_key=batches_key,
                  host_threads=host_threads(sc))
    ship_files(sc, job)
    # Each task's stats tell the driver's live merge that the task's part is durable (StatsAccumulator).
    stats = sc.accumulator(StatsFold(), StatsAccumulator((job.output_bucket, job.parts_prefix)))
    score = functools.partial(score_into, job=job, stats=stats)
    stop = threading.Event()
    reporter = Reporter(lambda: stats.value, run.batches, run.keys, cfg.progress_seconds,
                        expected_executors(conf), on_tick, ticks)
    threading.Thread(target=reporter.run, args=(stop,), daemon=True).start()
    group = f"mxinfer-{run.prefix}"

    def score_batches():
        # A job group is a property of the thread that starts the job (PySpark pins Python threads to
        # JVM threads), so it is set here, in run_cancellable's thread; lost_task_attempts reads it.
        sc.setJobGroup(group, f"score {run.batches} batches")
        return rdd.mapPartitionsWithIndex(score).sum()

    start.before_run(sc)  # a warm-up's tasks first: the run's then find the model loaded
    try:
        run_cancellable(sc, score_batches)
        start.run_ended()
        stop.set()
        reporter.tick(final=True)  # a job shorter than the first tick still prints a line
        fold = stats.value
        fold.lost_task_attempts = lost_task_attempts(sc, group)
    except BaseException as exc:
        signals.ending.set()
        start.run_ended()
        stop.set()
        if not isinstance(exc, Exception):
            # A signal (YARN's kill, Ctrl-C): the status must say "interrupted" before YARN's SIGKILL
            # (yarn.nodemanager.sleep-delay-before-sigkill.ms after its SIGTERM), and a stop can take
            # seconds on a loaded node: it goes on in the background while the driver writes the status.
            SparkStop(sc)
            raise
        finished = stats.value  # the tasks that did finish: their workers' memory, for the message below
        # Asked before the stop below, which would make every failure look like the JVM's shutdown.
        shutting_down = jvm_shutting_down(sc, exc)
        # Release the executors now rather than letting the JVM's shutdown race them (a JVM shutting down
        # alone, too: its RPC threads print stack traces when the executors are left to it).
        stop_context(sc)
        if shutting_down:  # a signal to spark-submit's JVM alone: an interruption, not a failure
            raise signals.Interrupted(signal.SIGTERM, signals.JVM_SHUTDOWN) from exc
        raise JobError(container_memory.killed_message(str(exc), container, finished.workers,
                                                       container_memory.driver_peak_mib())
                       or f"the Spark job failed: {spark_failure_reason(exc)}") from exc
    if container is not None:
        context["executor_container"] = container_memory.fit(container, fold.workers)
        log_container_fit(container, context["executor_container"])
    return fold, SparkStop(sc, context, job_ended=True)


def log_container_fit(container: ExecutorContainer, fit: dict) -> None:
    """One line on the executors' memory: the container's limit and the Python workers' peak; a warning when close."""
    peak, share = fit["python_worker_peak_rss_mib"], fit["python_worker_peak_share_of_limit"]
    if peak is None:
        return
    line = (f"executor containers of {container.describe()}: the Python workers peaked at {peak:,.0f} MiB RSS "
            f"({share:.0%} of the limit, beside the executor's JVM)")
    if share > 0.8:
        log.warning("%s; YARN kills a container over its limit: raise spark.executor.memoryOverhead", line)
    else:
        log.info("%s", line)


def lost_task_attempts(sc, group: str, wait_seconds: float = 10.0) -> int | None:
    """Task attempts of the job group that failed (an executor lost, a worker crashed), from Spark's status tracker.

    A failed attempt never reports to the stats accumulator (Spark merges only
    successful tasks' updates), so the driver asks Spark itself: each stage's
    ``numFailedTasks``. Spark counts an attempt that lost a speculation race as
    killed, not failed, so speculation adds nothing here. The tracker is fed by
    Spark's listener bus, which may trail the job's end by a moment: this waits
    (up to ``wait_seconds``) until the tracker has seen every job end. ``None``
    when the tracker cannot tell.
    """
    try:
        tracker = sc.statusTracker()
        deadline = time.monotonic() + wait_seconds
        jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
        pause = 0.05
        while any(j is None or j.status == "RUNNING" for j in jobs) and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(2 * pause, 1.0)  # each look is Py4J calls: less often the longer the listener bus trails
            jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
        stages = [tracker.getStageInfo(stage) for job in jobs if job is not None for stage in job.stageIds]
        return sum(stage.numFailedTasks for stage in stages if stage is not None)
    except Exception as exc:  # noqa: BLE001 - a count for the summary must not fail a finished job
        log.warning("cannot count the lost task attempts: %s", first_line(exc))
        return None


#: Seconds between the main thread's looks at its signals while the Spark job runs.
SIGNAL_POLL_SECONDS = 0.2
#: Seconds to let a cancelled job's call return before going on without it.
CANCEL_WAIT_SECONDS = 30.0


def run_cancellable(sc, action):
    """Run ``action`` (a Spark action) in a thread of its own; cancel every Spark job if the main thread is interrupted.

    A Py4J call blocks the thread that makes it, and Python runs signal
    handlers in the main thread only, between bytecodes: a SIGTERM to the
    driver's Python process alone would wait for the whole job. Here the main
    thread only waits, in short steps that each let a handler run; the
    :class:`signals.Interrupted` it raises cancels the jobs
    (``SparkContext.cancelAllJobs``) and goes on once the action has returned.
    Returns the action's value, or raises its exception.
    """
    outcome: dict = {}

    def run():
        try:
            outcome["value"] = action()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="spark-job", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(SIGNAL_POLL_SECONDS)
    except BaseException:  # Interrupted, KeyboardInterrupt: stop the job, then go on with the interruption
        cancel_jobs(sc)
        worker.join(CANCEL_WAIT_SECONDS)
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def cancel_jobs(sc) -> None:
    """Cancel every running Spark job; a JVM already gone has nothing left to cancel."""
    try:
        sc.cancelAllJobs()
    except Exception as exc:  # noqa: BLE001 - the JVM may be shutting down too
        log.debug("cancelling the Spark jobs: %s", first_line(exc))


#: PySpark's private handles on its JVM that the driver asks: the gateway's view of the JVM and the Java
#: SparkContext. PySpark has no public call for what the driver asks through them (is the JVM shutting
#: down, is the context stopped, which executors are registered), so there is no public fallback: without
#: them the driver says which is missing and goes on without the answer.
JVM_HANDLES = ("_jvm", "_jsc")


def missing_jvm_handles(sc, names: tuple[str, ...] = JVM_HANDLES) -> str | None:
    """Which of PySpark's private JVM handles ``names`` this SparkContext lacks (``None``: it has them all)."""
    missing = [name for name in names if not hasattr(sc, name)]
    if not missing:
        return None
    import pyspark

    return (f"PySpark {pyspark.__version__} has no {' or '.join(f'SparkContext.{name}' for name in missing)} "
            "(a private handle on its JVM)")


#: Py4J's words for a class or method the JVM does not have (its API changed, it is not going away).
_JVM_API_CHANGED = ("does not exist", "Trying to call a package")

#: What :func:`jvm_shutting_down` asks the JVM, named in its warning when the question fails.
_SHUTDOWN_PROBE = ("SparkContext._jvm.org.apache.spark.util.ShutdownHookManager.inShutdown() or "
                   "SparkContext._jsc.sc().isStopped() (through PySpark's private JVM handles)")


def jvm_shutting_down(sc, exc: BaseException) -> bool:
    """Whether the job failed because spark-submit's JVM is shutting down, or is gone.

    Its shutdown hook stops the SparkContext, so the job fails with one of
    several reasons ("SparkContext was shut down", on local-cluster "Master
    removed our application"): the JVM's own state says which, not the text.
    Asked through PySpark's private JVM handles (:data:`JVM_HANDLES`); only
    their own signs of a stopped context count: a handle that ``stop()`` has
    dropped, or a Py4J error of a JVM that no longer answers. Any other error
    of the question (an ``AttributeError`` of a changed PySpark, Py4J's "does
    not exist" of a changed Spark) is logged with the private call that
    failed, and the job's failure is reported as what it is.
    """
    if "SparkContext was shut down" in str(exc):
        return True
    answer = _jvm_says_shutting_down(sc)
    if isinstance(answer, str):
        log.warning("cannot ask Spark's JVM whether it is shutting down: %s; reporting the job's failure as it is",
                    answer)
        return False
    return answer


def _jvm_says_shutting_down(sc) -> bool | str:
    """The JVM's answer for :func:`jvm_shutting_down`, or why it cannot be asked (what is missing or failed)."""
    from py4j.protocol import Py4JError

    missing = missing_jvm_handles(sc)
    if missing is not None:
        return missing
    if sc._jvm is None or sc._jsc is None:
        return True  # SparkContext.stop() drops its handles: the context was stopped under the job
    try:
        return bool(sc._jvm.org.apache.spark.util.ShutdownHookManager.inShutdown() or sc._jsc.sc().isStopped())
    except Py4JError as probe:
        # A JVM that went away mid-call: Py4J logs the network error and raises a bare "An error occurred
        # while calling". A JVM that answered that it has no such class or method has changed, not gone.
        # Py4J's own message (args), not str(): a Java exception's str() asks the JVM again.
        text = str(probe.args[0]) if probe.args else ""
        if any(sign in text for sign in _JVM_API_CHANGED):
            return f"{_SHUTDOWN_PROBE} is not in this Spark: {text.strip().splitlines()[0]}"
        return True
    except Exception as probe:  # noqa: BLE001 - the job's own failure is the one to report
        return f"{_SHUTDOWN_PROBE} failed with {type(probe).__name__}: {first_line(probe)}"


def expected_executors(conf: dict) -> int | None:
    """Executors the cluster will start: ``local-cluster[N,...]``'s N, else ``spark.executor.instances``.

    ``None`` with dynamic allocation, or when nothing says (standalone, Kubernetes).
    """
    master = conf.get("spark.master", "")
    if master.startswith("local-cluster["):
        return int(master[len("local-cluster["):].split(",")[0])
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return None
    instances = conf.get("spark.executor.instances")
    return int(instances) if instances and str(instances).isdigit() else None


def executor_hosts(sc) -> list[str]:
    """The host of each registered executor (not the driver), from the SparkContext's JVM.

    Through PySpark's private ``SparkContext._jsc`` (see :data:`JVM_HANDLES`); raises
    ``AttributeError`` naming it when this PySpark has none.
    """
    missing = missing_jvm_handles(sc, ("_jsc",))
    if missing is not None:
        raise AttributeError(missing)
    jsc = sc._jsc.sc()
    driver = jsc.env().blockManager().blockManagerId()
    return [info.host() for info in jsc.statusTracker().getExecutorInfos()
            if (info.host(), info.port()) != (driver.host(), driver.port())]


def host_threads(sc, wait_seconds: float = 30.0) -> HostThreads | None:
    """What the workers need to size their threads (:func:`worker_threads`).

    Executors register a few seconds after the SparkContext starts; this waits
    (up to ``wait_seconds``) for the expected number, or for the first one if
    the number is unknown, so two executors on one host do not both take
    every core.
    """
    conf = dict(sc.getConf().getAll())
    wanted = expected_executors(conf)
    deadline = time.monotonic() + wait_seconds
    try:
        hosts = executor_hosts(sc)
        while len(hosts) < (wanted or 1) and time.monotonic() < deadline:
            time.sleep(0.25)
            hosts = executor_hosts(sc)
    except Exception as exc:  # noqa: BLE001 - a JVM API that changed must not stop the job
        log.warning("cannot list the executors through PySpark's private SparkContext._jsc (%s: %s); workers size "
                    "their threads without them: set --threads if the summary warns", type(exc).__name__,
                    first_line(exc))
        return None
    return count_host_threads(conf, hosts)


def count_host_threads(conf: dict, hosts: list[str]) -> HostThreads:
    """The :class:`HostThreads` for a Spark conf and the executors' hosts (pure)."""
    master = conf.get("spark.master", "")
    cores = conf.get("spark.executor.cores")
    if cores is None and master.startswith("local-cluster["):
        cores = master[len("local-cluster["):].split(",")[1]
    tasks = max(1, int(cores or 1) // max(1, int(conf.get("spark.task.cpus", 1))))
    return HostThreads(omp_from_user="spark.executorEnv.OMP_NUM_THREADS" in conf,
                       executors_by_host=tuple(sorted(Counter(hosts).items())), tasks_per_executor=tasks)
