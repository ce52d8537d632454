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
users to reproduce): ``PIL.Image.open`` -> ``ImageOps.exif_transpose`` -> RGB
(``convert("RGB")``; 16-bit and 32-bit greyscale are scaled to 8 bits first, not
clipped) -> ``resize((W, H), BILINEAR)`` (or short side to ``H*256/224`` then a
centre crop) -> float32 CHW -> ``(x - mean) / std`` on 0-255 values.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import threading
import time
import warnings
import zlib
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np
from PIL import Image, ImageOps

import utils

log = logging.getLogger(__name__)

DEFAULT_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")
RESIZE_MODES = ("stretch", "short-side-crop")
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
    """

    input_shape: tuple = (3, 224, 224)
    mean: tuple = (0.0,)
    std: tuple = (1.0,)
    resize: str = "stretch"
    max_image_pixels: int = 100_000_000

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
        img.load()
        img = ImageOps.exif_transpose(img)
        img = to_rgb(img, "RGB" if channels == 3 else "L")
        if prep.resize == "stretch":
            img = img.resize((width, height), Image.BILINEAR)
        else:
            img = _short_side_crop(img, width, height)
        array = np.asarray(img, dtype=np.float32)
    if channels == 1:
        array = array[np.newaxis, :, :]
    else:
        array = array.transpose(2, 0, 1)
    mean = np.asarray(prep.mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(prep.std, dtype=np.float32).reshape(-1, 1, 1)
    return np.ascontiguousarray((array - mean) / std, dtype=np.float32)


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

    def read(self, uri: str) -> bytes:
        client = utils.s3_client(self.endpoint_url, self.region) if utils.is_s3_uri(uri) else None
        return utils.read_uri(uri, client)


def mx_context(name: str):
    """``cpu``, ``gpu`` or ``gpu:N`` to an MXNet context."""
    import mxnet as mx

    kind, _, index = name.partition(":")
    if kind == "cpu":
        return mx.cpu()
    if kind == "gpu":
        return mx.gpu(int(index or 0))
    raise ValueError(f"context must be cpu, gpu or gpu:N, got {name!r}")


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
            spec = ModelSpec(**{**asdict(spec), "context": context})
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
                             f"{_first_line(exc)}") from exc
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
            raise ModelError(f"the model rejects input shape {self.input_shape} (C,H,W): "
                             f"{_first_line(exc)}; set --input-shape to what it was trained on") from exc
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
                                 f"{tuple(want)} for input shape {self.input_shape}")
        self.output_shapes = [tuple(s[1:]) for s in out_shapes]
        self.num_params = int(sum(int(np.prod(v.shape)) for v in arg_params.values()))

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
            "num_classes": int(np.prod(self.output_shapes[0])) if self.output_shapes else 0,
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
        rows = []
        for row in top_classes(probabilities, k):
            entries = []
            for class_id, prob in row:
                entry = {"class_id": class_id}
                if self.labels:
                    entry["label"] = self.labels[class_id]
                entry["probability"] = float(f"{prob:.6g}")
                entries.append(entry)
            rows.append(entries)
        return rows


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


_models: dict[tuple, Classifier] = {}
_models_lock = threading.Lock()
#: How many times this process has loaded a model; tests read it to prove reuse.
load_count = 0


def get_classifier(spec: ModelSpec, input_shape: tuple, batch_size: int) -> Classifier:
    """This Python worker's classifier for ``spec``, loaded on first use and then reused.

    Relies on ``spark.python.worker.reuse=true`` (Spark's default): the worker
    process, and so this cache, outlives the task. Keyed by everything that
    changes the bound module; kept small because an executor serves one job.
    """
    global load_count
    key = (spec, tuple(input_shape), int(batch_size))
    with _models_lock:
        model = _models.get(key)
        if model is None:
            started = time.perf_counter()
            model = Classifier(spec, input_shape, batch_size)
            load_count += 1
            log.info("loaded model %s (%s, batch %d) in %.2fs; loads in this worker: %d",
                     spec.symbol_uri, model.model_summary()["head"], batch_size,
                     time.perf_counter() - started, load_count)
            if len(_models) >= 4:
                _models.pop(next(iter(_models)))
            _models[key] = model
        return model


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
    io_threads: int = 8
    max_in_flight: int = 128
    max_object_bytes: int = 50 * 1024 * 1024
    s3_max_attempts: int = 5


def error_line(key: str, stage: str, exc: BaseException) -> str:
    return json.dumps({"key": key, "error": {"stage": stage, "type": type(exc).__name__,
                                             "message": _first_line(exc)}}, ensure_ascii=False)


class ObjectTooLargeError(ValueError):
    """An object over ``max_object_bytes``; refused from its listed size, never downloaded."""


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(threads: int) -> ThreadPoolExecutor:
    pool = _pools.get(threads)
    if pool is None:
        pool = _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="fetch")
    return pool


def _fetch_and_decode(client, job: JobSpec, key: str, size: int, io_stats: utils.IOStats):
    """Download and decode one object: ``(key, array, None, times)`` or ``(key, None, error_line, times)``."""
    started = time.perf_counter()
    if size > job.max_object_bytes:
        exc = ObjectTooLargeError(f"object is {size} bytes, over max_object_bytes={job.max_object_bytes}")
        return key, None, error_line(key, "download", exc), (0.0, 0.0)
    try:
        data = utils.read_object(client, job.bucket, key, stats=io_stats)
    except Exception as exc:  # noqa: BLE001 - every download failure becomes this key's error line
        return key, None, error_line(key, "download", exc), (time.perf_counter() - started, 0.0)
    downloaded = time.perf_counter()
    try:
        array = decode_image(data, job.preprocess)
    except Exception as exc:  # noqa: BLE001 - any decoder failure is this image's, not the batch's
        return key, None, error_line(key, "decode", exc), (downloaded - started, time.perf_counter() - downloaded)
    return key, array, None, (downloaded - started, time.perf_counter() - downloaded)


def _prefetched(items: Sequence[tuple[str, int]], work, pool: ThreadPoolExecutor, window: int) -> Iterator:
    """Results of ``work(key, size)`` in input order, with at most ``window`` in flight.

    The window bounds memory (decoded images waiting for the model) while
    downloads and decoding run ahead of the model on the pool's threads.
    """
    pending: deque = deque()
    it = iter(items)
    for key, size in it:
        pending.append(pool.submit(work, key, size))
        if len(pending) >= window:
            break
    while pending:
        result = pending.popleft().result()
        nxt = next(it, None)
        if nxt is not None:
            pending.append(pool.submit(work, *nxt))
        yield result


def _task_attempt() -> int:
    """This task's attempt number (0 the first time); 0 outside Spark."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - the library used without Spark installed
        return 0
    context = TaskContext.get()
    return context.attemptNumber() if context is not None else 0


def score_partition(index: int, items: Iterable, job: JobSpec) -> Iterator[tuple]:
    """Score one partition (one batch); yields a single ``(index, lines, blob, stats)``.

    ``items`` are ``(key, size)`` pairs; ``None`` marks a padding slot, which
    downloads nothing and yields nothing. ``blob`` is the partition's JSON
    lines, sorted by key and zlib-compressed, so a million results travel to
    the driver compactly.
    """
    started = time.perf_counter()
    real = [item for item in items if item is not None]
    try:
        classifier = get_classifier(job.model, job.preprocess.input_shape, job.batch_size)
    except Exception as exc:
        # Same message on every attempt, so the driver's error names the cause
        # (weights unreachable from the executors, corrupt, ...), not a stack.
        raise ModelError(f"executor {socket.gethostname()} cannot load the model {job.model.params_uri}: "
                         f"{type(exc).__name__}: {_first_line(exc)}") from exc
    client = utils.s3_client(job.endpoint_url, job.region, max_attempts=job.s3_max_attempts,
                             max_pool_connections=max(10, job.io_threads + 2))
    io_stats = utils.IOStats()
    lines: list[tuple[str, str]] = []
    timing = {"download": 0.0, "decode": 0.0, "forward": 0.0, "wait": 0.0}
    errors = {"download": 0, "decode": 0, "predict": 0}

    def work(key, size):
        return _fetch_and_decode(client, job, key, size, io_stats)

    batch_keys: list[str] = []
    batch_arrays: list[np.ndarray] = []

    def flush():
        forward_started = time.perf_counter()
        try:
            probs = classifier.probabilities(np.stack(batch_arrays))
        except Exception as exc:  # noqa: BLE001 - a failed forward marks its images, other batches go on
            for key in batch_keys:
                lines.append((key, error_line(key, "predict", exc)))
                errors["predict"] += 1
        else:
            finite = np.isfinite(probs).all(axis=1)
            for key, ok, preds in zip(batch_keys, finite, classifier.prediction_dicts(probs, job.top_k)):
                if ok:
                    lines.append((key, json.dumps({"key": key, "predictions": preds}, ensure_ascii=False)))
                else:
                    lines.append((key, error_line(key, "predict", FloatingPointError("model output is not finite"))))
                    errors["predict"] += 1
        timing["forward"] += time.perf_counter() - forward_started
        batch_keys.clear()
        batch_arrays.clear()

    pool = _pool(job.io_threads)
    results = _prefetched(real, work, pool, max(job.max_in_flight, 1))
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
            lines.append((key, failure))
            errors[json.loads(failure)["error"]["stage"]] += 1
            continue
        batch_keys.append(key)
        batch_arrays.append(array)
        if len(batch_keys) == classifier.batch_size:
            flush()
    if batch_keys:
        flush()
    lines.sort()
    blob = zlib.compress("\n".join(line for _, line in lines).encode("utf-8"), 1)
    stats = {
        "partition": index,
        "executor": f"{socket.gethostname()}/{os.getppid()}",
        "worker_pid": os.getpid(),
        "attempt": _task_attempt(),
        "keys": len(real),
        "errors": errors,
        "seconds": {**{k: round(v, 4) for k, v in timing.items()}, "task": round(time.perf_counter() - started, 4)},
        "s3_retries": {"request": io_stats.request_retries, "body": io_stats.body_retries},
        "model_loads": load_count,
    }
    log.info("partition %d: %d keys, %d errors in %.2fs", index, len(real), sum(errors.values()),
             stats["seconds"]["task"])
    yield index, len(lines), blob, stats
