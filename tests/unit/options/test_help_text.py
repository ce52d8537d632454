"""User-facing text outside docs/: ``--help``'s opening lines, and the module map in ``mxjob/__init__.py``.

``--help`` is what a user reads first, so its lines above the options must say
what the job makes (the three tasks) and where (the output formats). The
package's docstring is a map for engineers; every module it names must exist,
whatever modules are added or moved later.
"""

from __future__ import annotations

import re
from pathlib import Path

import mxjob
from mxjob import tasks
from tests.project.test_docs import ISSUE
from tests.support.helpers import ROOT

# A module named in a docstring: ``name``, ``pkg.name`` or ``name.py`` (not ``--py-files``, ``make package``).
MODULE_NAME = re.compile(r"``([A-Za-z_][\w.]*)``")


def help_intro(runner) -> str:
    """``infer_main.py --help`` above its option list."""
    import infer_main

    result = runner.invoke(infer_main.main, ["--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output.partition("\nOptions:")[0]


def test_help_opens_with_the_three_tasks_and_what_each_writes(runner):
    intro = help_intro(runner)
    assert tasks.names() == ("classify", "embed", "detect")
    rows = {task: re.search(rf"^\s+{task}\s+(.+)$", intro, re.M) for task in tasks.names()}
    assert all(rows.values()), intro
    assert rows["classify"][1].endswith("; the default")
    assert "top-k labels" in rows["classify"][1]
    assert "a vector per image" in rows["embed"][1]
    assert "boxes" in rows["detect"][1]


def test_help_opens_with_every_output_format(runner):
    intro = " ".join(help_intro(runner).split())
    for said in ("JSON Lines", ".jsonl.gz: gzipped", "one Parquet object", "--output-format parquet",
                 "s3://BUCKET/PREFIX/ a Parquet dataset", "KEY.summary.json"):
        assert said in intro, said
    # The first line no longer promises top-k JSON Lines alone.
    assert "top-k JSON Lines" not in intro


def test_help_names_no_issue_number(runner):
    import infer_main

    text = runner.invoke(infer_main.main, ["--help"], terminal_width=400).output
    assert not [line for line in text.splitlines() if ISSUE.search(line)]


def missing_modules(docstring: str, package: Path = ROOT / "mxjob", root: Path = ROOT) -> list[str]:
    """The names in ``docstring`` that are neither a module of ``package`` nor a top-level ``.py`` of ``root``."""
    missing = []
    for name in MODULE_NAME.findall(docstring):
        stem = name[:-3] if name.endswith(".py") else name
        parts = Path(*stem.split("."))
        candidates = (package / parts.with_suffix(".py"), package / parts / "__init__.py",
                      root / parts.with_suffix(".py"))
        if not any(path.is_file() for path in candidates):
            missing.append(name)
    return missing


def test_every_module_the_package_docstring_names_exists():
    named = MODULE_NAME.findall(mxjob.__doc__)
    assert len(named) > 10, named
    assert missing_modules(mxjob.__doc__) == []


def test_the_module_check_reports_a_name_that_is_not_a_module(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "a.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "pkg" / "sub" / "b.py").write_text("", encoding="utf-8")
    (tmp_path / "top.py").write_text("", encoding="utf-8")
    doc = "``a``, ``sub``, ``sub.b``, ``top.py``, ``top``, ``defaults``, ``sub.c``; ``make package``, ``--py-files``"
    assert missing_modules(doc, tmp_path / "pkg", tmp_path) == ["defaults", "sub.c"]

