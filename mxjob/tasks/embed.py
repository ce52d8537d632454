"""--task embed: one layer's output as a vector per image."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from mxjob.core import constants
from mxjob.model.predictor import ModelError, Predictor, images_array, preprocess_for
from mxjob.model.preprocess import Preprocess


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
