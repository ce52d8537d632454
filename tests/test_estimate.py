"""The time and cost estimate: cluster shapes, the projection, the sample, the options."""

from __future__ import annotations

import subprocess
import sys

import pytest

import infer_main
from mxjob import estimate
from tests.helpers import ROOT

BASE = ["--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", "s3://out/p.jsonl"]


@pytest.mark.parametrize(("text", "nodes", "vcpus"), [("10x16", 10, 16), (" 3 x 4 ", 3, 4), ("2\u00d78", 2, 8),
                                                      ("1*2", 1, 2)])
def test_parse_cluster_reads_nodes_by_vcpus(text, nodes, vcpus):
    cluster = estimate.parse_cluster(text)
    assert (cluster.nodes, cluster.vcpus_per_node, cluster.vcpus, cluster.executors) == \
        (nodes, vcpus, nodes * vcpus, nodes * vcpus)


@pytest.mark.parametrize("text", ["10", "0x16", "4x0", "ax4", "10x16x2", ""])
def test_parse_cluster_refuses_anything_else(text):
    with pytest.raises(ValueError, match="must be NODESxVCPUS with both at least 1"):
        estimate.parse_cluster(text)


def test_cluster_from_local_cluster_master_is_this_host():
    cluster = estimate.cluster_from_conf({"spark.master": "local-cluster[2,1,1024]"}, host_vcpus=2)
    assert (cluster.nodes, cluster.vcpus, cluster.executors) == (1, 2, 2)


def test_cluster_from_executor_instances_on_nodes_like_the_driver():
    conf = {"spark.master": "yarn", "spark.executor.instances": "20", "spark.executor.cores": "1"}
    cluster = estimate.cluster_from_conf(conf, host_vcpus=8)
    assert (cluster.nodes, cluster.vcpus, cluster.executors) == (3, 24, 20)
    dynamic = {"spark.dynamicAllocation.enabled": "true", "spark.dynamicAllocation.maxExecutors": "16",
               "spark.executor.instances": "2"}
    assert estimate.cluster_from_conf(dynamic, host_vcpus=4).executors == 16


def test_cluster_without_a_count_is_this_host_and_says_so():
    cluster = estimate.cluster_from_conf({"spark.master": "yarn"}, host_vcpus=4)
    assert (cluster.nodes, cluster.vcpus) == (1, 4) and "--estimate-cluster" in cluster.source


def project(images=5120, batch=64, cluster="1x4", cpu=0.05, price=None):
    return estimate.project(cpu, images, batch, estimate.parse_cluster(cluster), model_load_seconds=2.0,
                            start_seconds=9.0, node_price=price)


def test_projection_scales_with_images_and_vcpus():
    base, double, wider = project(), project(images=10240), project(cluster="2x4")
    fixed = 9.0
    assert double.wall_seconds - fixed == pytest.approx(2 * (base.wall_seconds - fixed))
    assert wider.wall_seconds - fixed == pytest.approx((base.wall_seconds - fixed) / 2)
    # 80 batches of 64 on 4 slots: 20 waves of 64 * 0.05 s plus a task's overhead.
    assert base.wall_seconds == pytest.approx(fixed + 20 * (64 * 0.05 + estimate.TASK_OVERHEAD_SECONDS))
    assert base.images_per_second == pytest.approx(5120 / (base.wall_seconds - fixed))


def test_projection_counts_the_last_partial_wave_whole():
    # 5 batches on 4 slots take two waves, as long as 8 batches.
    assert project(images=5 * 64).wall_seconds == pytest.approx(project(images=8 * 64).wall_seconds)


def test_cost_is_nodes_times_price_times_hours_and_none_without_a_price():
    priced = project(cluster="3x4", price=1.5)
    assert priced.cost_usd == pytest.approx(3 * 1.5 * priced.wall_seconds / 3600)
    assert project().cost_usd is None and project().as_dict()["cost_usd"] is None


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
    script = "from mxjob import estimate; print(estimate.jvm_start_seconds())"
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
    assert estimate.sample_items(images, 4) == [images[0], images[25], images[50], images[75]]
    assert estimate.sample_items(images[:3], 10) == images[:3]
    assert estimate.sample_items([], 5) == []


def test_no_local_server_for_remote_or_missing_endpoints():
    assert estimate.local_server_process(None) is None
    assert estimate.local_server_process("https://s3.us-east-1.amazonaws.com") is None


@pytest.mark.parametrize(("args", "message"), [
    (["--estimate-cluster", "ten"], "must be NODESxVCPUS"),
    (["--node-price", "-1"], "is not in the range x>=0"),
    (["--estimate-images", "-1"], "is not in the range x>=0"),
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
    result = runner.invoke(infer_main.main, [*BASE, "--estimate-cluster", "10x16", "--node-price", "0.77"])
    assert result.exit_code == 0, result.output
    [cfg] = ran
    assert (cfg.estimate_cluster, cfg.node_price, cfg.estimate_images) == ("10x16", 0.77, 32)
