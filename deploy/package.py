"""Build the ``--py-files`` zip: ``mxinfer.py``, ``utils.py`` and the ``mxjob`` package, nothing else.

``make package`` runs it into ``dist/``; ``make run-local``, ``make submit``
and the tests build the same zip into a temporary folder, so every
spark-submit ships exactly what a cluster gets. Usage::

    python deploy/package.py dist/mxinfer_job.zip
"""

from __future__ import annotations

import py_compile
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Top-level modules beside the package in the zip (infer_main.py is the job file, passed on its own).
MODULES = ("mxinfer.py", "utils.py")
PACKAGE = "mxjob"


def zip_members(root: Path = ROOT) -> list[Path]:
    """The files the zip holds, relative to ``root``: the modules, then the package's ``.py`` files, subpackages too."""
    files = [Path(name) for name in MODULES]
    files += sorted(p.relative_to(root) for p in (root / PACKAGE).rglob("*.py"))
    return files


def build_zip(path: str | Path, root: Path = ROOT) -> Path:
    """Write the zip to ``path`` and return it; the same sources give the same bytes (fixed timestamps).

    Beside each ``.py`` goes its ``.pyc``, compiled by this Python, where
    ``zipimport`` looks first: Python cannot cache what it compiles from a
    zip, so without them the driver and every Python worker compile the
    sources at each start (0.3 CPU-s for the driver's modules on a 2-vCPU
    AMD EPYC). They are hash-checked against the source beside them (a stale
    one is never used) and carry no timestamp; another Python version
    ignores them for their magic number and compiles the sources, as before:
    build the zip with the cluster's Python (EMR 7: 3.9) to give it them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, tempfile.TemporaryDirectory() as folder:
        for member in zip_members(root):
            name = member.as_posix()
            _add(archive, name, (root / member).read_bytes())
            compiled = py_compile.compile(str(root / member), cfile=str(Path(folder) / "member.pyc"), dfile=name,
                                          doraise=True, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            _add(archive, name + "c", Path(compiled).read_bytes())
    return path


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    """One member, with the fixed timestamp and mode that keep the zip's bytes a function of its sources."""
    info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    archive.writestr(info, data)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python deploy/package.py OUT.zip")
    print(build_zip(sys.argv[1]))
