"""The time and cost estimate: cluster shapes, the projection, the sample, the options."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

import infer_main
from mxjob.executor import measure
from mxjob.planning import estimate, sizing
from tests.support.helpers import ROOT

BASE = ["--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", "s3://out/p.jsonl"]


@pytest.mark.parametrize(("text", "nodes", "vcpus"), [("10x16", 10, 16), (" 3 x 4 ", 3, 4), ("2\u00d78", 2, 8),
                                                      ("1*2", 1, 2)])
def test_parse_cluster_reads_one_executor_per_node_with_a_thread_per_vcpu(text, nodes, vcpus):
    # EMR's layout, as make emr-cluster builds it: one executor a node, its threads the node's vCPUs.
    cluster = estimate.parse_cluster(text)
    assert (cluster.nodes, cluster.vcpus_per_node, cluster.vcpus, cluster.executors) == \
        (nodes, vcpus, nodes * vcpus, nodes)
    assert cluster.threads == vcpus
    assert f"{nodes} executors of {vcpus} threads, one per node" in cluster.source


@pytest.mark.parametrize("text", ["10", "0x16", "4x0", "ax4", "10x16x2", ""])
def test_parse_cluster_refuses_anything_else(text):
    with pytest.raises(ValueError, match="must be NODESxVCPUS with both at least 1"):
        estimate.parse_cluster(text)


def test_cluster_from_local_cluster_master_is_this_host():
    cluster = estimate.cluster_from_conf({"spark.master": "local-cluster[2,1,1024]"}, host_vcpus=2)
    assert (cluster.nodes, cluster.vcpus, cluster.executors) == (1, 2, 2)


def test_cluster_from_executor_instances_on_nodes_like_the_driver():
    # Without spark.executorEnv.OMP_NUM_THREADS the job divides a node's vCPUs among its Python workers
    # (mxjob.model.worker.worker_threads): 20 one-core executors fill 3 nodes of 8 vCPUs, 7 a node,
    # 8 // 7 = 1 thread each.
    conf = {"spark.master": "yarn", "spark.executor.instances": "20", "spark.executor.cores": "1"}
    cluster = estimate.cluster_from_conf(conf, host_vcpus=8)
    assert (cluster.nodes, cluster.vcpus, cluster.executors) == (3, 20, 20)
    assert cluster.threads == 1
    dynamic = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.maxExecutors": "16",
               "spark.executor.instances": "2"}
    assert estimate.cluster_from_conf(dynamic, host_vcpus=4).executors == 16


def test_cluster_without_a_count_is_this_host_and_says_so():
    cluster = estimate.cluster_from_conf({"spark.master": "yarn"}, host_vcpus=4)
    assert (cluster.nodes, cluster.vcpus) == (1, 4) and "--estimate-cluster" in cluster.source


def emr_spark_defaults(count: int, vcpus: int) -> dict[str, str]:
    """conf/emr.yaml's spark-defaults as EMR gets them (strings), for ``count`` core nodes of ``vcpus`` vCPUs.

    The file's Spark settings take core.count and core.vcpus through YAML anchors, so the anchors' values are
    changed in its text, as a user resizing the cluster would, and every setting that refers to them follows.
    """
    text = (ROOT / "conf" / "emr.yaml").read_text()
    text, counts = re.subn(r"&core_count \d+", f"&core_count {count}", text)
    text, sizes = re.subn(r"&core_vcpus \d+", f"&core_vcpus {vcpus}", text)
    assert (counts, sizes) == (1, 1), "conf/emr.yaml no longer sizes the cluster with its two anchors"
    raw = yaml.safe_load(text)
    [props] = [c["Properties"] for c in raw["configurations"] if c["Classification"] == "spark-defaults"]
    return {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in props.items()}


# The driver's host: a core node of 16 vCPUs in cluster mode, the m5.xlarge master (4 vCPUs) in client mode.
@pytest.mark.parametrize("host_vcpus", [16, 4])
def test_the_emr_layout_is_estimated_as_the_cluster_it_runs_on(host_vcpus):
    conf = emr_spark_defaults(count=10, vcpus=16)
    assert (conf["spark.executor.instances"], conf["spark.executorEnv.OMP_NUM_THREADS"]) == ("10", "16")
    cluster = estimate.cluster_from_conf(conf, host_vcpus=host_vcpus)
    assert (cluster.nodes, cluster.executors, cluster.vcpus) == (10, 10, 160)
    assert cluster.threads == 16
    assert "10 executors of 16 threads (spark.executorEnv.OMP_NUM_THREADS), one per node" in cluster.source
    from_conf, from_shape = project(cluster=cluster, price=1.0), project(cluster="10x16", price=1.0)
    assert from_conf.wall_seconds == pytest.approx(from_shape.wall_seconds)
    assert from_conf.cost_usd == pytest.approx(from_shape.cost_usd)


def project(images=5120, batch=64, cluster="1x4", cpu=0.05, price=None):
    shape = estimate.parse_cluster(cluster) if isinstance(cluster, str) else cluster
    sample = measure.SampleCost(images=0, scored=0, cpu_seconds_per_image=cpu, s3_server_cpu_seconds_per_image=0.0,
                                 model_load_seconds=2.0)
    return estimate.project(sample, images, batch, shape, start_seconds=9.0, node_price=price)


def test_projection_scales_with_images_and_vcpus():
    base, double, wider = project(cluster="4x1"), project(cluster="4x1", images=10240), project(cluster="8x1")
    fixed = 9.0
    assert double.wall_seconds - fixed == pytest.approx(2 * (base.wall_seconds - fixed))
    assert wider.wall_seconds - fixed == pytest.approx((base.wall_seconds - fixed) / 2)
    # 80 batches of 64 on 4 executors of one thread: 20 waves of 64 * 0.05 s plus a task's overhead.
    assert base.wall_seconds == pytest.approx(fixed + 20 * (64 * 0.05 + estimate.TASK_OVERHEAD_SECONDS))
    # One executor of 4 threads: 80 waves of 64 * 0.05 s / 4 threads plus a task's overhead.
    assert project(cluster="1x4").wall_seconds == pytest.approx(
        fixed + 80 * (64 * 0.05 / 4 + estimate.TASK_OVERHEAD_SECONDS))
    assert base.images_per_second == pytest.approx(5120 / (base.wall_seconds - fixed))


def test_projection_counts_the_last_partial_wave_whole():
    # 5 batches on 4 slots take two waves, as long as 8 batches.
    assert project(cluster="4x1", images=5 * 64).wall_seconds == pytest.approx(
        project(cluster="4x1", images=8 * 64).wall_seconds)


def test_each_part_of_the_cost_is_its_nodes_times_the_price_times_its_hours():
    cost = estimate.cluster_cost(10, 0.5, 5400, start_up_seconds=480, idle_seconds=900)
    # At 0.5 USD a node-hour, 10 core nodes and 1 master: the job 5400 s = 1.5 h, start-up 480 s = 0.1333 h,
    # idle 900 s = 0.25 h.
    assert cost.core_nodes_job_usd == pytest.approx(7.5)  # 10 x 0.5 x 1.5
    assert cost.start_up_usd == pytest.approx(0.66667, abs=1e-5)  # 10 x 0.5 x 0.13333
    assert cost.idle_usd == pytest.approx(1.25)  # 10 x 0.5 x 0.25
    assert cost.master_usd == pytest.approx(0.94167, abs=1e-5)  # 1 x 0.5 x (0.13333 + 1.5 + 0.25)
    assert cost.total_usd == pytest.approx(10.35833, abs=1e-5)  # 7.5 + 0.66667 + 1.25 + 0.94167
    assert cost.total_usd == pytest.approx(cost.core_nodes_job_usd + cost.start_up_usd + cost.master_usd
                                           + cost.idle_usd)


def test_the_master_is_priced_at_its_own_price_when_given():
    same = estimate.cluster_cost(10, 0.5, 5400, start_up_seconds=480, idle_seconds=900)
    cheaper = estimate.cluster_cost(10, 0.5, 5400, start_up_seconds=480, idle_seconds=900, master_price=0.25)
    assert cheaper.master_usd == pytest.approx(same.master_usd / 2)  # 1 x 0.25 x (0.13333 + 1.5 + 0.25)
    assert (cheaper.core_nodes_job_usd, cheaper.start_up_usd, cheaper.idle_usd) == (
        same.core_nodes_job_usd, same.start_up_usd, same.idle_usd)
    assert cheaper.total_usd == pytest.approx(same.total_usd - same.master_usd / 2)
    assert "$0.5/core node-hour and $0.25/master node-hour" in cheaper.describe()


def test_the_estimate_prices_the_whole_cluster_for_as_long_as_it_bills_and_names_each_part():
    priced = project(cluster="3x4", price=1.5)
    cost = priced.cost
    job, start, idle = (priced.wall_seconds / 3600, estimate.CLUSTER_START_SECONDS / 3600,
                        estimate.IDLE_TIMEOUT_SECONDS / 3600)
    assert (cost.core_nodes, cost.master_nodes) == (3, 1)
    assert (cost.core_nodes_job_usd, cost.start_up_usd, cost.idle_usd, cost.master_usd) == (
        pytest.approx(3 * 1.5 * job), pytest.approx(3 * 1.5 * start), pytest.approx(3 * 1.5 * idle),
        pytest.approx(1 * 1.5 * (start + job + idle)))
    assert priced.cost_usd == cost.total_usd == pytest.approx(4 * 1.5 * (start + job + idle))
    plan = priced.as_dict()
    assert plan["cost"]["total_usd"] == pytest.approx(
        sum(plan["cost"][part] for part in ("core_nodes_job_usd", "start_up_usd", "master_usd", "idle_usd")),
        abs=1e-3)
    text = cost.describe()
    for part in ("3 core nodes", "start-up", "master", "idle", "make emr-run", f"= total ${cost.total_usd:,.2f}"):
        assert part in text, (part, text)
    assert project().cost_usd is None and project().cost is None
    assert project().as_dict()["cost_usd"] is None and project().as_dict()["cost"] is None


def test_the_cost_defaults_are_what_conf_emr_yaml_asks_for():
    raw = yaml.safe_load((ROOT / "conf" / "emr.yaml").read_text())
    assert estimate.IDLE_TIMEOUT_SECONDS == raw["idle_timeout_seconds"]
    assert estimate.MASTER_NODES == raw["master"]["count"]


def test_nothing_to_score_takes_no_time():
    nothing = project(images=0)
    assert (nothing.batches, nothing.wall_seconds, nothing.images_per_second) == (0, 0.0, 0.0)


def test_start_up_is_the_hosts_jvm_starts_mxnets_import_and_the_models_load():
    assert estimate.start_seconds(0.5, jvm_seconds=2.0, mxnet_import_seconds=3.0) == pytest.approx(
        estimate.SPARK_START_JVMS * 2.0 + 3.0 + 0.5)
    # A slower host's JVM start makes a longer start-up; unmeasured parts take the defaults.
    assert estimate.start_seconds(0.5, jvm_seconds=3.0, mxnet_import_seconds=3.0) > estimate.start_seconds(
        0.5, jvm_seconds=2.0, mxnet_import_seconds=3.0)
    assert estimate.start_seconds(0.5) == pytest.approx(
        estimate.SPARK_START_JVMS * estimate.DEFAULT_JVM_START_SECONDS + estimate.DEFAULT_MXNET_IMPORT_SECONDS + 0.5)
    assert project().start_seconds == 9.0 and project(images=0).start_seconds == 0.0


def test_jvm_start_is_the_gap_after_a_java_parents_start_and_none_under_another_parent(tmp_path):
    script = "from mxjob.planning import sizing; print(sizing.jvm_start_seconds())"
    # A parent named java that takes 0.6 s to start its Python child, as spark-submit's JVM does.
    java = tmp_path / "java"
    java.write_text(f'#!/bin/sh\nsleep 0.6\n"{sys.executable}" -c "{script}"\n')
    java.chmod(0o755)
    under_java = subprocess.run([str(java)], capture_output=True, text=True, cwd=str(ROOT), check=True)
    assert 0.55 <= float(under_java.stdout) < 5, under_java.stdout  # start times count in clock ticks
    under_python = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=str(ROOT),
                                  check=True)
    assert under_python.stdout.strip() == "None"


def test_sample_items_are_evenly_spaced_and_deterministic():
    images = [(f"k{i:03d}", i) for i in range(100)]
    assert sizing.sample_items(images, 4) == [images[0], images[25], images[50], images[75]]
    assert sizing.sample_items(images[:3], 10) == images[:3]
    assert sizing.sample_items([], 5) == []


def test_the_sample_is_whole_micro_batches_and_a_sixteenth_of_a_small_run():
    size = sizing.sample_size
    # --estimate-images 32 of a large run: two micro-batches of 16.
    assert size(32, 100_000, 16) == 32
    # A 128-image run: a sixteenth (8), rounded up to one whole forward pass.
    assert size(32, 128, 16) == 16
    # Never over half the run: rounded down to whole passes instead, or left short when there is not one.
    assert (size(32, 40, 16), size(32, 20, 16)) == (16, 8)
    assert (size(4, 40), size(0, 1000, 16)) == (4, 0)
    # --estimate-images is the most it measures (its images then repeat up to a whole pass); half of 8 keys is 4.
    assert (size(4, 40, 16), size(32, 8, 4)) == (4, 4)


def test_no_local_server_for_remote_or_missing_endpoints():
    assert measure.local_server_process(None) is None
    assert measure.local_server_process("https://s3.us-east-1.amazonaws.com") is None


@pytest.mark.parametrize(("args", "message"), [
    (["--estimate-cluster", "ten"], "must be NODESxVCPUS"),
    (["--node-price", "-1"], "is not in the range x>=0"),
    (["--estimate-images", "-1"], "is not in the range 0<=x<=100000"),
])
def test_bad_estimate_options_exit_2_before_any_work(runner, monkeypatch, args, message):
    ran = []
    monkeypatch.setattr(infer_main, "run_job", lambda cfg: ran.append(cfg) or 0)
    result = runner.invoke(infer_main.main, [*BASE, *args])
    assert result.exit_code == 2 and not ran
    assert message in result.output


def test_estimate_options_reach_the_config(runner, monkeypatch):
    ran = []
    monkeypatch.setattr(infer_main, "run_job", lambda cfg, **_: ran.append(cfg) or 0)
    result = runner.invoke(infer_main.main, [*BASE, "--estimate-cluster", "10x16", "--node-price", "0.77",
                                             "--master-price", "0.38"])
    assert result.exit_code == 0, result.output
    [cfg] = ran
    assert (cfg.estimate_cluster, cfg.node_price, cfg.master_price, cfg.estimate_images) == ("10x16", 0.77, 0.38, 32)


def test_a_master_price_without_the_core_nodes_price_is_refused(runner):
    result = runner.invoke(infer_main.main, [*BASE, "--master-price", "0.38"])
    assert result.exit_code == 2
    assert "--master-price prices the master beside the core nodes: give the core nodes' --node-price too" in (
        result.output)
