"""--precision int8 through spark-submit: the executors score with the int8 checkpoint the driver made.

The samples, the quantized checkpoint and the agreement gate are tested
without Spark in ``tests/unit/int8/test_int8.py``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import mxinfer
from demo import make_demo
from mxjob.int8 import int8_prep
from tests.support.helpers import bucket_with_model, spark_submit


@pytest.mark.spark
def test_the_executors_score_with_the_drivers_int8_checkpoint(moto_endpoint, demo_dir, tmp_path):
    s3 = bucket_with_model(moto_endpoint, "int8-job", demo_dir / "model")
    paths = sorted((demo_dir / "images").rglob("*.png"))[:40]
    keys = [f"imgs/{p.parent.name}/{p.name}" for p in paths]
    for key, path in zip(keys, paths):
        s3.put_object(Bucket="int8-job", Key=key, Body=path.read_bytes())
    result = spark_submit(["--input", "s3://int8-job/imgs/", "--model", "s3://int8-job/model/digits",
                           "--output", "s3://int8-job/out/p.jsonl", "--endpoint-url", moto_endpoint,
                           "--input-shape", "3,32,32", "--std", "255", "--batch-size", "8", "--top-k", "10",
                           "--precision", "int8", "--calibration-images", "20", "--min-agreement", "0.8"])
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(s3.get_object(Bucket="int8-job", Key="out/p.jsonl.summary.json")["Body"].read())
    assert summary["precision"]["precision"] == "int8" and summary["precision"]["images"] == 20
    assert summary["precision"]["top1_agreement"] >= 0.8 and summary["predicted"] == 40
    # The same documented sample, quantized here, gives the job's probabilities.
    by_key = dict(zip(keys, paths))
    listing = sorted((key, path.stat().st_size) for key, path in by_key.items())
    calibration, _ = int8_prep.sample_keys(listing, 20)
    arrays = np.stack([mxinfer.decode_image(by_key[k].read_bytes(), make_demo.PREPROCESS) for k, _ in calibration])
    spec = mxinfer.ModelSpec.from_prefix(str(demo_dir / "model" / "digits"), labels_uri="")
    int8 = mxinfer.Classifier(mxinfer.quantize_int8(spec, make_demo.INPUT_SHAPE, arrays, str(tmp_path / "q")),
                              make_demo.INPUT_SHAPE, 8)
    lines = [json.loads(line) for line in
             s3.get_object(Bucket="int8-job", Key="out/p.jsonl")["Body"].read().decode().splitlines()]
    mine = int8.probabilities(np.stack([mxinfer.decode_image(by_key[line["key"]].read_bytes(),
                                                             make_demo.PREPROCESS) for line in lines]))
    for line, row in zip(lines, mine):
        got = {p["class_id"]: p["probability"] for p in line["predictions"]}
        np.testing.assert_allclose([got[c] for c in range(10)], row, atol=1e-4)
