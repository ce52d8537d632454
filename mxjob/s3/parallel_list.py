"""Listing a prefix: with a paginator, or with many list calls in flight over key ranges (``--list-concurrency``).

:func:`list_prefix` splits the key space at characters keys can hold
(:func:`split_range`) and lists each range with its own paginator, starting
more ranges where a page says there are more keys, so a prefix of millions
of keys lists at the rate of many calls at once. The keys come back sorted.
"""

from __future__ import annotations

import logging
import os
import string
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pyarrow as pa

from mxjob.core import constants
from mxjob.core.errors import plural

#: Arrow type of the key column: 64-bit offsets, so fifty million keys of 60
#: bytes (3 GB of text) still fit one column.
KEY_TYPE = pa.large_string()

log = logging.getLogger(__name__)


def list_objects(client, bucket: str, prefix: str, start_after: str | None = None) -> Iterator[tuple[str, int]]:
    """Yield ``(key, size)`` for every object under ``prefix``, page by page (after ``start_after``, if given).

    An empty prefix yields nothing (a page without ``Contents`` is normal).
    """
    paginator = client.get_paginator("list_objects_v2")
    extra = {"StartAfter": start_after} if start_after else {}
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, **extra):
        for obj in page.get("Contents", ()):
            yield obj["Key"], int(obj["Size"])


#: ListObjectsV2 calls in flight (``--list-concurrency``).
LIST_CONCURRENCY = constants.DEFAULT.list_concurrency


#: Characters the range splitter cuts at: S3's "safe" key characters in code point order.
#: Any key is still listed (ranges cover everything); these only decide where ranges end.
_CUT_CHARS = "".join(sorted(set(string.digits + string.ascii_letters + "!-_.*'()/")))


def list_prefix(client, bucket: str, prefix: str, concurrency: int = LIST_CONCURRENCY, *, page_size: int = 1000,
                progress_every: int = 100_000, etags: bool = False) -> tuple[pa.ChunkedArray, ...]:
    """Every key under ``prefix`` and its size, with up to ``concurrency`` list calls in flight.

    The key range left to list starts as everything after ``prefix``. Each
    call lists one page of a range from its ``StartAfter``; when the page is
    full and list slots are idle, the rest of the range is cut at boundary
    strings into as many parts as there are idle slots, each listed on its
    own. Cuts are made at the first character where the range's last listed
    key and its end differ, at characters common in keys (digits, letters,
    ``/-_.``), one character deeper when there is no room: a part that holds
    no key costs one call, and a part with keys is cut again on its first
    page. Parts never overlap and cover the whole range, so the result is the
    same as sequential listing's, whatever the keys are.

    Parameters
    ----------
    client : botocore S3 client
        Its ``max_pool_connections`` should be at least ``concurrency``.
    bucket, prefix : str
        What to list.
    concurrency : int
        List calls in flight at most; 1 lists page after page.
    page_size : int
        ``MaxKeys`` per call (S3 returns at most 1,000).
    progress_every : int
        Log a progress line each time this many more keys are listed.
    etags : bool
        Also return each object's ETag (without its quotes): needs a client
        of botocore's own parser (``list_client(kind="botocore")``), since the
        lean one reads keys and sizes only.

    Returns
    -------
    tuple of pyarrow.ChunkedArray
        Keys (``large_string``) and their sizes (``int64``), in pages in the
        order they came back: :meth:`Listing.build` sorts them; then the
        ETags (``string``) with ``etags``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    started = time.monotonic()
    # (start_after, end): list keys > start_after and <= end; None is open.
    pending: deque = deque([(None, None)])
    pages: list[tuple] = []
    calls = listed = 0
    next_report = progress_every
    with ThreadPoolExecutor(concurrency, thread_name_prefix="list") as pool:
        running: dict = {}
        try:
            while pending or running:
                while pending and len(running) < concurrency:
                    span = pending.popleft()
                    running[pool.submit(_list_page, client, bucket, prefix, span, page_size, etags)] = span
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in done:
                    span = running.pop(future)
                    keys, sizes, tags, last, more = future.result()
                    calls += 1
                    if len(keys):
                        pages.append((keys, sizes, tags))
                        listed += len(keys)
                    if more:
                        idle = concurrency - len(running) - len(pending)
                        pending.extend(split_range(prefix, last, span[1], max(1, idle)))
                if listed >= next_report:
                    log.info("listing s3://%s/%s: %d keys so far, %d calls, %d in flight, %.0f keys/s",
                             bucket, prefix, listed, calls, len(running), listed / (time.monotonic() - started))
                    next_report = (listed // progress_every + 1) * progress_every
        except BaseException:
            for future in running:
                future.cancel()
            raise
    log.info("listed s3://%s/%s: %s in %.1fs (%s, up to %d at once)",
             bucket, prefix, plural(listed, "key"), time.monotonic() - started, plural(calls, "call"), concurrency)
    columns = (pa.chunked_array([page[0] for page in pages], KEY_TYPE),
               pa.chunked_array([page[1] for page in pages], pa.int64()))
    return (*columns, pa.chunked_array([page[2] for page in pages], pa.string())) if etags else columns


def _list_page(client, bucket: str, prefix: str, span: tuple, page_size: int, etags: bool = False):
    """One ``ListObjectsV2`` page of ``span``: ``(keys, sizes, etags or None, last key, more to list)``."""
    start_after, end = span
    if start_after is not None and end is not None:
        # Every key between two strings starts with their common prefix: asking for it keeps
        # S3 from returning (and the client from reading) keys past the end of the range.
        prefix = max(prefix, os.path.commonprefix([start_after, end]), key=len)
    extra = {} if start_after is None else {"StartAfter": start_after}
    response = client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=page_size, **extra)
    tags = None
    if "KeysAndSizes" in response:  # the lean list_client
        if etags:
            raise ValueError("the lean listing client reads no ETags: list with list_client(kind='botocore')")
        keys, sizes = response["KeysAndSizes"]
    else:
        contents = response.get("Contents", ())
        keys = [obj["Key"] for obj in contents]
        sizes = [int(obj["Size"]) for obj in contents]
        if etags:
            tags = [obj["ETag"].strip('"') if obj.get("ETag") is not None else None for obj in contents]
    more = bool(response.get("IsTruncated")) and bool(keys)
    if end is not None and keys and keys[-1] >= end:
        # The page reached the range's end (and maybe ran into the next range): keep this range's keys.
        cut = next((i for i, key in enumerate(keys) if key > end), len(keys))
        keys, sizes, more = keys[:cut], sizes[:cut], False
        tags = tags[:cut] if tags is not None else None
    return (pa.array(keys, KEY_TYPE), pa.array(sizes, pa.int64()), pa.array(tags, pa.string()) if etags else None,
            keys[-1] if keys else None, more)


def split_range(prefix: str, last: str, end: str | None, parts: int) -> list[tuple[str, str | None]]:
    """Cut the range ``(last, end]`` into at most ``parts`` ranges that cover it exactly.

    Parameters
    ----------
    prefix : str
        The listed prefix: cuts are made after it.
    last : str
        The last key listed so far; the range starts after it.
    end : str or None
        The range's last possible key (inclusive); None for the prefix's end.
    parts : int
        How many ranges at most.

    Returns
    -------
    list of (str, str or None)
        ``(start_after, end)`` ranges, in order; consecutive ranges share a boundary.

    Examples
    --------
    >>> split_range("p/", "p/a9", None, 3)
    [('p/a9', 'p/j'), ('p/j', 'p/r'), ('p/r', None)]
    """
    cuts = _cuts(prefix, last, end, parts - 1) if parts > 1 else []
    edges = [last, *cuts, end]
    return list(zip(edges[:-1], edges[1:]))


def _cuts(prefix: str, last: str, end: str | None, count: int) -> list[str]:
    """Up to ``count`` strings strictly between ``last`` and ``end``, in order."""
    position = len(prefix)
    if end is not None:  # the first character where they differ (end > last, so end has one there)
        while position < min(len(last), len(end)) and last[position] == end[position]:
            position += 1
    base = last[:position]
    floor = last[position] if position < len(last) else ""
    ceiling = end[position] if end is not None else None
    while True:
        # Every base + c with floor < c < ceiling is above last and below end.
        choices = [c for c in _CUT_CHARS if c > floor and (ceiling is None or c < ceiling)]
        if choices:
            break
        if floor:
            # No room here (last "p/a", end "p/b"): below end is every longer string that starts
            # with last's next character, so cut one character deeper, above last only.
            base, position = last[: position + 1], position + 1
            floor, ceiling = (last[position] if position < len(last) else ""), None
        else:
            # last ends here and end's character leaves no room below it: follow end one deeper.
            base, position = end[: position + 1], position + 1
            if position >= len(end):
                return []
            floor, ceiling = "", end[position]
    # Keys number their files and folders: after a digit the next key most likely has a digit
    # there too, after a letter a letter. Cut at those first, spread over the rest.
    kind = _kind(floor)
    alike = [c for c in choices if _kind(c) == kind]
    picked = _spread(alike, count) if len(alike) >= count else alike + _spread(
        [c for c in choices if _kind(c) != kind], count - len(alike))
    return [base + c for c in sorted(picked)]


def _kind(char: str) -> int:
    return 0 if char.isdigit() else 1 if char.islower() else 2 if char.isupper() else 3


def _spread(choices: list[str], count: int) -> list[str]:
    """``count`` of ``choices`` (in order), evenly spaced."""
    if count <= 0 or not choices:
        return []
    step = len(choices) / (count + 1)
    return sorted({choices[min(len(choices) - 1, int(step * (i + 1)))] for i in range(count)})
