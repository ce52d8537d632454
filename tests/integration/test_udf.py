"""mxinfer.model_udf on Spark: one spark-submit of ``tests/support/udf_job.py`` on local-cluster.

Two executors, the modules shipped with ``--py-files``: the UDF's rows equal
``classify_images``' predictions, a bad file is a decode error and a null
stays null. The executor side is tested without Spark in
``tests/unit/executor/test_udf.py``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from demo.run_local import spark_env, spark_submit_command
from tests.support.helpers import MASTER, ROOT
from tests.support.udf_reference import assert_same, digit_pngs, reference


@pytest.fixture(scope="module")
def udf_run(tmp_path_factory, logits_prefix):
    """spark-submit tests/support/udf_job.py on local-cluster over 14 digit PNGs and one bad file."""
    work = tmp_path_factory.mktemp("udf")
    images = work / "images"
    images.mkdir()
    pngs = digit_pngs(14)
    for i, png in enumerate(pngs):
        (images / f"{i:02d}.png").write_bytes(png)
    (images / "bad.png").write_bytes(b"<html>403</html>")
    out = work / "out.json"
    command = spark_submit_command([str(images), str(logits_prefix), str(out)], MASTER)
    command[command.index(str(ROOT / "infer_main.py"))] = str(ROOT / "tests" / "support" / "udf_job.py")
    result = subprocess.run(command, env=spark_env(), cwd=str(work), capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = {Path(path).name: value for path, value in json.loads(out.read_text()).items()}
    return rows, pngs


@pytest.mark.spark
def test_model_udf_on_local_cluster_gives_classify_images_predictions(udf_run, logits_prefix):
    rows, pngs = udf_run
    assert len(rows) == 16
    expected = reference(logits_prefix, pngs)
    for i, want in enumerate(expected):
        row = rows[f"{i:02d}.png"]
        assert row["error"] is None
        assert_same(row["predictions"], want)
    assert rows["bad.png"]["predictions"] is None
    assert rows["bad.png"]["error"]["stage"] == "decode"
    assert rows["null"] == {"predictions": None, "error": None}
