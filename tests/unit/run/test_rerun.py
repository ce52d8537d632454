"""The resume command: complete and copyable (mxjob/run/rerun.py)."""

from __future__ import annotations

import shlex
import sys

import pytest

import infer_main
from mxjob.run import rerun
from tests.support.helpers import ROOT

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
    assert rerun.resume_command(argv, yarn, cwd=str(ROOT)).startswith(
        f"cd {shlex.quote(str(ROOT))} && spark-submit --master yarn --properties-file")  # conf/demo.yaml is relative


#: The ApplicationMaster's command line: a cluster-mode driver's parent, whose --primary-py-file is a bare name.
AM = ["java", "-cp", "x", "org.apache.spark.deploy.yarn.ApplicationMaster", "--class",
      "org.apache.spark.deploy.PythonRunner", "--primary-py-file", "infer_main.py", "--arg", "--input"]
#: What spark-submit --deploy-mode cluster put in the SparkConf (Spark 3.5): the files as URIs of the submitting
#: host; no setting names the job file itself.
CLUSTER_CONF = {"spark.master": "yarn", "spark.submit.deployMode": "cluster", "spark.app.name": "infer_main.py",
                "spark.submit.pyFiles": "file:///home/me/dist/mxinfer_job.zip",
                "spark.yarn.dist.pyFiles": "file:///home/me/dist/mxinfer_job.zip",
                "spark.yarn.dist.archives": "s3://b/env.tar.gz#env"}


@pytest.mark.parametrize("jvm", [None, AM, [*JAVA, "--master", "yarn", "other.py", "--input", "s3://b/in/"]],
                         ids=["no-parent", "cluster-mode", "other-arguments"])
def test_in_cluster_mode_the_files_come_from_the_sparkconf_and_the_unknown_job_file_is_a_placeholder(jvm):
    argv = ["infer_main.py", *JOB]  # YARN runs its localized copy under the bare name
    command = rerun.resume_command(argv, jvm, cwd="/yarn/container_01", conf=CLUSTER_CONF)
    line, _, note = command.partition("  # ")
    assert line == ("spark-submit --master yarn --deploy-mode cluster --py-files file:///home/me/dist/mxinfer_job.zip "
                    "--archives 's3://b/env.tar.gz#env' <path/to/infer_main.py> --input s3://b/in/ "
                    "--output 's3://b/o k.jsonl' --resume")
    assert "the same spark-submit line (or the same EMR step) with --resume added" in note
    # Off YARN --py-files is only in spark.submit.pyFiles.
    local = {"spark.master": "spark://h:7077", "spark.submit.pyFiles": "/home/me/dist/mxinfer_job.zip"}
    assert rerun.resume_command(argv, jvm, conf=local).startswith(
        "spark-submit --master spark://h:7077 --py-files /home/me/dist/mxinfer_job.zip <path/to/infer_main.py> ")


def test_before_spark_starts_a_cluster_mode_driver_reads_the_sparkconf_yarn_put_beside_it(tmp_path, monkeypatch):
    monkeypatch.setattr(rerun, "_conf", {})  # Spark has not started: nothing remembered yet
    (tmp_path / "__spark_conf__").mkdir()
    # As java.util.Properties writes it: ':' and '=' escaped, a comment on top.
    (tmp_path / "__spark_conf__" / "__spark_conf__.properties").write_text(
        "#Spark configuration.\n#Thu Nov 26 04:16:29 UTC 2026\nspark.master=yarn\n"
        "spark.yarn.dist.pyFiles=file\\:///home/me/dist/mxinfer_job.zip\nspark.submit.deployMode=cluster\n"
        "spark.executorEnv.A\\=B=x\\u00e9\n")
    assert rerun.container_conf(str(tmp_path))["spark.executorEnv.A=B"] == "x\u00e9"
    command = rerun.resume_command(["infer_main.py", *JOB], AM, cwd=str(tmp_path))
    assert command.startswith("spark-submit --master yarn --deploy-mode cluster --py-files "
                              "file:///home/me/dist/mxinfer_job.zip <path/to/infer_main.py> --input s3://b/in/ ")


def test_with_nothing_known_the_line_has_placeholders_and_says_to_repeat_the_submit_line(monkeypatch, tmp_path):
    monkeypatch.setattr(rerun, "_conf", {})
    command = rerun.resume_command(["/home/me/dist/infer_main.py", *JOB], None, cwd=str(tmp_path))
    line, _, note = command.partition("  # ")
    assert line == ("spark-submit <spark-submit options> /home/me/dist/infer_main.py --input s3://b/in/ "
                    "--output 's3://b/o k.jsonl' --resume")
    assert "the same spark-submit line (or the same EMR step) with --resume added" in note
    assert "[the same spark options]" not in command


def test_client_mode_with_relative_paths_changes_to_the_submit_directory_first(tmp_path):
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "mxinfer_job.zip").write_bytes(b"")
    (tmp_path / "job.yaml").write_text("top_k: 2\n")
    options = ["--master", "yarn", "--py-files", "dist/mxinfer_job.zip"]
    argv = [str(tmp_path / "dist" / "infer_main.py"), "--config", "job.yaml", "--top-k", "2"]
    command = rerun.resume_command(argv, [*JAVA, *options, *argv], cwd=str(tmp_path))
    assert command == (f"cd {shlex.quote(str(tmp_path))} && spark-submit --master yarn --py-files "
                       f"dist/mxinfer_job.zip {argv[0]} --config job.yaml --top-k 2 --resume")


def test_the_status_files_resume_command_is_the_make_submit_line_that_started_the_run(runner, monkeypatch):
    argv = [str(ROOT / "infer_main.py"), "--input", "s3://b/in/", "--model", "s3://b/m", "--output", "s3://b/o.jsonl"]
    options = ["--master", "local-cluster[2,1,1024]", "--properties-file", str(ROOT / "conf" / "spark-local.conf")]
    monkeypatch.setattr(rerun, "parent_jvm_cmdline", lambda: [*JAVA, *options, *argv])
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.chdir(ROOT)
    given = []
    monkeypatch.setattr(infer_main, "run_job", lambda cfg, resume_command=None, **_: given.append(resume_command) or 0)
    result = runner.invoke(infer_main.main, argv[1:])
    assert result.exit_code == 0, result.output
    # What the status file, make watch and the report show while the run goes on.
    assert given == ["make submit ARGS='--input s3://b/in/ --model s3://b/m --output s3://b/o.jsonl --resume'"]


def test_resume_is_added_once():
    assert rerun.resume_args(["--resume", "--top-k", "2"]) == ["--resume", "--top-k", "2"]
    assert rerun.resume_args(["--overwrite"]) == ["--resume"]


def test_the_driver_reads_the_parent_jvms_command_line_only_from_a_jvm():
    assert rerun.parent_jvm_cmdline() is None  # pytest's parent is a shell, not spark-submit
    line, _, note = infer_main.resume_command(["/x/infer_main.py", "--overwrite"]).partition("  # ")
    assert line == "spark-submit <spark-submit options> /x/infer_main.py --resume" and "--resume added" in note
