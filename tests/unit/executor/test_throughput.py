"""Throughput plumbing without Spark: micro-batches, threads, eager prefetch, timing and memory in the summary."""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

import mxinfer
from mxjob.core import state
from mxjob.executor import partition
from mxjob.executor.stats import StatsAccumulator, StatsFold, TaskStats
from mxjob.inputs import listing
from mxjob.model import worker
from mxjob.options import config
from mxjob.outputs import merge, work_prefix
from mxjob.reporting.record_fields import to_json
from mxjob.reporting.summary import RunOutcome, summarize, thread_fit
from mxjob.results import part_format, results
from mxjob.run import cluster
from mxjob.tasks import classify
from tests.support.helpers import lines_of

BASE = {"input": "s3://in/p/", "model": "s3://m/r", "output": "s3://o/k.jsonl"}


def job_spec(**kwargs) -> mxinfer.JobSpec:
    return mxinfer.JobSpec(model=mxinfer.ModelSpec.from_prefix("s3://m/r"), preprocess=mxinfer.Preprocess(),
                           bucket="b", **kwargs)


@pytest.mark.parametrize(("batch", "micro", "bound"), [(64, 16, 16), (64, None, 64), (8, 16, 8), (64, 64, 64)])
def test_the_module_is_bound_at_the_micro_batch_never_above_the_batch(batch, micro, bound):
    assert job_spec(batch_size=batch, micro_batch_size=micro).forward_batch == bound


def test_micro_batch_and_threads_reach_the_executors_from_the_options():
    cfg = config.resolve(config.merge_settings({**BASE, "micro_batch_size": 8, "threads": 4, "batch_size": 64}, {}))
    spec = cfg.job_spec()
    assert (spec.micro_batch_size, spec.threads, spec.forward_batch) == (8, 4, 8)
    defaults = config.resolve(config.merge_settings(BASE, {})).job_spec()
    assert (defaults.micro_batch_size, defaults.threads, defaults.io_threads) == (16, None, 16)


@pytest.mark.parametrize(("output", "fmt", "rendered"), [
    ("s3://o/k.jsonl", None, True), ("s3://o/k.parquet", None, False), ("s3://o/k", "parquet", False),
    ("s3://o/k", "jsonl", True)])
def test_tasks_render_json_lines_into_their_parts_only_for_a_json_lines_output(output, fmt, rendered):
    options = {**BASE, "output": output, **({"output_format": fmt} if fmt else {})}
    job = config.resolve(config.merge_settings(options, {})).job_spec()
    assert job.json_lines is rendered
    rows = classify.TASK.results()
    rows.add("a", classify.prediction_entries([(1, "one", 0.5)]))
    part = part_format.read_part(partition.write_results(job, classify.TASK, 0, None, rows.record_batch()))
    assert part.column(results.LINE.name).null_count == (0 if rendered else 1)
    assert lines_of(part) == ['{"key": "a", "predictions": [{"class_id": 1, "label": "one", '
                                        '"probability": 0.5}]}']


def test_threads_option_beats_the_environment_which_beats_task_cpus_which_beats_cpu_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    monkeypatch.setattr(state, "spark_task", lambda: SimpleNamespace(cpus=lambda: 6))
    assert worker.worker_threads(5) == 5
    assert worker.worker_threads(None) == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert worker.worker_threads(None) == 6
    monkeypatch.setattr(state, "spark_task", lambda: SimpleNamespace(cpus=lambda: 1))
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 12)
    assert worker.worker_threads(None) == 12
    monkeypatch.setattr(state, "spark_task", lambda: None)
    assert worker.worker_threads(None) == 12


def test_thread_env_sets_openmp_and_keeps_an_explicit_worker_thread_count(monkeypatch):
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    assert worker.thread_env(8) == {"OMP_NUM_THREADS": "8", "MXNET_CPU_WORKER_NTHREADS": "1"}
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "8")
    assert worker.thread_env(8)["MXNET_CPU_WORKER_NTHREADS"] == "8"


def test_prefetch_starts_on_the_call_keeps_order_and_bounds_what_is_in_flight():
    started = []
    in_flight, most = [0], [0]
    lock = threading.Lock()
    window_started = threading.Event()  # set when the fourth call starts

    def work(key, size):
        with lock:
            started.append(key)
            if len(started) == 4:
                window_started.set()
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.01 * (size % 3))  # finish out of order
        with lock:
            in_flight[0] -= 1
        return key

    items = [(f"k{i:02d}", i) for i in range(20)]
    with ThreadPoolExecutor(8) as pool:
        results = partition._prefetched(items, work, pool, window=4)
        assert window_started.wait(timeout=30)
        assert sorted(started) == ["k00", "k01", "k02", "k03"]  # submitted before the first next()
        assert list(results) == [key for key, _ in items]
    assert most[0] <= 4


def task_stats(worker: str, n: int, started: float, rss: int, keys: int = 64) -> TaskStats:
    return TaskStats(partition=n, executor="host/1", worker_pid=worker, attempt=0, keys=keys,
                     errors={"download": 0, "decode": 0, "predict": 0},
                     seconds={"download": 1.0, "decode": 0.5, "forward": 2.0, "wait": 0.1, "task": 1.0, "cpu": 1.5,
                              "download_cpu": 0.1 * n, "decode_cpu": 0.3, "task_thread_cpu": 0.2},
                     s3_retries={"request": 0, "body": 0}, model_loads=1, started=started,
                     ended=started + 1.0, threads=2, worker_task=n, memory={"rss": rss, "max_rss": rss + 5})


def test_summary_has_task_window_steady_state_inputs_idle_time_and_memory_by_task():
    cfg = config.resolve(config.merge_settings(BASE, {}))
    # One worker, 200 tasks of 1 s with 0.1 s between them; RSS grows by 1 byte per task.
    stats = [task_stats("7", n, 1000.0 + (n - 1) * 1.1, 500 + n) for n in range(1, 201)]
    keys = listing.Listing.build("b", [f"k{i}" for i in range(200 * 64)])
    workload = work_prefix.Workload(runs=[], todo=keys, number=1, resumed=False)
    counts = merge.AssemblyCounts(predicted=12800, failed=0)
    stats.reverse()  # order must not matter
    summary = summarize(cfg, RunOutcome(images=200 * 64, batches=200, fold=StatsFold.of(stats), counts=counts,
                                        elapsed=300.0, model_summary={}, seconds={"assembly": 0.5}, workload=workload,
                                        fingerprint={}))
    window = 199 * 1.1 + 1.0
    assert summary["tasks"]["seconds"] == pytest.approx(window, abs=1e-3)
    assert summary["tasks"]["images_per_second"] == pytest.approx(12800 / window, rel=1e-3)
    [worker] = summary["python_workers"].values()
    # The first task's CPU and its split (its own download_cpu is 0.1 x its number, 1).
    assert worker["first_task"] == {"started": 1000.0, "ended": 1001.0, "images": 64, "cpu": 1.5,
                                    "download_cpu": 0.1, "decode_cpu": 0.3, "task_thread_cpu": 0.2}
    assert worker["threads"] == 2 and worker["max_rss_bytes"] == 705
    assert worker["task_seconds"] == pytest.approx(200.0)
    assert worker["idle_between_tasks_seconds"] == pytest.approx(199 * 0.1, abs=1e-2)
    assert worker["rss_bytes_after_task"] == {"1": 501, "2": 502, "5": 505, "10": 510, "20": 520, "50": 550,
                                              "100": 600, "200": 700, "last": 700}
    assert summary["seconds"]["cpu"] == pytest.approx(300.0)
    assert summary["seconds"]["download_cpu"] == pytest.approx(0.1 * 200 * 201 / 2)
    assert summary["seconds"]["task_thread_cpu"] == pytest.approx(40.0)
    assert summary["driver_max_rss_bytes"] > 0
    assert summary["scored"] == 12800 and summary["reused"] == 0 and summary["seconds"]["assembly"] == 0.5


def test_stats_folded_per_task_in_any_order_and_grouping_give_the_same_summary():
    cfg = config.resolve(config.merge_settings(BASE, {}))
    stats = [task_stats(worker, n, 1000.0 + (n - 1) * 1.1 + int(worker), 500 + n)
             for worker in ("7", "8") for n in range(1, 31)]
    stats[5].attempt = 1
    stats[7].errors = {"download": 1, "decode": 2, "predict": 0}
    keys = listing.Listing.build("b", [f"k{i}" for i in range(60 * 64)])
    workload = work_prefix.Workload(runs=[], todo=keys, number=1, resumed=False)
    counts = merge.AssemblyCounts(predicted=3840, failed=3)
    def outcome(fold: StatsFold) -> RunOutcome:
        return RunOutcome(images=3840, batches=60, fold=fold, counts=counts, elapsed=100.0, model_summary={},
                          seconds={}, workload=workload, fingerprint={})

    whole = summarize(cfg, outcome(StatsFold.of(stats)))
    # As Spark's accumulator sees them: each task's own fold, merged as tasks end, in any order.
    random.Random(3).shuffle(stats)
    merged = StatsFold()
    for start in range(0, len(stats), 7):
        merged = StatsAccumulator().addInPlace(merged, StatsFold.of(stats[start:start + 7]))
    folded = summarize(cfg, outcome(merged))
    for summary in (whole, folded):
        summary.pop("driver_max_rss_bytes")
    assert folded == whole
    assert whole["retried_batches"] == 1 and whole["errors_by_stage"] == {"download": 1, "decode": 2, "predict": 0}
    assert sorted(w["batches"] for w in whole["python_workers"].values()) == [30, 30]
    assert all(w["first_task"]["images"] == 64 for w in whole["python_workers"].values())


def test_spark_implicit_omp_is_ignored_and_the_host_cores_are_shared_among_its_executors(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Spark sets for spark.executor.cores=1
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 36)
    monkeypatch.setattr(worker, "host_names", lambda: ["node-a", "10.0.0.1"])
    one_each = worker.HostThreads(executors_by_host=(("node-a", 1), ("node-b", 1)))
    assert worker.worker_threads(None, one_each) == 36
    assert worker.worker_threads(None, worker.HostThreads(executors_by_host=(("10.0.0.1", 4),))) == 9
    # Not listed under any of its names: the busiest host's share, never more threads than cores.
    assert worker.worker_threads(None, worker.HostThreads(executors_by_host=(("x", 2), ("y", 3)))) == 12
    assert worker.worker_threads(None, worker.HostThreads(executors_by_host=(("node-a", 2),),
                                                           tasks_per_executor=2)) == 9
    assert worker.worker_threads(None, worker.HostThreads(omp_from_user=True)) == 1
    assert worker.worker_threads(3, one_each) == 3


def test_plan_threads_counts_executors_per_host_and_tells_a_user_omp_setting_apart():
    conf = {"spark.master": "yarn", "spark.executor.cores": "4", "spark.task.cpus": "2"}
    hosts = cluster.count_host_threads(conf, ["b", "a", "b"])
    assert hosts == worker.HostThreads(False, (("a", 1), ("b", 2)), 2)
    assert cluster.count_host_threads({**conf, "spark.executorEnv.OMP_NUM_THREADS": "8"}, ["a"]).omp_from_user
    assert cluster.count_host_threads({"spark.master": "local-cluster[2,1,1024]"}, []).tasks_per_executor == 1


@pytest.mark.parametrize(("conf", "wanted"), [
    ({"spark.master": "local-cluster[3,1,1024]"}, 3),
    ({"spark.master": "yarn", "spark.executor.instances": "10"}, 10),
    ({"spark.master": "yarn", "spark.executor.instances": "10", "spark.dynamicAllocation.enabled": "true"}, None),
    ({"spark.master": "yarn"}, None),
])
def test_expected_executors_from_the_master_or_the_instances(conf, wanted):
    assert cluster.expected_executors(conf) == wanted


def test_thread_fit_warns_when_threads_times_executors_differ_from_the_host_cores():
    def stat(executor, threads, cores, planned=None):
        return replace(task_stats("1", 1, 1000.0, 1), executor=executor, threads=threads,
                       host={"cores": cores, "workers": planned})

    fit = to_json(thread_fit(StatsFold.of([stat("a/1", 2, 4), stat("a/2", 2, 4), stat("b/1", 1, 4),
                                           stat("c/1", 8, 4), stat("b/1", 1, 4), stat("d/1", 2, 4, planned=2)])))
    assert fit["hosts"] == {"a": {"cores": 4, "executors": 2, "threads": 4},
                            "b": {"cores": 4, "executors": 1, "threads": 1},
                            "c": {"cores": 4, "executors": 1, "threads": 8},
                            # Two executors planned on d, one ran a task: no warning for the idle one.
                            "d": {"cores": 4, "executors": 2, "threads": 4}}
    assert len(fit["warnings"]) == 2
    assert "host b" in fit["warnings"][0] and "idle" in fit["warnings"][0]
    assert "host c" in fit["warnings"][1] and "wait" in fit["warnings"][1]


class FakeSparkContext:
    """Just what host_threads reads: the conf, and executors that register one call at a time."""

    def __init__(self, conf: dict, registrations: list[list[tuple[str, int]]]):
        self.conf, self.registrations, self.calls = conf, registrations, 0
        info = lambda host, port: SimpleNamespace(host=lambda: host, port=lambda: port)  # noqa: E731
        driver = SimpleNamespace(host=lambda: "driver", port=lambda: 1)

        def executor_infos():
            listed = self.registrations[min(self.calls, len(self.registrations) - 1)]
            self.calls += 1
            return [info("driver", 1)] + [info(h, p) for h, p in listed]

        jvm = SimpleNamespace(env=lambda: SimpleNamespace(blockManager=lambda: SimpleNamespace(
            blockManagerId=lambda: driver)), statusTracker=lambda: SimpleNamespace(getExecutorInfos=executor_infos))
        self._jsc = SimpleNamespace(sc=lambda: jvm)

    def getConf(self):
        return SimpleNamespace(getAll=lambda: list(self.conf.items()))


def test_thread_plan_waits_for_the_expected_executors_and_leaves_out_the_driver():
    sc = FakeSparkContext({"spark.master": "local-cluster[2,1,1024]"},
                          [[], [("127.0.0.1", 5)], [("127.0.0.1", 5), ("127.0.0.1", 6)]])
    hosts = cluster.host_threads(sc, wait_seconds=5)
    assert hosts.executors_by_host == (("127.0.0.1", 2),) and sc.calls == 3


def test_thread_plan_gives_up_on_a_broken_executor_list_and_workers_fall_back():
    sc = FakeSparkContext({"spark.master": "yarn"}, [[]])
    sc._jsc = SimpleNamespace(sc=lambda: (_ for _ in ()).throw(RuntimeError("no such method")))
    assert cluster.host_threads(sc, wait_seconds=0.1) is None


@pytest.mark.parametrize(("threads", "lanes"), [(1, 1), (2, 2), (3, 3), (4, 4), (6, 3), (8, 4), (16, 4), (7, 1)])
def test_auto_lanes_are_the_largest_divisor_of_the_threads_up_to_four(threads, lanes):
    assert worker.worker_lanes(None, threads) == lanes
    assert threads % lanes == 0


def test_lanes_stay_one_on_a_gpu_or_with_a_handler_and_an_explicit_count_is_capped_by_the_threads():
    assert worker.worker_lanes(None, 8, gpu=True) == 1
    assert worker.worker_lanes(None, 8, handlers=True) == 1
    assert worker.worker_lanes(2, 8, handlers=True) == 2  # asked for: the user vouches for the handler
    assert worker.worker_lanes(6, 4) == 4
    assert worker.worker_lanes(64, 64) == state.MAX_MODELS


def test_thread_env_gives_each_lane_its_share_of_the_threads(monkeypatch):
    monkeypatch.delenv("MXNET_CPU_WORKER_NTHREADS", raising=False)
    assert worker.thread_env(8, 4) == {"OMP_NUM_THREADS": "2", "MXNET_CPU_WORKER_NTHREADS": "4"}
    assert worker.thread_env(2, 2) == {"OMP_NUM_THREADS": "1", "MXNET_CPU_WORKER_NTHREADS": "2"}
    monkeypatch.setenv("MXNET_CPU_WORKER_NTHREADS", "6")
    assert worker.thread_env(8, 4)["MXNET_CPU_WORKER_NTHREADS"] == "6"


class BarrierEmbedder:
    """A fake model for ``--task embed`` whose forward pass waits until ``barrier``'s other party is in one too."""

    def __init__(self, barrier: threading.Barrier, batch_size: int = 2, fail_first: str | None = None):
        self.barrier, self.batch_size, self.dimension, self.fail_first = barrier, batch_size, 3, fail_first
        self.threads: list[str] = []

    def embed(self, batch, normalize, dtype):
        self.threads.append(threading.current_thread().name)
        self.barrier.wait()  # raises BrokenBarrierError after its timeout if no other pass runs at once
        if self.fail_first is not None and batch[0, 0, 0, 0] == 0:
            raise RuntimeError(self.fail_first)
        return batch.reshape(len(batch), -1)[:, :3].astype(np.float32)


def test_scoring_runs_a_pass_on_every_lane_at_once_and_keeps_every_row():
    barrier = threading.Barrier(2, timeout=10)
    lanes = [BarrierEmbedder(barrier, fail_first="lane broke"), BarrierEmbedder(barrier)]
    job = mxinfer.JobSpec(model=mxinfer.ModelSpec.from_prefix("s3://m/r"), preprocess=mxinfer.Preprocess((3, 2, 2)),
                          bucket="b", task="embed")
    scoring = partition.Scoring(lanes, job, partition.job_task(job))
    keys = [f"k{i:02d}" for i in range(8)]
    for i, key in enumerate(keys):
        scoring.add((key, np.full((3, 2, 2), i, np.float32), None, partition.FetchTimes()))
    scoring.add(("k99", None, ("decode", {"stage": "decode", "type": "ValueError", "message": "bad"}),
                 partition.FetchTimes()))
    scoring.finish()
    batch = scoring.results.record_batch()
    assert batch.column("key").to_pylist() == [*keys, "k99"]
    # Four passes of two: two on each lane, each pair at once (the barrier lets none through alone).
    assert [len(m.threads) for m in lanes] == [2, 2]
    assert all(name.startswith("lane") for m in lanes for name in m.threads)
    errors = batch.column("error").to_pylist()
    # The first lane's first pass (k00, k01, whose inputs start with 0) failed: its keys only.
    assert [e and e["message"] for e in errors] == ["lane broke", "lane broke", *[None] * 6, "bad"]
    assert scoring.errors == {"download": 0, "decode": 1, "predict": 2}
    assert scoring.timing["forward"] > 0
