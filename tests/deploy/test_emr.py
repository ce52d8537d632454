"""EMR deployment: conf/emr.yaml, deploy/emr.py and the make targets, against moto.

``make upload``, ``make emr-cluster`` and ``make emr-submit`` run the pinned AWS
CLI with ``AWS_ENDPOINT_URL`` pointing at a moto server (which also serves the
EMR API); boto3 then reads back what the CLI created.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import click
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf" / "emr.yaml"
BUCKET = "emr-deploy-test"
S3 = f"s3://{BUCKET}/jobs/v1"

_spec = importlib.util.spec_from_file_location("emr_deploy", ROOT / "deploy" / "emr.py")
emr = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = emr  # dataclasses look their module up there
_spec.loader.exec_module(emr)


def write_conf(tmp_path: Path, **changes) -> Path:
    """conf/emr.yaml with top-level keys replaced; ``spark`` updates spark-defaults."""
    raw = yaml.safe_load(CONF.read_text())
    spark = changes.pop("spark", {})
    raw.update(changes)
    for conf in raw["configurations"]:
        if conf["Classification"] == "spark-defaults":
            conf["Properties"].update(spark)
    path = tmp_path / "emr.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ---------------------------------------------------------------------------
# The config and the command lines, without AWS


def test_shipped_config_gives_one_single_task_executor_per_core_node():
    conf = emr.load_config(CONF)
    props = emr.spark_defaults(conf.configurations)
    assert props["spark.executor.instances"] == str(conf.core.count)
    assert props["spark.executor.cores"] == "1"
    assert props["spark.dynamicAllocation.enabled"] == "false"
    assert props["spark.python.worker.reuse"] == "true"
    assert props["spark.executorEnv.OMP_NUM_THREADS"] == str(conf.core.vcpus)
    assert props["spark.executorEnv.MXNET_CPU_WORKER_NTHREADS"] == str(conf.core.vcpus)
    assert conf.release_label.startswith("emr-7.")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"core": {"instance_type": "m5.2xlarge", "count": 3, "vcpus": 8}},
         "spark.executor.instances is '2', want '3'"),
        ({"core": {"instance_type": "m5.4xlarge", "count": 2, "vcpus": 16}},
         "spark.executorEnv.OMP_NUM_THREADS is '8', want '16'"),
        ({"spark": {"spark.executor.cores": 4}}, "spark.executor.cores is '4', want '1'"),
        ({"spark": {"spark.dynamicAllocation.enabled": True}},
         "spark.dynamicAllocation.enabled is 'true', want 'false'"),
        ({"subnet_id": "subnet-1"}, r"unknown keys \['subnet_id'\]"),
        ({"core": {"instance_type": "m5.2xlarge", "count": 2}}, "core.vcpus: expected the vCPU count"),
        ({"step": {"name": "x"}}, "step needs the keys name, action_on_failure"),
    ],
)  # fmt: skip
def test_load_config_refuses_inconsistent_settings(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        emr.load_config(write_conf(tmp_path, **changes))


def test_cli_reports_a_bad_config_and_exits_1(tmp_path, runner):
    path = write_conf(tmp_path, spark={"spark.executor.instances": 5})
    result = runner.invoke(
        emr.cli, ["create-cluster", "--config", str(path), "--s3", S3, "--dry-run"]
    )
    assert result.exit_code == 1
    assert "spark.executor.instances is '5', want '2'" in result.output


ACCOUNT = {"subnet": "subnet-0123456789abcdef0", "key_pair": "my-key", "log_uri": "s3://my-emr-logs/batch/"}


def test_create_cluster_refuses_the_shipped_placeholders_before_calling_aws(runner):
    result = runner.invoke(emr.cli, ["create-cluster", "--config", str(CONF), "--s3", S3, "--aws",
                                     "/nonexistent/aws"])
    assert result.exit_code == 1, result.output
    assert "still has placeholders for your account" in result.output
    for key, value in (("subnet", "subnet-CHANGE-ME"), ("key_pair", "CHANGE-ME"),
                       ("log_uri", "s3://CHANGE-ME-emr-logs/mxnet-batch-inference/")):
        assert f"{key}: {value!r} (set {key} to " in result.output
    assert "+ " not in result.output and "not found" not in result.output  # no aws command was run


def test_the_docs_dry_run_preview_works_on_a_fresh_checkout_with_the_placeholders_marked(stderr_runner):
    """docs/emr.md's own preview: the command is printed (exit 0) after a warning that names each placeholder."""
    result = stderr_runner.invoke(emr.cli, ["create-cluster", "--config", str(CONF), "--s3", S3, "--aws",
                                            "/nonexistent/aws", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("warning: ") and "still has placeholders for your account" in result.stderr
    assert "key_pair: 'CHANGE-ME' (set key_pair to " in result.stderr
    assert "--ec2-attributes" in result.stdout and "subnet-CHANGE-ME" in result.stdout


def test_create_cluster_names_the_one_placeholder_left(tmp_path, runner):
    path = write_conf(tmp_path, **{**ACCOUNT, "key_pair": "CHANGE-ME"})
    result = runner.invoke(emr.cli, ["create-cluster", "--config", str(path), "--s3", S3])
    assert result.exit_code == 1 and "still has a placeholder for your account: key_pair: 'CHANGE-ME'" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--s3", "bucket/prefix", "--cluster-id", "j-ABC"], "expected s3://bucket"),
        (["--s3", S3, "--cluster-id", ""], "expected an EMR cluster id"),
    ],
)
def test_add_step_refuses_bad_s3_prefix_and_cluster_id(args, message, runner):
    result = runner.invoke(emr.cli, ["add-step", "--dry-run", *args])
    assert result.exit_code == 2
    assert message in result.output


#: The step commands and what each needs besides the job's options (run-job creates a cluster: no placeholders).
STEP_COMMANDS = {"add-step": ["add-step", "--cluster-id", "j-ABC"], "run-job": ["run-job"]}


@pytest.mark.parametrize("command", list(STEP_COMMANDS))
@pytest.mark.parametrize(
    ("job_args", "message"),
    [
        (["--top-kk", "3"], "No such option: --top-kk Did you mean --top-k?"),
        (["--top-k", "0"], "Invalid value for '--top-k': 0 is not in the range x>=1"),
        (["--access-key", "AKIA"], "Invalid value for '--access_key'"),
    ],
    ids=["unknown", "bad-value", "secret"],
)
def test_step_commands_refuse_a_bad_job_option_before_calling_aws(tmp_path, runner, command, job_args, message):
    path = write_conf(tmp_path, **ACCOUNT)
    result = runner.invoke(emr.cli, [*STEP_COMMANDS[command], "--config", str(path), "--aws", "/nonexistent/aws",
                                     "--s3", S3, "--", *job_args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Usage: infer_main.py [OPTIONS]" in result.output  # the job's own usage, not deploy/emr.py's
    assert "+ " not in result.output and "not found" not in result.output  # no aws command was run


#: A job config the job accepts as it stands.
VALID_JOB = """\
input: s3://emr-deploy-test/photos/
model: s3://emr-deploy-test/models/resnet-50
output: s3://emr-deploy-test/predictions/photos.jsonl
top_k: 3
"""


@pytest.mark.parametrize(
    ("job", "job_args", "message"),
    [
        (VALID_JOB + "batchsize: 8\n", [], r"job\.yaml has 1 unknown option: batchsize \(did you mean batch_size"),
        (VALID_JOB.replace("top_k: 3", "top_k: three"), [], r"Invalid value for 'top_k' in .*job\.yaml"),
        (VALID_JOB.replace("model:", "# model:"), [], "no model: give --model PREFIX"),
        (VALID_JOB, ["--input", "photos"], "--input: 'photos' is not an S3 URI"),
        (VALID_JOB, ["--resume", "--overwrite"], r"give --resume \(finish an earlier run\) or --overwrite"),
    ],
    ids=["unknown-key", "bad-value", "no-model", "bad-option", "conflicting-options"],
)
def test_check_job_refuses_a_bad_job_config_with_the_jobs_own_messages(tmp_path, runner, job, job_args, message):
    path = tmp_path / "job.yaml"
    path.write_text(job)
    result = runner.invoke(emr.cli, ["check-job", "--job-file", str(path), "--", *job_args])
    assert result.exit_code == 2, result.output
    assert re.search(message, result.output), result.output
    assert result.output.startswith("Usage: infer_main.py [OPTIONS]")


# --task embed on the command line: the file's classify-only top_k yields to it, as when the job reads them.
@pytest.mark.parametrize("job_args", [[], ["--batch-size", "16"], ["--task", "embed"]])
def test_check_job_accepts_a_valid_job_and_says_what_it_checked(tmp_path, runner, job_args):
    path = tmp_path / "job.yaml"
    path.write_text(VALID_JOB)
    result = runner.invoke(emr.cli, ["check-job", "--job-file", str(path), "--", *job_args])
    assert result.exit_code == 0, result.output
    assert result.output == f"{path}{' with ' if job_args else ''}{' '.join(job_args)}: infer_main.py accepts them\n"


def test_check_job_refuses_a_missing_job_file(tmp_path, runner):
    result = runner.invoke(emr.cli, ["check-job", "--job-file", str(tmp_path / "my-job.yaml")])
    assert result.exit_code == 2
    assert "my-job.yaml' does not exist" in result.output


def test_add_step_checks_the_local_job_file_together_with_the_options(tmp_path, runner):
    path = tmp_path / "job.yaml"
    path.write_text(VALID_JOB.replace("output:", "# output:"))
    base = ["add-step", "--dry-run", "--s3", S3, "--cluster-id", "j-ABC", "--job-file", str(path)]
    refused = runner.invoke(emr.cli, base)
    assert refused.exit_code == 2 and "no output: give --output" in refused.output
    accepted = runner.invoke(emr.cli, [*base, "--", "--output", "s3://b/out.jsonl"])
    assert accepted.exit_code == 0, accepted.output
    assert re.match(r"\+ \S*aws emr add-steps ", accepted.output)


def test_options_alone_are_checked_for_themselves_when_the_job_config_is_on_s3():
    # input, model and output are in S3/job.yaml, which the check does not read: only the options are checked.
    assert emr.check_job_args(["--top-k", "3", "--config", "s3://elsewhere/job.yaml"]) is None
    assert emr.check_job_args(["--output", "s3://b/out.jsonl"]) == "s3://b/out.jsonl"
    with pytest.raises(click.UsageError, match="No such option: --top-kk"):
        emr.check_job_args(["--top-kk", "3"])


def test_dry_run_prints_the_step_without_running_it(runner):
    result = runner.invoke(
        emr.cli,
        ["add-step", "--dry-run", "--aws", "/nonexistent/aws", "--s3", S3 + "/",
         "--cluster-id", "j-ABC", "--", "--top-k", "3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output.startswith("+ /nonexistent/aws emr add-steps --region us-east-1 ")
    assert (
        '"Args":["spark-submit","--deploy-mode","cluster","--master","yarn",'
        f'"--py-files","{S3}/mxinfer_job.zip","{S3}/infer_main.py",'
        f'"--config","{S3}/job.yaml","--top-k","3"]'
    ) in result.output


# ---------------------------------------------------------------------------
# The make targets, against moto


@pytest.fixture
def aws_env(moto_endpoint):
    """The environment for a make target: conftest's fake credentials, the CLI aimed at moto."""
    return {**os.environ, "AWS_ENDPOINT_URL": moto_endpoint}


def make(*args: str, env: dict[str, str], fails: bool = False) -> subprocess.CompletedProcess:
    """Run a make target; it must succeed, or with ``fails`` fail."""
    result = subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert (result.returncode != 0) == fails, result.stdout + result.stderr
    return result


def test_make_upload_copies_dist_and_the_job_config(tmp_path, aws_env, s3):
    s3.create_bucket(Bucket=BUCKET)
    job = tmp_path / "my-job.yaml"
    job.write_text(VALID_JOB)

    make("upload", f"S3={S3}/", f"DIST={tmp_path / 'dist'}", f"JOB={job}", env=aws_env)

    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="jobs/v1/")["Contents"]
    assert sorted(obj["Key"] for obj in listed) == [
        "jobs/v1/conf/defaults.yaml",
        "jobs/v1/conf/emr.yaml",
        "jobs/v1/infer_main.py",
        "jobs/v1/install-deps.sh",
        "jobs/v1/job.yaml",
        "jobs/v1/mxinfer_job.zip",
        "jobs/v1/requirements.txt",
    ]
    body = s3.get_object(Bucket=BUCKET, Key="jobs/v1/install-deps.sh")["Body"].read()
    assert body == (ROOT / "bootstrap" / "install-deps.sh").read_bytes()
    body = s3.get_object(Bucket=BUCKET, Key="jobs/v1/job.yaml")["Body"].read()
    assert body == VALID_JOB.encode()


@pytest.mark.parametrize(
    ("job", "message"),
    [(None, "Invalid value for '--job-file': File '{job}' does not exist"),
     (VALID_JOB + "batchsize: 8\n", "has 1 unknown option: batchsize (did you mean batch_size")],
    ids=["missing", "unknown-key"],
)
def test_make_upload_refuses_a_bad_job_file_before_building_or_uploading_anything(tmp_path, aws_env, s3, job,
                                                                                   message):
    s3.create_bucket(Bucket=BUCKET)
    path = tmp_path / "my-job.yaml"
    if job is not None:
        path.write_text(job)
    prefix = f"refused/{tmp_path.name}/"

    result = make("upload", f"S3=s3://{BUCKET}/{prefix}", f"DIST={tmp_path / 'dist'}", f"JOB={path}", env=aws_env,
                  fails=True)

    assert message.format(job=path) in result.stderr
    assert not (tmp_path / "dist").exists()  # refused before make package
    assert "Contents" not in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)


def test_make_emr_cluster_and_emr_submit(aws_env, moto_endpoint, tmp_path):
    path = write_conf(tmp_path, **ACCOUNT)  # the account's own subnet, key pair and log bucket
    conf = yaml.safe_load(path.read_text())
    client = boto3.client("emr", region_name=conf["region"], endpoint_url=moto_endpoint)

    created = make("emr-cluster", f"S3={S3}", f"EMR_CONF={path}", env=aws_env)
    print(created.stdout)
    assert re.search(r"^\+ \S*aws emr create-cluster --region ", created.stdout, re.M)
    cluster_id = re.search(r"CLUSTER_ID=(j-[A-Z0-9]+)", created.stdout).group(1)

    cluster = client.describe_cluster(ClusterId=cluster_id)["Cluster"]
    assert cluster["Name"] == conf["name"]
    assert cluster["ReleaseLabel"] == conf["release_label"]
    assert cluster["LogUri"] == conf["log_uri"]
    assert cluster["ServiceRole"] == "EMR_DefaultRole"
    assert [app["Name"] for app in cluster["Applications"]] == ["Spark"]
    ec2 = cluster["Ec2InstanceAttributes"]
    assert (ec2["Ec2SubnetId"], ec2["Ec2KeyName"], ec2["IamInstanceProfile"]) == (
        conf["subnet"], conf["key_pair"], "EMR_EC2_DefaultRole"
    )
    spark_defaults, yarn_site, spark_env = cluster["Configurations"]
    assert spark_defaults["Classification"] == "spark-defaults"
    assert yarn_site["Properties"] == {"yarn.resourcemanager.nodemanager-graceful-decommission-timeout-secs": "120",
                                       "yarn.nodemanager.sleep-delay-before-sigkill.ms": "10000"}
    props = spark_defaults["Properties"]
    assert {key: props[key] for key in (
        "spark.dynamicAllocation.enabled", "spark.executor.instances", "spark.executor.cores",
        "spark.python.worker.reuse", "spark.executorEnv.OMP_NUM_THREADS",
        "spark.executorEnv.MXNET_CPU_WORKER_NTHREADS",
    )} == {
        "spark.dynamicAllocation.enabled": "false", "spark.executor.instances": "2",
        "spark.executor.cores": "1", "spark.python.worker.reuse": "true",
        "spark.executorEnv.OMP_NUM_THREADS": "8", "spark.executorEnv.MXNET_CPU_WORKER_NTHREADS": "8",
    }  # fmt: skip
    # Every value EMR receives is a string, and nothing from the YAML is lost.
    assert len(props) == len(conf["configurations"][0]["Properties"])
    assert all(isinstance(value, str) for value in props.values())
    assert spark_env == {
        "Classification": "spark-env",
        "Configurations": [
            {"Classification": "export", "Properties": {"PYSPARK_PYTHON": "/usr/bin/python3"}}
        ],
    }

    assert client.list_bootstrap_actions(ClusterId=cluster_id)["BootstrapActions"] == [
        {
            "Name": "install-python-deps",
            "ScriptPath": f"{S3}/install-deps.sh",
            "Args": [f"{S3}/requirements.txt"],
        }
    ]
    groups = client.list_instance_groups(ClusterId=cluster_id)["InstanceGroups"]
    assert sorted(
        (g["InstanceGroupType"], g["InstanceType"], g["RequestedInstanceCount"]) for g in groups
    ) == [("CORE", "m5.2xlarge", 2), ("MASTER", "m5.xlarge", 1)]

    submitted = make(
        "emr-submit", f"CLUSTER_ID={cluster_id}", f"S3={S3}", f"EMR_CONF={path}", "ARGS=--top-k 3 --batch-size 16",
        env=aws_env,
    )  # fmt: skip
    print(submitted.stdout)
    assert re.search(r"^\+ \S*aws emr add-steps --region ", submitted.stdout, re.M)
    [step] = client.list_steps(ClusterId=cluster_id)["Steps"]
    assert step["Name"] == "mxnet-batch-inference"
    assert step["ActionOnFailure"] == "CONTINUE"
    assert step["Config"]["Jar"] == "command-runner.jar"
    assert step["Config"]["Args"] == [
        "spark-submit", "--deploy-mode", "cluster", "--master", "yarn",
        "--py-files", "s3://emr-deploy-test/jobs/v1/mxinfer_job.zip",
        "s3://emr-deploy-test/jobs/v1/infer_main.py",
        "--config", "s3://emr-deploy-test/jobs/v1/job.yaml",
        "--top-k", "3", "--batch-size", "16",
    ]  # fmt: skip


@pytest.mark.parametrize("stack", ["emr7", "emr8"])
def test_make_emr_run_creates_a_cluster_that_runs_the_step_and_terminates(aws_env, moto_endpoint, tmp_path, stack):
    path = write_conf(tmp_path, **ACCOUNT)
    conf = yaml.safe_load(path.read_text())
    if stack == "emr8":  # conf/emr8.yaml, extending the account's emr.yaml beside it
        path = tmp_path / "emr8.yaml"
        path.write_text((ROOT / "conf" / "emr8.yaml").read_text())
    client = boto3.client("emr", region_name=conf["region"], endpoint_url=moto_endpoint)
    output = "s3://emr-deploy-test/predictions/run.jsonl"

    ran = make("emr-run", f"STACK={stack}", f"S3={S3}", f"EMR_CONF={path}", f"ARGS=--output {output} --top-k 3",
               env=aws_env)
    print(ran.stdout)

    command = re.search(r"^\+ \S*aws emr create-cluster --region .*$", ran.stdout, re.M).group(0)
    assert command.endswith(" --auto-terminate")
    assert "--auto-termination-policy" not in command  # the last step ends it, so no idle timeout is needed
    cluster_id = re.search(r"^cluster (j-[A-Z0-9]+) ", ran.stdout, re.M).group(1)
    assert f"make watch OUTPUT={output}" in ran.stdout
    assert f"aws emr list-steps --region {conf['region']} --cluster-id {cluster_id}" in ran.stdout
    cluster = client.describe_cluster(ClusterId=cluster_id)["Cluster"]
    assert cluster["AutoTerminate"] is True
    assert cluster["Name"] == conf["name"]
    assert cluster["ReleaseLabel"] == ("emr-spark-8.0.0" if stack == "emr8" else conf["release_label"])
    [bootstrap] = client.list_bootstrap_actions(ClusterId=cluster_id)["BootstrapActions"]
    assert bootstrap["Args"][1:] == (["python3.11"] if stack == "emr8" else [])  # the interpreter it installs into
    [step] = client.list_steps(ClusterId=cluster_id)["Steps"]
    assert step["Name"] == conf["step"]["name"]
    assert step["ActionOnFailure"] == "TERMINATE_CLUSTER"  # a failed step must not keep the cluster up
    assert step["Config"]["Jar"] == "command-runner.jar"
    assert step["Config"]["Args"][-6:] == [
        "--config", f"{S3}/job.yaml", "--output", output, "--top-k", "3"]


def test_emr_cluster_idles_briefly_and_run_job_ends_with_its_step():
    conf = emr.load_config(CONF)
    # EMR's shortest idle timeout is 60 s; an hour of idle nodes is what the timeout is there to save.
    assert 60 <= conf.idle_timeout_seconds <= 900
    assert f"({conf.idle_timeout_seconds // 60} minutes in `conf/emr.yaml`" in (ROOT / "docs" / "emr.md").read_text()
    created = emr.create_cluster_command(conf, S3)
    assert created[-2:] == ["--auto-termination-policy", f"IdleTimeout={conf.idle_timeout_seconds}"]
    assert "--auto-terminate" not in created and "--steps" not in created
    run_once = emr.run_job_command(conf, S3, f"{S3}/job.yaml", ("--top-k", "3"))
    assert run_once[-1] == "--auto-terminate" and "--auto-termination-policy" not in run_once
    [step] = json.loads(run_once[run_once.index("--steps") + 1])
    assert step["ActionOnFailure"] == "TERMINATE_CLUSTER"
    assert step["Args"] == emr.spark_submit_args(S3, f"{S3}/job.yaml", ("--top-k", "3"))


def test_spot_task_nodes_add_a_task_group_and_an_executor_each(tmp_path):
    raw = yaml.safe_load(CONF.read_text())
    raw["task"] = {"instance_type": "m5.2xlarge", "count": 3, "vcpus": 8, "market": "SPOT"}
    path = tmp_path / "emr.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"spark\.executor\.instances is '2', want '5'"):
        emr.load_config(path)
    for item in raw["configurations"]:
        if item["Classification"] == "spark-defaults":
            item["Properties"]["spark.executor.instances"] = 5
    path.write_text(yaml.safe_dump(raw))
    command = emr.create_cluster_command(emr.load_config(path), "s3://b/p")
    groups = json.loads(command[command.index("--instance-groups") + 1])
    assert [(g["InstanceGroupType"], g["InstanceCount"], g.get("BidPrice")) for g in groups] == [
        ("MASTER", 1, None), ("CORE", 2, None), ("TASK", 3, "OnDemandPrice")]


def test_shipped_config_makes_a_lost_or_decommissioned_node_cheap():
    conf = emr.load_config(CONF)
    props = emr.spark_defaults(conf.configurations)
    assert props["spark.decommission.enabled"] == "true"
    assert props["spark.storage.decommission.enabled"] == "false"  # no shuffle, no cached blocks to move
    yarn = next(c["Properties"] for c in conf.configurations if c["Classification"] == "yarn-site")
    assert yarn["yarn.resourcemanager.nodemanager-graceful-decommission-timeout-secs"] == "120"


def test_the_emr8_config_is_emr_yamls_with_what_emr_8_changes():
    seven, eight = emr.load_config(CONF), emr.load_config(ROOT / "conf" / "emr8.yaml")
    assert (seven.release_label.startswith("emr-7."), eight.release_label) == (True, "emr-spark-8.0.0")
    assert eight.bootstrap["args"] == ["{s3}/requirements.txt", "python3.11"]  # the interpreter, as an argument
    assert eight.bootstrap["path"] == seven.bootstrap["path"]  # merged key by key, not replaced
    spark7, spark8 = emr.spark_defaults(seven.configurations), emr.spark_defaults(eight.configurations)
    assert spark8 == spark7 and not any("blacklist" in key for key in spark7)  # valid on both releases

    def exports(conf):
        [env] = [c for c in conf.configurations if c["Classification"] == "spark-env"]
        return env["Configurations"][0]["Properties"]

    assert (exports(seven)["PYSPARK_PYTHON"], exports(eight)["PYSPARK_PYTHON"]) == (
        "/usr/bin/python3", "/usr/bin/python3.11")
    assert (seven.core, seven.master, seven.step) == (eight.core, eight.master, eight.step)  # declared once


def test_a_layer_removes_a_property_set_to_null_and_merges_nested_classifications(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"name": "n", "bootstrap": {"name": "b", "path": "p"},
        "configurations": [{"Classification": "spark-defaults", "Properties": {"a": 1, "b": 2}},
                           {"Classification": "spark-env", "Configurations": [
                               {"Classification": "export", "Properties": {"X": "1", "Y": "2"}}]}]}))
    (tmp_path / "top.yaml").write_text(yaml.safe_dump({"extends": "base.yaml", "bootstrap": {"args": ["x"]},
        "configurations": [{"Classification": "spark-defaults", "Properties": {"b": None, "c": 3}},
                           {"Classification": "spark-env", "Configurations": [
                               {"Classification": "export", "Properties": {"Y": "3"}}]}]}))
    merged = emr.read_layered(tmp_path / "top.yaml")
    assert merged["bootstrap"] == {"name": "b", "path": "p", "args": ["x"]} and merged["name"] == "n"
    assert merged["configurations"] == [
        {"Classification": "spark-defaults", "Properties": {"a": 1, "c": 3}},
        {"Classification": "spark-env", "Configurations": [{"Classification": "export",
                                                            "Properties": {"X": "1", "Y": "3"}}]}]


def test_make_package_ships_the_stacks_pins_and_config(tmp_path):
    for stack, pyspark, config in (("emr7", "pyspark==3.5.7", "emr.yaml"), ("emr8", "pyspark==4.0.2", "emr8.yaml")):
        dist = tmp_path / stack
        done = subprocess.run(["make", "-s", "package", f"STACK={stack}", f"DIST={dist}"], cwd=ROOT,
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert pyspark in (dist / "requirements.txt").read_text().splitlines()
        assert emr.load_config(dist / "conf" / config).bootstrap  # emr8.yaml's base, emr.yaml, goes with it
