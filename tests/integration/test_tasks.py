"""--task detect and --task embed through spark-submit: boxes and vectors compared with the models' own outputs.

``detect`` runs on a small SSD-style graph made in ``demo/examples.py``
(``MultiBoxPrior`` + ``MultiBoxDetection``, fixed random weights); every box
is compared with the same graph's output mapped back by hand onto the upright
image. ``embed`` runs on the real pretrained EfficientNet-Lite0
(``demo/pretrained.py``) and real photos; every vector is compared with a
plain MXNet Module bound on the layer's internal output. The result model's
views, the box mapping and the refusals are tested without Spark in
``tests/unit/tasks/test_tasks.py``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from PIL import Image, ImageOps

import mxinfer
from demo.examples import random_detector
from mxjob.model.preprocess import Preprocess
from tests.support.helpers import CLASSES, bucket_with_effnet, encode, make_s3_client, spark_submit

DETECT_SHAPE = (3, 64, 64)


def ssd(prefix: Path) -> Path:
    """demo/examples.py's tiny SSD-style detector on DETECT_SHAPE for CLASSES, with fixed random weights."""
    return random_detector(prefix, DETECT_SHAPE, CLASSES)


@pytest.fixture(scope="module")
def detector(tmp_path_factory) -> Path:
    return ssd(tmp_path_factory.mktemp("ssd") / "ssd")


# ----------------------------------------------------------------------------
# detect through spark-submit


def detect_images() -> dict[str, bytes]:
    rng = np.random.RandomState(3)

    def noise(w, h):
        return Image.fromarray(rng.randint(0, 255, (h, w, 3), np.uint8))

    exif = Image.Exif()
    exif[0x0112] = 6  # turned a quarter: the file is 120x90, the upright image 90x120
    return {"d/rotated.jpg": encode(noise(120, 90), "JPEG", quality=95, exif=exif.tobytes()),
            "d/tall.png": encode(noise(100, 140), "PNG"),
            "d/square.jpg": encode(noise(90, 90), "JPEG", quality=95),
            "d/broken.jpg": b"not an image"}


def by_hand(data: bytes, row: np.ndarray, min_score: float) -> tuple[list, list]:
    """docs/output.md's mapping, written out: the upright image, the short side to 73, the centre 64x64."""
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    width, height = upright.size
    short = round(64 * 256 / 224)
    scale = short / min(width, height)
    new_w, new_h = max(64, round(width * scale)), max(64, round(height * scale))
    left, top = (new_w - 64) // 2, (new_h - 64) // 2
    kept = row[(row[:, 0] >= 0) & (row[:, 1] >= min_score)]
    kept = kept[np.argsort(-kept[:, 1], kind="stable")]
    boxes = [[min(max((left + d[2] * 64) * width / new_w, 0), width), min(max((top + d[3] * 64) * height / new_h, 0),
              height), min(max((left + d[4] * 64) * width / new_w, 0), width),
              min(max((top + d[5] * 64) * height / new_h, 0), height)] for d in kept]
    return [width, height], [(int(d[0]), float(d[1]), box) for d, box in zip(kept, boxes)]


@pytest.mark.spark
def test_detect_job_writes_boxes_in_pixels_of_the_upright_image(moto_endpoint, detector):
    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="detect-job")
    for path in detector.parent.iterdir():
        s3.put_object(Bucket="detect-job", Key=f"model/{path.name}", Body=path.read_bytes())
    objects = detect_images()
    for key, data in objects.items():
        s3.put_object(Bucket="detect-job", Key=key, Body=data)
    min_score = 0.34
    result = spark_submit(["--input", "s3://detect-job/d/", "--model", "s3://detect-job/model/ssd", "--output",
                           "s3://detect-job/out/boxes.jsonl", "--endpoint-url", moto_endpoint, "--task", "detect",
                           "--input-shape", "3,64,64", "--std", "255", "--resize", "short-side-crop",
                           "--min-score", str(min_score), "--batch-size", "2", "--max-errors", "1"])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = {r["key"]: r for r in map(json.loads, s3.get_object(Bucket="detect-job", Key="out/boxes.jsonl")[
        "Body"].read().decode().splitlines())}
    assert rows["d/broken.jpg"]["error"]["stage"] == "decode"
    module = mx.mod.Module(mx.sym.load(f"{detector}-symbol.json"), label_names=None)
    module.bind(data_shapes=[("data", (1, *DETECT_SHAPE))], for_training=False)
    saved = mx.nd.load(f"{detector}-0000.params")
    module.set_params({k[4:]: v for k, v in saved.items()}, {})
    prep = Preprocess(DETECT_SHAPE, std=(255.0,), resize="short-side-crop")
    found = 0
    for key in ("d/rotated.jpg", "d/tall.png", "d/square.jpg"):
        module.forward(mx.io.DataBatch([mx.nd.array(mxinfer.decode_image(objects[key], prep)[np.newaxis])]),
                       is_train=False)
        size, want = by_hand(objects[key], module.get_outputs()[0].asnumpy()[0], min_score)
        got = rows[key]
        assert got["image_size"] == size
        assert [(d["class_id"], d["label"]) for d in got["detections"]] == [(c, CLASSES[c]) for c, _, _ in want]
        np.testing.assert_allclose([d["score"] for d in got["detections"]], [s for _, s, _ in want], atol=1e-5)
        np.testing.assert_allclose([d["box"] for d in got["detections"]] or np.zeros((0, 4)),
                                   [b for _, _, b in want] or np.zeros((0, 4)), atol=1e-3)
        assert all(d["score"] >= min_score and d["class_id"] >= 0 for d in got["detections"])
        found += len(want)
    assert rows["d/rotated.jpg"]["image_size"] == [90, 120] and found > 0


# ----------------------------------------------------------------------------
# embed through spark-submit on EfficientNet-Lite0


@pytest.fixture(scope="module")
def effnet_world(moto_endpoint, tmp_path_factory):
    from demo import photos as images
    from demo import pretrained

    s3, prefix = bucket_with_effnet(moto_endpoint, "embed-job", tmp_path_factory.mktemp("effnet-embed"))
    photos = {f"photos/{i:02d}.jpg": data for i, data in enumerate(images.photo_views(5, seed=11))}
    for key, data in photos.items():
        s3.put_object(Bucket="embed-job", Key=key, Body=data)
    args = ["--endpoint-url", moto_endpoint, "--model", "s3://embed-job/model/effnet", "--input",
            "s3://embed-job/photos/", "--mean", pretrained.MEAN, "--std", pretrained.STD, "--task", "embed",
            "--batch-size", "3"]
    return {"s3": s3, "prefix": prefix, "photos": photos, "args": args, "pretrained": pretrained}


def reference_vectors(world, normalize: bool) -> dict[str, np.ndarray]:
    """The layer the FullyConnected head reads, from a plain Module on the documented recipe."""
    prefix, pretrained = world["prefix"], world["pretrained"]
    graph = json.loads(Path(f"{prefix}-symbol.json").read_text())["nodes"]
    layer = graph[[n for n in graph if n["op"] == "FullyConnected"][-1]["inputs"][0][0]]["name"]
    symbol = mx.sym.load(f"{prefix}-symbol.json").get_internals()[layer + "_output"]
    module = mx.mod.Module(symbol, label_names=None)
    module.bind(data_shapes=[("data", (1, *pretrained.INPUT_SHAPE))], for_training=False)
    saved = mx.nd.load(f"{prefix}-0000.params")
    module.set_params({k[4:]: v for k, v in saved.items() if k.startswith("arg:")},
                      {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}, allow_extra=True)
    prep = Preprocess(pretrained.INPUT_SHAPE, mean=(127.0,) * 3, std=(128.0,) * 3)
    out = {}
    for key, data in world["photos"].items():
        module.forward(mx.io.DataBatch([mx.nd.array(mxinfer.decode_image(data, prep)[np.newaxis])]), is_train=False)
        vector = module.get_outputs()[0].asnumpy().reshape(-1)
        out[key] = vector / np.linalg.norm(vector) if normalize else vector
    return out


@pytest.mark.spark
def test_embed_job_writes_the_layers_vectors_as_json_lines_and_parquet(effnet_world):
    s3 = effnet_world["s3"]
    result = spark_submit([*effnet_world["args"], "--normalize", "--output", "s3://embed-job/out/v.jsonl"])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    normalized = reference_vectors(effnet_world, normalize=True)
    rows = [json.loads(x) for x in s3.get_object(Bucket="embed-job", Key="out/v.jsonl")["Body"].read().splitlines()]
    assert [r["key"] for r in rows] == sorted(effnet_world["photos"])
    for row in rows:
        np.testing.assert_allclose(row["embedding"], normalized[row["key"]], atol=1e-4)
    summary = json.loads(s3.get_object(Bucket="embed-job", Key="out/v.jsonl.summary.json")["Body"].read())
    assert summary["fingerprint"]["task"] == "embed" and summary["fingerprint"]["output_layer"]

    result = spark_submit([*effnet_world["args"], "--embedding-dtype", "float16",
                           "--output", "s3://embed-job/out/v.parquet"])
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    table = pq.read_table(io.BytesIO(s3.get_object(Bucket="embed-job", Key="out/v.parquet")["Body"].read()))
    plain = reference_vectors(effnet_world, normalize=False)
    dimension = len(next(iter(plain.values())))
    assert table.schema.field("embedding").type == pa.list_(pa.float16())
    assert dimension == 1280 and set(pc.list_value_length(table["embedding"]).to_pylist()) == {dimension}
    fingerprint = json.loads(table.schema.metadata[b"mxinfer.fingerprint"])
    assert fingerprint["task"] == "embed" and fingerprint["embedding_dtype"] == "float16"
    assert fingerprint["model_params"] and fingerprint["preprocess"]["mean"] == [127.0, 127.0, 127.0]
    for key, vector in zip(table.column("key").to_pylist(), table.column("embedding").to_pylist()):
        want = plain[key]
        np.testing.assert_allclose(np.asarray(vector, np.float32), want.astype(np.float16).astype(np.float32),
                                   rtol=2e-3, atol=2e-3 * np.abs(want).max())
