"""A loopback HTTP proxy in front of the moto server that adds latency and faults.

moto answers in about a millisecond; real S3's first byte takes tens. The
benchmark puts this proxy in front of moto so that sequential I/O costs what it
costs on S3, and the fault tests use it to throw what S3 and networks throw:
``503 SlowDown``, ``500 InternalError``, reset connections and bodies cut off
midway, for a chosen share of requests.

Usage::

    with moto_server() as upstream, S3Proxy(upstream, latency=0.02, fault_rate=0.2) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint)
        ...
        proxy.counts  # {"requests": ..., "slowdown": ..., "reset": ...}
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("slowdown", "internal", "reset", "cut")

_ERROR_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
              "<Message>{message}</Message><RequestId>proxy</RequestId></Error>")


class S3Proxy:
    """Forward every request to ``upstream``, after ``latency`` seconds, injecting faults.

    Parameters
    ----------
    upstream : str
        The moto server's endpoint URL.
    latency : float
        Seconds added before each response (first-byte latency).
    fault_rate : float
        Share of eligible requests that get a fault instead of (or in the middle of) the answer.
    faults : tuple of str
        Which faults to draw from: ``slowdown`` (503), ``internal`` (500), ``reset`` (TCP RST
        before any answer), ``cut`` (the full headers, then half the body, then close).
    fault_methods : tuple of str
        HTTP methods eligible for faults (all by default).
    fault_key_filter : callable, optional
        ``f(method, path) -> bool``: only matching requests are eligible.
    deny : callable, optional
        ``f(method, path) -> bool``: matching requests get ``403 AccessDenied``, always.
    seed : int
        Fault draws are reproducible.
    """

    def __init__(self, upstream: str, latency: float = 0.0, fault_rate: float = 0.0,
                 faults: tuple = FAULTS, fault_methods: tuple = ("GET", "PUT", "POST", "HEAD", "DELETE"),
                 fault_key_filter=None, deny=None, seed: int = 0):
        parsed = urllib.parse.urlparse(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self.latency, self.fault_rate, self.faults = latency, fault_rate, tuple(faults)
        self.fault_methods, self.fault_key_filter, self.deny = tuple(fault_methods), fault_key_filter, deny
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self.counts: Counter = Counter()
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
        """Send the request upstream and its answer back (cut in half for the ``cut`` fault)."""
        upstream = http.client.HTTPConnection(self.proxy.upstream_host, self.proxy.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
            upstream.request(self.command, self.path, body=body, headers=headers)
            response = upstream.getresponse()
            data = response.read()
        finally:
            upstream.close()
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
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

