"""``make bench-listing``: parallel vs sequential listing of one large prefix, timed in the same run.

Not a test: it prints measurements. It

1. starts an S3 stand-in: moto's ``ThreadedMotoServer``
   behind ``demo/s3proxy.py``, which adds ``--latency`` seconds to every
   request (real S3 answers a LIST page of 1,000 keys in tens of ms to 0.1 s;
   moto in about a millisecond). The child fills moto's backend directly
   (``put_object`` on the in-process backend: about 15 s for 200,000 keys,
   against minutes through HTTP), and answers ``ListObjectsV2`` from a sorted
   index of the bucket's keys: moto itself scans and sorts the whole bucket on
   every call (seconds per page at 200,000 keys), which real S3 does not. The
   index gives the same pages as moto (the child checks that on a small bucket
   before it starts) and leaves moto's XML rendering, the proxy's latency and
   HTTP as they are. Moto and the proxy run in two child processes, so that
   neither the stand-in's two halves nor the lister in this process share one
   Python interpreter lock; the table shows the CPU each side used.
2. lists the prefix three times, each timed:

   - **sequential**: page after page, ``parallel_list.list_prefix(concurrency=1)``;
   - **parallel**: ``parallel_list.list_prefix(concurrency=--concurrency)``, the job's default path;
   - **sequential, botocore's default parser**: ``parallel_list.list_objects`` with
     ``clients.s3_client``, the job's listing before ``listing.py`` (it also
     parses every ``LastModified`` with dateutil);

   checks that all three found the same keys, and prints the times, the
   ratio, the client CPU per page and an estimate for ten million keys on S3.

Usage::

    python -m bench.listing                      # 200,000 keys, folders of 1,000, 50 ms per request
    python -m bench.listing --layout flat        # 200,000 keys in one folder
    python -m bench.listing --keys 20000 --latency 0.1
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import psutil

from mxjob.s3 import clients, lean_list, parallel_list

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.s3local import FAKE_AWS_ENV  # noqa: E402
from mxjob.inputs import listing  # noqa: E402

BUCKET = "bench-listing"
PREFIX = "images/"


def layout_keys(layout: str, count: int) -> list[str]:
    """``nested``: ImageNet-like class folders of 1,000 images; ``flat``: one folder."""
    if layout == "flat":
        return [f"{PREFIX}img_{i:07d}.jpg" for i in range(count)]
    return [f"{PREFIX}n{1440000 + i // 1000:08d}/n{1440000 + i // 1000:08d}_{i % 1000}.JPEG" for i in range(count)]


# ----------------------------------------------------------------------------
# The child: moto with an indexed ListObjectsV2, filled directly, behind the latency proxy


def _index_listing(backend_class) -> None:
    """Answer ListObjectsV2 without a delimiter from a sorted index of the bucket's keys."""
    original = backend_class.list_objects_v2
    indexes: dict[int, tuple[int, list[str]]] = {}

    def list_objects_v2(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys):
        if delimiter:
            return original(self, bucket, prefix, delimiter, continuation_token, start_after, max_keys)
        cached = indexes.get(id(bucket))
        if cached is None or cached[0] != len(bucket.keys):
            cached = indexes[id(bucket)] = (len(bucket.keys), sorted(bucket.keys.keys()))
        names = cached[1]
        prefix = prefix or ""
        after = self._pagination_tokens.get(continuation_token) if continuation_token else start_after
        start = bisect.bisect_left(names, prefix)
        if after is not None and after >= prefix:
            start = bisect.bisect_right(names, after)
        found = []
        for name in names[start: start + max_keys + 1]:
            if not name.startswith(prefix):
                break
            found.append(bucket.keys[name])
        return self._truncate_result(found, max_keys)

    list_objects_v2.original = original
    backend_class.list_objects_v2 = list_objects_v2


#: A request with this header gets moto's own rendering (the check compares the two).
ORIGINAL_HEADER = "x-bench-moto-original"


def _prerender_pages(response_class) -> dict:
    """Render ListObjectsV2 pages from per-key XML made once, instead of moto's template per call.

    moto renders each page's 1,000 entries with Jinja: about 35 ms of the
    stand-in's CPU a page, which real S3 spends on its own many machines.
    Returns the cache of entries by (bucket, key), filled by :func:`_render_entries`.
    """
    from xml.sax.saxutils import escape

    original = response_class.list_objects_v2
    entries: dict = {}

    def list_objects_v2(self):
        query = self.querystring
        if (self.headers.get(ORIGINAL_HEADER) or query.get("delimiter") or query.get("fetch-owner")
                or query.get("encoding-type", [None])[0] != "url"):
            return original(self)
        prefix = self._get_querystring(self.request, self.uri).get("prefix", [None])[0]
        prefix = prefix.decode("utf-8") if isinstance(prefix, bytes) else prefix
        max_keys = int(query.get("max-keys", ["1000"])[0])
        token = query.get("continuation-token", [None])[0]
        start_after = None if token else query.get("start-after", [None])[0]
        bucket = self.backend.get_bucket(self.bucket_name)
        found, truncated, token = self.backend.list_objects_v2(bucket, prefix, None, token, start_after, max_keys)
        head = [f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult '
                f'xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>{escape(bucket.name)}</Name>',
                f"<Prefix>{escape(urllib.parse.quote(prefix)) if prefix else ''}</Prefix>",
                f"<MaxKeys>{max_keys}</MaxKeys><KeyCount>{len(found)}</KeyCount>",
                "<EncodingType>url</EncodingType>", f"<IsTruncated>{truncated}</IsTruncated>"]
        if token:
            head.append(f"<NextContinuationToken>{token}</NextContinuationToken>")
        if start_after:
            head.append(f"<StartAfter>{escape(start_after)}</StartAfter>")
        body = [entries.get((bucket.name, key.name)) or _render_entry(key) for key in found]
        return "".join(head) + "".join(body) + "</ListBucketResult>"

    response_class.list_objects_v2 = list_objects_v2
    return entries


def _render_entry(key) -> str:
    """One <Contents> as moto's template writes it, without the indentation."""
    from xml.sax.saxutils import escape

    checksum = (f"<ChecksumAlgorithm>{key.checksum_algorithm}</ChecksumAlgorithm>"
                if key.checksum_algorithm else "")
    return (f"<Contents><Key>{escape(key.safe_name('url'))}</Key><LastModified>{key.last_modified_ISO8601}"
            f"</LastModified><ETag>{escape(key.etag)}</ETag><Size>{key.size}</Size>"
            f"<StorageClass>{key.storage_class}</StorageClass>{checksum}</Contents>")


def _check_stand_in(backend, backend_class, endpoint: str) -> None:
    """The index and the pre-rendered pages answer as moto does, on a small bucket with awkward keys."""
    import boto3

    backend.create_bucket("bench-index-check", "us-east-1")
    keys = [f"p/{c}{i}" for c in ("a", "b", "é", "z/", "Z ", "&<+%") for i in range(30)] + ["p", "q/x", "o/y"]
    for key in keys:
        backend.put_object("bench-index-check", key, b"x" * len(key))
    bucket = backend.get_bucket("bench-index-check")
    indexed = backend_class.list_objects_v2
    ours = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    theirs = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    theirs.meta.events.register("before-sign.s3.ListObjectsV2",
                                lambda request, **_: request.headers.add_header(ORIGINAL_HEADER, "1"))
    for prefix in ("", "p/", "p/z", "nothing"):
        for after in (None, "p/a3", "p/é", "p/zz", "a"):
            for max_keys in (1, 7, 1000):
                args = (bucket, prefix, None, None, after, max_keys)
                got, want = indexed(backend, *args), indexed.original(backend, *args)
                assert ([k.name for k in got[0]], got[1]) == ([k.name for k in want[0]], want[1]), args
                params = {"Bucket": "bench-index-check", "Prefix": prefix, "MaxKeys": max_keys,
                          **({"StartAfter": after} if after else {})}
                mine, moto = ours.list_objects_v2(**params), theirs.list_objects_v2(**params)
                for page in (mine, moto):
                    page.pop("ResponseMetadata")
                    page.pop("NextContinuationToken", None)  # moto's token names the same key either way
                assert mine == moto, params
    for client in (ours, theirs):  # a paginated listing (continuation tokens) too
        pages = client.get_paginator("list_objects_v2").paginate(Bucket="bench-index-check", PaginationConfig={
            "PageSize": 7})
        listed = [(obj["Key"], obj["Size"]) for page in pages for obj in page.get("Contents", ())]
        assert listed == sorted((key, len(key)) for key in keys), listed[:5]


def serve(count: int, layout: str) -> None:
    """Run in the first child: fill, check, serve; print the endpoint; stop when stdin closes."""
    from moto.s3.models import S3Backend, s3_backends
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    os.environ.update(FAKE_AWS_ENV)
    _index_listing(S3Backend)
    entries = _prerender_pages(S3Response)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    backend = s3_backends["123456789012"]["global"]
    _check_stand_in(backend, S3Backend, f"http://{host}:{port}")
    started = time.perf_counter()
    backend.create_bucket(BUCKET, "us-east-1")
    for i, key in enumerate(layout_keys(layout, count)):
        backend.put_object(BUCKET, key, b"x" * (i % 97))
    bucket = backend.get_bucket(BUCKET)
    entries.update({(BUCKET, name): _render_entry(key) for name, key in bucket.keys.items()})
    fill = time.perf_counter() - started
    print(json.dumps({"endpoint": f"http://{host}:{port}", "fill_seconds": round(fill, 1)}), flush=True)
    sys.stdin.read()
    server.stop()


def proxy(upstream: str, latency: float) -> None:
    """Run in the second child: the latency proxy, in a process (and a GIL) of its own."""
    from demo.s3proxy import S3Proxy

    with S3Proxy(upstream, latency=latency) as running:
        print(json.dumps({"endpoint": running.endpoint}), flush=True)
        sys.stdin.read()


# ----------------------------------------------------------------------------
# The parent: time the listings


def stand_in_cpu(children) -> float:
    """CPU seconds the S3 stand-in's processes (moto, the proxy) have used so far."""
    return sum(sum(psutil.Process(child.pid).cpu_times()[:2]) for child in children)


def timed(children, run) -> dict:
    """Wall time, this process's CPU, the stand-in's CPU and the LIST calls of ``run(count_calls)``."""
    calls: list = []
    wall, cpu, server = time.perf_counter(), time.process_time(), stand_in_cpu(children)
    result = run(lambda client: client.meta.events.register(
        "provide-client-params.s3.ListObjectsV2", lambda params, **_: calls.append(1)))
    return {"seconds": time.perf_counter() - wall, "cpu": time.process_time() - cpu,
            "server_cpu": stand_in_cpu(children) - server, "calls": len(calls), "keys": len(result),
            "listing": result}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Parallel vs sequential listing of one prefix on moto.")
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--layout", choices=("nested", "flat"), default="nested")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds the proxy adds to every request")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--skip-botocore-default", action="store_true",
                        help="skip the third, slowest listing (botocore's default parser)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--proxy", metavar="UPSTREAM", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.keys, args.layout)
        return 0
    if args.proxy:
        proxy(args.proxy, args.latency)
        return 0

    print(f"== filling moto with {args.keys:,} keys ({args.layout}) in a child process; "
          f"proxy latency {args.latency * 1000:.0f} ms a request", flush=True)
    env = {**os.environ, **FAKE_AWS_ENV}
    children = []

    def start(*extra: str) -> dict:
        child = subprocess.Popen([sys.executable, "-m", "bench.listing", *extra], cwd=str(ROOT), env=env, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        children.append(child)
        return json.loads(child.stdout.readline())

    try:
        moto = start("--serve", "--keys", str(args.keys), "--layout", args.layout)
        endpoint = start("--proxy", moto["endpoint"], "--latency", str(args.latency))["endpoint"]
        print(f"   filled in {moto['fill_seconds']}s; moto at {moto['endpoint']}, the proxy at {endpoint}", flush=True)
        os.environ.update(FAKE_AWS_ENV)

        def lister(concurrency: int):
            def run(count_calls):
                client = lean_list.list_client(endpoint, max_pool_connections=max(10, concurrency))
                client.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX, MaxKeys=1)  # connect first
                count_calls(client)
                keys, sizes = parallel_list.list_prefix(client, BUCKET, PREFIX, concurrency, progress_every=10**9)
                return listing.Listing.build(BUCKET, keys, sizes)
            return run

        print("== sequential (1 call in flight)", flush=True)
        sequential = timed(children, lister(1))
        print(f"== parallel ({args.concurrency} calls in flight)", flush=True)
        parallel = timed(children, lister(args.concurrency))
        rows = [("sequential", sequential), (f"parallel, {args.concurrency} in flight", parallel)]
        if not args.skip_botocore_default:
            print("== sequential with botocore's default parser (the job's listing before listing.py)", flush=True)

            def default_parser(count_calls):
                client = clients.s3_client(endpoint)
                count_calls(client)
                return sorted(parallel_list.list_objects(client, BUCKET, PREFIX))

            rows.append(("sequential, botocore's parser", timed(children, default_parser)))
            assert rows[-1][1]["listing"] == list(sequential["listing"]), "the default parser's listing differs"
    finally:
        for child in reversed(children):
            child.stdin.close()
            child.wait(timeout=60)

    report(args, rows, sequential, parallel)
    return 0


def report(args, rows: list, sequential: dict, parallel: dict) -> None:
    """Check that both listings agree, then print the table and the ten-million-key projection."""
    assert sequential["keys"] == parallel["keys"] == args.keys, (sequential["keys"], parallel["keys"])
    assert sequential["listing"].keys.equals(parallel["listing"].keys), "parallel listing differs from sequential"
    assert sequential["listing"].sizes.equals(parallel["listing"].sizes)

    print(f"\n{args.keys:,} keys ({args.layout}), proxy latency {args.latency * 1000:.0f} ms, "
          f"{os.cpu_count()} vCPUs ({cpu_name()}), both lists in this run, the same keys and sizes:\n")
    print("| listing | seconds | LIST calls | keys/s | client CPU s | client CPU ms/call | S3 stand-in CPU s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in rows:
        print(f"| {name} | {row['seconds']:.1f} | {row['calls']} | {row['keys'] / row['seconds']:,.0f} | "
              f"{row['cpu']:.1f} | {1000 * row['cpu'] / row['calls']:.0f} | {row['server_cpu']:.1f} |")
    ratio = sequential["seconds"] / parallel["seconds"]
    print(f"\nparallel is {ratio:.1f}x faster than sequential "
          f"({sequential['seconds']:.1f}s / {parallel['seconds']:.1f}s)")
    page = sequential["seconds"] / sequential["calls"]
    print(f"(a sequential page cost {1000 * page:.0f} ms here: the proxy's {args.latency * 1000:.0f} ms, moto, "
          "HTTP and the client)")
    # Ten million keys on S3: 10,000 pages of 1,000 at about 0.1 s each (the figure). The
    # parallel lister needs this run's calls per page, and its CPU per key caps it whatever the latency.
    pages = 10_000_000 / 1000
    round_trips = pages * (parallel["calls"] / (parallel["keys"] / 1000)) * 0.1 / args.concurrency
    cpu = parallel["cpu"] / parallel["keys"] * 10_000_000
    print(f"\nten million keys on S3 (pages of 1,000 keys, about 0.1 s a page): sequential about "
          f"{pages * 0.1 / 60:.0f} min; parallel about {max(round_trips, cpu) / 60:.1f} min, the larger of "
          f"{round_trips:.0f} s of round trips ({args.concurrency} in flight) and {cpu:.0f} s of the driver's CPU "
          f"(one core: this run's {1000 * parallel['cpu'] / parallel['keys']:.3f} ms a key)")


if __name__ == "__main__":
    sys.exit(main())
