"""INT8 (``--precision int8``): post-training quantization with oneDNN, and how far it strays from fp32.

The driver quantizes once per job (``mxjob.int8.int8_prep.prepare_precision``),
calibrated on the job's own images, and refuses to run when int8 and fp32
disagree on more top-1 classes than ``--min-agreement`` allows.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from mxjob.core.errors import plural
from mxjob.int8 import int8_search
from mxjob.model.predictor import ModelError, ModelSpec

#: The layers oneDNN quantizes, by their op in the fp32 graph; --int8-exclude names them.
WEIGHT_OPS = ("Convolution", "FullyConnected")


def weight_layers(symbol_json: str) -> list[str]:
    """Names of the graph's convolution and fully connected layers, input first."""
    return [node["name"] for node in json.loads(symbol_json)["nodes"] if node["op"] in WEIGHT_OPS]


def int8_excluded(symbol_json: str, patterns: Sequence[str]) -> list[str]:
    """The layers ``patterns`` (shell-style, ``fnmatch``) name; a pattern naming none raises ``ModelError``."""
    import fnmatch

    layers = weight_layers(symbol_json)
    excluded: list[str] = []
    for pattern in patterns:
        matched = fnmatch.filter(layers, pattern)
        if not matched:
            shown = ", ".join([*layers[:3], "...", *layers[-2:]]) if len(layers) > 5 else ", ".join(layers)
            raise ModelError(f"--int8-exclude {pattern!r} names no convolution or fully connected layer of "
                             f"the model; its layers are {shown}")
        excluded.extend(name for name in matched if name not in excluded)
    return excluded


def quantize_int8(spec: ModelSpec, input_shape: tuple, calibration: np.ndarray, out_prefix: str,
                  exclude: Sequence[str] = (), batch_size: int = 16) -> ModelSpec:
    """Quantize a checkpoint to int8 with oneDNN, calibrated on ``calibration``; write it beside ``out_prefix``.

    MXNet's post-training quantization (``quantize_model_mkldnn``): the
    graph is fused for oneDNN, every convolution and fully connected layer
    but the ``exclude`` ones (:func:`int8_excluded`) gets int8 weights and
    inputs, and each layer's output range is the min and max it reached on
    the calibration images (``naive`` calibration: no scipy needed on the
    cluster). Deterministic for the same images.

    Parameters
    ----------
    spec : ModelSpec
        The fp32 checkpoint.
    input_shape : tuple of int
        ``(C, H, W)``.
    calibration : numpy.ndarray
        ``(N, C, H, W)`` float32 model inputs, preprocessed as the job does.
    out_prefix : str
        Writes ``out_prefix-symbol.json`` and ``out_prefix-0000.params``.
    exclude : sequence of str
        Layer names (of the fp32 graph) to keep in fp32.
    batch_size : int
        Images per calibration forward pass.

    Returns
    -------
    ModelSpec
        ``spec`` pointing at the int8 files (``shipped``, so a Spark job
        ships them with ``addFile``).
    """
    import mxnet as mx
    from mxnet.contrib.quantization import quantize_model_mkldnn

    symbol, arg_params, aux_params = int8_search.load_checkpoint(spec)
    label_names = [n for n in symbol.list_arguments() if n.endswith("_label")]
    data = mx.io.NDArrayIter({spec.data_name: calibration}, batch_size=min(batch_size, len(calibration)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Data provided by label_shapes")
        qsym, qargs, qaux = quantize_model_mkldnn(
            symbol, arg_params, aux_params, data_names=[spec.data_name], label_names=label_names, ctx=mx.cpu(),
            excluded_sym_names=list(exclude), calib_mode="naive", calib_data=data,
            num_calib_examples=len(calibration), quantized_dtype="auto", quantize_mode="smart")
    mx.model.save_checkpoint(out_prefix, 0, qsym, qargs, qaux)
    return replace(spec, symbol_uri=f"{out_prefix}-symbol.json", params_uri=f"{out_prefix}-0000.params", shipped=True)


#: Held-out images below which the agreement is not a check at all (one image "agrees 100%"): the job refuses.
#: With 20, one disagreement moves the figure by 5 points; a --min-agreement near 1 wants far more.
MIN_HELD_OUT = 20


def sample_too_small(held_out: int, sampled: int, calibration_images: int, listed: int) -> str | None:
    """Why ``held_out`` decoded images cannot check the agreement, with what to change; ``None`` when they can.

    ``sampled``: held-out keys picked (some may not decode); ``listed``: the
    job's keys, which cap the sample at half of them.
    """
    if held_out >= MIN_HELD_OUT:
        return None
    if sampled < calibration_images:
        cause = (f"the input has {plural(listed, 'image')}, of which half ({sampled}) were held out; int8 needs "
                 f"at least {2 * MIN_HELD_OUT} images: use --precision fp32")
    else:
        cause = (f"--calibration-images {calibration_images} held out {plural(sampled, 'image')}"
                 f"{f', of which {held_out} decoded' if held_out < sampled else ''}; give --calibration-images "
                 f"{MIN_HELD_OUT} or more, or use --precision fp32")
    return (f"--precision int8: too few held-out images to check int8 against fp32: {held_out}, where at least "
            f"{MIN_HELD_OUT} are needed; {cause}")


def agreement_refusal(figures: dict, min_agreement: float, layers: Sequence[str], calibrated: int,
                      search: int8_search.SearchResult | None = None) -> str:
    """The ``JobError`` message when int8 agrees with fp32 on fewer top-1 classes than ``--min-agreement``.

    Parameters
    ----------
    figures : dict
        :func:`agreement`'s, on the held-out images.
    min_agreement : float
        ``--min-agreement``.
    layers : sequence of str
        The model's convolution and fully connected layers (:func:`weight_layers`).
    calibrated : int
        Images the quantization was calibrated on.
    search : SearchResult, optional
        ``--int8-exclude auto``'s search, when the run used it: the message
        says what it tried. Without it, the message suggests ``auto`` first,
        as the one suggestion that checks the agreement itself.
    """
    first, last = (layers[0], layers[-1]) if layers else ("?", "?")
    by_name = f"with --int8-exclude (the first and last are {first} and {last}; patterns such as '*conv*' work)"
    sample = (f"more --calibration-images (this run calibrated on {calibrated} and held out {figures['images']}), "
              f"or --precision fp32")
    if search is None:
        advice = (f"Try --int8-exclude auto first: it searches for the layers to keep in fp32 until int8 agrees, "
                  f"and keeps int8 only if it is faster. Or try keeping layers in fp32 yourself {by_name}, {sample}")
    else:
        advice = (f"--int8-exclude auto tried {int8_search.tried(search)}. Try keeping more layers in fp32 "
                  f"{by_name}, {sample}")
    return (f"int8 agrees with fp32 on only {figures['top1_agreement']:.2%} of top-1 classes "
            f"({figures['images']} held-out images; largest probability difference "
            f"{figures['max_probability_difference']:.4f}), under --min-agreement {min_agreement}. "
            f"Nothing was scored. {advice}")


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """How far ``candidate`` class probabilities stray from ``reference`` (both ``(N, classes)``).

    Returns ``top1_agreement`` (the share of rows with the same top class),
    ``max_probability_difference`` (the largest absolute difference of any
    class's probability) and ``images``.
    """
    if reference.shape != candidate.shape or not len(reference):
        raise ValueError(f"need two non-empty arrays of one shape, got {reference.shape} and {candidate.shape}")
    return {"top1_agreement": round(int8_search.top1_agreement(reference, candidate), 4),
            "max_probability_difference": round(float(np.abs(reference - candidate).max()), 4),
            "images": len(reference)}
