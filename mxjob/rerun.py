"""The command that resumes a run that did not finish: whole, so it can be pasted as it is.

In client mode spark-submit's JVM starts the Python driver, and its command
line (``/proc/PPID/cmdline``) holds every spark-submit option as given, after
``org.apache.spark.deploy.SparkSubmit``: :func:`resume_command` repeats them,
with the job's arguments, ``--overwrite`` dropped and ``--resume`` added. A
run that ``make submit`` or ``make run-local`` started (local-cluster, this
checkout's ``conf/spark-local.conf``) is resumed with ``make submit ARGS='...'``.
Elsewhere (cluster mode: the parent is YARN's application master) the
command is rebuilt from the SparkConf the job ran with (:func:`remember_conf`),
or, before Spark started, says which options to repeat.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

#: The class spark-submit's launcher runs; its arguments follow it on the JVM's command line.
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"
#: The checkout this module is in: ``make submit`` runs from there.
ROOT = Path(__file__).resolve().parent.parent
#: The properties file of ``make submit`` and ``make run-local``: a run it started is resumed the same way.
LOCAL_PROPERTIES = ROOT / "conf" / "spark-local.conf"

#: The SparkConf entries a spark-submit line needs, as :func:`remember_conf` keeps them.
_CONF_FLAGS = (("spark.master", "--master"), ("spark.submit.deployMode", "--deploy-mode"),
               ("spark.submit.pyFiles", "--py-files"))
_conf: dict[str, str] = {}


def remember_conf(conf: dict[str, str]) -> None:
    """Keep the SparkConf entries that rebuild the spark-submit line (called once Spark has started)."""
    _conf.clear()
    _conf.update({key: conf[key] for key, _ in _CONF_FLAGS if conf.get(key)})


def resume_args(job_args: Sequence[str]) -> list[str]:
    """The job's arguments with ``--overwrite`` dropped and ``--resume`` added (once)."""
    args = [a for a in job_args if a != "--overwrite"]
    return args if "--resume" in args else [*args, "--resume"]


def submit_args(jvm_cmdline: Sequence[str], argv: Sequence[str]) -> tuple[list[str], str] | None:
    """``(spark-submit options, job file)`` from the JVM's command line, if its tail is this driver's ``argv``."""
    if SUBMIT_CLASS not in jvm_cmdline:
        return None
    args = list(jvm_cmdline[jvm_cmdline.index(SUBMIT_CLASS) + 1:])
    job_args = list(argv[1:])
    split = len(args) - len(job_args) - 1
    if split < 0 or args[split + 1:] != job_args or os.path.basename(args[split]) != os.path.basename(argv[0]):
        return None
    return args[:split], args[split]


def is_make_submit(options: Sequence[str], script: str) -> bool:
    """Whether ``make submit`` (or ``make run-local``) started this run: this checkout's script and local settings."""
    given = dict(zip(options, options[1:]))
    return (Path(script).resolve() == ROOT / "infer_main.py"
            and Path(given.get("--properties-file", "/")).resolve() == LOCAL_PROPERTIES
            and given.get("--master", "").startswith("local-cluster["))


def resume_command(argv: Sequence[str], jvm_cmdline: Sequence[str] | None = None, cwd: str | None = None,
                   conf: dict[str, str] | None = None) -> str:
    """The command line that resumes this run, as complete as what is known about how it was started.

    Parameters
    ----------
    argv : sequence of str
        The driver's ``sys.argv``: the job file and its arguments.
    jvm_cmdline : sequence of str, optional
        The parent JVM's command line (client mode), see :func:`parent_jvm_cmdline`.
    cwd : str, optional
        The driver's working directory (for ``make submit``, which runs in the checkout).
    conf : dict, optional
        SparkConf entries (:func:`remember_conf`'s, by default).
    """
    job = resume_args(argv[1:])
    found = submit_args(jvm_cmdline, argv) if jvm_cmdline else None
    if found:
        options, script = found
        if is_make_submit(options, script):
            cd = "" if cwd is None or Path(cwd).resolve() == ROOT else f"cd {shlex.quote(str(ROOT))} && "
            return f"{cd}make submit ARGS={shlex.quote(shlex.join(job))}"
        return shlex.join(["spark-submit", *options, script, *job])
    conf = _conf if conf is None else conf
    if conf.get("spark.master"):
        options = [part for key, flag in _CONF_FLAGS if conf.get(key) for part in (flag, conf[key])]
        return shlex.join(["spark-submit", *options, os.path.basename(argv[0]), *job])
    return "spark-submit [the same spark options] " + shlex.join([os.path.basename(argv[0]), *job])


def parent_jvm_cmdline() -> list[str] | None:
    """The parent process's command line if it is spark-submit's JVM (Linux ``/proc``), else ``None``."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return None
    parts = data[:-1].split("\0") if data.endswith("\0") else data.split("\0")  # each argument ends in NUL
    return parts if SUBMIT_CLASS in parts else None
