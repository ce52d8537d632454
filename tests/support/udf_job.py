"""Score a folder of PNGs with ``mxinfer.model_udf`` on Spark; ``tests/integration/test_udf.py`` spark-submits it::

    spark-submit --py-files dist/mxinfer_job.zip tests/support/udf_job.py IMAGES_DIR MODEL_PREFIX OUT.json

Writes ``{path: {"predictions": [...], "error": ...}}`` for every image, plus a
row whose content is null under the path ``"null"``.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import SparkSession

import mxinfer


def main(images: str, model: str, out: str) -> None:
    spark = SparkSession.builder.appName("model_udf test").getOrCreate()
    classify = mxinfer.model_udf(model, mxinfer.Preprocess((3, 32, 32), std=(255.0,)), batch_size=4, top_k=3)
    files = spark.read.format("binaryFile").option("pathGlobFilter", "*.png").load(images)
    null_row = spark.createDataFrame([("null", None)], "path string, content binary")
    frame = files.select("path", "content").unionByName(null_row).repartition(3)
    rows = frame.select("path", classify("content").alias("result")).collect()
    with open(out, "w") as handle:
        json.dump({row.path: row.result.asDict(recursive=True) for row in rows}, handle)
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
