"""``python -m bench.worker_steps`` measures: every step is in its table, with sane figures.

A benchmark, not a test of speed: this checks that the probe runs and prints
each step, not how fast the steps are.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bench import models as bench_models
from bench import worker_steps
from mxjob.core import state


def test_the_probe_prints_every_step_and_the_large_photos(capsys):
    assert worker_steps.main(["--images", "4", "--large", "1", "--repeats", "1", "--no-s3"]) == 0
    out = capsys.readouterr().out
    for step in ("open (header)", "JPEG decode (load)", "EXIF transpose", "RGB conversion", "resize (BILINEAR)",
                 "bands + float32 + normalise into a batch row", "batch assembly (np.stack of 16)",
                 "decode_into a preallocated batch", "Python glue", "total: decode + preprocess",
                 "JPEG decoder at 1/8 (floor)"):
        assert step in out
    assert "AVX-512 VNNI: " in out


def test_the_figures_are_positive_cpu_milliseconds():
    result = worker_steps.measure(images=2, large=0, repeats=1, s3=False)
    figures = [*result["steps"].values(), *result["end_to_end"].values(), result["glue"]]
    assert all(math.isfinite(ms) and ms >= 0 for ms in figures)
    assert result["steps"]["JPEG decode (load)"] > 0 and result["steps"]["resize (BILINEAR)"] > 0


def test_the_get_is_measured_for_both_readers():
    result = worker_steps.get_ms(worker_steps.photos(2), repeats=1)
    assert set(result) == {"lean", "botocore"} and all(ms > 0 for ms in result.values())


def test_the_whole_task_is_measured_per_output_format_and_its_steps_add_up():
    result = worker_steps.measure(images=2, large=0, repeats=1, steps=False, task_batch=4)
    tasks = result["task"]
    assert set(tasks) == {"JSON Lines output", "Parquet output"}
    for figures in tasks.values():
        steps = [ms for step, ms in figures.items() if step != "task (score_partition)"]
        assert all(math.isfinite(ms) and ms >= 0 for ms in steps)
        assert figures["decode + preprocess"] > 0 and figures["GET (lean reader, client)"] > 0
        # "the rest" is what the steps leave of the whole: never more than the whole.
        assert sum(steps) >= figures["task (score_partition)"] - 1e-9
    text = worker_steps.table(result)
    assert "| step | JSON Lines output | Parquet output |" in text and "| JSON lines |" in text


def test_the_free_forward_classifier_scores_like_a_classifier_of_its_classes():
    model = worker_steps.FreeForward((3, 8, 8), batch_size=4, classes=10)
    rows = model.classify(np.zeros((6, 3, 8, 8), np.float32), top_k=3)
    assert len(rows) == 6 and all(len(row) == 3 for row in rows)
    assert all(label == f"class {c}, a label of about this length" for row in rows for c, label, _ in row)


def test_the_real_models_rows_measure_fp32_and_int8_and_the_rest_of_the_task(monkeypatch, tmp_path):
    monkeypatch.setattr(state, "counters", state.Counters())  # the threads this probe sets stay its own
    datas = worker_steps.photos(16)
    with worker_steps._served(datas) as (endpoint, keys):
        result = worker_steps.precision_ms(endpoint, keys, datas, repeats=1, model=bench_models.RESNET20,
                                           folder=tmp_path)
    assert set(result) == {"rest", "fp32", "int8"} and result["rest"] > 0
    assert list(tmp_path.glob("*-int8-symbol.json"))  # the int8 rows ran a quantized copy, not the fp32 one
    for precision in ("fp32", "int8"):
        figures = result[precision]
        assert figures["forward pass alone"] > 0 and figures["whole task"] > 0
        assert figures["S3 stand-in's server"] >= 0
    lines = worker_steps.precision_table({"precision": result, "precision_model": "ResNet-20", "task_batch": 16})
    assert "| step | fp32 | int8 | fp32 / int8 |" in lines
    image = [line for line in lines if line.startswith("| **the worker's image")]
    fp32_image = result["fp32"]["forward pass alone"] + result["rest"]
    assert len(image) == 1 and f"| {fp32_image:.2f} |" in image[0]
    assert any("int8's speed-up: the forward pass alone" in line for line in lines)


def test_a_task_batch_shorter_than_a_micro_batch_is_refused_with_the_real_model(capsys):
    with pytest.raises(SystemExit) as exited:
        worker_steps.main(["--task-batch", "4"])
    assert exited.value.code == 2
    assert "give --task-batch 16 or more, or --model none" in capsys.readouterr().err


def test_the_gain_kept_is_the_images_speed_up_over_the_models():
    kept = worker_steps.kept_gain(2.0, {"forward pass alone": 8.0, "S3 stand-in's server": 1.0},
                                  {"forward pass alone": 2.0, "S3 stand-in's server": 1.0})
    assert (kept["model"], kept["image"], kept["kept"]) == (4.0, 2.5, 0.5)
    assert round(kept["image with the stand-in"], 3) == 2.2  # 11 / 5
