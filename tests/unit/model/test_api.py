"""The library API: thread safety, flat memory, device choice and the device-keyed model cache."""

from __future__ import annotations

import threading
from dataclasses import replace
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import psutil
import pytest

import mxinfer
from demo import make_demo
from mxjob.core import state
from mxjob.executor import partition

SHAPE = make_demo.INPUT_SHAPE


def digit_batches(count: int) -> list[np.ndarray]:
    """``count`` batches of real digits, 1 to 6 rows each, so padding differs between them."""
    (_, _), (test_x, _) = make_demo.digits_split()
    arrays = [mxinfer.decode_image(make_demo.digit_png(img), make_demo.PREPROCESS) for img in test_x[:40]]
    return [np.stack(arrays[i * 5: i * 5 + 1 + i % 6]) for i in range(count)]


def test_one_instance_called_from_8_threads_at_once_gives_the_serial_results(logits_prefix):
    clf = mxinfer.Classifier(str(logits_prefix), SHAPE, batch_size=4)
    batches = digit_batches(8)
    serial_probs = [clf.probabilities(b) for b in batches]
    serial_top = [clf.classify(b, top_k=3) for b in batches]
    start = threading.Barrier(8)
    results: dict[int, list] = {}

    def worker(i):
        start.wait()  # all eight enter predict together
        results[i] = [(clf.probabilities(batches[i]), clf.classify(batches[i], top_k=3)) for _ in range(25)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == list(range(8))
    for i in range(8):
        for probs, top in results[i]:
            np.testing.assert_array_equal(probs, serial_probs[i])  # bit for bit, not merely close
            assert top == serial_top[i]


@pytest.fixture(scope="module")
def tiny_prefix(tmp_path_factory):
    """A one-layer classifier on 3x8x8 inputs: fast enough for 10,000 calls in a few seconds."""
    prefix = tmp_path_factory.mktemp("tiny") / "tiny"
    net = mx.sym.FullyConnected(mx.sym.Flatten(mx.sym.var("data")), num_hidden=10, name="fc")
    module = mx.mod.Module(net, data_names=["data"], label_names=[])
    module.bind(data_shapes=[("data", (1, 3, 8, 8))], for_training=False)
    mx.random.seed(0)
    module.init_params(mx.init.Xavier())
    arg_params, aux_params = module.get_params()
    mx.model.save_checkpoint(str(prefix), 0, net, arg_params, aux_params)
    return prefix


def test_memory_stays_flat_over_10000_calls(tiny_prefix):
    clf = mxinfer.Classifier(str(tiny_prefix), (3, 8, 8), batch_size=4)
    batch = np.random.RandomState(0).rand(3, 3, 8, 8).astype(np.float32)  # 3 rows: padded each call
    process = psutil.Process()
    for _ in range(500):  # warm-up: MXNet's memory pools and numpy's caches fill once
        clf.classify(batch, top_k=3)
    before = process.memory_info().rss
    for _ in range(10_000):
        clf.classify(batch, top_k=3)
    growth = process.memory_info().rss - before
    print(f"RSS {before / 2**20:.1f} MiB; growth over 10,000 calls: {growth / 2**20:.2f} MiB")
    assert growth < min(20 * 2**20, 0.05 * before), f"RSS grew by {growth / 2**20:.1f} MiB"


def test_model_summary_names_the_softmax_head(softmax_prefix):
    summary = mxinfer.Predictor(str(softmax_prefix), SHAPE, batch_size=2).model_summary()
    assert summary["head"] == "softmax" and summary["head_op"] == "SoftmaxOutput"
    assert summary["inputs"] == {"data": [3, 32, 32]}
    assert summary["outputs"] == {"softmax_output": [10]} and summary["num_classes"] == 10


# ----------------------------------------------------------------------------
# Devices


def gpus(*addresses):
    return {"gpu": SimpleNamespace(name="gpu", addresses=list(addresses))}


@pytest.mark.parametrize("requested, resources, index, count, expected", [
    ("cpu", gpus("1"), 5, 4, "cpu"),           # cpu stays cpu, whatever the node has
    ("gpu:2", gpus("1"), 5, 4, "gpu:2"),       # gpu:N pins, even against Spark's choice
    ("gpu", gpus("3"), 0, 4, "gpu:3"),         # the GPU Spark assigned to the task
    ("gpu", gpus("1", "2"), 0, 4, "gpu:1"),    # a task given two GPUs runs the model on the first
    ("gpu", {}, 6, 4, "gpu:2"),                # no GPU scheduling: partition modulo visible GPUs
    ("gpu", None, 7, 1, "gpu:0"),
    ("gpu", gpus(), 3, 2, "gpu:1"),            # an empty assignment counts as none
])
def test_choose_context(requested, resources, index, count, expected):
    assert mxinfer.choose_context(requested, resources, index, count) == expected


@pytest.mark.parametrize("requested, match", [
    ("gpu", "assigned this task no GPU and this process sees none"),
    ("tpu", "cpu, gpu or gpu:N"),
    ("gpu:x", "cpu, gpu or gpu:N"),
    ("cpu:0", "cpu, gpu or gpu:N"),
])
def test_choose_context_refuses(requested, match):
    with pytest.raises(ValueError, match=match):
        mxinfer.choose_context(requested, {}, 0, 0)


def test_task_context_outside_spark_on_this_gpu_less_machine():
    assert mxinfer.task_context("cpu") == "cpu"
    assert mxinfer.task_context("gpu:1") == "gpu:1"
    with pytest.raises(ValueError, match="sees none"):
        mxinfer.task_context("gpu")


LOADS: list[str] = []


class FakeModel:
    """Stands in for a Classifier: records the device of every load in LOADS."""

    def __init__(self, spec, input_shape, batch_size):
        self.spec = spec
        LOADS.append(spec.context)

    def model_summary(self):
        return {"head": "logits"}


def test_model_cache_keys_on_the_device():
    LOADS.clear()
    spec = mxinfer.ModelSpec.from_prefix("/nowhere/m")
    on = {ctx: replace(spec, context=ctx) for ctx in ("gpu:0", "gpu:1")}
    first = mxinfer.get_model(on["gpu:0"], SHAPE, 4, FakeModel)
    second = mxinfer.get_model(on["gpu:1"], SHAPE, 4, FakeModel)
    assert first is not second and LOADS == ["gpu:0", "gpu:1"]
    assert mxinfer.get_model(on["gpu:0"], SHAPE, 4, FakeModel) is first  # reused, not reloaded
    assert LOADS == ["gpu:0", "gpu:1"]


def test_a_second_lane_binds_lane_zeros_model_again_without_reading_its_files(logits_prefix, monkeypatch):
    from mxjob.s3 import reads

    read = []
    real_read = reads.read_uri
    monkeypatch.setattr(reads, "read_uri", lambda uri, client=None: read.append(uri) or real_read(uri, client))
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix))
    first = mxinfer.get_model(spec, SHAPE, 4, mxinfer.Classifier)
    files = list(read)
    assert spec.params_uri in files and spec.symbol_uri in files
    second = mxinfer.get_model(spec, SHAPE, 4, mxinfer.Classifier, lane=1)
    assert read == files  # nothing read again: not the weights, the graph or the labels
    assert second is not first and second._module is not first._module and second._lock is not first._lock
    assert mxinfer.get_model(spec, SHAPE, 4, mxinfer.Classifier, lane=1) is second  # cached as lane 0 is
    assert second.labels == first.labels and second.file_digests == first.file_digests
    batches = digit_batches(3)
    expected = [first.probabilities(b) for b in batches]
    # The copy's own executor gives lane 0's very numbers, also while lane 0 runs passes of its own at once.
    done = threading.Thread(target=lambda: [first.probabilities(b) for b in batches * 20])
    done.start()
    got = [second.probabilities(b) for b in batches * 20]
    done.join()
    for i, probs in enumerate(got):
        np.testing.assert_array_equal(probs, expected[i % 3])


class Loaded(Exception):
    """Stops score_partition right after it chose the model's device."""


@pytest.mark.parametrize("resources, visible, index, expected", [
    (gpus("1"), 4, 0, "gpu:1"),   # Spark's GPU scheduling decides
    ({}, 2, 3, "gpu:1"),          # else partition 3 of 2 visible GPUs
])
def test_the_job_runs_each_task_on_the_gpu_chosen_for_it(monkeypatch, resources, visible, index, expected):
    task = SimpleNamespace(resources=lambda: resources, partitionId=lambda: index, attemptNumber=lambda: 0)
    monkeypatch.setattr(state, "spark_task", lambda: task)
    monkeypatch.setattr(mx.context, "num_gpus", lambda: visible)
    chosen = []

    def fake_get_model(spec, input_shape, batch_size, kind, lane=0):
        chosen.append(spec.context)
        raise Loaded

    monkeypatch.setattr(partition, "get_model", fake_get_model)
    spec = mxinfer.ModelSpec.from_prefix("/nowhere/m", context="gpu")
    job = mxinfer.JobSpec(model=spec, preprocess=mxinfer.Preprocess(SHAPE), bucket="b")
    with pytest.raises(mxinfer.ModelError, match="Loaded"):
        list(mxinfer.score_partition(index, [], job))
    assert chosen == [expected]
