"""What the peers of ``make bench-peers`` share: the checkpoint from S3 in an MXNet module, and top-k.

Written as a user of Daft or of Spark's ``predict_batch_udf`` would write it
with MXNet's own API (``mx.mod.Module``), not with the job's model code:
only the decode recipe is the job's, so that every system gets the same input.
Imports only boto3 and NumPy at the top, so that both venvs import it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading

import numpy as np


def fetch_checkpoint(uri: str, endpoint: str, into: str) -> str:
    """Copy ``URI-symbol.json`` and ``URI-0000.params`` from S3 into the folder ``into``; the local prefix."""
    import boto3

    bucket, _, key = uri[len("s3://"):].partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    prefix = os.path.join(into, key.rsplit("/", 1)[-1])
    for suffix in ("-symbol.json", "-0000.params"):
        s3.download_file(bucket, key + suffix, prefix + suffix)
    return prefix


class Module:
    """The checkpoint at ``uri`` bound for batches of ``batch`` inputs of ``shape``, on the CPU."""

    def __init__(self, uri: str, endpoint: str, shape: tuple, batch: int):
        import mxnet as mx

        self.mx = mx
        with tempfile.TemporaryDirectory() as folder:
            symbol, arg_params, aux_params = mx.model.load_checkpoint(fetch_checkpoint(uri, endpoint, folder), 0)
        self.module = mx.mod.Module(symbol, data_names=["data"], label_names=None, context=mx.cpu())
        self.module.bind(data_shapes=[("data", (batch, *shape))], for_training=False)
        self.module.set_params(arg_params, aux_params, allow_missing=False)
        # A Module is not thread-safe, and Daft 0.7.26 can call one instance from two threads at once
        # (@daft.cls with max_concurrency=2, run in-process): a short batch's reshape then broke the other
        # call's forward ("expected [1,3,32,32], got [2,3,32,32]"), and the two could read each other's outputs.
        self.lock = threading.Lock()

    def top_k(self, batch: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(class ids, probabilities)``, each ``(len(batch), k)``, highest first (ties: lower id first)."""
        with self.lock:  # Module.forward rebinds for a short last batch by itself
            self.module.forward(self.mx.io.DataBatch([self.mx.nd.array(batch)]), is_train=False)
            logits = self.module.get_outputs()[0].asnumpy()
        return top_k(logits, k)


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The softmax of ``logits`` (the bench's checkpoints end in logits, as the job takes them), its top ``k``."""
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs = exp / exp.sum(axis=1, keepdims=True)
    best = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return best.astype(np.int32), np.take_along_axis(probs, best, axis=1).astype(np.float32)


def recipe(args: argparse.Namespace):
    """The job's decode recipe (:class:`mxjob.model.preprocess.Preprocess`) from :func:`peer_arguments`' shape,
    mean and std: every peer decodes with it, or scales its own decode with its mean and std."""
    from mxjob.model.preprocess import Preprocess

    return Preprocess(input_shape=tuple(int(x) for x in args.input_shape.split(",")),
                      mean=tuple(float(x) for x in args.mean.split(",")),
                      std=tuple(float(x) for x in args.std.split(",")))


def peer_arguments(description: str, input_help: str, output_help: str) -> argparse.ArgumentParser:
    """The command line both peers take: the same images, model, recipe, batch and top-k as the job's run."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--input", required=True, help=input_help)
    parser.add_argument("--model", required=True, help="s3:// prefix of PREFIX-symbol.json and PREFIX-0000.params")
    parser.add_argument("--output", required=True, help=output_help)
    parser.add_argument("--endpoint-url", required=True)
    parser.add_argument("--input-shape", default="3,224,224")
    parser.add_argument("--mean", default="123.68,116.78,103.94")
    parser.add_argument("--std", default="58.4,57.12,57.38")
    parser.add_argument("--batch", type=int, default=16, help="images per forward pass (the job's micro-batch)")
    parser.add_argument("--top-k", type=int, default=5)
    return parser
