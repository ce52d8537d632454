"""The job written the way Ray Data's docs show batch inference, for ``make bench-peers`` (``bench/peers.py``).

Runs in the bench's own venv ``.venv-peers`` (``bench/requirements-peers.txt``):
Ray needs Python 3.10 or later here, so it is never a dependency of the job.

The pipeline, as Ray Data's "offline batch inference" guide writes it:
``ray.data.read_binary_files`` lists and reads the images through a pyarrow
S3 filesystem pointed at the stand-in, a stateless ``map_batches`` task
decodes each with the job's own recipe (``mxjob.model.preprocess.decode_image``,
so every system gets the same model input; ``--decode`` ``task``) or the
stateful one does it itself (``actor``), a callable class holding the MXNet
module (``bench/peer_mxnet.py``, loaded once per actor) scores batches of
``--batch`` images on ``--actors`` actors of ``--actor-cpus`` CPUs each
(``ActorPoolStrategy(size=…)``, ``num_cpus``: the actors must leave a CPU to the read tasks,
which take one each, or the pipeline waits forever), and ``write_parquet`` writes each image's top
``--top-k`` classes back to S3. MXNet's threads are the environment's
``OMP_NUM_THREADS`` (the bench sets it to the cores an actor holds).

Usage (moto's fake keys in the environment)::

    .venv-peers/bin/python -m bench.peer_ray --input s3://bench/peers/n128/ \\
        --model s3://bench/models/resnet18 --output s3://bench/out/ray-128/ \\
        --endpoint-url http://127.0.0.1:5000 --actors 1 --actor-cpus 2
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import pyarrow.fs  # noqa: E402
import ray  # noqa: E402

from bench.peer_mxnet import Module, peer_arguments, recipe  # noqa: E402
from mxjob.model.preprocess import Preprocess, decode_image  # noqa: E402


def filesystem(endpoint: str) -> pyarrow.fs.S3FileSystem:
    """pyarrow's S3 filesystem (what Ray Data reads and writes S3 through) pointed at the S3 stand-in."""
    scheme, _, host = endpoint.partition("://")
    return pyarrow.fs.S3FileSystem(endpoint_override=host, scheme=scheme,
                                   region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                                   access_key=os.environ["AWS_ACCESS_KEY_ID"],
                                   secret_key=os.environ["AWS_SECRET_ACCESS_KEY"],
                                   session_token=os.environ.get("AWS_SESSION_TOKEN"))


def bucket_path(uri: str) -> str:
    """``s3://bucket/key`` as pyarrow's filesystem names it, ``bucket/key``."""
    return uri[len("s3://"):] if uri.startswith("s3://") else uri


def decode(batch: dict, prep: Preprocess) -> dict:
    """The decode step: ``bytes`` in, the recipe's float32 CHW arrays out (a function: Ray runs it as tasks)."""
    images = np.stack([decode_image(bytes(data), prep) for data in batch["bytes"]])
    return {"path": batch["path"], "image": images}


class Classifier:
    """The stateful step: the MXNet module, loaded once per actor; decodes too when ``decode`` is given."""

    def __init__(self, model: str, endpoint: str, prep: Preprocess, batch: int, top_k: int, decode: bool):
        self.module, self.top_k = Module(model, endpoint, prep.input_shape, batch), top_k
        self.prep = prep if decode else None

    def __call__(self, batch: dict) -> dict:
        if self.prep is not None:
            batch = decode(batch, self.prep)
        ids, probs = self.module.top_k(batch["image"], self.top_k)
        # Ray's paths are the filesystem's, bucket/key: the key column names the object as the others do.
        return {"key": [f"s3://{path}" for path in batch["path"]], "predictions": [
            [{"class_id": int(c), "probability": float(p)} for c, p in zip(row_ids, row_probs)]
            for row_ids, row_probs in zip(ids, probs)]}


def run(args) -> None:
    """List, read, decode, score and write."""
    fs = filesystem(args.endpoint_url)
    prep = recipe(args)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "")}})
    ds = ray.data.read_binary_files(bucket_path(args.input), filesystem=fs, include_paths=True)
    if args.decode == "task":
        ds = ds.map_batches(decode, fn_kwargs={"prep": prep}, batch_size=args.batch)
    ds = ds.map_batches(Classifier, fn_constructor_args=(args.model, args.endpoint_url, prep, args.batch, args.top_k,
                                                         args.decode == "actor"),
                        batch_size=args.batch, compute=ray.data.ActorPoolStrategy(size=args.actors),
                        num_cpus=args.actor_cpus)
    ds.write_parquet(bucket_path(args.output), filesystem=fs)
    ray.shutdown()


def main(argv=None) -> int:
    parser = peer_arguments(__doc__.split("\n")[0], "s3:// folder of the images, e.g. s3://bench/peers/n128/",
                            "s3:// folder for the Parquet files")
    parser.add_argument("--decode", choices=("task", "actor"), default="task",
                        help="decode in stateless tasks before the actors, or in the actors themselves")
    parser.add_argument("--actors", type=int, default=1, help="model actors (concurrency)")
    parser.add_argument("--actor-cpus", type=float, default=1.0,
                        help="CPUs each actor reserves (num_cpus); the read tasks need one left over")
    args = parser.parse_args(argv)
    run(args)
    print(f"ray {ray.__version__}: wrote Parquet under {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
