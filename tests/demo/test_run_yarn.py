"""The local YARN's plumbing without starting it: the scaled Spark settings, the state file, the pyspark archives.

``tests/integration/test_yarn.py`` runs the job on the real thing; these check, in a
second, what it is given.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from demo import run_yarn, yarn_local
from mxjob.run.container_memory import ExecutorContainer, size_mib


def container_mib(conf: dict, role: str) -> float:
    return size_mib(conf[f"spark.{role}.memory"]) + size_mib(conf[f"spark.{role}.memoryOverhead"])


@pytest.mark.parametrize(("conf", "node_mib"), [
    (run_yarn.emr_spark_defaults(), 24576),  # conf/emr.yaml on an m5.2xlarge core node (its comments say so)
    ({**run_yarn.emr_spark_defaults(), **run_yarn.LOCAL_MEMORY}, yarn_local.NODE_MEMORY_MB),
], ids=["emr", "local-yarn"])
def test_one_executor_per_node_and_the_driver_beside_it(conf, node_mib):
    executor, driver = container_mib(conf, "executor"), container_mib(conf, "driver")
    assert executor > node_mib / 2  # YARN can never place two executors on one node
    assert executor + driver <= node_mib  # the cluster-mode driver still fits beside one


def test_the_local_settings_are_emrs_with_memory_threads_and_placement_replaced():
    emr = run_yarn.emr_spark_defaults()
    conf = run_yarn.yarn_spark_conf({"spark.executor.memoryOverhead": "2g"}, env={"AWS_ENDPOINT_URL": "http://x"})
    kept = {key: value for key, value in emr.items()
            if key not in run_yarn.LOCAL_MEMORY and key not in run_yarn.LOCAL_THREADS
            and key != "spark.executor.instances"}
    assert {key: conf[key] for key in kept} == kept
    assert conf["spark.yarn.maxAppAttempts"] == "2"
    assert conf["spark.executor.instances"] == str(yarn_local.NODES)
    assert conf["spark.executor.memoryOverhead"] == "2g"  # an override wins
    assert conf["spark.executor.memory"] == run_yarn.LOCAL_MEMORY["spark.executor.memory"]
    assert conf["spark.executorEnv.OMP_NUM_THREADS"] == "1"
    assert conf["spark.yarn.jars"].startswith("local:") and conf["spark.yarn.jars"].endswith("/jars/*")
    assert conf["spark.yarn.appMasterEnv.AWS_ENDPOINT_URL"] == conf["spark.executorEnv.AWS_ENDPOINT_URL"] == "http://x"
    container = ExecutorContainer.from_conf({**run_yarn.LOCAL_MEMORY, "spark.master": "yarn"})
    assert container is not None and container.limit_mib == 6144


def test_container_env_gives_moto_keys_locally_and_the_callers_aws_variables_otherwise(monkeypatch):
    local = run_yarn.container_env(True, "http://127.0.0.1:5000")
    assert local["AWS_ACCESS_KEY_ID"] == "testing" and local["AWS_ENDPOINT_URL"] == "http://127.0.0.1:5000"
    monkeypatch.setenv("AWS_PROFILE", "mine")
    monkeypatch.setenv("HOME", "/home/me")
    remote = run_yarn.container_env(False)
    assert remote["AWS_PROFILE"] == "mine" and remote["HOME"] == "/home/me"
    assert remote["AWS_ACCESS_KEY_ID"] == "testing"  # the test's own fake keys, passed on as any variable is


def test_the_properties_file_is_private_and_holds_every_setting(tmp_path):
    conf = {"spark.a": "1", "spark.yarn.appMasterEnv.AWS_SECRET_ACCESS_KEY": "s3cret"}
    command = run_yarn.submit_command(["--config", "s3://b/job.yaml"], conf, tmp_path / "p.conf")
    written = (tmp_path / "p.conf").read_text().splitlines()
    assert written == ["spark.a 1", "spark.yarn.appMasterEnv.AWS_SECRET_ACCESS_KEY s3cret"]
    assert (tmp_path / "p.conf").stat().st_mode & 0o777 == 0o600
    assert "s3cret" not in " ".join(command)  # the printed command holds no secret
    assert command[command.index("--deploy-mode") + 1] == "cluster" and command[-2:] == ["--config", "s3://b/job.yaml"]


def test_pyspark_archives_hold_the_installed_pyspark_and_py4j_sources():
    paths = [Path(item.removeprefix("local:")) for item in run_yarn.pyspark_archives().split(",")]
    assert [path.name for path in paths] == ["pyspark.zip", "py4j.zip"]
    with zipfile.ZipFile(paths[0]) as archive:
        names = archive.namelist()
    assert "pyspark/__init__.py" in names and "pyspark/daemon.py" in names
    assert not any(name.startswith("pyspark/jars/") for name in names)
    import pyspark

    # The data files the sources read too (Spark 4 loads pyspark/errors/error-conditions.json at import), and
    # nothing of local-cluster's work/ folder, which the tests fill with the executors' files.
    if (Path(pyspark.__file__).parent / "errors" / "error-conditions.json").is_file():
        assert "pyspark/errors/error-conditions.json" in names
    assert not any(name.startswith(("pyspark/work/", "pyspark/examples/", "pyspark/bin/")) for name in names)


def test_only_files_of_python_packages_are_archived(tmp_path):
    (tmp_path / "pkg" / "errors").mkdir(parents=True)
    (tmp_path / "pkg" / "work" / "app-1").mkdir(parents=True)
    for name in ("pkg/__init__.py", "pkg/errors/__init__.py", "pkg/errors/conditions.json",
                 "pkg/work/app-1/model-symbol.json"):
        (tmp_path / name).write_text("")
    root = tmp_path / "pkg"
    assert run_yarn.in_package(root / "errors" / "conditions.json", root)
    assert not run_yarn.in_package(root / "work" / "app-1" / "model-symbol.json", root)


def container(tmp_path: Path, stdout: str = "", stderr: str = "") -> Path:
    folder = tmp_path / "container_1_0001_01_000001"
    folder.mkdir()
    (folder / "stdout").write_text(stdout)
    (folder / "stderr").write_text(stderr)
    return folder


@pytest.mark.parametrize(("stdout", "stderr", "said"), [
    ("2026-11-29 02:38:10,569 INFO mxjob.run.driver: listing\nError: cannot read --config s3://b/job.yaml: gone\n",
     "26/11/29 02:38:11 ERROR ApplicationMaster: User application exited with status 2\n",
     "Error: cannot read --config s3://b/job.yaml: gone"),
    ("2026-11-29 02:38:10,569 ERROR mxjob.run.scoring: 1 image failed, more than --max-errors 0 allows (0)\n"
     "2026-11-29 02:38:10,627 INFO mxjob.run.scoring: exit 3\n", "",
     "2026-11-29 02:38:10,569 ERROR mxjob.run.scoring: 1 image failed, more than --max-errors 0 allows (0)"),
    ("2026-11-29 02:38:38,457 WARNING mxjob.outputs.claim: attempt 1 finished the run (exit code 3)\n", "",
     "2026-11-29 02:38:38,457 WARNING mxjob.outputs.claim: attempt 1 finished the run (exit code 3)"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nFileNotFoundError: /x/error-conditions.json\n", "",
     "FileNotFoundError: /x/error-conditions.json"),
    ("", "26/11/29 02:38:11 INFO ApplicationMaster: Final app status: SUCCEEDED\n", None),
], ids=["error-line", "error-log", "warning-log", "traceback", "nothing"])
def test_the_jobs_last_word_is_found_in_its_drivers_container(tmp_path, stdout, stderr, said):
    assert run_yarn.job_said(container(tmp_path, stdout, stderr)) == said


def test_cluster_state_reads_the_launchers_state_file():
    state = yarn_local.ClusterState.parse(
        "pid=42\nrm.address=localhost:1\nrm.web=127.0.0.1:2\nnodes=2\nnode.memory_mb=8192\nnode.vcores=2\n"
        "node.0.id=localhost:10\nnode.0.http=11\nnode.0.running=true\nnode.0.log_dirs=/x/nm-0/logs\n"
        "node.1.id=localhost:20\nnode.1.http=21\nnode.1.running=false\nnode.1.log_dirs=/x/nm-1/logs\n"
        "request.0=stop-node-1 done\nrequest.1=kill-app-application_1_0001 failed: no such app\n")
    assert state.pid == 42 and state.node_memory_mb == 8192 and state.rm_web == "127.0.0.1:2"
    assert [(node.node_id, node.running) for node in state.nodes] == [("localhost:10", True), ("localhost:20", False)]
    assert state.nodes[1].log_dir == Path("/x/nm-1/logs")
    assert state.requests == ("stop-node-1 done", "kill-app-application_1_0001 failed: no such app")


def test_emr_yarn_site_settings_reach_the_local_yarn():
    site = yarn_local.emr_yarn_site()
    assert site["yarn.nodemanager.sleep-delay-before-sigkill.ms"] == "10000"


def test_no_local_yarn_is_reported_as_none_when_its_jvm_is_gone(tmp_path, monkeypatch):
    state = tmp_path / "state.properties"
    state.write_text("pid=999999999\nrm.address=x\nrm.web=x\nnodes=0\nnode.memory_mb=1\nnode.vcores=1\n")
    monkeypatch.setattr(yarn_local, "STATE_FILE", state)
    assert yarn_local.read_state() is None
