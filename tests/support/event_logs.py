"""Spark's event logs as text, as either stack writes them (the tests that read them: secrets, faults, speculation).

Spark 3.5 writes one plain file per application (``local-1700000000000``).
Spark 4.0 rolls it by default into a folder (``eventlog_v2_APP/``, holding
``events_1_APP.zstd``, ... and an ``appstatus_APP`` marker) and compresses each
file with zstd. A test that read only plain files would read nothing on Spark
4 and pass; :func:`event_logs` reads both, and :func:`events` fails if it found
no event at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

#: Spark's event-log codecs by file suffix (``spark.eventLog.compression.codec``), as pyarrow names them: zstd is
#: Spark 4's default. lz4 and snappy are Spark's own block formats, which pyarrow's streams do not read.
CODECS = {".zstd": "zstd"}


def event_logs(folder: Path) -> dict[Path, str]:
    """Every event-log file under ``folder``, decompressed: path -> text (the ``appstatus_`` markers left out)."""
    found = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("appstatus_")):
        codec = next((name for suffix, name in CODECS.items() if suffix in path.suffixes), None)
        if codec is None and path.suffix in (".lz4", ".snappy", ".lzf"):
            raise AssertionError(f"{path}: a codec these tests cannot read; keep Spark's default (zstd)")
        data = path.read_bytes()
        if codec is not None:
            data = pa.input_stream(pa.py_buffer(data), compression=codec).read()
        found[path] = data.decode("utf-8", "replace")
    return found


def events(folder: Path) -> list[dict]:
    """Every event of every log under ``folder``, in order; asserts there is at least one."""
    parsed = [json.loads(line) for text in event_logs(folder).values() for line in text.splitlines() if line]
    assert parsed, f"no Spark event log under {folder}"
    return parsed


def application_ids(folder: Path) -> list[str]:
    """The applications whose logs are under ``folder`` (their ``SparkListenerApplicationStart``)."""
    return [event["App ID"] for event in events(folder) if event.get("Event") == "SparkListenerApplicationStart"]
