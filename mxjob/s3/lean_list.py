"""The listing client under ``--s3-reader lean``: botocore's client, with a parser that reads only keys and sizes.

Parsing a ``ListObjectsV2`` page is most of a listing's driver CPU, and the
job needs two fields of each entry. The client registers a response handler
that reads them with one regular expression; a page it cannot read that way
(an unusual key, a URL-encoded page) goes to botocore's own parser.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import unquote_plus
from xml.etree import ElementTree

import boto3
import botocore.config
import botocore.handlers
import botocore.parsers
import botocore.session

from mxjob.core import constants, state
from mxjob.s3 import clients

_fallback_lock = threading.Lock()


_S3_XML = "{http://s3.amazonaws.com/doc/2006-03-01/}"

log = logging.getLogger(__name__)


def list_client(endpoint_url: str | None = None, region: str | None = None, max_attempts: int = clients.S3_MAX_ATTEMPTS,
                max_pool_connections: int = clients.S3_POOL_CONNECTIONS, kind: str = constants.DEFAULT.s3_reader):
    """A new S3 client for :func:`list_prefix`, configured as :func:`clients.s3_client`'s.

    ``kind`` is the job's ``--s3-reader``. ``"botocore"`` gives a plain boto3
    client: botocore's own parser, nothing of ours hooked in. ``"lean"``
    gives a client whose ``ListObjectsV2`` pages cost a tenth of the CPU:
    botocore turns each of a page's 1,000 objects into a dict of six parsed
    fields (``LastModified`` through dateutil), 170 ms of the driver's CPU a
    page on the benchmark's machine (``bench/listing.py``), so a parallel
    listing runs out of CPU (one core: the GIL) long before it runs out of S3.
    The job needs only keys and sizes, so this client reads them from the XML
    itself in a ``before-parse`` hook (a regular expression over the
    url-encoded keys; ElementTree for any other page) and gives botocore the
    page without its ``Contents``: 6 to 11 ms a page there. The keys and
    sizes come back as ``response["KeysAndSizes"]``. Signing, retries,
    errors and the check for a cut-off page stay botocore's.

    The lean client leans on botocore internals (:func:`lean_listing_unavailable`
    says which). When this botocore lacks them, ``"lean"`` gives the plain
    client instead and logs why, once per process: the listing is the same,
    only slower.
    """
    if kind not in constants.S3_READERS:
        raise ValueError(f"s3 reader {kind!r}: choose one of {', '.join(constants.S3_READERS)}")
    config = clients.client_config(max_attempts, max_pool_connections)
    if kind == "lean":
        reason = lean_listing_unavailable()
        if reason is None:
            return _lean_list_client(endpoint_url, region, config)
        _warn_fallback(reason)
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)


def lean_listing_unavailable() -> str | None:
    """Why this botocore cannot serve the lean listing client (``None``: it can).

    The lean client moves botocore's check of 200 answers
    (``botocore.handlers._handle_200_error``, a private name) after its own
    ``before-parse`` hook, and sets the parser factory's defaults of its
    session. Without either, its hook would save nothing or could not be set
    up as tested, so the plain client is used.
    """
    check = getattr(botocore.handlers, "_handle_200_error", None)
    if not callable(check):
        return f"botocore {botocore.__version__} has no botocore.handlers._handle_200_error to run after its hook"
    if not callable(getattr(botocore.parsers.ResponseParserFactory, "set_parser_defaults", None)):
        return f"botocore {botocore.__version__} has no ResponseParserFactory.set_parser_defaults"
    return None


def _warn_fallback(reason: str) -> None:
    """Say once per process why ``--s3-reader lean`` lists through botocore's own parser."""
    with _fallback_lock:
        if state.counters.listing_fallback is not None:
            return
        state.counters.listing_fallback = reason
    log.warning("--s3-reader lean: the lean listing is not available (%s); listing with botocore's own "
                "ListObjectsV2 parser instead (the same keys, at about ten times the driver's CPU a page)", reason)


def _lean_list_client(endpoint_url: str | None, region: str | None, config: botocore.config.Config):
    """The lean listing client (see :func:`list_client`); only once :func:`lean_listing_unavailable` said yes."""
    session = botocore.session.get_session()
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=str)
    client = boto3.session.Session(botocore_session=session).client(
        "s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)
    # botocore checks every 200 answer for an embedded error or a cut-off document by parsing all
    # of it, which costs as much as the hook. Moved after the hook (on its own event name, where
    # the order is the order of registration), it checks what the hook leaves: the page without
    # its Contents.
    check = botocore.handlers._handle_200_error
    client.meta.events.unregister("before-parse.s3.*", check)
    client.meta.events.register("before-parse.s3.*", _keys_and_sizes)
    client.meta.events.register("before-parse.s3.*", check)
    return client


_CONTENTS = re.compile(rb"<Contents>.*?</Contents>", re.S)


#: A key and the size after it in one <Contents> (S3 writes Key first, Size later): a url-encoded
#: key has no "<" or "&", so nothing in it needs unescaping.
_KEY_SIZE = re.compile(rb"<Contents>\s*<Key>([^<&]*)</Key>.*?<Size>(\d+)</Size>", re.S)


_URL_ENCODED = b"<EncodingType>url</EncodingType>"


def _keys_and_sizes(response_dict, customized_response_dict, operation_model=None, **_) -> None:
    """``before-parse`` hook of the lean listing client: take a page's keys and sizes out of its XML.

    See :func:`list_client`; never registered under ``--s3-reader botocore``.
    """
    body = response_dict.get("body")
    if operation_model is not None and operation_model.name != "ListObjectsV2":
        return
    if response_dict.get("status_code") != 200 or not body:
        return  # errors are botocore's to parse
    found = _KEY_SIZE.findall(body) if _URL_ENCODED in body else None
    if found is not None and len(found) == body.count(b"<Contents>"):
        # botocore asks for url-encoded keys (encoding-type=url, so that any key survives XML)
        # and decodes them after parsing; these bypass that, so they are decoded here as it would:
        # S3 form-encodes them ("+" a space), and botocore's internal botocore.compat.unquote_str is
        # the standard library's unquote_plus under another name.
        keys = [unquote_plus(key.decode("utf-8")) if b"%" in key or b"+" in key else key.decode("utf-8")
                for key, _ in found]
        sizes = [int(size) for _, size in found]
    else:  # not the layout the expression knows: ElementTree reads any
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            return  # a cut-off or broken page: botocore's check makes it a retried 500
        items = root.iterfind(_S3_XML + "Contents")
        pairs = [(item.findtext(_S3_XML + "Key"), int(item.findtext(_S3_XML + "Size"))) for item in items]
        if root.findtext(_S3_XML + "EncodingType") == "url":
            pairs = [(unquote_plus(key), size) for key, size in pairs]
        keys, sizes = [key for key, _ in pairs], [size for _, size in pairs]
    customized_response_dict["KeysAndSizes"] = (keys, sizes)
    # S3 writes the Contents one after the other: cut them out in one slice, not a search.
    first, last = body.find(b"<Contents>"), body.rfind(b"</Contents>")
    rest = body[:first] + body[last + len(b"</Contents>"):] if first >= 0 else body
    response_dict["body"] = rest if b"<Contents>" not in rest else _CONTENTS.sub(b"", rest)
