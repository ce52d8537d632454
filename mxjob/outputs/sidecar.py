"""The keys beside an output: its work prefix, summary, status, report and, for a dataset, ``_SUCCESS``.

An output is one object (``--output s3://B/out.jsonl``) or a Parquet dataset
(``--output s3://B/predictions/``, a trailing slash). Beside one object the
job's own files are ``out.jsonl.parts/``, ``out.jsonl.summary.json``,
``out.jsonl.status.json`` and ``out.jsonl.report.html``. Inside a dataset's
prefix they are ``_parts/``, ``_summary.json``, ``_status.json``,
``_report.html`` and ``_SUCCESS``: names that start with an underscore are
hidden from the dataset's readers (pyarrow.dataset's default
``ignore_prefixes``, Hadoop's and so Spark's hidden-file filter, Athena's
Hive and Iceberg readers), so they never read them as rows.
"""

from __future__ import annotations

#: What beside an output has a key of its own: the work prefix and the job's files.
NAMES = ("parts/", "summary.json", "status.json", "report.html", "SUCCESS")


def is_dataset(output_key: str | None) -> bool:
    """Whether ``output_key`` names a dataset prefix (it ends with ``/``) rather than one object."""
    return bool(output_key) and output_key.endswith("/")


def side_key(output_key: str, name: str) -> str:
    """The key of ``name`` (one of :data:`NAMES`) beside ``output_key``: ``KEY.name``, or ``PREFIX/_name``."""
    if name not in NAMES:
        raise ValueError(f"{name!r} is not one of {', '.join(NAMES)}")
    if is_dataset(output_key):
        return f"{output_key}_{name}"
    if name == "SUCCESS":
        raise ValueError("a single output object has no _SUCCESS: the object itself appears only when whole")
    return f"{output_key}.{name}"


def output_of(key: str) -> str:
    """The output key a status (or summary, report) key is beside: the inverse of :func:`side_key`."""
    for name in NAMES:
        for joined in ("_", "."):
            if key.endswith(joined + name) and (joined == "." or key[:-len(joined + name)].endswith("/")):
                return key[:-len(joined + name)]
    return key
