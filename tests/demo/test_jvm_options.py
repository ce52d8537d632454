"""The local Spark JVMs' class-data sharing archives (demo/jvm_options.py): named only while they match, and used.

``make venv`` builds them; a JVM started with ``-Xshare:on`` refuses to
start unless it can map its archive, so the job below proves that the
driver's and the executors' archives fit the JVMs spark-submit starts.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from demo import jvm_options
from demo.run_local import ROOT, spark_env, spark_submit_command


def fake_archives(folder, key):
    folder.mkdir(parents=True, exist_ok=True)
    for role in jvm_options.ROLES:
        (folder / f"{role}.jsa").write_bytes(b"archive")
    (folder / jvm_options.KEY_FILE).write_text(json.dumps(key))


def test_archives_are_named_only_while_their_key_matches_this_java_and_these_jars(tmp_path):
    key = jvm_options.current_key()
    assert key is not None and key["jars"].endswith("pyspark/jars")
    fake_archives(tmp_path / "same", key)
    assert jvm_options.driver_options(tmp_path / "same") == (
        f"-XX:SharedArchiveFile={tmp_path / 'same' / 'driver.jsa'} {jvm_options.QUIET}")
    assert jvm_options.launcher_env(tmp_path / "same") == {
        "SPARK_LAUNCHER_OPTS": f"-XX:SharedArchiveFile={tmp_path / 'same' / 'launcher.jsa'} {jvm_options.QUIET}"}
    fake_archives(tmp_path / "other-jars", {**key, "jars_sha256": "0" * 64})  # another pyspark's jars
    fake_archives(tmp_path / "other-java", {**key, "java_mtime": key["java_mtime"] + 1})  # Java upgraded
    for folder in ("other-jars", "other-java", "none"):
        assert jvm_options.executor_options(tmp_path / folder) == ""
        assert jvm_options.launcher_env(tmp_path / folder) == {}
    (tmp_path / "same" / "executor.jsa").unlink()  # a key without its archive
    assert jvm_options.executor_options(tmp_path / "same") == ""


def test_without_archives_the_command_names_none(monkeypatch, tmp_path):
    monkeypatch.setattr(jvm_options, "ARCHIVE_DIR", tmp_path)
    command = spark_submit_command(["--help"])
    assert "SharedArchiveFile" not in " ".join(command)
    assert not any(arg.startswith("spark.executor.defaultJavaOptions") for arg in command)
    assert "SPARK_LAUNCHER_OPTS" not in spark_env() or "SharedArchiveFile" not in spark_env()["SPARK_LAUNCHER_OPTS"]


@pytest.mark.spark
def test_the_archives_make_venv_built_fit_the_jvms_spark_submit_starts(tmp_path):
    for role in jvm_options.ROLES:
        assert jvm_options.archive(role) is not None, f"no {role} archive: run python -m demo.jvm_options build"
    script = tmp_path / "job.py"
    script.write_text("from pyspark import SparkContext\nsc = SparkContext()\n"
                      "print('sum', sc.parallelize(range(10), 2).map(lambda x: x * 2).sum())\nsc.stop()\n")
    command = spark_submit_command([])  # the job's JVM options, the script instead of infer_main.py
    command[command.index("--master") + 1] = "local-cluster[1,1,1024]"
    command[-1] = str(script)
    command = [arg.replace("-XX:SharedArchiveFile", "-Xshare:on -XX:SharedArchiveFile") for arg in command]
    env = spark_env()
    env["SPARK_LAUNCHER_OPTS"] = env["SPARK_LAUNCHER_OPTS"].replace("-XX:", "-Xshare:on -XX:", 1)
    assert sum("-Xshare:on" in arg for arg in [*command, env["SPARK_LAUNCHER_OPTS"]]) == 3
    done = subprocess.run(command, env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "sum 90" in done.stdout


def test_if_stale_builds_only_when_an_archive_is_missing_or_of_another_java_or_jars(tmp_path, monkeypatch, capsys):
    built = []
    monkeypatch.setattr(jvm_options, "build", lambda folder: built.append(folder) or {"driver": 2**20})
    fake_archives(tmp_path / "current", jvm_options.current_key())
    fake_archives(tmp_path / "stale", {**jvm_options.current_key(), "jars_sha256": "0" * 64})
    for folder in ("current", "stale", "missing"):
        assert jvm_options.main(["build", "--if-stale", "--folder", str(tmp_path / folder)]) == 0
    assert built == [tmp_path / "stale", tmp_path / "missing"]
    assert "class-data sharing archives for Spark's JVMs in" in capsys.readouterr().out


def test_a_failed_build_says_spark_runs_without_the_archives_and_does_not_fail_the_install(monkeypatch, capsys):
    def no_java(folder=None):
        raise RuntimeError("no java binary or no pyspark/jars: nothing to archive")

    monkeypatch.setattr(jvm_options, "build", no_java)
    assert jvm_options.main(["build"]) == 0
    assert capsys.readouterr().err == ("demo.jvm_options: no class-data sharing archives (no java binary or no "
                                       "pyspark/jars: nothing to archive); Spark's JVMs start without them\n")
