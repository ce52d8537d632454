"""mxinfer.model_udf: a DataFrame column of image bytes to top-k predictions, without Spark.

The executor side, in this process: ``score_images``, the UDF's batches, its
arguments and recipe. ``tests/integration/test_udf.py`` proves it on Spark
(one spark-submit of ``tests/support/udf_job.py`` on local-cluster).
"""

from __future__ import annotations

import pandas as pd
import pytest

import mxinfer
from demo import make_demo
from mxjob.core import state
from mxjob.executor import udf
from tests.support.udf_reference import SHAPE, assert_same, digit_pngs, reference


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
