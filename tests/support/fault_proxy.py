"""The tests' S3 fault proxy: the bench's latency proxy (``demo/s3proxy.py``) throwing what S3 and networks throw.

``503 SlowDown``, ``500 InternalError``, reset connections and bodies cut off
midway, for a chosen share of requests, and ``403 AccessDenied`` for chosen
ones.

Usage::

    with moto_server() as upstream, FaultProxy(upstream, faults=Faults(rate=0.2)) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint)
        ...
        proxy.counts  # {"requests": ..., "slowdown": ..., "reset": ...}
"""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass

from demo.s3proxy import S3Proxy

FAULTS = ("slowdown", "internal", "reset", "cut")

_ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
              "<Message>{message}</Message><RequestId>proxy</RequestId></Error>")


@dataclass(frozen=True)
class Faults:
    """The faults a proxy injects, and into which requests.

    Attributes
    ----------
    rate : float
        Share of eligible requests that get a fault instead of (or in the middle of) the answer.
    kinds : tuple of str
        Which faults to draw from: ``slowdown`` (503), ``internal`` (500), ``reset`` (TCP RST
        before any answer), ``cut`` (the full headers, then half the body, then close).
    methods : tuple of str
        HTTP methods eligible for faults (all by default).
    key_filter : callable, optional
        ``f(method, path) -> bool``: only matching requests are eligible.
    seed : int
        Fault draws are reproducible.
    """

    rate: float = 0.0
    kinds: tuple = FAULTS
    methods: tuple = ("GET", "PUT", "POST", "HEAD", "DELETE")
    key_filter: Callable[[str, str], bool] | None = None
    seed: int = 0


class _FaultHandler(S3Proxy.handler):
    """One request through a :class:`FaultProxy`: denied, answered with a fault, or relayed (perhaps cut)."""

    proxy: FaultProxy
    fault: str | None = None

    def intercept(self) -> bool:
        if self.proxy.deny is not None and self.proxy.deny(self.command, self.path):
            self.proxy.count("denied")
            self._send_error(403, "AccessDenied", "Access Denied")
            return True
        self.fault = self.proxy.draw_fault(self.command, self.path)
        if self.fault == "reset":
            # SO_LINGER 0 makes close() send RST: the client sees "connection reset".
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return True
        if self.fault == "slowdown":
            self._send_error(503, "SlowDown", "Please reduce your request rate.")
            return True
        if self.fault == "internal":
            self._send_error(500, "InternalError", "We encountered an internal error.")
            return True
        return False

    def write_body(self, data: bytes) -> None:
        """Half the body, then close, for the ``cut`` fault; else all of it."""
        if self.fault == "cut" and len(data) > 1:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        super().write_body(data)

    def _send_error(self, status: int, code: str, message: str) -> None:
        payload = _ERROR_XML.format(code=code, message=message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


class FaultProxy(S3Proxy):
    """An :class:`S3Proxy` that injects ``faults`` and denies what ``deny(method, path)`` matches.

    Parameters
    ----------
    upstream, latency
        As :class:`S3Proxy`'s.
    faults : Faults, optional
        The faults to inject, and into which requests (none by default).
    deny : callable, optional
        ``f(method, path) -> bool``: matching requests get ``403 AccessDenied``, always.
    """

    handler = _FaultHandler

    def __init__(self, upstream: str, latency: float = 0.0, faults: Faults | None = None, deny=None):
        self.faults, self.deny = faults or Faults(), deny
        self._random = random.Random(self.faults.seed)
        super().__init__(upstream, latency)

    def draw_fault(self, method: str, path: str) -> str | None:
        """The fault this request gets, if any (counted by kind)."""
        faults = self.faults
        with self._lock:
            if method not in faults.methods or faults.rate <= 0:
                return None
            if faults.key_filter is not None and not faults.key_filter(method, path):
                return None
            if self._random.random() >= faults.rate:
                return None
            # A cut body is only drawn for GETs: cutting the answer to a POST
            # that upstream already carried out (CompleteMultipartUpload) tests
            # moto's idempotency, not ours.
            choices = [f for f in faults.kinds if f != "cut" or method == "GET"]
            if not choices:
                return None
            fault = self._random.choice(choices)
            self.counts[fault] += 1
            return fault
