"""Build the ``--py-files`` zip: ``mxinfer.py``, ``utils.py`` and the ``mxjob`` package, nothing else.

``make package`` runs it into ``dist/``; ``make run-local``, ``make submit``
and the tests build the same zip into a temporary folder, so every
spark-submit ships exactly what a cluster gets. Usage::

    python deploy/package.py dist/mxinfer_job.zip
"""

from __future__ import annotations

import sys
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
    """Write the zip to ``path`` and return it; the same sources give the same bytes (fixed timestamps)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for member in zip_members(root):
            info = zipfile.ZipInfo(member.as_posix(), date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, (root / member).read_bytes())
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python deploy/package.py OUT.zip")
    print(build_zip(sys.argv[1]))
