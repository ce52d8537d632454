"""The settings table: everything derived from it agrees with it, and the library's defaults are the job's."""

from __future__ import annotations

import inspect
import pickle
from dataclasses import fields
from pathlib import Path

import click
import pytest
import yaml

import mxinfer
from mxjob.executor import partition
from mxjob.executor.partition import JobSpec
from mxjob.inputs import listing
from mxjob.options import config, option_types, settings, settings_docs
from mxjob.planning import sizing
from mxjob.s3 import clients, parallel_list

ROOT = Path(__file__).resolve().parents[3]
BASE = {"input": "s3://in/photos/", "model": "s3://m/r18", "output": "s3://out/p.jsonl"}


def resolved(**changes) -> config.JobConfig:
    return config.resolve(config.merge_settings({**BASE, **changes}, {}))


def test_docs_options_page_is_generated_from_the_table():
    assert (ROOT / "docs" / "options.md").read_text() == settings_docs.options_markdown(), \
        "docs/options.md differs from SETTINGS: run `make docs`"


def test_conf_defaults_yaml_is_generated_from_the_table():
    assert (ROOT / "conf" / "defaults.yaml").read_text() == settings_docs.defaults_yaml(), \
        "conf/defaults.yaml differs from SETTINGS: run `make docs`"


def test_conf_defaults_yaml_read_as_a_config_gives_the_defaults():
    documented = yaml.safe_load((ROOT / "conf" / "defaults.yaml").read_text())
    assert sorted(documented) == sorted(s.name for s in settings.SETTINGS)
    assert config.merge_settings({}, documented) == config.merge_settings({}, {})


def test_the_options_page_names_every_flag_and_default():
    page = settings_docs.options_markdown()
    for s in settings.SETTINGS:
        row = next(line for line in page.splitlines() if line.startswith(f"| `{s.flags[0]}`"))
        if s.default_text() and not isinstance(s.default, bool):
            assert f"`{s.default_text()}`" in row, s.name


def test_every_setting_is_an_option_of_the_command_line_with_its_default():
    for s in settings.SETTINGS:
        param = config.PARAMS[s.name]
        assert s.flag in param.opts
        if s.default is None:
            assert param.default is None, s.name
        else:
            assert config.convert_option(s.name, param.default, "default") == \
                config.convert_option(s.name, s.default, "default"), s.name


def test_job_config_has_a_field_per_driver_and_executor_setting_and_none_for_the_rest():
    names = {f.name for f in fields(config.JobConfig)}
    assert {s.name for s in settings.going_to("driver", "executor")} <= names
    # resolve() makes "model" (a ModelSpec), "input_manifest" (checked) and "output" (an Output) from their settings.
    made_from = {s.name for s in settings.going_to("resolve", "model", "preprocess")} & names
    assert made_from == {"model", "input_manifest", "output"}
    assert {"input_bucket", "input_prefix", "output", "preprocess"} <= names


def test_job_spec_has_a_field_per_executor_setting_with_the_tables_default():
    spec_fields = {f.name: f for f in fields(JobSpec)}
    for s in settings.going_to("executor"):
        assert spec_fields[s.name].default == s.library_default, s.name
    # The one default decided at run time: an executor always gets a number, the fallback by default.
    assert settings.BY_NAME["batch_size"].default == "auto" and spec_fields["batch_size"].default == 64
    # "handler" on an executor is the driver's shipped copy of --handler (JobConfig.handler_path).
    assert {s.name for s in settings.going_to("driver")} & set(spec_fields) == {"handler"}


def test_job_spec_carries_every_executor_setting_of_the_run_and_pickles():
    cfg = resolved(io_threads=3, s3_reader="botocore", micro_batch_size=8, top_k=2, s3_max_attempts=7, batch_size=128)
    spec = cfg.job_spec()
    for s in settings.going_to("executor"):
        assert getattr(spec, s.name) == getattr(cfg, s.name), s.name
    assert pickle.loads(pickle.dumps(spec)) == spec  # as Spark ships it to the executors
    assert type(spec).__module__ == "mxjob.executor.partition" and type(spec).__qualname__ == "JobSpec"


def test_a_new_setting_reaches_every_destination_from_its_declaration_alone(monkeypatch):
    """What docs/layout.md promises: declare it in SETTINGS, run make docs, and every layer has it."""
    extra = settings.Setting("decode_threads", ("--decode-threads",), "tuning", "Test only.", default=3,
                             type=option_types.WholeNumber(min=1), to="executor", fingerprint=True, task="detect")
    monkeypatch.setattr(settings, "SETTINGS", (*settings.SETTINGS, extra))
    # The command line (and so --help): its option, typed.
    [option] = [o for o in settings.click_options() if o.name == "decode_threads"]
    assert option.opts == ["--decode-threads"] and option.type.convert("5", None, None) == 5
    # The YAML layer converts through the same option: a whole number, refused otherwise.
    monkeypatch.setattr(config, "PARAMS", {**config.PARAMS, "decode_threads": option})
    monkeypatch.setattr(config, "DEFAULTS", {**config.DEFAULTS, "decode_threads": 3})
    merged = config.merge_settings({}, {**BASE, "decode_threads": 7})
    assert merged["decode_threads"] == 7
    with pytest.raises(click.BadParameter, match="is not a whole number"):
        config.merge_settings({}, {**BASE, "decode_threads": 2.5})
    # JobConfig, as mxjob.options.config makes it.
    cfg_cls = settings.make_settings_dataclass("JobConfig", config.JobConfig.__mro__[1],
                                               settings.going_to("driver", "executor"), "mxjob.options.config",
                                               with_defaults=False)
    assert "decode_threads" in {f.name for f in fields(cfg_cls)}
    # JobSpec, from the constants make docs generates (the executors read no table).
    generated: dict = {}
    exec(settings_docs.constants_text((ROOT / "mxjob" / "core" / "constants.py").read_text()), generated)
    assert generated["EXECUTOR_SETTINGS"][-1] == "decode_threads" and generated["DEFAULT"].decode_threads == 3
    spec_cls = partition.job_spec_class(generated["EXECUTOR_SETTINGS"], generated["DEFAULT"])
    assert spec_cls(model=None, preprocess=None, bucket="b").decode_threads == 3
    # Its one task: refused with another, in that task's fingerprint only.
    assert {s.name: s.task for s in settings.SETTINGS if s.task}["decode_threads"] == "detect"  # as TASK_ONLY is
    assert extra.in_fingerprint({"task": "detect"}) and not extra.in_fingerprint({"task": "classify"})
    # The docs and conf/defaults.yaml.
    assert "`--decode-threads`" in settings_docs.options_markdown()
    assert "decode_threads: 3" in settings_docs.defaults_yaml()


@pytest.mark.parametrize(("record", "destination"), [(mxinfer.Preprocess, "preprocess"), (mxinfer.ModelSpec, "model")])
def test_the_recipe_and_the_model_records_hold_their_settings_with_the_jobs_defaults(record, destination):
    """Preprocess and ModelSpec are declared with their docs; this fails when they drift from the table."""
    declared = {f.name: f.default for f in fields(record)}
    for s in settings.going_to(destination):
        assert s.name in declared, f"{record.__name__} has no field for the {destination} setting {s.name}"
        assert declared[s.name] == s.library_default, s.name
    if record is mxinfer.Preprocess:  # the recipe is its settings, nothing more: the fingerprint holds it whole
        assert list(declared) == [s.name for s in settings.going_to("preprocess")]


def test_task_only_settings_say_their_task_once():
    assert settings.TASK_ONLY == {"top_k": "classify", "output_layer": "embed", "embedding_dtype": "embed",
                                  "normalize": "embed", "min_score": "detect", "max_detections": "detect"}
    values = {s.name: s.default for s in settings.SETTINGS}
    for task in ("classify", "embed", "detect"):
        held = {s.name for s in settings.SETTINGS if s.task and s.in_fingerprint({**values, "task": task})}
        assert held == {name for name, only in settings.TASK_ONLY.items() if only == task}


def test_model_udf_takes_the_recipe_and_the_model_as_their_records():
    parameters = inspect.signature(mxinfer.model_udf).parameters
    assert list(parameters) == ["model", "preprocess", "batch_size", "top_k", "context"]
    assert parameters["batch_size"].default == settings.BY_NAME["batch_size"].library_default
    assert parameters["top_k"].default == settings.BY_NAME["top_k"].library_default


def test_the_library_defaults_are_the_jobs():
    # The job's batch size is chosen at run time (auto); the library's is the number the job chooses when
    # it measures nothing, so compare against a run that measures nothing.
    cfg, _ = sizing.size_run(resolved(estimate_images=0), images=[], to_score=100)
    assert resolved().batch_size == "auto" and cfg.batch_size == 64
    assert mxinfer.Preprocess() == cfg.preprocess
    spec = mxinfer.ModelSpec("s", "p")
    assert (spec.data_name, spec.context, spec.s3_max_attempts) == (cfg.model.data_name, cfg.model.context,
                                                                   cfg.s3_max_attempts)
    for cls in (mxinfer.Predictor, mxinfer.Classifier, mxinfer.ImageClassifier):
        signature = inspect.signature(cls.__init__)
        assert signature.parameters["input_shape"].default == cfg.preprocess.input_shape
        assert signature.parameters["batch_size"].default == cfg.batch_size
    assert inspect.signature(mxinfer.Classifier.classify).parameters["top_k"].default == cfg.top_k
    assert inspect.signature(mxinfer.model_udf).parameters["batch_size"].default == cfg.batch_size
    library_spec = mxinfer.JobSpec(model=cfg.model, preprocess=mxinfer.Preprocess(), bucket="in")
    job_spec = cfg.job_spec()
    for s in settings.going_to("executor"):
        assert getattr(library_spec, s.name) == getattr(job_spec, s.name), s.name
    assert listing.DEFAULT_SUFFIXES == cfg.suffixes and parallel_list.LIST_CONCURRENCY == cfg.list_concurrency
    assert clients.S3_MAX_ATTEMPTS == cfg.s3_max_attempts


def test_the_fingerprint_holds_exactly_the_settings_the_table_marks():
    fp32 = resolved().line_settings()
    assert set(fp32) == {"data_name", "preprocess", "top_k", "max_object_bytes", "precision", "task"}
    assert fp32["preprocess"] == {s.name: s.default for s in settings.going_to("preprocess")}
    int8 = resolved(precision="int8", int8_exclude="conv0").line_settings()
    assert set(int8) - set(fp32) == {"calibration_images", "int8_exclude"}
    assert int8["int8_exclude"] == ("conv0",)
    # A setting that does not change a line (io_threads) is not in it, whatever its value; nor is the
    # batch size, so a --resume of an auto run that chose 1904 with --batch-size 64 (or auto again) matches.
    assert resolved(io_threads=2).line_settings() == fp32
    assert resolved(batch_size="auto").line_settings() == resolved(batch_size=1904).line_settings() == fp32
    # A task's own settings are in it for that task only.
    embed = resolved(task="embed", output_layer="flatten0", normalize=True).line_settings()
    assert set(embed) - set(fp32) == {"output_layer", "embedding_dtype", "normalize"}
    assert (embed["task"], embed["output_layer"], embed["normalize"]) == ("embed", "flatten0", True)
    detect = resolved(task="detect").line_settings()
    assert set(detect) - set(fp32) == {"min_score", "max_detections"}


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"to": "nowhere"}, "to must be one of"),
    ({"section": "misc"}, "section must be one of"),
    ({"to": "resolve", "fingerprint": True}, "cannot be in the fingerprint"),
])
def test_a_bad_declaration_is_refused_at_import(kwargs, match):
    declared = {"name": "x", "flags": ("--x",), "section": "run", "help": "x", **kwargs}
    with pytest.raises(ValueError, match=match):
        settings.Setting(**declared)


def test_help_lists_every_setting_in_table_order():
    options = [p for p in config.OPTIONS if isinstance(p, click.Option) and not p.hidden and p.name != "config_uri"]
    assert [p.name for p in options] == [s.name for s in settings.SETTINGS]


def test_the_table_is_in_section_order_so_the_tuning_options_come_last_in_help():
    order = [settings.SECTIONS.index(s.section) for s in settings.SETTINGS]
    assert order == sorted(order)
    assert {s.name for s in settings.SETTINGS[-7:]} == {"list_concurrency", "s3_reader", "io_threads", "max_in_flight",
                                                        "micro_batch_size", "threads", "forward_lanes"}
