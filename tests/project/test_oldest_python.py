"""The oldest Python the shipped code may need: EMR 7 runs the job, the library and deploy/ on Python 3.9, while
this machine's venvs are 3.11, where a call that 3.10 added passes every test. vermin (vermin.ini) reads the code
for the version each call and syntax needs."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERMIN = Path(sys.executable).with_name("vermin")
#: What runs on EMR 7's Python 3.9: the job and its package, the library, the S3 helpers, the deploy tool.
SHIPPED = ("mxjob", "infer_main.py", "mxinfer.py", "utils.py", "deploy")


def vermin(root: Path, *paths: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(VERMIN), *paths], cwd=root, capture_output=True, text=True, timeout=300, check=False)


def test_the_shipped_code_runs_on_emr_7s_python():
    result = vermin(ROOT, *SHIPPED)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "Minimum required versions: 3.9" in result.stdout


def test_a_call_python_3_10_added_is_refused(tmp_path):
    shutil.copy(ROOT / "vermin.ini", tmp_path / "vermin.ini")
    (tmp_path / "mxjob").mkdir()
    (tmp_path / "mxjob" / "sorted_keys.py").write_text(
        "import bisect\n\n\ndef cut(column, frontier):\n"
        "    return bisect.bisect_right(column, frontier, key=lambda scalar: scalar.as_py())\n")
    result = vermin(tmp_path, "mxjob")
    assert result.returncode == 1
    assert "'bisect.bisect_right(key)' requires !2, 3.10" in result.stdout
    assert "Target versions not met:   3.9-" in result.stdout
