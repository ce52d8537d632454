"""The estimate against the measured time: ``--dry-run``'s projection beside the run it projected.

Not a test: it prints measurements (``make bench-estimate``). Against a moto
S3 server on this machine it uploads the first N JPEGs of ``demo/photos.py``'s
set for each size and ResNet-18 (random weights, ``bench/models.py``), then
per size runs the job twice through spark-submit on ``make run-local``'s master
(``demo.run_local.MASTER``, ``conf/spark-local.conf``): a ``--dry-run`` with
``--estimate-cluster NODESxVCPUS --node-price P`` (the EMR layout, modelled),
and the run itself, whose summary holds the estimate for the cluster it ran
on (``estimate.wall_seconds``) and what it took (``elapsed_seconds``, from the
driver's start to its end). Last, the largest size's sample projected onto
the EMR layout for ``--backfill`` images, with and without the S3 stand-in's
CPU (which EMR does not spend). The CPU model is printed with the figures.

Usage::

    python -m bench.estimate_check                      # 128 and 1,280 JPEGs, 10x16 at $0.96/node-hour
    python -m bench.estimate_check --sizes 16,64        # a smoke run
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import tempfile
import time
from pathlib import Path

import boto3

from bench import models
from bench.worker_steps import cpu_model
from demo import photos as bench_images
from demo.run_local import MASTER, spark_env, spark_submit_command
from demo.s3local import FAKE_AWS_ENV, moto_server
from mxjob.executor import measure
from mxjob.planning import batchsize, estimate

BUCKET = "estimate-check"


def job_args(endpoint: str, size: int, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/in{size}/", "--model", f"s3://{BUCKET}/model/resnet18",
            "--input-shape", models.RESNET18.shape_arg, "--mean", models.MEAN, "--std", models.STD,
            "--resize", "short-side-crop", "--endpoint-url", endpoint, *extra]


def upload(s3, sizes: list[int], work: Path) -> None:
    s3.create_bucket(Bucket=BUCKET)
    prefix = models.export(models.RESNET18, work / "model")
    for suffix in ("-symbol.json", "-0000.params"):
        # One PUT, not upload_file's multipart: moto answers a multipart object's GET with a checksum
        # botocore refuses (see bench/run_bench.py).
        s3.put_object(Bucket=BUCKET, Key=f"model/resnet18{suffix}", Body=Path(f"{prefix}{suffix}").read_bytes())
    jpegs = [p for p in bench_images.make_images(work / "images", int(max(sizes) * 1.2)) if p.suffix == ".jpg"]
    if len(jpegs) < max(sizes):
        raise SystemExit(f"demo/photos.py made {len(jpegs)} JPEGs, fewer than {max(sizes)}")
    for size in sizes:
        for path in jpegs[:size]:
            s3.put_object(Bucket=BUCKET, Key=f"in{size}/{path.name}", Body=path.read_bytes())


def run_size(s3, endpoint: str, size: int, layout: str, price: float) -> dict:
    env = spark_env()
    dry = subprocess.run(spark_submit_command(job_args(endpoint, size, "--output", f"s3://{BUCKET}/dry{size}.jsonl",
                                                       "--dry-run", "--estimate-cluster", layout,
                                                       "--node-price", str(price))),
                         env=env, capture_output=True, text=True, check=False)
    if dry.returncode:
        raise SystemExit(f"the dry run of {size} images failed:\n{dry.stderr[-3000:]}")
    modelled = json.loads(dry.stdout.strip().splitlines()[-1])["estimate"]
    started = time.monotonic()
    run = subprocess.run(spark_submit_command(job_args(endpoint, size, "--output", f"s3://{BUCKET}/out{size}.jsonl")),
                         env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if run.returncode:
        raise SystemExit(f"the run of {size} images failed:\n{run.stderr[-3000:]}")
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"out{size}.jsonl.summary.json")["Body"].read())
    return {"images": size, "estimate": summary["estimate"], "elapsed": summary["elapsed_seconds"],
            "wall": round(wall, 1), "modelled": modelled}


def backfill(modelled: dict, images: int, layout: str, price: float) -> list[tuple[str, estimate.Estimate, int]]:
    """The sample's cost projected onto ``layout`` for ``images``, with and without the stand-in's CPU."""
    sample = measure.SampleCost(images=modelled["sample_images"], scored=modelled["sample_images"],
                                 cpu_seconds_per_image=modelled["cpu_seconds_per_image"],
                                 s3_server_cpu_seconds_per_image=modelled["s3_server_cpu_seconds_per_image"],
                                 model_load_seconds=modelled["model_load_seconds"])
    without = dataclasses.replace(sample, cpu_seconds_per_image=sample.cpu_seconds_per_image
                                  - sample.s3_server_cpu_seconds_per_image, s3_server_cpu_seconds_per_image=0.0)
    cluster = estimate.parse_cluster(layout)
    out = []
    for label, cost in (("with the stand-in's CPU", sample), ("without it, as on EMR", without)):
        per_image = cost.cpu_seconds_per_image * cluster.executors / cluster.vcpus
        batch = batchsize.choose_batch_size(per_image, estimate.TASK_OVERHEAD_SECONDS, cluster.executors, images,
                                            16).chosen
        out.append((label, estimate.project(cost, images, batch, cluster, start_seconds=modelled["start_seconds"],
                                            node_price=price), batch))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="128,1280", help="comma-separated image counts")
    parser.add_argument("--layout", default="10x16", help="the EMR layout modelled, NODESxVCPUS")
    parser.add_argument("--node-price", type=float, default=0.96, help="USD per node-hour")
    parser.add_argument("--backfill", type=int, default=10_000_000, help="images to project onto the layout")
    args = parser.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(","))
    with tempfile.TemporaryDirectory() as tmp, moto_server(Path(tmp) / "moto.log") as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"])
        upload(s3, sizes, Path(tmp))
        rows = [run_size(s3, endpoint, size, args.layout, args.node_price) for size in sizes]
    name, vnni = cpu_model()
    print(f"CPU: {name}, AVX-512 VNNI: {'yes' if vnni else 'no'}; ResNet-18 (random weights), 3x224x224 JPEGs of "
          f"about 500x375, {MASTER}, moto on the same cores")
    print("| images | estimate here | measured (driver start to end) | spark-submit wall | estimate / measured |"
          " CPU per image (sample) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        e = row["estimate"]
        print(f"| {row['images']:,} | {e['wall_seconds']:.1f} s (start-up {e['start_seconds']:.1f} s, "
              f"{e['images_per_second']:.1f} img/s) | {row['elapsed']:.1f} s | {row['wall']:.1f} s | "
              f"{e['wall_seconds'] / row['elapsed']:.2f} | {1000 * e['cpu_seconds_per_image']:.1f} ms |")
    for label, projected, batch in backfill(rows[-1]["modelled"], args.backfill, args.layout, args.node_price):
        cost = projected.cost.describe() if projected.cost is not None else "no --node-price"
        print(f"{args.layout}, {args.backfill:,} images, {label}: batch {batch}, {projected.images_per_second:,.0f} "
              f"img/s, {projected.wall_seconds / 3600:.2f} h; {cost}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
