"""The command that resumes a run that did not finish: whole, so it can be pasted as it is.

In client mode spark-submit's JVM starts the Python driver, and its command
line (``/proc/PPID/cmdline``) holds every spark-submit option as given, after
``org.apache.spark.deploy.SparkSubmit``: :func:`resume_command` repeats them,
with the job's arguments, ``--overwrite`` dropped and ``--resume`` added (after
a ``cd`` to the driver's directory when a path in them is relative). A run
that ``make submit`` or ``make run-local`` started (local-cluster, this
checkout's ``conf/spark-local.conf``) is resumed with ``make submit ARGS='...'``.

In cluster mode the parent is YARN's ApplicationMaster, which runs a localized
copy of the job file under its bare name: the line is rebuilt from the
SparkConf (:func:`remember_conf` once Spark has started, before that the copy
YARN put beside the driver, :func:`container_conf`), where spark-submit left
the master, the deploy mode and the URIs of ``--py-files``, ``--files``,
``--archives`` and ``--jars``. No setting names the job file, a
``--properties-file`` or a ``--conf``: the line shows the job file as a
placeholder in angle brackets and says to submit the same line (or EMR step)
with ``--resume`` added.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from mxjob.core.secrets import redact

#: The class spark-submit's launcher runs; its arguments follow it on the JVM's command line.
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"
#: The checkout this module is in: ``make submit`` runs from there.
ROOT = Path(__file__).resolve().parents[2]
#: The properties file of ``make submit`` and ``make run-local``: a run it started is resumed the same way.
LOCAL_PROPERTIES = ROOT / "conf" / "spark-local.conf"

#: The spark-submit flags a SparkConf gives back, each from the first of its keys that is set: spark-submit
#: keeps the URIs it resolved on the submitting host in ``spark.yarn.dist.*`` (YARN) and ``spark.submit.pyFiles``.
_CONF_FLAGS = (("--master", ("spark.master",)), ("--deploy-mode", ("spark.submit.deployMode",)),
               ("--py-files", ("spark.yarn.dist.pyFiles", "spark.submit.pyFiles")),
               ("--files", ("spark.yarn.dist.files",)), ("--archives", ("spark.yarn.dist.archives",)),
               ("--jars", ("spark.yarn.dist.jars",)))
_conf: dict[str, str] = {}
#: Where YARN localizes the SparkConf in a cluster-mode driver's container: readable before Spark starts.
CONTAINER_CONF = Path("__spark_conf__") / "__spark_conf__.properties"
#: Stands for the job file in a rebuilt line: in cluster mode YARN runs a copy, and no setting names the original.
JOB_FILE = "<path/to/infer_main.py>"
#: Stands for the spark-submit options when no SparkConf is known either.
OPTIONS = "<spark-submit options>"
#: Follows a rebuilt line, as a shell comment: the settings do not hold every option spark-submit was given.
SAME_LINE = ("  # the driver does not know every spark-submit option (nor, in cluster mode, the job file's path): "
             "submit the same spark-submit line (or the same EMR step) with --resume added")


def remember_conf(conf: dict[str, str]) -> None:
    """Keep the SparkConf entries that rebuild the spark-submit line (called once Spark has started)."""
    _conf.clear()
    _conf.update({key: conf[key] for _, keys in _CONF_FLAGS for key in keys if conf.get(key)})


def conf_options(conf: dict[str, str]) -> list[str]:
    """The spark-submit options ``conf`` gives back (see :data:`_CONF_FLAGS`)."""
    options = []
    for flag, keys in _CONF_FLAGS:
        value = next((conf[key] for key in keys if conf.get(key)), None)
        if value:
            options += [flag, value]
    return options


_PROPERTY = re.compile(r"((?:\\.|[^\\=:])*)[=:](.*)")
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)")
_ESCAPED = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    """``text`` without ``java.util.Properties``' backslash escapes."""
    return _ESCAPE.sub(lambda m: chr(int(m[1][1:], 16)) if len(m[1]) == 5 else _ESCAPED.get(m[1], m[1]), text)


def container_conf(cwd: str | None) -> dict[str, str]:
    """The SparkConf YARN localized beside a cluster-mode driver (``java.util.Properties`` text), or ``{}``."""
    if cwd is None:
        return {}
    try:
        text = (Path(cwd) / CONTAINER_CONF).read_text(encoding="utf-8", errors="replace")
    except OSError:  # not in a YARN container
        return {}
    found = (_PROPERTY.fullmatch(line.strip()) for line in text.splitlines() if not line.startswith(("#", "!")))
    return {_unescape(m[1].strip()): _unescape(m[2].lstrip()) for m in found if m}


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

    A URI's password (``--endpoint-url http://user:secret@host``) shows as ``REDACTED``: put it back to run it.

    Parameters
    ----------
    argv : sequence of str
        The driver's ``sys.argv``: the job file and its arguments.
    jvm_cmdline : sequence of str, optional
        The parent JVM's command line (client mode), see :func:`parent_jvm_cmdline`.
    cwd : str, optional
        The driver's working directory: spark-submit's in client mode, the container's in cluster mode.
    conf : dict, optional
        SparkConf entries (by default :func:`remember_conf`'s, else :func:`container_conf`'s).
    """
    job = resume_args(argv[1:])
    found = submit_args(jvm_cmdline, argv) if jvm_cmdline else None
    if found:
        return redact(_from_submit_line(*found, job, cwd))
    if conf is None:
        conf = _conf or container_conf(cwd)
    return redact(_from_conf(conf, argv[0], job))


def _from_submit_line(options: list[str], script: str, job: list[str], cwd: str | None) -> str:
    """spark-submit's own line again, or ``make submit`` for a run it started; from ``cwd`` if a path is relative."""
    if is_make_submit(options, script):
        cd = "" if cwd is None or Path(cwd).resolve() == ROOT else f"cd {shlex.quote(str(ROOT))} && "
        return f"{cd}make submit ARGS={shlex.quote(shlex.join(job))}"
    line = shlex.join(["spark-submit", *options, script, *job])
    return f"cd {shlex.quote(cwd)} && {line}" if cwd and _names_a_relative_path([*options, *job], cwd) else line


def _names_a_relative_path(args: Sequence[str], cwd: str) -> bool:
    """Whether an argument (a ``--flag=`` value, an item of a comma-separated list) is a file relative to ``cwd``."""
    values = (arg.partition("=")[2] if arg.startswith("-") else arg for arg in args)
    # ':' marks a URI (s3://, file:, local:), never a relative path
    return any(item and ":" not in item and not os.path.isabs(item) and os.path.exists(os.path.join(cwd, item))
               for value in values for item in value.split(","))


def _from_conf(conf: dict[str, str], script: str, job: list[str]) -> str:
    """The line rebuilt from ``conf``: placeholders for what it does not say, and a comment saying so."""
    options = conf_options(conf)
    # A cluster-mode driver runs YARN's copy of the job file: its path says nothing of the original's.
    known = os.path.isabs(script) and conf.get("spark.submit.deployMode") != "cluster"
    return " ".join([shlex.join(["spark-submit", *options]) if options else f"spark-submit {OPTIONS}",
                     shlex.quote(script) if known else JOB_FILE, shlex.join(job)]) + SAME_LINE


def parent_jvm_cmdline() -> list[str] | None:
    """The parent process's command line if it is spark-submit's JVM (Linux ``/proc``), else ``None``."""
    try:
        data = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode("utf-8", "replace")
    except OSError:
        return None
    parts = data[:-1].split("\0") if data.endswith("\0") else data.split("\0")  # each argument ends in NUL
    return parts if SUBMIT_CLASS in parts else None
