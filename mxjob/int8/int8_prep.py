"""``--precision int8`` on the driver: sample the input, quantize once, check agreement with fp32.

:func:`prepare_precision` calibrates on keys spread over the listing
(:func:`sample_keys`), decoded as the executors decode them
(:func:`sample_arrays`), and refuses the run when int8 and fp32 disagree
more than ``--min-agreement`` allows.
"""

from __future__ import annotations

import atexit
import logging
import os
import pathlib
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from mxjob.core.errors import JobError, first_line, plural
from mxjob.int8 import int8_search
from mxjob.int8.int8 import agreement, agreement_refusal, int8_excluded, quantize_int8, sample_too_small, weight_layers
from mxjob.int8.int8_search import SampleArrays, SearchGoal, quantize_auto
from mxjob.model.handlers import get_handlers
from mxjob.model.predictor import ModelError, Predictor
from mxjob.model.preprocess import decode_image
from mxjob.options.config import JobConfig
from mxjob.planning.sizing import bound_batch
from mxjob.s3 import reads
from mxjob.tasks.classify import Classifier

log = logging.getLogger(__name__)


def sample_keys(images: list, count: int) -> tuple[list, list]:
    """The int8 samples: ``(calibration, held_out)``, each up to ``count`` keys of the sorted listing.

    ``2 * count`` keys evenly spaced over the whole listing (the ``i * n //
    (2 * count)``-th of ``n``), so they span every folder and date; the even
    ones calibrate, the odd ones are held out to check agreement, so no image
    does both. A job of one image uses it for both.
    """
    n = min(2 * count, len(images))
    picked = [images[i * len(images) // n] for i in range(n)]
    return picked[0::2], picked[1::2] or picked[0::2]


def sample_arrays(cfg: JobConfig, client, items: list) -> np.ndarray:
    """Download and decode ``items`` as the executors do; images that fail are left out (they fail in the job too)."""
    handlers = get_handlers(cfg.handler_path)

    def one(item):
        key, _ = item
        try:
            data = reads.read_object(client, cfg.input_bucket, key)
            if handlers is not None and handlers.input_handler is not None:
                return handlers.decode(key, data, cfg.preprocess.input_shape)
            return decode_image(data, cfg.preprocess)
        except Exception as exc:  # noqa: BLE001 - the job records it as this key's error line
            log.debug("int8 sample: %s left out: %s", key, first_line(exc))
            return None

    with ThreadPoolExecutor(cfg.io_threads) as pool:
        arrays = [a for a in pool.map(one, items) if a is not None]
    return np.stack(arrays) if arrays else np.zeros((0, *cfg.preprocess.input_shape), np.float32)


def prepare_precision(cfg: JobConfig, client, images: list, classifier: Predictor) -> tuple[JobConfig, dict]:
    """For ``--precision int8``: quantize on the driver, check agreement, return ``cfg`` with the int8 model.

    The driver quantizes once (:func:`quantize_int8`; with ``--int8-exclude
    auto``, :func:`quantize_auto` searches for the layers to keep in fp32,
    :func:`quantize_for_job`), calibrated on
    :func:`sample_keys`' calibration images, and scores the held-out ones in
    fp32 and int8. Below ``--min-agreement`` the job refuses (``JobError``)
    with the figures and what to try; otherwise the executors get the int8
    checkpoint through ``SparkContext.addFile`` and load it through the same
    per-worker cache. Returns the summary's ``precision`` entry.
    """
    if cfg.precision == "fp32":
        return cfg, {"precision": "fp32"}
    if not isinstance(classifier, Classifier):
        raise JobError("--precision int8 checks that int8 and fp32 agree on the top-1 class, so it needs a "
                       "classifier; with an output_handler use --precision fp32")
    started = time.time()
    calibration_keys, held_out_keys = sample_keys(images, cfg.calibration_images)
    calibration = sample_arrays(cfg, client, calibration_keys)
    held_out = sample_arrays(cfg, client, held_out_keys)
    if not len(calibration) or not len(held_out):
        raise JobError(f"--precision int8: none of the {len(calibration_keys) + len(held_out_keys)} sampled "
                       f"images could be read and decoded; check the input, or use --precision fp32")
    # Before the quantization: a sample this small proves nothing.
    if too_small := sample_too_small(len(held_out), len(held_out_keys), cfg.calibration_images, len(images)):
        raise JobError(too_small)
    try:
        symbol_json = cfg.model.read(cfg.model.symbol_uri).decode("utf-8")
        exclude = [] if int8_search.is_auto(cfg.int8_exclude) else int8_excluded(symbol_json, cfg.int8_exclude)
    except ModelError as exc:
        raise JobError(str(exc)) from exc
    folder = tempfile.mkdtemp(prefix="mxinfer-int8-")
    # Kept until the driver exits: executors fetch the files from the driver while the job runs.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    spec, exclude, search = quantize_for_job(cfg, symbol_json, exclude, calibration, held_out,
                                             os.path.join(folder, "model-int8"), classifier)
    labels_uri = os.path.join(folder, "synset.txt") if classifier.labels else ""
    if labels_uri:
        pathlib.Path(labels_uri).write_text("\n".join(classifier.labels) + "\n", encoding="utf-8")
    spec = replace(spec, labels_uri=labels_uri, context=cfg.model.context)
    int8 = Classifier(spec, cfg.preprocess.input_shape, bound_batch(cfg), context="cpu")
    figures = agreement(classifier.probabilities(held_out), int8.probabilities(held_out))
    report = {"precision": "int8", **figures, "min_agreement": cfg.min_agreement,
              "calibration_images": len(calibration), "excluded_layers": exclude,
              "quantize_seconds": round(time.time() - started, 2)}
    if search is not None:
        report.update(granularity=search.chosen.granularity, speedup=search.timing["speedup"], search=search.as_dict())
    log.info("int8: top-1 agreement with fp32 %.2f%% on %d held-out images, largest probability difference "
             "%.4f (calibrated on %d images, %s kept in fp32, %.1fs)",
             100 * figures["top1_agreement"], figures["images"], figures["max_probability_difference"],
             len(calibration), plural(len(exclude), "layer"), report["quantize_seconds"])
    if figures["top1_agreement"] < cfg.min_agreement:
        raise JobError(agreement_refusal(figures, cfg.min_agreement, weight_layers(symbol_json), len(calibration),
                                         search))
    return replace(cfg, int8_model=spec), report


def quantize_for_job(cfg: JobConfig, symbol_json: str, exclude: list, calibration: np.ndarray,
                     held_out: np.ndarray, out_prefix: str, classifier: Classifier):
    """The int8 checkpoint, the layers it keeps in fp32, and ``--int8-exclude auto``'s search (else ``None``).

    With ``auto``, :func:`quantize_auto` chooses the layers; a search that
    finds nothing that agrees and is faster refuses the job here, with the
    best it found.
    """
    auto = int8_search.is_auto(cfg.int8_exclude)
    try:
        if auto:
            spec, search = quantize_auto(cfg.model, weight_layers(symbol_json), SampleArrays(calibration, held_out),
                                         out_prefix, bound_batch(cfg),
                                         SearchGoal(cfg.min_agreement, cfg.int8_search_seconds),
                                         classifier.output_is_probability)
        else:
            spec, search = quantize_int8(cfg.model, cfg.preprocess.input_shape, calibration, out_prefix, exclude,
                                         bound_batch(cfg)), None
    except Exception as exc:  # MXNetError from the quantization pass or the calibration run
        raise JobError(f"cannot quantize the model to int8: {first_line(exc)}; keep the layer it names "
                       f"in fp32 with --int8-exclude, or use --precision fp32") from exc
    if not auto:
        return spec, exclude, None
    log.info("%s", int8_search.describe(search))
    if spec is None:
        raise JobError(int8_search.refusal(search, cfg.min_agreement, len(held_out)))
    return spec, search.chosen.excluded, search
