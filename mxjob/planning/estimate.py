"""How long the job will take and what it will cost: measured on a sample, projected onto a cluster.

The driver scores a small, deterministic sample of the input exactly as an
executor does (:func:`mxjob.executor.partition.score_partition`: download, decode,
forward) and measures the CPU seconds it took per image, with the CPU of a
local S3 stand-in (moto on this machine) counted too, since it shares the
cores. :func:`project` turns that into the wall time of the whole input on a
cluster: ``--estimate-cluster NxVCPUS`` for one not yet created (N executors
of VCPUS threads, one a node, as ``make emr-cluster`` builds it), else the
Spark configuration in force (its executors times the threads each gets).
With ``--node-price`` it adds what the whole cluster bills
(:func:`cluster_cost`): core nodes and master, from start-up to idle timeout.

The projection assumes what the job is built for: CPU-bound executors that
keep every vCPU busy (downloads overlap the forward pass), one partition per
batch, waves of batches over the executors' slots, and fixed costs measured
on this project's runs (Spark's per-task cost, :data:`TASK_OVERHEAD_SECONDS`),
and a start-up made of what this host measures: its JVMs' start
(:func:`jvm_start_seconds`, times :data:`SPARK_START_JVMS`), MXNet's import
and the model's load, both timed on the driver (:func:`start_seconds`).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from mxjob.options.option_types import cluster_shape

if TYPE_CHECKING:  # the record only: mxjob.executor.measure scores, the estimate projects
    from mxjob.executor.measure import SampleCost

#: Spark's start-up beyond the Python workers' import of MXNet, in units of this host's JVM start
#: (:func:`jvm_start_seconds`): the SparkContext's own start, then the executors' JVMs starting (at once, on
#: the host's vCPUs under local-cluster) and registering before their first task (measured:
#: docs/performance.md, "Figures behind the code"). A YARN cluster that must first allocate containers
#: takes longer.
SPARK_START_JVMS = 4.5
#: This host's JVM start when it cannot be measured (the driver's parent is not spark-submit's JVM).
DEFAULT_JVM_START_SECONDS = 1.5
#: MXNet's import in a Python worker when the driver did not time its own (``mxjob.model.worker.import_mxnet``).
DEFAULT_MXNET_IMPORT_SECONDS = 1.5
#: Seconds of an executor's time a Spark task costs beyond its images: scheduling, serialising the task
#: and its result, the Python worker's hand-over, the plan's GET and the part's PUT: the top of what
#: ``bench/task_cost.py`` (``make bench``) measured (docs/performance.md, "Figures behind the code").
#: ``--batch-size auto`` keeps it at most 5% of a task (:mod:`mxjob.planning.batchsize`).
TASK_OVERHEAD_SECONDS = 0.25
#: Seconds an EMR cluster bills before the job can start: EC2 provisions the nodes, each runs the bootstrap
#: action (bootstrap/install-deps.sh pip-installs MXNet and the pins), then EMR starts YARN and Spark. Nothing
#: the job runs can measure it (the job starts after it), so this is an assumption: 8 minutes for EMR 7 with
#: that bootstrap. A cluster's own figure is the gap between CreationDateTime and ReadyDateTime in
#: ``aws emr describe-cluster``'s Status.Timeline.
CLUSTER_START_SECONDS = 8 * 60
#: Master nodes billed beside the core nodes, at --master-price (else --node-price): conf/emr.yaml's master.count.
MASTER_NODES = 1
#: Seconds a cluster bills after its last step before it ends itself: conf/emr.yaml's idle_timeout_seconds,
#: which the job never reads (a test keeps the two equal). A cluster that ends with its step
#: (``make emr-run``) bills none of it.
IDLE_TIMEOUT_SECONDS = 900
#: A cluster shape: ``10x16`` is ten nodes of 16 vCPUs.


@dataclass(frozen=True)
class Cluster:
    """The cluster the estimate is for.

    Parameters
    ----------
    nodes : int
        Core nodes that run executors (the cost counts these, and the master).
    vcpus_per_node : int
        vCPUs of each.
    executors : int
        Slots in all: the Python workers that score one batch each at a time
        (one a single-core executor, as conf/emr.yaml runs them).
    threads : float
        vCPUs each slot's forward passes keep busy: the threads MXNet gets
        (divided among its forward lanes); a share of the host's vCPUs under local-cluster.
    source : str
        Where the shape came from, for the reader of the estimate.
    """

    nodes: int
    vcpus_per_node: int
    executors: int
    threads: float
    source: str

    @property
    def vcpus(self) -> int:
        """vCPUs working: the slots times their threads."""
        return round(self.executors * self.threads)


def parse_cluster(text: str) -> Cluster:
    """``"10x16"`` -> ten nodes of 16 vCPUs, one executor of 16 threads each; ``ValueError`` otherwise.

    This is the layout conf/emr.yaml makes (``make emr-cluster``): one
    single-task executor a node, ``spark.executorEnv.OMP_NUM_THREADS`` = the
    node's vCPUs.
    """
    nodes, vcpus = cluster_shape(text)
    return Cluster(nodes, vcpus, nodes, vcpus,
                   f"--estimate-cluster {nodes}x{vcpus}: {nodes} executors of {vcpus} threads, one per node")


def cluster_from_conf(conf: dict | None, host_vcpus: int | None = None) -> Cluster:
    """The cluster a Spark configuration asks for; this host alone when it says nothing.

    ``local-cluster[N,C,M]`` runs N executors of C cores sharing this
    host's vCPUs. Otherwise ``spark.executor.instances`` (or dynamic
    allocation's ``spark.dynamicAllocation.maxExecutors``) executors, each
    running ``spark.executor.cores // spark.task.cpus`` tasks at once, each
    task's Python worker with the threads :func:`mxjob.model.worker.worker_threads`
    gives it: ``spark.executorEnv.OMP_NUM_THREADS`` when set
    (:func:`_threads_given`), else its node's vCPUs divided among the node's
    workers (:func:`_threads_shared`). Nodes are the size of this host (the
    driver runs on one in cluster mode).
    """
    host_vcpus = host_vcpus or os.cpu_count() or 1
    conf = conf or {}
    master = conf.get("spark.master", "")
    local = re.match(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,", master)
    if local:
        executors = int(local.group(1)) * int(local.group(2))
        return Cluster(1, host_vcpus, executors, host_vcpus / executors, f"{master}: one host of {host_vcpus} vCPUs")
    instances = _executor_count(conf)
    if instances is None:
        return Cluster(1, host_vcpus, host_vcpus, 1, f"no executor count in the Spark conf: this host's "
                       f"{host_vcpus} vCPUs (give --estimate-cluster NxVCPUS for a cluster)")
    tasks = max(1, int(conf.get("spark.executor.cores", 1) or 1) // max(1, int(conf.get("spark.task.cpus", 1) or 1)))
    omp = str(conf.get("spark.executorEnv.OMP_NUM_THREADS", "")).strip()
    if omp.isdigit() and int(omp) > 0:  # what worker_threads takes as the user's setting
        return _threads_given(instances, tasks, int(omp), host_vcpus)
    return _threads_shared(instances, tasks, host_vcpus)


def _executor_count(conf: dict) -> int | None:
    """The executors the conf asks for (dynamic allocation's most), or ``None`` if it names no sane count."""
    dynamic = str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true"
    instances = conf.get("spark.dynamicAllocation.maxExecutors" if dynamic else "spark.executor.instances")
    # Dynamic allocation's default maximum is effectively unbounded: no count to project onto.
    if instances and str(instances).isdigit() and 0 < int(instances) < 10**6:
        return int(instances)
    return None


def _threads_given(instances: int, tasks: int, threads: int, host_vcpus: int) -> Cluster:
    """Executors whose workers each have ``threads`` (``spark.executorEnv.OMP_NUM_THREADS``).

    As many executors share a node as their threads fit in this host's
    vCPUs, and at least one: conf/emr.yaml sets the threads to the node's
    vCPUs, one executor a node, and in client mode the driver's host is the
    smaller master, which says nothing about the core nodes.
    """
    per_node = max(1, host_vcpus // (tasks * threads))
    work = f"{tasks} tasks of {threads} threads each" if tasks > 1 else f"{threads} threads"
    where = "one per node" if per_node == 1 else f"{per_node} a node of {host_vcpus} vCPUs like the driver's"
    return Cluster(math.ceil(instances / per_node), max(host_vcpus, per_node * tasks * threads), instances * tasks,
                   threads, f"{instances} executors of {work} (spark.executorEnv.OMP_NUM_THREADS), {where}")


def _threads_shared(instances: int, tasks: int, host_vcpus: int) -> Cluster:
    """Executors whose workers share their node's vCPUs, as the job sizes them without OMP_NUM_THREADS.

    The slots fill nodes the size of this host, at most one a vCPU, evenly;
    each worker gets the node's vCPUs divided by the workers on it, rounded
    down (:func:`mxjob.model.worker.worker_threads` with the driver's HostThreads).
    """
    slots = instances * tasks
    nodes = max(1, math.ceil(slots / host_vcpus))
    threads = max(1, host_vcpus // math.ceil(slots / nodes))
    return Cluster(nodes, host_vcpus, slots, threads,
                   f"{slots} executor tasks in the Spark conf on nodes of {host_vcpus} vCPUs like the driver's, "
                   f"{threads} threads each (the node's vCPUs shared, without spark.executorEnv.OMP_NUM_THREADS)")


@dataclass(frozen=True)
class Cost:
    """What the whole cluster bills for a run at ``node_price`` USD a core node-hour and ``master_price`` a master
    node-hour, part by part (:func:`cluster_cost`).

    The core nodes bill through the start-up (provisioning and bootstrap),
    the job and the idle time after it, each a part; the master node bills
    for all three, one part. ``total_usd`` is the sum of the four parts.
    """

    node_price: float
    master_price: float
    core_nodes: int
    master_nodes: int
    start_up_hours: float
    job_hours: float
    idle_hours: float
    core_nodes_job_usd: float
    start_up_usd: float
    master_usd: float
    idle_usd: float
    total_usd: float

    def describe(self) -> str:
        """The parts in words, for the driver's log line."""
        return (f"${self.total_usd:,.2f} at ${self.node_price}/core node-hour and ${self.master_price}/master "
                f"node-hour: {self.core_nodes} core nodes x "
                f"{self.job_hours:.2f} h of job ${self.core_nodes_job_usd:,.2f} + start-up (provisioning and "
                f"bootstrap, assumed) {self.core_nodes} x {self.start_up_hours:.2f} h ${self.start_up_usd:,.2f} + "
                f"master {self.master_nodes} x {self.start_up_hours + self.job_hours + self.idle_hours:.2f} h "
                f"${self.master_usd:,.2f} + idle until the idle timeout {self.core_nodes} x {self.idle_hours:.2f} h "
                f"${self.idle_usd:,.2f} (none with make emr-run, whose cluster ends with its step) "
                f"= total ${self.total_usd:,.2f}")


def cluster_cost(core_nodes: int, node_price: float, job_seconds: float, *, start_up_seconds: float | None = None,
                 idle_seconds: float | None = None, master_nodes: int = MASTER_NODES,
                 master_price: float | None = None) -> Cost:
    """The :class:`Cost` of ``core_nodes`` at ``node_price`` and ``master_nodes`` at ``master_price`` (by default
    ``node_price``) for a job of ``job_seconds``.

    Start-up and idle time default to :data:`CLUSTER_START_SECONDS` and
    :data:`IDLE_TIMEOUT_SECONDS`.
    """
    start = (CLUSTER_START_SECONDS if start_up_seconds is None else start_up_seconds) / 3600
    idle = (IDLE_TIMEOUT_SECONDS if idle_seconds is None else idle_seconds) / 3600
    job = job_seconds / 3600
    master_price = node_price if master_price is None else master_price
    parts = {"core_nodes_job_usd": core_nodes * node_price * job, "start_up_usd": core_nodes * node_price * start,
             "master_usd": master_nodes * master_price * (start + job + idle),
             "idle_usd": core_nodes * node_price * idle}
    return Cost(node_price=node_price, master_price=master_price, core_nodes=core_nodes, master_nodes=master_nodes,
                start_up_hours=start, job_hours=job, idle_hours=idle, **parts, total_usd=sum(parts.values()))


@dataclass(frozen=True)
class Estimate:
    """The projection of one run, as the dry run's plan and the summary show it."""

    sample_images: int
    cpu_seconds_per_image: float
    #: Of which a local S3 stand-in's CPU (0 against real S3).
    s3_server_cpu_seconds_per_image: float
    model_load_seconds: float
    #: Seconds before the first wave of batches: Spark's start, MXNet's import, the model's load.
    start_seconds: float
    images: int
    batches: int
    cluster: str
    vcpus: int
    executors: int
    images_per_second: float
    wall_seconds: float
    #: The whole cluster's bill (``cost.total_usd``); ``None`` without a price.
    cost_usd: float | None
    cost: Cost | None

    def as_dict(self) -> dict:
        out = asdict(self)
        for key in ("cpu_seconds_per_image", "s3_server_cpu_seconds_per_image"):
            out[key] = round(out[key], 5)
        for key in ("model_load_seconds", "start_seconds", "images_per_second", "wall_seconds"):
            out[key] = round(out[key], 2)
        out["cost_usd"] = None if self.cost_usd is None else round(self.cost_usd, 2)
        if out["cost"] is not None:
            # Four places, not cents: the parts still add up to the total for a reader who checks.
            out["cost"] = {key: round(value, 4) if isinstance(value, float) else value
                           for key, value in out["cost"].items()}
        return out


def project(sample: SampleCost, images: int, batch_size: int, cluster: Cluster, *, start_seconds: float,
            node_price: float | None = None, master_price: float | None = None) -> Estimate:
    """The wall time (and cost) of scoring ``images`` in batches of ``batch_size`` on ``cluster``.

    Each executor slot keeps ``cluster.threads`` vCPUs busy with its forward
    passes (the ``sample`` measured CPU seconds, so V threads do V vCPUs' work);
    a batch takes ``batch_size * sample.cpu_seconds_per_image / threads`` seconds plus
    :data:`TASK_OVERHEAD_SECONDS`, and the batches run in waves over the
    slots (the last wave may be partly idle). Before the first wave:
    ``start_seconds`` (:func:`start_seconds`: Spark's start-up, MXNet's
    import and the model's load on each worker). ``node_price`` (and
    ``master_price``) price the whole cluster for that wall time (:func:`cluster_cost`).
    """
    cpu_per_image = sample.cpu_seconds_per_image
    batches = math.ceil(images / batch_size) if images else 0
    batch_seconds = batch_size * cpu_per_image / max(cluster.threads, 1e-9) + TASK_OVERHEAD_SECONDS
    waves = math.ceil(batches / max(1, cluster.executors))  # over the executors' slots
    compute = waves * batch_seconds
    wall = start_seconds + compute if batches else 0.0
    cost = None if node_price is None else cluster_cost(cluster.nodes, node_price, wall, master_price=master_price)
    return Estimate(
        sample_images=sample.images, cpu_seconds_per_image=cpu_per_image,
        s3_server_cpu_seconds_per_image=sample.s3_server_cpu_seconds_per_image,
        model_load_seconds=sample.model_load_seconds, start_seconds=start_seconds if batches else 0.0, images=images,
        batches=batches, cluster=cluster.source, vcpus=cluster.vcpus, executors=cluster.executors,
        images_per_second=images / compute if compute else 0.0, wall_seconds=wall,
        cost_usd=None if cost is None else cost.total_usd, cost=cost)


def start_seconds(model_load_seconds: float, jvm_seconds: float | None = None,
                  mxnet_import_seconds: float | None = None) -> float:
    """Seconds from the SparkContext's creation to the executors' first batch scored.

    :data:`SPARK_START_JVMS` of this host's JVM starts, then each Python
    worker's import of MXNet and its load of the model (the workers start at
    once, one per executor core). Unmeasured parts take their defaults.
    """
    jvm = DEFAULT_JVM_START_SECONDS if jvm_seconds is None else jvm_seconds
    mxnet = DEFAULT_MXNET_IMPORT_SECONDS if mxnet_import_seconds is None else mxnet_import_seconds
    return SPARK_START_JVMS * jvm + mxnet + model_load_seconds


