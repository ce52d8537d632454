"""A loopback HTTP proxy in front of the moto server that adds latency and faults.

moto answers in about a millisecond; real S3's first byte takes tens. The
benchmark puts this proxy in front of moto so that sequential I/O costs what it
costs on S3, and the fault tests use it to throw what S3 and networks throw:
``503 SlowDown``, ``500 InternalError``, reset connections and bodies cut off
midway, for a chosen share of requests.

Usage::

    with moto_server() as upstream, S3Proxy(upstream, latency=0.02, faults=Faults(rate=0.2)) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint)
        ...
        proxy.counts  # {"requests": ..., "slowdown": ..., "reset": ...}

``proxy.keep_in_memory(bucket, keys)`` answers later plain GETs of those
objects from the proxy's memory, with moto's own answer (headers and body)
captured once: moto then spends no CPU on them (the benchmark's image GETs;
S3 spends none of the node's either).
"""

from __future__ import annotations

import http.client
import random
import socket
import struct
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("slowdown", "internal", "reset", "cut")

#: Upstream headers the proxy does not pass on: its own connection's, and the length it sets itself.
_NOT_RELAYED = ("transfer-encoding", "connection", "content-length", "server", "date")

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


class S3Proxy:
    """Forward every request to ``upstream``, after ``latency`` seconds, injecting faults.

    Parameters
    ----------
    upstream : str
        The moto server's endpoint URL.
    latency : float
        Seconds added before each response (first-byte latency).
    faults : Faults, optional
        The faults to inject, and into which requests (none by default).
    deny : callable, optional
        ``f(method, path) -> bool``: matching requests get ``403 AccessDenied``, always.
    """

    def __init__(self, upstream: str, latency: float = 0.0, faults: Faults | None = None, deny=None):
        faults = faults or Faults()
        parsed = urllib.parse.urlparse(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self.latency, self.fault_rate, self.faults = latency, faults.rate, tuple(faults.kinds)
        self.fault_methods, self.fault_key_filter, self.deny = tuple(faults.methods), faults.key_filter, deny
        self._random = random.Random(faults.seed)
        self._lock = threading.Lock()
        self.counts: Counter = Counter()
        self._memory: dict[str, tuple[list, bytes]] = {}  # request path -> moto's headers and body
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> S3Proxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> S3Proxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def keep_in_memory(self, client, bucket: str, keys) -> int:
        """Answer later GETs of ``keys`` in ``bucket`` from memory; the bytes now held.

        ``client``, a boto3 S3 client on upstream, fetches each object once,
        now, with checksum mode on (the answer then carries the checksum
        headers botocore may check); its headers and body are replayed to every
        later GET of the same path that asks for the whole object (no
        ``Range``, no query but ``x-id=GetObject``). Latency, faults and
        denials apply as before; everything else still goes to upstream. The
        objects must not change afterwards: the copy is not refreshed.
        """
        held = 0
        for key in keys:
            response = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            body = response["Body"].read()
            headers = [(name, value) for name, value in response["ResponseMetadata"]["HTTPHeaders"].items()
                       if name.lower() not in _NOT_RELAYED]
            self._memory[f"/{bucket}/{urllib.parse.quote(key, safe='/~')}"] = (headers, body)
            held += len(body)
        return held

    def _held(self, method: str, path: str, headers) -> tuple[list, bytes] | None:
        """The answer kept in memory for this request, if it is a whole-object GET of a kept path."""
        if method != "GET" or not self._memory or "Range" in headers:
            return None
        path, _, query = path.partition("?")
        return self._memory.get(path) if query in ("", "x-id=GetObject") else None

    def _draw_fault(self, method: str, path: str) -> str | None:
        with self._lock:
            self.counts["requests"] += 1
            if method not in self.fault_methods or self.fault_rate <= 0:
                return None
            if self.fault_key_filter is not None and not self.fault_key_filter(method, path):
                return None
            if self._random.random() >= self.fault_rate:
                return None
            # A cut body is only drawn for GETs: cutting the answer to a POST
            # that upstream already carried out (CompleteMultipartUpload) tests
            # moto's idempotency, not ours.
            choices = [f for f in self.faults if f != "cut" or method == "GET"]
            if not choices:
                return None
            fault = self._random.choice(choices)
            self.counts[fault] += 1
            return fault

    def _handler_class(self) -> type:
        return type("Handler", (_ProxyHandler,), {"proxy": self})


class _ProxyHandler(BaseHTTPRequestHandler):
    """One request through the proxy: a fault drawn by ``proxy``, or S3's own answer relayed."""

    proxy: S3Proxy  # set per proxy by S3Proxy._handler_class
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY: the headers and the body go out as two writes, and Nagle's
    # algorithm would hold the body until the client's delayed ACK, adding
    # about 40 ms to every request on top of ``latency``.
    disable_nagle_algorithm = True

    def log_message(self, *args):  # quiet: tests and benchmarks read counts instead
        pass

    def _forward(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        if self.proxy.latency:
            time.sleep(self.proxy.latency)
        if self.proxy.deny is not None and self.proxy.deny(self.command, self.path):
            with self.proxy._lock:
                self.proxy.counts["denied"] += 1
            self._send_error(403, "AccessDenied", "Access Denied")
            return
        fault = self.proxy._draw_fault(self.command, self.path)
        if self._answer_fault(fault):
            return
        self._relay(body, fault)

    def _answer_fault(self, fault) -> bool:
        """Answer with the fault instead of S3, if it is one that replaces the answer."""
        if fault == "reset":
            # SO_LINGER 0 makes close() send RST: the client sees "connection reset".
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return True
        if fault == "slowdown":
            self._send_error(503, "SlowDown", "Please reduce your request rate.")
            return True
        if fault == "internal":
            self._send_error(500, "InternalError", "We encountered an internal error.")
            return True
        return False

    def _relay(self, body, fault) -> None:
        """Send the request upstream (or take the answer kept in memory) and the answer back.

        The answer is cut in half for the ``cut`` fault.
        """
        held = self.proxy._held(self.command, self.path, self.headers)
        if held is not None:
            self._answer(200, "OK", *held, fault)
            return
        upstream = http.client.HTTPConnection(self.proxy.upstream_host, self.proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        relayed = [(name, value) for name, value in response.getheaders() if name.lower() not in _NOT_RELAYED]
        # A HEAD's answer has no body, but its Content-Length is the object's size: pyarrow's S3 files read it.
        length = response.getheader("Content-Length") if self.command == "HEAD" else None
        self._answer(response.status, response.reason, relayed, data, fault, length)

    def _answer(self, status: int, reason: str, headers: list, data: bytes, fault,
                length: str | None = None) -> None:
        self.send_response(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", length if length is not None else str(len(data)))
        self.end_headers()
        if fault == "cut" and self.command != "HEAD" and len(data) > 1:
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error(self, status: int, code: str, message: str) -> None:
        payload = _ERROR_XML.format(code=code, message=message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(payload) if self.command != "HEAD" else 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

