"""The run's keys on the driver: the input prefix listed, or the manifest read, and the columns a manifest carries
to the output."""

from __future__ import annotations

import logging

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core.errors import JobError, first_line, plural
from mxjob.inputs import extsort, listing, manifest
from mxjob.options.config import JobConfig
from mxjob.outputs.fingerprint import carried_names
from mxjob.s3 import lean_list, parallel_list

log = logging.getLogger(__name__)


def list_images(client, cfg: JobConfig) -> listing.Listing:
    """Every image key of the input with its size, sorted, limited: a compact :class:`listing.Listing`.

    The keys under the input prefix, listed with ``--list-concurrency`` calls
    in flight (on a client of ``--s3-reader``'s kind), or those
    ``--input-manifest`` names (``client`` reads it). The listing's
    ``bucket`` is the one to read the images from, and a prefix's
    ``skipped_keys`` says which keys were not images. A manifest too large to
    sort in memory is sorted out of core (:mod:`mxjob.inputs.extsort`); under
    ``--dry-run`` its sorted keys then stay on local disk (an
    :class:`extsort.SpilledListing`), since the dry run only plans them.
    """
    if cfg.input_manifest:
        try:
            return manifest.read_manifest(cfg.input_manifest, client, bucket=cfg.input_bucket,
                                          prefix=cfg.input_prefix, suffixes=cfg.suffixes, limit=cfg.limit,
                                          spill=extsort.Spill(in_memory=not cfg.dry_run))
        except manifest.ManifestError as exc:
            raise JobError(str(exc)) from exc
        except OSError as exc:  # unreadable file, full disk for the downloaded copy
            raise JobError(f"cannot read --input-manifest {cfg.input_manifest}: {exc}") from exc
    try:
        # Its own client, with a connection per list call in flight; under --s3-reader lean, one
        # whose parser skips the dates (lean_list.list_client).
        # --with-object-metadata needs the ETags, which only botocore's own parser reads.
        lister = lean_list.list_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts,
                                     max_pool_connections=max(10, cfg.list_concurrency),
                                     kind="botocore" if cfg.with_object_metadata else cfg.s3_reader)
        keys, sizes, *etags = parallel_list.list_prefix(lister, cfg.input_bucket, cfg.input_prefix,
                                                        cfg.list_concurrency, etags=cfg.with_object_metadata)
        skipped = listing.Skipped(suffixes=cfg.suffixes)
        images = listing.Listing.build(cfg.input_bucket, keys, sizes, suffixes=cfg.suffixes, limit=cfg.limit,
                                       carried={"etag": etags[0]} if etags else None, skipped=skipped)
        images.skipped_keys = skipped.entry("not_image")
    except Exception as exc:  # NoSuchBucket, AccessDenied, endpoint unreachable
        raise JobError(f"cannot list {cfg.input_uri}: {first_line(exc)}") from exc
    if not len(images):
        raise JobError(f"no images under {cfg.input_uri} (looked for keys ending in "
                       f"{' '.join(cfg.suffixes)}); check --input and --suffixes")
    warn_of_neighbours(images, cfg.input_uri, cfg.input_prefix)
    return images


def warn_of_neighbours(images: listing.Listing, input_uri: str, prefix: str) -> None:
    """A prefix without its ``/`` takes every key that starts with it, as S3 and SageMaker's ``S3Prefix`` do:
    ``photos`` takes ``photos-2023/`` beside ``photos/``. Say so when it took both."""
    if not prefix or prefix.endswith("/"):
        return
    keys = images.table["key"]
    beside = pc.invert(pc.starts_with(keys, pattern=prefix + "/"))
    others = pc.sum(beside).as_py() or 0
    if 0 < others < len(images):
        example = pc.filter(keys, beside)[0].as_py()
        log.warning("--input %s is a key prefix, not a folder: it takes %s under %s/ and %s beside it, such as "
                    "%s; end it in / to score only the folder", input_uri, plural(len(images) - others, "image"),
                    prefix, plural(others, "image"), example)


def carried_columns(cfg: JobConfig, images: listing.Listing) -> pa.Table | None:
    """The table :func:`merge.assemble` appends to the rows (a row per key of ``images``), or None."""
    names = carried_names(cfg, images)
    if not names:
        return None
    table = images.table
    columns = {name: table[name] for name in names if name not in ("etag", "size")}
    if cfg.with_object_metadata:
        columns["etag"] = table["etag"] if "etag" in table.column_names else pa.nulls(len(table), pa.string())
        sizes = table["size"]
        columns["size"] = pc.if_else(pc.equal(sizes, listing.UNKNOWN_SIZE), pa.scalar(None, pa.int64()), sizes)
    return pa.table(columns)
