"""Spark's cost per task: our task (with a fake, instant scorer) against a trivial PySpark task.

Not a test: it prints measurements (``make bench`` runs it; ``python -m
bench.task_cost`` alone). On one SparkContext (``local-cluster[2,1,1024]``
with ``conf/spark-local.conf``, the executors' Python workers started by
``bench/fake_daemon.py``), against a moto S3 server on this machine, it runs

- **trivial**: ``sc.parallelize(range(n), n).mapPartitions(count).sum()``,
  ``n`` tasks of one element each: what any PySpark task costs;
- **ours**: ``n`` batches of one key each through :func:`mxjob.executor.partition.score_into`,
  as ``mxjob.run.cluster.run_spark`` runs them (the JobSpec in the closure, a
  ranged GET of the run's plan, the stats accumulator, the part's PUT), with
  the fake daemon's instant fetch, decode and model: everything a task costs
  beyond its images.

Each runs once first on a few tasks (workers forked, modules imported, S3
clients made), then measured. Per task it prints the executor-seconds (the
job's wall time times the executors, over the tasks) and the CPU of each
process kind while the job ran, polled with psutil: the Python workers, the
executors' JVMs, the driver (its JVM and Python) and the S3 stand-in. Then
``ours / trivial``, and at the batch ``--batch-size auto`` picks (with
:data:`mxjob.planning.estimate.TASK_OVERHEAD_SECONDS`) for a few models' costs per
image, the share of a task that the measured per-task cost takes.

Usage::

    python -m bench.task_cost              # 200 tasks of each kind
    python -m bench.task_cost --tasks 40   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

import psutil

from mxjob.executor.measure import local_server_process
from mxjob.s3 import clients

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUCKET = "task-cost"
DAEMON_MODULE = "bench.fake_daemon"
#: Model costs per image on one executor (ms) to show auto's batch for: a CIFAR ResNet-20 and
#: ResNet-18 on the two development machines of docs/performance-history.md.
MODEL_MS = {"resnet20 3x32x32": 2.0, "resnet18 (fast CPU)": 16.0, "resnet18 (slow CPU)": 47.0}


# ----------------------------------------------------------------------------
# Inside spark-submit: the measurement


def count(items) -> list[int]:
    """The trivial task: how many elements its partition has."""
    return [sum(1 for _ in items)]


def role(process: psutil.Process) -> str | None:
    """What a process of the job is, by its command line."""
    command = " ".join(process.cmdline())
    if "CoarseGrainedExecutorBackend" in command:
        return "executor JVM"
    if "daemon" in command and "python" in command.lower():
        return "python worker"
    return None


def cpu_by_role(driver_jvm: psutil.Process, server: psutil.Process | None) -> dict[str, float]:
    """CPU seconds so far of each kind of process (the Python workers' ended children included)."""
    out: dict[str, float] = defaultdict(float)
    fixed = {"driver JVM": driver_jvm, "driver python": psutil.Process()}
    if server is not None:
        fixed["S3 stand-in"] = server
    for name, process in fixed.items():
        times = process.cpu_times()
        out[name] += times.user + times.system
    for process in driver_jvm.children(recursive=True):
        try:
            kind = role(process)
            if kind is not None:
                times = process.cpu_times()
                out[kind] += times.user + times.system + times.children_user + times.children_system
        except psutil.Error:  # a worker that ended between the listing and the reading
            continue
    return out


def timed(run, tasks: int, executors: int, driver_jvm, server) -> dict:
    """Run ``run()`` once and return its wall seconds, executor-ms and CPU ms by process kind, per task."""
    before, started = cpu_by_role(driver_jvm, server), time.perf_counter()
    run()
    wall = time.perf_counter() - started
    after = cpu_by_role(driver_jvm, server)
    return {"tasks": tasks, "wall_seconds": wall, "executor_ms_per_task": 1000 * wall * executors / tasks,
            "cpu_ms_per_task": {k: 1000 * (after[k] - before.get(k, 0.0)) / tasks for k in sorted(after)}}


def our_job(sc, endpoint: str, tasks: int, number: int, plan):
    """A callable that runs ``tasks`` one-key batches of ours, as ``mxjob.run.cluster.run_spark`` does."""
    from mxjob.executor.partition import JobSpec, score_into
    from mxjob.executor.stats import StatsAccumulator, StatsFold
    from mxjob.model.predictor import ModelSpec
    from mxjob.model.preprocess import Preprocess
    from mxjob.outputs import work_prefix

    work = work_prefix.WorkPrefix(clients.s3_client(endpoint, None), BUCKET, "out/task-cost.jsonl")
    run = work.start_run(number, [f"k/{i:06d}.jpg" for i in range(tasks)], 1, None)
    # The model is never loaded (the fake daemon's stand-in); its URIs only have to be well formed.
    job = JobSpec(model=ModelSpec(f"s3://{BUCKET}/m-symbol.json", f"s3://{BUCKET}/m-0000.params"),
                  preprocess=Preprocess(input_shape=(3, 8, 8)), bucket=BUCKET, endpoint_url=endpoint,
                  batch_size=1, micro_batch_size=1, output_bucket=BUCKET, parts_prefix=run.prefix,
                  batches_key=work.batches_key(run), host_threads=plan)
    stats = sc.accumulator(StatsFold(), StatsAccumulator())

    def go():
        sc.parallelize(run.spans, run.batches).mapPartitionsWithIndex(partial(score_into, job=job, stats=stats)).sum()
        if stats.value.keys != tasks:
            raise RuntimeError(f"ours scored {stats.value.keys} keys, not {tasks}: did the fake daemon run?")
    return go, stats


def measure(endpoint: str, tasks: int, out: Path) -> None:
    """Warm up, then time ``tasks`` trivial tasks and ``tasks`` of ours; write the results to ``out``."""
    from pyspark import SparkConf, SparkContext

    from mxjob.run.cluster import expected_executors, host_threads

    sc = SparkContext.getOrCreate(SparkConf().setAppName("task-cost"))
    sc.setLogLevel("WARN")
    plan = host_threads(sc)  # waits for the executors to register
    executors = expected_executors(dict(sc.getConf().getAll())) or 1
    driver_jvm, server = psutil.Process().parent(), local_server_process(endpoint)
    results = {"master": sc.master, "executors": executors}
    warm = 4 * executors
    # Both kinds warm before either is timed: the workers forked, ours' modules imported and clients made.
    sc.parallelize(range(warm), warm).mapPartitions(count).sum()
    our_job(sc, endpoint, warm, 1, plan)[0]()
    results["trivial"] = timed(lambda: sc.parallelize(range(tasks), tasks).mapPartitions(count).sum(), tasks,
                               executors, driver_jvm, server)
    go, stats = our_job(sc, endpoint, tasks, 2, plan)
    results["ours"] = timed(go, tasks, executors, driver_jvm, server)
    fold = stats.value
    results["ours"]["in_task_ms_per_task"] = 1000 * sum(e["task"] for e in fold.executors.values()) / tasks
    results["ours"]["in_task_cpu_ms_per_task"] = 1000 * sum(e["cpu"] for e in fold.executors.values()) / tasks
    sc.stop()
    out.write_text(json.dumps(results, indent=2))


# ----------------------------------------------------------------------------
# Outside: moto, spark-submit, the printout


def run(tasks: int, work: Path, master: str = "local-cluster[2,1,1024]") -> dict:
    """Start moto, run :func:`measure` under spark-submit with the fake daemon; its results."""
    import boto3

    from demo.run_local import spark_env, spark_submit_command
    from demo.s3local import moto_server

    work.mkdir(parents=True, exist_ok=True)
    out, log_path = work / "task-cost.json", work / "task-cost.log"
    with moto_server(work / "task-cost-moto.log") as endpoint:
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                     aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
        command = spark_submit_command([], master)
        command[-1] = str(Path(__file__).resolve())  # this file instead of infer_main.py
        command += ["--inner", "--endpoint", endpoint, "--tasks", str(tasks), "--out", str(out)]
        for setting in (f"spark.python.daemon.module={DAEMON_MODULE}", f"spark.executorEnv.PYTHONPATH={ROOT}"):
            command[3:3] = ["--conf", setting]
        with open(log_path, "w") as log:
            code = subprocess.run(command, env=spark_env(), cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT,
                                  check=False, timeout=1800).returncode
    if code != 0:
        raise RuntimeError(f"the task-cost probe exited {code}; see {log_path}")
    return json.loads(out.read_text())


def auto_shares(per_task_seconds: float, executors: int) -> list[dict]:
    """For each of :data:`MODEL_MS`: auto's batch (from the constant) and the measured per-task cost's share of it."""
    from mxjob.planning import batchsize, estimate

    rows = []
    for name, ms in MODEL_MS.items():
        choice = batchsize.choose_batch_size(ms / 1000, estimate.TASK_OVERHEAD_SECONDS, executors, 10**6, 16)
        share = per_task_seconds / (choice.chosen * ms / 1000 + per_task_seconds)
        at_64 = per_task_seconds / (64 * ms / 1000 + per_task_seconds)
        rows.append({"model": name, "ms_per_image": ms, "batch": choice.chosen, "share": share, "share_at_64": at_64})
    return rows


def report(results: dict) -> str:
    """The probe's printout: per-task cost of both kinds, their ratio, and auto's share."""
    trivial, ours = results["trivial"], results["ours"]
    roles = sorted(set(trivial["cpu_ms_per_task"]) | set(ours["cpu_ms_per_task"]))
    lines = [f"Spark's per-task cost: {ours['tasks']} tasks of each kind on {results['master']} "
             f"({results['executors']} executors), fake instant scorer",
             "| task | executor-ms per task | " + " | ".join(f"{r} CPU ms" for r in roles) + " |",
             "|---|---|" + "---|" * len(roles)]
    for name, row in (("trivial", trivial), ("ours", ours)):
        cpu = " | ".join(f"{row['cpu_ms_per_task'].get(r, 0.0):.1f}" for r in roles)
        lines.append(f"| {name} | {row['executor_ms_per_task']:.1f} | {cpu} |")
    worker = "python worker"
    ratio_wall = ours["executor_ms_per_task"] / trivial["executor_ms_per_task"]
    ratio_cpu = ours["cpu_ms_per_task"].get(worker, 0.0) / max(trivial["cpu_ms_per_task"].get(worker, 0.0), 1e-9)
    lines.append(f"  ours / trivial: {ratio_wall:.2f}x executor time, {ratio_cpu:.2f}x Python worker CPU "
                 f"(target <= 1.2x); ours spends {ours['in_task_ms_per_task']:.1f} ms inside score_partition "
                 f"({ours['in_task_cpu_ms_per_task']:.1f} ms CPU): the plan's GET, the part's PUT, the stats")
    for row in auto_shares(ours["executor_ms_per_task"] / 1000, results["executors"]):
        lines.append(f"  {row['model']} at {row['ms_per_image']:g} ms/image: auto's batch {row['batch']}, "
                     f"where the measured per-task cost is {row['share']:.1%} of a task (target <= 5%; "
                     f"{row['share_at_64']:.1%} at batch 64)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks of each kind")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--work", type=Path, default=ROOT / "run" / "bench")
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner:
        measure(args.endpoint, args.tasks, args.out)
        return 0
    print(report(run(args.tasks, args.work, args.master)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
