"""A loopback HTTP proxy in front of the moto server that adds latency.

moto answers in about a millisecond; real S3's first byte takes tens. The
benchmark and the tests put this proxy in front of moto so that sequential
I/O costs what it costs on S3. The tests' fault proxy
(``tests/support/fault_proxy.py``) is this proxy with faults drawn into its
answers.

Usage::

    with moto_server() as upstream, S3Proxy(upstream, latency=0.02) as proxy:
        client = boto3.client("s3", endpoint_url=proxy.endpoint)
        ...
        proxy.counts  # {"requests": ...}

``proxy.keep_in_memory(bucket, keys)`` answers later plain GETs of those
objects from the proxy's memory, with moto's own answer (headers and body)
captured once: moto then spends no CPU on them (the benchmark's image GETs;
S3 spends none of the node's either).
"""

from __future__ import annotations

import http.client
import threading
import time
import urllib.parse
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: Upstream headers the proxy does not pass on: its own connection's, and the length it sets itself.
_NOT_RELAYED = ("transfer-encoding", "connection", "content-length", "server", "date")


class _ProxyHandler(BaseHTTPRequestHandler):
    """One request through the proxy: S3's own answer relayed, after the proxy's latency."""

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
        self.proxy.count("requests")
        if not self.intercept():
            self._relay(body)

    def intercept(self) -> bool:
        """Answer the request here instead of relaying it; True if it did (never, in this proxy)."""
        return False

    def _relay(self, body) -> None:
        """Send the request upstream (or take the answer kept in memory) and the answer back."""
        held = self.proxy._held(self.command, self.path, self.headers)
        if held is not None:
            self._answer(200, "OK", *held)
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
        self._answer(response.status, response.reason, relayed, data, length)

    def _answer(self, status: int, reason: str, headers: list, data: bytes, length: str | None = None) -> None:
        self.send_response(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", length if length is not None else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.write_body(data)

    def write_body(self, data: bytes) -> None:
        """The answer's body, after its headers."""
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


class S3Proxy:
    """Forward every request to ``upstream``, after ``latency`` seconds.

    Parameters
    ----------
    upstream : str
        The moto server's endpoint URL.
    latency : float
        Seconds added before each response (first-byte latency).
    """

    def __init__(self, upstream: str, latency: float = 0.0):
        parsed = urllib.parse.urlparse(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self.latency = latency
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
        ``Range``, no query but ``x-id=GetObject``). Latency (and a fault
        proxy's faults) apply as before; everything else still goes to upstream. The
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

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    #: The handler class this proxy's requests are answered by (a subclass's may answer some itself).
    handler: type = _ProxyHandler

    def _handler_class(self) -> type:
        return type("Handler", (self.handler,), {"proxy": self})
