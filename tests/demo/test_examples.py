"""``make examples`` (demo/examples.py): the files docs/library.md's examples read, and the page run as printed.

Each of the page's Python blocks runs in a fresh Python, in a folder laid out as the repository root after
``make examples`` (``run/examples/`` and the demo model in ``run/demo/model/``), and what it prints is compared
with the comments under its ``print`` calls. The demo detector's boxes are also worked out by hand from its
weights' definition, and the job takes the detector with ``--task detect``.
"""

from __future__ import annotations

import ast
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps
from skimage import data

import infer_main
import mxinfer
from demo import examples, make_demo
from tests.support.helpers import ROOT, make_s3_client
from tests.support.library_page import BLOCKS, CHECKER, LOCAL, OPTIONS, SPARK, printed


def named_files(code: str) -> list[str]:
    """The repository paths a block names: its string constants under ``run/``."""
    return [n.value for n in ast.walk(ast.parse(code))
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value.startswith("run/")]


def missing_files(blocks: list[tuple[int, str]], root: Path) -> list[str]:
    """``line: path`` of each file a block names that is not under ``root``; a checkpoint prefix counts when its
    ``-symbol.json`` is there."""
    return [f"{line}: {name}" for line, code in blocks for name in named_files(code)
            if not (root / name).exists() and not (root / f"{name}-symbol.json").is_file()]


def run_block(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh Python with ``cwd`` as its working folder and this checkout's modules importable."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", code], cwd=str(cwd), env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A folder laid out as the repository root after ``make examples``: the command's own function made it."""
    root = tmp_path_factory.mktemp("checkout")
    examples.make_examples(root / "run" / "examples", root / "run" / "demo")
    return root


# ----------------------------------------------------------------------------
# The files


def test_make_examples_writes_held_out_digits_a_sideways_photo_and_the_detector(checkout):
    out = checkout / "run" / "examples"
    (_, _), (test_x, test_y) = make_demo.digits_split()
    for name, digit, fmt in (("three.png", 3, "PNG"), ("seven.png", 7, "PNG"), ("one.gif", 1, "GIF")):
        with Image.open(out / name) as image:
            assert image.format == fmt
            pixels = np.asarray(image.convert("L"))
        first = test_x[np.flatnonzero(test_y == digit)[0]]  # the demo's first held-out digit of its kind
        np.testing.assert_array_equal(pixels, np.asarray(Image.open(io.BytesIO(make_demo.digit_png(first)))))
    with Image.open(out / "astronaut.jpg") as photo:
        assert photo.getexif()[0x0112] == examples.SIDEWAYS
        upright = np.asarray(ImageOps.exif_transpose(photo), np.float32)
        stored = np.asarray(photo, np.float32)
    astronaut = data.astronaut().astype(np.float32)
    assert np.abs(upright - astronaut).mean() < 4  # the photo, through JPEG
    assert np.abs(stored - astronaut).mean() > 40  # stored turned, so only the tag makes it upright
    assert (out / "ssd" / "synset.txt").read_text() == "dark\nbright\n"
    assert (checkout / "run" / "demo" / "model" / "digits-symbol.json").is_file()


def test_make_examples_is_listed_by_make_help_and_writes_where_the_page_reads():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    target = re.search(r"^examples: .*?## (.+)\n\t(.+)$", makefile, re.M)
    assert target and "run/examples/" in target[1]
    assert target[2] == "$(PY) -m demo.examples run/examples run/demo"  # the layout the fixture above makes


def test_every_file_the_page_names_is_one_make_examples_writes(checkout):
    assert sum(len(named_files(code)) for _, code in BLOCKS) >= 10
    assert missing_files(BLOCKS, checkout) == []


def test_a_block_naming_a_file_make_examples_does_not_write_is_found(checkout):
    block = 'import mxinfer\nmxinfer.ObjectDetector("run/examples/ssd/shades")\nopen("run/examples/street.jpg")\n'
    assert missing_files([(7, block)], checkout) == ["7: run/examples/street.jpg"]


def test_printed_reads_the_comments_under_each_statement_that_prints():
    code = ('x = 1  # not output\n# nor this\nprint(x)\n# 1\nfor i in range(2):\n    print(i)\n# 0\n# 1\n'
            'y = 2\n# a comment on what follows\nprint(y)\n\n# said after a blank line: no output\n')
    assert printed(code) == "1\n0\n1\n"


# ----------------------------------------------------------------------------
# The page, run as printed


@pytest.mark.parametrize("code", [code for _, code in LOCAL], ids=[f"line{line}" for line, _ in LOCAL])
def test_the_library_pages_block_runs_and_prints_what_it_says(checkout, code):
    result = run_block(code, checkout)
    assert result.returncode == 0, result.stderr[-3000:]
    want = printed(code)
    assert CHECKER.check_output(want, result.stdout, OPTIONS), f"prints:\n{result.stdout}\nthe page says:\n{want}"


def test_a_block_that_shows_no_output_only_defines_things():
    # The handler file defines functions; every other block shows what it prints, so the tests above check it.
    assert LOCAL and SPARK
    for line, code in BLOCKS:
        definitions = (ast.Import, ast.ImportFrom, ast.FunctionDef)
        assert printed(code) or all(isinstance(s, definitions) for s in ast.parse(code).body), f"line {line}"


@pytest.mark.spark
def test_the_library_pages_dataframe_block_runs_and_prints_what_it_says(checkout):
    [(_, code)] = SPARK
    result = run_block(code, checkout)
    assert result.returncode == 0, result.stderr[-3000:]
    assert CHECKER.check_output(printed(code), result.stdout, OPTIONS), result.stdout


# ----------------------------------------------------------------------------
# The demo detector


def shades_by_hand(array: np.ndarray, min_score: float) -> list[tuple[str, float, list[float]]]:
    """``(label, score, box in 0..1)`` best first, from shades_detector's definition: each window's mean
    brightness, the three scores' softmax, then per class the windows overlapping a better one dropped."""
    means = examples.window_brightness(array)
    logits = examples.SHARPNESS * np.stack([np.full_like(means, examples.BRIGHT), 1 - means, means])
    scores = np.exp(logits - logits.max(axis=0)) / np.exp(logits - logits.max(axis=0)).sum(axis=0)
    side, step, size = examples.SHADES_SHAPE[1], examples.STRIDE, examples.WINDOW
    found = []
    for class_id, label in enumerate(examples.SHADES_LABELS):
        windows = sorted(((scores[class_id + 1, i, j], [j * step / side, i * step / side, (j * step + size) / side,
                                                        (i * step + size) / side])
                          for i in range(means.shape[0]) for j in range(means.shape[1])), key=lambda w: -w[0])
        kept = []
        for score, box in windows:
            if all(iou(box, other) <= examples.SHADES_NMS for _, other in kept):
                kept.append((score, box))
        found += [(label, float(score), box) for score, box in kept if score >= min_score]
    return sorted(found, key=lambda f: -f[1])


def iou(a: list[float], b: list[float]) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def test_the_demo_detector_finds_the_windows_its_definition_says_on_the_upright_photo(checkout):
    photo = checkout / "run" / "examples" / "astronaut.jpg"
    det = mxinfer.ObjectDetector(str(checkout / "run" / "examples" / "ssd" / "shades"), examples.SHADES_SHAPE, 4)
    [image] = det.detect_images([str(photo)], min_score=0.5, max_detections=20)
    want = shades_by_hand(mxinfer.decode_image(photo.read_bytes(), det.preprocess), min_score=0.5)
    assert image["image_size"] == [512, 512]
    assert [d["label"] for d in image["detections"]] == [label for label, _, _ in want]
    assert {d["label"] for d in image["detections"]} == {"dark", "bright"}
    np.testing.assert_allclose([d["score"] for d in image["detections"]], [s for _, s, _ in want], atol=1e-4)
    # The default resize stretches the 512x512 photo to 128x128: a box is its window times 4, on the upright photo.
    np.testing.assert_allclose([d["box"] for d in image["detections"]], [np.array(b) * 512 for _, _, b in want])
    upright = np.asarray(ImageOps.exif_transpose(Image.open(photo)), np.float32).mean(axis=2) / 255
    for d in image["detections"]:
        xmin, ymin, xmax, ymax = (int(v) for v in d["box"])
        mean = upright[ymin:ymax, xmin:xmax].mean()
        assert mean < examples.DARK + 0.05 if d["label"] == "dark" else mean > examples.BRIGHT - 0.05, (d, mean)


def test_the_job_takes_the_demo_detector_with_task_detect(checkout, moto_endpoint, runner):
    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="shades")
    photo = checkout / "run" / "examples" / "astronaut.jpg"
    s3.put_object(Bucket="shades", Key="photos/astronaut.jpg", Body=photo.read_bytes())
    prefix = checkout / "run" / "examples" / "ssd" / "shades"
    result = runner.invoke(infer_main.main, [
        "--input", "s3://shades/photos/", "--output", "s3://shades/boxes.jsonl", "--endpoint-url", moto_endpoint,
        "--model", str(prefix), "--input-shape", "3,128,128", "--task", "detect", "--min-score", "0.5",
        "--dry-run"])
    assert result.exit_code == 0, result.output
    sample = json.loads(result.stdout)["sample"]
    [want] = mxinfer.ObjectDetector(str(prefix), examples.SHADES_SHAPE, 4).detect_images([str(photo)], min_score=0.5)
    assert sample["image_size"] == want["image_size"]
    assert [(d["label"], d["box"]) for d in sample["detections"]] == \
        [(d["label"], d["box"]) for d in want["detections"]]
