"""Read the job's keys from a manifest instead of listing a prefix (``--input-manifest``).

Driver-only, like :mod:`listing`. Three formats, told apart by the name:

- ``*.json``: an S3 Inventory ``manifest.json``; its data files (CSV, ORC or
  Parquet, as its ``fileFormat`` says) are read from the inventory's
  destination bucket with pyarrow. Inventory CSV files are gzipped, have no
  header, name their columns in the manifest's ``fileSchema`` and URL-encode
  the keys. With object versions, only current versions that are not delete
  markers are kept.
- ``*.csv``: ``bucket,key[,size]`` rows, optionally under a ``bucket,key[,size]``
  header; a key with a comma is quoted, as CSV does. Under a header (a first
  line that starts ``bucket,key``) every column after ``bucket,key[,size]`` is
  *carried*: kept as text beside its key (:attr:`listing.Listing.carried`) and
  written into each output row by the assembly, named as in the header.
- anything else: plain text, one key or ``s3://bucket/key`` per line; blank lines
  are skipped, everything else on a line is the key.

Every key must be in one bucket, because the executors read from one
(``JobSpec.bucket``) and the output names keys without their bucket; a
manifest that names several is refused with their names. Sizes come from the
manifest when it has them; a key without one gets size -1, and the executor
then checks ``--max-object-bytes`` against the GET's ``Content-Length``.
"""

from __future__ import annotations

import codecs
import csv
import json
import logging
import os
import tempfile
import urllib.parse
from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from mxjob import extsort, results
from mxjob.errors import first_line, plural
from mxjob.extsort import KeySorter, SpilledListing
from mxjob.listing import KEY_TYPE, Listing, Skipped
from mxjob.s3 import uris

log = logging.getLogger(__name__)

#: Keys gathered in Python before they go into an Arrow chunk (bounds the Python objects alive at once).
_CHUNK = 100_000
#: Malformed lines named in one error message at most.
_SHOWN = 10


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the manifest, and the lines when they are the cause."""


def read_manifest(uri: str, client=None, *, bucket: str | None = None, prefix: str = "",
                  suffixes: Iterable[str] | None = None, limit: int | None = None, in_memory: bool = True,
                  spill_bytes: int | None = None, spill_dir: str | None = None) -> Listing | SpilledListing:
    """The image keys a manifest names, as a :class:`listing.Listing`.

    A manifest of more than ``spill_bytes`` of keys (about two million) is
    sorted out of core (:mod:`mxjob.extsort`): read in runs that are sorted
    and spilled to ``spill_dir``, then merged, so that the keys are never
    held twice. ``in_memory=False`` then keeps the merged keys on disk too
    (a :class:`extsort.SpilledListing`, for the dry run's plan).

    Parameters
    ----------
    uri : str
        A local path, ``file://`` or ``s3://`` URI of the manifest.
    client : botocore S3 client, optional
        For ``s3://`` manifests and inventory data files.
    bucket : str, optional
        The bucket of bare keys (``--input``/``--bucket``); when given, every
        key the manifest names must be in it.
    prefix : str
        Keep only keys under this prefix.
    suffixes : iterable of str, optional
        Keep only keys with these suffixes (case-insensitive).
    limit : int, optional
        Keep only the first ``limit`` keys, in sorted order.
    in_memory : bool
        Whether keys sorted out of core are loaded into memory (one copy) or
        left in a local file.
    spill_bytes : int, optional
        Arrow bytes of keys read before a run is sorted and spilled:
        :data:`extsort.SPILL_BYTES` (read when called) by default.
    spill_dir : str, optional
        Where runs are spilled: :func:`extsort.spill_dir` by default.

    Returns
    -------
    Listing or extsort.SpilledListing
        Sorted, unique keys, with sizes where the manifest gives them (the
        same keys whichever way they were sorted).

    Raises
    ------
    ManifestError
        The manifest cannot be read, has malformed lines (named by number),
        names keys in several buckets or no bucket, or names no image.
    """
    sorter = KeySorter(prefix=prefix, suffixes=suffixes, spill_bytes=spill_bytes or extsort.SPILL_BYTES,
                       directory=spill_dir)
    try:
        with tempfile.TemporaryDirectory(prefix="mxinfer-manifest-") as work:
            path = _local_copy(uri, client, work)
            buckets = _read_keys(uri, path, client, work, sorter)
        named = _one_bucket(uri, buckets, bucket)
        out_of_core, read, skipped = sorter.spilled, sorter.rows, sorter.skipped  # close() forgets them
        if out_of_core:
            # The merge stops at --limit, so the repeated keys past it are not counted.
            images = sorter.listing(named, limit) if in_memory else sorter.spilled_listing(named, limit)
            kept = None if limit is not None else len(images)
        else:
            # Listing.build lets go of each step's input as soon as it has its output: no name here may keep
            # the raw columns alive beside their sorted copy (at ten million keys, half a gigabyte).
            columns = list(sorter.columns())
            images = Listing.build(named, columns.pop(0), columns.pop(0), prefix=prefix, suffixes=suffixes,
                                   skipped=skipped, carried={name: columns.pop(0) for name in sorter.carried})
            kept = len(images)
            if limit is not None:
                images = images[:limit]
    finally:
        sorter.close()
    images.manifest = manifest_report(uri, read, len(images), kept, skipped)
    if not len(images):
        where = f" under {prefix!r}" if prefix else ""
        raise ManifestError(f"--input-manifest {uri} names no image{where} (looked for keys ending in "
                            f"{' '.join(suffixes or ())}; {describe_skipped(images.manifest)}); check the "
                            "manifest, --input and --suffixes")
    if images.manifest["skipped"] or images.manifest["duplicates"]:
        log.warning("manifest %s: %s", uri, describe_skipped(images.manifest))
    log.info("manifest %s: %d images in s3://%s%s", uri, len(images), images.bucket,
             f" ({read} keys read, sorted out of core)" if out_of_core else _sizes_note(images))
    return images


def _read_keys(uri: str, path: str, client, work: str, sorter: KeySorter) -> set:
    """Read the manifest's keys into ``sorter`` in the reader its name calls for; the buckets it names."""
    name = uri.rsplit("/", 1)[-1].lower()
    if name.endswith(".json"):
        return _read_inventory(uri, path, client, work, sorter)
    if name.endswith(".csv"):
        return _read_csv(uri, path, sorter)
    return _read_text(uri, path, sorter)


def _one_bucket(uri: str, buckets: set, bucket: str | None) -> str:
    """The one bucket the manifest's keys are in (``bucket`` for bare keys); refuses several, or none."""
    named = sorted(buckets - {None})
    if bucket is not None and named and named != [bucket]:
        others = [name for name in named if name != bucket]
        raise ManifestError(f"--input-manifest {uri} names keys in {'bucket' if len(others) == 1 else 'buckets'} "
                            f"{', '.join(others[:5])}, not in the input bucket {bucket}; drop --input/--bucket "
                            "or fix the manifest")
    if len(named) > 1:
        raise ManifestError(f"--input-manifest {uri} names keys in {len(named)} buckets "
                            f"({', '.join(named[:5])}{', ...' if len(named) > 5 else ''}); one job reads one "
                            "bucket: split the manifest by bucket and run one job for each")
    if None in buckets and bucket is None:
        raise ManifestError(f"--input-manifest {uri} names keys without a bucket: write them as "
                            "s3://BUCKET/KEY, or give their bucket with --input s3://BUCKET/")
    return bucket or named[0]


def manifest_report(uri: str, named: int, images: int, kept: int | None, skipped: Skipped) -> dict:
    """The summary's ``manifest`` entry: keys named, images scored, repeated keys, and the keys skipped by reason.

    A key outside the input prefix (``outside_input``) or without an image
    suffix (``not_image``) gets no line: it is counted here, with examples,
    never dropped silently. A key named more than once gets one line; the
    repeats are ``duplicates`` (``None`` when ``--limit`` stopped the count).
    """
    duplicates = None if kept is None else named - skipped.total - kept
    return {"uri": uri, "keys_named": named, "images": images, "duplicates": duplicates,
            "skipped": skipped.report()}


def describe_skipped(report: dict) -> str:
    """One phrase for the log and messages: how many keys got no line and why, with examples; the duplicates."""
    parts = [f"{plural(entry['count'], 'key')} skipped, {entry['why']} ({reason}; e.g. "
             f"{', '.join(entry['examples'][:3])})" for reason, entry in report["skipped"].items()]
    if report["duplicates"]:
        parts.append(f"{plural(report['duplicates'], 'repeated key')} (each key gets one line)")
    return "; ".join(parts) or "nothing skipped"


def _sizes_note(images: Listing) -> str:
    return f" ({'with' if pc.min(images.sizes).as_py() >= 0 else 'without all'} sizes)"


def _local_copy(uri: str, client, work: str) -> str:
    """The manifest as a local file: a path as it is, an S3 object downloaded into ``work``."""
    if uris.is_s3_uri(uri):
        try:
            bucket, key = uris.parse_s3_uri(uri, need_key=True)
        except uris.S3UriError as exc:
            raise ManifestError(f"--input-manifest: {exc}") from None
        path = os.path.join(work, "manifest-" + key.rsplit("/", 1)[-1])
        _download(client, bucket, key, path, f"--input-manifest {uri}")
        return path
    path = urllib.parse.urlparse(uri).path if uri.startswith("file://") else uri
    if not os.path.isfile(path):
        raise ManifestError(f"--input-manifest {uri}: no such file (in cluster mode give an s3:// URI)")
    return path


def _download(client, bucket: str, key: str, path: str, what: str) -> None:
    try:
        client.download_file(bucket, key, path)  # streams to disk: a manifest can be gigabytes
    except Exception as exc:  # botocore: missing, denied, unreachable; each stops the job
        raise ManifestError(f"cannot read {what} (s3://{bucket}/{key}): {first_line(exc)}") from exc


# ----------------------------------------------------------------------------
# Plain text and CSV: read by pyarrow's C++ CSV reader, block by block, into Arrow chunks.
# A manifest the fast reader has any doubt about (a line it cannot parse, a URI it would
# not split exactly as the Python reader does) is read again by the Python reader below,
# which names the malformed lines or, for the rare line only it reads right, gives the keys.


#: Bytes pyarrow parses at a time: the bound on the manifest's text held beside the keys.
_BLOCK = 1 << 20
#: Column delimiter for plain text, where a line is one field: a control character no key has in
#: practice; a line with one makes the fast reader fall back, so such a key is still read right.
_TEXT_DELIMITER = "\x1f"
#: ``s3://BUCKET/KEY`` lines the fast reader splits itself: exactly those ``uris.parse_s3_uri``
#: splits into this bucket and key (no ``?``, ``#`` or ``;``, which urlparse cuts off; no leading
#: or trailing ``/`` in the key; a plain bucket name). Any other URI goes to the Python reader.
_PLAIN_URI = r"^s3://(?P<bucket>[a-z0-9][a-z0-9.\-]*)/(?P<key>[^/?#;\t\r\n](?:[^?#;\t\r\n]*[^/?#;\t\r\n])?)$"


class _Doubt(Exception):
    """The fast reader cannot vouch for a manifest: the Python reader reads it instead."""


class _Chunks:
    """Hands the fast readers' key and size chunks, one block at a time, to a sorter; gathers the buckets named."""

    def __init__(self, sorter: KeySorter):
        self.sorter = sorter
        self.buckets: set[str | None] = set()

    def add(self, keys, sizes=None, carried: dict | None = None) -> None:
        keys = _plain(keys)
        self.sorter.add(keys.cast(KEY_TYPE),
                        pa.nulls(len(keys), pa.int64()) if sizes is None else _plain(sizes).cast(pa.int64()),
                        carried)

    def result(self) -> set:
        # The parser's blocks are freed, but Arrow's allocator keeps their pages (about 40 bytes a
        # key in all) until asked: give them back before the listing's copies need the room.
        pa.default_memory_pool().release_unused()
        return self.buckets


def _plain(values):
    """One Arrow array of a block's column (compute functions may hand back a chunked one)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _read_text(uri: str, path: str, sorter: KeySorter) -> set:
    return _fast_or_scanned(uri, path, sorter, _fast_text, _scan_text, "line")


def _read_csv(uri: str, path: str, sorter: KeySorter) -> set:
    return _fast_or_scanned(uri, path, sorter, lambda path_, sorter_: _fast_csv(path_, sorter_, uri), _scan_csv,
                            "row")


def _fast_or_scanned(uri: str, path: str, sorter: KeySorter, fast, scan, unit: str) -> set:
    """``fast``; if it cannot vouch for every ``unit``, ``scan`` from the start, which names a bad one exactly."""
    try:
        return fast(path, sorter)
    except _Doubt:
        log.info("manifest %s: read %s by %s in Python (a %s the fast reader does not vouch for)", uri, unit, unit,
                 unit)
        sorter.reset()  # the keys the fast reader gave so far are read again
        return scan(uri, path, sorter)


def _python_lines(path: str) -> int:
    """How many lines the Python reader sees: one per ``\\n``, and a last one without it."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _blocks(path: str, names: list[str], *, skip_rows: int = 0, text: bool = False) -> Iterator[pa.RecordBatch]:
    """The manifest's rows, one block of about :data:`_BLOCK` bytes at a time, every column a string.

    ``text``: one field a line, no quoting, and every line a row (blank ones
    too), so that rows count lines. Any row pyarrow finds malformed, and any
    byte that is not UTF-8, raises :class:`_Doubt`.
    """
    if os.path.getsize(path) == 0:
        return
    parse = (pa_csv.ParseOptions(delimiter=_TEXT_DELIMITER, quote_char=False, escape_char=False,
                                 ignore_empty_lines=False) if text
             else pa_csv.ParseOptions(newlines_in_values=True))  # a quoted key may hold a line break
    try:
        reader = pa_csv.open_csv(
            path, read_options=pa_csv.ReadOptions(column_names=names, skip_rows=skip_rows, use_threads=False,
                                                  block_size=_BLOCK),
            parse_options=parse,
            convert_options=pa_csv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                  strings_can_be_null=False, quoted_strings_can_be_null=False))
        yield from reader
    except pa.ArrowInvalid as exc:
        raise _Doubt(str(exc)) from None


def _fast_text(path: str, sorter: KeySorter) -> set:
    chunks, rows = _Chunks(sorter), 0
    for batch in _blocks(path, ["line"], text=True):
        rows += batch.num_rows
        line = batch.column(0)
        line = line.filter(pc.invert(pc.equal(pc.utf8_trim_whitespace(line), "")))  # blank lines
        uri = pc.match_substring(line, "://")
        if pc.any(uri).as_py():
            uris = line.filter(uri)
            if not pc.all(pc.match_substring_regex(uris, _PLAIN_URI)).as_py():
                raise _Doubt("a URI that is not plainly s3://BUCKET/KEY")
            parts = pc.extract_regex(uris, _PLAIN_URI)
            chunks.buckets.update(pc.unique(parts.field("bucket")).to_pylist())
            chunks.add(parts.field("key"))
            line = line.filter(pc.invert(uri))
        if len(line):
            chunks.buckets.add(None)
            chunks.add(line)
    # pyarrow also ends a line at a lone "\r", which the Python reader keeps in the key.
    if rows != _python_lines(path):
        raise _Doubt("a line break other than \\n or \\r\\n")
    return chunks.result()


def _csv_layout(uri: str, path: str) -> tuple[list[str] | None, int]:
    """``(header, fields)``: line 1's names if it is a header (:func:`_header`), and the fields of the first data row.

    Read with the Python reader, up to the first data row only. A manifest
    without data rows gives ``fields`` 0.
    """
    with open(path, encoding="utf-8-sig", errors="strict", newline="") as handle:
        reader = csv.reader(handle)
        try:
            for row in reader:
                if not row or not any(field.strip() for field in row):
                    continue
                header = _header(uri, row) if reader.line_num == 1 else None
                if header is not None:
                    return header, _first_fields(reader)
                return None, len(row)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise _Doubt(str(exc)) from None
    return None, 0


def _first_fields(reader) -> int:
    """Fields of the next row with any text (0 at the end)."""
    return next((len(row) for row in reader if row and any(field.strip() for field in row)), 0)


def _header(uri: str, row: list[str]) -> list[str] | None:
    """The names of a header row (its fields, stripped), or ``None`` when ``row`` is not one.

    A header is a first line whose first two fields are ``bucket`` and ``key``
    (any case); a third ``size`` names the sizes, and every other field names a
    column carried to the output. Carried names must be unique, not empty,
    and none of the output's own (:data:`results.RESERVED`).
    """
    names = [field.strip() for field in row]
    if [name.lower() for name in names[:2]] != ["bucket", "key"]:
        return None
    carried = _carried_names(names)
    problems = []
    if any(not name for name in carried):
        problems.append("an empty column name")
    repeated = sorted({name for name in carried if carried.count(name) > 1})
    if repeated:
        problems.append(f"{', '.join(repeated)} named more than once")
    taken = [name for name in carried if name.lower() in results.RESERVED]
    if taken:
        problems.append(f"{', '.join(taken)}: the output's own {'name' if len(taken) == 1 else 'names'} "
                        f"({', '.join(sorted(results.RESERVED))})")
    if problems:
        raise ManifestError(f"--input-manifest {uri}: its header row cannot name the columns carried to the output: "
                            f"{'; '.join(problems)}; rename them in the header")
    return names


def _carried_names(header: list[str]) -> list[str]:
    """The names a header gives the columns carried to the output: every one after bucket, key and size."""
    return header[3:] if len(header) > 2 and header[2].lower() == "size" else header[2:]


def _no_header(uri: str, fields: int) -> ManifestError:
    return ManifestError(f"--input-manifest {uri}: its rows have {fields} fields, but only bucket,key[,size] are "
                         "read without a header row; to carry the other columns to the output, name them in a "
                         "first line such as bucket,key,size,product_id (or cut the rows to bucket,key,size)")


def _fast_csv(path: str, sorter: KeySorter, uri: str | None = None) -> set:
    uri = uri or path  # names the manifest in messages
    header, fields = _csv_layout(uri, path)
    carried = _carried_names(header) if header else []
    chunks = _Chunks(sorter)
    if carried:
        if fields not in (0, len(header)):
            raise _Doubt(f"{fields} fields under a header of {len(header)}")
        names = ["bucket", "key", *(["size"] if len(header) - len(carried) == 3 else []), *carried]
    else:
        if header is None and fields > 3:
            raise _no_header(uri, fields)
        if fields not in (0, 2, 3):
            raise _Doubt(f"{fields} fields")
        names = ["bucket", "key", "size"][:fields]
    if not fields:
        return chunks.result()
    for batch in _blocks(path, names, skip_rows=int(header is not None)):
        _csv_block(batch, chunks, "size" in names, carried)
    return chunks.result()


def _csv_block(batch: pa.RecordBatch, chunks: _Chunks, with_size: bool, carried: list[str]) -> None:
    """Add one block's ``bucket,key[,size]`` rows and carried columns to ``chunks``.

    A row the Python reader would refuse raises :class:`_Doubt`.
    """
    bucket, key = pc.utf8_trim_whitespace(batch.column(0)), batch.column(1)
    size = pc.utf8_trim_whitespace(batch.column(2)) if with_size else None
    others = {name: batch.column(name) for name in carried}
    blank = pc.and_(pc.equal(bucket, ""), pc.equal(pc.utf8_trim_whitespace(key), ""))
    for column in ([size] if size is not None else []) + [pc.utf8_trim_whitespace(c) for c in others.values()]:
        blank = pc.and_(blank, pc.equal(column, ""))
    if pc.any(blank).as_py():  # a row of blank fields is skipped, as a blank line is
        keep = pc.invert(blank)
        bucket, key = bucket.filter(keep), key.filter(keep)
        size = size.filter(keep) if size is not None else None
        others = {name: column.filter(keep) for name, column in others.items()}
    if pc.any(pc.or_(pc.equal(bucket, ""), pc.equal(key, ""))).as_py():
        raise _Doubt("an empty bucket or key")
    if size is not None:
        if not pc.all(pc.match_substring_regex(size, r"^[0-9]*$")).as_py():
            raise _Doubt("a size that is not a whole number")
        try:
            size = pc.cast(pc.if_else(pc.equal(size, ""), pa.scalar(None, pa.string()), size), pa.int64())
        except pa.ArrowInvalid as exc:  # more than int64 holds
            raise _Doubt(str(exc)) from None
    chunks.buckets.update(pc.unique(bucket).to_pylist())
    chunks.add(key, size, {name: _plain(column) for name, column in others.items()} or None)


# ----------------------------------------------------------------------------
# Plain text and CSV, line by line in Python: names malformed lines, and reads what the
# fast reader doubted (as the job always read them, but a byte-order mark is skipped).


class _Columns:
    """Keys and sizes gathered in Python lists and handed to a sorter as Arrow every :data:`_CHUNK` keys."""

    def __init__(self, sorter: KeySorter, carried: list[str] = ()):
        self.sorter, self.carried = sorter, list(carried)
        self.keys: list[str] = []
        self.sizes: list[int | None] = []
        self.others: list[list[str]] = [[] for _ in self.carried]
        self.buckets: set[str | None] = set()

    def add(self, bucket: str | None, key: str, size: int | None, others: list[str] = ()) -> None:
        self.buckets.add(bucket)
        self.keys.append(key)
        self.sizes.append(size)
        for values, value in zip(self.others, others):
            values.append(value)
        if len(self.keys) >= _CHUNK:
            self.flush()

    def flush(self) -> None:
        carried = {name: pa.array(values, pa.string()) for name, values in zip(self.carried, self.others)}
        self.sorter.add(pa.array(self.keys, KEY_TYPE), pa.array(self.sizes, pa.int64()), carried or None)
        self.keys, self.sizes, self.others = [], [], [[] for _ in self.carried]

    def result(self) -> set:
        self.flush()
        return self.buckets


class _Problems:
    """Malformed lines: the first few are named, all are counted, and one error reports them."""

    def __init__(self, uri: str):
        self.uri, self.lines, self.count = uri, [], 0

    def add(self, number: int, message: str) -> None:
        self.count += 1
        if len(self.lines) < _SHOWN:
            self.lines.append(f"line {number}: {message}")

    def check(self) -> None:
        if self.count:
            more = f" (and {self.count - len(self.lines)} more)" if self.count > len(self.lines) else ""
            raise ManifestError(f"--input-manifest {self.uri} has {self.count} malformed line(s){more}: "
                                + "; ".join(self.lines))


def _lines(path: str, problems: _Problems) -> Iterator[tuple[int, str]]:
    """``(number, text)`` of every line, without its line ending; lines that are not UTF-8 are problems."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            if number == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]  # a byte-order mark is no part of the first key
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError:
                problems.add(number, "not UTF-8 text")


def _scan_text(uri: str, path: str, sorter: KeySorter) -> set:
    columns, problems = _Columns(sorter), _Problems(uri)
    for number, line in _lines(path, problems):
        if not line.strip():
            continue
        if "://" not in line:
            columns.add(None, line, None)
            continue
        try:
            bucket, key = uris.parse_s3_uri(line, need_key=True)
        except uris.S3UriError:
            problems.add(number, f"{line[:200]!r} is not s3://BUCKET/KEY")
            continue
        columns.add(bucket, key, None)
    problems.check()
    return columns.result()


def _scan_csv(uri: str, path: str, sorter: KeySorter) -> set:
    try:
        header, _ = _csv_layout(uri, path)
    except _Doubt:  # not CSV from its first line: the rows below name the problem
        header = None
    carried = _carried_names(header) if header else []
    columns, problems = _Columns(sorter, carried), _Problems(uri)
    with open(path, encoding="utf-8-sig", errors="strict", newline="") as handle:
        reader = csv.reader(handle)
        try:
            for row in reader:
                number = reader.line_num
                if not row or not any(field.strip() for field in row) or (number == 1 and header is not None):
                    continue
                parsed = _csv_row(row, header if carried else None)
                if isinstance(parsed, str):
                    problems.add(number, parsed)
                else:
                    columns.add(*parsed)
        except (csv.Error, UnicodeDecodeError) as exc:
            problems.add(reader.line_num + 1, f"not CSV: {exc}")
    problems.check()
    return columns.result()


def _csv_row(row: list[str], header: list[str] | None) -> tuple | str:
    """``(bucket, key, size, carried values)`` of one CSV row, or what is wrong with it.

    ``header``: the names when the manifest carries columns (then every row has as many fields).
    """
    carried = _carried_names(header) if header else []
    if header:
        if len(row) != len(header):
            return f"{len(row)} fields, expected {len(header)}, as the header names"
        with_size = len(header) - len(carried) == 3
    elif len(row) not in (2, 3):
        return (f"{len(row)} fields, expected bucket,key or bucket,key,size"
                + (" (a header row bucket,key,size,NAME,... names the columns carried to the output)"
                   if len(row) > 3 else ""))
    else:
        with_size = len(row) == 3
    bucket, key = row[0].strip(), row[1]
    if not bucket or not key:
        return "empty bucket or key"
    size = None
    if with_size and row[2].strip():
        text = row[2].strip()
        if not (text.isascii() and text.isdigit()):
            return f"size {text[:40]!r} is not a whole number of bytes"
        size = int(text)
    return bucket, key, size, row[len(row) - len(carried):] if carried else ()


# ----------------------------------------------------------------------------
# S3 Inventory: manifest.json and its data files, read with pyarrow


def _read_inventory(uri: str, path: str, client, work: str, sorter: KeySorter) -> set:
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
        _download(client, destination, key, local, f"inventory data file {number} of {uri}")
        what = f"inventory data file s3://{destination}/{key}"
        if kind == "CSV":
            table = _inventory_csv(what, local, str(manifest.get("fileSchema") or ""))
        else:
            table = _inventory_columnar(what, local, kind)
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
            stream, read_options=pa_csv.ReadOptions(column_names=names, use_threads=False, block_size=_BLOCK),
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
                          for row in invalid[:_SHOWN])
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
    keys = _plain(keys).cast(KEY_TYPE)
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

    def equals(name: str, value: bool):
        column = table[name]
        if text:
            found = pc.equal(pc.utf8_lower(column), str(value).lower())
        else:
            found = pc.equal(column.cast(pa.bool_()), value)
        return pc.fill_null(found, False)

    keep = None
    for name, dropped in ((latest, False), (marker, True)):
        if name in table.column_names:
            kept = pc.invert(equals(name, dropped))
            keep = kept if keep is None else pc.and_(keep, kept)
    return keep
