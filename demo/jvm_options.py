"""Class-data sharing archives for the local Spark's JVMs: spark-submit's launcher, its driver and the executors.

Each Spark JVM loads and verifies some ten thousand classes from the
venv's ``pyspark/jars`` at start. On this two-core machine that is seconds of
CPU per JVM, and a local run starts four of them (the launcher, the driver
with local-cluster's master and worker, two executors) while the Python
driver checks the model. A dynamic CDS archive (JDK 13+,
``-XX:ArchiveClassesAtExit``, then ``-XX:SharedArchiveFile``) holds those
classes parsed and verified, mapped from one file: an empty PySpark job on
``local-cluster[2,1,2048]`` went from 9.5 to 6 s and from 14.5 to 8.5 CPU-s
here (``make bench-peers`` prints the floor it measures).

:func:`build` makes the archives once, with a small PySpark job of the
run's kind (``make jvm-archives``, which every target that runs Spark here
runs first: a no-op while they are current); they live in the venv, beside the jars
they were made from, with :data:`KEY_FILE` saying which Java and which jars.
:func:`driver_options`, :func:`executor_options` and :func:`launcher_env`
name them only while that key still matches: a JVM given an archive of
another JDK or classpath prints a warning on stdout and runs without it, and
none is given here rather than a stale one. The JVMs' own logging of the
archive is off (``-Xlog:cds=off``) so that a mismatch the key missed never
prints into the job's output.

Local only: on EMR the JVMs are EMR's (its JDK, its classpath), and an
archive would have to be made on each node after Spark is installed, which
bootstrap actions run before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Where the archives live: in the venv, so a new venv (new jars) makes new ones.
ARCHIVE_DIR = Path(sys.prefix) / "share" / "mxinfer-cds"
KEY_FILE = "key.json"
ROLES = ("launcher", "driver", "executor")
#: Quiet if the archive cannot be mapped (another JDK build): the JVM then runs without it.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"

#: The training job: the SparkContext, an accumulator, a Python mapPartitions, a sum and the status
#: tracker, as mxjob.run.cluster uses them, so the archive holds the classes a run loads.
TRAINING_JOB = """
from pyspark import SparkConf, SparkContext
sc = SparkContext(conf=SparkConf().setAppName("mxinfer-cds-training"))
sc.setJobGroup("cds", "training")
total = sc.accumulator(0)
def part(index, rows):
    total.add(1)
    yield sum(rows) + index
print(sc.parallelize(range(64), 4).mapPartitionsWithIndex(part).sum(), total.value)
sc.statusTracker().getJobIdsForGroup("cds")
sc.stop()
"""


def java_binary() -> str | None:
    """The ``java`` spark-class runs: ``$JAVA_HOME/bin/java``, else the first on ``PATH``; resolved."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def spark_jars() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def current_key() -> dict | None:
    """What the archives depend on: the Java binary (path, size, time) and the jars' names and sizes."""
    java = java_binary()
    jars = spark_jars()
    if java is None or not jars.is_dir():
        return None
    digest = hashlib.sha256()
    for jar in sorted(jars.iterdir()):
        digest.update(f"{jar.name}:{jar.stat().st_size}\n".encode())
    stat = os.stat(java)
    return {"java": java, "java_size": stat.st_size, "java_mtime": int(stat.st_mtime), "jars": str(jars),
            "jars_sha256": digest.hexdigest()}


def archive(role: str, folder: Path | None = None) -> Path | None:
    """The archive of ``role`` (in ``folder``, else :data:`ARCHIVE_DIR`) if it exists and was made from this Java
    and these jars, else ``None``."""
    folder = folder or ARCHIVE_DIR
    path = folder / f"{role}.jsa"
    try:
        key = json.loads((folder / KEY_FILE).read_text())
    except (OSError, ValueError):
        return None
    return path if path.is_file() and key == current_key() else None


def _options(role: str, folder: Path | None) -> str:
    path = archive(role, folder)
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path is not None else ""


def driver_options(folder: Path | None = None) -> str:
    """The driver JVM's archive flags (``--driver-java-options``), or ``""``."""
    return _options("driver", folder)


def executor_options(folder: Path | None = None) -> str:
    """The executors' archive flags (``spark.executor.defaultJavaOptions``), or ``""``."""
    return _options("executor", folder)


def launcher_env(folder: Path | None = None) -> dict:
    """``SPARK_LAUNCHER_OPTS`` for spark-class's launcher JVM, or nothing."""
    options = _options("launcher", folder)
    return {"SPARK_LAUNCHER_OPTS": options} if options else {}


def build(folder: Path | None = None) -> dict:
    """Make the three archives with :data:`TRAINING_JOB` on ``local-cluster[1,1,1024]``; their sizes in bytes.

    One executor, so one process writes the executor's archive. The key is
    written last: a build that fails half-way leaves archives nothing uses.
    """
    from demo.run_local import spark_env

    folder = folder or ARCHIVE_DIR
    key = current_key()
    if key is None:
        raise RuntimeError("no java binary or no pyspark/jars: nothing to archive")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / KEY_FILE).unlink(missing_ok=True)
    for role in ROLES:
        (folder / f"{role}.jsa").unlink(missing_ok=True)
    dump = {role: f"-XX:ArchiveClassesAtExit={folder / f'{role}.jsa'}" for role in ROLES}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "training.py"
        script.write_text(TRAINING_JOB)
        command = [str(Path(sys.executable).parent / "spark-submit"), "--master", "local-cluster[1,1,1024]",
                   "--properties-file", str(ROOT / "conf" / "spark-local.conf"),
                   "--driver-java-options",
                   f"-Dlog4j2.configurationFile=file:{ROOT / 'conf' / 'log4j2.properties'} {dump['driver']}",
                   "--conf", f"spark.executor.defaultJavaOptions={dump['executor']}", str(script)]
        env = spark_env({"SPARK_LAUNCHER_OPTS": dump["launcher"]}, fake_aws=False)
        done = subprocess.run(command, env=env, cwd=tmp, capture_output=True, text=True, timeout=300, check=False)
    missing = [role for role in ROLES if not (folder / f"{role}.jsa").is_file()]
    if done.returncode != 0 or missing:
        raise RuntimeError(f"the training job exited {done.returncode}, archives missing: {missing or 'none'}\n"
                           f"{done.stderr[-2000:]}")
    (folder / KEY_FILE).write_text(json.dumps(key, indent=1))
    return {role: (folder / f"{role}.jsa").stat().st_size for role in ROLES}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["build", "show"])
    parser.add_argument("--folder", type=Path, default=ARCHIVE_DIR)
    parser.add_argument("--if-stale", action="store_true",
                        help="build only if an archive is missing or was made from another Java or other jars")
    args = parser.parse_args(argv)
    if args.command == "build" and args.if_stale and all(archive(role, args.folder) for role in ROLES):
        return 0
    if args.command == "show":
        for role in ROLES:
            print(f"{role}: {archive(role, args.folder) or 'none (made by: python -m demo.jvm_options build)'}")
        return 0
    try:
        sizes = build(args.folder)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        # Spark runs without the archives, only slower to start: a failed build must not fail the install.
        print(f"demo.jvm_options: no class-data sharing archives ({exc}); Spark's JVMs start without them",
              file=sys.stderr)
        return 0
    print("class-data sharing archives for Spark's JVMs in " + str(args.folder) + ": "
          + ", ".join(f"{role} {size / 2**20:.0f} MiB" for role, size in sizes.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
