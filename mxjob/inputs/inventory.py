"""S3 Inventory manifests: a ``manifest.json`` and its data files (CSV, ORC or Parquet), read with pyarrow.

:func:`read_inventory`, called by :func:`mxjob.inputs.manifest.read_manifest` for a
``*.json`` manifest, downloads the data files one at a time from the
inventory's destination bucket and hands the keys and sizes of their current
versions (not delete markers) to a key sorter.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import urllib.parse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

# As "manifests": in read_inventory, "manifest" is the manifest.json. mxjob.inputs.manifest imports this module in
# turn: its names are read when an inventory is read, never at import.
from mxjob.inputs import manifest_text
from mxjob.inputs.extsort import KeySorter
from mxjob.inputs.listing import KEY_TYPE
from mxjob.inputs.manifest_text import ManifestError

log = logging.getLogger(__name__)


def read_inventory(uri: str, path: str, client, work: str, sorter: KeySorter) -> set:
    try:
        with open(path, encoding="utf-8") as handle:
            manifest = json.load(handle)
        files = [entry["key"] for entry in manifest["files"]]
        kind = str(manifest["fileFormat"]).upper()
        destination = str(manifest["destinationBucket"]).rsplit(":", 1)[-1]  # arn:aws:s3:::NAME
        source = str(manifest.get("sourceBucket") or "") or None
    except (ValueError, KeyError, TypeError) as exc:
        raise ManifestError(f"--input-manifest {uri} is not an S3 Inventory manifest.json (with fileFormat, "
                                      f"destinationBucket and files): {type(exc).__name__}: {exc}") from None
    if kind not in ("CSV", "ORC", "PARQUET"):
        raise ManifestError(f"--input-manifest {uri}: fileFormat {kind!r} is not CSV, ORC or Parquet")
    if client is None and files:
        raise ManifestError(f"--input-manifest {uri}: reading its data files needs an S3 client")
    buckets: set[str | None] = {source} if source else set()
    for number, key in enumerate(files, 1):
        local = os.path.join(work, f"data-{number}-" + key.rsplit("/", 1)[-1])
        manifest_text.download(client, destination, key, local, f"inventory data file {number} of {uri}")
        what = f"inventory data file s3://{destination}/{key}"
        table = (_inventory_csv(what, local, str(manifest.get("fileSchema") or "")) if kind == "CSV"
                 else _inventory_columnar(what, local, kind))
        os.remove(local)  # one data file on disk at a time
        buckets.update(pc.unique(table["bucket"]).to_pylist() if "bucket" in table.column_names else ())
        for batch in table.select(["key", "size"]).to_batches():
            sorter.add(batch.column(0).cast(KEY_TYPE), batch.column(1))
    log.info("inventory %s: %d %s data files", uri, len(files), kind)
    return buckets


def _inventory_csv(what: str, path: str, schema: str) -> pa.Table:
    names = [name.strip().lower() for name in schema.split(",") if name.strip()]
    if "key" not in names:
        raise ManifestError(f"{what}: the manifest's fileSchema {schema!r} has no Key column")
    wanted = [n for n in ("bucket", "key", "size", "islatest", "isdeletemarker") if n in names]
    invalid: list = []

    def remember(row) -> str:
        invalid.append(row)
        return "skip"

    tables, rows = [], 0
    try:
        # Streamed a block at a time, each block cut down to the kept rows' key, size and bucket at
        # once: the columns the job does not need never exist for the whole file.
        stream = pa.input_stream(path, compression="gzip" if path.endswith(".gz") else None)
        reader = pa_csv.open_csv(
            stream, read_options=pa_csv.ReadOptions(column_names=names, use_threads=False,
                                                    block_size=manifest_text.BLOCK),
            parse_options=pa_csv.ParseOptions(invalid_row_handler=remember),
            convert_options=pa_csv.ConvertOptions(include_columns=wanted,
                                                  column_types={n: pa.string() for n in wanted}))
        for batch in reader:
            tables.append(_inventory_block(what, pa.Table.from_batches([batch]), wanted, rows))
            rows += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise ManifestError(f"{what} is not a gzipped inventory CSV: {exc}") from None
    if invalid:
        shown = "; ".join(f"line {row.number}: {row.actual_columns} fields, expected {row.expected_columns}"
                          for row in invalid[:manifest_text.SHOWN])
        raise ManifestError(f"{what} has {len(invalid)} malformed line(s): {shown}")
    schema = pa.schema([("key", KEY_TYPE), ("size", pa.int64())] + ([("bucket", pa.string())]
                                                                    if "bucket" in wanted else []))
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _inventory_block(what: str, table: pa.Table, wanted: list[str], before: int) -> pa.Table:
    """One block of an inventory CSV as ``key``, ``size`` (and ``bucket``): current versions, keys decoded.

    ``before`` is the rows of the file before this block, to number a bad size's line.
    """
    current = _current_versions(table, "islatest", "isdeletemarker", text=True)
    if current is not None:
        table = table.filter(current)
    keys = _unquote_plus(table["key"])
    sizes = table["size"] if "size" in wanted else None
    if sizes is not None:
        bad = pc.invert(pc.match_substring_regex(pc.fill_null(sizes, "0"), r"^\d*$"))
        if pc.any(bad).as_py():
            first = pc.index(bad, True).as_py()
            raise ManifestError(f"{what}: line {before + first + 1}: Size {sizes[first].as_py()!r} "
                                          "is not a whole number")
        sizes = pc.cast(pc.if_else(pc.equal(sizes, ""), pa.scalar(None, pa.string()), sizes), pa.int64())
    columns = {"key": keys, "size": sizes if sizes is not None else pa.nulls(len(keys), pa.int64())}
    if "bucket" in wanted:
        columns["bucket"] = table["bucket"]
    return pa.table(columns)


def _unquote_plus(keys: pa.ChunkedArray) -> pa.Array:
    """Inventory CSV URL-encodes keys (a space is "+"): decode them as S3 lists them.

    Only keys with a ``%`` or ``+`` go through Python; the rest stay in Arrow as they are.
    """
    keys = manifest_text.plain(keys).cast(KEY_TYPE)
    encoded = pc.match_substring_regex(keys, "[%+]")
    if not pc.any(encoded).as_py():
        return keys
    decoded = pa.array([urllib.parse.unquote_plus(k) for k in keys.filter(encoded).to_pylist()], KEY_TYPE)
    return pc.replace_with_mask(keys, encoded, decoded)


def _inventory_columnar(what: str, path: str, kind: str) -> pa.Table:
    try:
        if kind == "ORC":
            import pyarrow.orc as reader_module
        else:
            import pyarrow.parquet as reader_module
        table = reader_module.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise ManifestError(f"{what} is not a readable {kind} file: {exc}") from None
    lower = {name.lower(): name for name in table.column_names}
    if "key" not in lower:
        raise ManifestError(f"{what} has no key column (its columns: {', '.join(table.column_names)})")
    columns = {"key": table[lower["key"]].cast(KEY_TYPE),
               "size": (table[lower["size"]].cast(pa.int64()) if "size" in lower
                        else pa.nulls(table.num_rows, pa.int64()))}
    if "bucket" in lower:
        columns["bucket"] = table[lower["bucket"]].cast(pa.string())
    current = _current_versions(table.rename_columns([n.lower() for n in table.column_names]),
                                "is_latest", "is_delete_marker", text=False)
    return pa.table(columns).filter(current) if current is not None else pa.table(columns)


def _current_versions(table: pa.Table, latest: str, marker: str, text: bool):
    """A filter keeping current versions that are not delete markers; None for an inventory without versions."""
    kept = []
    for name, dropped in ((latest, False), (marker, True)):
        if name in table.column_names:
            column = table[name]
            found = (pc.equal(pc.utf8_lower(column), str(dropped).lower()) if text
                     else pc.equal(column.cast(pa.bool_()), dropped))
            kept.append(pc.invert(pc.fill_null(found, False)))
    return functools.reduce(pc.and_, kept) if kept else None
