"""--task embed and --task detect without Spark: the result model's views, box mapping and refusals.

Boxes are mapped back onto the upright image for every EXIF orientation and
resize; the driver's refusals name the nearest layer or the output's shape.
``tests/integration/test_tasks.py`` runs both tasks through spark-submit
(``detect`` on a small SSD-style graph, ``embed`` on the real pretrained
EfficientNet-Lite0), comparing every box and vector with the model's own
output.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image, ImageOps

import infer_main
import mxinfer
from mxjob import tasks
from mxjob.core import errors
from mxjob.model.preprocess import Geometry, Preprocess, decode_image_geometry, map_boxes
from mxjob.options import config
from mxjob.results import part_format, results
from mxjob.tasks import classify, custom, detect, embed
from tests.support.helpers import (
    encode,
    lines_of,
    make_s3_client,
    parquet_of,
    part_of,
)

BASE = {"input": "s3://in/p/", "model": "s3://m/r", "output": "s3://o/k.jsonl"}


# ----------------------------------------------------------------------------
# The result model's views


def test_each_kind_has_its_schema_and_json_lines_view():
    vectors = embed.TASK.results(embed.TASK.schema(dimension=3, dtype="float16"))
    vectors.add("b", np.array([0.5, 1.0, -2.0], np.float32))
    vectors.fail("a", {"stage": "decode", "type": "ValueError", "message": "bad"})
    batch = part_format.read_part(part_of(vectors.record_batch()))
    assert batch.schema.field("embedding").type == pa.list_(pa.float16(), 3)
    assert lines_of(batch) == [
        '{"key": "a", "error": {"stage": "decode", "type": "ValueError", "message": "bad"}}',
        '{"key": "b", "embedding": [0.5, 1, -2]}']
    boxes = detect.TASK.results()
    boxes.add("k", ([40, 30], detect.detection_entries([(1, None, 0.75, [1.5, 2.0, 30.25, 29.0])])))
    [line] = lines_of(boxes.record_batch())
    assert line == ('{"key": "k", "image_size": [40, 30], "detections": [{"class_id": 1, "score": 0.75, '
                    '"box": [1.5, 2, 30.25, 29]}]}')
    parquet = parquet_of(detect.TASK.schema(), {"mxinfer.task": "detect"})
    # Fixed-size lists go to Parquet as plain lists: pyarrow 20 cannot read a null fixed-size list back.
    box_as_list = pa.struct([f.with_type(pa.list_(pa.float32())) if f.name == "box" else f for f in detect.DETECTION])
    assert parquet.field("detections").type == pa.list_(box_as_list)
    assert parquet.field("image_size").type == pa.list_(pa.int32())
    assert parquet.metadata == {b"mxinfer.task": b"detect"}


def test_a_custom_rows_error_member_fills_the_error_column_only_when_it_is_the_jobs_shape():
    error = {"stage": "predict", "type": "X", "message": "m"}
    assert custom.custom_value('{"error": {}}', {"error": error}) == (None, error)
    assert custom.custom_value('{"a": 1}', {"error": error, "a": 1}) == ('{"a": 1}', error)
    assert custom.custom_value('{"error": "no"}', {"error": "no"}) == ('{"error": "no"}', None)


# ----------------------------------------------------------------------------
# Boxes back onto the image


def test_map_boxes_stretch_and_crop_windows_and_clips_to_the_image():
    whole = Geometry(200, 100, (0.0, 0.0, 200.0, 100.0))
    np.testing.assert_allclose(map_boxes(np.array([[0.1, 0.2, 0.5, 1.2]]), whole), [[20, 20, 100, 100]])
    crop = Geometry(200, 100, (50.0, 0.0, 150.0, 100.0))
    np.testing.assert_allclose(map_boxes(np.array([[0.0, 0.5, 1.0, 1.0], [-0.9, 0, 2, 1]]), crop),
                               [[50, 50, 150, 100], [0, 0, 200, 100]])


def oriented_jpeg(orientation: int, size=(120, 80)) -> bytes:
    """A JPEG whose stored pixels have a white block in their top-left quarter, with an EXIF orientation."""
    pixels = np.zeros((size[1], size[0], 3), np.uint8)
    pixels[: size[1] // 2, : size[0] // 2] = 255
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encode(Image.fromarray(pixels), "JPEG", quality=95, exif=exif.tobytes())


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("resize", ["stretch", "short-side-crop"])
def test_the_geometry_follows_every_exif_orientation(orientation, resize):
    data = oriented_jpeg(orientation)
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    prep = Preprocess((3, 32, 32), resize=resize)
    array, geometry = decode_image_geometry(data, prep)
    np.testing.assert_array_equal(array, mxinfer.decode_image(data, prep))  # the same pixels as the job's
    assert (geometry.width, geometry.height) == upright.size
    # The white block, found in the model's input, maps back onto the block in the upright image.
    white = np.argwhere(array.mean(axis=0) > 200)
    (top, left), (bottom, right) = white.min(axis=0), white.max(axis=0) + 1
    box = map_boxes(np.array([[left / 32, top / 32, right / 32, bottom / 32]]), geometry)[0]
    block = np.argwhere(np.asarray(upright.convert("L")) > 128)
    (want_top, want_left), (want_bottom, want_right) = block.min(axis=0), block.max(axis=0) + 1
    width, height = upright.size
    window = (0, 0, width, height)
    if resize == "short-side-crop":  # the centre crop, by hand: the short side to 37, then 32x32 in the middle
        scale = round(32 * 256 / 224) / min(width, height)
        new_w, new_h = round(width * scale), round(height * scale)
        left, top = (new_w - 32) // 2, (new_h - 32) // 2
        window = (left * width / new_w, top * height / new_h, (left + 32) * width / new_w, (top + 32) * height / new_h)
    want = [max(want_left, window[0]), max(want_top, window[1]), min(want_right, window[2]),
            min(want_bottom, window[3])]
    np.testing.assert_allclose(box, want, atol=5)


def test_draft_decoding_keeps_the_geometry_of_exact_decoding():
    big = oriented_jpeg(6, size=(1200, 800))
    _, draft = decode_image_geometry(big, Preprocess((3, 64, 64), resize="short-side-crop"))
    _, exact = decode_image_geometry(big, Preprocess((3, 64, 64), resize="short-side-crop", decode="exact"))
    assert (draft.width, draft.height) == (exact.width, exact.height) == (800, 1200)
    np.testing.assert_allclose(draft.window, exact.window, atol=8)  # within one pixel at 1/8 scale


# ----------------------------------------------------------------------------
# The models


def run_cli(runner, *args):
    return runner.invoke(infer_main.main, ["--input", "s3://no-such-bucket-t/i/", "--output",
                                           "s3://no-such-bucket-t/o.jsonl", *args])


def test_top_k_with_embed_is_refused_and_so_is_another_tasks_option():
    with pytest.raises(infer_main.click.UsageError, match="--top-k applies to --task classify only"):
        config.resolve(config.merge_settings({**BASE, "task": "embed", "top_k": 3}, {}))
    # From the file, with the file's own task (with the command line's, it is left out:
    # tests/unit/options/test_config.py).
    with pytest.raises(infer_main.click.UsageError, match="min_score in --config applies to --task detect"):
        config.resolve(config.merge_settings(BASE, {"task": "embed", "min_score": 0.5}))
    assert config.resolve(config.merge_settings({**BASE, "task": "embed"}, {})).task == "embed"


@pytest.mark.parametrize("dtype, output, warned", [("float16", "o.parquet", True), ("float32", "o.parquet", False),
                                                    ("float16", "o.jsonl", False)])
def test_float16_embeddings_in_parquet_warn_that_spark_and_athena_cannot_read_them(dtype, output, warned):
    cfg = config.resolve(config.merge_settings(
        {**BASE, "task": "embed", "embedding_dtype": dtype, "output": f"s3://b/{output}"}, {}))
    messages = tasks.get(cfg.task).warnings(cfg, cfg.output_format == "parquet")
    assert bool(messages) == warned
    assert not warned or "Spark 3.5 and Athena cannot read Parquet's FLOAT16" in messages[0]


def test_an_unknown_output_layer_names_the_nearest_layers(logits_prefix):
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix), output_layer="dense0_fwdd")
    with pytest.raises(mxinfer.ModelError, match=r"no layer named 'dense0_fwdd'; the nearest are dense0_fwd"):
        mxinfer.Embedder(spec, (3, 32, 32), 2)


def test_detect_on_a_classifier_names_its_output_shape(logits_prefix):
    with pytest.raises(mxinfer.ModelError, match=r"detection layout \(batch, anchors, 6\); its output "
                                                 r"\S+ has shape \(2, 10\); one value per class, as a classifier's is: "
                                                 r"--task classify$"):
        mxinfer.ObjectDetector(str(logits_prefix), (3, 32, 32), 2)


def test_the_driver_refuses_an_unknown_layer_before_any_spark_work(logits_prefix, demo_dir, moto_endpoint, runner):
    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="task-refusals")
    s3.put_object(Bucket="task-refusals", Key="i/a.png", Body=(demo_dir / "images").rglob("*.png").__next__()
                  .read_bytes())
    args = ["--input", "s3://task-refusals/i/", "--output", "s3://task-refusals/o.jsonl", "--endpoint-url",
            moto_endpoint, "--model", str(logits_prefix), "--input-shape", "3,32,32"]
    result = runner.invoke(infer_main.main, [*args, "--task", "embed", "--output-layer", "flaten"])
    assert result.exit_code == errors.EXIT_FAILED and "no layer named 'flaten'; the nearest are" in result.output
    result = runner.invoke(infer_main.main, [*args, "--task", "detect"])
    assert result.exit_code == errors.EXIT_FAILED and "has shape (16, 10)" in result.output
    # Nothing scored: no output, no work prefix; only the status and report that say why the run failed.
    listed = [obj["Key"] for obj in s3.list_objects_v2(Bucket="task-refusals", Prefix="o.jsonl").get("Contents", [])]
    assert sorted(listed) == ["o.jsonl.report.html", "o.jsonl.status.json"]


def test_the_embedder_cuts_the_graph_at_the_input_of_the_last_dense_layer(logits_prefix):
    embedder = mxinfer.Embedder(str(logits_prefix), (3, 32, 32), 4)
    graph = json.loads(Path(f"{logits_prefix}-symbol.json").read_text())["nodes"]
    dense = [n for n in graph if n["op"] == "FullyConnected"][-1]
    assert embedder.output_layer == graph[dense["inputs"][0][0]]["name"]
    vectors = embedder.embed(np.zeros((3, 3, 32, 32), np.float32), normalize=True, dtype="float16")
    assert vectors.shape == (3, embedder.dimension) and vectors.dtype == np.float16


def test_a_parts_lines_are_the_json_view_of_its_own_columns_for_every_kind():
    made = {kind: tasks.get(kind).results() for kind in ("classify", "custom", "detect")}
    made["embed"] = embed.TASK.results(embed.TASK.schema(dimension=2))
    made["classify"].add("a", classify.prediction_entries([(3, "tabby, \"cat\"", 0.123456789)]))
    made["custom"].add("a", '{"boxes": [1.5]}')
    made["embed"].add("a", np.array([0.25, 1e-7], np.float32))
    made["detect"].add("a", ([3, 4], []))
    for kind, rows in made.items():
        rows.fail("b", {"stage": "download", "type": "OSError", "message": "gone"})
        part = part_format.read_part(part_of(rows.record_batch()))
        assert results.kind_of(part.schema) == kind
        assert part.column(results.LINE.name).to_pylist() == lines_of(part.drop_columns([results.LINE.name]))
        assert [json.loads(x)["key"] for x in lines_of(part)] == ["a", "b"]


def test_top_labels_count_each_rows_first_class_by_label_else_id():
    rows = classify.TASK.results()
    rows.add("a", classify.prediction_entries([(3, "cat", 0.9), (1, "dog", 0.1)]))
    rows.add("b", classify.prediction_entries([(3, "cat", 0.6)]))
    rows.add("c", classify.prediction_entries([(7, None, 0.5)]))
    rows.add("d", [])
    rows.fail("e", {"stage": "decode", "type": "OSError", "message": "bad"})
    assert classify.TASK.top_labels(rows.record_batch()) == {"cat": 2, "7": 1}
    assert embed.TASK.top_labels(embed.TASK.results(embed.TASK.schema(dimension=2)).record_batch()) == {}


def test_a_part_without_lines_has_the_same_schema_and_renders_the_same_lines():
    made = {kind: tasks.get(kind).results() for kind in ("classify", "custom", "detect")}
    made["embed"] = embed.TASK.results(embed.TASK.schema(dimension=2, dtype="float16"))
    made["classify"].add("a", classify.prediction_entries([(3, "tabby, \"cat\"", 0.123456789), (1, None, 0.5)]))
    made["custom"].add("a", '{"boxes": [1.5], "note": "é"}')
    made["embed"].add("a", np.array([0.25, 1e-7], np.float32))
    made["detect"].add("a", ([3, 4], detect.detection_entries([(2, "dog", 0.5, [0.5, 1.0, 2.0, 3.25])])))
    for kind, rows in made.items():
        rows.fail("b", {"stage": "download", "type": "OSError", "message": "gone\nfor good"})
        with_lines = part_format.read_part(part_of(rows.record_batch()))
        without = part_format.read_part(part_format.write_part(rows.record_batch()))
        assert without.schema == with_lines.schema, kind
        assert without.column(results.LINE.name).null_count == without.num_rows == 2, kind
        assert lines_of(without) == lines_of(with_lines), kind
        assert lines_of(without.slice(1)) == lines_of(with_lines)[1:], kind
