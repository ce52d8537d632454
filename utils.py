"""The seed's S3 helpers, as a small facade over :mod:`mxjob.s3`.

The original job kept its S3 helpers in a top-level ``utils.py`` shipped with
``--py-files``; this module keeps that entry point for scripts and notebooks
written against it. The job itself imports :mod:`mxjob.s3`'s modules, where
each helper lives with its concern; nothing under ``mxjob/`` imports this
module. Every function takes its boto3 client as an argument (or builds one
through :func:`s3_client`), and credentials always come from boto3's default
chain (the instance role on EMR).

Examples
--------
>>> import utils
>>> client = utils.s3_client()                                # doctest: +SKIP
>>> bucket, prefix = utils.parse_s3_uri("s3://my-bucket/images/")
>>> keys = [key for key, size in utils.list_objects(client, bucket, prefix)]  # doctest: +SKIP
>>> data = utils.read_object(client, bucket, keys[0])         # doctest: +SKIP
>>> utils.put_text(client, bucket, "results/done.txt", "ok")  # doctest: +SKIP
"""

from __future__ import annotations

from mxjob.s3.clients import s3_client
from mxjob.s3.parallel_list import list_objects
from mxjob.s3.reads import read_object, read_uri
from mxjob.s3.uris import S3UriError, is_s3_uri, parse_s3_uri
from mxjob.s3.writes import MultipartWriter, put_text

__all__ = ["MultipartWriter", "S3UriError", "is_s3_uri", "list_objects", "parse_s3_uri", "put_text", "read_object",
           "read_uri", "s3_client"]
