"""Plain-text and CSV manifests: their keys, sizes and carried columns, read into a key sorter.

:func:`read_text` (one key or ``s3://bucket/key`` a line) and
:func:`read_csv` (``bucket,key[,size]`` rows, and the columns a header
names) are the two formats :func:`mxjob.inputs.manifest.read_manifest` reads as
text; :mod:`mxjob.inputs.manifest` describes them. Each is read by pyarrow's CSV
reader, a block at a time, into Arrow chunks; a manifest that reader has any
doubt about is read again line by line in Python, which names the malformed
lines.
"""

from __future__ import annotations

import codecs
import csv
import logging
import os
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from mxjob.core.errors import first_line
from mxjob.inputs.extsort import KeySorter
from mxjob.inputs.listing import KEY_TYPE
from mxjob.results import results
from mxjob.s3 import uris


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names the manifest, and the lines when they are the cause."""


log = logging.getLogger(__name__)

#: Keys gathered in Python before they go into an Arrow chunk (bounds the Python objects alive at once).
_CHUNK = 100_000
#: Malformed lines named in one error message at most.
SHOWN = 10


# ----------------------------------------------------------------------------
# Plain text and CSV: read by pyarrow's C++ CSV reader, block by block, into Arrow chunks.
# A manifest the fast reader has any doubt about (a line it cannot parse, a URI it would
# not split exactly as the Python reader does) is read again by the Python reader below,
# which names the malformed lines or, for the rare line only it reads right, gives the keys.


#: Bytes pyarrow parses at a time: the bound on the manifest's text held beside the keys.
BLOCK = 1 << 20
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
        keys = plain(keys)
        self.sorter.add(keys.cast(KEY_TYPE),
                        pa.nulls(len(keys), pa.int64()) if sizes is None else plain(sizes).cast(pa.int64()),
                        carried)

    def result(self) -> set:
        # The parser's blocks are freed, but Arrow's allocator keeps their pages (about 40 bytes a
        # key in all) until asked: give them back before the listing's copies need the room.
        pa.default_memory_pool().release_unused()
        return self.buckets


def plain(values):
    """One Arrow array of a block's column (compute functions may hand back a chunked one)."""
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def read_text(uri: str, path: str, sorter: KeySorter) -> set:
    return _fast_or_scanned(uri, path, sorter, _fast_text, _scan_text, "line")


def read_csv(uri: str, path: str, sorter: KeySorter) -> set:
    return _fast_or_scanned(uri, path, sorter, lambda path_, sorter_: _fast_csv(path_, sorter_, uri), _scan_csv, "row")


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
        while block := handle.read(BLOCK):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def _blocks(path: str, names: list[str], *, skip_rows: int = 0, text: bool = False) -> Iterator[pa.RecordBatch]:
    """The manifest's rows, one block of about :data:`BLOCK` bytes at a time, every column a string.

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
                                                  block_size=BLOCK),
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
                if header is None:
                    return None, len(row)
                return header, next((len(row) for row in reader if row and any(field.strip() for field in row)), 0)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise _Doubt(str(exc)) from None
    return None, 0


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
        raise ManifestError(f"--input-manifest {uri}: its header row cannot name the columns carried to the "
                                     f"output: {'; '.join(problems)}; rename them in the header")
    return names


def _carried_names(header: list[str]) -> list[str]:
    """The names a header gives the columns carried to the output: every one after bucket, key and size."""
    return header[3:] if len(header) > 2 and header[2].lower() == "size" else header[2:]


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
            raise ManifestError(f"--input-manifest {uri}: its rows have {fields} fields, but only bucket,key[,size] "
                                "are read without a header row; to carry the other columns to the output, name them "
                                "in a first line such as bucket,key,size,product_id (or cut the rows to "
                                "bucket,key,size)")
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
    chunks.add(key, size, {name: plain(column) for name, column in others.items()} or None)


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
        if len(self.lines) < SHOWN:
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


def download(client, bucket: str, key: str, path: str, what: str) -> None:
    try:
        client.download_file(bucket, key, path)  # streams to disk: a manifest can be gigabytes
    except Exception as exc:  # botocore: missing, denied, unreachable; each stops the job
        raise ManifestError(f"cannot read {what} (s3://{bucket}/{key}): {first_line(exc)}") from exc
