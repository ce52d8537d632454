"""Read the job's keys from a manifest instead of listing a prefix (``--input-manifest``).

Driver-only, like :mod:`listing`. Three formats, told apart by the name;
:func:`read_manifest` hands each to its reader:

- ``*.json``: an S3 Inventory ``manifest.json`` (:mod:`mxjob.inputs.inventory`); its
  data files (CSV, ORC or Parquet, as its ``fileFormat`` says) are read from
  the inventory's destination bucket with pyarrow. Inventory CSV files are
  gzipped, have no header, name their columns in the manifest's
  ``fileSchema`` and URL-encode the keys. With object versions, only current
  versions that are not delete markers are kept.
- ``*.csv`` (:mod:`mxjob.inputs.manifest_text`): ``bucket,key[,size]`` rows, optionally
  under a ``bucket,key[,size]`` header; a key with a comma is quoted, as CSV
  does. Under a header (a first line that starts ``bucket,key``) every column
  after ``bucket,key[,size]`` is *carried*: kept as text beside its key
  (:attr:`listing.Listing.carried`) and written into each output row by the
  assembly, named as in the header.
- anything else: plain text (:mod:`mxjob.inputs.manifest_text`), one key or
  ``s3://bucket/key`` per line; blank lines are skipped, everything else on a
  line is the key.

Every key must be in one bucket, because the executors read from one
(``JobSpec.bucket``) and the output names keys without their bucket; a
manifest that names several is refused with their names. Sizes come from the
manifest when it has them; a key without one gets size -1, and the executor
then checks ``--max-object-bytes`` against the GET's ``Content-Length``.

This module holds what every format shares: the dispatch, the sort (in
memory or out of core), the one-bucket rule, the summary's ``manifest``
entry, the manifest's local copy and :class:`ManifestError`, which the
readers raise.
"""

from __future__ import annotations

import logging
import os
import tempfile
import urllib.parse
from collections.abc import Iterable

import pyarrow.compute as pc

from mxjob.core.errors import plural
from mxjob.inputs import extsort, inventory, manifest_text
from mxjob.inputs.extsort import KeySorter, Spill, SpilledListing
from mxjob.inputs.listing import Listing, Skipped
from mxjob.inputs.manifest_text import ManifestError, download
from mxjob.s3 import uris

log = logging.getLogger(__name__)


def read_manifest(uri: str, client=None, *, bucket: str | None = None, prefix: str = "",
                  suffixes: Iterable[str] | None = None, limit: int | None = None,
                  spill: Spill | None = None) -> Listing | SpilledListing:
    """The image keys a manifest names, as a :class:`listing.Listing`.

    A manifest of more than ``spill.run_bytes`` of keys (about two million) is
    sorted out of core (:mod:`mxjob.inputs.extsort`): read in runs that are sorted
    and spilled to ``spill.directory``, then merged, so that the keys are never
    held twice. ``spill.in_memory=False`` then keeps the merged keys on disk too
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
    spill : extsort.Spill, optional
        The out-of-core sort's run size and folder, and whether its merged
        keys are loaded into memory; :class:`extsort.Spill`'s defaults if not given.

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
    spill = spill or Spill()
    sorter = KeySorter(prefix=prefix, suffixes=suffixes, spill_bytes=spill.run_bytes or extsort.SPILL_BYTES,
                       directory=spill.directory)
    try:
        with tempfile.TemporaryDirectory(prefix="mxinfer-manifest-") as work:
            path = _local_copy(uri, client, work)
            buckets = _read_keys(uri, path, client, work, sorter)
        named = _one_bucket(uri, buckets, bucket)
        out_of_core, read, skipped = sorter.spilled, sorter.rows, sorter.skipped  # close() forgets them
        if out_of_core:
            # The merge stops at --limit, so the repeated keys past it are not counted.
            images = sorter.listing(named, limit) if spill.in_memory else sorter.spilled_listing(named, limit)
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
        return inventory.read_inventory(uri, path, client, work, sorter)
    if name.endswith(".csv"):
        return manifest_text.read_csv(uri, path, sorter)
    return manifest_text.read_text(uri, path, sorter)


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
    duplicates = None if kept is None else named - sum(skipped.counts.values()) - kept
    return {"uri": uri, "keys_named": named, "images": images, "duplicates": duplicates, "skipped": skipped.report()}


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
        download(client, bucket, key, path, f"--input-manifest {uri}")
        return path
    path = urllib.parse.urlparse(uri).path if uri.startswith("file://") else uri
    if not os.path.isfile(path):
        raise ManifestError(f"--input-manifest {uri}: no such file (in cluster mode give an s3:// URI)")
    return path

