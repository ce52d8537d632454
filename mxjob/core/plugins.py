"""A user's Python files, imported by their path: ``--plugin`` files and ``--handler`` files.

A ``--plugin`` file adds tasks or kinds of output to the job (it calls
``mxjob.tasks.register`` or ``mxjob.outputs.register`` as it is imported,
as the built-ins do). The driver imports it at the command line's edge,
before ``--task`` and ``--output`` are checked, and ships it to the executors
(``SparkContext.addFile``), which import it before a task asks for its task
(:func:`load`, once per Python worker). A handler file is imported the same
way (:func:`import_file`).

Each file is imported under a module name of its own and never put in
``sys.modules``, so ``import utils`` anywhere still finds ours. That the file
itself cannot clash with our ``--py-files`` on an executor is the driver's
doing: it ships a copy under a name of its own.
"""

from __future__ import annotations

import importlib.util
import os
import types

from mxjob.core import state
from mxjob.core.errors import first_line


class PluginError(Exception):
    """A user's file that cannot be imported: missing, not Python, or raising on import; the message says which."""


def shipped_copy(path: str) -> str:
    """Where a Spark task finds the driver's copy of ``path`` (``SparkFiles.get`` of its name); elsewhere ``path``."""
    if state.spark_task() is None:
        return path
    from pyspark import SparkFiles

    shipped = SparkFiles.get(os.path.basename(path))
    return shipped if os.path.isfile(shipped) else path


def import_file(path: str, kind: str) -> types.ModuleType:
    """Import the ``.py`` file ``path`` as a module named after ``kind`` and its stem; :class:`PluginError` if it
    cannot be."""
    if not path.endswith(".py"):
        raise PluginError(f"{path} is not a Python file (.py)")
    if not os.path.isfile(path):
        raise PluginError(f"{path} does not exist")
    stem = os.path.basename(path)[:-3]
    name = f"mxinfer_{kind}_" + "".join(c if c.isalnum() else "_" for c in stem)
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        raise PluginError(f"{path} fails to import: {type(exc).__name__}: {first_line(exc)}") from exc
    return module


def load(paths) -> None:
    """Import each ``--plugin`` file of ``paths`` once in this process (its shipped copy in a Spark task): what it
    registers is registered from then on."""
    for path in paths:
        state.plugins.get(path, lambda path=path: import_file(shipped_copy(path), "plugin"))
