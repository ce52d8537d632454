"""The resume command: complete and copyable (mxjob/rerun.py)."""

from __future__ import annotations

import shlex

import pytest

import infer_main
from mxjob import rerun
from tests.helpers import ROOT

JAVA = ["/usr/lib/jvm/java-17/bin/java", "-cp", "/opt/spark/conf/:/opt/spark/jars/*", "-Xmx1g", rerun.SUBMIT_CLASS]
JOB = ["--input", "s3://b/in/", "--output", "s3://b/o k.jsonl", "--overwrite"]


def test_client_mode_repeats_every_spark_submit_option_and_the_job_with_resume():
    options = ["--master", "yarn", "--deploy-mode", "client", "--conf", "spark.executor.cores=1",
               "--py-files", "/home/me/dist/mxinfer_job.zip"]
    argv = ["/home/me/dist/infer_main.py", *JOB]
    command = rerun.resume_command(argv, [*JAVA, *options, "/home/me/dist/infer_main.py", *JOB], cwd="/home/me")
    assert command == ("spark-submit --master yarn --deploy-mode client --conf spark.executor.cores=1 --py-files "
                       "/home/me/dist/mxinfer_job.zip /home/me/dist/infer_main.py --input s3://b/in/ --output "
                       "'s3://b/o k.jsonl' --resume")
    assert shlex.split(command)[-1] == "--resume" and "--overwrite" not in shlex.split(command)


def test_a_run_make_submit_started_is_resumed_with_make_submit():
    options = ["--master", "local-cluster[2,1,1024]", "--properties-file", str(ROOT / "conf" / "spark-local.conf"),
               "--py-files", str(ROOT / "run" / "py-files" / "mxinfer_job.zip")]
    argv = [str(ROOT / "infer_main.py"), "--config", "conf/demo.yaml", "--endpoint-url", "http://127.0.0.1:5000"]
    jvm = [*JAVA, *options, *argv]
    assert rerun.resume_command(argv, jvm, cwd=str(ROOT)) == (
        "make submit ARGS='--config conf/demo.yaml --endpoint-url http://127.0.0.1:5000 --resume'")
    assert rerun.resume_command(argv, jvm, cwd="/tmp").startswith(f"cd {shlex.quote(str(ROOT))} && make submit ")
    # The same files on another master are a plain spark-submit line.
    yarn = [*JAVA, "--master", "yarn", *options[2:], *argv]
    assert rerun.resume_command(argv, yarn, cwd=str(ROOT)).startswith("spark-submit --master yarn --properties-file")


@pytest.mark.parametrize("jvm", [None, ["java", "-cp", "x", "org.apache.spark.deploy.yarn.ApplicationMaster"],
                                 [*JAVA, "--master", "yarn", "other.py", "--input", "s3://b/in/"]],
                         ids=["no-parent", "cluster-mode", "other-arguments"])
def test_without_the_submit_line_the_sparkconf_gives_the_options(jvm):
    argv = ["infer_main.py", *JOB]
    conf = {"spark.master": "yarn", "spark.submit.deployMode": "cluster",
            "spark.submit.pyFiles": "s3://b/job/mxinfer_job.zip", "spark.app.name": "x"}
    assert rerun.resume_command(argv, jvm, conf=conf) == (
        "spark-submit --master yarn --deploy-mode cluster --py-files s3://b/job/mxinfer_job.zip infer_main.py "
        "--input s3://b/in/ --output 's3://b/o k.jsonl' --resume")
    # Before Spark started, nothing says the options: the line says which to repeat.
    assert rerun.resume_command(argv, jvm, conf={}).startswith("spark-submit [the same spark options] infer_main.py")


def test_resume_is_added_once():
    assert rerun.resume_args(["--resume", "--top-k", "2"]) == ["--resume", "--top-k", "2"]
    assert rerun.resume_args(["--overwrite"]) == ["--resume"]


def test_the_driver_reads_the_parent_jvms_command_line_only_from_a_jvm():
    assert rerun.parent_jvm_cmdline() is None  # pytest's parent is a shell, not spark-submit
    assert infer_main.resume_command(["/x/infer_main.py", "--overwrite"]).endswith("infer_main.py --resume")
