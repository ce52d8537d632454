"""The job written with Spark's own inference helper, ``predict_batch_udf``, for ``make bench-peers``.

Run by ``bench/peers.py`` through ``spark-submit --master local[2]`` with
Spark's defaults. As ``pyspark.ml.functions.predict_batch_udf``'s docs show:
a DataFrame holds each image as a flattened float array, and the helper
calls ``make_predict_fn`` once per Python worker and the returned function on
batches of ``--batch`` images reshaped to the input shape. The MXNet module
is ``bench/peer_mxnet.py``'s; a pandas UDF GETs each image and decodes it
with the job's own recipe (``mxjob.model.preprocess.decode_image``).

Spark reads and writes ``s3a://`` only with the S3A connector's jars, which
this machine has not got, so the driver lists the keys and PUTs the Parquet
file with boto3 (as the job's driver lists and writes too).

Usage (moto's fake keys in the environment, the checkout on ``PYTHONPATH``)::

    .venv/bin/spark-submit --master 'local[2]' bench/peer_spark_udf.py --input s3://bench/peers/n128/ \\
        --model s3://bench/models/resnet18 --output s3://bench/out/spark-udf-128.parquet \\
        --endpoint-url http://127.0.0.1:5000
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import boto3
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.peer_mxnet import peer_arguments, recipe  # noqa: E402

#: The Parquet columns, as Daft's and the job's outputs have them.
SCHEMA = pa.schema([("key", pa.string()), ("predictions", pa.list_(pa.struct(
    [("class_id", pa.int32()), ("probability", pa.float32())])))])


def list_keys(s3, uri: str) -> list[str]:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", [])]
    return keys


def run(args: argparse.Namespace) -> int:
    """List, score and write; the number of rows written."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField, StructType

    prep = recipe(args)
    shape = prep.input_shape
    bucket = args.input[len("s3://"):].partition("/")[0]
    endpoint, model, batch, top_k = args.endpoint_url, args.model, args.batch, args.top_k
    spark = SparkSession.builder.appName("peer-predict-batch-udf").getOrCreate()
    s3 = boto3.client("s3", endpoint_url=endpoint)
    keys = spark.createDataFrame([(k,) for k in list_keys(s3, args.input)], "key string")

    @F.pandas_udf(ArrayType(FloatType()))
    def load(batch_keys: pd.Series) -> pd.Series:
        from mxjob.model.preprocess import decode_image

        client = boto3.client("s3", endpoint_url=endpoint)
        return pd.Series([decode_image(client.get_object(Bucket=bucket, Key=k)["Body"].read(), prep).ravel()
                          for k in batch_keys])

    def make_predict_fn():
        from bench.peer_mxnet import Module

        module = Module(model, endpoint, shape, batch)

        def predict(inputs: np.ndarray) -> dict:
            ids, probs = module.top_k(inputs, top_k)
            return {"class_ids": ids, "probabilities": probs}

        return predict

    top = predict_batch_udf(make_predict_fn, return_type=StructType([
        StructField("class_ids", ArrayType(IntegerType())), StructField("probabilities", ArrayType(FloatType()))]),
        batch_size=batch, input_tensor_shapes=[list(shape)])
    scored = keys.withColumn("top", top(load("key"))).select("key", "top.class_ids", "top.probabilities").toPandas()
    spark.stop()
    predictions = [[{"class_id": int(c), "probability": float(p)} for c, p in zip(ids, probs)]
                   for ids, probs in zip(scored["class_ids"], scored["probabilities"])]
    table = pa.table({"key": list(scored["key"]), "predictions": predictions}, schema=SCHEMA)
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    out_bucket, _, out_key = args.output[len("s3://"):].partition("/")
    s3.put_object(Bucket=out_bucket, Key=out_key, Body=buffer.getvalue())
    return table.num_rows


def main(argv=None) -> int:
    parser = peer_arguments(__doc__.split("\n")[0], "s3:// prefix of the images", "s3:// key of the Parquet file")
    args = parser.parse_args(argv)
    rows = run(args)
    print(f"predict_batch_udf: wrote {rows} rows to {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
