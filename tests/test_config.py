"""Options: defaults, YAML, command line; their precedence; usage errors; padding; dry run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import infer_main
import mxinfer
from tests.conftest import ROOT, make_s3_client

BASE = ["--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", "s3://out/p.jsonl"]


def resolve(*args: str, config: dict | None = None, tmp_path: Path | None = None):
    """Run the CLI's option handling only (run_job replaced) and return the JobConfig."""
    seen = {}

    def fake_run(cfg):
        seen["cfg"] = cfg
        return 0

    argv = list(args)
    if config is not None:
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(config))
        argv += ["--config", str(path)]
    runner = CliRunner()
    original = infer_main.run_job
    infer_main.run_job = fake_run
    try:
        result = runner.invoke(infer_main.main, argv)
    finally:
        infer_main.run_job = original
    return result, seen.get("cfg")


def test_conf_defaults_yaml_documents_exactly_the_defaults():
    documented = yaml.safe_load((ROOT / "conf" / "defaults.yaml").read_text())
    assert documented == infer_main.DEFAULTS


def test_defaults_apply_when_nothing_overrides_them():
    result, cfg = resolve(*BASE)
    assert result.exit_code == 0, result.output
    assert cfg.batch_size == 64 and cfg.top_k == 5
    assert cfg.preprocess == mxinfer.Preprocess((3, 224, 224), (0.0,), (1.0,), "stretch", 64_000_000)
    assert cfg.suffixes == mxinfer.DEFAULT_SUFFIXES
    assert cfg.model.symbol_uri == "s3://m/r18-symbol.json"
    assert cfg.model.params_uri == "s3://m/r18-0000.params"
    assert (cfg.input_bucket, cfg.input_prefix) == ("in", "photos/")
    assert (cfg.output_bucket, cfg.output_key) == ("out", "p.jsonl")


def test_command_line_beats_yaml_beats_defaults(tmp_path):
    config = {"batch_size": 16, "top_k": 3, "input_shape": [3, 32, 32], "mean": "1,2,3", "epoch": 7}
    result, cfg = resolve(*BASE, "--top-k", "2", config=config, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.top_k == 2  # command line
    assert cfg.batch_size == 16  # YAML
    assert cfg.preprocess.input_shape == (3, 32, 32) and cfg.preprocess.mean == (1.0, 2.0, 3.0)
    assert cfg.model.params_uri == "s3://m/r18-0007.params"
    assert cfg.max_errors == "1%"  # default


def test_yaml_alone_can_carry_every_required_option(tmp_path):
    config = {"input": "s3://in/x/", "model": "s3://m/r", "output": "s3://o/k.jsonl", "dry_run": True}
    result, cfg = resolve(config=config, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.dry_run is True and cfg.input_uri == "s3://in/x/"


def test_the_originals_flags_map_to_the_same_job():
    result, cfg = resolve(
        "--sym_url", "http://h/r-symbol.json", "--param_url", "http://h/r-0000.params",
        "--label_url", "http://h/synset.txt", "--batch", "32", "--bucket", "B", "--prefix", "cifar10/test",
        "--output_s3_key", "preds.jsonl")
    assert result.exit_code == 0, result.output
    assert (cfg.input_bucket, cfg.input_prefix) == ("B", "cifar10/test")
    assert (cfg.output_bucket, cfg.output_key) == ("B", "preds.jsonl")  # output bucket defaults to the input's
    assert cfg.model.symbol_uri == "http://h/r-symbol.json" and cfg.model.labels_uri == "http://h/synset.txt"
    assert cfg.batch_size == 32


@pytest.mark.parametrize("args, message", [
    (["--model", "s3://m/r", "--output", "s3://o/k"], "no input"),
    (["--input", "s3://i/p", "--output", "s3://o/k"], "no model"),
    (["--input", "s3://i/p", "--model", "s3://m/r"], "no output"),
    ([*BASE, "--bucket", "x"], "either --input"),
    (["--input", "photos/", "--model", "m", "--output", "s3://o/k"], "not an S3 URI"),
    ([*BASE[:4], "--output", "s3://o/"], "names no object"),
    ([*BASE, "--batch-size", "0"], "batch_size must be at least 1"),
    ([*BASE, "--top-k", "-1"], "top_k must be at least 1"),
    ([*BASE, "--input-shape", "3,224"], "input_shape needs 3"),
    ([*BASE, "--input-shape", "3,a,224"], "comma-separated numbers"),
    ([*BASE, "--mean", "1,2"], "mean needs 1 or 3 values"),
    ([*BASE, "--std", "0"], "non-zero"),
    ([*BASE, "--resize", "zoom"], "'zoom' is not one of"),
    ([*BASE, "--max-errors", "lots"], "max_errors must be"),
    ([*BASE, "--context", "tpu"], "context must be"),
    ([*BASE, "--log-level", "LOUD"], "log_level must be"),
])
def test_usage_errors_exit_2_and_say_what_to_fix(args, message):
    result, cfg = resolve(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert cfg is None


@pytest.mark.parametrize("flag", ["--access_key", "--secret_key", "--access-key"])
def test_aws_keys_on_the_command_line_are_refused_with_the_reason(flag):
    result, cfg = resolve(*BASE, flag, "AKIAEXAMPLE")
    assert result.exit_code == 2
    assert "instance role" in result.output and "process list" in result.output
    assert "AKIAEXAMPLE" not in result.output
    assert cfg is None


def test_aws_keys_in_the_yaml_are_refused(tmp_path):
    result, _ = resolve(*BASE, config={"secret_key": "x"}, tmp_path=tmp_path)
    assert result.exit_code == 2 and "instance role" in result.output


def test_unknown_yaml_option_is_named(tmp_path):
    result, _ = resolve(*BASE, config={"batchsize": 3}, tmp_path=tmp_path)
    assert result.exit_code == 2 and "unknown option(s): batchsize" in result.output


def test_missing_config_file_is_a_usage_error(tmp_path):
    result, _ = resolve(*BASE, "--config", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2 and "cannot read --config" in result.output


@pytest.mark.parametrize("n, batch, batches", [(1, 4, 1), (4, 4, 1), (5, 4, 2), (9, 3, 3)])
def test_plan_cuts_whole_batches_and_a_short_last_one_without_padding(n, batch, batches):
    items = [(f"k{i}", 1) for i in range(n)]
    planned = infer_main.plan_batches(items, batch)
    assert len(planned) == batches
    assert [item for b in planned for item in b] == items  # every item once, in order
    assert all(len(b) == batch for b in planned[:-1]) and 1 <= len(planned[-1]) <= batch


@pytest.mark.parametrize("value, keys, allowed", [("0", 100, 0), ("5", 10, 5), ("1%", 1000, 10), ("1%", 99, 0),
                                                   ("100%", 7, 7)])
def test_allowed_errors(value, keys, allowed):
    assert infer_main.allowed_errors(value, keys) == allowed


def test_spark_failure_reason_finds_the_python_error():
    text = ("An error occurred while calling o45.collect.\n: org.apache.spark.SparkException: Job aborted\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "mxinfer.ModelError: weights missing\n\tat org.apache.spark.api.python.X\n")
    assert infer_main.spark_failure_reason(RuntimeError(text)) == "mxinfer.ModelError: weights missing"


# --- against the local S3 server, without Spark


@pytest.fixture(scope="module")
def small_world(moto_endpoint, logits_prefix):
    """A bucket with a few digit PNGs and the demo model."""
    from demo import make_demo

    s3 = make_s3_client(moto_endpoint)
    s3.create_bucket(Bucket="cfg-bucket")
    for suffix in ("-symbol.json", "-0000.params"):
        s3.upload_file(f"{logits_prefix}{suffix}", "cfg-bucket", f"model/digits{suffix}")
    s3.upload_file(str(logits_prefix.parent / "synset.txt"), "cfg-bucket", "model/synset.txt")
    (_, _), (test_x, _) = make_demo.digits_split()
    for i in range(5):
        s3.put_object(Bucket="cfg-bucket", Key=f"imgs/{i}.png", Body=make_demo.digit_png(test_x[i]))
    s3.put_object(Bucket="cfg-bucket", Key="imgs/readme.txt", Body=b"not an image")
    return ["--endpoint-url", moto_endpoint, "--model", "s3://cfg-bucket/model/digits",
            "--input-shape", "3,32,32", "--std", "255"]


def test_dry_run_prints_the_plan_and_a_scored_image_without_spark(small_world):
    runner = CliRunner()
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                             "--batch-size", "2", "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["images"] == 5 and plan["batches"] == 3
    assert plan["first_key"] == "imgs/0.png"
    assert plan["sample"]["key"] == "imgs/0.png" and len(plan["sample"]["predictions"]) == 5
    assert plan["model"]["num_classes"] == 10
    from pyspark import SparkContext
    assert SparkContext._active_spark_context is None


def test_empty_prefix_fails_with_a_clear_message(small_world):
    result = CliRunner().invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/nothing/",
                                                  "--output", "s3://cfg-bucket/o.jsonl"])
    assert result.exit_code == 1
    assert "no images under s3://cfg-bucket/nothing/" in result.output


def test_missing_input_bucket_fails_before_any_work(small_world):
    result = CliRunner().invoke(infer_main.main, [*small_world, "--input", "s3://no-such-bucket-x/p/",
                                                  "--output", "s3://cfg-bucket/o.jsonl"])
    assert result.exit_code == 1
    assert "cannot list s3://no-such-bucket-x/p/" in result.output and "NoSuchBucket" in result.output


def test_top_k_over_the_number_of_classes_fails_on_the_driver(small_world):
    result = CliRunner().invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                                  "--output", "s3://cfg-bucket/o.jsonl", "--top-k", "11"])
    assert result.exit_code == 1
    assert "--top-k 11 is larger than the model's 10 classes" in result.output


def test_missing_model_file_fails_on_the_driver(small_world):
    result = CliRunner().invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                                  "--output", "s3://cfg-bucket/o.jsonl", "--epoch", "3"])
    assert result.exit_code == 1
    assert "model file missing" in result.output and "digits-0003.params" in result.output


def test_empty_labels_means_no_labels_and_absent_means_synset_beside_the_model():
    _, cfg = resolve(*BASE, "--labels", "")
    assert cfg.model.labels_uri == ""
    _, cfg = resolve(*BASE)
    assert cfg.model.labels_uri is None


def test_unwritable_output_fails_before_any_spark_work(small_world):
    result = CliRunner().invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                                  "--output", "s3://no-such-output-bucket/o.jsonl"])
    assert result.exit_code == 1
    assert "cannot write s3://no-such-output-bucket/o.jsonl" in result.output and "NoSuchBucket" in result.output
    from pyspark import SparkContext
    assert SparkContext._active_spark_context is None
