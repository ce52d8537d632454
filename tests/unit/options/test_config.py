"""Options: defaults, YAML, command line; their precedence; usage errors; padding; dry run."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import click
import pytest
import yaml

import infer_main
import mxinfer
from mxjob.core import errors
from mxjob.inputs import batch_list, listing
from mxjob.options import config, option_types
from mxjob.outputs import jsonl
from mxjob.planning import sizing
from mxjob.reporting import record_fields, records
from tests.support.helpers import ROOT, make_s3_client

BASE = ["--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", "s3://out/p.jsonl"]


@pytest.fixture
def resolve(runner):
    """``resolve(*args, config=None, tmp_path=None)``: run the CLI's option handling only (run_job replaced).

    Returns the click result and the JobConfig the job would have run with.
    """

    def run(*args: str, config: dict | None = None, tmp_path: Path | None = None):
        seen = {}

        def fake_run(cfg, **_):
            seen["cfg"] = cfg
            return 0

        argv = list(args)
        if config is not None:
            path = tmp_path / "job.yaml"
            path.write_text(yaml.safe_dump(config))
            argv += ["--config", str(path)]
        original = infer_main.run_job
        infer_main.run_job = fake_run
        try:
            result = runner.invoke(infer_main.main, argv)
        finally:
            infer_main.run_job = original
        return result, seen.get("cfg")

    return run


def test_conf_defaults_yaml_documents_exactly_the_defaults():
    documented = yaml.safe_load((ROOT / "conf" / "defaults.yaml").read_text())
    assert sorted(documented) == sorted(config.DEFAULTS)
    # Compared as the job reads them: a YAML list of suffixes is the default's comma-separated text.
    assert config.merge_settings({}, documented) == config.merge_settings({}, {})


def test_defaults_apply_when_nothing_overrides_them(resolve):
    result, cfg = resolve(*BASE)
    assert result.exit_code == 0, result.output
    assert cfg.batch_size == "auto" and cfg.top_k == 5
    assert cfg.preprocess == mxinfer.Preprocess((3, 224, 224), (0.0,), (1.0,), "stretch", 64_000_000)
    assert cfg.suffixes == listing.DEFAULT_SUFFIXES
    assert cfg.model.symbol_uri == "s3://m/r18-symbol.json"
    assert cfg.model.params_uri == "s3://m/r18-0000.params"
    assert (cfg.input_bucket, cfg.input_prefix) == ("in", "photos/")
    assert (cfg.output_bucket, cfg.output_key) == ("out", "p.jsonl")


def test_command_line_beats_yaml_beats_defaults(tmp_path, resolve):
    config = {"batch_size": 16, "top_k": 3, "input_shape": [3, 32, 32], "mean": "1,2,3", "epoch": 7}
    result, cfg = resolve(*BASE, "--top-k", "2", config=config, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.top_k == 2  # command line
    assert cfg.batch_size == 16  # YAML
    assert cfg.preprocess.input_shape == (3, 32, 32) and cfg.preprocess.mean == (1.0, 2.0, 3.0)
    assert cfg.model.params_uri == "s3://m/r18-0007.params"
    assert cfg.max_errors == "1%"  # default


def test_a_task_only_option_of_the_config_file_yields_to_the_task_on_the_command_line():
    # conf/demo.yaml sets top_k (classify's); --task embed on the command line must still run.
    cli = {"input": "s3://in/p/", "model": "s3://m/r", "output": "s3://o/k.jsonl", "task": "embed",
           "embedding_dtype": "float16", "normalize": True}
    settings = config.merge_settings(cli, {"top_k": 3, "batch_size": 8}, "conf/demo.yaml")
    cfg = config.resolve(settings)
    assert (cfg.task, cfg.embedding_dtype, cfg.normalize, cfg.batch_size) == ("embed", "float16", True, 8)
    assert cfg.top_k == config.DEFAULTS["top_k"] and "top_k" not in settings.given
    assert settings.notes == ("top_k in conf/demo.yaml applies to --task classify only: left out, since the "
                              "command line chose --task embed",)


def test_the_cli_logs_the_config_files_option_it_left_out_once_at_info(tmp_path, resolve, caplog):
    caplog.set_level(logging.INFO, logger="infer_main")
    result, cfg = resolve(*BASE, "--task", "detect", config={"top_k": 3}, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert (cfg.task, cfg.min_score) == ("detect", config.DEFAULTS["min_score"])
    left_out = [(r.levelno, r.getMessage()) for r in caplog.records if "top_k" in r.getMessage()]
    assert left_out == [(logging.INFO, f"top_k in {tmp_path / 'job.yaml'} applies to --task classify only: left "
                                       "out, since the command line chose --task detect")]


def test_a_task_only_option_on_the_command_line_with_another_task_is_still_refused():
    cli = {"input": "s3://in/p/", "model": "s3://m/r", "output": "s3://o/k.jsonl", "task": "embed", "top_k": 3}
    with pytest.raises(click.UsageError, match="--top-k applies to --task classify only, and this run's task is "
                                               "embed: leave it out"):
        config.resolve(config.merge_settings(cli, {"top_k": 3}))
    # The file's own task and an option of another task contradict each other: refused too.
    with pytest.raises(click.UsageError, match="top_k in --config applies to --task classify only"):
        config.resolve(config.merge_settings({**cli, "task": None, "top_k": None}, {"task": "embed", "top_k": 3}))

def test_yaml_alone_can_carry_every_required_option(tmp_path, resolve):
    config = {"input": "s3://in/x/", "model": "s3://m/r", "output": "s3://o/k.jsonl", "dry_run": True}
    result, cfg = resolve(config=config, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.dry_run is True and cfg.input_uri == "s3://in/x/"


def test_the_originals_flags_map_to_the_same_job(resolve):
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
    ([*BASE, "--batch-size", "0"], "'--batch-size' / '--batch': 0 is not in the range 1<=x<=100000"),
    ([*BASE, "--top-k", "-1"], "'--top-k': -1 is not in the range x>=1"),
    ([*BASE, "--input-shape", "3,224"], "'--input-shape': needs 3 comma-separated"),
    ([*BASE, "--input-shape", "3,a,224"], "'--input-shape': needs comma-separated whole numbers"),
    ([*BASE, "--input-shape", "2,8,8"], "--input-shape: C (the first of C,H,W) must be 3 (RGB) or 1"),
    ([*BASE, "--mean", "1,2"], "--mean needs 1 or 3 values"),
    ([*BASE, "--std", "0"], "'--std': values must be non-zero"),
    ([*BASE, "--resize", "zoom"], "'zoom' is not one of"),
    ([*BASE, "--max-errors", "lots"], "'--max-errors': must be a count (10) or a percentage (1%)"),
    ([*BASE, "--max-errors", "101%"], "'--max-errors': out of range"),
    ([*BASE, "--context", "tpu"], "'--context': must be cpu, gpu or gpu:N"),
    ([*BASE, "--log-level", "LOUD"], "'LOUD' is not one of"),
    ([*BASE, "--batch-size", "8.9"], "'--batch-size' / '--batch': '8.9' is not a valid integer"),
    ([*BASE, "--progress-seconds", "fast"], "'--progress-seconds': 'fast' is not a valid float"),
    ([*BASE, "--handler", "boxes.txt"], "'--handler': must be a Python file ending in .py"),
    ([*BASE, "--suffixes", ","], "'--suffixes': no suffix given"),
])
def test_usage_errors_exit_2_and_say_what_to_fix(args, message, resolve):
    result, cfg = resolve(*args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert cfg is None


@pytest.mark.parametrize("flag", ["--access_key", "--secret_key", "--access-key"])
def test_aws_keys_on_the_command_line_are_refused_with_the_reason(flag, resolve):
    result, cfg = resolve(*BASE, flag, "AKIAEXAMPLE")
    assert result.exit_code == 2
    assert "instance role" in result.output and "process list" in result.output
    assert "AKIAEXAMPLE" not in result.output
    assert cfg is None


def test_aws_keys_in_the_yaml_are_refused(tmp_path, resolve):
    result, _ = resolve(*BASE, config={"secret_key": "x"}, tmp_path=tmp_path)
    assert result.exit_code == 2 and "instance role" in result.output


def test_unknown_yaml_option_is_named_with_the_option_it_is_close_to(tmp_path, resolve):
    result, _ = resolve(*BASE, config={"batchsize": 3}, tmp_path=tmp_path)
    assert result.exit_code == 2
    assert "unknown option: batchsize (did you mean batch_size or micro_batch_size?)" in result.output
    result, _ = resolve(*BASE, config={"batchsize": 3, "zzz": 1}, tmp_path=tmp_path)
    assert "2 unknown options: batchsize (did you mean batch_size or micro_batch_size?); zzz;" in result.output


def test_messages_count_in_singular_and_plural():
    assert [errors.plural(n, "bucket") for n in (0, 1, 2)] == ["0 buckets", "1 bucket", "2 buckets"]
    assert errors.plural(1, "batch", "batches") == "1 batch" and errors.plural(3, "batch", "batches") == "3 batches"


def test_a_misspelled_option_on_the_command_line_gets_a_suggestion(resolve):
    result, _ = resolve(*BASE, "--top-kk", "2")
    assert result.exit_code == 2 and "No such option: --top-kk Did you mean --top-k?" in result.output


def test_bad_yaml_is_reported_at_its_file_and_line(tmp_path, runner):
    path = tmp_path / "job.yaml"
    path.write_text("top_k: 2\nbatch_size: [8\n")
    result = runner.invoke(infer_main.main, [*BASE, "--config", str(path)])
    assert result.exit_code == 2 and f'in "{path}", line 2' in result.output
    assert "<unicode string>" not in result.output


@pytest.mark.parametrize("flag, value, want", [("--output-format", "JSONL", "jsonl"), ("--precision", "FP32", "fp32"),
                                               ("--resize", "Short-Side-Crop", "short-side-crop")])
def test_choices_are_taken_in_any_case_and_kept_in_lower_case(flag, value, want, resolve):
    result, cfg = resolve(*BASE, flag, value)
    assert result.exit_code == 0, result.output
    assert want in (cfg.output_format, cfg.precision, cfg.preprocess.resize)


@pytest.mark.parametrize("value", ["false", "no", False, "off"])
def test_yaml_dry_run_false_in_any_spelling_runs_the_job_for_real(tmp_path, value, resolve):
    result, cfg = resolve(*BASE, config={"dry_run": value}, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.dry_run is False  # run_job takes the real path: no plan, Spark and the upload


@pytest.mark.parametrize("value", ["yes", "true", True])
def test_yaml_dry_run_true_in_any_spelling_is_a_dry_run(tmp_path, value, resolve):
    result, cfg = resolve(*BASE, config={"dry_run": value}, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.dry_run is True


def test_no_dry_run_on_the_command_line_beats_the_yaml(tmp_path, resolve):
    result, cfg = resolve(*BASE, "--no-dry-run", config={"dry_run": True}, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.dry_run is False


@pytest.mark.parametrize("key, value, message", [
    ("dry_run", "maybe", "'maybe' is not a valid boolean"),
    ("batch_size", 8.9, "8.9 is not a whole number"),
    ("batch_size", "8.9", "'8.9' is not a valid integer"),
    ("top_k", 2.7, "2.7 is not a whole number"),
    ("epoch", True, "True is not a whole number"),
    ("progress_seconds", "fast", "'fast' is not a valid float"),
    ("progress_seconds", float("nan"), "nan is not a finite number"),
    ("input_shape", [3, 32.5, 32], "needs comma-separated whole numbers"),
    ("mean", "1,x,3", "needs comma-separated numbers"),
    ("resize", "zoom", "'zoom' is not one of"),
    ("log_level", "LOUD", "'LOUD' is not one of"),
    ("batch_size", [1, 2], "expected one integer value, got a YAML list: [1, 2]"),
    ("top_k", {"a": 1}, "expected one integer value, got a YAML mapping: {'a': 1}"),
    ("dry_run", 2, "expected a boolean value, got int 2"),
    ("mean", [[1], 2, 3], "needs comma-separated numbers"),
])
def test_a_bad_yaml_value_exits_2_naming_the_key_and_the_file(tmp_path, key, value, message, resolve):
    result, cfg = resolve(*BASE, config={key: value}, tmp_path=tmp_path)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{key}' in {tmp_path / 'job.yaml'}: {message}" in result.output
    assert cfg is None


@pytest.mark.parametrize(("flag", "value", "bound"), [
    ("--io-threads", "1000000000", "1<=x<=256"),
    ("--list-concurrency", "1000000000", "1<=x<=1024"),
    ("--threads", "1000000000", "1<=x<=512"),
    ("--forward-lanes", "1000", "1<=x<=512"),
    ("--max-in-flight", "10000000", "1<=x<=100000"),
    ("--micro-batch-size", "10000000", "1<=x<=100000"),
    ("--batch-size", "1000000", "1<=x<=100000"),
    ("--s3-max-attempts", "1000", "1<=x<=100"),
    ("--estimate-images", "1000000", "0<=x<=100000"),
    ("--progress-seconds", "100000", "1<=x<=3600"),
])
def test_every_numeric_option_is_bounded_and_the_refusal_names_the_bound(runner, flag, value, bound):
    """A typo's huge value is refused at the command line (exit 2), not after it exhausted the driver or executors."""
    result = runner.invoke(infer_main.main, [*BASE, "--dry-run", flag, value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}'" in result.output and bound in result.output


@pytest.mark.parametrize(("flag", "uri", "meant"), [
    ("--output", "s3://out//p.jsonl", "s3://out/p.jsonl"),
    ("--output", "s3://out/a//b/", "s3://out/a/b/"),
    ("--input", "s3://in//photos/", "s3://in/photos/"),
])
def test_an_s3_uri_with_an_empty_path_segment_is_refused_saying_what_was_meant(runner, flag, uri, meant):
    args = dict(zip(BASE[::2], BASE[1::2]))
    args[flag] = uri
    result = runner.invoke(infer_main.main, [*(x for pair in args.items() for x in pair), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert f"{flag} {uri}: an empty path segment (//)" in result.output and f"did you mean {meant}?" in result.output


def test_a_key_given_twice_in_the_yaml_exits_2_naming_it_and_its_lines(tmp_path, runner):
    path = tmp_path / "twice.yaml"
    path.write_text("batch_size: 8\ntop_k: 2\nbatch_size: 16\n")
    result = runner.invoke(infer_main.main, ["--config", str(path), *BASE])
    assert result.exit_code == 2, result.output
    assert f"--config {path} is not valid YAML" in result.output
    assert "found the key 'batch_size' twice (first on line 1): give it once" in result.output
    assert "line 3" in result.output and "Traceback" not in result.output


def test_a_yaml_value_the_options_check_together_is_named_as_a_yaml_key(tmp_path, resolve):
    result, _ = resolve(*BASE, config={"mean": "1,2"}, tmp_path=tmp_path)
    assert result.exit_code == 2
    assert f"mean in {tmp_path / 'job.yaml'} needs 1 or 3 values" in result.output


def test_yaml_whole_floats_and_numeric_text_are_taken(tmp_path, resolve):
    result, cfg = resolve(*BASE, config={"batch_size": 8.0, "top_k": "3", "progress_seconds": "2.5"},
                          tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert (cfg.batch_size, cfg.top_k, cfg.progress_seconds) == (8, 3, 2.5)


def test_yaml_null_keeps_the_default(tmp_path, resolve):
    result, cfg = resolve(*BASE, config={"batch_size": None}, tmp_path=tmp_path)
    assert result.exit_code == 0, result.output
    assert cfg.batch_size == config.DEFAULTS["batch_size"]


#: Every numeric option of the table with a lower bound: sizes, counts, intervals.
BOUNDED = sorted(name for name, param in config.PARAMS.items()
                 if isinstance(param.type, (click.IntRange, click.FloatRange)) and param.type.min is not None)


def test_every_numeric_option_has_a_range():
    numeric = [name for name, param in config.PARAMS.items()
               if isinstance(param.type, (click.types._NumberParamTypeBase, option_types.NumberList))]
    unbounded = [name for name in numeric if name not in BOUNDED and not isinstance(
        config.PARAMS[name].type, option_types.NumberList)]
    assert numeric and unbounded == []


@pytest.mark.parametrize("key", BOUNDED)
@pytest.mark.parametrize("where", ["command line", "yaml"])
def test_zero_or_negative_sizes_counts_and_intervals_exit_2(tmp_path, key, where, resolve):
    too_small = config.PARAMS[key].type.min - 1
    if where == "yaml":
        result, cfg = resolve(*BASE, config={key: too_small}, tmp_path=tmp_path)
        named = f"'{key}' in {tmp_path / 'job.yaml'}"
    else:
        flag = config.option_flag(key)
        result, cfg = resolve(*BASE, f"{flag}={too_small}")
        named = f"'{flag}'"
    assert result.exit_code == 2, result.output
    assert named in result.output and "is not in the range" in result.output
    assert cfg is None


def test_help_shows_every_default_from_the_table_and_no_help_text_types_one(runner):
    result = runner.invoke(infer_main.main, ["--help"], terminal_width=400)
    assert result.exit_code == 0
    assert not [name for name, param in config.PARAMS.items() if "[default" in (param.help or "")]
    for name in ("batch_size", "top_k", "max_image_pixels", "io_threads", "app_name"):
        assert f"[default: {config.DEFAULTS[name]}" in " ".join(result.output.split())


def test_the_job_and_the_library_share_their_defaults():
    cfg = config.resolve(config.merge_settings({k[2:]: v for k, v in zip(BASE[::2], BASE[1::2])}, {}))
    # auto's choice when nothing is measured is the library's batch size.
    cfg, _ = sizing.size_run(replace(cfg, estimate_images=0), images=[], to_score=1000)
    assert cfg.preprocess == mxinfer.Preprocess()
    library = mxinfer.JobSpec(model=cfg.model, preprocess=mxinfer.Preprocess(), bucket="in")
    job = cfg.job_spec()
    for name in ("batch_size", "top_k", "io_threads", "max_in_flight", "max_object_bytes", "s3_max_attempts"):
        assert getattr(job, name) == getattr(library, name)


def test_missing_config_file_is_a_usage_error(tmp_path, resolve):
    result, _ = resolve(*BASE, "--config", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2 and "cannot read --config" in result.output


@pytest.mark.parametrize("n, batch, batches", [(1, 4, 1), (4, 4, 1), (5, 4, 2), (9, 3, 3)])
def test_plan_cuts_whole_batches_and_a_short_last_one_without_padding(n, batch, batches):
    images = listing.Listing.build("b", [f"k{i}" for i in range(n)], list(range(n)))
    stream = bytearray()
    spans = batch_list.write_batches(images, batch, stream.extend)
    planned = [batch_list.read_batch(bytes(stream[offset:offset + length])) for offset, length in spans]
    assert len(planned) == batches == images.num_batches(batch)
    assert [item for b in planned for item in b] == list(images)  # every item once, in order
    assert all(len(b) == batch for b in planned[:-1]) and 1 <= len(planned[-1]) <= batch


@pytest.mark.parametrize("value, keys, allowed", [("0", 100, 0), ("5", 10, 5), ("1%", 1000, 10), ("1%", 99, 0),
                                                   ("100%", 7, 7)])
def test_allowed_errors(value, keys, allowed):
    assert config.allowed_errors(value, keys) == allowed


def test_spark_failure_reason_finds_the_python_error():
    text = ("An error occurred while calling o45.collect.\n: org.apache.spark.SparkException: Job aborted\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "mxinfer.ModelError: weights missing\n\tat org.apache.spark.api.python.X\n")
    assert errors.spark_failure_reason(RuntimeError(text)) == "mxinfer.ModelError: weights missing"


def test_spark_failure_reason_without_a_python_error_gives_the_jvms_line():
    # A job the SparkContext's stop cancelled: Py4J's first line names only the JVM call that failed.
    text = ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
            ": org.apache.spark.SparkException: Job 1 cancelled because SparkContext was shut down\n"
            "\tat org.apache.spark.scheduler.DAGScheduler.cleanUpAfterSchedulerStop(DAGScheduler.scala:1253)\n")
    assert errors.spark_failure_reason(RuntimeError(text)) == (
        "org.apache.spark.SparkException: Job 1 cancelled because SparkContext was shut down")


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


def test_dry_run_prints_the_plan_and_a_scored_image_without_spark(small_world, runner):
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                             "--batch-size", "2", "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    record_fields.from_json(records.Plan, plan)  # its declared fields and types (docs/configuration.md's table)
    assert (plan["output"], plan["output_writable"]) == (None, None)  # no --output: nothing to check
    assert plan["images"] == 5 and plan["batches"] == 3
    assert plan["first_key"] == "imgs/0.png"
    assert plan["sample"]["key"] == "imgs/0.png" and len(plan["sample"]["predictions"]) == 5
    assert plan["model"]["num_classes"] == 10
    from pyspark import SparkContext
    assert SparkContext._active_spark_context is None


def test_empty_prefix_fails_with_a_clear_message(small_world, runner):
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/nothing/",
                                             "--output", "s3://cfg-bucket/o.jsonl"])
    assert result.exit_code == 1
    assert "no images under s3://cfg-bucket/nothing/" in result.output


def test_missing_input_bucket_fails_before_any_work(small_world, runner):
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://no-such-bucket-x/p/",
                                             "--output", "s3://cfg-bucket/o.jsonl"])
    assert result.exit_code == 1
    assert "cannot list s3://no-such-bucket-x/p/" in result.output and "NoSuchBucket" in result.output


def test_top_k_over_the_number_of_classes_fails_on_the_driver(small_world, runner):
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                             "--output", "s3://cfg-bucket/o.jsonl", "--top-k", "11"])
    assert result.exit_code == 1
    assert "--top-k 11 is larger than the model's 10 classes" in result.output


def test_missing_model_file_fails_on_the_driver(small_world, runner):
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                             "--output", "s3://cfg-bucket/o.jsonl", "--epoch", "3"])
    assert result.exit_code == 1
    assert "model file missing" in result.output and "digits-0003.params" in result.output


def test_empty_labels_means_no_labels_and_absent_means_synset_beside_the_model(resolve):
    _, cfg = resolve(*BASE, "--labels", "")
    assert cfg.model.labels_uri == ""
    _, cfg = resolve(*BASE)
    assert cfg.model.labels_uri is None


def test_unwritable_output_fails_before_any_spark_work(small_world, runner):
    result = runner.invoke(infer_main.main, [*small_world, "--input", "s3://cfg-bucket/imgs/",
                                             "--output", "s3://no-such-output-bucket/o.jsonl"])
    assert result.exit_code == 1
    assert "cannot write s3://no-such-output-bucket/o.jsonl" in result.output and "NoSuchBucket" in result.output
    from pyspark import SparkContext
    assert SparkContext._active_spark_context is None


def test_dry_run_with_an_unwritable_output_fails_and_says_so_once(small_world, caplog, stderr_runner):
    result = stderr_runner.invoke(infer_main.main, [
        *small_world, "--input", "s3://cfg-bucket/imgs/", "--output", "s3://no-such-output-bucket/o.jsonl",
        "--dry-run"])
    assert result.exit_code == 1
    assert result.stdout == ""  # no plan
    assert result.stderr.count("cannot write s3://no-such-output-bucket/o.jsonl") == 1
    assert "NoSuchBucket" in result.stderr
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # not also logged as an ERROR line


def test_dry_run_checks_a_writable_output_and_leaves_nothing_there(small_world, moto_endpoint, stderr_runner):
    result = stderr_runner.invoke(infer_main.main, [
        *small_world, "--input", "s3://cfg-bucket/imgs/", "--output", "s3://cfg-bucket/dry/o.jsonl", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout.splitlines()[-1])
    record_fields.from_json(records.Plan, plan)
    assert plan["output"] == "s3://cfg-bucket/dry/o.jsonl" and plan["output_writable"] is True
    assert make_s3_client(moto_endpoint).list_objects_v2(Bucket="cfg-bucket", Prefix="dry/")["KeyCount"] == 0


def test_dry_run_plan_holds_the_estimate_for_the_cluster_asked(small_world, stderr_runner, caplog):
    caplog.set_level(logging.INFO, logger="mxjob.planning.sizing")
    result = stderr_runner.invoke(infer_main.main, [
        *small_world, "--input", "s3://cfg-bucket/imgs/", "--output", "s3://cfg-bucket/dry/e.jsonl", "--dry-run",
        "--estimate-cluster", "10x16", "--node-price", "0.5", "--estimate-images", "4"])
    assert result.exit_code == 0, result.stderr
    plan = json.loads(result.stdout.splitlines()[-1])
    estimate = plan["estimate"]
    assert set(estimate) == {"sample_images", "cpu_seconds_per_image", "s3_server_cpu_seconds_per_image",
                             "model_load_seconds", "start_seconds", "images", "batches", "cluster", "vcpus",
                             "executors", "images_per_second", "wall_seconds", "cost_usd", "cost"}
    assert (estimate["sample_images"], estimate["vcpus"], estimate["images"]) == (4, 160, plan["to_score"])
    assert estimate["cpu_seconds_per_image"] > 0 and estimate["wall_seconds"] > 0
    # The whole cluster (10 core nodes and the master) at 0.5 USD a node-hour, from start-up to idle timeout.
    from mxjob.planning.estimate import CLUSTER_START_SECONDS, IDLE_TIMEOUT_SECONDS

    hours = (CLUSTER_START_SECONDS + estimate["wall_seconds"] + IDLE_TIMEOUT_SECONDS) / 3600
    assert estimate["cost_usd"] == pytest.approx(11 * 0.5 * hours, abs=0.01)
    assert estimate["cost"]["total_usd"] == pytest.approx(estimate["cost_usd"], abs=0.01)
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("estimate:")]
    assert "on 160 vCPUs: --estimate-cluster 10x16" in line and "at $0.5/core node-hour" in line
    assert all(part in line for part in ("10 core nodes x", "start-up", "master 1 x", "idle", "= total $"))


def test_estimate_images_0_turns_the_estimate_off(small_world, stderr_runner):
    result = stderr_runner.invoke(infer_main.main, [
        *small_world, "--input", "s3://cfg-bucket/imgs/", "--output", "s3://cfg-bucket/dry/e.jsonl", "--dry-run",
        "--estimate-images", "0"])
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["estimate"] is None


@pytest.mark.parametrize("output, fmt", [("s3://out/p.jsonl", "parquet"), ("s3://out/p.json", "parquet"),
                                         ("s3://out/p.jsonl.gz", "parquet"), ("s3://out/p.parquet", "jsonl")])
def test_an_output_format_the_keys_suffix_contradicts_is_refused(output, fmt, resolve):
    result, cfg = resolve("--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", output,
                          "--output-format", fmt)
    assert result.exit_code == 2 and cfg is None
    assert f"--output-format {fmt} does not match the output key" in result.output
    assert "drop --output-format" in result.output


@pytest.mark.parametrize("output, fmt, ending, told, rows", [
    ("s3://out/preds.csv", None, ".csv", "CSV", "JSON Lines"),
    ("s3://out/preds.CSV.gz", None, ".csv.gz", "CSV", "JSON Lines"),
    ("s3://out/preds.tsv", "jsonl", ".tsv", "tab-separated values", "JSON Lines"),
    ("s3://out/preds.jsonl.zst", None, ".zst", "zstd-compressed data", "JSON Lines"),
    ("s3://out/preds.csv", "parquet", ".csv", "CSV", "Parquet"),
    ("s3://out/preds.jpg", None, ".jpg", "a JPEG image", "JSON Lines"),
    ("s3://out/scans/0001.TIFF", None, ".tiff", "a TIFF image", "JSON Lines")])
def test_a_key_whose_suffix_says_another_format_or_compression_is_refused(output, fmt, ending, told, rows,
                                                                          resolve):
    # A key with no suffix of the job's is JSON Lines, but not a .csv one: pandas.read_csv would take it for CSV.
    result, cfg = resolve("--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", output,
                          *(["--output-format", fmt] if fmt else []))
    assert result.exit_code == 2 and cfg is None
    key = output[len("s3://out/"):]
    assert (f"the output key {key!r} ends in {ending}, so readers would take it for {told}, but the job would "
            f"write {rows} there: end the key in {'.jsonl' if rows == 'JSON Lines' else '.parquet'}, or give another "
            "of the outputs the job writes: s3://BUCKET/KEY.jsonl, s3://BUCKET/KEY.parquet, s3://BUCKET/PREFIX/"
            ) in " ".join(result.output.split())


@pytest.mark.parametrize("output", ["/tmp/preds.jsonl", "gs://b/preds.jsonl", "file:///tmp/preds/"])
def test_an_output_no_kind_claims_is_a_usage_error_naming_the_forms_the_job_writes(output, resolve):
    result, cfg = resolve("--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", output)
    assert result.exit_code == 2 and cfg is None
    assert (f"{output!r} is not an output the job writes; expected one of s3://BUCKET/KEY.jsonl, "
            "s3://BUCKET/KEY.parquet, s3://BUCKET/PREFIX/, iceberg://CATALOG/NAMESPACE.TABLE") in \
        " ".join(result.output.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--output", "s3://b/model/digits-symbol.json", "--overwrite"],
     "--output s3://b/model/digits-symbol.json would overwrite the model's symbol file "
     "(s3://b/model/digits-symbol.json), which this run reads; write the output elsewhere"),
    (["--output", "s3://b/model/", "--overwrite"], "would overwrite the model's symbol file"),
    (["--output", "s3://b/model/labels.txt", "--labels", "s3://b/model/labels.txt"], "would overwrite --labels"),
    (["--input-manifest", "s3://b/lists/keys", "--output", "s3://b/lists/keys", "--overwrite"],
     "would overwrite --input-manifest (s3://b/lists/keys)"),
    (["--input", "s3://b/imgs/", "--suffixes", ".dat", "--output", "s3://b/imgs/0001.dat", "--overwrite"],
     "--output s3://b/imgs/0001.dat writes under the input s3://b/imgs/ (at s3://b/imgs/0001.dat): the next run "
     "would list the job's own files as input, and one of them may be an input key; write the output outside the "
     "input prefix"),
    (["--input", "s3://b/imgs/", "--output", "s3://b/imgs/preds/", "--dry-run"], "writes under the input"),
], ids=["symbol-file", "dataset-over-the-model", "labels", "manifest", "an-input-key", "dry-run-in-the-input"])
def test_an_output_over_what_the_run_reads_is_a_usage_error(args, message, resolve):
    # The URIs alone decide, so the job exits 2 before any request, as make check-job and submit-yarn's check do.
    if "--input" not in args and "--input-manifest" not in args:
        args = ["--input", "s3://b/imgs/", *args]
    result, cfg = resolve(*args, "--model", "s3://b/model/digits")
    assert result.exit_code == 2 and cfg is None
    assert message in " ".join(result.output.split())


@pytest.mark.parametrize("output", ["s3://b/imgs-preds/out.jsonl", "s3://b/model/digits.jsonl"])
def test_an_output_beside_the_input_prefix_or_the_model_but_not_over_them_is_taken(output, resolve):
    result, cfg = resolve("--input", "s3://b/imgs/", "--model", "s3://b/model/digits", "--output", output)
    assert result.exit_code == 0, result.output
    assert cfg.output_uri == output


@pytest.mark.parametrize("output, fmt, want", [("s3://out/p.jsonl", None, "jsonl"), ("s3://out/p.parquet", None,
                                                "parquet"), ("s3://out/p.PARQUET", "parquet", "parquet"),
                                               ("s3://out/results", "parquet", "parquet"),
                                               ("s3://out/results.txt", "jsonl", "jsonl")])
def test_an_output_format_that_fits_the_key_or_a_key_without_a_known_suffix_is_taken(output, fmt, want, resolve):
    result, cfg = resolve("--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", output,
                          *(["--output-format", fmt] if fmt else []))
    assert result.exit_code == 0, result.output
    assert cfg.output_format == want


@pytest.mark.parametrize("output, fmt", [("s3://out/p.parquet.gz", None), ("s3://out/p.parquet.gz", "jsonl"),
                                         ("s3://out/p.gz", "parquet"), ("s3://out/preds.gz/", None)])
def test_parquet_under_a_gz_name_is_refused(output, fmt, resolve):
    result, cfg = resolve("--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", output,
                          *(["--output-format", fmt] if fmt else []))
    assert result.exit_code == 2 and cfg is None
    assert f"the output '{output[len('s3://out/'):]}' ends in .gz but is " in result.output
    assert "cannot read Parquet inside gzip. Drop the .gz" in result.output
    assert "for gzipped JSON Lines give an output key ending in .jsonl.gz" in result.output
    assert ("ending in .jsonl.gz and drop --output-format" in result.output) == (fmt == "parquet")


@pytest.mark.parametrize("output", ["s3://out/p.jsonl.gz", "s3://out/p.ndjson.gz", "s3://out/results.gz"])
def test_a_gz_key_is_gzipped_json_lines(output, resolve):
    result, cfg = resolve("--input", "s3://in/photos/", "--model", "s3://m/r18", "--output", output)
    assert result.exit_code == 0, result.output
    assert cfg.output_format == "jsonl" and jsonl.is_gzip(cfg.output_key)
    assert cfg.output.content_type == "application/gzip"
