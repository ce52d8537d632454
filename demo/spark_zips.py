"""Spark's own Python zips, compiled: what the local driver and every executor's Python daemon import PySpark from.

spark-submit puts ``$SPARK_HOME/python/lib/pyspark.zip`` and Py4J's
``py4j-*-src.zip`` first on the ``PYTHONPATH`` of the Python driver and of
every executor's Python daemon (Spark's ``PythonUtils.sparkPythonPath``),
ahead of the installed package and the bytecode pip compiled for it. Python
caches no bytecode for what it imports from a zip, so each of those processes
compiles PySpark's sources at its start: 0.4 of the 0.55 CPU-s that
``import pyspark.daemon, pyspark.worker`` takes on a 2-vCPU AMD EPYC, three
times a local run (the driver and two executors' daemons), on the start-up's
critical path (the executors' Python workers boot before they load the model).

:func:`compile_zip` adds each module's ``.pyc`` beside its source in those
two zips of the venv's PySpark (:func:`deploy.package.compiled`: this
Python's code, checked against the source's hash at each import, so a stale
one is never run), once: ``make spark-zips``, which every target that runs
Spark here runs first (a no-op while the zips hold this Python's code). A
PySpark reinstalled by pip brings its plain zips back, and the next
``make`` compiles them again. A failure leaves the zips as they were: Spark
then imports the sources, only slower to start.

Local only: on EMR the zips are EMR's (``/usr/lib/spark/python/lib``) and
each executor's Python daemon compiles them once, as on any Spark cluster.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import py_compile
import sys
import tempfile
import zipfile
from pathlib import Path

from deploy.package import compiled


def spark_home() -> Path:
    """The pip-installed PySpark's folder: the ``SPARK_HOME`` its spark-submit runs with."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("pyspark is not installed in this Python")
    return Path(spec.origin).parent


def spark_zips(home: Path) -> list[Path]:
    """PySpark's and Py4J's zips under ``home/python/lib``: what Spark puts on the Python processes' path."""
    folder = home / "python" / "lib"
    return sorted([*folder.glob("pyspark.zip"), *folder.glob("py4j-*-src.zip")])


def is_compiled(path: Path) -> bool:
    """Whether :func:`compile_zip` ran on the zip with this Python: it holds ``.pyc``, all of this Python's bytecode.

    Not "a ``.pyc`` for every source": one this Python cannot compile keeps
    its source alone, and the zip would be compiled again at every ``make``.
    """
    with zipfile.ZipFile(path) as archive:
        compiled_names = [name for name in archive.namelist() if name.endswith(".pyc")]
        return bool(compiled_names) and all(
            archive.read(name)[:4] == importlib.util.MAGIC_NUMBER for name in compiled_names)


def compile_zip(path: Path) -> int:
    """Rewrite the zip with this Python's ``.pyc`` beside each source it can compile; the ``.pyc`` written.

    Every other member is copied as it was (earlier ``.pyc`` are replaced).
    Written beside the zip, then renamed over it: a process that has the old
    one open keeps reading it.
    """
    written = 0
    fd, partial = tempfile.mkstemp(dir=path.parent, suffix=".zip.partial")
    os.close(fd)
    try:
        with zipfile.ZipFile(path) as old, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as new, \
                tempfile.TemporaryDirectory() as folder:
            for info in old.infolist():
                if info.filename.endswith(".pyc"):
                    continue
                data = old.read(info)
                new.writestr(info, data)
                if info.filename.endswith(".py"):
                    try:
                        code = compiled(data, info.filename, folder)
                    except py_compile.PyCompileError:  # not this Python's syntax: its source stays, compiled at import
                        continue
                    pyc = zipfile.ZipInfo(info.filename + "c", date_time=info.date_time)
                    pyc.compress_type, pyc.external_attr = zipfile.ZIP_DEFLATED, info.external_attr
                    new.writestr(pyc, code)
                    written += 1
        os.chmod(partial, path.stat().st_mode & 0o777)
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["compile", "show"])
    parser.add_argument("--home", type=Path, default=None, help="the SPARK_HOME (default: the installed PySpark's)")
    parser.add_argument("--if-stale", action="store_true",
                        help="compile only a zip that lacks this Python's bytecode for a module")
    args = parser.parse_args(argv)
    home = args.home or spark_home()
    for path in spark_zips(home):
        if args.command == "show":
            print(f"{path}: {'compiled' if is_compiled(path) else 'sources only (made by: make spark-zips)'}")
        elif not (args.if_stale and is_compiled(path)):
            try:
                print(f"{path}: {compile_zip(path)} modules compiled")
            except (OSError, zipfile.BadZipFile) as exc:
                # Spark imports the sources instead, only slower to start: a failure must not fail the install.
                print(f"demo.spark_zips: {path} left as it was ({exc})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
