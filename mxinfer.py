"""The executor side of the job, and its library: decode images, load the model once, predict.

Shipped to the executors in ``mxinfer_job.zip`` (``--py-files``, built by
``make package``) beside the ``mxjob`` package that holds the code, one
concern per module:

=============================  ==========================================================
``mxjob.model.preprocess``     encoded bytes to the model's input (:func:`decode_image`, :func:`decode_into`)
``mxjob.model.predictor``      the checkpoint (:class:`Predictor`), the per-worker model cache
``mxjob.tasks``                each task: :class:`Classifier` / :class:`ImageClassifier` (top-k),
                               :class:`Embedder` / :class:`ImageEmbedder`, :class:`ObjectDetector`
``mxjob.results``              the result model: one Arrow record batch per batch; a part; its JSON lines
``mxjob.model.device``         ``cpu`` / ``gpu`` / ``gpu:N``, one grammar
``mxjob.int8.int8``            oneDNN post-training quantization and the agreement check
``mxjob.model.handlers``       a user's ``input_handler`` / ``output_handler``
``mxjob.executor.udf``         :func:`model_udf`, the DataFrame function
``mxjob.model.worker``         threads and memory of a Python worker
``mxjob.executor.partition``   :func:`score_partition`, what each Spark task runs
``mxjob.executor.stats``       the tasks' stats, folded in one accumulator
``mxjob.core.state``           every piece of per-process state (caches, counters)
=============================  ==========================================================

The public API below is what the job itself runs, so a notebook gets the same
numbers as a backfill.

Preprocessing recipe (what :func:`decode_image` does, and what the README tells
users to reproduce): ``PIL.Image.open`` -> for a JPEG, ``img.draft(None,
draft_size(img, prep))`` (DCT scaling; skipped with ``decode="exact"``) ->
``ImageOps.exif_transpose`` -> RGB (``convert("RGB")``; 16-bit and 32-bit
greyscale are scaled to 8 bits first, not clipped) -> ``resize((W, H),
BILINEAR)`` (or short side to ``H*256/224`` then a centre crop) -> float32
CHW -> ``(x - mean) / std`` on 0-255 values.
"""

from mxjob import tasks
from mxjob.core.constants import DECODE_MODES, PRECISIONS, RESIZE_MODES
from mxjob.core.errors import first_line
from mxjob.executor.partition import JobSpec, score_partition
from mxjob.executor.udf import model_udf, score_images, udf_return_type
from mxjob.int8.int8 import agreement, quantize_int8
from mxjob.model.device import choose_context, task_context
from mxjob.model.handlers import HandlerError, Handlers, load_handlers
from mxjob.model.predictor import ModelError, ModelSpec, Predictor, get_model, parse_labels
from mxjob.model.preprocess import (
    Geometry,
    ImageTooLargeError,
    Preprocess,
    decode_image,
    decode_image_geometry,
    decode_into,
    draft_size,
    map_boxes,
)
from mxjob.tasks.classify import Classifier, ImageClassifier, get_classifier, softmax, top_classes
from mxjob.tasks.detect import ObjectDetector
from mxjob.tasks.embed import Embedder, ImageEmbedder

#: The tasks ``--task`` takes (:mod:`mxjob.tasks`).
TASKS = tasks.names()

__all__ = [
    "DECODE_MODES",
    "PRECISIONS",
    "RESIZE_MODES",
    "TASKS",
    "Classifier",
    "Embedder",
    "Geometry",
    "HandlerError",
    "Handlers",
    "ImageClassifier",
    "ImageEmbedder",
    "ImageTooLargeError",
    "JobSpec",
    "ModelError",
    "ModelSpec",
    "ObjectDetector",
    "Predictor",
    "Preprocess",
    "agreement",
    "choose_context",
    "decode_image",
    "decode_image_geometry",
    "decode_into",
    "draft_size",
    "first_line",
    "get_classifier",
    "get_model",
    "load_handlers",
    "map_boxes",
    "model_udf",
    "parse_labels",
    "quantize_int8",
    "score_images",
    "score_partition",
    "softmax",
    "task_context",
    "top_classes",
    "udf_return_type",
]
