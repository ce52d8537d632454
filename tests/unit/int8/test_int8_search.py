"""--int8-exclude auto: the search finds the layer int8 breaks, keeps to its budget, and refuses what is no faster."""

from __future__ import annotations

import numpy as np
import pytest

import mxinfer
from mxjob.core import errors
from mxjob.int8 import int8_prep, int8_search
from mxjob.options import config

SHAPE = (3, 32, 32)
CHANNELS = 32


def outlier_model(prefix: str) -> str:
    """Four conv layers and a dense one, random weights; int8 destroys ``conv1`` and no other layer.

    ``conv0``'s last channel has a bias that its ReLU always zeroes, and
    every ``conv1`` filter has weights of 1,000 on that channel: in fp32
    they multiply zeros and never count, but in int8 they set each filter's
    weight scale (per tensor or per channel alike), so that the real
    weights, about 0.1, all round to zero.
    """
    import mxnet as mx

    rng = np.random.RandomState(0)
    args = {}

    def conv(x, name, channels_in):
        args[f"{name}_weight"] = rng.normal(0, np.sqrt(2 / (9 * channels_in)), (CHANNELS, channels_in, 3, 3))
        args[f"{name}_bias"] = np.zeros(CHANNELS)
        return mx.sym.relu(mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=CHANNELS, name=name))

    x = conv(mx.sym.var("data"), "conv0", SHAPE[0])
    args["conv0_bias"][-1] = -50  # inputs in [-1, 1]: this channel's pre-activation never reaches 0
    x = conv(x, "conv1", CHANNELS)
    args["conv1_weight"][:, -1] = 1e3
    x = conv(conv(x, "conv2", CHANNELS), "conv3", CHANNELS)
    x = mx.sym.Flatten(mx.sym.Pooling(x, kernel=(1, 1), global_pool=True, pool_type="avg"))
    args["fc_weight"] = rng.normal(0, 1 / np.sqrt(CHANNELS), (10, CHANNELS))
    args["fc_bias"] = np.zeros(10)
    x = mx.sym.FullyConnected(x, num_hidden=10, name="fc")
    mx.model.save_checkpoint(prefix, 0, x, {k: mx.nd.array(v, dtype=np.float32) for k, v in args.items()}, {})
    return prefix


@pytest.fixture(scope="module")
def outlier_prefix(tmp_path_factory) -> str:
    return outlier_model(str(tmp_path_factory.mktemp("outlier") / "outlier"))


def auto_job(monkeypatch, prefix: str, **options):
    """A --precision int8 --int8-exclude auto config on ``prefix``, its classifier, and a 40 + 40 image sample."""
    cfg = config.resolve(config.merge_settings(
        {"input": "s3://in/p/", "output": "s3://o/k.jsonl", "model": prefix, "input_shape": "3,32,32",
         "precision": "int8", "int8_exclude": "auto", "calibration_images": 40, **options}, {}))

    def arrays(cfg, client, items):  # the same key always decodes to the same image
        return np.stack([np.random.RandomState(int(key[1:])).uniform(-1, 1, SHAPE).astype(np.float32)
                         for key, _ in items])

    monkeypatch.setattr(int8_prep, "sample_arrays", arrays)
    return cfg, mxinfer.Classifier(cfg.model, SHAPE, 4), [(f"k{i:03d}", 1) for i in range(80)]


def test_the_search_keeps_the_one_broken_layer_in_fp32_and_passes_the_gate(monkeypatch, outlier_prefix):
    # How much faster int8 runs depends on the CPU; test_a_configuration_no_faster_than_fp32_is_refused covers it.
    monkeypatch.setattr(int8_search, "MIN_SPEEDUP", 0.0)
    cfg, classifier, images = auto_job(monkeypatch, outlier_prefix)
    cfg, report = int8_prep.prepare_precision(cfg, None, images, classifier)
    search = report["search"]
    assert search["trials"][0]["excluded_layers"] == 0 and search["trials"][0]["top1_agreement"] < 0.5
    assert search["most_sensitive"][0]["layer"] == "conv1"
    assert "conv1" in report["excluded_layers"] and len(report["excluded_layers"]) <= 2
    assert report["top1_agreement"] >= 0.99 and report["images"] == 40  # the driver's own check, on the file
    assert cfg.int8_model.shipped and report["speedup"] == search["timing"]["speedup"]


def test_the_search_stops_at_its_budget_and_refuses_with_the_best_it_found(monkeypatch, outlier_prefix):
    monkeypatch.setattr(int8_search, "MIN_SPEEDUP", 0.0)
    cfg, classifier, images = auto_job(monkeypatch, outlier_prefix, int8_search_seconds=0)
    with pytest.raises(errors.JobError, match=r"--int8-exclude auto found no int8 configuration .* \(1 tried in "
                                              r"[0-9.]+ s on 40 held-out images; no time left to rank the layers\)\. "
                                              r"The best: layers none in fp32, tensor-wise weight scales, top-1 "
                                              r"agreement 0\.00%, speed-up [0-9.]+x\. Nothing was scored"):
        int8_prep.prepare_precision(cfg, None, images, classifier)


def test_a_configuration_no_faster_than_fp32_is_refused(monkeypatch, outlier_prefix):
    monkeypatch.setattr(int8_search, "MIN_SPEEDUP", 1e6)  # no int8 model is a million times faster
    cfg, classifier, images = auto_job(monkeypatch, outlier_prefix)
    with pytest.raises(errors.JobError, match=r"at least 1e\+06x faster .* no faster than fp32 with every layer "
                                              r"quantized\)\. The best: .* speed-up"):
        int8_prep.prepare_precision(cfg, None, images, classifier)


@pytest.mark.parametrize(("exclude", "granularity"), [((), "tensor-wise"), (("conv1", "fc"), "channel-wise")])
def test_one_calibration_quantizes_as_mxnets_own_naive_calibration_of_each_configuration(
        outlier_prefix, exclude, granularity):
    # Calibration collects the ranges once (MXNet's public Monitor) and quantizes each configuration with
    # MXNet's public quantize_graph and calib_graph: the graph and weights quantize_model_mkldnn makes when
    # it calibrates that configuration itself, on the same images.
    import mxnet as mx
    from mxnet.contrib.quantization import quantize_model_mkldnn

    symbol, args, aux = mx.model.load_checkpoint(outlier_prefix, 0)
    images = np.random.RandomState(1).uniform(-1, 1, (12, *SHAPE)).astype(np.float32)
    ours = int8_search.Calibration(symbol, args, aux, "data", images, 4).quantize(exclude, granularity)
    theirs = quantize_model_mkldnn(symbol, args, aux, data_names=("data",), label_names=(), ctx=mx.cpu(),
                                   excluded_sym_names=list(exclude), calib_mode="naive",
                                   calib_data=mx.io.NDArrayIter({"data": images}, batch_size=4),
                                   num_calib_examples=len(images), quantized_dtype="auto", quantize_mode="smart",
                                   quantize_granularity=granularity)
    assert ours[0].tojson() == theirs[0].tojson()
    assert sorted(ours[1]) == sorted(theirs[1])
    for name, array in ours[1].items():
        np.testing.assert_array_equal(array.asnumpy(), theirs[1][name].asnumpy(), err_msg=name)


@pytest.mark.parametrize("seconds, shown", [(0.4, "0.4 s"), (0.04, "0.04 s"), (7.3, "7.3 s"), (95.4, "95 s")])
def test_the_search_log_line_gives_a_sub_second_search_its_time_not_0s(seconds, shown):
    trial = int8_search.Trial(["conv1"], "tensor-wise", 40, 1.0, 0.0, 1.3, passed=True)
    result = int8_search.SearchResult(chosen=trial, best=trial, configurations_tried=7, seconds=seconds,
                                      stopped="agreed")
    assert f"int8 --int8-exclude auto: 7 configurations in {shown} (agreed)" in int8_search.describe(result)


def test_exclusion_steps_grow_by_about_a_third_and_stay_under_the_layer_count():
    assert int8_search.exclusion_steps(50) == [1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 28, 37, 49]
    assert int8_search.exclusion_steps(2) == [1] and int8_search.exclusion_steps(1) == []


def test_auto_is_a_value_of_int8_exclude_and_the_budget_an_option():
    cfg = config.resolve(config.merge_settings(
        {"input": "s3://in/p/", "output": "s3://o/k.jsonl", "model": "s3://m/r", "precision": "int8",
         "int8_exclude": "auto", "int8_search_seconds": 30}, {}))
    assert int8_search.is_auto(cfg.int8_exclude) and cfg.int8_search_seconds == 30
    assert not int8_search.is_auto(("auto", "conv0")) and not int8_search.is_auto(("conv0",))
