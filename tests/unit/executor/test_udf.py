"""mxinfer.model_udf: a DataFrame column of image bytes to top-k predictions.

One spark-submit of ``tests/support/udf_job.py`` on local-cluster (two executors, the
modules shipped with ``--py-files``) proves it on Spark; the executor side is
also tested in this process, without Spark.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import mxinfer
from demo import make_demo
from demo.run_local import spark_env, spark_submit_command
from mxjob.core import state
from mxjob.executor import udf
from tests.support.helpers import MASTER, ROOT

SHAPE = make_demo.INPUT_SHAPE


def digit_pngs(count: int) -> list[bytes]:
    (_, _), (test_x, _) = make_demo.digits_split()
    return [make_demo.digit_png(img) for img in test_x[:count]]


def reference(logits_prefix, images: list[bytes], top_k: int = 3):
    clf = mxinfer.ImageClassifier(str(logits_prefix), SHAPE, batch_size=4, preprocess=make_demo.PREPROCESS)
    return clf.classify_images(images, top_k=top_k)


def assert_same(predictions: list[dict], expected: list[tuple]) -> None:
    assert [(p["class_id"], p["label"]) for p in predictions] == [(c, label) for c, label, _ in expected]
    np.testing.assert_allclose([p["probability"] for p in predictions], [p for _, _, p in expected], atol=1e-6)


def test_score_images_matches_classify_images_with_per_row_errors(logits_prefix):
    pngs = digit_pngs(9)
    clf = mxinfer.get_classifier(mxinfer.ModelSpec.from_prefix(str(logits_prefix)), SHAPE, 4)
    images = [pngs[0], None, b"not an image", *pngs[1:]]  # 11 rows: three batches of 4
    rows = mxinfer.score_images(clf, images, make_demo.PREPROCESS, top_k=3)
    assert rows[1] == (None, None)  # null in, null out
    assert rows[2][0] is None and rows[2][1]["stage"] == "decode"
    assert rows[2][1]["type"] == "UnidentifiedImageError"
    expected = reference(logits_prefix, pngs)
    for (predictions, error), want in zip([rows[0], *rows[3:]], expected):
        assert error is None
        assert_same(predictions, want)


def test_udf_worker_loads_the_model_once_for_all_its_batches(logits_prefix):
    spec = udf.UdfSpec(mxinfer.ModelSpec.from_prefix(str(logits_prefix)), make_demo.PREPROCESS,
                           batch_size=7, top_k=2)  # a batch size no other test binds: a fresh cache entry
    before = state.counters.model_loads
    pngs = digit_pngs(5)
    frames = list(udf._udf_batches(iter([pd.Series(pngs[:3]), pd.Series(pngs[3:])]), spec))
    assert state.counters.model_loads == before + 1
    assert [len(f) for f in frames] == [3, 2] and list(frames[0].columns) == ["predictions", "error"]
    assert frames[1]["predictions"][0][0]["class_id"] == reference(logits_prefix, pngs[3:4], 1)[0][0][0]


def test_model_udf_is_an_iterator_pandas_udf_and_checks_its_arguments(logits_prefix):
    from pyspark.rdd import PythonEvalType

    recipe = mxinfer.Preprocess(SHAPE, std=(255.0,))
    udf = mxinfer.model_udf(str(logits_prefix), recipe, batch_size=4, top_k=3)
    assert udf.evalType == PythonEvalType.SQL_SCALAR_PANDAS_ITER_UDF
    with pytest.raises(ValueError, match="cpu, gpu or gpu:N"):
        mxinfer.model_udf(str(logits_prefix), recipe, context="tpu")
    with pytest.raises(ValueError, match="at least 1"):
        mxinfer.model_udf(str(logits_prefix), recipe, top_k=0)
    with pytest.raises(TypeError, match=r"preprocess must be a Preprocess .* got tuple"):
        mxinfer.model_udf(str(logits_prefix), SHAPE)


def test_model_udf_takes_the_jobs_whole_recipe_decode_included(logits_prefix, monkeypatch):
    """--decode (and every other recipe setting) reaches the UDF's workers as the job's Preprocess carries it."""
    import pandas as pd
    import pyspark.sql.functions

    made = []
    monkeypatch.setattr(pyspark.sql.functions, "pandas_udf", lambda function, _type: made.append(function) or function)
    for decode in ("draft", "exact"):
        recipe = mxinfer.Preprocess(SHAPE, std=(255.0,), decode=decode, resize="short-side-crop")
        mxinfer.model_udf(str(logits_prefix), recipe, batch_size=4, top_k=3)
    seen = []
    monkeypatch.setattr(udf, "score_images", lambda classifier, images, preprocess, top_k: seen.append(
        preprocess) or [])
    for predict in made:
        list(predict(iter([pd.Series([], dtype=object)])))
    assert [(p.decode, p.resize) for p in seen] == [("draft", "short-side-crop"), ("exact", "short-side-crop")]


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
