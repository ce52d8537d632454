"""--precision int8: the samples, the quantized checkpoint, and the agreement gate on a real pretrained model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import infer_main
import mxinfer
from demo import make_demo
from mxjob.core import errors
from mxjob.int8 import int8_prep
from mxjob.int8.int8 import agreement_refusal, int8_excluded, weight_layers
from mxjob.int8.int8_search import SearchResult, Trial
from mxjob.options import config
from tests.support.helpers import bucket_with_effnet

BASE = {"input": "s3://in/p/", "model": "s3://m/r", "output": "s3://o/k.jsonl"}


def test_samples_are_spread_over_the_listing_disjoint_and_the_same_every_time():
    images = [(f"k{i:03d}", 1) for i in range(100)]
    calibration, held_out = int8_prep.sample_keys(images, 10)
    assert (len(calibration), len(held_out)) == (10, 10)
    assert not set(calibration) & set(held_out)
    assert calibration[0] == images[0] and held_out[-1][0] >= "k090"  # from the first key to the last tenth
    assert int8_prep.sample_keys(images, 10) == (calibration, held_out)
    few_cal, few_held = int8_prep.sample_keys(images[:5], 10)
    assert sorted(few_cal + few_held) == images[:5]
    assert int8_prep.sample_keys(images[:1], 10) == (images[:1], images[:1])


def test_agreement_counts_top1_matches_and_the_largest_probability_difference():
    reference = np.eye(4)[[0, 1, 2, 3]] * 0.7 + 0.075
    candidate = reference.copy()
    candidate[3] = reference[2]  # one row of four disagrees on the top class
    figures = mxinfer.agreement(reference, candidate)
    assert figures["top1_agreement"] == 0.75 and figures["images"] == 4
    assert figures["max_probability_difference"] == pytest.approx(np.abs(reference - candidate).max())
    with pytest.raises(ValueError, match="one shape"):
        mxinfer.agreement(reference, candidate[:2])


#: The demo's figures in the report: int8 short of --min-agreement 0.99 on 60 held-out images.
DEMO_FIGURES = {"top1_agreement": 0.9833, "max_probability_difference": 0.2143, "images": 60}


def test_the_agreement_refusal_suggests_int8_exclude_auto_first_when_the_run_named_its_layers():
    message = agreement_refusal(DEMO_FIGURES, 0.99, ["conv0", "conv1", "fc"], 30)
    assert message.startswith("int8 agrees with fp32 on only 98.33% of top-1 classes (60 held-out images; "
                              "largest probability difference 0.2143), under --min-agreement 0.99. Nothing was "
                              "scored. Try --int8-exclude auto first")
    # The other ways out are still there, after it.
    rest = message[message.index("--int8-exclude auto"):]
    assert "with --int8-exclude (the first and last are conv0 and fc; patterns such as '*conv*' work)" in rest
    assert rest.endswith("more --calibration-images (this run calibrated on 30 and held out 60), "
                         "or --precision fp32")


def test_the_agreement_refusal_after_int8_exclude_auto_says_what_the_search_tried():
    chosen = Trial(["conv1"], "channel-wise", 60, 0.9917, 0.01, 1.4, passed=True)
    search = SearchResult(chosen=chosen, best=chosen, configurations_tried=7, seconds=0.4, stopped="agreed")
    message = agreement_refusal(DEMO_FIGURES, 0.99, ["conv0", "conv1", "fc"], 30, search)
    assert "Try --int8-exclude auto" not in message  # this run used it
    assert ("Nothing was scored. --int8-exclude auto tried 7 configurations in 0.4 s and chose layers 1 in fp32 "
            "(conv1) with channel-wise weight scales, which agreed on 99.17% of the 60 held-out images in its "
            "search") in message
    assert message.endswith("more --calibration-images (this run calibrated on 30 and held out 60), "
                            "or --precision fp32")


def test_int8_exclude_takes_names_and_patterns_and_names_the_layers_when_nothing_matches(logits_prefix):
    symbol_json = Path(f"{logits_prefix}-symbol.json").read_text()
    layers = weight_layers(symbol_json)
    assert layers and all(name in symbol_json for name in layers)
    assert int8_excluded(symbol_json, [layers[0], layers[0]]) == [layers[0]]
    assert int8_excluded(symbol_json, ["*"]) == layers
    with pytest.raises(mxinfer.ModelError, match=f"names no convolution .* its layers are {layers[0]}"):
        int8_excluded(symbol_json, ["no_such_layer"])


@pytest.mark.parametrize(("args", "message"), [
    ({"precision": "int4"}, "'int4' is not one of 'fp32', 'int8'"),
    ({"min_agreement": 1.5}, "1.5 is not in the range 0<=x<=1"),
    ({"calibration_images": 0}, "0 is not in the range 1<=x<=100000"),
    ({"precision": "int8", "context": "gpu"}, "int8 runs on CPUs"),
])
def test_int8_options_are_checked(args, message):
    with pytest.raises(infer_main.click.UsageError, match=message):
        config.resolve(config.merge_settings({**BASE, **args}, {}))


def test_int8_options_reach_the_config_and_the_executors():
    cfg = config.resolve(config.merge_settings(
        {**BASE, "precision": "int8", "calibration_images": 8, "min_agreement": 0.9, "int8_exclude": "a*,b"}, {}))
    assert (cfg.precision, cfg.calibration_images, cfg.min_agreement, cfg.int8_exclude) == ("int8", 8, 0.9, ("a*", "b"))
    assert cfg.job_spec().precision == "int8" and cfg.job_spec().model == cfg.model  # until the driver quantizes


def digit_arrays(count: int) -> np.ndarray:
    (_, _), (test_x, _) = make_demo.digits_split()
    return np.stack([mxinfer.decode_image(make_demo.digit_png(x), make_demo.PREPROCESS) for x in test_x[:count]])


def test_the_quantized_checkpoint_is_int8_but_for_excluded_layers_and_ships_its_files(logits_prefix, tmp_path):
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix))
    layers = weight_layers(Path(f"{logits_prefix}-symbol.json").read_text())
    arrays = digit_arrays(48)
    int8 = mxinfer.quantize_int8(spec, make_demo.INPUT_SHAPE, arrays[:24], str(tmp_path / "q"), [layers[-1]], 8)
    assert int8.shipped and int8.shipped_files() == [str(tmp_path / "q-symbol.json"), str(tmp_path / "q-0000.params")]
    graph = json.loads(Path(int8.symbol_uri).read_text())
    ops = [node["op"] for node in graph["nodes"]]
    assert "_contrib_quantize_v2" in ops  # the input is quantized
    quantized = [node for node in graph["nodes"] if node.get("attrs", {}).get("quantized") == "true"]
    assert quantized and all(layers[-1] not in node["name"] for node in quantized)
    fp32 = mxinfer.Classifier(spec, make_demo.INPUT_SHAPE, 8)
    figures = mxinfer.agreement(fp32.probabilities(arrays[24:]), mxinfer.Classifier(
        int8, make_demo.INPUT_SHAPE, 8).probabilities(arrays[24:]))
    assert figures["top1_agreement"] >= 0.9  # a trained model, quantized: mostly the same answers


# ----------------------------------------------------------------------------
# The gate on a real pretrained model (EfficientNet-Lite0) and real photos


@pytest.fixture(scope="module")
def real_world(moto_endpoint, tmp_path_factory):
    from demo import photos as images
    from demo import pretrained

    s3, _ = bucket_with_effnet(moto_endpoint, "int8-bucket", tmp_path_factory.mktemp("effnet"))
    for i, data in enumerate(images.photo_views(48, seed=3)):
        s3.put_object(Bucket="int8-bucket", Key=f"photos/{i:03d}.jpg", Body=data)
    return ["--endpoint-url", moto_endpoint, "--model", "s3://int8-bucket/model/effnet",
            "--input", "s3://int8-bucket/photos/", "--output", "s3://int8-bucket/out/p.jsonl",
            "--mean", pretrained.MEAN, "--std", pretrained.STD, "--precision", "int8", "--calibration-images", "24"]


def written_but_the_status(s3) -> list[str]:
    """What the runs wrote under out/ besides the status and report, which say why a refused run failed."""
    listed = s3.list_objects_v2(Bucket="int8-bucket", Prefix="out/").get("Contents", [])
    return [obj["Key"] for obj in listed if not obj["Key"].endswith((".status.json", ".report.html"))]


def test_int8_below_the_minimum_agreement_refuses_with_the_figures_and_what_to_try(real_world, s3, runner):
    result = runner.invoke(infer_main.main, real_world)
    assert result.exit_code == errors.EXIT_FAILED, result.output
    assert "int8 agrees with fp32 on only" in result.output and "24 held-out images" in result.output
    assert "under --min-agreement 0.99" in result.output
    assert "--int8-exclude" in result.output and "--precision fp32" in result.output
    assert written_but_the_status(s3) == []  # nothing was scored
    status = json.loads(s3.get_object(Bucket="int8-bucket", Key="out/p.jsonl.status.json")["Body"].read())
    assert status["state"] == "failed" and "int8 agrees with fp32 on only" in status["message"]


def test_int8_at_or_above_the_minimum_runs_on_the_quantized_model(real_world, runner):
    result = runner.invoke(infer_main.main, [*real_world, "--min-agreement", "0.5", "--dry-run"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert len(plan["sample"]["predictions"]) == 5


@pytest.mark.real_model
def test_int8_exclude_auto_on_the_real_model_passes_faster_or_refuses_with_the_best_it_found(real_world, s3, runner):
    # A short run for CI (24 held-out images, a 20 s budget); python -m bench.int8_search runs 200 for 120 s.
    result = runner.invoke(infer_main.main, [*real_world, "--int8-exclude", "auto", "--int8-search-seconds", "20",
                                             "--dry-run"])
    if result.exit_code == 0:
        chosen = re.search(r"chosen: layers .* top-1 agreement ([0-9.]+)% .* speed-up ([0-9.]+)x", result.output)
        assert chosen and float(chosen[1]) >= 99 and float(chosen[2]) >= 1.05, result.output
        return
    assert result.exit_code == errors.EXIT_FAILED, result.output
    assert "--int8-exclude auto found no int8 configuration" in result.output
    assert re.search(r"The best: layers .* top-1 agreement [0-9.]+%, speed-up [0-9.]+x\. Nothing was scored",
                     result.output), result.output
    assert written_but_the_status(s3) == []


def test_a_model_that_cannot_be_quantized_fails_with_what_to_do(monkeypatch, logits_prefix):
    def broken(*args, **kwargs):
        raise RuntimeError("MXNetError: unsupported operator\nstack...")

    monkeypatch.setattr(int8_prep, "quantize_int8", broken)
    cfg = config.resolve(config.merge_settings(
        {**BASE, "model": str(logits_prefix), "input_shape": "3,32,32", "precision": "int8"}, {}))
    classifier = mxinfer.Classifier(cfg.model, (3, 32, 32), 4)
    monkeypatch.setattr(int8_prep, "sample_arrays", lambda cfg, client, items: digit_arrays(len(items)))
    with pytest.raises(errors.JobError, match=r"cannot quantize the model to int8: MXNetError: unsupported "
                                                   r"operator; keep the layer .* --precision fp32"):
        int8_prep.prepare_precision(cfg, None, [(f"k{i}", 1) for i in range(40)], classifier)


def int8_job(monkeypatch, logits_prefix, **options):
    """A --precision int8 config on the demo model, and its classifier; the sample decodes to digits."""
    cfg = config.resolve(config.merge_settings(
        {**BASE, "model": str(logits_prefix), "input_shape": "3,32,32", "precision": "int8", **options}, {}))
    monkeypatch.setattr(int8_prep, "sample_arrays", lambda cfg, client, items: digit_arrays(len(items)))
    return cfg, mxinfer.Classifier(cfg.model, (3, 32, 32), 4)


@pytest.mark.parametrize("images, options, message", [
    (1, {"calibration_images": 1, "min_agreement": 1.0},
     r"too few held-out images to check int8 against fp32: 1, where at least 20 are needed; --calibration-images "
     r"1 held out 1 image; give --calibration-images 20 or more"),
    (30, {}, r"too few held-out images .*: 15, where at least 20 are needed; the input has 30 images, of which "
             r"half \(15\) were held out; int8 needs at least 40 images: use --precision fp32"),
    (1000, {"calibration_images": 5},
     r"too few held-out images .*: 5, where at least 20 are needed; --calibration-images 5 held out 5 images; "
     r"give --calibration-images 20 or more, or use --precision fp32"),
], ids=["one-image", "small-sample", "small-input"])
def test_a_held_out_sample_under_the_minimum_is_refused_before_quantizing(monkeypatch, logits_prefix, images,
                                                                          options, message):
    cfg, classifier = int8_job(monkeypatch, logits_prefix, **options)
    quantized = []
    monkeypatch.setattr(int8_prep, "quantize_int8", lambda *args, **kwargs: quantized.append(1))
    with pytest.raises(errors.JobError, match=message):
        int8_prep.prepare_precision(cfg, None, [(f"k{i:04d}", 1) for i in range(images)], classifier)
    assert quantized == []


def test_the_agreement_refusal_names_the_sample_actually_used(monkeypatch, logits_prefix):
    cfg, classifier = int8_job(monkeypatch, logits_prefix)  # --calibration-images 256, but 60 images listed
    monkeypatch.setattr(int8_prep, "quantize_int8", lambda spec, *args, **kwargs: spec)  # "int8" is fp32 itself
    monkeypatch.setattr(int8_prep, "agreement", lambda fp32, int8: {
        "top1_agreement": 0.9, "max_probability_difference": 0.3, "images": len(fp32)})
    with pytest.raises(errors.JobError, match=r"more --calibration-images \(this run calibrated on 30 and held "
                                              r"out 30\), or --precision fp32") as refused:
        int8_prep.prepare_precision(cfg, None, [(f"k{i:03d}", 1) for i in range(60)], classifier)
    assert "now 256" not in str(refused.value)
