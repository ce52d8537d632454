"""The handler tests' detector: a small SSD-style graph, an input and output handler writing its boxes, and a bucket.

``tests/unit/model/test_handlers.py`` runs the handler without Spark (and a
dry run on the bucket); ``tests/integration/test_handlers.py`` runs the job
through spark-submit with the handler given as ``s3://``. Both compare every
box with the handler run in this process on a plain Predictor
(:func:`expected_boxes`).
"""

from __future__ import annotations

import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxinfer
from demo import make_demo
from tests.support.helpers import bucket_with_model, scored_lines

SHAPE = make_demo.INPUT_SHAPE

# Decodes with Pillow to 0-1 RGB (as float64: the job converts to float32) and
# writes the detections above a score as boxes. The pid and import count let
# the test see that each Python worker imported it once, from the shipped copy.
BOXES_HANDLER = '''
import io
import os
import subprocess
import sys
import sys

import numpy as np
from PIL import Image

LABELS = ["cat", "dog", "bird"]
MIN_SCORE = 0.25
# Counted on the sys module: per process, and not inherited like an environment variable.
sys.boxes_imports = getattr(sys, "boxes_imports", 0) + 1


def input_handler(key, data):
    if key.endswith("reject.png"):
        raise ValueError("rejected by input_handler")
    img = Image.open(io.BytesIO(data)).convert("RGB").resize((32, 32), Image.BILINEAR)
    return np.asarray(img, dtype=np.float64).transpose(2, 0, 1) / 255.0


def output_handler(key, outputs):
    if "explode" in key:
        raise RuntimeError("output_handler refuses " + key)
    detections = outputs[0]  # (anchors, 6): class id (-1: none), score, xmin, ymin, xmax, ymax
    kept = detections[(detections[:, 0] >= 0) & (detections[:, 1] >= MIN_SCORE)]
    return {
        "key": "ignored: the job keeps the real key",
        "boxes": [{"label": LABELS[int(d[0])], "score": d[1], "box": d[2:]} for d in kept],
        "worker": {"pid": os.getpid(), "imports": sys.boxes_imports, "file": __file__},
    }
'''


def make_detector(prefix: Path, num_classes: int = 3) -> None:
    """An SSD-style graph on 3x32x32: 16 anchors, softmax class scores, MultiBoxDetection head."""
    data = mx.sym.var("data")
    feat = mx.sym.Activation(mx.sym.Convolution(data, kernel=(3, 3), pad=(1, 1), num_filter=8, name="conv"),
                             act_type="relu")
    feat = mx.sym.Pooling(feat, kernel=(8, 8), stride=(8, 8), pool_type="avg")  # a 4x4 feature map
    anchors = mx.sym.contrib.MultiBoxPrior(feat, sizes=[0.4], ratios=[1.0])
    cls = mx.sym.Convolution(feat, kernel=(1, 1), num_filter=num_classes + 1, name="cls")
    cls_prob = mx.sym.softmax(mx.sym.reshape(cls, shape=(0, 0, -1)), axis=1)
    loc = mx.sym.Convolution(feat, kernel=(1, 1), num_filter=4, name="loc")
    loc = mx.sym.flatten(mx.sym.transpose(loc, axes=(0, 2, 3, 1)))
    det = mx.sym.contrib.MultiBoxDetection(cls_prob, loc, anchors, nms_threshold=0.5, name="detection")
    module = mx.mod.Module(det, data_names=["data"], label_names=[])
    module.bind(data_shapes=[("data", (1, *SHAPE))], for_training=False)
    mx.random.seed(0)
    module.init_params(mx.init.Xavier(magnitude=6))
    arg_params, aux_params = module.get_params()
    mx.model.save_checkpoint(str(prefix), 0, det, arg_params, aux_params)
    # Three labels for 16x6 outputs: a Classifier would refuse this model, a Predictor serves it.
    (prefix.parent / "synset.txt").write_text("cat\ndog\nbird\n")


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("detector") / "detector"
    make_detector(prefix)
    return prefix


@pytest.fixture(scope="module")
def boxes_handler(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("handler") / "boxes.py"
    path.write_text(BOXES_HANDLER)
    return path


def images() -> dict[str, bytes]:
    """Six digits, one undecodable object, one the input handler rejects, one the output handler does."""
    (_, _), (test_x, _) = make_demo.digits_split()
    objects = {f"imgs/{i}.png": make_demo.digit_png(test_x[i]) for i in range(6)}
    objects["imgs/garbage.png"] = b"<html>403</html>"
    objects["imgs/reject.png"] = make_demo.digit_png(test_x[6])
    objects["imgs/explode.png"] = make_demo.digit_png(test_x[7])
    return objects


def expected_boxes(detector, handler_path, objects, keys) -> dict[str, dict]:
    """The handler run in this process on a plain Predictor: what every executor must write."""
    handlers = mxinfer.load_handlers(str(handler_path))
    predictor = mxinfer.Predictor(str(detector), SHAPE, batch_size=1)
    return {key: json.loads(scored_lines(predictor, [key], [handlers.decode(key, objects[key], SHAPE)], handlers)[0])
            for key in keys}


def assert_same_boxes(got: dict, want: dict) -> None:
    assert len(got["boxes"]) == len(want["boxes"]) > 0
    for a, b in zip(got["boxes"], want["boxes"]):
        assert a["label"] == b["label"]
        np.testing.assert_allclose([a["score"], *a["box"]], [b["score"], *b["box"]], atol=1e-5)


BUCKET = "handler-bucket"


@pytest.fixture(scope="module")
def world(moto_endpoint, detector, boxes_handler):
    s3 = bucket_with_model(moto_endpoint, BUCKET, detector.parent)
    s3.upload_file(str(boxes_handler), BUCKET, "code/boxes.py")
    objects = images()
    for key, body in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    args = ["--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/detector",
            "--endpoint-url", moto_endpoint, "--input-shape", "3,32,32", "--batch-size", "4",
            "--handler", f"s3://{BUCKET}/code/boxes.py"]
    return {"s3": s3, "objects": objects, "args": args}
