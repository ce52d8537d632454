"""What the ``mxinfer.model_udf`` tests compare with: demo digits as PNGs and ``classify_images``' predictions.

Used by ``tests/unit/executor/test_udf.py`` (the executor side, in this
process) and ``tests/integration/test_udf.py`` (the UDF through spark-submit).
"""

from __future__ import annotations

import numpy as np

import mxinfer
from demo import make_demo

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
