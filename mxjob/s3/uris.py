"""``s3://`` URIs: parsed into bucket and key, recognised, and a sibling key built beside one."""

from __future__ import annotations

import urllib.parse


class S3UriError(ValueError):
    """An s3:// URI that cannot be split into bucket and key."""


def parse_s3_uri(uri: str, *, need_key: bool = False) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)``.

    Parameters
    ----------
    uri : str
        The URI; ``s3a://`` and ``s3n://`` are accepted as on EMR.
    need_key : bool
        Refuse a URI without a key (an output object needs one).

    Returns
    -------
    tuple of str
        The bucket and the key (possibly empty: a whole-bucket prefix).

    Examples
    --------
    >>> parse_s3_uri("s3://photos/2024/cat.jpg")
    ('photos', '2024/cat.jpg')
    """
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme not in ("s3", "s3a", "s3n") or not parsed.netloc:
        raise S3UriError(f"{uri!r} is not an S3 URI; expected s3://BUCKET/KEY")
    key = parsed.path.lstrip("/")
    if need_key and (not key or key.endswith("/")):
        raise S3UriError(f"{uri!r} names no object; expected s3://BUCKET/KEY")
    return parsed.netloc, key


def is_s3_uri(uri: str) -> bool:
    return uri.startswith(("s3://", "s3a://", "s3n://"))


def sibling_uri(uri: str, name: str) -> str:
    """The URI of ``name`` in the same folder as ``uri`` (for ``synset.txt``)."""
    head, _, _ = uri.rpartition("/")
    return f"{head}/{name}" if head else name
