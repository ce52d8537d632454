"""The light venv of the targets that only watch or deploy a job: ``requirements-ops.txt``, ``.venv-ops``.

Its versions are the other files' pins; what ``make watch``, ``check-job``,
``upload`` and the ``emr-*`` targets run imports nothing outside it (checked
here with every other installed package hidden, and, marked ``install``, in a
venv built from it); and those targets build and use it, not ``.venv``, where
there is no ``.venv``, but use ``.venv`` where there is one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.helpers import ROOT

OPS = ROOT / "requirements-ops.txt"
#: A job config check-job accepts: nothing is read from S3.
JOB = "input: s3://bucket/images/\nmodel: s3://bucket/models/m\noutput: s3://bucket/out/p.jsonl\n"
#: What the light venv must never hold, by distribution and by module: Spark, MXNet, pandas, the test tools.
HEAVY = {"pyspark": "pyspark", "mxnet": "mxnet", "pandas": "pandas", "moto": "moto", "pytest": "pytest",
         "scikit-image": "skimage", "scikit-learn": "sklearn"}


def pins(path: Path) -> dict[str, str]:
    """``{name: version}`` of a requirements file's ``name==version`` lines (extras dropped)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            req = Requirement(line)
            found[canonicalize_name(req.name)] = str(req.specifier).removeprefix("==")
    return found


def ops_lines() -> list[str]:
    """requirements-ops.txt without its comments and blank lines."""
    lines = (raw.split("#", 1)[0].strip() for raw in OPS.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line]


def ops_packages() -> set[str]:
    return {canonicalize_name(Requirement(line).name) for line in ops_lines()[1:]}


def dependency_closure(names: set[str]) -> set[str]:
    """The distributions ``names`` install, as this venv's metadata says (extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for raw in metadata.requires(name) or []:
            req = Requirement(raw)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def test_every_ops_version_is_declared_once_in_requirements_txt_or_repeats_the_dev_pin():
    runtime, dev = pins(ROOT / "requirements.txt"), pins(ROOT / "requirements-dev.txt")
    lines = ops_lines()
    assert lines[0] == "-c requirements.txt"  # pip then installs requirements.txt's versions, no other
    for line in lines[1:]:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if req.specifier:  # pinned here: only what requirements.txt cannot constrain, at the dev pin
            assert name not in runtime, f"{line}: the version is requirements.txt's, leave it to -c"
            assert str(req.specifier) == f"=={dev.get(name)}", f"{line}: requirements-dev.txt has {dev.get(name)}"
        else:
            assert name in runtime, f"{line}: not in requirements.txt, so -c leaves it unpinned"


def test_the_ops_packages_leave_out_spark_mxnet_and_the_test_tools():
    closure = dependency_closure(ops_packages())
    assert sorted(closure & set(HEAVY)) == []
    assert {"boto3", "click", "pyyaml", "awscli"} <= closure


def importable_names(distributions: set[str]) -> set[str]:
    """The top-level modules those distributions put in site-packages."""
    names = set()
    for dist in distributions:
        for path in metadata.files(dist) or []:
            top = path.parts[0]
            if top != ".." and not top.endswith(".dist-info"):
                names.add(top.split(".", 1)[0])
    return names


#: Run a module (``-m name``) or script after hiding every package of site-packages not in ALLOWED
#: (a comma-separated list): an import of one fails as it would in the light venv.
HIDING_RUNNER = """
import importlib.abc, importlib.machinery, os, runpy, sys, sysconfig
allowed = set(sys.argv[1].split(","))
site = tuple(dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]))

class OpsOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if path is not None or name in allowed:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name)
        where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), None))
        if where and where.startswith(site):
            raise ModuleNotFoundError(f"No module named {name!r} (not in requirements-ops.txt)", name=name)
        return None

sys.meta_path.insert(0, OpsOnly())
if sys.argv[2] == "-m":
    sys.argv = [sys.argv[3], *sys.argv[4:]]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[2:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # as `python deploy/emr.py` has it
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_ops_only(*args: str) -> subprocess.CompletedProcess:
    allowed = importable_names(dependency_closure(ops_packages()))
    return subprocess.run([sys.executable, "-c", HIDING_RUNNER, ",".join(sorted(allowed)), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("ops") / "job.yaml"
    path.write_text(JOB)
    return path


def entry_points(job_file: Path) -> dict[str, tuple[tuple[str, ...], str]]:
    """What the light venv runs, and a line of its output: the watch, and deploy/emr.py's job check."""
    return {
        "watch --help": (("-m", "mxjob.reporting.watch", "--help"),
                         "Usage: python -m mxjob.reporting.watch [OPTIONS] OUTPUT"),
        "emr.py --help": (("deploy/emr.py", "--help"), "Create an EMR cluster for the inference job"),
        "emr.py check-job": (("deploy/emr.py", "check-job", "--job-file", str(job_file), "--", "--top-k", "3"),
                             "infer_main.py accepts them"),
        "emr.py add-step --dry-run": (("deploy/emr.py", "add-step", "--dry-run", "--aws", "aws", "--s3", "s3://b/p",
                                       "--cluster-id", "j-ABC", "--job-file", str(job_file), "--", "--top-k", "3"),
                                      "+ aws emr add-steps --region "),
    }


@pytest.mark.parametrize("entry", ["watch --help", "emr.py --help", "emr.py check-job", "emr.py add-step --dry-run"])
def test_watch_and_deploy_run_with_only_the_ops_packages_importable(job_file, entry):
    args, expected = entry_points(job_file)[entry]
    result = run_ops_only(*args)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout


def test_the_hiding_runner_refuses_a_package_outside_the_ops_file(tmp_path):
    # Without this, a runner that hid nothing would pass the test above.
    script = tmp_path / "uses_spark.py"
    script.write_text("import pyspark\n")
    result = run_ops_only(str(script))
    assert result.returncode == 1
    assert "No module named 'pyspark' (not in requirements-ops.txt)" in result.stderr


# ---------------------------------------------------------------------------
# The make targets: `make -n` prints what they would run, running nothing

#: Each target with the variables it needs, and the command it runs in its venv (``{venv}``).
TARGETS = {
    "watch": (["OUTPUT=s3://b/out.jsonl"], "{venv}/bin/python -m mxjob.reporting.watch "),
    "check-job": (["JOB=job.yaml"], "{venv}/bin/python deploy/emr.py check-job "),
    "upload": (["S3=s3://b/p", "JOB=job.yaml"], "{venv}/bin/aws s3 cp --recursive "),
    "emr-cluster": (["S3=s3://b/p"], "{venv}/bin/python deploy/emr.py create-cluster "),
    "emr-submit": (["S3=s3://b/p", "CLUSTER_ID=j-ABC"], "{venv}/bin/python deploy/emr.py add-step "),
    "emr-run": (["S3=s3://b/p"], "{venv}/bin/python deploy/emr.py run-job "),
}


def make_dry_run(target: str, *variables: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(["make", "--no-print-directory", "-n", target, *TARGETS[target][0], *variables],
                            cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    return result.stdout


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_without_a_full_venv_the_target_builds_the_light_one_and_runs_in_it(tmp_path, target):
    full, light = tmp_path / ".venv", tmp_path / ".venv-ops"
    # No full venv of either stack (FULL_VENVS: the checkout's .venv and .venv-emr8, which this one may have).
    printed = make_dry_run(target, f"VENV={full}", "FULL_VENVS=", f"LIGHT_VENV={light}", f"DIST={tmp_path / 'dist'}")

    assert f"{light}/bin/python -m pip install --quiet -r requirements-ops.txt" in printed
    assert TARGETS[target][1].format(venv=light) in printed
    assert "requirements-dev.txt" not in printed and f"{full}/" not in printed


def test_with_only_the_other_stacks_venv_installed_the_targets_use_it(tmp_path):
    full, other, light = tmp_path / ".venv", tmp_path / ".venv-emr8", tmp_path / ".venv-ops"
    other.mkdir()
    (other / ".installed").touch()
    printed = make_dry_run("watch", f"VENV={full}", f"FULL_VENVS={other}", f"LIGHT_VENV={light}",
                           "OUTPUT=s3://b/k.jsonl")
    assert f"{other}/bin/python -m mxjob.reporting.watch" in printed and "pip install" not in printed


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_with_the_full_venv_installed_the_target_uses_it_and_builds_nothing(tmp_path, target):
    full, light = tmp_path / ".venv", tmp_path / ".venv-ops"
    full.mkdir()
    (full / ".installed").touch()  # newer than the requirements files: make sees .venv up to date
    printed = make_dry_run(target, f"VENV={full}", f"LIGHT_VENV={light}", f"DIST={tmp_path / 'dist'}")

    assert TARGETS[target][1].format(venv=full) in printed
    assert "pip install" not in printed and str(light) not in printed


# ---------------------------------------------------------------------------
# The light venv itself, built by make from PyPI (or pip's cache)


def clean_env() -> dict[str, str]:
    """This environment without this venv: make's python3 is the system's, as for a user's first run."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PATH": path}


@pytest.mark.install
def test_make_venv_ops_builds_a_venv_that_watches_and_deploys_without_spark_or_mxnet(tmp_path, job_file):
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    light = tmp_path / ".venv-ops"
    subprocess.run(["make", "--no-print-directory", "venv-ops", f"LIGHT_VENV={light}"], cwd=ROOT, env=clean_env(),
                   check=True, timeout=900)
    python = str(light / "bin" / "python")

    for args, expected in entry_points(job_file).values():
        result = subprocess.run([python, *args], cwd=ROOT, env=clean_env(), capture_output=True, text=True,
                                timeout=120, check=False)
        assert result.returncode == 0, result.stderr
        assert expected in result.stdout
    heavy = sorted(HEAVY.values())
    present = subprocess.run(
        [python, "-c", f"import importlib.util as u; print([n for n in {heavy!r} if u.find_spec(n)])"],
        cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=60, check=True).stdout
    assert present.strip() == "[]"
    assert (light / "bin" / "aws").is_file()  # make upload's and deploy/emr.py's CLI
