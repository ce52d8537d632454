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

    Beside each ``.py`` goes its ``.pyc`` (:func:`compiled`), where
    ``zipimport`` looks first: Python cannot cache what it compiles from a
    zip, so without them the driver and every Python worker compile the
    sources at each start (0.3 CPU-s for the driver's modules on a 2-vCPU
    AMD EPYC). Another Python version ignores them for their magic number
    and compiles the sources, as before: build the zip with the cluster's
    Python (EMR 7: 3.9) to give it them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive, tempfile.TemporaryDirectory() as folder:
        for member in zip_members(root):
            name, source = member.as_posix(), (root / member).read_bytes()
            _add(archive, name, source)
            _add(archive, name + "c", compiled(source, name, folder))
    return path


def compiled(source: bytes, name: str, folder: str) -> bytes:
    """``source``'s code as this Python's ``.pyc``, hash-checked and without a timestamp; ``name`` in its tracebacks.

    Checked against the hash of the source beside it in the zip at each
    import (``zipimport`` does), so a ``.pyc`` that no longer matches its
    source is never run; and with no timestamp, the same source gives the
    same bytes. ``folder``: a scratch folder for py_compile's two files.
    Raises ``py_compile.PyCompileError`` for a source this Python cannot compile.
    """
    source_path, pyc_path = Path(folder) / "member.py", Path(folder) / "member.pyc"
    source_path.write_bytes(source)
    py_compile.compile(str(source_path), cfile=str(pyc_path), dfile=name, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    return pyc_path.read_bytes()


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
