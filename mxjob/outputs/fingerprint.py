"""The fingerprint: what every line of the output depends on, so that one output never mixes rows made otherwise.

The settings that change a line (``JobConfig.line_settings``: those the
option table marks ``fingerprint``), the model's files, labels, handler and
int8 weights by SHA-256, the columns carried into the rows, and the parts'
format. A resume refuses progress of another fingerprint
(:mod:`mxjob.outputs.claim`), ``--skip-existing`` a dataset's files of another
(:mod:`mxjob.outputs.dataset`), and an Iceberg table keeps its creator's as a
property (:mod:`mxjob.outputs.iceberg_catalog`).
"""

from __future__ import annotations

import hashlib
import json

from mxjob.results import results
from mxjob.s3 import reads


def fingerprint(settings: dict, files: dict[str, bytes | str | None]) -> dict:
    """What every line of the output depends on: the settings as given, and files by SHA-256.

    Two runs whose fingerprints are equal write the same row for the same
    image, so their parts may be merged into one output. ``part_format`` is
    the parts' format (:data:`results.FORMAT`): a resume never reads parts of another.
    A file is its bytes, or (a ``str``) the SHA-256 hex digest whoever read them took.
    """
    digests = {name: _digest(data) for name, data in files.items()}
    # The settings as JSON gives them back (tuples as lists), so that a fingerprint equals its own round trip.
    return {**json.loads(json.dumps(settings)), **digests, "part_format": results.FORMAT}


def _digest(data: bytes | str | None) -> str | None:
    """A file's SHA-256 hex digest: taken here from its bytes, or already taken by whoever read them (a ``str``)."""
    if data is None or isinstance(data, str):
        return data
    return hashlib.sha256(data).hexdigest()


#: The fingerprint's file entries (compared by digest, named as files in messages).
_FILES = ("model_symbol", "model_params", "labels", "handler", "plugins", "int8_params")


def differences(earlier: dict, now: dict) -> list[str]:
    """One phrase per fingerprint entry that differs, e.g. ``top_k: 3 then, 5 now``."""
    out = []
    for name in sorted(set(earlier) | set(now)):
        before, after = earlier.get(name), now.get(name)
        if before != after:
            if name in _FILES:
                out.append(f"{name} (a different file: sha256 {str(before)[:12]} then, {str(after)[:12]} now)")
            else:
                out.append(f"{name}: {json.dumps(before)} then, {json.dumps(after)} now")
    return out


def carried_names(cfg, images) -> list[str]:
    """The columns carried to every output row: the manifest's (named as in its header), then etag and size."""
    names = [name for name in getattr(images, "carried", ()) if name != "etag"]
    return names + (["etag", "size"] if cfg.with_object_metadata else [])


def job_fingerprint(cfg, classifier, carried: list[str] = ()) -> dict:
    """:func:`fingerprint` of this run: settings, model files, labels and handler by content.

    ``classifier`` is the loaded model, or an executor's ``ModelFacts`` of it; ``cfg.line_settings()`` are the
    settings that change a line. ``carried`` (:func:`carried_names`) is in it when the rows carry any column, so
    that a resume never mixes rows with and without them.
    """
    labels = getattr(classifier, "labels", None)
    handler = cfg.handler_path
    # The model's files as the check loaded them (on the driver, or in an executor: mxjob.executor.model_check), by
    # digest: the driver reads no model file a second time (a few hundred MB for some models).
    known = getattr(classifier, "file_digests", None) or {}
    files = {
        "model_symbol": known.get(cfg.model.symbol_uri) or cfg.model.read(cfg.model.symbol_uri),
        "model_params": known.get(cfg.model.params_uri) or cfg.model.read(cfg.model.params_uri),
        "labels": "\n".join(labels).encode("utf-8") if labels else None,
        "handler": reads.read_uri(handler) if handler else None,
        # A plug-in can define the task and its lines (mxjob.core.plugins).
        "plugins": b"".join(reads.read_uri(path) for path in cfg.plugin_files) if cfg.plugin_files else None,
        # The quantized model itself: calibrated on the job's own sample, it is part of what made the lines.
        "int8_params": cfg.int8_model.read(cfg.int8_model.params_uri) if cfg.int8_model else None,
    }
    values = cfg.line_settings()
    if carried:
        values["carried"] = list(carried)
    return fingerprint(values, files)
