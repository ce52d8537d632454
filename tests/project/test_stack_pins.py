"""deploy/stack_pins.py: a stack's pins are requirements.txt's with the stack file's in place of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from deploy import stack_pins

ROOT = Path(__file__).resolve().parents[2]


def pins(text: str) -> dict[str, str]:
    return {stack_pins.name_of(line): line for line in text.splitlines() if stack_pins.name_of(line)}


def test_the_emr8_stack_changes_pyspark_alone():
    requirements = (ROOT / "requirements.txt").read_text()
    merged = pins(stack_pins.merged(requirements, (ROOT / "stacks" / "emr8.txt").read_text()))
    base = pins(requirements)
    assert merged["pyspark"] == "pyspark==4.0.2"
    assert {name: line for name, line in merged.items() if name != "pyspark"} == {
        name: line for name, line in base.items() if name != "pyspark"}


def test_the_emr7_stack_is_requirements_txt_as_it_is():
    requirements = (ROOT / "requirements.txt").read_text()
    assert stack_pins.merged(requirements, (ROOT / "stacks" / "emr7.txt").read_text()) == requirements


def test_names_compare_as_pip_normalizes_them_and_comments_stay():
    merged = stack_pins.merged("# pins\nPy_Spark==3.5.7  # EMR 7\nnumpy==1.23.5\n", "py.spark==4.0.2\n")
    assert merged == "# pins\npy.spark==4.0.2\nnumpy==1.23.5\n"


def test_a_stack_pin_requirements_txt_lacks_is_refused_by_the_command(tmp_path):
    (tmp_path / "stack.txt").write_text("pyspak==4.0.2\n")  # a typo would add a package
    done = subprocess.run([sys.executable, str(ROOT / "deploy" / "stack_pins.py"), str(ROOT / "requirements.txt"),
                           str(tmp_path / "stack.txt")], capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert "the stack pins pyspak, which requirements.txt does not" in done.stderr
    with pytest.raises(ValueError, match="pyspak"):
        stack_pins.merged("pyspark==3.5.7\n", "pyspak==4.0.2\n")
