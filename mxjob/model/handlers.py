"""Custom handlers (``--handler``): a user's ``input_handler`` and ``output_handler``, from one file."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mxjob.core import plugins, state


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

    def output_json(self, key: str, outputs: list[np.ndarray]) -> tuple[str, dict]:
        """``(JSON text, object)`` of ``output_handler(key, outputs)``, its own ``"key"`` left out.

        The text is what the key's line holds after ``"key"``: numpy numbers
        and arrays as JSON numbers and lists; NaN and infinities refused.
        """
        obj = self.output_handler(key, outputs)
        if not isinstance(obj, dict):
            raise TypeError(f"output_handler returned {type(obj).__name__}; expected a dict")
        obj = {k: v for k, v in obj.items() if k != "key"}
        return json.dumps(obj, ensure_ascii=False, allow_nan=False, default=_json_default), obj


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
    try:
        module = plugins.import_file(path, "handler")
    except plugins.PluginError as exc:
        raise HandlerError(str(exc)) from exc
    found = {}
    for attr in ("input_handler", "output_handler"):
        value = getattr(module, attr, None)
        if value is not None and not callable(value):
            raise HandlerError(f"{path}: {attr} is a {type(value).__name__}, not a function")
        found[attr] = value
    if not any(found.values()):
        raise HandlerError(f"{path} defines neither input_handler(key, data) nor output_handler(key, outputs)")
    return Handlers(path, **found)


def get_handlers(path: str | None) -> Handlers | None:
    """This Python worker's handlers from ``path``, imported once.

    In a Spark task the file is the copy the driver shipped with
    ``SparkContext.addFile`` (found by its name with ``SparkFiles.get``);
    elsewhere (the driver's dry run, tests) ``path`` itself.
    """
    return state.handlers.get(path, lambda: load_handlers(plugins.shipped_copy(path))) if path else None
