"""``--batch-size auto``: the pure choice, its bounds, the option, and the driver's one measurement for it."""

from __future__ import annotations

import logging
from dataclasses import replace

import click
import pytest

from mxjob.options import config
from mxjob.planning import batchsize, estimate, sizing

BASE = {"input": "s3://in/photos/", "model": "s3://m/r18", "output": "s3://out/p.jsonl"}
#: Spark's per-task cost in these tests: known, so every expected batch is arithmetic.
OVERHEAD = 0.2


def choose(per_image, keys=1_000_000, executors=2, micro=16, **kwargs):
    return batchsize.choose_batch_size(per_image, OVERHEAD, executors, keys, micro, **kwargs)


def test_a_fast_model_gets_a_larger_batch_than_a_slow_one():
    fast, slow = choose(0.002), choose(0.05)
    # 19 x 0.2 s / 2 ms = 1900 -> 1904; 19 x 0.2 s / 50 ms = 76 -> 80: multiples of the micro-batch 16.
    assert (fast.chosen, slow.chosen) == (1904, 80)
    assert fast.chosen > slow.chosen


@pytest.mark.parametrize("per_image", [0.0005, 0.002, 0.01, 0.05, 0.3])
def test_the_chosen_batch_keeps_the_task_overhead_within_five_percent(per_image):
    choice = choose(per_image, maximum=10**6)
    assert choice.overhead_share <= batchsize.OVERHEAD_SHARE
    # ... and is the smallest multiple of the micro-batch that does.
    smaller = batchsize.BatchChoice(choice.chosen - 16, "auto", "", per_image, OVERHEAD)
    assert choice.chosen == 16 or smaller.overhead_share > batchsize.OVERHEAD_SHARE


@pytest.mark.parametrize("micro", [1, 7, 16, 32])
def test_the_batch_is_a_multiple_of_the_micro_batch_and_never_below_it(micro):
    for per_image in (0.0001, 0.003, 0.04, 5.0):
        chosen = choose(per_image, micro=micro).chosen
        assert chosen % micro == 0 and chosen >= micro, (per_image, chosen)


def test_a_very_slow_model_gets_one_micro_batch():
    choice = choose(5.0)
    assert choice.chosen == 16 and choice.why.startswith("one micro-batch: ") and "of 5000 ms" in choice.why


def test_a_very_fast_model_is_capped_at_the_maximum():
    choice = choose(0.00001)  # would need 380,000 images a task
    assert choice.chosen == batchsize.MAX_BATCH and "largest batch auto picks" in choice.why


def test_the_batch_leaves_several_batches_for_every_executor():
    # 20,000 keys on 10 executors: at most 20,000 / (4 x 10) = 500 -> 496 a batch, not the 1,904 the overhead wants.
    choice = choose(0.002, keys=20_000, executors=10)
    assert choice.chosen == 496 and "10 executors get 4 batches each: 20000 / 40 images" in choice.why
    assert -(-20_000 // choice.chosen) >= batchsize.WAVES * 10


def test_an_input_too_small_for_the_waves_gets_one_micro_batch_a_task():
    assert choose(0.002, keys=50, executors=4).chosen == 16


def test_an_executor_of_several_forward_lanes_gets_a_micro_batch_for_each_lane():
    """One micro-batch a task would leave the other lanes' threads idle: a 64-image run on one executor of two
    lanes (local-cluster[1,1,...] on 2 vCPUs) took 0.7 s a task of 16 where 32 took 0.8 s."""
    small = batchsize.choose_batch_size(0.03, 0.25, 1, 64, 16, lanes=2)
    assert small.chosen == 32 and "the micro-batch 16 times the executors' 2 forward lanes (32)" in small.why
    slow = batchsize.choose_batch_size(10.0, 0.25, 1, 100_000, 16, lanes=4)
    assert slow.chosen == 64 and slow.why.startswith("one micro-batch for each of the executors' 4 forward lanes")
    assert batchsize.choose_batch_size(0.002, 0.2, 2, 100_000, 16, lanes=4).chosen % 64 == 0
    assert batchsize.choose_batch_size(0.03, 0.25, 1, 64, 16).chosen == 16  # one lane: as before


def test_the_run_sizes_batches_for_the_executors_forward_lanes(measured):
    # One node of 2 vCPUs, one executor of 2 threads: two lanes of one thread (mxjob.model.worker.worker_lanes).
    cfg, _ = sizing.size_run(resolved(estimate_cluster="1x2"), KEYS[:64], 64)
    assert cfg.batch_size == 32
    cfg, _ = sizing.size_run(resolved(estimate_cluster="1x2", forward_lanes=1), KEYS[:64], 64)
    assert cfg.batch_size == 16


def test_a_bad_measurement_is_refused():
    with pytest.raises(ValueError, match="must be positive"):
        choose(0.0)


# ----------------------------------------------------------------------------
# The option


@pytest.mark.parametrize(("given", "value"), [("auto", "auto"), ("AUTO", "auto"), ("128", 128), (128, 128),
                                              (8.0, 8)])
def test_batch_size_takes_a_whole_number_or_auto(given, value):
    assert config.convert_option("batch_size", given, "--batch-size") == value


@pytest.mark.parametrize(("given", "message"), [
    ("0", "0 is not in the range 1<=x<=100000; give a whole number of at least 1 and at most 100,000, or auto"),
    ("abc", "'abc' is not a valid integer; give a whole number of at least 1 and at most 100,000, or auto"),
    (8.9, "8.9 is not a whole number; give a whole number of at least 1 and at most 100,000, or auto"),
])
def test_batch_size_refuses_anything_else_naming_both_forms(given, message):
    with pytest.raises(click.BadParameter, match=message):
        config.convert_option("batch_size", given, "--batch-size")


def test_batch_size_auto_from_the_command_line_and_the_yaml(runner, tmp_path, monkeypatch):
    import infer_main

    ran = []
    monkeypatch.setattr(infer_main, "run_job", lambda cfg, **_: ran.append(cfg) or 0)
    args = [f"--{k}={v}" for k, v in BASE.items()]
    (tmp_path / "job.yaml").write_text("batch_size: auto\n")
    for extra in (["--batch-size", "auto"], ["--batch-size", "128"], ["--config", str(tmp_path / "job.yaml")], []):
        result = runner.invoke(infer_main.main, [*args, *extra])
        assert result.exit_code == 0, result.output
    assert [cfg.batch_size for cfg in ran] == ["auto", 128, "auto", "auto"]
    result = runner.invoke(infer_main.main, [*args, "--batch-size", "0"])
    assert result.exit_code == 2 and "give a whole number of at least 1 and at most 100,000, or auto" in result.output


# ----------------------------------------------------------------------------
# The driver: one measurement for the batch and the estimate


def resolved(**changes):
    return config.resolve(config.merge_settings({**BASE, **changes}, {}))


@pytest.fixture
def measured(monkeypatch):
    """The driver's sample measurement faked with a known cost; returns the list of samples it was given."""
    calls = []

    def fake_measure(job, items, endpoint_url):
        calls.append((job.batch_size, list(items)))
        return sizing.SampleCost(images=len(items), scored=len(items), cpu_seconds_per_image=0.002,
                                   s3_server_cpu_seconds_per_image=0.0, model_load_seconds=1.0)

    monkeypatch.setattr(sizing, "measure", fake_measure)
    monkeypatch.setattr(estimate, "TASK_OVERHEAD_SECONDS", OVERHEAD)  # the expected batches are arithmetic
    return calls


KEYS = [(f"k{i:06d}", 100) for i in range(100_000)]


def test_auto_measures_once_and_the_estimate_uses_the_chosen_batch(measured, caplog):
    cfg = resolved(batch_size="auto", estimate_cluster="2x1", micro_batch_size=16)
    with caplog.at_level(logging.INFO, logger="mxjob.planning.sizing"):
        chosen_cfg, sized = sizing.size_run(cfg, KEYS, len(KEYS))
    [(bound, sample)] = measured  # one measurement, bound at the micro-batch, for both
    assert bound == 16 and len(sample) == cfg.estimate_images
    assert chosen_cfg.batch_size == sized.choice["chosen"] == 1904 and sized.choice["requested"] == "auto"
    assert chosen_cfg.job_spec().batch_size == 1904  # what the executors get: a number
    assert sized.estimate["batches"] == -(-len(KEYS) // 1904)
    assert "batch size 1904: 5% of a task for Spark's 0.2 s per task needs 1900 images of 2 ms" in caplog.text


def test_a_given_batch_size_is_kept_and_still_measured_for_the_estimate(measured):
    cfg, sized = sizing.size_run(resolved(batch_size=128, estimate_cluster="2x1"), KEYS, len(KEYS))
    assert cfg.batch_size == sized.choice["chosen"] == 128 and sized.choice["why"] == "--batch-size 128"
    assert sized.choice["per_image_seconds"] == pytest.approx(0.002) and len(measured) == 1


def test_the_per_image_time_is_the_cpu_over_each_executors_threads(measured):
    # 4 nodes of 8 vCPUs, one executor of 8 threads each: 2 ms of CPU an image is 0.25 ms on an executor.
    _, sized = sizing.size_run(resolved(estimate_cluster="4x8"), KEYS, len(KEYS))
    assert sized.choice["per_image_seconds"] == pytest.approx(0.00025)
    # The overhead wants 19 x 0.2 s / 0.25 ms = 15,200; 100,000 / (4 waves x 4 executors) = 6250 -> 6240; at most 4096.
    assert sized.choice["chosen"] == 4096
    # The same 32 vCPUs as 32 executors of one thread: 2 ms an image, 100,000 / (4 waves x 32) = 781 -> 768.
    _, sized = sizing.size_run(resolved(estimate_cluster="32x1"), KEYS, len(KEYS))
    assert sized.choice["per_image_seconds"] == pytest.approx(0.002)
    assert sized.choice["chosen"] == 768


def test_a_small_runs_sample_is_a_sixteenth_of_its_keys_never_under_eight_in_whole_forward_passes(measured):
    # 32 of 128 keys would score a quarter of the run on the driver before Spark's executors get it; its
    # eighth (8) is rounded up to a whole micro-batch (16), which costs the same forward pass.
    sizing.size_run(resolved(estimate_cluster="2x1"), KEYS[:128], 128)
    sizing.size_run(resolved(estimate_cluster="2x1"), KEYS[:40], 40)
    sizing.size_run(resolved(estimate_cluster="2x1"), KEYS[:1000], 1000)
    sizing.size_run(resolved(estimate_cluster="2x1", estimate_images=4), KEYS[:40], 40)
    assert [len(sample) for _, sample in measured] == [16, 16, 32, 4]
    # Spread over the listing as before: the i * n // count-th keys.
    assert [key for key, _ in measured[0][1]] == [f"k{i:06d}" for i in range(0, 128, 8)]


def test_auto_without_a_measurement_falls_back_to_the_librarys_batch(measured):
    cfg, sized = sizing.size_run(resolved(estimate_images=0), KEYS, len(KEYS))
    assert cfg.batch_size == batchsize.FALLBACK == 64 and not measured
    assert "--estimate-images 0 measures nothing" in sized.choice["why"] and sized.estimate is None


def test_auto_when_no_sample_image_could_be_scored_falls_back(monkeypatch):
    monkeypatch.setattr(sizing, "measure", lambda job, items, url: sizing.SampleCost(
        images=len(items), scored=0, cpu_seconds_per_image=0.0001, s3_server_cpu_seconds_per_image=0.0,
        model_load_seconds=1.0))
    cfg, sized = sizing.size_run(resolved(estimate_cluster="1x2"), KEYS, len(KEYS))
    assert cfg.batch_size == 64 and "no sample image could be scored" in sized.choice["why"]


# ----------------------------------------------------------------------------
# The driver's model and sample, with the demo model on moto


def test_the_driver_loads_the_model_once_for_its_check_and_its_sample(moto_endpoint, demo_dir, monkeypatch):
    """The sample scores with the check's copy, from the process's cache; the check's load counts as the sample's."""
    from mxjob.core import state
    from mxjob.run import checks
    from tests.support.helpers import bucket_with_model

    bucket = "driver-loads"
    s3 = bucket_with_model(moto_endpoint, bucket, demo_dir / "model")
    pngs = sorted((demo_dir / "images").rglob("*.png"))[:8]
    keys = []
    for path in pngs:
        s3.put_object(Bucket=bucket, Key=f"imgs/{path.name}", Body=path.read_bytes())
        keys.append((f"imgs/{path.name}", path.stat().st_size))
    cfg = config.resolve(config.merge_settings(
        {"input": f"s3://{bucket}/imgs/", "model": f"s3://{bucket}/model/digits", "output": f"s3://{bucket}/o.jsonl",
         "endpoint_url": moto_endpoint, "input_shape": "3,32,32", "std": "255", "estimate_images": 8,
         "estimate_cluster": "2x1"}, {}))
    cfg = replace(cfg, input_bucket=bucket)
    monkeypatch.setattr(state, "models", state.ProcessCache("models", state.MAX_MODELS))
    monkeypatch.setattr(state, "counters", state.Counters())
    checked = checks.load_model_on_driver(cfg)
    assert (state.counters.model_loads, len(state.models)) == (1, 1)
    load_seconds = state.counters.model_load_seconds
    _, sized = sizing.size_run(cfg, keys, len(keys))
    assert state.counters.model_loads == 1  # the sample found the check's copy
    assert len(state.models) == 0  # and the driver keeps none for the run
    assert sized.estimate["sample_images"] == 8 and sized.estimate["model_load_seconds"] > load_seconds > 0
    assert checked.num_classes == 10


def test_the_checks_copy_stays_cached_only_for_a_sample_that_scores_with_it(moto_endpoint, demo_dir, monkeypatch):
    """int8's quantized model, or an embedding's found layer, is another model: the check's copy is dropped."""
    from mxjob.core import state
    from mxjob.run import checks
    from tests.support.helpers import bucket_with_model

    bucket = "driver-keeps"
    bucket_with_model(moto_endpoint, bucket, demo_dir / "model")
    cfg = config.resolve(config.merge_settings(
        {"input": f"s3://{bucket}/imgs/", "model": f"s3://{bucket}/model/digits", "output": f"s3://{bucket}/o.jsonl",
         "endpoint_url": moto_endpoint, "input_shape": "3,32,32", "std": "255"}, {}))
    monkeypatch.setattr(state, "models", state.ProcessCache("models", state.MAX_MODELS))
    checked = checks.load_model_on_driver(cfg)
    checks.keep_for_sample(cfg, checked)
    assert len(state.models) == 1
    quantized = replace(cfg, int8_model=replace(cfg.model, params_uri=f"s3://{bucket}/int8/digits-0000.params"))
    checks.keep_for_sample(quantized, checked)
    assert len(state.models) == 0
