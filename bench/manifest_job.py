"""A manifest job at scale: one output line per named key, real images and missing keys alike.

Not a test (``tests/integration/test_manifest.py`` runs the same with 20 keys): it
prints measurements. It trains the demo model, starts moto in this process
(``ThreadedMotoServer``, filled through its backend: faster than PUTs over
HTTP), stores real digit PNGs under half of ``--keys`` keys and nothing under
the other half, writes a plain-text manifest of all of them (no sizes), runs
the job through ``spark-submit`` on ``make run-local``'s master, and checks
that the output has exactly one line per key: predictions for the stored
ones, a ``NoSuchKey`` download error for the missing ones.

Usage::

    python -m bench.manifest_job                 # 100,000 keys (long: one Spark task per batch)
    python -m bench.manifest_job --keys 2000     # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo import make_demo  # noqa: E402
from demo.run_local import spark_env, spark_submit_command  # noqa: E402
from demo.s3local import FAKE_AWS_ENV  # noqa: E402

BUCKET = "bench-manifest"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="A manifest job of real and missing keys, one line per key.")
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--work", default=None, help="folder for the model and manifest [default: a temporary one]")
    args = parser.parse_args(argv)

    import boto3
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    os.environ.update(FAKE_AWS_ENV)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-manifest-"))
    print(f"== training the demo model in {work}", flush=True)
    made = make_demo.make_demo(work / "demo", epochs=4)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        for path in sorted(Path(made["model_prefix"]).parent.iterdir()):
            s3.upload_file(str(path), BUCKET, f"model/{path.name}")
        pngs = [path.read_bytes() for path in sorted(Path(made["images"]).rglob("*.png"))]
        backend = s3_backends["123456789012"]["global"]
        keys = [f"imgs/{i:07d}.png" for i in range(args.keys)]
        stored = set(keys[::2])  # every other key exists; the rest are missing
        started = time.perf_counter()
        for i, key in enumerate(keys[::2]):
            backend.put_object(BUCKET, key, pngs[i % len(pngs)])
        print(f"== stored {len(stored):,} images in {time.perf_counter() - started:.1f}s; "
              f"{args.keys - len(stored):,} keys missing", flush=True)
        manifest = work / "keys.txt"
        manifest.write_text("".join(f"s3://{BUCKET}/{key}\n" for key in keys))

        command = spark_submit_command([
            "--input-manifest", str(manifest), "--model", f"s3://{BUCKET}/model/digits",
            "--output", f"s3://{BUCKET}/out/manifest.jsonl", "--endpoint-url", endpoint,
            "--input-shape", "3,32,32", "--std", "255", "--batch-size", str(args.batch_size), "--top-k", "1",
            "--max-errors", "60%", "--progress-seconds", "30"])
        print("== " + " ".join(command), flush=True)
        started = time.perf_counter()
        result = subprocess.run(command, env=spark_env(), cwd=str(ROOT), check=False)
        seconds = time.perf_counter() - started
        if result.returncode != 0:
            print(f"!! the job exited {result.returncode}", file=sys.stderr)
            return result.returncode
        body = s3.get_object(Bucket=BUCKET, Key="out/manifest.jsonl")["Body"].read().decode()
        rows = [json.loads(line) for line in body.splitlines()]
    finally:
        server.stop()

    named = [row["key"] for row in rows]
    wrong = [row for row in rows if ("predictions" in row) != (row["key"] in stored)
             or ("error" in row and row["error"]["type"] != "NoSuchKey")]
    print(f"\n{args.keys:,} keys in the manifest: {len(rows):,} lines, "
          f"{sum('predictions' in row for row in rows):,} with predictions, "
          f"{sum('error' in row for row in rows):,} NoSuchKey errors; job {seconds:.0f}s")
    assert named == sorted(keys), "not exactly one line per key, in key order"
    assert not wrong, wrong[:3]
    print("exactly one line per key: predictions for the stored images, NoSuchKey for the missing keys")
    return 0


if __name__ == "__main__":
    sys.exit(main())
