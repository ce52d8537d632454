"""``make bench`` still runs: its quickest mode, end to end (images, moto + latency proxy, L, S, E, driver memory).

The benchmark measures; this only proves the measuring works, so it checks
that every number is there and sane, not how large it is.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.spark


def test_bench_quick_prints_the_table_and_results(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.run_bench", "--quick", "--work", str(tmp_path)],
                            cwd=str(ROOT), capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "| resnet20 3x32x32 |" in result.stdout
    assert "Driver for 1,000 results" in result.stdout and "assembly of 16 parts" in result.stdout
    assert "were it free, the other processes'" in result.stdout  # the E/L ceiling line
    assert "| resnet20 int8 |" in result.stdout and "Large photos: 8 JPEGs of 8-12 MP" in result.stdout
    assert "MXNet threads per Python worker" in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    int8 = results["int8"]["resnet20"]
    assert int8["L"]["images_per_second"] > 0 and int8["E"]["summary"]["precision"]["precision"] == "int8"
    assert int8["E"]["summary"]["predicted"] == 128
    large = results["large"]
    assert large["E"]["summary"]["predicted"] == 8 and large["decode"]["draft_cpu_ms_per_image"] > 0
    row = results["models"]["resnet20"]
    assert row["L"]["images_per_second"] > 0 and row["S"]["images_per_second"] > 0
    summary = row["E"]["summary"]
    assert summary["keys_listed"] == summary["predicted"] == results["images"] == 128
    assert row["E"]["E"] == summary["tasks"]["images_per_second"] > 0
    assert all(w["max_rss_bytes"] > 0 and w["first_task"]["images"] > 0
               for w in summary["python_workers"].values())
    assert row["E"]["driver_python_peak_rss"] > 0 and row["E"]["driver_jvm_peak_rss"] > 0
