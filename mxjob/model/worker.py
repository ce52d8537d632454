"""Threads and memory of a Python worker: how many cores a forward pass may use, and what the process holds.

Since Spark 3.0 every Python worker gets ``OMP_NUM_THREADS`` = the executor's
cores unless ``spark.executorEnv.OMP_NUM_THREADS`` is set, so with
``spark.executor.cores=1`` MXNet would use one core whatever the node has.
The driver sends a :class:`HostThreads` (where the workers run); each worker
divides its host's cores by the workers the host runs at once
(:func:`worker_threads`) and applies that before MXNet loads
(:func:`configure_threads`).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass

from mxjob.core import state

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class HostThreads:
    """What the driver knows about where the Python workers run, for :func:`worker_threads`.

    Since Spark 3.0 (SPARK-28843) every Python worker gets ``OMP_NUM_THREADS``
    = the executor's cores unless ``spark.executorEnv.OMP_NUM_THREADS`` is set,
    so a worker cannot tell Spark's value from a user's; the driver can.

    Parameters
    ----------
    omp_from_user : bool
        ``spark.executorEnv.OMP_NUM_THREADS`` is set: the worker's
        ``OMP_NUM_THREADS`` is the user's choice and wins.
    executors_by_host : tuple of (str, int)
        Registered executors per host, as the driver's SparkContext lists them.
    tasks_per_executor : int
        Tasks an executor runs at once (``spark.executor.cores // spark.task.cpus``).
    """

    omp_from_user: bool = False
    executors_by_host: tuple = ()
    tasks_per_executor: int = 1

    def workers_on(self, names: Iterable[str]) -> int:
        """Python workers at once on the host known by any of ``names``; the busiest host's if none matches.

        The busiest host is the safe guess: too few threads leave cores idle,
        too many make every worker on the host wait for each other.
        """
        counts = dict(self.executors_by_host)
        found = next((counts[name] for name in names if name in counts), None)
        executors = found if found is not None else max(counts.values(), default=1)
        return max(1, executors) * max(1, self.tasks_per_executor)


def host_names() -> list[str]:
    """The names the driver may list this host under: hostname, FQDN, address, Spark's and YARN's."""
    names = [socket.gethostname(), socket.getfqdn()]
    names += [os.environ[var] for var in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME", "NM_HOST") if os.environ.get(var)]
    try:
        names.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return names


def host_share(plan: HostThreads | None) -> dict:
    """This host's ``cores`` and the Python ``workers`` the driver's plan puts on it at once (``None``: no plan)."""
    return {"cores": os.cpu_count(), "workers": plan.workers_on(host_names()) if plan is not None else None}


def worker_threads(requested: int | None = None, plan: HostThreads | None = None) -> int:
    """How many cores one forward pass of this Python worker may use.

    ``requested`` (the ``threads`` option) if given; else ``OMP_NUM_THREADS``
    if the user set it (``spark.executorEnv.OMP_NUM_THREADS``, as ``plan``
    tells; without a plan any value counts); else, with a ``plan``, this
    host's cores divided among the Python workers the host runs at once (every
    core for one executor per node); without one, the task's cores
    (``spark.task.cpus``) if more than one, else every core of the machine.
    """
    if requested:
        return int(requested)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0 and (plan is None or plan.omp_from_user):
        return int(env)
    if plan is not None:
        return max(1, (os.cpu_count() or 1) // plan.workers_on(host_names()))
    task = state.spark_task()
    cpus = task.cpus() if task is not None and hasattr(task, "cpus") else 1
    return cpus if cpus > 1 else (os.cpu_count() or 1)


#: ``--forward-lanes auto``'s most lanes: each holds its own bound copy of the model (weights and activations;
#: ResNet-18 at a micro-batch of 16 about 300 MB more peak RSS per lane in ``make bench``).
MAX_AUTO_LANES = 4


def worker_lanes(requested: int | None, threads: int, *, gpu: bool = False, handlers: bool = False) -> int:
    """How many forward passes this Python worker runs at once (``--forward-lanes``) on its ``threads``.

    Each lane has its own bound copy of the model and ``threads // lanes``
    MXNet threads. One forward pass on several OpenMP threads waits at every
    barrier for the slowest of them, so whenever another thread of the
    worker (a download, a decode), a JVM or the OS preempts one, its partners
    spin (measured: docs/performance.md, "Figures behind the code"). ``requested``
    if given (at most ``threads`` and :data:`mxjob.core.state.MAX_MODELS`); else 1 on a GPU (one device, one stream)
    or with a handler module (its code would run on several threads at once);
    else the largest divisor of ``threads`` up to :data:`MAX_AUTO_LANES`.
    """
    if requested:
        return max(1, min(int(requested), threads, state.MAX_MODELS))
    if gpu or handlers:
        return 1
    return max(n for n in range(1, min(threads, MAX_AUTO_LANES) + 1) if threads % n == 0)


def thread_env(threads: int, lanes: int = 1) -> dict[str, str]:
    """The environment that gives MXNet's forward passes ``threads`` cores in ``lanes`` lanes, and no more.

    ``OMP_NUM_THREADS`` sizes OpenMP (and oneDNN's convolutions) for one
    forward pass: ``threads // lanes``; without it MXNet uses half the cores
    (docs/performance.md, "Figures behind the code").
    ``MXNET_CPU_WORKER_NTHREADS`` (operators run at once) is ``lanes``, or
    the executor's environment's value if larger: one operator of each lane's
    chain of convolutions at a time, with that lane's threads.
    """
    per_lane = max(1, threads // max(1, lanes))
    workers = max(int(os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1") or 1), lanes)
    return {"OMP_NUM_THREADS": str(per_lane), "MXNET_CPU_WORKER_NTHREADS": str(workers)}


def configure_threads(threads: int, lanes: int = 1) -> tuple[int | None, int]:
    """Apply :func:`thread_env` in this process if MXNet is not loaded yet; the threads and lanes in force.

    libmxnet and its OpenMP runtime read these variables once, when they load,
    so this must run before the first ``import mxnet`` of the Python worker
    (``score_partition`` calls it first thing). Once MXNet is loaded the
    earlier setting stays, and is what this returns: the threads of one
    forward pass times the lanes (``None``: MXNet's default), and one lane
    unless the setting that loaded it had more.
    """
    if state.counters.threads_set:
        return state.counters.threads, state.counters.lanes
    if "mxnet" in sys.modules:
        env = os.environ.get("OMP_NUM_THREADS", "")
        in_force, lanes = (int(env) if env.isdigit() else None), 1
        # In an executor this is a mistake worth a warning; in a notebook or a
        # --dry-run on the driver, MXNet is there first by design.
        if in_force != threads and state.spark_task() is not None:
            log.warning("MXNet was loaded before the threads setting (%d) could apply; it keeps %s", threads,
                        f"OMP_NUM_THREADS={env}" if env else "its default")
    else:
        env = thread_env(threads, lanes)
        os.environ.update(env)
        in_force = int(env["OMP_NUM_THREADS"]) * lanes
    state.counters.threads_set, state.counters.threads, state.counters.lanes = True, in_force, lanes
    return in_force, lanes


#: What ``import mxnet`` tries and falls back from, for features the job does not use (:func:`without_modules`).
MXNET_OPTIONAL = ("sklearn", "scipy")


def import_mxnet() -> float | None:
    """Import MXNet in this process, timed; the seconds it took (kept in ``state.counters``).

    ``None`` when MXNet was loaded before, untimed.

    Every Python worker pays this before its first batch (a second or two,
    without the optional packages of :data:`MXNET_OPTIONAL`), so
    the driver's own import, timed here, is what :mod:`mxjob.planning.estimate`
    counts for the executors' start. The driver imports MXNet first through
    here, a worker when it loads its first model (:class:`mxjob.model.predictor.Predictor`).
    """
    if "mxnet" in sys.modules:
        return state.counters.mxnet_import_seconds
    started = time.perf_counter()
    with without_modules(*MXNET_OPTIONAL):
        import mxnet  # noqa: F401 - loaded for its cost; callers import it where they use it

    state.counters.mxnet_import_seconds = time.perf_counter() - started
    return state.counters.mxnet_import_seconds


@contextlib.contextmanager
def without_modules(*names: str):
    """Within the block, ``import`` of each of ``names`` fails as if it were not installed; after it, it works again.

    For MXNet's import, which tries two optional packages three times, and
    falls back when they are absent, for features this job never uses:
    ``mxnet.model`` tries scikit-learn only to make the legacy ``FeedForward``
    an estimator (which loads SciPy and pandas too); ``mxnet.contrib.quantization``
    tries ``scipy.stats`` for the ``entropy`` calibration (the job calibrates
    int8 with ``naive``); ``mxnet.ndarray.sparse`` tries ``scipy.sparse`` for
    ``asscipy``. Where they are installed (the dev venv; requirements.txt
    has none of them) those tries cost about a CPU-second, in the driver and
    in every Python worker (docs/performance.md, "Figures behind the code"). ``None`` in
    ``sys.modules`` is Python's documented way to make an import raise
    ``ImportError`` (the import system's reference, "The module cache"). A
    module already loaded is left as it is. The block hides them from the
    process's other threads too, for the second MXNet's import takes: none
    of the job's imports one of them.
    """
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in hidden:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def freeze_long_lived() -> None:
    """Take what this worker keeps for good (modules, the model, clients) out of the cyclic GC's sight.

    A reused PySpark worker runs ``gc.collect()`` after every task, and with
    MXNet, botocore and a model loaded a full collection costs a tenth of a
    second or more each time (docs/performance.md). Once the first task has loaded
    everything, ``gc.freeze()`` moves the survivors of one last collection to
    the permanent generation, so later collections scan only new objects.
    Reference counting still frees frozen objects; only cycles among them
    would stay, and those are the long-lived ones.
    """
    gc.collect()
    gc.freeze()


def memory_bytes() -> dict[str, int | None]:
    """This process's resident memory now (``rss``, Linux only) and at its peak (``max_rss``)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return {"rss": None, "max_rss": None}
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if os.uname().sysname == "Darwin" else 1024)
    try:
        with open("/proc/self/statm") as handle:
            rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = None
    return {"rss": rss, "max_rss": peak}
