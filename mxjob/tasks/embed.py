"""--task embed: one layer's output as a vector per image.

:class:`Embedder` cuts the graph at the layer (``--output-layer``, by default
the input of the last FullyConnected layer); :data:`TASK` is the task
(``embedding fixed_size_list<float32 or float16>[D]``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

import numpy as np
import pyarrow as pa

from mxjob.core import constants
from mxjob.model.predictor import ModelError, Predictor, images_array, preprocess_for
from mxjob.model.preprocess import Preprocess
from mxjob.results import jsonl_view
from mxjob.tasks.base import Task, TaskOption, forward_or_fail


def layer_names(symbol_json: str) -> list[str]:
    """The names of the graph's operator nodes (its layers), in graph order."""
    return [node["name"] for node in json.loads(symbol_json)["nodes"] if node["op"] != "null"]


def default_output_layer(symbol_json: str) -> str:
    """The data input of the graph's last FullyConnected node: the features a classifier's head reads.

    ``flatten`` (or the global pooling) in a ResNet or an EfficientNet. Raises
    :class:`ModelError` for a graph without a FullyConnected node.
    """
    nodes = json.loads(symbol_json)["nodes"]
    dense = [node for node in nodes if node["op"] == "FullyConnected"]
    if not dense:
        raise ModelError("the model has no FullyConnected layer to take the embedding before; name a layer "
                         f"with --output-layer (its last layers: {', '.join(layer_names(symbol_json)[-5:])})")
    return nodes[dense[-1]["inputs"][0][0]]["name"]


def output_layer_symbol(symbol, symbol_json: str, name: str | None):
    """``(layer name, the symbol of its output)``; a name not in the graph raises :class:`ModelError`.

    ``name`` is a node name (``flatten0``) or its output's (``flatten0_output``);
    ``None`` is :func:`default_output_layer`. The message of an unknown name
    lists the nearest layer names.
    """
    import difflib

    name = name or default_output_layer(symbol_json)
    internals = symbol.get_internals()
    outputs = internals.list_outputs()
    for candidate in (name, f"{name}_output"):
        if candidate in outputs:
            return name, internals[candidate]
    nearest = difflib.get_close_matches(name, layer_names(symbol_json), n=5, cutoff=0.0)
    raise ModelError(f"the model has no layer named {name!r}; the nearest are {', '.join(nearest)}")


class Embedder(Predictor):
    """A :class:`Predictor` that returns one layer's output, flattened to one vector per image.

    The layer is ``spec.output_layer`` (``--output-layer``), by default the
    input of the last FullyConnected layer (:func:`default_output_layer`). The
    graph is cut there, so the layers after it never run.

    Examples
    --------
    >>> e = Embedder("file:///models/resnet18", (3, 224, 224), batch_size=8)  # doctest: +SKIP
    >>> e.embed(np.zeros((3, 3, 224, 224), np.float32)).shape  # doctest: +SKIP
    (3, 512)
    """

    def _select_output(self, symbol, symbol_json: str) -> tuple:
        self.output_layer, layer = output_layer_symbol(symbol, symbol_json, self.spec.output_layer)
        return layer, layer.tojson()

    @property
    def dimension(self) -> int:
        """The length of one vector."""
        return int(np.prod(self.output_shapes[0]))

    def embed(self, array: np.ndarray, normalize: bool = False, dtype: str = "float32") -> np.ndarray:
        """The vectors of ``array`` (N, C, H, W): ``(N, D)`` of ``dtype``, L2-normalised if ``normalize``."""
        out = self.predict(array)[0].reshape(array.shape[0], -1).astype(np.float32)
        if normalize:
            # A zero vector stays zero rather than becoming NaN.
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.finfo(np.float32).tiny)
        return out.astype(dtype)


class ImageEmbedder(Embedder):
    """An :class:`Embedder` that takes encoded images, decoded exactly as the job does."""

    def __init__(self, model, input_shape=constants.DEFAULT.input_shape, batch_size: int = constants.DEFAULT.batch_size,
                 context: str | None = None, preprocess: Preprocess | None = None):
        super().__init__(model, input_shape, batch_size, context)
        self.preprocess = preprocess_for(self, preprocess)

    def embed_images(self, images: Sequence, normalize: bool = False, dtype: str = "float32") -> np.ndarray:
        """Embed encoded bytes, file paths or PIL images: ``(N, D)``."""
        return self.embed(images_array(images, self.preprocess), normalize, dtype)


# ----------------------------------------------------------------------------
# The task


_DTYPES = {"float32": pa.float32(), "float16": pa.float16()}
#: The element types of ``--embedding-dtype``.
EMBEDDING_DTYPES = tuple(_DTYPES)


def vectors(values: list, type_: pa.FixedSizeListType) -> pa.Array:
    """Vectors (``None`` for a failed row) as one fixed-size list array, built from one numpy block."""
    size, dtype = type_.list_size, type_.value_type.to_pandas_dtype()
    block = np.zeros((len(values), size), dtype)
    missing = np.array([value is None for value in values], bool)
    for i, value in enumerate(values):
        if value is not None:
            block[i] = value
    return pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), size, mask=pa.array(missing))


class EmbedTask(Task):
    """One layer's output per image (``embedding``), a vector of D numbers."""

    name = "embed"
    summary = "a vector per image: one layer's output (--output-layer)"
    options = (
        TaskOption("output_layer", "--output-layer",
                   "embed: the layer whose output is the vector (a name of the symbol's graph).", kind="text",
                   to="model", metavar="NAME", show_default="the input of the model's last FullyConnected layer"),
        TaskOption("embedding_dtype", "--embedding-dtype", "embed: the vectors' element type.", default="float32",
                   kind="choice", choices=EMBEDDING_DTYPES),
        TaskOption("normalize", "--normalize", "embed: scale each vector to unit length (L2).", default=False,
                   kind="flag"),
    )
    model_class = Embedder
    meanings: ClassVar[dict] = {
        "embedding": "the layer's output as one vector of D numbers (unit length with `--normalize`); "
                     "null for an error row"}
    doc_examples: ClassVar[tuple] = (("embed", {"dimension": 1280}, "photo_embeddings", "s3://my-bucket/embeddings/"),
                    ("embed-float16", {"dimension": 1280, "dtype": "float16"}, "photo_embeddings_f16",
                     "s3://my-bucket/embeddings-f16/"))
    example_shape: ClassVar[dict] = {"dimension": 1280}
    no_labels: ClassVar[str] = "No top-1 labels: an embed run writes vectors, not labels."

    def columns(self, dimension: int = 1, dtype: str = "float32") -> list[pa.Field]:
        if not dimension or dimension < 1:
            raise ValueError(f"an embedding needs a dimension of at least 1, got {dimension}")
        return [pa.field("embedding", pa.list_(_DTYPES[dtype], int(dimension)))]

    def shape(self, job, model) -> dict:
        return {"dimension": model.dimension, "dtype": job.embedding_dtype}

    def arrays(self, schema: pa.Schema, values: list) -> list[pa.Array]:
        return [vectors(values, schema.field("embedding").type)]

    def score(self, model: Embedder, keys, inputs, job, out) -> None:
        found = forward_or_fail(lambda: model.embed(np.stack(inputs), job.normalize, job.embedding_dtype), keys, out)
        if found is None:
            return
        for key, vector, finite in zip(keys, found, np.isfinite(found).all(axis=1)):
            if finite:
                out.add(key, vector)
            else:
                out.fail_stage(key, "predict", FloatingPointError("model output is not finite"))

    def json_bodies(self, batch: pa.RecordBatch) -> list[str | None]:
        return [None if text is None else ', "embedding": [' + text + "]}"
                for text in jsonl_view.number_lists(batch.column("embedding"))]

    def row_bytes(self, settings, model_summary: dict) -> tuple[float, str]:
        outputs = list((model_summary.get("outputs") or {}).values())
        values = int(np.prod(outputs[0])) if outputs else 1
        itemsize = _DTYPES[settings.embedding_dtype].bit_width // 8
        return values * itemsize, f"{values} values of {itemsize} bytes"

    def warnings(self, settings, parquet: bool) -> list[str]:
        """float16 embeddings in Parquet, which not every reader the output is for can read.

        pyarrow writes them as Parquet's FLOAT16 type: pyarrow and pandas read
        it, Spark 3.5 fails on the file's footer and Trino (Athena) refuses the type.
        """
        if settings.embedding_dtype != "float16" or not parquet:
            return []
        return ["--embedding-dtype float16 in Parquet: pyarrow and pandas read it, but Spark 3.5 and Athena cannot "
                "read Parquet's FLOAT16 type; use --embedding-dtype float32 (twice the bytes) for them"]

    def model_found_by_check(self, model_spec) -> bool:
        return model_spec.output_layer is None

    def checked_spec(self, model_spec, facts):
        """The model the executors load: with the layer the check found."""
        return replace(model_spec, output_layer=facts.output_layer)


#: The task (``mxjob/tasks/__init__.py`` registers it).
TASK = EmbedTask()
