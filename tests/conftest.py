"""Shared fixtures: fake AWS environment, one moto S3 server and one demo model per session.

Integration tests run the real job through ``spark-submit`` on
``local-cluster[2,1,1024]``; each such run is a session fixture whose output
several tests read, so the suite starts Spark only a handful of times.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo import make_demo  # noqa: E402
from demo.run_local import spark_env, spark_submit_command  # noqa: E402
from demo.s3local import FAKE_AWS_ENV, moto_server  # noqa: E402
from mxjob import state  # noqa: E402


def encode(img: Image.Image, fmt: str = "PNG", **kwargs) -> bytes:
    """``img`` encoded as ``fmt`` (Pillow's format name), with Pillow's save options."""
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **kwargs)
    return buffer.getvalue()


@pytest.fixture(autouse=True)
def fresh_model_cache():
    """Each test loads its own models: none finds one an earlier test left in this process's cache."""
    state.clear()
    yield
    state.clear()


@pytest.fixture(autouse=True)
def fake_aws_env(monkeypatch):
    """No test can reach a real AWS account: fake keys, a fixed region, no profile."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """A moto S3 (and EMR) server for the whole session; its endpoint URL."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        yield endpoint


def make_s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def bucket_with_model(endpoint: str, bucket: str, model_dir: Path):
    """Create ``bucket`` and upload every file of ``model_dir`` under ``model/``; return the client."""
    s3 = make_s3_client(endpoint)
    s3.create_bucket(Bucket=bucket)
    for path in sorted(model_dir.iterdir()):
        s3.upload_file(str(path), bucket, f"model/{path.name}")
    return s3


@pytest.fixture(scope="session")
def s3(moto_endpoint):
    return make_s3_client(moto_endpoint)


@pytest.fixture(scope="session")
def demo_dir(tmp_path_factory):
    """The demo model (logits head) and held-out digit PNGs, trained once per session."""
    out = tmp_path_factory.mktemp("demo")
    made = make_demo.make_demo(out, epochs=6)
    prefix = Path(made["model_prefix"])
    make_demo.export_softmax_head(prefix, prefix.with_name("digits_softmax"))
    return out


@pytest.fixture(scope="session")
def logits_prefix(demo_dir) -> Path:
    return demo_dir / "model" / "digits"


@pytest.fixture(scope="session")
def softmax_prefix(demo_dir) -> Path:
    return demo_dir / "model" / "digits_softmax"


def start_spark_submit(job_args: list[str], extra_env: dict | None = None) -> subprocess.Popen:
    """Start the job through spark-submit in a session of its own, so a test can signal the whole driver.

    Killing the process group is what a lost driver node, YARN's container
    kill or a terminal's Ctrl-C does: the JVM, the Python driver and (on
    local-cluster) the executors it started go together.
    """
    return subprocess.Popen(spark_submit_command(job_args), env=spark_env(extra_env), cwd=str(ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def spark_submit(job_args: list[str], timeout: int = 600, extra_env: dict | None = None,
                 cwd: Path = ROOT, master: str | None = None) -> subprocess.CompletedProcess:
    """Run the job through spark-submit on local-cluster (``master``, else ``make run-local``'s)."""
    command = spark_submit_command(job_args, master) if master else spark_submit_command(job_args)
    return subprocess.run(command, check=False, env=spark_env(extra_env), cwd=str(cwd),
                          capture_output=True, text=True, timeout=timeout)
