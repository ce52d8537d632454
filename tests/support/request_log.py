"""Every request a proxy in front of moto sees, by kind: an image, the plan, a part, a listing of the parts.

A :class:`RequestLog` is a :class:`tests.support.fault_proxy.FaultProxy`'s
``deny`` hook that denies nothing and counts. ``tests/unit/outputs/test_assembly.py``
counts the merge's requests without Spark, ``tests/integration/test_assembly.py``
a real run's per batch.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import Counter


class RequestLog:
    """Every request the proxy sees, by kind (:func:`request_kind`): the proxy's ``deny`` hook, denying nothing."""

    def __init__(self, output_key: str, images: str = "imgs/"):
        self.output_key, self.images = output_key, images
        self.kinds: Counter = Counter()
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str) -> bool:
        kind = request_kind(method, path, self.output_key, self.images)
        with self._lock:
            self.kinds[kind] += 1
        return False

    def per_batch(self, batches: int) -> dict:
        """Each kind's requests per batch, images' GETs apart."""
        return {kind: round(count / batches, 2) for kind, count in sorted(self.kinds.items())}


def request_kind(method: str, path: str, output_key: str, images: str) -> str:
    """What a path-style S3 request is for: an image, the plan, a part, a listing of the parts, anything else."""
    path, _, query = path.partition("?")
    params = urllib.parse.parse_qs(query)
    key = urllib.parse.unquote(path.split("/", 2)[2]) if path.count("/") >= 2 else ""
    work = output_key + ".parts/"
    if method == "GET" and "list-type" in params:
        prefix = params.get("prefix", [""])[0]
        return "part LIST" if prefix.startswith(work) and prefix.endswith("/part-") else "other LIST"
    if key.startswith(work) and "/part-" in key:
        return f"part {method}"
    if key.startswith(work) and key.endswith("/batches.arrows"):
        return f"plan {method}"
    if key.startswith(images) and method == "GET":
        return "image GET"
    return f"other {method}"
