"""``pip install .``: the wheel holds the library and the job's CLI, and works from a virtualenv of its own.

The wheel is built from a copy of the checkout (the build writes ``build/``
and ``*.egg-info`` where it runs), then installed with ``--no-deps`` into a
fresh virtualenv that sees this one's site-packages through a ``.pth`` file:
the dependencies (MXNet, Spark) are not downloaded again, and nothing of the
checkout is on that interpreter's path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support.helpers import ROOT

pytestmark = pytest.mark.install

#: What the wheel ships: infer_main.py, the --py-files zip's modules and the mxjob package, nothing more.
#: utils.py stays out of the wheel: a top-level ``utils`` would shadow a user's own (the zip still carries it).
MODULES = {"infer_main.py", "mxinfer.py"}
#: Left out of the copy the wheel is built from: every dot-entry (the virtualenvs, the local YARN's state,
#: the Iceberg jars, git's data, caches: gigabytes the build never reads), build output and Spark's files.
_SKIPPED = shutil.ignore_patterns(".*", "build", "dist", "*.egg-info", "__pycache__", "spark-warehouse",
                                  "metastore_db")


def skipped(folder: str, names: list[str]) -> set[str]:
    """:data:`_SKIPPED` anywhere, and the checkout's own ``run/`` (make run-local's output), not ``mxjob/run/``."""
    return set(_SKIPPED(folder, names)) | ({"run"} if Path(folder) == ROOT else set())


def fresh_env() -> dict[str, str]:
    """This environment less what would put the checkout (or another Python's files) on the import path."""
    return {name: value for name, value in os.environ.items()
            if name not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=skipped)
    out = tmp / "out"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(out), str(source)], check=True, timeout=300, env=fresh_env())
    [built] = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel, tmp_path_factory) -> Path:
    """A virtualenv with the wheel installed; this venv's packages visible behind its own."""
    venv = tmp_path_factory.mktemp("venv") / "fresh"
    # No pip of its own (ensurepip takes seconds): this venv's pip is on its path through the .pth below.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120,
                   env=fresh_env())
    python = venv / "bin" / "python"
    site_packages = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True, env=fresh_env()).stdout.strip()
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    Path(site_packages, "dev-venv.pth").write_text("".join(f"{path}\n" for path in ours))
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, timeout=300, env=fresh_env(), cwd=str(venv))
    return venv


def test_wheel_ships_the_modules_and_the_package_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert top - {name for name in top if name.endswith(".dist-info")} == MODULES | {"mxjob"}
    shipped = {name for name in names if name.startswith("mxjob/")}
    assert shipped == {path.relative_to(ROOT).as_posix() for path in (ROOT / "mxjob").rglob("*.py")}


def test_console_script_runs_the_job_cli(fresh_venv, tmp_path):
    result = subprocess.run([str(fresh_venv / "bin" / "mxinfer-job"), "--help"], cwd=str(tmp_path),
                            env=fresh_env(), capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "Usage: mxinfer-job [OPTIONS]" in result.stdout
    assert "--input" in result.stdout


def test_library_imports_from_the_venv_not_the_checkout(fresh_venv, tmp_path):
    code = ("import mxinfer, mxjob, mxjob.s3, infer_main\n"
            "for module in (mxinfer, mxjob, mxjob.s3, infer_main): print(module.__file__)\n"
            "import importlib.util; print(importlib.util.find_spec('utils'))\n")
    result = subprocess.run([str(fresh_venv / "bin" / "python"), "-c", code], cwd=str(tmp_path),
                            env=fresh_env(), capture_output=True, text=True, timeout=120, check=True)
    *lines, utils_spec = result.stdout.splitlines()
    assert utils_spec == "None"  # no top-level utils installed to shadow a user's own
    files = [Path(line).resolve() for line in lines]
    assert len(files) == 4
    for path in files:
        assert path.is_relative_to(fresh_venv.resolve()), path
        assert not path.is_relative_to(ROOT), path
