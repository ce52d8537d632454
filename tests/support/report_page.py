"""The run report's page, checked: self-contained, its figures the summary's, and drawn in headless chromium.

Used by ``tests/unit/reporting/test_report.py`` (pages rendered from fake
runs) and ``tests/integration/test_report.py`` (a real run's page). The
browser checks need Debian's ``chromium`` (``make test`` installs it when run
as root); without it they skip, saying so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

CHROMIUM = shutil.which("chromium")
CHARTS = ("chart-throughput", "chart-progress", "chart-eta", "chart-time", "chart-io", "chart-labels",
          "chart-memory", "errors", "workers", "settings", "fingerprint")


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*https?:|url\(\s*["']?https?:""", page)
    # An http:// in text (the --endpoint-url option) is no request; only attributes and url() are.
    assert "<script" not in page and "<link" not in page and "@import" not in page


def figures(page: str) -> dict:
    return {m.group(1): m.group(2) for m in re.finditer(r'data-field="([^"]+)" data-value="([^"]*)"', page)}


def assert_figures_match(shown: dict, summ: dict) -> None:
    assert int(shown["summary.keys_listed"]) == summ["keys_listed"]
    assert int(shown["summary.predicted"]) == summ["predicted"]
    assert int(shown["summary.failed"]) == summ["failed"]
    assert float(shown["summary.rates.images_per_second_spark"]) == summ["rates"]["images_per_second_spark"]
    assert float(shown["summary.elapsed_seconds"]) == summ["elapsed_seconds"]
    assert float(shown["summary.tasks.last_end"]) == summ["tasks"]["last_end"]


def chromium(tmp_path: Path, page: Path, *args: str) -> subprocess.CompletedProcess:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (make test installs it with apt-get when run as root)")
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
                           '--host-resolver-rules=MAP * ~NOTFOUND', *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)


def check_in_browser(tmp_path: Path, page: Path, summ: dict | None = None) -> Path:
    """Screenshot (not blank) and DOM (every chart, the summary's figures) of ``page`` in headless chromium."""
    shot = tmp_path / "report.png"
    result = chromium(tmp_path, page, f"--screenshot={shot}", "--window-size=1280,2000")
    assert shot.exists(), result.stderr[-2000:]
    with Image.open(shot) as img:
        assert img.size == (1280, 2000)
        colours = img.convert("RGB").resize((320, 500)).getcolors(maxcolors=100_000)
        assert colours is not None and len(colours) > 50
    dom = chromium(tmp_path, page, "--dump-dom").stdout
    for chart in CHARTS:
        assert f'id="{chart}"' in dom
    if summ is not None:
        assert_figures_match(figures(dom), summ)
    return shot
