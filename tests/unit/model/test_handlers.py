"""--handler: user input and output handlers, checked on the driver, shipped to executors.

The use case is a detector: a small MXNet graph ending in MultiBoxDetection
(rows of class, score, box) whose output handler writes boxes instead of top-k.
Here, without Spark: the handlers, ``score_partition`` against moto, the
CLI's checks and a dry run. ``tests/integration/test_handlers.py`` proves it
end to end through spark-submit on local-cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import infer_main
import mxinfer
from demo import make_demo
from mxjob.model.handlers import get_handlers
from mxjob.options import config
from mxjob.run import checks
from tests.support import detector_handler
from tests.support.detector_handler import BOXES_HANDLER, SHAPE, assert_same_boxes, expected_boxes, images
from tests.support.helpers import ROOT, make_s3_client, part_lines, scored_lines

# The fixtures shared with tests/integration/test_handlers.py, bound here for pytest to find.
detector = detector_handler.detector
boxes_handler = detector_handler.boxes_handler
world = detector_handler.world


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------
# Loading and calling handlers


@pytest.mark.parametrize("name, text, match", [
    ("missing.py", None, "does not exist"),
    ("handler.txt", "def input_handler(key, data): pass\n", r"not a Python file \(\.py\)"),
    ("broken.py", "import no_such_module_here\n", "fails to import: ModuleNotFoundError: No module named"),
    ("syntax.py", "def input_handler(key, data:\n", "fails to import: SyntaxError"),
    ("empty.py", "def helper(x):\n    return x\n", "defines neither input_handler"),
    ("wrong.py", "output_handler = 3\n", "output_handler is a int, not a function"),
])
def test_load_handlers_refuses_what_cannot_serve(tmp_path, name, text, match):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(mxinfer.HandlerError, match=match):
        mxinfer.load_handlers(str(path))


def test_a_handler_named_like_our_modules_is_shipped_under_a_name_of_its_own(tmp_path):
    # Spark's addFile puts the handler beside the --py-files: as utils.py it would clash with ours.
    write(tmp_path / "utils.py", "def output_handler(key, outputs):\n    return {}\n")
    cfg = config.resolve(config.merge_settings({
        "input": "s3://b/in/", "model": "s3://b/m", "output": "s3://b/o.jsonl", "handler": str(tmp_path / "utils.py")},
        {}))
    prepared = checks.prepare_handler(cfg, client=None)
    shipped = os.path.basename(prepared.handler_file)
    assert shipped == "mxinfer_handler_utils.py" and prepared.job_spec().handler == prepared.handler_file
    assert shipped[:-3] not in {"utils", "mxinfer", "mxjob", "infer_main"}
    assert get_handlers(prepared.handler_file).output_handler is not None


def test_input_handler_output_is_converted_to_float32_and_its_shape_checked(tmp_path):
    handlers = mxinfer.load_handlers(write(tmp_path / "h.py", (
        "import numpy as np\n"
        "def input_handler(key, data):\n"
        "    if key == 'small':\n"
        "        return np.zeros((3, 8, 8))\n"
        "    if key == 'text':\n"
        "        return np.array([['a']])\n"
        "    return np.ones((3, 32, 32), dtype=np.float64) * len(data)\n")))
    array = handlers.decode("k", b"four", SHAPE)
    assert array.dtype == np.float32 and array.shape == SHAPE and array[0, 0, 0] == 4.0
    with pytest.raises(ValueError, match=r"returned shape \(3, 8, 8\); the model takes \(3, 32, 32\)"):
        handlers.decode("small", b"", SHAPE)
    with pytest.raises(TypeError, match="expected float32 numbers"):
        handlers.decode("text", b"", SHAPE)


def test_an_output_handlers_line_keeps_the_real_key_and_writes_numpy_values(tmp_path):
    handlers = mxinfer.load_handlers(write(tmp_path / "h.py", (
        "import numpy as np\n"
        "def output_handler(key, outputs):\n"
        "    if key == 'nan':\n"
        "        return {'x': float('nan')}\n"
        "    if key == 'list':\n"
        "        return [1]\n"
        "    return {'key': 'other', 'first': outputs[0][:2], 'tenth': np.float32(0.1), 'n': np.int64(3)}\n")))
    model = SimpleNamespace(predict=lambda batch: [np.array([[1.5, 2.0, 3.0]] * len(batch), np.float32)])
    lines = scored_lines(model, ["a/b.png", "nan", "list"], [np.zeros(SHAPE, np.float32)] * 3, handlers)
    # float32 written with its own 7 digits: 0.1, not 0.10000000149011612
    assert json.loads(lines[0]) == {"key": "a/b.png", "first": [1.5, 2.0], "tenth": 0.1, "n": 3}
    assert lines[0].startswith('{"key": "a/b.png"')
    errors = [json.loads(line)["error"] for line in lines[1:]]
    assert errors[0]["type"] == "ValueError" and "Out of range float" in errors[0]["message"]  # NaN: not JSON
    assert errors[1] == {"stage": "predict", "type": "TypeError",
                         "message": "output_handler returned list; expected a dict"}


# ----------------------------------------------------------------------------
# score_partition with handlers, without Spark


@pytest.fixture(scope="module")
def bucket(moto_endpoint):
    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="handler-unit")
    objects = images()
    for key, body in objects.items():
        s3.put_object(Bucket="handler-unit", Key=key, Body=body)
    items = sorted((key, len(body)) for key, body in objects.items())
    return {"endpoint": moto_endpoint, "objects": objects, "items": items}


def score(bucket, prefix, handler, shape=SHAPE, **preprocess) -> dict[str, dict]:
    job = mxinfer.JobSpec(model=mxinfer.ModelSpec.from_prefix(str(prefix)),
                          preprocess=mxinfer.Preprocess(shape, **preprocess), bucket="handler-unit",
                          batch_size=4, top_k=3, endpoint_url=bucket["endpoint"], io_threads=2,
                          handler=handler)
    [(_, count, blob, _stats)] = mxinfer.score_partition(0, bucket["items"], job)
    rows = [json.loads(line) for line in part_lines(blob)]
    assert count == len(rows) == len(bucket["items"])
    return {row["key"]: row for row in rows}


def test_both_handlers_in_score_partition_write_boxes_and_per_key_errors(bucket, detector, boxes_handler):
    rows = score(bucket, detector, str(boxes_handler))
    good = [f"imgs/{i}.png" for i in range(6)]
    want = expected_boxes(detector, boxes_handler, bucket["objects"], good)
    for key in good:
        assert set(rows[key]) == {"key", "boxes", "worker"} and rows[key]["key"] == key
        assert_same_boxes(rows[key], want[key])
    assert rows["imgs/garbage.png"]["error"]["stage"] == "decode"
    assert rows["imgs/garbage.png"]["error"]["type"] == "UnidentifiedImageError"
    assert rows["imgs/reject.png"]["error"] == {"stage": "decode", "type": "ValueError",
                                               "message": "rejected by input_handler"}
    assert rows["imgs/explode.png"]["error"] == {"stage": "predict", "type": "RuntimeError",
                                                "message": "output_handler refuses imgs/explode.png"}


def test_input_handler_alone_keeps_top_k_and_matches_our_decoder(bucket, logits_prefix, tmp_path):
    # Pillow to RGB, resize, /255: the demo model's own preprocessing, written by hand.
    handler = write(tmp_path / "decode_only.py", BOXES_HANDLER.split("def output_handler")[0])
    with_handler = score(bucket, logits_prefix, handler)
    without = score(bucket, logits_prefix, None, mean=(0.0,), std=(255.0,))
    for i in range(6):
        key = f"imgs/{i}.png"
        got, want = with_handler[key]["predictions"], without[key]["predictions"]
        assert [p["class_id"] for p in got] == [p["class_id"] for p in want]
        np.testing.assert_allclose([p["probability"] for p in got], [p["probability"] for p in want], atol=1e-5)
    assert with_handler["imgs/reject.png"]["error"]["message"] == "rejected by input_handler"
    assert "predictions" in with_handler["imgs/explode.png"]  # no output handler here


def test_output_handler_alone_gets_our_decoding_and_raw_outputs(bucket, logits_prefix, tmp_path):
    handler = write(tmp_path / "argmax.py", (
        "def output_handler(key, outputs):\n"
        "    (logits,) = outputs\n"
        "    return {'argmax': int(logits.argmax()), 'logits': logits}\n"))
    rows = score(bucket, logits_prefix, handler, mean=(0.0,), std=(255.0,))
    clf = mxinfer.ImageClassifier(str(logits_prefix), SHAPE, batch_size=4, preprocess=make_demo.PREPROCESS)
    for i in range(6):
        key = f"imgs/{i}.png"
        logits = clf.predict(clf.to_array([bucket["objects"][key]]))[0][0]
        assert rows[key]["argmax"] == int(logits.argmax())
        np.testing.assert_allclose(rows[key]["logits"], logits, atol=1e-5)
    assert rows["imgs/reject.png"]["argmax"] >= 0  # no input handler to reject it
    assert rows["imgs/garbage.png"]["error"]["stage"] == "decode"  # our decoder's error


# ----------------------------------------------------------------------------
# The driver's checks


def run_cli(runner, endpoint: str, *args):
    # The output's bucket exists: the job checks the output first (a failure after it is reported in the
    # output's status), then the handler, and only then lists the input, whose bucket does not exist.
    client = make_s3_client(endpoint)
    if "handler-checks" not in [b["Name"] for b in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket="handler-checks")
    return runner.invoke(infer_main.main, ["--input", "s3://no-such-bucket-h/imgs/", "--model", "s3://m/x",
                                           "--output", "s3://handler-checks/o.jsonl", "--endpoint-url", endpoint,
                                           *args])


@pytest.mark.parametrize("text, code, message", [
    (None, 2, "no such file"),
    ("import no_such_module_here\n", 1, "--handler: {path} fails to import: ModuleNotFoundError"),
    ("x = 1\n", 1, "--handler: {path} defines neither input_handler(key, data) nor output_handler"),
])
def test_a_bad_handler_stops_the_run_before_any_listing(tmp_path, moto_endpoint, text, code, message, runner):
    path = tmp_path / "h.py"
    if text is not None:
        path.write_text(text)
    result = run_cli(runner, moto_endpoint, "--handler", str(path))
    assert result.exit_code == code, result.output
    assert message.format(path=path) in result.output
    assert "cannot list" not in result.output  # it failed first


def test_handler_must_be_a_python_file(runner, moto_endpoint):
    result = run_cli(runner, moto_endpoint, "--handler", "s3://b/handler.zip")
    assert result.exit_code == 2 and "'--handler': must be a Python file ending in .py" in result.output


def test_missing_s3_handler_is_named(moto_endpoint, runner):
    result = run_cli(runner, moto_endpoint, "--handler", "s3://no-such-bucket-h/h.py")
    assert result.exit_code == 1 and "cannot read --handler s3://no-such-bucket-h/h.py" in result.output


# ----------------------------------------------------------------------------
# A dry run with the handler given as s3://, and two forward lanes in a fresh worker


def test_dry_run_with_a_handler_scores_a_sample_with_it(world, runner):
    result = runner.invoke(infer_main.main, [*world["args"], "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["sample"]["key"] == "imgs/0.png" and "boxes" in plan["sample"]
    assert plan["model"]["head_op"] == "_contrib_MultiBoxDetection" and plan["model"]["num_classes"] is None


LANES_SCRIPT = """
import json, sys
import mxinfer
from tests.support.helpers import part_lines
endpoint, prefix, items = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
job = mxinfer.JobSpec(model=mxinfer.ModelSpec.from_prefix(prefix), preprocess=mxinfer.Preprocess({shape}),
                      bucket="handler-unit", batch_size=8, micro_batch_size=2, top_k=3, endpoint_url=endpoint,
                      io_threads=2, threads=2, forward_lanes=2)
[(_, count, blob, stats)] = mxinfer.score_partition(0, [tuple(i) for i in items], job)
print(json.dumps({{"rows": [json.loads(line) for line in part_lines(blob)], "threads": stats.threads,
                  "lanes": stats.lanes}}))
"""


def test_two_forward_lanes_in_a_fresh_worker_score_as_one_does(bucket, logits_prefix):
    # A fresh process: MXNet reads its thread settings when it loads, and this one has loaded it already.
    want = score(bucket, logits_prefix, None)
    done = subprocess.run([sys.executable, "-c", LANES_SCRIPT.format(shape=tuple(SHAPE)), bucket["endpoint"],
                           str(logits_prefix), json.dumps(bucket["items"])],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert (got["threads"], got["lanes"]) == (2, 2)
    rows = {row["key"]: row for row in got["rows"]}
    assert sorted(rows) == sorted(want)
    for key, row in want.items():
        if "predictions" in row:
            assert [p["class_id"] for p in rows[key]["predictions"]] == [p["class_id"] for p in row["predictions"]]
            np.testing.assert_allclose([p["probability"] for p in rows[key]["predictions"]],
                                       [p["probability"] for p in row["predictions"]], atol=1e-5)
        else:
            assert rows[key]["error"] == row["error"]
