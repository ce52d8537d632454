"""``make submit ARGS='...'``: the job through spark-submit on local-cluster, from any shell.

``.venv/bin/spark-submit`` alone fails in a shell where the venv is not
activated (exit 127, ``find_spark_home.py ... 'NoneType' object has no
attribute 'origin'``): PySpark's launcher runs whatever ``python3`` is first
on PATH, which has no pyspark. This sets the environment the run needs
(:func:`demo.run_local.spark_env`), prints the whole command with that
environment, so it can be copied and run by hand, and runs it.

Against a local S3 server (an ``--endpoint-url`` on 127.0.0.1 or localhost)
it sets moto's fake keys; against anything else your own AWS credentials
apply, as on a cluster.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from demo.run_local import ROOT, spark_env, spark_submit_command

LOCAL_ENDPOINTS = ("http://127.0.0.1", "http://localhost", "https://127.0.0.1", "https://localhost")


def uses_local_s3(job_args: list[str]) -> bool:
    """Whether ``job_args`` point the job at an S3 server on this machine."""
    values = [arg.partition("=")[2] if arg.startswith("--endpoint-url=") else arg for arg in job_args]
    return any(value.startswith(LOCAL_ENDPOINTS) for value in values)


def absolute_config(job_args: list[str], cwd: str) -> list[str]:
    """``job_args`` with a relative local ``--config`` path made absolute against ``cwd``; an ``s3://`` URI stays.

    spark-submit runs in the checkout, and the printed line may be run from
    anywhere: a path relative to the caller's directory would name another file.
    """
    def absolute(value: str) -> str:
        return value if "://" in value else os.path.normpath(os.path.join(cwd, value))  # join keeps an absolute one

    out = []
    for arg in job_args:
        if out and out[-1] == "--config":
            arg = absolute(arg)
        elif arg.startswith("--config="):
            arg = "--config=" + absolute(arg[len("--config="):])
        out.append(arg)
    return out


def shell_line(command: list[str], env: dict[str, str]) -> str:
    """``command`` as one line a POSIX shell runs as is, with ``env`` assigned in front."""
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *map(shlex.quote, command)])


def main(job_args: list[str]) -> int:
    local = uses_local_s3(job_args)
    env = spark_env(fake_aws=local)
    command = spark_submit_command(absolute_config(job_args, os.getcwd()))
    # What this adds to the caller's environment: with it, the line runs from any shell.
    shown = {k: v for k, v in env.items() if os.environ.get(k) != v}
    print("== " + shell_line(command, shown), flush=True)
    return subprocess.call(command, env=env, cwd=str(ROOT))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
