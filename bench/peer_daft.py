"""The job written the way Daft's docs show batch inference, for ``make bench-peers`` (``bench/peers.py``).

Runs in the bench's own venv ``.venv-peers`` (``bench/requirements-peers.txt``):
Daft needs Python 3.10 or later, so it is never a dependency of the job.

The pipeline: ``daft.from_glob_path`` lists the images, ``.download()`` fetches
them, and they are decoded either

- ``--decode recipe``: by a ``@daft.func`` with the job's own recipe
  (``mxjob.model.preprocess.decode_image``: every system gets the same model input), or
- ``--decode daft``: by Daft's own ``decode_image`` and ``resize`` (Rust, on
  Daft's threads), kept as a uint8 tensor until the batch function scales it
  with the recipe's mean and std, as Daft's image-classification guide does;

then a ``@daft.cls`` class holds the MXNet module (``bench/peer_mxnet.py``,
loaded once per instance, as the docs' class UDFs hold a model; ``--instances``
of them at once) and scores batches of ``--batch`` images, and
``write_parquet`` writes each image's top ``--top-k`` classes back to S3.
MXNet's threads are the environment's ``OMP_NUM_THREADS`` (the bench sets it).

Usage (moto's fake keys in the environment)::

    .venv-peers/bin/python -m bench.peer_daft --input 's3://bench/peers/n128/*' \\
        --model s3://bench/models/resnet18 --output s3://bench/out/daft-128/ \\
        --endpoint-url http://127.0.0.1:5000 --input-shape 3,224,224 \\
        --mean 123.68,116.78,103.94 --std 58.4,57.12,57.38
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import daft  # noqa: E402
from daft import DataType  # noqa: E402

from bench.peer_mxnet import Module, peer_arguments, recipe  # noqa: E402
from mxjob.model.preprocess import decode_image  # noqa: E402

TOP = DataType.list(DataType.struct({"class_id": DataType.int32(), "probability": DataType.float32()}))


def io_config(endpoint: str) -> daft.io.IOConfig:
    """Daft's S3 client pointed at the S3 stand-in, with the keys of the environment (moto's fake ones)."""
    return daft.io.IOConfig(s3=daft.io.S3Config(
        endpoint_url=endpoint, region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        key_id=os.environ["AWS_ACCESS_KEY_ID"], access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
        session_token=os.environ.get("AWS_SESSION_TOKEN"), use_ssl=endpoint.startswith("https")))


def build(args: argparse.Namespace):
    """The decode expression's maker and the classifier of the pipeline, for ``args``."""
    prep = recipe(args)
    shape = prep.input_shape
    channels, height, width = shape
    mean = np.asarray(prep.mean, dtype=np.float32).reshape(1, channels, 1, 1)
    std = np.asarray(prep.std, dtype=np.float32).reshape(1, channels, 1, 1)

    @daft.func(return_dtype=DataType.tensor(DataType.float32(), shape=shape))
    def decode_recipe(data: bytes) -> np.ndarray:
        return decode_image(data, prep)

    def decode(data: daft.Expression) -> daft.Expression:
        if args.decode == "recipe":
            return decode_recipe(data)
        image = data.decode_image(mode="RGB").resize(width, height)
        return image.cast(DataType.tensor(DataType.uint8(), shape=(height, width, channels)))

    @daft.cls(max_concurrency=args.instances)
    class Classifier:
        def __init__(self, model: str, endpoint: str, batch: int, top_k: int):
            self.module, self.top_k = Module(model, endpoint, shape, batch), top_k

        @daft.method.batch(return_dtype=TOP, batch_size=args.batch)
        def predict(self, images: daft.Series) -> list:
            batch = np.stack(images.to_pylist())
            if batch.dtype == np.uint8:  # Daft's decode: HWC bytes, scaled here as the recipe scales them
                batch = (batch.transpose(0, 3, 1, 2).astype(np.float32) - mean) / std
            ids, probs = self.module.top_k(batch, self.top_k)
            return [[{"class_id": int(c), "probability": float(p)} for c, p in zip(*row)] for row in zip(ids, probs)]

    return decode, Classifier(args.model, args.endpoint_url, args.batch, args.top_k)


def run(args: argparse.Namespace) -> int:
    """List, download, decode, score and write; the number of Parquet files written."""
    config = io_config(args.endpoint_url)
    decode, classifier = build(args)
    df = daft.from_glob_path(args.input, io_config=config)
    df = df.with_column("image", decode(df["path"].download(io_config=config)))
    df = df.with_column("predictions", classifier.predict(df["image"]))
    written = df.select(df["path"].alias("key"), df["predictions"]).write_parquet(args.output, io_config=config)
    return len(written.to_pydict()["path"])


def main(argv=None) -> int:
    parser = peer_arguments(__doc__.split("\n")[0], "glob of the images, e.g. 's3://bench/peers/n128/*'",
                            "s3:// folder for the Parquet files")
    parser.add_argument("--decode", choices=("recipe", "daft"), default="recipe",
                        help="the job's recipe in a @daft.func, or Daft's own decode_image and resize")
    parser.add_argument("--instances", type=int, default=1,
                        help="classifier instances at once (max_concurrency); each holds a module")
    args = parser.parse_args(argv)
    files = run(args)
    print(f"daft {daft.__version__}: wrote {files} Parquet file(s) under {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
