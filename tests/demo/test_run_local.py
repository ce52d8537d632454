"""make run-local's own lines and its stop (demo/run_local.py), without Spark: what it prints, how SIGTERM ends it."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from demo import run_local, s3local

JOB_ARGS = ["--config", "conf/demo.yaml", "--endpoint-url", "http://127.0.0.1:5000"]


def test_run_local_prints_the_spark_submit_line_it_runs_not_a_make_submit_line(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(run_local, "py_files_zip", lambda: Path("/repo/run/py-files/mxinfer_job.zip"))
    monkeypatch.setattr(run_local.subprocess, "call", lambda command, **_: ran.append(command) or 0)
    assert run_local.submit_job(JOB_ARGS) == 0
    [command] = ran
    assert command[0].endswith("spark-submit") and command[-4:] == JOB_ARGS
    printed = capsys.readouterr().out
    assert "make submit" not in printed and "--overwrite" not in printed
    [line] = [x for x in printed.splitlines() if x.startswith("== ")]
    assert shlex.split(line.split(": ", 1)[1]) == command


def test_the_rerun_line_comes_after_the_run_and_says_it_is_how_to_rerun():
    text = run_local.keep_s3_message("http://127.0.0.1:5000", JOB_ARGS)
    assert "until Ctrl-C or SIGTERM" in text
    assert text.splitlines()[-2:] == ["   rerun the job with:", "   " + run_local.rerun_command(JOB_ARGS)]


@pytest.fixture
def moto_processes(monkeypatch):
    """The moto server processes that s3local.moto_server starts during the test."""
    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        process = real_popen(*args, **kwargs)
        started.append(process)
        return process

    monkeypatch.setattr(s3local.subprocess, "Popen", popen)
    return started


def sigterm_to_self(after: float) -> threading.Timer:
    """A SIGTERM to this process ``after`` seconds from now, as ``kill PID`` sends it to make run-local."""
    timer = threading.Timer(after, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    return timer


def test_sigterm_ends_the_keep_s3_wait_and_the_moto_server_stops(tmp_path, moto_processes):
    before = signal.getsignal(signal.SIGTERM)
    with s3local.moto_server(tmp_path / "moto.log"):
        timer = sigterm_to_self(0.5)
        try:
            started = time.monotonic()
            assert run_local.wait_until_stopped() == "SIGTERM"
            assert time.monotonic() - started < 30
        finally:
            timer.cancel()
    [server] = moto_processes
    assert server.poll() is not None  # the context's finally stopped it
    assert signal.getsignal(signal.SIGTERM) is before  # the wait's handler is gone with it


def test_sigterm_during_the_run_goes_through_the_moto_servers_clean_up(tmp_path, moto_processes):
    with pytest.raises(run_local.Terminated, match="SIGTERM"), run_local.sigterm_raises(), \
            s3local.moto_server(tmp_path / "moto.log"):
        timer = sigterm_to_self(0.5)
        try:
            time.sleep(30)  # as subprocess.call waits for spark-submit
        finally:
            timer.cancel()
    [server] = moto_processes
    assert server.poll() is not None



def test_the_iceberg_rerun_line_sets_the_catalog_and_adds_to_the_table_instead_of_overwriting():
    env = {"PYICEBERG_CATALOG__LOCAL__URI": "sqlite:////repo/run/iceberg/catalog.db",
           "PYICEBERG_CATALOG__LOCAL__WAREHOUSE": "s3://demo-bucket/warehouse"}
    args = [*JOB_ARGS, "--output", run_local.ICEBERG_TABLE, "--skip-existing"]
    words = shlex.split(run_local.rerun_command(args, env))
    assert words[:2] == [f"{k}={v}" for k, v in env.items()] and words[2:4] == ["make", "submit"]
    assert shlex.split(words[4].split("=", 1)[1]) == args  # no --overwrite: a table is added to


@pytest.mark.spark
def test_run_local_iceberg_writes_the_demo_to_a_table_read_back_with_pyiceberg(capsys):
    before = dict(os.environ)
    try:
        assert run_local.main(iceberg=True) == 0  # the demo's accuracy is as expected
    finally:  # main sets the catalog's variables in this process, as a user's shell would
        for name in set(os.environ) - set(before):
            del os.environ[name]
    printed = capsys.readouterr().out
    assert f"the Iceberg table {run_local.ICEBERG_TABLE}" in printed and "360 rows in" in printed
    assert "demo accuracy" in printed
    assert (run_local.ROOT / "run" / "output" / "digits.parquet").is_file()
    assert (run_local.ROOT / "run" / "output" / "digits.report.html").is_file()
    # The summary is named where it is, under the table's _mxinfer/ home, not beside the table's name.
    assert ("a copy of s3://demo-bucket/warehouse/demo.db/_mxinfer/digits/_summary.json)" in printed), printed
    assert "demo.digits.summary.json" not in printed
