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

make exits 2 whenever a command fails, so a failed run ends with the job's own
code as its last line (``exit 3: more images failed than --max-errors
allows``); the printed line, run by hand, exits with that code.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time

from demo.run_local import ROOT, spark_env, spark_submit_command
from mxjob.core.errors import exit_line

#: Seconds spark-submit has to stop after a forwarded SIGTERM or SIGINT (the driver writes its last status and
#: prints the resume command) before it is killed.
STOP_GRACE_SECONDS = 60.0
#: Seconds between checks on spark-submit while it runs: a wait without a timeout would not see the grace end.
POLL_SECONDS = 0.2

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


class _Forward:
    """A signal handler that passes SIGTERM and SIGINT on to the child's process group, and notes when."""

    def __init__(self):
        self.child: subprocess.Popen | None = None
        self.since: float | None = None
        self.signum = signal.SIGTERM

    def __call__(self, signum, _frame) -> None:
        self.since, self.signum = self.since or time.monotonic(), signum
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                os.killpg(self.child.pid, signum)


def run_and_wait(command: list[str], grace: float = STOP_GRACE_SECONDS, **popen_kwargs) -> int:
    """Run ``command`` and return its exit code (128 + N if signal N ended it), once it has stopped.

    SIGTERM or SIGINT to this process (make passes its SIGTERM on; Ctrl-C reaches
    the terminal's foreground group) goes to the command's process group, its
    own so that the JVM and the driver get it once, and this waits ``grace``
    seconds for it to stop before it kills the group: returning first would
    put the job's "Resume with:" line after the shell's prompt. The previous
    handlers are back on return.
    """
    forward = _Forward()
    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        forward.child = subprocess.Popen(command, start_new_session=True, **popen_kwargs)
        if forward.since is not None:  # signalled while it started
            os.killpg(forward.child.pid, forward.signum)
        code = _wait(forward, grace)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


def _wait(forward: _Forward, grace: float) -> int:
    """The child's return code; its group is killed once ``grace`` seconds passed after the first signal."""
    while True:
        try:
            return forward.child.wait(timeout=POLL_SECONDS)
        except subprocess.TimeoutExpired:
            if forward.since is not None and time.monotonic() - forward.since > grace:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(forward.child.pid, signal.SIGKILL)
                return forward.child.wait()


def main(job_args: list[str]) -> int:
    local = uses_local_s3(job_args)
    env = spark_env(fake_aws=local)
    command = spark_submit_command(absolute_config(job_args, os.getcwd()))
    # What this adds to the caller's environment: with it, the line runs from any shell.
    shown = {k: v for k, v in env.items() if os.environ.get(k) != v}
    print("== " + shell_line(command, shown), flush=True)
    code = run_and_wait(command, env=env, cwd=str(ROOT))
    if code:  # make exits 2 for any failure: the last line keeps the job's code
        print(exit_line(code), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
