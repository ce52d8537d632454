"""S3 access for the driver and the executors, a concern a module.

- :mod:`mxjob.s3.uris`: ``s3://`` URIs parsed and built.
- :mod:`mxjob.s3.clients`: boto3 clients, configured from the ``S3_*`` constants, one cached per process and endpoint.
- :mod:`mxjob.s3.reads`: GETs with retries of a body cut off midway, any URI read whole.
- :mod:`mxjob.s3.object_reader`: the executors' image reader, alone with its lean path through botocore's internals.
- :mod:`mxjob.s3.parallel_list`: a prefix listed with many calls in flight, split by key ranges.
- :mod:`mxjob.s3.lean_list`: the listing client whose parser reads only keys and sizes.
- :mod:`mxjob.s3.writes`: multipart uploads, small PUTs, deletes, aborted uploads.
- :mod:`mxjob.s3.access`: whether an object exists, whether the output may be written, and why not.

Every function takes its boto3 client as an argument (or builds one through
:func:`mxjob.s3.clients.s3_client`), uses paginators for listings, and
raises on failure: callers decide whether a failure becomes an error line or
fails the job. Credentials always come from boto3's default chain (the
instance role on EMR); nothing here accepts keys. The top-level ``utils.py``
is the seed's small facade over this package.
"""
