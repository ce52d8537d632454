"""The job end to end: spark-submit on local-cluster[2,1,1024] against the moto S3 server.

Two real runs, each a module fixture that several tests read:

* the logits-head model with the new options, default ``--max-errors``;
* the softmax-head model (``SoftmaxOutput``) with the original article's flags.

Their output is compared with a plain single-process reference that follows
the preprocessing recipe of docs/performance.md and runs its own MXNet Module.
"""

from __future__ import annotations

import io
import json

import mxnet as mx
import numpy as np
import pytest
from PIL import Image, ImageOps

from demo import make_demo
from mxjob.executor import measure
from mxjob.planning import estimate
from tests.support.helpers import bucket_with_model, encode, spark_submit

pytestmark = pytest.mark.spark

BUCKET = "job-bucket"
BATCH = 8


def image_set() -> dict[str, bytes]:
    """Real digits in every mode and format the job must read, plus three bad objects."""
    (_, _), (test_x, test_y) = make_demo.digits_split()
    objects: dict[str, bytes] = {}
    formats = [("L", "PNG", ".png"), ("RGB", "JPEG", ".jpg"), ("P", "PNG", ".PNG"), ("RGBA", "PNG", ".png"),
               ("LA", "PNG", ".png"), ("CMYK", "JPEG", ".jpeg"), ("RGB", "BMP", ".bmp"), ("RGB", "GIF", ".gif"),
               ("RGB", "TIFF", ".tif"), ("RGB", "WEBP", ".webp")]
    for i in range(40):
        mode, fmt, suffix = formats[i % len(formats)]
        img = Image.open(io.BytesIO(make_demo.digit_png(test_x[i]))).convert(mode)
        extra = {"quality": 95} if fmt in ("JPEG", "WEBP") else {}
        objects[f"imgs/{test_y[i]}/{i:03d}{suffix}"] = encode(img, fmt, **extra)
    grey16 = (np.asarray(Image.open(io.BytesIO(make_demo.digit_png(test_x[40]))), np.uint16) * 257)
    objects[f"imgs/{test_y[40]}/040-16bit.png"] = encode(Image.fromarray(grey16), "PNG")
    objects["imgs/bad/empty.jpg"] = b""
    objects["imgs/bad/not-an-image.jpg"] = b"<html>403 Forbidden</html>"
    objects["imgs/bad/truncated.png"] = objects[f"imgs/{test_y[0]}/000.png"][:60]
    objects["imgs/notes/readme.txt"] = b"not an image suffix: never listed"
    return objects


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    objects = image_set()
    for key, body in objects.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    return {"s3": s3, "objects": objects, "endpoint": moto_endpoint, "demo": demo_dir}


def read_output(s3, key: str):
    lines = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode().splitlines()
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{key}.summary.json")["Body"].read())
    return lines, summary


def logits_args(world, output_key: str, *extra: str) -> list[str]:
    """The logits run's command line, writing ``output_key``, with ``extra`` options."""
    return [
        "--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits",
        "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", world["endpoint"],
        "--input-shape", "3,32,32", "--std", "255", "--batch-size", str(BATCH), "--top-k", "3",
        "--progress-seconds", "2", *extra,
    ]


@pytest.fixture(scope="module")
def logits_run(world):
    result = spark_submit(logits_args(world, "out/logits.jsonl"))
    lines, summary = read_output(world["s3"], "out/logits.jsonl")
    return result, lines, summary


@pytest.fixture(scope="module")
def botocore_run(world):
    """:func:`logits_run`'s command line under ``--s3-reader botocore``: public boto3 APIs only."""
    result = spark_submit(logits_args(world, "out/logits-botocore.jsonl", "--s3-reader", "botocore"))
    body = world["s3"].get_object(Bucket=BUCKET, Key="out/logits-botocore.jsonl")["Body"].read()
    _, summary = read_output(world["s3"], "out/logits-botocore.jsonl")
    return result, body, summary


@pytest.fixture(scope="module")
def original_flags_run(world):
    """The article's command line, URLs changed, plus this small model's input shape and scaling."""
    model = f"s3://{BUCKET}/model/digits_softmax"
    result = spark_submit([
        "--sym_url", f"{model}-symbol.json", "--param_url", f"{model}-0000.params",
        "--label_url", f"s3://{BUCKET}/model/synset.txt", "--batch", str(BATCH),
        "--bucket", BUCKET, "--prefix", "imgs/", "--output_s3_bucket", BUCKET, "--output_s3_key", "out/orig.jsonl",
        "--endpoint-url", world["endpoint"], "--input-shape", "3,32,32", "--std", "255,255,255",
        "--max-errors", "3",
    ])
    lines, summary = read_output(world["s3"], "out/orig.jsonl")
    return result, lines, summary


def output(result) -> str:
    """What the driver printed: spark-submit sends a Python driver's stderr to stdout."""
    return result.stdout + result.stderr


def listed_keys(objects) -> list[str]:
    return sorted(k for k in objects if not k.endswith(".txt"))


class Reference:
    """docs/performance.md's recipe in one process with a plain MXNet Module: what users check our numbers against."""

    def __init__(self, prefix, softmax_head: bool):
        sym, args, aux = mx.model.load_checkpoint(str(prefix), 0)
        labels = ["softmax_label"] if softmax_head else []
        self.module = mx.mod.Module(sym, data_names=["data"], label_names=labels)
        self.module.bind(data_shapes=[("data", (1, 3, 32, 32))], for_training=False)
        self.module.set_params(args, aux)
        self.softmax_head = softmax_head

    def __call__(self, data: bytes) -> np.ndarray:
        img = Image.open(io.BytesIO(data))
        img = ImageOps.exif_transpose(img)
        img = img.convert("RGB")
        img = img.resize((32, 32), Image.BILINEAR)
        x = np.asarray(img, dtype=np.float32).transpose(2, 0, 1)
        x = (x - 0.0) / 255.0
        self.module.forward(mx.io.DataBatch([mx.nd.array(x[np.newaxis])]), is_train=False)
        out = self.module.get_outputs()[0].asnumpy()[0].astype(np.float64)
        if not self.softmax_head:
            out = np.exp(out - out.max())
            out /= out.sum()
        return out


def check_against_reference(lines, objects, reference, top_k):
    compared = 0
    for line in lines:
        row = json.loads(line)
        if "predictions" not in row or "16bit" in row["key"]:
            continue  # the recipe's plain convert("RGB") saturates 16-bit images; we scale them
        expected = reference(objects[row["key"]])
        order = np.argsort(-expected, kind="stable")[:top_k]
        assert [p["class_id"] for p in row["predictions"]] == order.tolist(), row["key"]
        for p in row["predictions"]:
            assert abs(p["probability"] - expected[p["class_id"]]) <= 1e-4, row["key"]
            assert p["label"] == make_demo.LABELS[p["class_id"]]
        compared += 1
    return compared


@pytest.mark.stacks
def test_logits_run_writes_one_line_per_listed_key_sorted_and_no_padding(logits_run, world):
    _result, lines, summary = logits_run
    keys = [json.loads(line)["key"] for line in lines]
    assert keys == listed_keys(world["objects"])  # exactly once each, sorted, nothing else
    assert summary["keys_listed"] == len(keys) == 44
    # The sample's 16 keys in two batches, then 28 in batches of 8 (the last has 4 padding slots).
    assert summary["batches"] == 6
    assert summary["predicted"] == 41 and summary["failed"] == 3


def test_logits_run_exits_3_for_errors_over_the_default_limit_yet_writes_everything(logits_run):
    result, lines, _summary = logits_run
    assert result.returncode == 3, output(result)[-3000:]
    assert "3 images failed, more than --max-errors 1% allows (0)" in output(result)
    assert len(lines) == 44


@pytest.mark.stacks
def test_logits_head_gets_softmax_and_matches_the_single_process_reference(logits_run, world):
    _, lines, _ = logits_run
    reference = Reference(world["demo"] / "model" / "digits", softmax_head=False)
    assert check_against_reference(lines, world["objects"], reference, top_k=3) == 40


@pytest.mark.stacks
def test_bad_objects_become_error_lines_with_their_stage(logits_run):
    _, lines, summary = logits_run
    rows = {json.loads(line)["key"]: json.loads(line) for line in lines}
    for key in ("imgs/bad/empty.jpg", "imgs/bad/not-an-image.jpg", "imgs/bad/truncated.png"):
        assert "predictions" not in rows[key]
        assert rows[key]["error"]["stage"] == "decode", rows[key]
        assert rows[key]["error"]["type"] and rows[key]["error"]["message"]
    assert summary["errors_by_stage"] == {"download": 0, "decode": 3, "predict": 0}


def test_sixteen_bit_image_is_predicted(logits_run):
    _, lines, _ = logits_run
    [row] = [json.loads(line) for line in lines if "16bit" in line]
    assert len(row["predictions"]) == 3


def test_the_estimate_is_the_measured_sample_projected_on_the_cluster_it_ran_on(logits_run):
    """The driver's estimate, made before Spark started, from the sample an executor measured and spark-submit's conf.

    How close it comes to the run's time is a measurement, printed by ``make bench-estimate``
    (bench/estimate_check.py), not asserted here: on 44 images a busy host moves the wall time by half.
    """
    _, _, summary = logits_run
    reported = summary["estimate"]
    assert reported["cluster"].startswith("local-cluster[2,1,1024]")  # read from spark-submit's conf
    assert reported["images"] == summary["keys_listed"] == 44 and reported["batches"] == summary["batches"] == 6
    assert reported["sample_images"] == 8 and reported["cpu_seconds_per_image"] > 0 and reported["start_seconds"] > 0
    sample = measure.SampleCost(images=8, scored=8, cpu_seconds_per_image=reported["cpu_seconds_per_image"],
                                s3_server_cpu_seconds_per_image=reported["s3_server_cpu_seconds_per_image"],
                                model_load_seconds=reported["model_load_seconds"])
    cluster = estimate.cluster_from_conf({"spark.master": "local-cluster[2,1,1024]"}, host_vcpus=reported["vcpus"])
    projected = estimate.project(sample, 44, BATCH, cluster, start_seconds=reported["start_seconds"])
    assert (reported["executors"], reported["vcpus"]) == (cluster.executors, cluster.vcpus)
    assert reported["wall_seconds"] == pytest.approx(projected.wall_seconds, abs=0.02), (reported, projected)


def test_model_is_loaded_once_per_python_worker_and_reused(logits_run):
    result, _, summary = logits_run
    # In client mode too, Spark started once the listing found keys and its executors loaded the model
    # (mxjob.run.spark_start): the run's tasks found it in their worker.
    assert "the executors' Python workers loaded the model in" in output(result), output(result)[-3000:]
    # One of them checked the model and measured the estimate's sample for the driver, which loaded none.
    assert "an executor checked the model and measured the estimate's sample on 8 images" in output(result)
    assert "mxjob.model.predictor: loaded model" not in output(result)
    workers = summary["python_workers"]
    assert sum(w["batches"] for w in workers.values()) == 6
    assert len(workers) < 6  # some worker ran several batches ...
    assert all(w["model_loads"] == 1 for w in workers.values())  # ... and loaded the model once


@pytest.mark.stacks
def test_summary_reports_counts_timing_model_and_options(logits_run):
    result, _, summary = logits_run
    assert summary["elapsed_seconds"] > 0 and summary["images_per_second"] > 0
    assert summary["model"]["head"] == "logits" and summary["model"]["num_classes"] == 10
    assert summary["model"]["labels"] == f"s3://{BUCKET}/model/synset.txt" and summary["model"]["labels_count"] == 10
    assert summary["options"]["batch_size"] == BATCH and summary["options"]["top_k"] == 3
    assert set(summary["seconds"]) >= {"download", "decode", "forward", "wait", "write", "spark", "assembly"}
    assert '"keys_listed": 44' in output(result)  # also logged by the driver
    # Nothing lost or retried in an undisturbed run, and each batch's stats counted once (44 keys, 6 batches of 8).
    assert (summary["lost_task_attempts"], summary["retried_batches"]) == (0, 0)
    assert (summary["scored"], summary["reused"], summary["runs"], summary["batches"]) == (44, 0, 1, 6)
    assert sum(executor["batches"] for executor in summary["executors"].values()) == 6
    assert sum(executor["images"] for executor in summary["executors"].values()) == 44
    assert "44 images under s3://" in output(result) and ": 6 batches of up to 8" in output(result)


def test_original_flags_with_a_softmax_output_head(original_flags_run, world):
    result, lines, summary = original_flags_run
    assert result.returncode == 0, output(result)[-3000:]
    assert [json.loads(line)["key"] for line in lines] == listed_keys(world["objects"])
    assert summary["model"]["head"] == "softmax"
    reference = Reference(world["demo"] / "model" / "digits_softmax", softmax_head=True)
    assert check_against_reference(lines, world["objects"], reference, top_k=5) == 40


def test_softmax_and_logits_heads_agree(logits_run, original_flags_run):
    by_key = {}
    for line in logits_run[1]:
        row = json.loads(line)
        by_key[row["key"]] = row.get("predictions")
    compared = 0
    for line in original_flags_run[1]:
        row = json.loads(line)
        if row.get("predictions"):
            # The softmax run keeps 5 classes, the logits run 3: the first 3 of each must match, all of them.
            theirs = by_key[row["key"]]
            assert len(row["predictions"]) == 5 and len(theirs) == 3, row["key"]
            for a, b in zip(row["predictions"][:3], theirs):
                assert a["class_id"] == b["class_id"]
                assert abs(a["probability"] - b["probability"]) <= 1e-5
            compared += 1
    # Both runs scored the same images: every one with predictions in the logits run was compared.
    assert compared == sum(1 for predictions in by_key.values() if predictions) >= 40


def test_dry_run_through_spark_submit_starts_no_spark_job(world):
    result = spark_submit([
        "--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits", "--dry-run",
        "--endpoint-url", world["endpoint"], "--input-shape", "3,32,32", "--std", "255", "--batch-size", "8",
        "--output", f"s3://{BUCKET}/out/dry.jsonl",
    ])
    assert result.returncode == 0, output(result)[-3000:]
    text = output(result)
    # The driver's log and MXNet's messages come first on the same stream; the plan is the last line.
    assert len(result.stdout.splitlines()) > 1
    plan = json.loads(result.stdout.splitlines()[-1])
    assert plan["images"] == 44 and plan["partitions"] == 6 and plan["to_score"] == 44
    assert plan["sample"]["key"] == plan["first_key"]
    assert plan["output"] == f"s3://{BUCKET}/out/dry.jsonl" and plan["output_writable"] is True
    assert "master local-cluster" not in text and "app-" not in text  # no SparkContext was made
    # The write check left nothing behind.
    listed = world["s3"].list_objects_v2(Bucket=BUCKET, Prefix="out/dry.jsonl")
    assert listed["KeyCount"] == 0


def test_dry_run_through_spark_submit_fails_once_on_an_unwritable_output(world):
    result = spark_submit([
        "--input", f"s3://{BUCKET}/imgs/", "--model", f"s3://{BUCKET}/model/digits", "--dry-run",
        "--endpoint-url", world["endpoint"], "--input-shape", "3,32,32", "--std", "255",
        "--output", "s3://no-such-dry-run-bucket/out.jsonl",
    ])
    assert result.returncode == 1, output(result)[-3000:]
    text = output(result)
    assert text.count("cannot write s3://no-such-dry-run-bucket/out.jsonl") == 1  # one error, printed once
    assert "NoSuchBucket" in text


def test_the_botocore_reader_writes_what_the_lean_reader_writes(logits_run, botocore_run, world):
    lean_result, _, lean_summary = logits_run
    result, body, summary = botocore_run
    assert result.returncode == lean_result.returncode == 3, output(result)[-3000:]  # the same 3 bad objects
    assert summary["options"]["s3_reader"] == "botocore" and lean_summary["options"]["s3_reader"] == "lean"
    lean_body = world["s3"].get_object(Bucket=BUCKET, Key="out/logits.jsonl")["Body"].read()
    assert body == lean_body  # byte for byte
    counts = ("keys_listed", "predicted", "failed", "batches", "errors_by_stage")
    assert {k: summary[k] for k in counts} == {k: lean_summary[k] for k in counts}
    assert summary["keys_listed"] == 44
    assert "lean listing is not available" not in output(result)  # botocore was chosen, not fallen back to
