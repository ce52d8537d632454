"""The import layers: executor code, the S3 layer and the estimate import nothing above them (.importlinter),
the constants module imports nothing, and the library imports no option table."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mxjob.core import constants
from mxjob.options import settings

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, capture_output=True, text=True, timeout=300,
                          check=False, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})


@pytest.fixture
def tree_copy(tmp_path) -> Path:
    """The package and the contracts, copied, for a change the contracts must refuse."""
    shutil.copytree(ROOT / "mxjob", tmp_path / "mxjob", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def test_the_import_contracts_hold():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "3 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "added", "contract"), [
    ("executor/partition.py", "from mxjob.options import settings", "Executor code"),
    ("model/preprocess.py", "import click", "Executor code"),
    ("s3/reads.py", "from mxjob.options import config", "The S3 layer"),
    ("planning/estimate.py", "from mxjob.executor.partition import score_partition", "The estimate only projects"),
])
def test_an_import_across_a_layer_breaks_its_contract(tree_copy, module, added, contract):
    path = tree_copy / "mxjob" / module
    path.write_text(path.read_text() + f"\n{added}  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode == 1
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout[-3000:]


def test_the_constants_module_imports_nothing():
    tree = ast.parse((ROOT / "mxjob" / "core" / "constants.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_the_constants_defaults_are_generated_from_the_table():
    path = ROOT / "mxjob" / "core" / "constants.py"
    assert path.read_text() == settings.constants_text(path.read_text()), \
        "mxjob/core/constants.py's defaults differ from mxjob/options/settings.py's SETTINGS: run make docs"
    assert {s.name: s.library_default for s in settings.SETTINGS} == {
        name: value for name, value in vars(constants.DEFAULT).items() if not name.startswith("_")}


@pytest.mark.parametrize("module", ["mxinfer", "utils", "mxjob.executor.partition", "mxjob.executor.udf"])
def test_the_library_and_the_executors_import_no_option_table(module):
    code = (f"import sys, {module}; "
            "print(sorted(m for m in ('click', 'mxjob.options.settings', 'mxjob.options.config', 'yaml') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_the_layout_page_names_every_module_once():
    """docs/layout.md's map: one line a module, none missing, none that no longer exists."""
    page = (ROOT / "docs" / "layout.md").read_text()
    block = page[page.index("```text"):page.index("```", page.index("```text") + 3)]
    named = [line.split()[0] for line in block.splitlines()[1:] if line.strip() and not line.strip().startswith("#")
             and line.startswith("  ")]
    modules = sorted(p.relative_to(ROOT / "mxjob").as_posix() for p in (ROOT / "mxjob").rglob("*.py")
                     if p.name != "__init__.py")
    assert sorted(named) == modules
