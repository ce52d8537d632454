"""docs/library.md's Python blocks, and what each says it prints (the comments under its ``print`` calls): the page
is run as printed by ``tests/demo/test_examples.py`` on this Python, and by ``tests/project/test_bootstrap.py`` on the
bootstrapped EMR 7 one."""

from __future__ import annotations

import ast
import doctest
import re

from tests.support.helpers import ROOT

PAGE = ROOT / "docs" / "library.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
#: '...' stands for any text, and line breaks and runs of spaces for any whitespace, as the page says.
CHECKER, OPTIONS = doctest.OutputChecker(), doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def python_blocks(text: str) -> list[tuple[int, str]]:
    """``(line number, code)`` of each fenced ``python`` block."""
    return [(text.count("\n", 0, m.start()) + 2, m[1]) for m in BLOCK.finditer(text)]


def printed(code: str) -> str:
    """What a block says it prints: the comment lines right under each top-level statement that calls ``print``."""
    lines = code.splitlines()
    out = []
    for statement in ast.parse(code).body:
        if not any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print" for n in ast.walk(statement)):
            continue
        for line in lines[statement.end_lineno:]:
            if not line.startswith("#"):
                break
            out.append(line[2:] if line.startswith("# ") else line[1:])
    return "".join(line + "\n" for line in out)


BLOCKS = python_blocks(PAGE.read_text(encoding="utf-8"))
LOCAL = [(line, code) for line, code in BLOCKS if "SparkSession" not in code]
SPARK = [(line, code) for line, code in BLOCKS if "SparkSession" in code]
