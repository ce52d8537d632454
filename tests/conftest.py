"""Shared fixtures: fake AWS environment, one moto S3 server and one demo model per session.

Integration tests run the real job through ``spark-submit`` on
``local-cluster[2,1,1024]``; each such run is a session fixture whose output
several tests read, so the suite starts Spark only a handful of times. The
helpers the tests call (``encode``, ``make_s3_client``, ``spark_submit``, ...)
are in ``tests/support/helpers.py``: a test module never imports this file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

import mxjob.tasks  # noqa: F401 - the built-in tasks registered, as in every run (their columns reserved)
from demo import make_demo
from demo.s3local import FAKE_AWS_ENV, moto_server
from mxjob.core import state
from tests.support.helpers import make_s3_client


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


@pytest.fixture
def runner() -> CliRunner:
    """Invokes a click command in-process; ``result.output`` has its stdout and stderr."""
    return CliRunner()


@pytest.fixture
def stderr_runner() -> CliRunner:
    """Like ``runner``, with stderr apart: ``result.stdout`` and ``result.stderr``."""
    return CliRunner(mix_stderr=False)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory):
    """A moto S3 (and EMR) server for the whole session; its endpoint URL."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3(moto_endpoint):
    return make_s3_client(moto_endpoint)


@pytest.fixture(scope="module")
def moto_buckets(request, moto_endpoint):
    """An S3 client on the session's moto server, with the test module's buckets created once per module.

    The buckets are the module's ``BUCKETS``, else its ``BUCKET``; a test can
    name others with ``@pytest.mark.parametrize("moto_buckets", [("a", "b")], indirect=True)``.
    """
    names = getattr(request, "param", None) or getattr(request.module, "BUCKETS", None) or (request.module.BUCKET,)
    client = make_s3_client(moto_endpoint)
    for name in names:
        client.create_bucket(Bucket=name)
    return client


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
