"""The model side: loading checks, softmax vs logits, top-k, padding, the per-worker cache."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from PIL import Image

import mxinfer
from demo import make_demo
from mxjob.core import state
from mxjob.outputs import merge
from tests.support.helpers import scored_lines

SHAPE = make_demo.INPUT_SHAPE
ROOT = Path(__file__).resolve().parents[3]


def digit_batch(n: int, seed: int = 0) -> np.ndarray:
    (_, _), (test_x, _) = make_demo.digits_split()
    picks = np.random.RandomState(seed).choice(len(test_x), n, replace=False)
    return np.stack([mxinfer.decode_image(make_demo.digit_png(test_x[i]), make_demo.PREPROCESS) for i in picks])


def test_top_classes_orders_by_probability_and_breaks_ties_by_class_id():
    probs = np.array([[0.1, 0.3, 0.3, 0.2, 0.1]])
    assert mxinfer.top_classes(probs, 3) == [[(1, 0.3), (2, 0.3), (3, 0.2)]]
    assert len(mxinfer.top_classes(probs, 10)[0]) == 5


def test_top_classes_are_the_first_k_of_a_stable_sort_of_every_row_ties_and_all():
    rng = np.random.RandomState(0)
    for trial in range(200):
        classes, k = int(rng.choice([1, 2, 7, 1000])), int(rng.randint(0, 9))
        probs = rng.rand(int(rng.randint(1, 17)), classes)
        if trial % 2:  # many ties, across the k-th value too
            probs = np.round(probs, 1)
        if trial % 7 == 0:
            probs[:] = 0.25
        order = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        assert mxinfer.top_classes(probs, k) == [[(int(c), float(row[c])) for c in idx]
                                                 for row, idx in zip(probs, order)], (trial, classes, k)


def test_softmax_rows_sum_to_one_and_survive_large_logits():
    out = mxinfer.softmax(np.array([[1000.0, 1001.0, 999.0], [0.0, 0.0, 0.0]]))
    np.testing.assert_allclose(out.sum(axis=1), 1.0)
    np.testing.assert_allclose(out[1], 1 / 3)
    assert out[0].argmax() == 1


def test_parse_labels_drops_synset_ids_and_trailing_blank_lines():
    text = "n01440764 tench, Tinca tinca\nn02123045 tabby, tabby cat\nplain label\n\n"
    assert mxinfer.parse_labels(text) == ["tench, Tinca tinca", "tabby, tabby cat", "plain label"]


def test_softmax_head_and_logits_head_give_the_same_probabilities(logits_prefix, softmax_prefix):
    logits = mxinfer.Classifier(str(logits_prefix), SHAPE, batch_size=8)
    softmax = mxinfer.Classifier(str(softmax_prefix), SHAPE, batch_size=8)
    assert logits.model_summary()["head"] == "logits"
    assert softmax.model_summary()["head"] == "softmax"
    assert "softmax_label" in softmax._symbol.list_arguments()
    batch = digit_batch(5)
    p_logits, p_softmax = logits.probabilities(batch), softmax.probabilities(batch)
    np.testing.assert_allclose(p_logits.sum(axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(p_logits, p_softmax, atol=1e-5)


def test_predict_pads_and_splits_yet_each_row_equals_its_result_alone(logits_prefix):
    predictor = mxinfer.Predictor(str(logits_prefix), SHAPE, batch_size=4)
    batch = digit_batch(11)
    together = predictor.predict(batch)[0]
    assert together.shape == (11, 10)
    for i in (0, 5, 10):
        alone = predictor.predict(batch[i: i + 1])[0]
        np.testing.assert_allclose(alone[0], together[i], rtol=1e-5, atol=1e-5)
    assert predictor.predict(np.zeros((0, *SHAPE), np.float32))[0].shape == (0, 10)


# docs/library.md quotes this bound. oneDNN picks its kernels by batch size, so another batch size sums in
# another order; measured on 64 demo digits, batch sizes 8 and 32: at most 5.1e-7 (every row differs a little).
BATCH_SIZE_PROBABILITY_BOUND = 1e-5


@pytest.mark.parametrize("head", ["logits_prefix", "softmax_prefix"])
def test_another_batch_size_gives_the_same_classes_and_probabilities_within_the_documented_bound(request, head):
    prefix = request.getfixturevalue(head)
    batch = digit_batch(64)
    small, large = (mxinfer.Classifier(mxinfer.ModelSpec.from_prefix(str(prefix)), SHAPE, batch_size)
                    for batch_size in (8, 32))
    p8, p32 = small.probabilities(batch), large.probabilities(batch)
    # The same batch size twice is the same bytes: the resume tests compare outputs byte for byte.
    assert np.array_equal(p8, small.probabilities(batch)) and np.array_equal(p32, large.probabilities(batch))
    assert (p8.argmax(axis=1) == p32.argmax(axis=1)).all()
    assert np.abs(p8 - p32).max() < BATCH_SIZE_PROBABILITY_BOUND

def test_predict_reads_the_callers_array_in_place_leaves_it_writeable_and_sees_each_new_content(logits_prefix):
    predictor = mxinfer.Predictor(str(logits_prefix), SHAPE, batch_size=4)
    first, second = digit_batch(4, seed=1), digit_batch(4, seed=2)
    # A reference through MXNet's own copy of the input.
    module = predictor._module
    expected = []
    for batch in (first, second):
        module.forward(mx.io.DataBatch([mx.nd.array(batch)]), is_train=False)
        expected.append(module.get_outputs()[0].asnumpy())
    buffer = first.copy()
    np.testing.assert_array_equal(predictor.predict(buffer)[0], expected[0])
    assert buffer.flags.writeable  # DLPack's wrapping marks only a view read-only
    buffer[:] = second  # the same memory, new images: the next forward pass reads them, not a stale copy
    np.testing.assert_array_equal(predictor.predict(buffer)[0], expected[1])
    # An array that cannot be wrapped in place (not C-contiguous) is copied: the same result.
    strided = np.asfortranarray(second)
    assert not strided.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(predictor.predict(strided)[0], expected[1])


@pytest.mark.parametrize("array, match", [
    (np.zeros((3, 32, 32), np.float32), "4-d NCHW"),
    (np.zeros((2, 3, 28, 28), np.float32), r"expected shape \(N, 3, 32, 32\)"),
    (np.zeros((2, 3, 32, 32), np.float64), "expected dtype float32"),
])
def test_predict_rejects_wrong_rank_shape_and_dtype(logits_prefix, array, match):
    predictor = mxinfer.Predictor(str(logits_prefix), SHAPE, batch_size=2)
    with pytest.raises(ValueError, match=match):
        predictor.predict(array)


def test_classifier_labels_come_from_synset_beside_the_model(logits_prefix):
    clf = mxinfer.Classifier(str(logits_prefix), SHAPE, batch_size=2)
    assert clf.labels == make_demo.LABELS
    [row] = clf.classify(digit_batch(1), top_k=3)
    assert len(row) == 3 and row[0][1] == make_demo.LABELS[row[0][0]]
    assert row[0][2] >= row[1][2] >= row[2][2]


def test_without_synset_predictions_have_class_ids_only(tmp_path, logits_prefix):
    for suffix in ("-symbol.json", "-0000.params"):
        shutil.copy(f"{logits_prefix}{suffix}", tmp_path / f"m{suffix}")
    clf = mxinfer.Classifier(str(tmp_path / "m"), SHAPE, batch_size=2)
    assert clf.labels is None
    [line] = scored_lines(clf, ["k"], list(digit_batch(1)), top_k=2)
    entries = json.loads(line)["predictions"]
    assert len(entries) == 2 and all(set(entry) == {"class_id", "probability"} for entry in entries)


def test_image_classifier_takes_bytes_paths_and_pil_images(tmp_path, logits_prefix):
    clf = mxinfer.ImageClassifier(str(logits_prefix), SHAPE, batch_size=4, preprocess=make_demo.PREPROCESS)
    (_, _), (test_x, _) = make_demo.digits_split()
    png = make_demo.digit_png(test_x[0])
    path = tmp_path / "digit.png"
    path.write_bytes(png)
    results = clf.classify_images([png, str(path), Image.open(io.BytesIO(png))], top_k=2)
    assert results[0] == results[1]
    assert [c for c, _, _ in results[2]] == [c for c, _, _ in results[0]]


def save_params(prefix, arg_params: dict, aux_params: dict) -> None:
    saved = {f"arg:{k}": v for k, v in arg_params.items()}
    saved.update({f"aux:{k}": v for k, v in aux_params.items()})
    mx.nd.save(f"{prefix}-0000.params", saved)


def test_missing_weight_is_an_error_even_with_a_softmax_label(tmp_path, softmax_prefix):
    _sym, args, aux = mx.model.load_checkpoint(str(softmax_prefix), 0)
    dropped = sorted(args)[0]
    del args[dropped]
    shutil.copy(f"{softmax_prefix}-symbol.json", tmp_path / "m-symbol.json")
    save_params(tmp_path / "m", args, aux)
    with pytest.raises(mxinfer.ModelError, match=f"lacks 1 weight.*{dropped}"):
        mxinfer.Classifier(str(tmp_path / "m"), SHAPE, batch_size=2)


def test_input_shape_the_model_rejects_is_named(logits_prefix):
    with pytest.raises(mxinfer.ModelError, match=r"\(3, 64, 64\)"):
        mxinfer.Classifier(str(logits_prefix), (3, 64, 64), batch_size=2)


def test_unknown_input_name_lists_the_real_inputs(logits_prefix):
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix), data_name="image")
    with pytest.raises(mxinfer.ModelError, match=r"no input named 'image'; its inputs are \['data'\]"):
        mxinfer.Classifier(spec, SHAPE, batch_size=2)


def test_labels_file_with_the_wrong_line_count_is_refused(tmp_path, logits_prefix):
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix), labels_uri=str(labels))
    with pytest.raises(mxinfer.ModelError, match="has 3 lines but the model has 10 classes"):
        mxinfer.Classifier(spec, SHAPE, batch_size=2)


def test_corrupt_params_file_is_a_model_error(tmp_path, logits_prefix):
    shutil.copy(f"{logits_prefix}-symbol.json", tmp_path / "m-symbol.json")
    (tmp_path / "m-0000.params").write_bytes(b"not a params file")
    with pytest.raises(mxinfer.ModelError, match="cannot load checkpoint"):
        mxinfer.Classifier(str(tmp_path / "m"), SHAPE, batch_size=2)


def test_model_summary_describes_the_model(logits_prefix):
    summary = mxinfer.Predictor(str(logits_prefix), SHAPE, batch_size=2).model_summary()
    assert summary["inputs"] == {"data": [3, 32, 32]}
    assert summary["num_classes"] == 10
    assert summary["parameters"] > 100_000
    assert list(summary["outputs"].values()) == [[10]]


def test_a_classifiers_summary_names_the_labels_file_it_read_and_the_count(logits_prefix):
    beside = mxinfer.Classifier(str(logits_prefix), SHAPE, batch_size=2)  # --labels not given: synset.txt beside
    summary = beside.model_summary()
    assert summary["labels"] == str(logits_prefix.parent / "synset.txt") and summary["labels_count"] == 10
    none = mxinfer.Classifier(mxinfer.ModelSpec.from_prefix(str(logits_prefix), labels_uri=""), SHAPE, batch_size=2)
    assert (none.model_summary()["labels"], none.model_summary()["labels_count"]) == (None, 0)


def test_the_run_summary_names_the_labels_file_the_lines_used(logits_prefix):
    from mxjob.executor import stats
    from mxjob.options import config
    from mxjob.outputs import work_prefix
    from mxjob.reporting import summary

    cfg = config.resolve(config.merge_settings({"input": "s3://b/in/", "model": str(logits_prefix),
                                                "output": "s3://b/o.jsonl"}, {}))
    assert cfg.model.labels_uri is None  # not given: the summary must still name the file used
    classifier = mxinfer.Classifier(cfg.model, SHAPE, batch_size=2)
    made = summary.summarize(cfg, summary.RunOutcome(
        images=0, batches=0, fold=stats.StatsFold(), counts=merge.AssemblyCounts(), elapsed=1.0,
        model_summary=classifier.model_summary(), seconds={},
        workload=work_prefix.Workload(runs=[], todo=[], number=1, resumed=False), fingerprint={}))
    assert made["model"]["labels"] == str(logits_prefix.parent / "synset.txt")
    assert made["model"]["labels_count"] == 10


def test_get_classifier_loads_once_per_process_and_key(logits_prefix):
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix))
    before = state.counters.model_loads
    first = mxinfer.get_classifier(spec, SHAPE, 3)
    second = mxinfer.get_classifier(spec, SHAPE, 3)
    assert first is second
    assert state.counters.model_loads == before + 1
    other = mxinfer.get_classifier(spec, SHAPE, 5)
    assert other is not first and state.counters.model_loads == before + 2


def test_empty_labels_uri_skips_the_synset_beside_the_model(logits_prefix):
    spec = mxinfer.ModelSpec.from_prefix(str(logits_prefix), labels_uri="")
    assert mxinfer.Classifier(spec, SHAPE, batch_size=2).labels is None


def test_weight_of_the_wrong_shape_is_named(tmp_path, logits_prefix):
    _, args, aux = mx.model.load_checkpoint(str(logits_prefix), 0)
    name = next(n for n in sorted(args) if n.endswith("weight") and len(args[n].shape) == 2)
    args[name] = mx.nd.zeros((args[name].shape[0], args[name].shape[1] + 1))
    shutil.copy(f"{logits_prefix}-symbol.json", tmp_path / "m-symbol.json")
    save_params(tmp_path / "m", args, aux)
    with pytest.raises(mxinfer.ModelError, match=f"weight {name} has shape"):
        mxinfer.Classifier(str(tmp_path / "m"), SHAPE, batch_size=2)


def linear_model(prefix, shape=(3, 4, 4), classes: int = 3) -> str:
    """A logits model with no ReLU or pooling, so a NaN in the input reaches the scores."""
    data = mx.sym.var("data")
    mx.sym.FullyConnected(mx.sym.flatten(data), num_hidden=classes, name="fc").save(f"{prefix}-symbol.json")
    weights = mx.nd.array(np.random.RandomState(0).randn(classes, int(np.prod(shape))))
    save_params(prefix, {"fc_weight": weights, "fc_bias": mx.nd.zeros(classes)}, {})
    return str(prefix)


def test_non_finite_scores_fail_their_row_and_a_failed_forward_fails_the_batch(tmp_path):
    shape = (3, 4, 4)
    clf = mxinfer.Classifier(linear_model(tmp_path / "linear", shape), shape, batch_size=4)
    good = np.random.RandomState(1).rand(2, *shape).astype(np.float32)
    nan = np.full(shape, np.nan, np.float32)
    rows = [json.loads(line) for line in scored_lines(clf, ["a", "b", "c"], [good[0], nan, good[1]], top_k=2)]
    assert [(row["key"], "error" in row) for row in rows] == [("a", False), ("b", True), ("c", False)]
    assert rows[1] == {"key": "b", "error": {"stage": "predict", "type": "FloatingPointError",
                                             "message": "model output is not finite"}}
    # The good images get what they get alone.
    [alone] = scored_lines(clf, ["c"], [good[1]], top_k=2)
    assert rows[2] == json.loads(alone) and len(rows[2]["predictions"]) == 2
    # Arrays the model cannot take fail every key of the forward pass, with the reason.
    wrong = [json.loads(line) for line in scored_lines(clf, ["a", "b"], [np.zeros((3, 8, 8), np.float32)] * 2,
                                                       top_k=2)]
    assert ["error" in row for row in wrong] == [True, True]
    assert "expected shape" in wrong[0]["error"]["message"]


@pytest.mark.parametrize("wrong", [(1, *SHAPE[1:]), (SHAPE[0], SHAPE[1] - 4, SHAPE[2] - 4)])
def test_a_wrong_input_shape_names_the_shape_the_weights_fit(logits_prefix, wrong):
    wanted = ",".join(map(str, SHAPE))
    with pytest.raises(mxinfer.ModelError, match=f"its weights fit input shape {wanted} \\(C,H,W\\)"):
        mxinfer.Classifier(str(logits_prefix), wrong, batch_size=2)


def test_a_wrong_input_shape_names_the_shape_the_checkpoint_records(tmp_path):
    recorded = (3, 5, 6)  # not square and not a common size: only the record can name it
    data = mx.sym.var("data", shape=(1, *recorded))
    mx.sym.FullyConnected(mx.sym.flatten(data), num_hidden=2, name="fc").save(f"{tmp_path / 'm'}-symbol.json")
    save_params(tmp_path / "m", {"fc_weight": mx.nd.zeros((2, int(np.prod(recorded)))), "fc_bias": mx.nd.zeros(2)},
                {})
    with pytest.raises(mxinfer.ModelError, match="the checkpoint records input shape 3,5,6: set --input-shape"):
        mxinfer.Predictor(str(tmp_path / "m"), (3, 8, 8), batch_size=1)


def test_without_modules_hides_a_module_for_the_block_only(tmp_path, monkeypatch):
    from mxjob.model.worker import without_modules

    (tmp_path / "mxinfer_probe_module.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with without_modules("mxinfer_probe_module"):
        with pytest.raises(ImportError, match="mxinfer_probe_module"):
            import mxinfer_probe_module
    import mxinfer_probe_module

    assert mxinfer_probe_module.VALUE == 7
    with without_modules("mxinfer_probe_module"):  # already loaded: left as it is
        import mxinfer_probe_module as again
    assert again is mxinfer_probe_module


def test_a_fresh_process_imports_mxnet_without_scikit_learn_or_scipy_and_can_import_them_after():
    # scikit-learn and SciPy are installed here (the tests' photos); mxnet would load them and pandas.
    code = ("import sys; from mxjob.model.predictor import Predictor; from mxjob.model.worker import import_mxnet\n"
            "seconds = import_mxnet()\n"
            "print(seconds > 0, *(name in sys.modules for name in ('sklearn', 'scipy', 'pandas')))\n"
            "import mxnet.model, sklearn.base, scipy.stats\n"
            "print(mxnet.model.BASE_ESTIMATOR is object, sklearn.base.__name__, scipy.stats.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == ["True", "False", "False", "False", "True", "sklearn.base", "scipy.stats"]
