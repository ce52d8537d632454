"""Helpers the tests import (``from tests.support.helpers import ...``); the fixtures are in ``conftest.py``.

pytest's ``pythonpath`` setting (pyproject.toml) puts the checkout's root on
``sys.path``, so ``tests`` imports from there, as do ``mxinfer``, ``utils``,
``mxjob``, ``demo`` and ``deploy``.
"""

from __future__ import annotations

import io
import subprocess
from pathlib import Path

import boto3
from PIL import Image

from demo.run_local import spark_env, spark_submit_command

ROOT = Path(__file__).resolve().parents[2]
#: The integration tests' master: two executors, not make run-local's one, so that the warm-up's shares,
#: the merge of parts from two workers and a lost executor are what the suite runs. make run-local's own
#: layout (demo.run_local.MASTER) runs in tests/demo/test_run_local.py and tests/demo/test_submit.py.
MASTER = "local-cluster[2,1,1024]"
#: The two labels of the tests' small detector (tests/integration/test_tasks.py's job) and of the example rows
#: tests/unit/reporting/test_output_docs.py writes.
CLASSES = ("cat", "dog")


def encode(img: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    """``img`` encoded as ``fmt`` (Pillow's format name), with Pillow's save options."""
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


def part_lines(data: bytes) -> list[str]:
    """The JSON lines of a part (``mxjob.results.part_format``): its record batch in its task's JSON Lines view."""
    from mxjob.results import part_format

    return lines_of(part_format.read_part(data))


def lines_of(batch) -> list[str]:
    """The JSON lines of a batch of the result model (its task's view)."""
    from mxjob import tasks

    return tasks.of_schema(batch.schema).json_lines(batch)


def part_of(batch, lines: bool = True, metadata=None) -> bytes:
    """A batch's part as its task writes it (``lines``: the output is JSON Lines, so they are rendered)."""
    from mxjob import tasks

    return tasks.of_schema(batch.schema).write_part(batch, lines, metadata)


def parquet_of(schema, metadata=None):
    """The Parquet view's schema of parts of ``schema`` (their task's)."""
    from mxjob import tasks

    return tasks.of_schema(schema).parquet_schema(schema, metadata)


def lines_part(lines: list[str], rendered: bool = True, seen: dict | None = None) -> bytes:
    """A classify part holding these JSON lines' rows (a test's stand-in for a task's part).

    ``rendered=False``: the part a Parquet job's task writes, its lines left null. ``seen``
    (``{key: (etag, size)}``): the part carries the objects' metadata, as under --with-object-metadata.
    """
    import json

    from mxjob.results import part_format
    from mxjob.tasks import classify

    out = classify.TASK.results()
    for line in lines:
        row = json.loads(line)
        if "error" in row:
            out.fail(row["key"], row["error"])
        else:
            out.add(row["key"], [{"label": None, **p} for p in row["predictions"]])
    batch = out.record_batch()
    metadata = None if seen is None else part_format.object_metadata(batch.column("key").to_pylist(), seen)
    return classify.TASK.write_part(batch, rendered, metadata)


def scored_lines(model, keys: list[str], inputs: list, handlers=None, **job) -> list[str]:
    """The JSON lines a task writes for ``keys`` scored together, in their order: one forward pass of ``model``
    (the run's task's ``score``, with ``handlers`` if given), then the part's JSON Lines view."""
    from mxjob.executor import partition
    from mxjob.model.preprocess import Preprocess

    spec = partition.JobSpec(model=getattr(model, "spec", None), preprocess=Preprocess(), bucket="", **job)
    task = partition.job_task(spec, handlers)
    out = task.results(task.result_schema(spec, model))
    task.score(model, keys, inputs, spec, out)
    return task.json_lines(out.record_batch(sort=False))


def make_s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


#: The stand-in model's URI prefix under a bucket (:func:`put_fake_model`).
FAKE_MODEL = "model/fake"


def put_fake_model(s3, bucket: str) -> str:
    """Two empty files where a model's symbol and params belong: enough for the runs that end before the model is
    loaded (its files are only looked for). Returns the ``--model`` URI."""
    for suffix in ("-symbol.json", "-0000.params"):
        s3.put_object(Bucket=bucket, Key=f"{FAKE_MODEL}{suffix}", Body=b"{}")
    return f"s3://{bucket}/{FAKE_MODEL}"


def bucket_with_model(endpoint: str, bucket: str, model_dir: Path):
    """Create ``bucket`` and upload every file of ``model_dir`` under ``model/``; return the client."""
    s3 = make_s3_client(endpoint)
    s3.create_bucket(Bucket=bucket)
    for path in sorted(model_dir.iterdir()):
        s3.upload_file(str(path), bucket, f"model/{path.name}")
    return s3


def start_spark_submit(job_args: list[str], extra_env: dict | None = None) -> subprocess.Popen:
    """Start the job through spark-submit in a session of its own, so a test can signal the whole driver.

    Killing the process group is what a lost driver node, YARN's container
    kill or a terminal's Ctrl-C does: the JVM, the Python driver and (on
    local-cluster) the executors it started go together.
    """
    return subprocess.Popen(spark_submit_command(job_args, MASTER), env=spark_env(extra_env), cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def spark_submit(job_args: list[str], timeout: int = 600, extra_env: dict | None = None,
                 cwd: Path = ROOT, master: str | None = None) -> subprocess.CompletedProcess:
    """Run the job through spark-submit on local-cluster (``master``, else :data:`MASTER`)."""
    command = spark_submit_command(job_args, master or MASTER)
    return subprocess.run(command, check=False, env=spark_env(extra_env), cwd=str(cwd),
                          capture_output=True, text=True, timeout=timeout)


def bucket_with_effnet(endpoint: str, bucket: str, model_dir: Path) -> tuple:
    """Create ``bucket`` with the real pretrained EfficientNet-Lite0 (``demo/pretrained.py``) under ``model/effnet``.

    Returns ``(client, local checkpoint prefix)``. One PUT a file: moto's
    checksum of a multipart upload (``upload_file`` over 8 MB) fails botocore's check.
    """
    from demo import pretrained

    prefix = pretrained.export(model_dir)
    s3 = make_s3_client(endpoint)
    s3.create_bucket(Bucket=bucket)
    for suffix in ("-symbol.json", "-0000.params"):
        s3.put_object(Bucket=bucket, Key=f"model/effnet{suffix}", Body=Path(f"{prefix}{suffix}").read_bytes())
    return s3, prefix


def bucket_with_digits(endpoint: str, bucket: str, model_dir: Path, count: int) -> tuple:
    """:func:`bucket_with_model`, plus ``count`` held-out demo digits as ``imgs/NN.png``; ``(client, keys)``."""
    from demo import make_demo

    s3 = bucket_with_model(endpoint, bucket, model_dir)
    (_, _), (test_x, _) = make_demo.digits_split()
    keys = [f"imgs/{i:02d}.png" for i in range(count)]
    for i, key in enumerate(keys):
        s3.put_object(Bucket=bucket, Key=key, Body=make_demo.digit_png(test_x[i]))
    return s3, keys


def digits_classifier(model_dir: Path, batch_size: int):
    """The demo digits model under ``model_dir`` in the library, decoding as a job given ``--input-shape 3,32,32
    --std 255`` does: what a test compares that job's rows with."""
    import mxinfer

    return mxinfer.ImageClassifier(str(model_dir / "digits"), (3, 32, 32), batch_size,
                                   preprocess=mxinfer.Preprocess((3, 32, 32), std=(255.0,)))


def put_digits(s3, bucket: str, first: int, count: int) -> list[str]:
    """Upload held-out demo digits ``first`` to ``first + count - 1`` as ``imgs/NNN.png`` in ``bucket``; their keys."""
    from demo import make_demo

    (_, _), (test_x, _) = make_demo.digits_split()
    keys = [f"imgs/{i:03d}.png" for i in range(first, first + count)]
    for i, key in zip(range(first, first + count), keys):
        s3.put_object(Bucket=bucket, Key=key, Body=make_demo.digit_png(test_x[i]))
    return keys


def upload_data_file(s3, uri: str, batch, fingerprint: dict) -> None:
    """One Parquet data file as the job writes it (its Parquet sink over a multipart upload, complete when closed),
    with ``fingerprint`` in its metadata."""
    from mxjob.outputs import parquet
    from mxjob.s3 import uris, writes

    bucket, key = uris.parse_s3_uri(uri, need_key=True)
    writer = writes.MultipartWriter(s3, bucket, key, content_type=parquet.PARQUET_TYPE)
    sink = parquet.ParquetSink(writer, parquet.provenance({"fingerprint": fingerprint}))
    sink.write([batch])
    sink.close()
