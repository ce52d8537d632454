"""boto3 S3 clients, every one configured from the ``S3_*`` constants here: retries, pool, timeouts."""

from __future__ import annotations

import os

import boto3
import botocore.config
import botocore.exceptions

from mxjob.core import constants, state

# Every S3 client of the job is configured from these: the driver's, the
# listing's, the executors' readers, the model's and the --config read.
#: Attempts per S3 request, the first included (botocore ``standard`` retries); ``--s3-max-attempts``' default.
S3_MAX_ATTEMPTS = constants.DEFAULT.s3_max_attempts


#: HTTP connections a client keeps per host: more than a worker's download threads.
S3_POOL_CONNECTIONS = 32


#: Seconds to open a connection: a healthy endpoint answers in milliseconds, so ten is a dead host.
S3_CONNECT_TIMEOUT = 10


#: Seconds to wait for the next bytes of an answer: a large page or object under load, not a hung socket.
S3_READ_TIMEOUT = 60.0


def s3_client(endpoint_url: str | None = None, region: str | None = None, max_attempts: int = S3_MAX_ATTEMPTS,
              max_pool_connections: int = S3_POOL_CONNECTIONS):
    """Return this process's S3 client for these settings, creating it once.

    boto3 clients are thread safe (sessions are not), so one client serves
    every download thread of a Python worker; creating one per task would cost
    a credential look-up each time. Retries use botocore's ``standard`` mode
    (exponential backoff with jitter on throttling, 5xx and connection errors)
    with a bounded number of attempts. The client carries only botocore's own
    event hooks: :func:`s3_reader` builds its client apart, so the hook its
    lean path registers never rides on a client handed out here.
    """
    return cached_client(endpoint_url, region, max_attempts, max_pool_connections)[0]


def client_config(max_attempts: int = S3_MAX_ATTEMPTS,
                  max_pool_connections: int = S3_POOL_CONNECTIONS) -> botocore.config.Config:
    """The botocore settings of every S3 client of the job: retries, connection pool, timeouts."""
    # total_max_attempts: the first try included.
    return botocore.config.Config(retries={"mode": "standard", "total_max_attempts": max_attempts},
                                  max_pool_connections=max_pool_connections, connect_timeout=S3_CONNECT_TIMEOUT,
                                  read_timeout=S3_READ_TIMEOUT)


def cached_client(endpoint_url: str | None, region: str | None, max_attempts: int, max_pool_connections: int,
                  purpose: str = "plain") -> tuple:
    """``(client, credentials)``: :func:`s3_client`'s client, with the credentials its session resolved for it.

    The two are cached together, so :class:`ObjectReader` signs with exactly
    the credentials the client uses (``None``: unsigned access). ``purpose``
    is part of the cache key: a client that gets hooks of ours (``"lean
    reader"``, see :func:`s3_reader`) is never the ``"plain"`` one that
    :func:`s3_client` hands out for anything else.
    """

    def make() -> tuple:
        config = client_config(max_attempts, max_pool_connections)
        # One session for all of them: botocore loads S3's service model and endpoint rules once a session
        # (0.06 CPU-s a client otherwise; a driver or worker makes three or four), and resolves the
        # credentials once a process (refreshing an instance role's). Made under the cache's lock, one
        # client at a time, as a boto3 session needs.
        session = state.s3_sessions.get(os.getpid(), boto3.session.Session)
        client = session.client("s3", endpoint_url=endpoint_url or None, region_name=region or None, config=config)
        # The session resolved these for the client and keeps them (refreshing
        # an instance role's): ObjectReader signs its GETs with the same ones.
        return client, session.get_credentials()

    # The pid: a client made before a fork (PySpark's daemon forks its workers) is not the child's.
    return state.s3_clients.get((endpoint_url, region, max_attempts, max_pool_connections, purpose, os.getpid()), make)


#: What a boto3 S3 call raises: an error answer, or no answer at all.
S3_ERRORS = (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError)
