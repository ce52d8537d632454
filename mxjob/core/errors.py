"""What a failure looks like: one line for the user, one error object for a key that failed."""

from __future__ import annotations

import contextlib
import re
import signal

from mxjob.core.secrets import redact


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type's name if it has none), credentials masked
    (:func:`mxjob.core.secrets.redact`): for one-line errors."""
    text = str(exc).strip()
    return redact(text.splitlines()[0]) if text else type(exc).__name__


def spark_failure_reason(exc: BaseException) -> str:
    """The Python exception line inside a Py4J error (else the JVM's exception line), not 200 lines of JVM stack."""
    text = str(exc)
    python_lines = [line.strip().removeprefix(": ") for line in text.splitlines()
                    if line.strip() and ("Error:" in line or "Exception:" in line)
                    and not line.strip().startswith(("at ", "py4j", "org.apache", "Caused by: org.apache"))]
    return (python_lines[-1] if python_lines else first_line(exc))[:1000]


def plural(count: int, singular: str, plural_form: str | None = None) -> str:
    """``1 bucket``, ``2 buckets``: the count and the word in the right number (``plural_form`` if not ``-s``)."""
    return f"{count} {singular if count == 1 else plural_form or singular + 's'}"


#: ``<_io.BytesIO object at 0x7f...>`` in a message (Pillow's "cannot identify image file").
_OBJECT_ADDRESS = re.compile(r"<([\w.]+) object at 0x[0-9a-fA-F]+>")


def error_object(stage: str, exc: BaseException) -> dict:
    """The ``error`` member of a failed key's line (and of a failed UDF row).

    Memory addresses are cut from the message, so the same image fails with
    the same line in every run (a resumed output equals an uninterrupted one).
    """
    return {"stage": stage, "type": type(exc).__name__, "message": _OBJECT_ADDRESS.sub(r"<\1>", first_line(exc))}


#: Exit codes of ``infer_main``: done (0), failed, usage error, done but more failed images than ``--max-errors``.
EXIT_FAILED, EXIT_USAGE, EXIT_TOO_MANY_ERRORS = 1, 2, 3
#: What each of those codes means, in :func:`exit_line`.
EXIT_MEANINGS = {EXIT_FAILED: "the job failed", EXIT_USAGE: "usage error",
                 EXIT_TOO_MANY_ERRORS: "more images failed than --max-errors allows"}


def exit_line(code: int, meanings: dict | None = None) -> str:
    """``exit 3: more images failed than --max-errors allows``: the last line of a command that make runs.

    make exits 2 whenever a recipe fails, whatever its code: ``make submit``
    and ``make watch`` print this so that the job's own code is not lost.
    ``meanings`` replaces :data:`EXIT_MEANINGS`; 128 + N is signal N.
    """
    meaning = (meanings or EXIT_MEANINGS).get(code)
    if meaning is None and code > 128:
        with contextlib.suppress(ValueError):  # no such signal: the code alone
            meaning = f"interrupted by {signal.Signals(code - 128).name}"
    return f"exit {code}: {meaning}" if meaning else f"exit {code}"


class JobError(Exception):
    """A failure with a message for the user; the job exits 1 with it."""
