"""The option types: the command line and the YAML layer convert through the same ones.

Each is a click type, so a value means the same and fails the same with the
same message in both (``mxjob.options.config.merge_settings``). :mod:`mxjob.options.settings`
declares which setting takes which.
"""

from __future__ import annotations

import math
import os
import re

import click

from mxjob import tasks
from mxjob.core.constants import AUTO
from mxjob.model.device import parse_context


class WholeNumber(click.IntRange):
    """``click.IntRange`` that refuses a non-whole number instead of cutting it.

    click's own ``INT`` calls ``int(8.9)`` and gets 8; a YAML ``batch_size: 8.9``
    or ``top_k: 2.7`` must be refused, not silently changed. ``True`` is no
    number either, though Python says ``int(True) == 1``.
    """

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        return super().convert(value, param, ctx)


class BatchSize(WholeNumber):
    """``--batch-size``: a whole number of at least 1, or ``auto`` (the driver measures and picks one).

    The command line and the YAML both take ``auto`` in any case; every other
    value goes through :class:`WholeNumber`, and a refusal says both forms.
    """

    def __init__(self, maximum: int | None = None):
        super().__init__(min=1, max=maximum)

    def convert(self, value, param, ctx):
        if isinstance(value, str) and value.strip().lower() == AUTO:
            return AUTO
        try:
            return super().convert(value, param, ctx)
        except click.BadParameter as exc:
            most = f" and at most {self.max:,}" if self.max is not None else ""
            self.fail(f"{exc.message.rstrip('.')}; give a whole number of at least 1{most}, or auto", param, ctx)


class FiniteNumber(click.FloatRange):
    """``click.FloatRange`` that refuses booleans, NaN and infinities."""

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class NumberList(click.ParamType):
    """Comma-separated numbers, or a YAML list, to a tuple: ``"3,224,224"`` -> ``(3, 224, 224)``.

    Parameters
    ----------
    kind : {int, float}
        Whole numbers at least 1 (``int``), or any finite numbers (``float``).
    count : int, optional
        The exact number of values.
    nonzero : bool
        Refuse zeros (a divisor).
    """

    name = "numbers"
    #: A YAML list is one of its values' forms (mxjob.options.config.convert_option).
    takes_lists = True

    def __init__(self, kind: type = float, count: int | None = None, nonzero: bool = False):
        self.kind, self.count, self.nonzero = kind, count, nonzero
        self._element = WholeNumber(min=1) if kind is int else FiniteNumber()

    def convert(self, value, param, ctx):
        parts = (list(value) if isinstance(value, (list, tuple))
                 else [p for p in str(value).replace(" ", "").split(",") if p])
        what = "whole numbers of at least 1" if self.kind is int else "numbers"
        try:
            numbers = tuple(self._element.convert(p, None, None) for p in parts)
        except (click.BadParameter, TypeError, ValueError):  # a nested YAML list or mapping too
            self.fail(f"needs comma-separated {what}, got {value!r}", param, ctx)
        if self.count is not None and len(numbers) != self.count:
            self.fail(f"needs {self.count} comma-separated {what}, got {value!r}", param, ctx)
        if not numbers:
            self.fail("needs at least one number", param, ctx)
        if self.nonzero and any(n == 0 for n in numbers):
            self.fail(f"values must be non-zero, got {value!r}", param, ctx)
        return numbers


class Names(click.ParamType):
    """Comma-separated names, or a YAML list, to a tuple of strings (stripped, blanks left out); empty is allowed."""

    name = "names"
    #: A YAML list is one of its values' forms (mxjob.options.config.convert_option).
    takes_lists = True

    def convert(self, value, param, ctx):
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        return tuple(s for s in (str(x).strip() for x in items) if s)


class Suffixes(Names):
    """Comma-separated key suffixes, or a YAML list, to a tuple of strings."""

    name = "suffixes"

    def convert(self, value, param, ctx):
        suffixes = super().convert(value, param, ctx)
        if not suffixes:
            self.fail("no suffix given, so no key could match; give some, such as .jpg,.png", param, ctx)
        return suffixes


class OptionalText(click.ParamType):
    """Text where ``""`` means unset (``None``): ``--endpoint-url ''`` is boto3's default endpoint."""

    name = "text"

    def convert(self, value, param, ctx):
        return str(value) or None


class CheckedText(click.ParamType):
    """Text, stripped, once ``check`` accepts it; ``check`` raises ``ValueError`` saying what is wrong.

    Parameters
    ----------
    name : str
        How ``--help`` shows the value (``N|P%``).
    check : callable
        Called with the text; its ``ValueError`` becomes the option's error.
    """

    def __init__(self, name: str, check):
        self.name, self.check = name, check

    def convert(self, value, param, ctx):
        try:
            self.check(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value).strip()


_SHAPE = re.compile(r"^\s*(\d+)\s*[x×*]\s*(\d+)\s*$")  # noqa: RUF001 - the multiplication sign as people write it


def cluster_shape(text: str) -> tuple[int, int]:
    """``"10x16"`` -> ``(10, 16)``: ``NODESxVCPUS``, both at least 1; ``ValueError`` otherwise.

    :func:`mxjob.planning.estimate.parse_cluster` turns it into the cluster.
    """
    match = _SHAPE.match(str(text))
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < 1:
        raise ValueError(f"must be NODESxVCPUS with both at least 1, such as 10x16, got {text!r}")
    return int(match.group(1)), int(match.group(2))


class DeviceContext(click.ParamType):
    """``cpu``, ``gpu`` or ``gpu:N``, checked by the grammar the executors use."""

    name = "context"

    def convert(self, value, param, ctx):
        try:
            parse_context(str(value))
        except ValueError:
            self.fail(f"must be cpu, gpu or gpu:N, got {value!r}", param, ctx)
        return str(value)


class HandlerFile(click.ParamType):
    """A ``.py`` file: a local path that exists, or a URI the driver downloads; ``""`` is none."""

    name = "FILE.py"

    def convert(self, value, param, ctx):
        path = str(value)
        if not path:
            return None
        if not path.endswith(".py"):
            self.fail(f"must be a Python file ending in .py, got {path!r}", param, ctx)
        if "://" not in path and not os.path.isfile(path):
            self.fail(f"{path}: no such file (in cluster mode give an s3:// URI)", param, ctx)
        return path


class TaskName(click.ParamType):
    """A registered task's name (:func:`mxjob.tasks.names`).

    click converts the command line as it parses it, before the ``--plugin``
    files are imported (``mxjob.options.config.load_plugins``): a name is taken
    as it is then (``ctx`` given), and checked when the settings are merged,
    so that a plug-in's task counts.
    """

    name = "task"

    def get_metavar(self, param, *args):
        return "[" + "|".join(tasks.names()) + "]"

    def convert(self, value, param, ctx):
        if ctx is None and str(value) not in tasks.names():
            try:
                tasks.get(str(value))
            except ValueError as exc:
                self.fail(str(exc), param, ctx)
            self.fail(f"{value!r} is not a task --task takes; the tasks are {', '.join(tasks.names())}", param, ctx)
        return str(value)


class PluginFiles(Names):
    """``.py`` files, comma-separated (or a YAML list): local paths that exist, or URIs the driver downloads."""

    name = "FILE.py[,FILE.py]"

    def convert(self, value, param, ctx):
        files = super().convert(value, param, ctx)
        for path in files:
            HandlerFile().convert(path, param, ctx)
        return files


def parse_max_errors(value) -> tuple[float, bool]:
    """``"10"`` -> (10, False); ``"2.5%"`` -> (2.5, True); anything else raises ``ValueError``."""
    text = str(value).strip()
    percent = text.endswith("%")
    try:
        number = float(text.rstrip("%"))
    except ValueError:
        raise ValueError(f"must be a count (10) or a percentage (1%), got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (percent and number > 100):
        raise ValueError(f"out of range (0 or more, at most 100%), got {value!r}")
    return number, percent


def count(minimum: int = 1, maximum: int | None = None) -> WholeNumber:
    """A whole number from ``minimum``, up to ``maximum`` if given (click names both bounds when it refuses one)."""
    return WholeNumber(min=minimum, max=maximum)
