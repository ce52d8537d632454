"""The import rules (.importlinter): one layer per package, every package in one, no import cycle between modules;
executor code and the estimate import nothing of the driver's side; the constants module imports nothing, and the
library imports no option table."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import networkx
import pytest

from deploy import layout_docs
from mxjob.core import constants
from mxjob.options import settings, settings_docs

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
    ("executor/partition.py", "from mxjob.options import settings", "One layer per pipeline stage"),
    ("model/preprocess.py", "import click", "What the executors import"),
    ("tasks/classify.py", "from mxjob.inputs import listing", "What the executors import"),
    ("s3/reads.py", "from mxjob.options import config", "One layer per pipeline stage"),
    ("tasks/base.py", "from mxjob.outputs import base", "One layer per pipeline stage"),
    ("results/results.py", "    from mxjob.executor import stats", "One layer per pipeline stage"),
    ("planning/estimate.py", "from mxjob.executor.partition import score_partition", "The estimate only projects"),
])
def test_an_import_across_a_layer_breaks_its_contract(tree_copy, module, added, contract):
    path = tree_copy / "mxjob" / module
    path.write_text(path.read_text() + f"\n{added}  # noqa\n")
    result = lint_imports(tree_copy)
    assert result.returncode == 1
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout[-3000:]


def test_a_package_in_no_layer_breaks_the_layers_contract(tree_copy):
    (tree_copy / "mxjob" / "newstage").mkdir()
    (tree_copy / "mxjob" / "newstage" / "__init__.py").write_text("")
    result = lint_imports(tree_copy)
    assert result.returncode == 1
    assert "mxjob.newstage" in result.stdout and "One layer per pipeline stage" in result.stdout


#: Each module's imports of mxjob modules, as grimp (import-linter's graph) finds them in the tree it runs in.
_GRAPH = ("import grimp, json; graph = grimp.build_graph('mxjob', exclude_type_checking_imports=True, cache_dir=None); "
          "print(json.dumps({m: sorted(o for o in graph.find_modules_directly_imported_by(m) if o.startswith('mxjob'))"
          " for m in graph.modules}))")


def import_cycles(root: Path) -> list[list[str]]:
    """Every set of mxjob modules that import each other round, imports inside functions included.

    grimp runs in a fresh interpreter in ``root``, so it reads that tree's package, not the one imported here.
    """
    result = subprocess.run([sys.executable, "-c", _GRAPH], cwd=root, capture_output=True, text=True, timeout=300,
                            check=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})
    graph = networkx.DiGraph(json.loads(result.stdout))  # networkx comes with scikit-image (requirements-dev)
    return [sorted(group) for group in networkx.strongly_connected_components(graph) if len(group) > 1]


def test_no_module_imports_itself_round_a_cycle():
    assert import_cycles(ROOT) == []


def test_an_import_inside_a_function_that_closes_a_cycle_is_found(tree_copy):
    path = tree_copy / "mxjob" / "inputs" / "extsort.py"
    path.write_text(path.read_text() + "\n\ndef _late():\n    from mxjob.inputs import manifest  # noqa\n")
    cycles = import_cycles(tree_copy)
    assert any({"mxjob.inputs.extsort", "mxjob.inputs.manifest"} <= set(group) for group in cycles), cycles


def test_the_constants_module_imports_nothing():
    tree = ast.parse((ROOT / "mxjob" / "core" / "constants.py").read_text())
    assert not [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def test_the_constants_defaults_are_generated_from_the_table():
    path = ROOT / "mxjob" / "core" / "constants.py"
    assert path.read_text() == settings_docs.constants_text(path.read_text()), \
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


def test_the_layout_page_is_generated_from_the_packages():
    """docs/layout.md's map: every module once, in its layer, with its docstring's first sentence (make docs)."""
    page = (ROOT / "docs" / "layout.md").read_text()
    assert page == layout_docs.page(ROOT), "docs/layout.md's map differs from the packages: run make docs"
    modules = sorted(p.relative_to(ROOT / "mxjob").as_posix() for p in (ROOT / "mxjob").rglob("*.py")
                     if p.name != "__init__.py")
    block = page[page.index(layout_docs.BEGIN):page.index(layout_docs.END)]
    assert sorted(line.split()[0] for line in block.splitlines() if line.startswith("  ") and ".py" in line) == modules


def test_a_new_module_changes_the_map(tree_copy):
    (tree_copy / "deploy").mkdir()
    (tree_copy / "docs").mkdir()
    (tree_copy / "docs" / "layout.md").write_text((ROOT / "docs" / "layout.md").read_text())
    for name in layout_docs.TOP_FILES:
        shutil.copy(ROOT / name, tree_copy / name)
    assert layout_docs.page(tree_copy) == (ROOT / "docs" / "layout.md").read_text()
    (tree_copy / "mxjob" / "tasks" / "segment.py").write_text('"""--task segment: a class per pixel."""\n')
    assert "  tasks/segment.py" in layout_docs.page(tree_copy) and "a class per pixel" in layout_docs.page(tree_copy)



def imports_of(folder: Path, package: str, skip: str = "") -> list[str]:
    """``file: module`` for each import of ``package`` or its modules by a file under ``folder`` (not under its
    subfolder ``skip``), in functions too."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        if skip and path.relative_to(folder).parts[0] == skip:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(folder)}: {name}" for name in names
                      if name == package or name.startswith(package + ".")]
    return found


@pytest.mark.parametrize("folder, package, skip", [("demo", "tests", ""), ("bench", "tests", ""),
                                                   ("tests", "bench", "bench")])
def test_the_demo_and_the_bench_import_no_test_and_only_the_benchs_tests_import_the_bench(folder, package, skip):
    assert imports_of(ROOT / folder, package, skip) == []


def test_an_import_of_the_bench_in_a_function_is_found(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "test_own.py").write_text("from bench import scale\n")
    (tmp_path / "test_x.py").write_text("def test_x():\n    from bench.scale import write_manifest\n")
    assert imports_of(tmp_path, "bench", skip="bench") == ["test_x.py: bench.scale"]
