"""Executor side of the job: decode images, load the model once, predict.

This module is shipped to the executors with ``--py-files``. It keeps
per-process state (the loaded models, the download pool), which is why it is a
module of its own and not part of the job script: a module is imported once per
Python worker and, with ``spark.python.worker.reuse=true`` (Spark's default),
that worker runs every later task of the executor, so a model loaded by the
first task serves all the others.

The public API (:class:`Predictor`, :class:`Classifier`,
:class:`ImageClassifier`) is what the job itself uses, so a notebook gets the
same numbers as a backfill.

Preprocessing recipe (what :func:`decode_image` does, and what the README tells
users to reproduce): ``PIL.Image.open`` -> for a JPEG, ``img.draft(None,
draft_size(img, prep))`` (DCT scaling; skipped with ``decode="exact"``) ->
``ImageOps.exif_transpose`` -> RGB
(``convert("RGB")``; 16-bit and 32-bit greyscale are scaled to 8 bits first, not
clipped) -> ``resize((W, H), BILINEAR)`` (or short side to ``H*256/224`` then a
centre crop) -> float32 CHW -> ``(x - mean) / std`` on 0-255 values.
"""

from __future__ import annotations

import ast
import gc
import gzip
import importlib.util
import io
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image, ImageOps

import listing
import utils

log = logging.getLogger(__name__)

DEFAULT_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")
RESIZE_MODES = ("stretch", "short-side-crop")
DECODE_MODES = ("draft", "exact")
ORIENTATION_TAG = 0x0112  # EXIF
# Graph heads that already end in a probability distribution; any other head is
# treated as logits and gets a softmax.
SOFTMAX_OPS = frozenset({"SoftmaxOutput", "softmax", "SoftmaxActivation", "Softmax"})


class ModelError(Exception):
    """A checkpoint that cannot serve this job (missing weight, wrong shape, ...)."""


# ----------------------------------------------------------------------------
# Preprocessing


@dataclass(frozen=True)
class Preprocess:
    """How encoded images become model input.

    Parameters
    ----------
    input_shape : tuple of int
        ``(C, H, W)``; ``C`` is 3 (RGB) or 1 (greyscale).
    mean, std : tuple of float
        Per channel, or one value for all, applied to 0-255 pixel values:
        ``(x - mean) / std``.
    resize : str
        ``"stretch"`` (straight to ``W x H``) or ``"short-side-crop"``.
    max_image_pixels : int
        Images declaring more pixels are refused before any pixel is decoded.
    decode : str
        ``"draft"``: a JPEG at least twice the size the resize needs is
        decoded at 1/2, 1/4 or 1/8 scale by the JPEG decoder itself (DCT
        scaling, Pillow's ``Image.draft``), never below twice that size, then
        resized as usual. ``"exact"``: always decode every pixel.
    """

    input_shape: tuple = (3, 224, 224)
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    resize: str = "stretch"
    max_image_pixels: int = 64_000_000
    decode: str = "draft"

    def __post_init__(self):
        channels = self.input_shape[0]
        if len(self.input_shape) != 3 or channels not in (1, 3) or min(self.input_shape) < 1:
            raise ValueError(f"input_shape must be (C, H, W) with C 1 or 3, got {self.input_shape}")
        for name in ("mean", "std"):
            values = getattr(self, name)
            if len(values) not in (1, channels):
                raise ValueError(f"{name} needs 1 or {channels} values, got {len(values)}")
        if any(s == 0 for s in self.std):
            raise ValueError("std values must be non-zero")
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"resize must be one of {', '.join(RESIZE_MODES)}, got {self.resize!r}")
        if self.decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, got {self.decode!r}")


class ImageTooLargeError(ValueError):
    """An image that declares more pixels than the configured limit."""


def to_rgb(img: Image.Image, mode: str = "RGB") -> Image.Image:
    """Convert any Pillow mode to 8-bit RGB (or L), scaling deep greyscale.

    Pillow's own ``convert`` clips 16-bit ("I;16") and 32-bit ("I", "F")
    greyscale to 255, which turns most real 16-bit images white; those are
    scaled from their bit depth to 0-255 instead.
    """
    if img.mode.startswith("I;16") or img.mode in ("I", "F"):
        values = np.asarray(img, dtype=np.float64)
        if img.mode.startswith("I;16"):
            scale = 255.0 / 65535.0
        elif img.mode == "I" and values.size and values.max() > 255:
            scale = 255.0 / 65535.0 if values.max() <= 65535 else 255.0 / 4294967295.0
        else:
            scale = 1.0
        values = np.clip(np.rint(values * scale), 0, 255).astype(np.uint8)
        img = Image.fromarray(values)
    return img if img.mode == mode else img.convert(mode)


def decode_image(data: bytes, prep: Preprocess) -> np.ndarray:
    """Decode one encoded image to a float32 CHW array, exactly per the recipe.

    Raises on anything that is not a whole, readable image: a truncated file is
    an error, never a half-grey image (``ImageFile.LOAD_TRUNCATED_IMAGES`` stays
    off). Animated images give their first frame.
    """
    if not data:
        raise ValueError("empty object (0 bytes)")
    channels, height, width = prep.input_shape
    try:
        opened = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:  # Pillow's own limit, which also caps ours
        raise ImageTooLargeError(f"image is over the limit of {2 * Image.MAX_IMAGE_PIXELS} pixels "
                                 f"(Pillow's decompression bomb check): {exc}") from None
    with opened as img:
        pixels = img.width * img.height
        if pixels > prep.max_image_pixels:
            raise ImageTooLargeError(
                f"image declares {img.width}x{img.height} = {pixels} pixels, over the limit of "
                f"{prep.max_image_pixels} (max_image_pixels)"
            )
        if prep.decode == "draft" and img.format in ("JPEG", "MPO"):
            img.draft(None, draft_size(img, prep))
        img.load()
        ImageOps.exif_transpose(img, in_place=True)  # in place: no copy of an upright image
        img = to_rgb(img, "RGB" if channels == 3 else "L")
        if prep.resize == "stretch":
            img = img.resize((width, height), Image.BILINEAR)
        else:
            img = _short_side_crop(img, width, height)
        values = np.asarray(img)  # uint8: to_rgb made it RGB or L
    # CHW as uint8 first, then (x - mean) / std in float32 into one new array:
    # the same values as converting to float32 first, in half the time.
    values = values[np.newaxis, :, :] if channels == 1 else np.ascontiguousarray(values.transpose(2, 0, 1))
    mean = np.asarray(prep.mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(prep.std, dtype=np.float32).reshape(-1, 1, 1)
    array = np.empty(values.shape, dtype=np.float32)
    np.subtract(values, mean, out=array, dtype=np.float32)
    array /= std
    return array


def draft_size(img: Image.Image, prep: Preprocess) -> tuple[int, int]:
    """Twice the size the resize step needs, in the file's own orientation: ``Image.draft``'s request.

    ``draft`` decodes at the smallest of 1/1, 1/2, 1/4, 1/8 scale that is
    still at least this size in both directions, so the resize that follows
    always shrinks by 2x or more, as it would from the full image.
    """
    _, height, width = prep.input_shape
    if prep.resize == "short-side-crop":
        short = round(min(width, height) * 256 / 224)
        width = height = short
    # EXIF orientations 5-8 turn the image a quarter: the file's width is the upright height.
    if img.getexif().get(ORIENTATION_TAG, 1) in (5, 6, 7, 8):
        width, height = height, width
    return 2 * width, 2 * height


def _short_side_crop(img: Image.Image, width: int, height: int) -> Image.Image:
    """Shorter side to ``min(H, W) * 256 / 224`` (ImageNet's usual ratio), then centre crop."""
    short = round(min(width, height) * 256 / 224)
    scale = short / min(img.width, img.height)
    new_w = max(width, round(img.width * scale))
    new_h = max(height, round(img.height * scale))
    img = img.resize((new_w, new_h), Image.BILINEAR)
    left, top = (new_w - width) // 2, (new_h - height) // 2
    return img.crop((left, top, left + width, top + height))


# ----------------------------------------------------------------------------
# Top-k


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax, stable for large logits."""
    shifted = x - x.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def top_classes(probabilities: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
    """Per row, the ``k`` largest ``(class_id, probability)``, highest first.

    Ties keep the lower class id first, so results are deterministic.
    """
    k = min(k, probabilities.shape[1])
    order = np.argsort(-probabilities, axis=1, kind="stable")[:, :k]
    return [[(int(c), float(row[c])) for c in idx] for row, idx in zip(probabilities, order)]


def parse_labels(text: str) -> list[str]:
    """One label per line; an ImageNet synset id in front (``n02123045 tabby``) is dropped."""
    labels = []
    for line in text.splitlines():
        line = line.strip()
        head, _, rest = line.partition(" ")
        if rest and len(head) == 9 and head[0] == "n" and head[1:].isdigit():
            line = rest.strip()
        labels.append(line)
    while labels and not labels[-1]:
        labels.pop()
    return labels


# ----------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class ModelSpec:
    """Where a checkpoint lives; plain strings so it pickles to executors.

    ``labels_uri`` of ``None`` means: ``synset.txt`` beside the symbol file if it
    exists, else class ids only; ``""`` means no labels.
    """

    symbol_uri: str
    params_uri: str
    labels_uri: str | None = None
    data_name: str = "data"
    context: str = "cpu"
    endpoint_url: str | None = None
    region: str | None = None

    @classmethod
    def from_prefix(cls, prefix: str, epoch: int = 0, **kwargs) -> ModelSpec:
        """``prefix-symbol.json`` and ``prefix-%04d.params``, as MXNet's checkpoints."""
        return cls(f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params", **kwargs)

    #: The files are local to the driver, which shipped them with ``SparkContext.addFile``
    #: (the job's int8 checkpoint); a Spark task reads its copy, found by name.
    shipped: bool = False

    def read(self, uri: str) -> bytes:
        if self.shipped and _spark_task() is not None:
            from pyspark import SparkFiles

            uri = SparkFiles.get(os.path.basename(uri))
        client = utils.s3_client(self.endpoint_url, self.region) if utils.is_s3_uri(uri) else None
        return utils.read_uri(uri, client)

    def shipped_files(self) -> list[str]:
        """The local files a Spark job must ``addFile`` for this model: none unless ``shipped``."""
        if not self.shipped:
            return []
        return [uri for uri in (self.symbol_uri, self.params_uri, self.labels_uri) if uri]


def mx_context(name: str):
    """``cpu``, ``gpu`` or ``gpu:N`` to an MXNet context."""
    import mxnet as mx

    kind, _, index = name.partition(":")
    if kind == "cpu":
        return mx.cpu()
    if kind == "gpu":
        return mx.gpu(int(index or 0))
    raise ValueError(f"context must be cpu, gpu or gpu:N, got {name!r}")


def choose_context(requested: str, resources: Mapping | None, partition_index: int, num_gpus: int) -> str:
    """The device one Spark task should run the model on, as ``"cpu"`` or ``"gpu:N"``.

    Pure: the caller passes what Spark and MXNet report (see :func:`task_context`).

    Parameters
    ----------
    requested : str
        ``"cpu"``; ``"gpu:N"`` pins GPU N; ``"gpu"`` picks one for this task.
    resources : mapping or None
        The task's Spark resources, ``TaskContext.get().resources()``: a name
        to an object with ``addresses``. With GPU scheduling on
        (``spark.task.resource.gpu.amount``) Spark names this task's GPU there.
    partition_index : int
        Spreads partitions over the visible GPUs when Spark assigned none.
    num_gpus : int
        GPUs this process sees (``mx.context.num_gpus()``).

    Returns
    -------
    str
        ``"cpu"`` or ``"gpu:N"``: the GPU Spark assigned, else
        ``partition_index % num_gpus``.

    Raises
    ------
    ValueError
        A malformed ``requested``, or ``"gpu"`` with no GPU assigned or visible.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> choose_context("gpu", {"gpu": SimpleNamespace(addresses=["3"])}, 0, 4)
    'gpu:3'
    >>> choose_context("gpu", {}, 6, 4)
    'gpu:2'
    """
    kind, colon, index = str(requested).partition(":")
    if kind == "cpu" and not colon:
        return "cpu"
    if kind != "gpu" or (colon and not index.isdigit()):
        raise ValueError(f"context must be cpu, gpu or gpu:N, got {requested!r}")
    if colon:
        return f"gpu:{int(index)}"
    gpu = (resources or {}).get("gpu")
    addresses = list(getattr(gpu, "addresses", None) or [])
    if addresses:
        if not str(addresses[0]).isdigit():
            raise ValueError(f"Spark assigned GPU address {addresses[0]!r}; expected a device number")
        return f"gpu:{int(addresses[0])}"
    if num_gpus > 0:
        return f"gpu:{partition_index % num_gpus}"
    raise ValueError("context gpu: Spark assigned this task no GPU and this process sees none; "
                     "set spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount, "
                     "or use context cpu")


def _spark_task():
    """The running Spark task's ``TaskContext``; ``None`` on the driver or without Spark."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the library used without Spark installed
        return None
    return TaskContext.get()


def task_context(requested: str, partition_index: int | None = None) -> str:
    """:func:`choose_context` for the running task: its Spark resources and the visible GPUs.

    ``partition_index`` defaults to the task's partition (0 outside Spark).
    Asks MXNet for the GPU count only when ``requested`` is plain ``"gpu"``.
    """
    if str(requested) != "gpu":
        return choose_context(requested, None, 0, 0)
    import mxnet as mx

    task = _spark_task()
    resources = task.resources() if task is not None else {}
    if partition_index is None:
        partition_index = task.partitionId() if task is not None else 0
    return choose_context(requested, resources, partition_index, mx.context.num_gpus())


def _head_op(symbol_json: str) -> str:
    graph = json.loads(symbol_json)
    head = graph["heads"][0][0]
    return graph["nodes"][head]["op"]


class Predictor:
    """A bound MXNet Module that maps NCHW float32 arrays to the model's outputs.

    Parameters
    ----------
    model : ModelSpec or str
        The checkpoint, or a checkpoint prefix (``prefix-symbol.json``,
        ``prefix-0000.params``).
    input_shape : tuple of int
        ``(C, H, W)`` of one input.
    batch_size : int
        The batch the module is bound at; :meth:`predict` pads or splits.

    Examples
    --------
    >>> p = Predictor("file:///models/resnet18", (3, 224, 224), batch_size=8)  # doctest: +SKIP
    >>> p.predict(np.zeros((3, 3, 224, 224), np.float32))[0].shape  # doctest: +SKIP
    (3, 1000)
    """

    def __init__(self, model, input_shape=(3, 224, 224), batch_size: int = 64, context: str | None = None):
        import mxnet as mx

        spec = model if isinstance(model, ModelSpec) else ModelSpec.from_prefix(model)
        if context is not None:
            spec = replace(spec, context=context)
        self.spec = spec
        self.input_shape = tuple(int(x) for x in input_shape)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        symbol_json = spec.read(spec.symbol_uri).decode("utf-8")
        params = spec.read(spec.params_uri)
        try:
            symbol = mx.sym.load_json(symbol_json)
            saved = mx.nd.load_frombuffer(params)
        except mx.base.MXNetError as exc:
            raise ModelError(f"cannot load checkpoint {spec.symbol_uri} / {spec.params_uri}: "
                             f"{first_line(exc)}") from exc
        arg_params = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
        aux_params = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
        self.head_op = _head_op(symbol_json)
        self.output_is_probability = self.head_op in SOFTMAX_OPS
        self._check(symbol, arg_params, aux_params)
        label_names = [n for n in symbol.list_arguments() if n.endswith("_label")]
        self._ctx = mx_context(spec.context)
        self._module = mx.mod.Module(symbol, data_names=[spec.data_name], label_names=label_names,
                                     context=self._ctx)
        data_shape = (self.batch_size, *self.input_shape)
        with warnings.catch_warnings():
            # Inference binds no label shapes; Module warns that they differ from label_names.
            warnings.filterwarnings("ignore", message="Data provided by label_shapes")
            self._module.bind(data_shapes=[(spec.data_name, data_shape)], for_training=False)
        self._module.set_params(arg_params, aux_params, allow_missing=False, allow_extra=True)
        self._symbol = symbol
        self._lock = threading.Lock()
        self._mx = mx

    def _check(self, symbol, arg_params, aux_params) -> None:
        """Fail on the driver, with a useful message, before any image is read."""
        spec = self.spec
        arguments = symbol.list_arguments()
        if spec.data_name not in arguments:
            inputs = [a for a in arguments if a not in arg_params and not a.endswith("_label")]
            raise ModelError(f"the model has no input named {spec.data_name!r}; its inputs are {inputs} "
                             "(set data_name)")
        shape = (self.batch_size, *self.input_shape)
        try:
            arg_shapes, out_shapes, aux_shapes = symbol.infer_shape(**{spec.data_name: shape})
        except Exception as exc:  # MXNetError; infer_shape raises several kinds
            raise ModelError(f"the model rejects input shape {self.input_shape} (C,H,W): {first_line(exc)}; "
                             f"{self._wanted_shape(symbol, arg_params, aux_params)}") from exc
        needed = {n: s for n, s in zip(arguments, arg_shapes) if n != spec.data_name and not n.endswith("_label")}
        missing = sorted(set(needed) - set(arg_params))
        if missing:
            raise ModelError(f"{spec.params_uri} lacks {len(missing)} weight(s) the graph needs: "
                             f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
        for name, want in list(needed.items()) + list(zip(symbol.list_auxiliary_states(), aux_shapes)):
            have = (arg_params.get(name) if name in arg_params else aux_params.get(name))
            if have is None:
                raise ModelError(f"{spec.params_uri} lacks auxiliary state {name}")
            if tuple(have.shape) != tuple(want):
                raise ModelError(f"weight {name} has shape {tuple(have.shape)} but the graph needs "
                                 f"{tuple(want)} for input shape {self.input_shape}; "
                                 f"{self._wanted_shape(symbol, arg_params, aux_params)}")
        self.output_shapes = [tuple(s[1:]) for s in out_shapes]
        self.num_params = int(sum(int(np.prod(v.shape)) for v in arg_params.values()))

    #: Square input sizes tried when the checkpoint does not record its shape:
    #: those of common ImageNet-style and small models.
    _COMMON_SIZES = (224, 299, 227, 256, 32, 28, 64, 96, 112, 128, 160, 192, 240, 288, 320, 331, 384, 512)

    def _wanted_shape(self, symbol, arg_params: dict, aux_params: dict) -> str:
        """What to set ``--input-shape`` to: the shape the checkpoint records, else one its weights fit.

        A data variable made with ``mx.sym.var(name, shape=...)`` records its
        shape in the symbol file. Otherwise the first ``(C, H, W)`` whose
        inferred weight shapes all match the saved ones is named: the given
        H and W with 3 or 1 channels first, then common square sizes. A graph
        that pools globally fits any size, so H and W are then the given ones.
        """
        recorded = symbol.attr_dict().get(self.spec.data_name, {}).get("__shape__")
        if recorded:
            try:
                dims = tuple(int(d) for d in ast.literal_eval(recorded))[-3:]
            except (ValueError, SyntaxError, TypeError):
                dims = ()
            if len(dims) == 3 and min(dims) > 0:
                return f"the checkpoint records input shape {','.join(map(str, dims))}: set --input-shape to it"
        saved = {**arg_params, **aux_params}
        given_c, given_h, given_w = self.input_shape
        channels = dict.fromkeys((given_c, 3, 1))
        sizes = dict.fromkeys([(given_h, given_w)] + [(n, n) for n in self._COMMON_SIZES])
        for height, width in sizes:
            for c in channels:
                shape = (1, c, height, width)
                try:
                    arg_shapes, _, aux_shapes = symbol.infer_shape(**{self.spec.data_name: shape})
                except Exception:  # noqa: BLE001 - MXNetError: this shape does not fit; try the next
                    continue
                inferred = dict(zip(symbol.list_arguments(), arg_shapes))
                inferred.update(zip(symbol.list_auxiliary_states(), aux_shapes))
                if all(tuple(inferred[n]) == tuple(v.shape) for n, v in saved.items() if n in inferred):
                    return (f"its weights fit input shape {c},{height},{width} (C,H,W): set --input-shape "
                            "to that, or to what it was trained on")
        return "set --input-shape to what it was trained on"

    def predict(self, array: np.ndarray) -> list[np.ndarray]:
        """Run the model on ``array`` (N, C, H, W) float32 of any length N.

        Returns
        -------
        list of numpy.ndarray
            One array per model output, each with exactly N rows.
        """
        if not isinstance(array, np.ndarray) or array.ndim != 4:
            raise ValueError(f"expected a 4-d NCHW numpy array, got {getattr(array, 'shape', type(array))}")
        if tuple(array.shape[1:]) != self.input_shape:
            raise ValueError(f"expected shape (N, {', '.join(map(str, self.input_shape))}), got {array.shape}")
        if array.dtype != np.float32:
            raise ValueError(f"expected dtype float32, got {array.dtype}")
        n = array.shape[0]
        chunks = []
        for start in range(0, n, self.batch_size):
            chunk = array[start: start + self.batch_size]
            rows = chunk.shape[0]
            if rows < self.batch_size:
                chunk = np.concatenate([chunk, np.zeros((self.batch_size - rows, *self.input_shape), np.float32)])
            chunks.append((self._forward(chunk), rows))
        if not chunks:
            return [np.zeros((0, *s), np.float32) for s in self.output_shapes]
        return [np.concatenate([outs[i][:rows] for outs, rows in chunks]) for i in range(len(chunks[0][0]))]

    def _forward(self, batch: np.ndarray) -> list[np.ndarray]:
        mx = self._mx
        data = mx.io.DataBatch([mx.nd.array(batch, ctx=self._ctx)])
        with self._lock:
            self._module.forward(data, is_train=False)
            return [o.asnumpy() for o in self._module.get_outputs()]

    def model_summary(self) -> dict:
        """Parameter count, input and output names and shapes, classes, head kind."""
        return {
            "parameters": self.num_params,
            "inputs": {self.spec.data_name: list(self.input_shape)},
            "outputs": {name: list(shape) for name, shape in zip(self._symbol.list_outputs(), self.output_shapes)},
            # A class-score head has one axis of length > 1, e.g. (1000,) or (1000, 1, 1);
            # a detector's (anchors, 6) has no number of classes to tell.
            "num_classes": (int(np.prod(self.output_shapes[0]))
                            if self.output_shapes and sum(d > 1 for d in self.output_shapes[0]) <= 1 else None),
            "head": "softmax" if self.output_is_probability else "logits",
            "head_op": self.head_op,
        }


class Classifier(Predictor):
    """A :class:`Predictor` whose first output is class scores; adds labels and top-k.

    Labels come from ``spec.labels_uri``; when that is ``None``, from
    ``synset.txt`` beside the symbol file if it exists.
    """

    def __init__(self, model, input_shape=(3, 224, 224), batch_size: int = 64, context: str | None = None):
        super().__init__(model, input_shape, batch_size, context)
        self.num_classes = int(np.prod(self.output_shapes[0]))
        self.labels = self._load_labels()

    def _load_labels(self) -> list[str] | None:
        uri = self.spec.labels_uri
        explicit = uri is not None
        if uri is None:
            uri = utils.sibling_uri(self.spec.symbol_uri, "synset.txt")
        if not uri:
            return None
        try:
            labels = parse_labels(self.spec.read(uri).decode("utf-8"))
        except FileNotFoundError:
            if explicit:
                raise ModelError(f"labels file {uri} does not exist") from None
            return None
        except Exception as exc:
            # Without s3:ListBucket, S3 answers a missing object with AccessDenied;
            # the implicit synset.txt is optional, so go on with class ids only.
            if explicit or "AccessDenied" not in str(exc):
                raise
            log.warning("cannot read %s (%s); predictions carry class ids only; set --labels to "
                        "name a labels file", uri, first_line(exc))
            return None
        if len(labels) != self.num_classes:
            raise ModelError(f"labels file {uri} has {len(labels)} lines but the model has "
                             f"{self.num_classes} classes")
        return labels

    def probabilities(self, array: np.ndarray) -> np.ndarray:
        scores = self.predict(array)[0].reshape(array.shape[0], -1).astype(np.float64)
        return scores if self.output_is_probability else softmax(scores)

    def classify(self, array: np.ndarray, top_k: int = 5) -> list[list[tuple[int, str | None, float]]]:
        """Per row, ``(class_id, label, probability)`` for the ``top_k`` classes, highest first."""
        return [self._labelled(row) for row in top_classes(self.probabilities(array), top_k)]

    def _labelled(self, row):
        return [(c, self.labels[c] if self.labels else None, p) for c, p in row]

    def prediction_dicts(self, probabilities: np.ndarray, k: int) -> list[list[dict]]:
        """Rows of top-k as the job's JSON objects."""
        return [self.prediction_entries(self._labelled(row)) for row in top_classes(probabilities, k)]

    def prediction_entries(self, labelled: list[tuple[int, str | None, float]]) -> list[dict]:
        """One row of :meth:`classify` as the job writes it: no label without labels, 6 significant digits."""
        entries = []
        for class_id, label, prob in labelled:
            entry = {"class_id": class_id}
            if self.labels:
                entry["label"] = label
            entry["probability"] = float(f"{prob:.6g}")
            entries.append(entry)
        return entries


class ImageClassifier(Classifier):
    """A :class:`Classifier` that takes encoded images, decoded exactly as the job does."""

    def __init__(self, model, input_shape=(3, 224, 224), batch_size: int = 64, context: str | None = None,
                 preprocess: Preprocess | None = None):
        super().__init__(model, input_shape, batch_size, context)
        self.preprocess = preprocess or Preprocess(input_shape=self.input_shape)
        if tuple(self.preprocess.input_shape) != self.input_shape:
            raise ValueError("preprocess.input_shape must match input_shape")

    def to_array(self, images: Sequence) -> np.ndarray:
        arrays = []
        for image in images:
            if isinstance(image, Image.Image):
                buffer = io.BytesIO()
                image.save(buffer, format="PNG")
                image = buffer.getvalue()
            elif isinstance(image, (str, os.PathLike)):
                with open(image, "rb") as handle:
                    image = handle.read()
            arrays.append(decode_image(bytes(image), self.preprocess))
        return np.stack(arrays) if arrays else np.zeros((0, *self.input_shape), np.float32)

    def classify_images(self, images: Sequence, top_k: int = 5):
        """Classify encoded bytes, file paths or PIL images."""
        return self.classify(self.to_array(images), top_k)


_models: dict[tuple, Predictor] = {}
_models_lock = threading.Lock()
#: Bound modules a worker keeps. An executor serves one job, which needs one
#: per device its worker uses (``--context gpu`` spreads tasks over the GPUs it
#: sees); more would only be a job's earlier settings. The oldest goes first.
MAX_MODELS = 4
#: How many times this process has loaded a model; tests read it to prove reuse.
load_count = 0


def get_classifier(spec: ModelSpec, input_shape: tuple, batch_size: int) -> Classifier:
    """This Python worker's classifier for ``spec``, loaded on first use and then reused.

    Relies on ``spark.python.worker.reuse=true`` (Spark's default): the worker
    process, and so this cache, outlives the task. Keyed by everything that
    changes the bound module, the device (``spec.context``) included; kept
    small because an executor serves one job.
    """
    return get_model(spec, input_shape, batch_size, Classifier)


def get_model(spec: ModelSpec, input_shape: tuple, batch_size: int, kind: type = Classifier) -> Predictor:
    """:func:`get_classifier` for any of the classes: ``Predictor`` serves models that are no classifiers."""
    global load_count
    key = (kind, spec, tuple(input_shape), int(batch_size))
    with _models_lock:
        model = _models.get(key)
        if model is None:
            started = time.perf_counter()
            model = kind(spec, input_shape, batch_size)
            load_count += 1
            log.info("loaded model %s (%s, batch %d) in %.2fs; loads in this worker: %d",
                     spec.symbol_uri, model.model_summary()["head"], batch_size,
                     time.perf_counter() - started, load_count)
            if len(_models) >= MAX_MODELS:
                _models.pop(next(iter(_models)))
            _models[key] = model
        return model


def clear_models() -> None:
    """Forget this process's loaded models (the next :func:`get_model` loads again)."""
    with _models_lock:
        _models.clear()


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name if it has none): for one-line errors."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ----------------------------------------------------------------------------
# INT8 (--precision int8)

PRECISIONS = ("fp32", "int8")
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

    symbol_json = spec.read(spec.symbol_uri).decode("utf-8")
    symbol = mx.sym.load_json(symbol_json)
    saved = mx.nd.load_frombuffer(spec.read(spec.params_uri))
    arg_params = {k[4:]: v for k, v in saved.items() if k.startswith("arg:")}
    aux_params = {k[4:]: v for k, v in saved.items() if k.startswith("aux:")}
    label_names = [n for n in symbol.list_arguments() if n.endswith("_label")]
    data = mx.io.NDArrayIter({spec.data_name: calibration}, batch_size=min(batch_size, len(calibration)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Data provided by label_shapes")
        qsym, qargs, qaux = quantize_model_mkldnn(
            symbol, arg_params, aux_params, data_names=[spec.data_name], label_names=label_names, ctx=mx.cpu(),
            excluded_sym_names=list(exclude), calib_mode="naive", calib_data=data,
            num_calib_examples=len(calibration), quantized_dtype="auto", quantize_mode="smart")
    mx.model.save_checkpoint(out_prefix, 0, qsym, qargs, qaux)
    return replace(spec, symbol_uri=f"{out_prefix}-symbol.json", params_uri=f"{out_prefix}-0000.params",
                   shipped=True)


def agreement(reference: np.ndarray, candidate: np.ndarray) -> dict:
    """How far ``candidate`` class probabilities stray from ``reference`` (both ``(N, classes)``).

    Returns ``top1_agreement`` (the share of rows with the same top class),
    ``max_probability_difference`` (the largest absolute difference of any
    class's probability) and ``images``.
    """
    if reference.shape != candidate.shape or not len(reference):
        raise ValueError(f"need two non-empty arrays of one shape, got {reference.shape} and {candidate.shape}")
    same = np.argmax(reference, axis=1) == np.argmax(candidate, axis=1)
    return {"top1_agreement": round(float(same.mean()), 4),
            "max_probability_difference": round(float(np.abs(reference - candidate).max()), 4),
            "images": len(reference)}


# ----------------------------------------------------------------------------
# Custom handlers (--handler)


class HandlerError(Exception):
    """A handler file that cannot serve: missing, fails to import, or defines neither handler."""


@dataclass(frozen=True)
class Handlers:
    """A user's ``input_handler`` and/or ``output_handler``, from one Python file.

    ``input_handler(key, data: bytes) -> np.ndarray`` replaces
    :func:`decode_image`: it returns the model input for one image, ``(C, H,
    W)``, converted to float32. ``output_handler(key, outputs) -> dict`` gets
    one array per model output (this key's row, before any softmax) and
    returns the JSON object of the key's line, which replaces the top-k
    ``predictions``; the job sets ``"key"`` itself. Load with
    :func:`load_handlers`.
    """

    path: str
    input_handler: Callable | None = None
    output_handler: Callable | None = None

    def decode(self, key: str, data: bytes, input_shape: tuple) -> np.ndarray:
        """``input_handler(key, data)``, checked against the model's ``(C, H, W)``."""
        array = np.asarray(self.input_handler(key, data))
        if array.dtype.kind not in "fiub":
            raise TypeError(f"input_handler returned dtype {array.dtype}; expected float32 numbers")
        if tuple(array.shape) != tuple(input_shape):
            raise ValueError(f"input_handler returned shape {tuple(array.shape)}; the model takes "
                             f"{tuple(input_shape)} (C, H, W)")
        return np.ascontiguousarray(array, dtype=np.float32)

    def output_line(self, key: str, outputs: list[np.ndarray]) -> str:
        """The JSON line ``output_handler(key, outputs)`` makes for ``key``."""
        obj = self.output_handler(key, outputs)
        if not isinstance(obj, dict):
            raise TypeError(f"output_handler returned {type(obj).__name__}; expected a dict")
        obj = {"key": key, **{k: v for k, v in obj.items() if k != "key"}}
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default)


def _json_default(value):
    """numpy scalars and arrays, which handlers naturally return, as JSON numbers and lists."""
    if isinstance(value, (np.generic, np.ndarray)):
        if value.dtype.kind == "f" and value.dtype.itemsize <= 4:
            # float32 holds about 7 significant digits: write those, not 0.9100000262260437.
            value = np.vectorize(lambda x: float(f"{x:.7g}"), otypes=[np.float64])(value)
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def load_handlers(path: str) -> Handlers:
    """Import a handler file and return its handlers.

    Parameters
    ----------
    path : str
        A local ``.py`` file defining ``input_handler``, ``output_handler`` or both.

    Raises
    ------
    HandlerError
        The file is missing or not ``.py``, raises on import, or defines neither
        callable; the message says which.
    """
    if not path.endswith(".py"):
        raise HandlerError(f"{path} is not a Python file (.py)")
    if not os.path.isfile(path):
        raise HandlerError(f"{path} does not exist")
    # Loaded from its file under a module name of its own and never put in sys.modules,
    # so ``import utils`` anywhere still finds ours. (That the file itself cannot clash
    # with our --py-files on an executor is the driver's doing: it ships a renamed copy.)
    stem = os.path.basename(path)[:-3]
    name = "mxinfer_handler_" + "".join(c if c.isalnum() else "_" for c in stem)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise HandlerError(f"{path} fails to import: {type(exc).__name__}: {first_line(exc)}") from exc
    found = {}
    for attr in ("input_handler", "output_handler"):
        value = getattr(module, attr, None)
        if value is not None and not callable(value):
            raise HandlerError(f"{path}: {attr} is a {type(value).__name__}, not a function")
        found[attr] = value
    if not any(found.values()):
        raise HandlerError(f"{path} defines neither input_handler(key, data) nor output_handler(key, outputs)")
    return Handlers(path, **found)


def model_class(handlers: Handlers | None) -> type:
    """:class:`Classifier`, or :class:`Predictor` when an ``output_handler`` makes the lines (a detector, say)."""
    return Predictor if handlers is not None and handlers.output_handler is not None else Classifier


_handlers: dict[str, Handlers] = {}
_handlers_lock = threading.Lock()


def get_handlers(path: str | None) -> Handlers | None:
    """This Python worker's handlers from ``path``, imported once.

    In a Spark task the file is the copy the driver shipped with
    ``SparkContext.addFile`` (found by its name with ``SparkFiles.get``);
    elsewhere (the driver's dry run, tests) ``path`` itself.
    """
    if not path:
        return None
    with _handlers_lock:
        handlers = _handlers.get(path)
        if handlers is None:
            local = path
            if _spark_task() is not None:
                from pyspark import SparkFiles

                shipped = SparkFiles.get(os.path.basename(path))
                local = shipped if os.path.isfile(shipped) else path
            handlers = _handlers[path] = load_handlers(local)
        return handlers


# ----------------------------------------------------------------------------
# The DataFrame function

def udf_return_type():
    """The struct :func:`model_udf` returns; ``error`` is null when the image was scored.

    ``predictions array<struct<class_id:int, label:string, probability:double>>,
    error struct<stage:string, type:string, message:string>``. Built in Python,
    not parsed from DDL, so a UDF can be made before any SparkSession.
    """
    from pyspark.sql.types import ArrayType, DoubleType, IntegerType, StringType, StructField, StructType

    prediction = StructType([StructField("class_id", IntegerType()), StructField("label", StringType()),
                             StructField("probability", DoubleType())])
    error = StructType([StructField(name, StringType()) for name in ("stage", "type", "message")])
    return StructType([StructField("predictions", ArrayType(prediction)), StructField("error", error)])


@dataclass(frozen=True)
class UdfSpec:
    """What a :func:`model_udf` worker needs, as plain values (pickled with the UDF)."""

    model: ModelSpec
    preprocess: Preprocess
    batch_size: int = 64
    top_k: int = 5


def model_udf(model, input_shape=(3, 224, 224), batch_size: int = 64, top_k: int = 5, *,
              mean=(0.0,), std=(1.0,), resize: str = "stretch", max_image_pixels: int = 64_000_000,
              context: str | None = None, epoch: int = 0, labels: str | None = None, data_name: str = "data",
              endpoint_url: str | None = None, region: str | None = None):
    """A Spark UDF from a column of encoded images to their top-k predictions.

    The model is loaded on the executors, once per Python worker, through
    :func:`get_classifier` (``spark.python.worker.reuse=true``, Spark's
    default, keeps the worker and so the model between tasks). Images are
    decoded exactly as the job does (:func:`decode_image`) and scored by the
    same :class:`Classifier`, ``batch_size`` at a time. The executors need
    ``mxinfer.py`` and ``utils.py`` (``--py-files``) and pandas and pyarrow.

    Not built on ``pyspark.ml.functions.predict_batch_udf``: it checks only the
    first row of each batch against the return type, so it cannot return a
    null ``predictions`` with an ``error`` for one unreadable image, and its
    model cache is keyed by a new id per UDF object, where ours is keyed by
    the model, shared with the job's code path.

    Parameters
    ----------
    model : str or ModelSpec
        Checkpoint prefix (``prefix-symbol.json``, ``prefix-%04d.params``;
        ``s3://``, ``http(s)://``, ``file://`` or a path every executor can
        read), or a :class:`ModelSpec`.
    input_shape : tuple of int
        ``(C, H, W)`` the model takes.
    batch_size : int
        Images per forward pass (the module's bound batch).
    top_k : int
        Predictions per image.
    mean, std, resize, max_image_pixels
        Preprocessing, as the job's options of the same names.
    context : str, optional
        ``cpu``, ``gpu`` (the GPU Spark assigned to the task, else partition
        modulo visible GPUs) or ``gpu:N``. Default: the ``ModelSpec``'s, cpu.
    epoch, labels, data_name, endpoint_url, region
        As :meth:`ModelSpec.from_prefix` when ``model`` is a prefix.

    Returns
    -------
    pyspark.sql.Column function
        Apply it to a binary column; it returns :func:`udf_return_type`:
        ``predictions`` (``class_id``, ``label``, ``probability``; highest
        first) and ``error`` (``stage`` decode or predict, ``type``,
        ``message``) for an image that could not be scored. A null input gives
        null fields.

    Examples
    --------
    >>> classify = model_udf("s3://bucket/models/resnet-18", top_k=3,  # doctest: +SKIP
    ...                      mean=(123.68, 116.78, 103.94), std=(58.4, 57.12, 57.38))
    >>> images = spark.read.format("binaryFile").load("s3://bucket/photos/")  # doctest: +SKIP
    >>> images.select("path", classify("content").alias("p")).select("path", "p.predictions")  # doctest: +SKIP
    """
    import typing

    import pandas as pd
    from pyspark.sql.functions import pandas_udf

    if isinstance(model, ModelSpec):
        spec = model if context is None else replace(model, context=context)
    else:
        spec = ModelSpec.from_prefix(str(model), epoch, labels_uri=labels, data_name=data_name,
                                     context=context or "cpu", endpoint_url=endpoint_url, region=region)
    choose_context(spec.context, None, 0, 1)  # a malformed context fails here, not on the executors
    if int(batch_size) < 1 or int(top_k) < 1:
        raise ValueError(f"batch_size and top_k must be at least 1, got {batch_size} and {top_k}")
    preprocess = Preprocess(input_shape=tuple(int(x) for x in input_shape), mean=tuple(mean), std=tuple(std),
                            resize=resize, max_image_pixels=int(max_image_pixels))
    udf_spec = UdfSpec(spec, preprocess, int(batch_size), int(top_k))

    def predict(batches):
        return _udf_batches(batches, udf_spec)

    # pandas_udf tells the UDF kind from real type hints; this module postpones
    # annotations and imports pandas lazily, so they are set here.
    predict.__annotations__ = {"batches": typing.Iterator[pd.Series], "return": typing.Iterator[pd.DataFrame]}
    return pandas_udf(predict, udf_return_type())


def _udf_batches(batches: Iterator, spec: UdfSpec) -> Iterator:
    """The executor side of :func:`model_udf`: Arrow batches of image bytes to frames of results."""
    import pandas as pd

    model = replace(spec.model, context=task_context(spec.model.context))
    classifier = get_classifier(model, spec.preprocess.input_shape, spec.batch_size)
    for series in batches:
        rows = score_images(classifier, list(series), spec.preprocess, spec.top_k)
        yield pd.DataFrame({"predictions": [p for p, _ in rows], "error": [e for _, e in rows]})


def score_images(classifier: Classifier, images: Sequence[bytes | None], preprocess: Preprocess,
                 top_k: int) -> list[tuple[list[dict] | None, dict | None]]:
    """Per image, ``(predictions, None)`` or ``(None, error)``; ``(None, None)`` for ``None``.

    Decodes and scores ``classifier.batch_size`` images at a time, so memory
    stays bounded however large the Arrow batch.
    """
    out: list[tuple[list[dict] | None, dict | None]] = [(None, None)] * len(images)

    def failed(stage, exc):
        return None, error_object(stage, exc)

    for start in range(0, len(images), classifier.batch_size):
        arrays, where = [], []
        for i in range(start, min(start + classifier.batch_size, len(images))):
            if images[i] is None:
                continue
            try:
                arrays.append(decode_image(bytes(images[i]), preprocess))
                where.append(i)
            except Exception as exc:  # noqa: BLE001 - an unreadable image is that row's error
                out[i] = failed("decode", exc)
        if not arrays:
            continue
        for i, (row, exc) in zip(where, _top_k_or_errors(classifier, arrays, top_k)):
            out[i] = failed("predict", exc) if exc is not None else (
                [{"class_id": c, "label": label, "probability": p} for c, label, p in row], None)
    return out


def _top_k_or_errors(classifier: Classifier, arrays: list[np.ndarray], top_k: int) -> list[tuple]:
    """One forward pass over ``arrays``; per row ``(top-k, None)`` or ``(None, the exception that failed it)``.

    The top-k is :meth:`Classifier.classify`'s row: ``(class_id, label,
    probability)``, highest first. A failed forward pass fails every row; a
    row whose scores are not finite fails alone. The job's lines and the UDF's
    rows are both made from this.
    """
    try:
        probs = classifier.probabilities(np.stack(arrays))
    except Exception as exc:  # noqa: BLE001 - a failed forward marks its images, other batches go on
        return [(None, exc)] * len(arrays)
    finite = np.isfinite(probs).all(axis=1)
    return [(classifier._labelled(row), None) if ok else (None, FloatingPointError("model output is not finite"))
            for ok, row in zip(finite, top_classes(probs, top_k))]


# ----------------------------------------------------------------------------
# Threads and memory of a Python worker


@dataclass(frozen=True)
class ThreadPlan:
    """What the driver knows about where the Python workers run, for :func:`worker_threads`.

    Since Spark 3.0 (SPARK-28843) every Python worker gets ``OMP_NUM_THREADS``
    = the executor's cores unless ``spark.executorEnv.OMP_NUM_THREADS`` is set,
    so a worker cannot tell Spark's value from a user's; the driver can.

    Parameters
    ----------
    omp_from_user : bool
        ``spark.executorEnv.OMP_NUM_THREADS`` is set: the worker's
        ``OMP_NUM_THREADS`` is the user's choice and wins.
    executors_by_host : tuple of (str, int)
        Registered executors per host, as the driver's SparkContext lists them.
    tasks_per_executor : int
        Tasks an executor runs at once (``spark.executor.cores // spark.task.cpus``).
    """

    omp_from_user: bool = False
    executors_by_host: tuple = ()
    tasks_per_executor: int = 1

    def workers_on(self, names: Iterable[str]) -> int:
        """Python workers at once on the host known by any of ``names``; the busiest host's if none matches.

        The busiest host is the safe guess: too few threads leave cores idle,
        too many make every worker on the host wait for each other.
        """
        counts = dict(self.executors_by_host)
        found = next((counts[name] for name in names if name in counts), None)
        executors = found if found is not None else max(counts.values(), default=1)
        return max(1, executors) * max(1, self.tasks_per_executor)


def host_names() -> list[str]:
    """The names the driver may list this host under: hostname, FQDN, address, Spark's and YARN's."""
    names = [socket.gethostname(), socket.getfqdn()]
    for variable in ("SPARK_LOCAL_IP", "SPARK_LOCAL_HOSTNAME", "NM_HOST"):
        if os.environ.get(variable):
            names.append(os.environ[variable])
    try:
        names.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    return names


def host_share(plan: ThreadPlan | None) -> dict:
    """This host's ``cores`` and the Python ``workers`` the driver's plan puts on it at once (``None``: no plan)."""
    return {"cores": os.cpu_count(), "workers": plan.workers_on(host_names()) if plan is not None else None}


def worker_threads(requested: int | None = None, plan: ThreadPlan | None = None) -> int:
    """How many cores one forward pass of this Python worker may use.

    ``requested`` (the ``threads`` option) if given; else ``OMP_NUM_THREADS``
    if the user set it (``spark.executorEnv.OMP_NUM_THREADS``, as ``plan``
    tells; without a plan any value counts); else, with a ``plan``, this
    host's cores divided among the Python workers the host runs at once (every
    core for one executor per node); without one, the task's cores
    (``spark.task.cpus``) if more than one, else every core of the machine.
    """
    if requested:
        return int(requested)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0 and (plan is None or plan.omp_from_user):
        return int(env)
    if plan is not None:
        return max(1, (os.cpu_count() or 1) // plan.workers_on(host_names()))
    task = _spark_task()
    cpus = task.cpus() if task is not None and hasattr(task, "cpus") else 1
    return cpus if cpus > 1 else (os.cpu_count() or 1)


def thread_env(threads: int) -> dict[str, str]:
    """The environment that gives MXNet's forward pass ``threads`` cores, and no more.

    ``OMP_NUM_THREADS`` sizes OpenMP (and oneDNN's convolutions); without it
    MXNet uses half the cores (ResNet-18 on 2 cores: 60 images/s by default,
    117 with 2 threads). ``MXNET_CPU_WORKER_NTHREADS`` (operators run at once)
    stays as the executor's environment sets it, else 1: one operator at a
    time with every thread, which is what a chain of convolutions needs.
    """
    return {"OMP_NUM_THREADS": str(threads),
            "MXNET_CPU_WORKER_NTHREADS": os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1")}


_threads_configured: list[int] = []
#: Tasks this Python worker has run; the summary plots its memory against it.
tasks_run = 0


def configure_threads(threads: int) -> int | None:
    """Apply :func:`thread_env` in this process if MXNet is not loaded yet; return the threads in force.

    libmxnet and its OpenMP runtime read these variables once, when they load,
    so this must run before the first ``import mxnet`` of the Python worker
    (``score_partition`` calls it first thing). Once MXNet is loaded the
    earlier setting stays, and is what this returns (``None``: MXNet's default).
    """
    if _threads_configured:
        return _threads_configured[0]
    if "mxnet" in sys.modules:
        env = os.environ.get("OMP_NUM_THREADS", "")
        in_force = int(env) if env.isdigit() else None
        # In an executor this is a mistake worth a warning; in a notebook or a
        # --dry-run on the driver, MXNet is there first by design.
        if in_force != threads and _spark_task() is not None:
            log.warning("MXNet was loaded before the threads setting (%d) could apply; it keeps %s", threads,
                        f"OMP_NUM_THREADS={env}" if env else "its default")
    else:
        os.environ.update(thread_env(threads))
        in_force = threads
    _threads_configured.append(in_force)
    return in_force


def _freeze_long_lived() -> None:
    """Take what this worker keeps for good (modules, the model, clients) out of the cyclic GC's sight.

    A reused PySpark worker runs ``gc.collect()`` after every task, and with
    MXNet, botocore and a model loaded a full collection costs 0.1-0.2 s of
    CPU each time (``make bench`` measured it). Once the first task has loaded
    everything, ``gc.freeze()`` moves the survivors of one last collection to
    the permanent generation, so later collections scan only new objects.
    Reference counting still frees frozen objects; only cycles among them
    would stay, and those are the long-lived ones.
    """
    gc.collect()
    gc.freeze()


def memory_bytes() -> dict[str, int | None]:
    """This process's resident memory now (``rss``, Linux only) and at its peak (``max_rss``)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows
        return {"rss": None, "max_rss": None}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    peak = peak if os.uname().sysname == "Darwin" else peak * 1024
    try:
        with open("/proc/self/statm") as handle:
            rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        rss = None
    return {"rss": rss, "max_rss": peak}


# ----------------------------------------------------------------------------
# One partition of the job


@dataclass(frozen=True)
class JobSpec:
    """Everything an executor needs, as plain values (pickled once per task)."""

    model: ModelSpec
    preprocess: Preprocess
    bucket: str
    batch_size: int = 64
    top_k: int = 5
    endpoint_url: str | None = None
    region: str | None = None
    io_threads: int = 16
    max_in_flight: int = 128
    max_object_bytes: int = 50 * 1024 * 1024
    s3_max_attempts: int = 5
    #: ``lean`` or ``botocore``: how executors GET objects (:func:`utils.s3_reader`).
    s3_reader: str = "lean"
    #: The driver's local copy of the --handler file; executors load the copy
    #: shipped with ``SparkContext.addFile`` under the same name.
    handler: str | None = None
    #: Images per forward pass (the module's bound batch); ``None``: ``batch_size``.
    micro_batch_size: int | None = None
    #: MXNet/OpenMP threads per Python worker; ``None``: see :func:`worker_threads`.
    threads: int | None = None
    #: Where the workers run, from the driver (``infer_main.thread_plan``); ``None`` outside a Spark job.
    thread_plan: ThreadPlan | None = None
    #: ``fp32`` or ``int8``; with ``int8``, ``model`` is the job's quantized checkpoint.
    precision: str = "fp32"
    #: Where each batch's lines become durable: ``s3://output_bucket/parts_prefix``
    #: (see :func:`part_key`). ``None``: the lines travel back to the driver instead.
    output_bucket: str | None = None
    parts_prefix: str | None = None
    #: The run's plan in ``output_bucket`` (``listing.write_plan``): when set, a
    #: partition holds one ``(offset, length)`` span and the task reads its keys from there.
    plan_key: str | None = None

    @property
    def forward_batch(self) -> int:
        """The module's bound batch: ``micro_batch_size``, never more than ``batch_size``."""
        return max(1, min(self.micro_batch_size or self.batch_size, self.batch_size))


def part_key(parts_prefix: str, index: int) -> str:
    """The S3 key of batch ``index``'s lines under a run's ``parts_prefix``.

    A batch always writes the same key, so a retried or speculative task
    replaces the object (S3 PUTs are atomic) instead of adding a second copy.
    """
    return f"{parts_prefix}part-{index:08d}.jsonl.gz"


#: ``<_io.BytesIO object at 0x7f...>`` in a message (Pillow's "cannot identify image file").
_OBJECT_ADDRESS = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def error_object(stage: str, exc: BaseException) -> dict:
    """The ``error`` member of a failed key's line (and of a failed UDF row).

    Memory addresses are cut from the message, so the same image fails with
    the same line in every run (a resumed output equals an uninterrupted one).
    """
    return {"stage": stage, "type": type(exc).__name__, "message": _OBJECT_ADDRESS.sub(r"<\1>", first_line(exc))}


def error_line(key: str, stage: str, exc: BaseException) -> str:
    return json.dumps({"key": key, "error": error_object(stage, exc)}, ensure_ascii=False)


#: An object over ``max_object_bytes`` (defined in utils, which raises it from a GET's Content-Length).
ObjectTooLargeError = utils.ObjectTooLargeError


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    pool = _pools.get(threads)
    if pool is None:
        pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="fetch")
    return pool


def _fetch_and_decode(reader: utils.ObjectReader, job: JobSpec, handlers: Handlers | None, key: str, size: int,
                      io_stats: utils.IOStats):
    """Download and decode one object (with ``handlers.input_handler`` if there is one).

    Returns ``(key, array, None, times)``, or ``(key, None, (stage, error_line), times)``.
    """
    started = time.perf_counter()

    def failed(stage, exc, times):
        return key, None, (stage, error_line(key, stage, exc)), times

    if size is not None and size > job.max_object_bytes:
        return failed("download", utils.too_large(size, job.max_object_bytes), (0.0, 0.0))
    try:
        # Also checked from the GET's Content-Length: a manifest may not give sizes (size -1).
        data = reader.read(job.bucket, key, stats=io_stats, max_bytes=job.max_object_bytes)
    except Exception as exc:  # noqa: BLE001 - every download failure becomes this key's error line
        return failed("download", exc, (time.perf_counter() - started, 0.0))
    downloaded = time.perf_counter()
    try:
        if handlers is not None and handlers.input_handler is not None:
            array = handlers.decode(key, data, job.preprocess.input_shape)
        else:
            array = decode_image(data, job.preprocess)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this image's, not the batch's
        return failed("decode", exc, (downloaded - started, time.perf_counter() - downloaded))
    return key, array, None, (downloaded - started, time.perf_counter() - downloaded)


def _prefetched(items: Sequence[tuple[str, int]], work, pool: ThreadPoolExecutor, window: int) -> Iterator:
    """Results of ``work(key, size)`` in input order, with at most ``window`` in flight.

    The window bounds memory (decoded images waiting for the model) while
    downloads and decoding run ahead of the model on the pool's threads. The
    first ``window`` items are submitted at once, on the call, not on the first
    ``next()``: a worker's first task fetches while it loads the model.
    """
    pending: deque = deque()
    it = iter(items)
    for key, size in it:
        pending.append(pool.submit(work, key, size))
        if len(pending) >= window:
            break
    return _drain(pending, it, work, pool)


def _drain(pending: deque, it: Iterator, work, pool: ThreadPoolExecutor) -> Iterator:
    while pending:
        result = pending.popleft().result()
        nxt = next(it, None)
        if nxt is not None:
            pending.append(pool.submit(work, *nxt))
        yield result


def _task_attempt() -> int:
    """This task's attempt number (0 the first time); 0 outside Spark."""
    task = _spark_task()
    return task.attemptNumber() if task is not None else 0


def output_lines(model: Predictor, keys: list[str], arrays: list[np.ndarray], top_k: int,
                 handlers: Handlers | None = None) -> list[tuple[str, str, bool]]:
    """One forward pass over ``arrays``; per key, ``(key, JSON line, failed)``.

    The line holds the top-k ``predictions`` (``model`` is a
    :class:`Classifier`), or the object of the user's ``output_handler``. A
    failed forward pass fails every key of the batch; a non-finite output or
    a failing handler fails its key only. Failures are ``predict`` error lines.
    """
    out = []
    if handlers is None or handlers.output_handler is None:
        for key, (row, exc) in zip(keys, _top_k_or_errors(model, arrays, top_k)):
            if exc is not None:
                out.append((key, error_line(key, "predict", exc), True))
            else:
                line = json.dumps({"key": key, "predictions": model.prediction_entries(row)}, ensure_ascii=False)
                out.append((key, line, False))
        return out
    try:
        outputs = model.predict(np.stack(arrays))
    except Exception as exc:  # noqa: BLE001 - a failed forward marks its images, other batches go on
        return [(key, error_line(key, "predict", exc), True) for key in keys]
    for i, key in enumerate(keys):
        try:
            out.append((key, handlers.output_line(key, [o[i] for o in outputs]), False))
        except Exception as exc:  # noqa: BLE001 - the user's code failing on one key fails that key
            out.append((key, error_line(key, "predict", exc), True))
    return out


def score_partition(index: int, items: Iterable, job: JobSpec) -> Iterator[tuple]:
    """Score one partition (one batch); yields a single ``(index, lines, blob, stats)``.

    ``items`` are ``(key, size)`` pairs; ``None`` marks a padding slot, which
    downloads nothing and yields nothing. With ``job.plan_key``, ``items`` is
    one ``(offset, length)`` span of the run's plan instead, and the batch's
    keys come from one ranged GET of it (the driver never ships the keys). The partition's JSON lines, sorted by
    key, are written to S3 as one gzip object of JSON Lines (:func:`part_key`)
    when ``job.parts_prefix`` is set, and ``blob`` is ``None``; otherwise
    ``blob`` is the lines joined by newlines and zlib-compressed, for the caller.
    """
    global tasks_run
    started, started_at, started_cpu = time.perf_counter(), time.time(), time.process_time()
    # First thing: MXNet reads its thread settings when it loads, and a handler may import it.
    threads = configure_threads(worker_threads(job.threads, job.thread_plan))
    handlers = get_handlers(job.handler)
    kind = model_class(handlers)
    reader = utils.s3_reader(job.endpoint_url, job.region, max_attempts=job.s3_max_attempts,
                             max_pool_connections=max(10, job.io_threads + 2), kind=job.s3_reader)
    io_stats = utils.IOStats()
    if job.plan_key is not None:
        [(offset, length)] = list(items)
        plan = utils.read_object(reader.client, job.output_bucket, job.plan_key, stats=io_stats,
                                 byte_range=(offset, length))
        real = listing.read_plan_batch(plan)
    else:
        real = [item for item in items if item is not None]
    lines: list[tuple[str, str]] = []
    timing = {"download": 0.0, "decode": 0.0, "forward": 0.0, "wait": 0.0}
    errors = {"download": 0, "decode": 0, "predict": 0}

    def work(key, size):
        return _fetch_and_decode(reader, job, handlers, key, size, io_stats)

    # Downloading and decoding start now, so a worker's first task fetches while MXNet
    # loads and the model comes in; later tasks find the model in this worker's cache.
    results = _prefetched(real, work, _pool(job.io_threads), max(job.max_in_flight, 1))
    try:
        # The cache keys on the device, so each GPU of a worker gets its own module.
        spec = replace(job.model, context=task_context(job.model.context, index))
        # Bound at the micro-batch: the first forward pass starts as soon as that
        # many images are decoded, while the pool fetches the rest of the batch.
        classifier = get_model(spec, job.preprocess.input_shape, job.forward_batch, kind)
    except Exception as exc:
        # Same message on every attempt, so the driver's error names the cause
        # (weights unreachable from the executors, corrupt, ...), not a stack.
        raise ModelError(f"executor {socket.gethostname()} cannot load the model {job.model.params_uri}: "
                         f"{type(exc).__name__}: {first_line(exc)}") from exc

    batch_keys: list[str] = []
    batch_arrays: list[np.ndarray] = []

    def flush():
        forward_started = time.perf_counter()
        for key, line, failed in output_lines(classifier, batch_keys, batch_arrays, job.top_k, handlers):
            lines.append((key, line))
            errors["predict"] += failed
        timing["forward"] += time.perf_counter() - forward_started
        batch_keys.clear()
        batch_arrays.clear()

    while True:
        wait_started = time.perf_counter()
        result = next(results, None)
        timing["wait"] += time.perf_counter() - wait_started
        if result is None:
            break
        key, array, failure, (download_s, decode_s) = result
        timing["download"] += download_s
        timing["decode"] += decode_s
        if failure is not None:
            stage, line = failure
            lines.append((key, line))
            errors[stage] += 1
            continue
        batch_keys.append(key)
        batch_arrays.append(array)
        if len(batch_keys) == classifier.batch_size:
            flush()
    if batch_keys:
        flush()
    lines.sort()
    text = "\n".join(line for _, line in lines).encode("utf-8")
    write_started = time.perf_counter()
    if job.parts_prefix is not None:
        # Durable before Spark hears the task is done: a dead driver loses nothing
        # this task scored. gzip level 1: ~5x smaller for a fraction of a ms.
        reader.client.put_object(Bucket=job.output_bucket, Key=part_key(job.parts_prefix, index),
                                 Body=gzip.compress(text + b"\n" if text else text, compresslevel=1),
                                 ContentType="application/gzip")
        blob = None
    else:
        blob = zlib.compress(text, 1)
    timing["write"] = time.perf_counter() - write_started
    stats = {
        "partition": index,
        "executor": f"{socket.gethostname()}/{os.getppid()}",
        "worker_pid": os.getpid(),
        "attempt": _task_attempt(),
        "keys": len(real),
        "errors": errors,
        # cpu: this worker's CPU seconds (all its threads) during the task.
        "seconds": {**{k: round(v, 4) for k, v in timing.items()}, "task": round(time.perf_counter() - started, 4),
                    "cpu": round(time.process_time() - started_cpu, 4)},
        "s3_retries": {"request": io_stats.request_retries, "body": io_stats.body_retries},
        "model_loads": load_count,
        # Wall-clock start and end, for throughput from the first task's start to the last one's end.
        "started": started_at,
        "ended": time.time(),
        "threads": threads,
        "host": host_share(job.thread_plan),
        "worker_task": tasks_run + 1,
        "memory": memory_bytes(),
    }
    tasks_run += 1
    if tasks_run == 1 and _spark_task() is not None:
        _freeze_long_lived()
    log.info("partition %d: %d keys, %d errors in %.2fs", index, len(real), sum(errors.values()),
             stats["seconds"]["task"])
    yield index, len(lines), blob, stats


class StatsFold:
    """The stats of every task of a job, folded as tasks finish: one entry per executor, worker and host.

    Its size grows with the cluster, not with the job: a job of ten million
    keys (156,000 tasks) holds no list of task stats anywhere. Executors fold
    their task's stats into a Spark accumulator (:class:`StatsAccumulator`),
    which the driver merges as each task ends; Spark applies a successful
    task's update once, also when the task was retried.
    """

    STAGES = ("download", "decode", "forward", "wait", "write", "task", "cpu")

    def __init__(self):
        self.tasks = 0
        self.keys = 0
        self.errors = {"download": 0, "decode": 0, "predict": 0}
        self.s3_retries = {"request": 0, "body": 0}
        #: Tasks whose result came from a retried attempt (lost worker or executor, ...).
        self.retried = 0
        self.first_start: float | None = None
        self.last_end: float | None = None
        self.executors: dict[str, dict] = {}
        self.workers: dict[str, dict] = {}
        self.hosts: dict[str, dict] = {}

    @classmethod
    def of(cls, stats: Iterable[dict]) -> StatsFold:
        """A fold of task stats dicts (as :func:`score_partition` yields them)."""
        fold = cls()
        for s in stats:
            fold.add(s)
        return fold

    def add(self, s: dict) -> StatsFold:
        """Fold in one task's stats."""
        self.tasks += 1
        self.keys += s["keys"]
        for k in self.errors:
            self.errors[k] += s["errors"][k]
        for k in self.s3_retries:
            self.s3_retries[k] += s["s3_retries"][k]
        self.retried += s.get("attempt", 0) > 0
        if "started" in s:
            self.first_start = min(filter(None, (self.first_start, s["started"])))
            self.last_end = max(filter(None, (self.last_end, s["ended"])))
        e = self.executors.setdefault(s["executor"], {"batches": 0, "images": 0, **dict.fromkeys(self.STAGES, 0.0)})
        e["batches"] += 1
        e["images"] += s["keys"]
        for k in self.STAGES:
            e[k] += s["seconds"].get(k, 0.0)
        w = self.workers.setdefault(f"{s['executor']}/{s['worker_pid']}", {"batches": 0, "model_loads": 0})
        w["batches"] += 1
        w["model_loads"] = max(w["model_loads"], s["model_loads"])
        if "worker_task" in s:
            n = s["worker_task"]
            if n >= w.get("last_task", 0):
                w["last_task"], w["threads"] = n, s["threads"]
                w["last_rss"] = s["memory"]["rss"]
            if n <= w.get("first", (n + 1,))[0]:
                w["first"] = (n, s["started"], s["ended"], s["keys"])
            w["task_seconds"] = w.get("task_seconds", 0.0) + s["ended"] - s["started"]
            w["last_end"] = max(w.get("last_end", s["ended"]), s["ended"])
            if s["memory"]["max_rss"]:
                w["max_rss"] = max(w.get("max_rss", 0), s["memory"]["max_rss"])
            # Resident memory after the worker's 1st, 2nd, 5th, 10th, 20th, ... task: flat once warm, or it leaks.
            if s["memory"]["rss"] is not None and str(n).strip("0") in ("1", "2", "5"):
                w.setdefault("rss_after", {})[n] = s["memory"]["rss"]
        share = s.get("host") or {}
        if s.get("threads") is not None and share.get("cores") is not None:
            h = self.hosts.setdefault(s["executor"].rsplit("/", 1)[0],
                                      {"cores": share["cores"], "planned": 0, "executors": {}})
            h["planned"] = max(h["planned"], share.get("workers") or 0)
            h["executors"][s["executor"]] = max(h["executors"].get(s["executor"], 0), s["threads"])
        return self

    def merge(self, other: StatsFold) -> StatsFold:
        """Fold in another fold (an executor's, when its task ends)."""
        self.tasks += other.tasks
        self.keys += other.keys
        for k in self.errors:
            self.errors[k] += other.errors[k]
        for k in self.s3_retries:
            self.s3_retries[k] += other.s3_retries[k]
        self.retried += other.retried
        self.first_start = min(filter(None, (self.first_start, other.first_start)), default=None)
        self.last_end = max(filter(None, (self.last_end, other.last_end)), default=None)
        for name, o in other.executors.items():
            e = self.executors.setdefault(name, {"batches": 0, "images": 0, **dict.fromkeys(self.STAGES, 0.0)})
            for k, v in o.items():
                e[k] += v
        for name, o in other.workers.items():
            w = self.workers.get(name)
            if w is None:
                self.workers[name] = {k: dict(v) if isinstance(v, dict) else v for k, v in o.items()}
                continue
            w["batches"] += o["batches"]
            w["model_loads"] = max(w["model_loads"], o["model_loads"])
            if "last_task" not in o:
                continue
            if o["last_task"] >= w.get("last_task", 0):
                w["last_task"], w["threads"], w["last_rss"] = o["last_task"], o["threads"], o["last_rss"]
            if "first" not in w or o["first"][0] < w["first"][0]:
                w["first"] = o["first"]
            w["task_seconds"] = w.get("task_seconds", 0.0) + o["task_seconds"]
            w["last_end"] = max(w.get("last_end", o["last_end"]), o["last_end"])
            if "max_rss" in o:
                w["max_rss"] = max(w.get("max_rss", 0), o["max_rss"])
            w.setdefault("rss_after", {}).update(o.get("rss_after", {}))
        for name, o in other.hosts.items():
            h = self.hosts.setdefault(name, {"cores": o["cores"], "planned": 0, "executors": {}})
            h["planned"] = max(h["planned"], o["planned"])
            for executor, threads in o["executors"].items():
                h["executors"][executor] = max(h["executors"].get(executor, 0), threads)
        return self

    def worker_summary(self, name: str) -> dict:
        """One Python worker as the job's summary shows it."""
        w = self.workers[name]
        out = {"batches": w["batches"], "model_loads": w["model_loads"]}
        if "last_task" not in w:
            return out
        _, started, ended, keys = w["first"]
        out["threads"] = w["threads"]
        # The first task includes loading the model: steady state starts after it.
        out["first_task"] = {"started": started, "ended": ended, "images": keys}
        # In tasks, and idle between them (Spark handing over the next task).
        out["task_seconds"] = round(w["task_seconds"], 3)
        out["idle_between_tasks_seconds"] = round(w["last_end"] - started - w["task_seconds"], 3)
        if "max_rss" in w:
            out["max_rss_bytes"] = w["max_rss"]
        after = {str(k): v for k, v in sorted(w.get("rss_after", {}).items())}
        if w.get("last_rss") is not None:
            after["last"] = w["last_rss"]
        out["rss_bytes_after_task"] = after
        return out


try:  # executors and the driver have pyspark; the library's other users may not
    from pyspark.accumulators import AccumulatorParam as _AccumulatorParam
except ImportError:  # pragma: no cover - without pyspark there is no accumulator to make
    _AccumulatorParam = object


class StatsAccumulator(_AccumulatorParam):
    """Spark accumulator type of a :class:`StatsFold`: ``sc.accumulator(StatsFold(), StatsAccumulator())``."""

    def zero(self, value: StatsFold) -> StatsFold:
        return StatsFold()

    def addInPlace(self, value1: StatsFold, value2: StatsFold) -> StatsFold:
        return value1.merge(value2)


def score_into(index: int, items: Iterable, job: JobSpec, stats) -> Iterator[int]:
    """:func:`score_partition`, with its stats added to the accumulator ``stats``; yields the keys it scored."""
    for _, _, _, task_stats in score_partition(index, items, job):
        stats.add(StatsFold().add(task_stats))
        yield task_stats["keys"]
