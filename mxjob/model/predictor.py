"""The model: a checkpoint (:class:`ModelSpec`), bound once as a :class:`Predictor`.

:class:`Predictor` maps NCHW float32 arrays to the model's outputs; each
task's class adds what its task makes of them (:mod:`mxjob.tasks`).
:func:`get_model` is the per-worker cache the job and the UDF load through
(held in :mod:`mxjob.core.state`), so a Python worker binds a model once and
reuses it for every later task (``spark.python.worker.reuse=true``, Spark's
default).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import io
import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from mxjob.core import constants, state
from mxjob.core.errors import first_line, plural
from mxjob.model.device import mx_context
from mxjob.model.preprocess import Preprocess, decode_into
from mxjob.model.worker import import_mxnet
from mxjob.s3 import clients, reads, uris

log = logging.getLogger(__name__)

# Graph heads that already end in a probability distribution; any other head is
# treated as logits and gets a softmax.
SOFTMAX_OPS = frozenset({"SoftmaxOutput", "softmax", "SoftmaxActivation", "Softmax"})


class ModelError(Exception):
    """A checkpoint that cannot serve this job (missing weight, wrong shape, ...)."""


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
# The checkpoint and the bound module


@dataclass(frozen=True)
class ModelSpec:
    """Where a checkpoint lives; plain strings so it pickles to executors.

    ``labels_uri`` of ``None`` means: ``synset.txt`` beside the symbol file if it
    exists, else class ids only; ``""`` means no labels.
    """

    symbol_uri: str
    params_uri: str
    labels_uri: str | None = None
    data_name: str = constants.DEFAULT.data_name
    context: str = constants.DEFAULT.context
    endpoint_url: str | None = None
    region: str | None = None
    #: Attempts per S3 read of the model's files (``--s3-max-attempts``).
    s3_max_attempts: int = constants.DEFAULT.s3_max_attempts
    #: The layer an :class:`Embedder` returns (``--output-layer``); ``None``: the last FullyConnected's input.
    output_layer: str | None = constants.DEFAULT.output_layer

    @classmethod
    def from_prefix(cls, prefix: str, epoch: int = 0, **kwargs) -> ModelSpec:
        """``prefix-symbol.json`` and ``prefix-%04d.params``, as MXNet's checkpoints."""
        return cls(f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params", **kwargs)

    #: The files are local to the driver, which shipped them with ``SparkContext.addFile``
    #: (the job's int8 checkpoint); a Spark task reads its copy, found by name.
    shipped: bool = False

    def read(self, uri: str) -> bytes:
        """The bytes of one of the model's files (``uri`` as :func:`reads.read_uri` takes it).

        An ``s3://`` file is read with ``endpoint_url``, ``region`` and
        ``s3_max_attempts``; a shipped file from the task's local copy.
        """
        if self.shipped and state.spark_task() is not None:
            from pyspark import SparkFiles

            uri = SparkFiles.get(os.path.basename(uri))
        client = (clients.s3_client(self.endpoint_url, self.region, max_attempts=self.s3_max_attempts)
                  if uris.is_s3_uri(uri) else None)
        return reads.read_uri(uri, client)

    def shipped_files(self) -> list[str]:
        """The local files a Spark job must ``addFile`` for this model: none unless ``shipped``."""
        return [uri for uri in (self.symbol_uri, self.params_uri, self.labels_uri) if uri] if self.shipped else []


def read_labels(spec: ModelSpec) -> tuple[list[str] | None, str | None]:
    """``(labels, uri)`` from ``spec.labels_uri``, else ``synset.txt`` beside the symbol file if it exists.

    A labels file named explicitly must exist; the implicit one is optional.
    """
    explicit = spec.labels_uri is not None
    uri = spec.labels_uri if explicit else uris.sibling_uri(spec.symbol_uri, "synset.txt")
    if not uri:
        return None, None
    try:
        return parse_labels(spec.read(uri).decode("utf-8")), uri
    except FileNotFoundError:
        if explicit:
            raise ModelError(f"labels file {uri} does not exist") from None
        return None, uri
    except Exception as exc:
        # Without s3:ListBucket, S3 answers a missing object with AccessDenied;
        # the implicit synset.txt is optional, so go on with class ids only.
        if explicit or "AccessDenied" not in str(exc):
            raise
        log.warning("cannot read %s (%s); results carry class ids only; set --labels to "
                    "name a labels file", uri, first_line(exc))
        return None, uri


def split_params(saved: dict) -> tuple[dict, dict]:
    """A loaded ``.params`` file's ``(arg_params, aux_params)``: its ``arg:`` and ``aux:`` entries, unprefixed."""
    return ({k[4:]: v for k, v in saved.items() if k.startswith("arg:")},
            {k[4:]: v for k, v in saved.items() if k.startswith("aux:")})


def bind(symbol, arg_params: dict, aux_params: dict, data_name: str, input_shape: tuple, batch_size: int,
         context=None):
    """An inference Module for ``symbol``, bound at ``(batch_size, *input_shape)`` on ``context`` (default the
    CPU), holding these weights."""
    import mxnet as mx

    label_names = [n for n in symbol.list_arguments() if n.endswith("_label")]
    module = mx.mod.Module(symbol, data_names=[data_name], label_names=label_names,
                           context=mx.cpu() if context is None else context)
    with warnings.catch_warnings():
        # Inference binds no label shapes; Module warns that they differ from label_names.
        warnings.filterwarnings("ignore", message="Data provided by label_shapes")
        module.bind(data_shapes=[(data_name, (batch_size, *input_shape))], for_training=False)
    module.set_params(arg_params, aux_params, allow_missing=False, allow_extra=True)
    return module


def padded_batches(arrays: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """Each ``batch_size`` rows of ``arrays`` in turn, the last padded with zeros, and how many of its rows are real."""
    for start in range(0, len(arrays), batch_size):
        batch = arrays[start:start + batch_size]
        rows = len(batch)
        if rows < batch_size:
            batch = np.concatenate([batch, np.zeros((batch_size - rows, *batch.shape[1:]), batch.dtype)])
        yield batch, rows


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

    def __init__(self, model, input_shape=constants.DEFAULT.input_shape, batch_size: int = constants.DEFAULT.batch_size,
                 context: str | None = None):
        import_mxnet()  # the first import in a worker: timed, and without the optional packages it would load
        import mxnet as mx

        spec = model if isinstance(model, ModelSpec) else ModelSpec.from_prefix(model)
        if context is not None:
            spec = replace(spec, context=context)
        self.spec = spec
        self.input_shape = tuple(int(x) for x in input_shape)
        self.batch_size = int(batch_size)
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        symbol_bytes = spec.read(spec.symbol_uri)
        symbol_json = symbol_bytes.decode("utf-8")
        params = spec.read(spec.params_uri)
        #: SHA-256 of each file this model was loaded from, by URI: the run's fingerprint names them
        #: (:func:`mxjob.outputs.claim.job_fingerprint`) without reading them a second time.
        self.file_digests = {spec.symbol_uri: hashlib.sha256(symbol_bytes).hexdigest(),
                             spec.params_uri: hashlib.sha256(params).hexdigest()}
        try:
            symbol = mx.sym.load_json(symbol_json)
            saved = mx.nd.load_frombuffer(params)
        except mx.base.MXNetError as exc:
            raise ModelError(f"cannot load checkpoint {spec.symbol_uri} / {spec.params_uri}: "
                             f"{first_line(exc)}") from exc
        arg_params, aux_params = split_params(saved)
        symbol, symbol_json = self._select_output(symbol, symbol_json)
        graph = json.loads(symbol_json)
        self.head_op = graph["nodes"][graph["heads"][0][0]]["op"]
        self.output_is_probability = self.head_op in SOFTMAX_OPS
        self._check(symbol, arg_params, aux_params)
        self._ctx, self._symbol, self._mx = mx_context(spec.context), symbol, mx
        self._module = bind(symbol, arg_params, aux_params, spec.data_name, self.input_shape, self.batch_size,
                            self._ctx)
        self._lock = threading.Lock()

    def bound_copy(self) -> Predictor:
        """This model bound again apart, for a forward pass at the same time as this one's (a forward lane).

        The copy has its own executor, arrays and lock, and this model's
        weights, labels and file digests: nothing is read or checked again. A
        lane that loaded the model itself would download the weights once more
        (each lane of a 16-vCPU node's four, a few hundred MB for a larger
        model), hash and parse them: 0.2 s of CPU here for ResNet-18's 47 MB,
        against 0.03 s for the copy.
        """
        twin = copy.copy(self)
        twin._module = bind(self._symbol, *self._module.get_params(), self.spec.data_name, self.input_shape,
                            self.batch_size, self._ctx)
        twin._lock = threading.Lock()
        return twin

    def _select_output(self, symbol, symbol_json: str) -> tuple:
        """The graph to bind and its JSON: the whole model here; one layer's output in :class:`Embedder`."""
        return symbol, symbol_json

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
            raise ModelError(f"{spec.params_uri} lacks {plural(len(missing), 'weight')} the graph needs: "
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
                try:
                    arg_shapes, _, aux_shapes = symbol.infer_shape(**{self.spec.data_name: (1, c, height, width)})
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
        chunks = [(self._forward(chunk), rows) for chunk, rows in padded_batches(array, self.batch_size)]
        if not chunks:
            return [np.zeros((0, *s), np.float32) for s in self.output_shapes]
        return [np.concatenate([outs[i][:rows] for outs, rows in chunks]) for i in range(len(chunks[0][0]))]

    def _forward(self, batch: np.ndarray) -> list[np.ndarray]:
        data = self._mx.io.DataBatch([self._input_array(batch)])
        with self._lock:
            self._module.forward(data, is_train=False)
            # Synchronous: once the outputs are read, the forward pass has copied ``batch`` into its input.
            return [o.asnumpy() for o in self._module.get_outputs()]

    def _input_array(self, batch: np.ndarray):
        """``batch`` as the NDArray the module copies into its bound input: on the CPU, without a copy of its own.

        ``mx.nd.array`` would allocate an NDArray and copy the micro-batch into
        it (9.6 MB at 16 x 3 x 224 x 224) before the module copies it again
        into its bound input: a copy the task's thread pays per image
        (docs/performance.md, "Figures behind the code"). ``mx.nd.from_numpy`` wraps the
        numpy memory instead (DLPack; it marks the array it is given read-only,
        so it gets a view and the caller's array stays writeable); the memory
        is read only by the module's copy, which is done when :meth:`_forward`
        returns. A GPU context copies it to the device there. Where the
        wrapping is refused (an array that is not C-contiguous), the copy.
        """
        mx = self._mx
        if self._ctx.device_type == "cpu" and batch.flags["C_CONTIGUOUS"]:
            return mx.nd.from_numpy(batch.view(), zero_copy=True)
        return mx.nd.array(batch, ctx=self._ctx)

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


def encoded(image) -> bytes:
    """An image given as encoded bytes, a file path or a PIL image, as encoded bytes (a PIL image as PNG)."""
    if isinstance(image, Image.Image):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return buffer.getvalue()
    if isinstance(image, (str, os.PathLike)):
        with open(image, "rb") as handle:
            return handle.read()
    return bytes(image)


def images_array(images: Sequence, preprocess: Preprocess) -> np.ndarray:
    """Encoded bytes, file paths or PIL images (:func:`encoded`) as one float32 NCHW batch, decoded as the job
    decodes (:func:`decode_into`, each into its row); ``(0, C, H, W)`` for none."""
    batch = np.empty((len(images), *preprocess.input_shape), np.float32)
    for row, image in zip(batch, images):
        decode_into(encoded(image), preprocess, row)
    return batch


def preprocess_for(predictor: Predictor, preprocess: Preprocess | None) -> Preprocess:
    """``preprocess``, or the default recipe at the predictor's input shape; it must take that shape."""
    preprocess = preprocess or Preprocess(input_shape=predictor.input_shape)
    if tuple(preprocess.input_shape) != predictor.input_shape:
        raise ValueError("preprocess.input_shape must match input_shape")
    return preprocess


def get_model(spec: ModelSpec, input_shape: tuple, batch_size: int, kind: type, lane: int = 0) -> Predictor:
    """:func:`get_classifier` for any of the classes: ``Predictor`` serves models that are no classifiers.

    ``lane`` > 0 is another copy of the same model, bound apart, for a forward pass at the same time as
    lane 0's (``--forward-lanes``).
    """
    # Lane 0's model, got before the cache's (non-reentrant) lock: another lane binds it again, so the files are
    # read once per worker.
    first = get_model(spec, input_shape, batch_size, kind) if lane else None

    def load() -> Predictor:
        started = time.perf_counter()
        if first is not None:
            model = first.bound_copy()
            log.info("bound lane %d's copy of model %s in %.2fs", lane, spec.symbol_uri, time.perf_counter() - started)
            return model
        model = kind(spec, input_shape, batch_size)
        state.counters.model_loads += 1
        state.counters.model_load_seconds = time.perf_counter() - started
        log.info("loaded model %s (%s, batch %d) in %.2fs; loads in this worker: %d",
                 spec.symbol_uri, model.model_summary()["head"], batch_size,
                 state.counters.model_load_seconds, state.counters.model_loads)
        return model

    return state.models.get((kind, spec, tuple(input_shape), int(batch_size), int(lane)), load)


