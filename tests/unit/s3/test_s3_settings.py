"""S3 settings reach every client, and botocore's internals are used only under ``--s3-reader lean``.

``--s3-max-attempts`` bounds the model's and the labels' reads and the
``--config s3://`` read, proved through the fault proxy (``demo/s3proxy.py``)
failing the first GETs of one key. The listing under ``--s3-reader botocore``
is botocore's own; under ``lean`` it falls back to that, with one warning,
when botocore lacks what its fast path needs. The lean GET reader's hook
never rides on a client that :func:`clients.s3_client` hands out.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import urllib.parse

import boto3
import botocore.exceptions
import botocore.handlers
import click
import pytest
import yaml

import infer_main
from demo import make_demo
from mxjob.core import state
from mxjob.core.errors import JobError
from mxjob.inputs import listing
from mxjob.model.predictor import ModelSpec
from mxjob.options import config
from mxjob.run import checks
from mxjob.s3 import clients, lean_list, object_reader, parallel_list
from mxjob.tasks.classify import Classifier
from tests.support.fault_proxy import FaultProxy, Faults
from tests.support.helpers import bucket_with_model

BUCKET = "s3-settings-bucket"
KEYS = sorted([f"list/{folder}/{i:03d}.jpg" for folder in ("a", "b", "Z") for i in range(25)]
              + ["list/é/café.jpg", "list/日本/写真 1.jpg", "list/+plus & more.png", "list/😀.png"])
#: What the proxy's SlowDown looks like once botocore has given up on it after one retry (two attempts).
GAVE_UP = r"An error occurred \(SlowDown\) when calling the GetObject operation \(reached max retries: 1\)"


@pytest.fixture(scope="module")
def bucket(moto_endpoint, demo_dir):
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    for n, key in enumerate(KEYS):
        s3.put_object(Bucket=BUCKET, Key=key, Body=b"x" * (n % 7))
    return s3


def first_gets(count: int, suffix: str):
    """A proxy fault filter: the first ``count`` GETs of the key ending in ``suffix`` are eligible, no others."""
    gets = []

    def eligible(method: str, path: str) -> bool:
        if method != "GET" or not urllib.parse.unquote(path.split("?")[0]).endswith(suffix):
            return False
        gets.append(path)  # the proxy calls this under its lock
        return len(gets) <= count

    eligible.gets = gets
    return eligible


def failing_proxy(upstream: str, count: int, suffix: str) -> FaultProxy:
    """A proxy that answers ``503 SlowDown`` to the first ``count`` GETs of ``suffix``, and passes the rest."""
    return FaultProxy(upstream, faults=Faults(rate=1.0, kinds=("slowdown",), key_filter=first_gets(count, suffix)))


# --- the model's and the labels' reads


@pytest.mark.parametrize("suffix", ["model/digits-0000.params", "model/synset.txt"])
def test_the_model_spec_decides_how_often_its_reads_are_tried(bucket, moto_endpoint, suffix):
    prefix = f"s3://{BUCKET}/model/digits"
    with failing_proxy(moto_endpoint, 2, suffix) as proxy:
        spec = ModelSpec.from_prefix(prefix, endpoint_url=proxy.endpoint, s3_max_attempts=3)
        model = Classifier(spec, make_demo.INPUT_SHAPE, 4)
    assert model.labels == make_demo.LABELS  # the labels came through too
    assert proxy.counts["slowdown"] == 2 and len(proxy.faults.key_filter.gets) == 3  # two 503s, then the file

    with failing_proxy(moto_endpoint, 2, suffix) as proxy:
        spec = ModelSpec.from_prefix(prefix, endpoint_url=proxy.endpoint, s3_max_attempts=2)
        with pytest.raises(botocore.exceptions.ClientError, match=GAVE_UP):
            Classifier(spec, make_demo.INPUT_SHAPE, 4)
    assert proxy.counts["slowdown"] == 2 and len(proxy.faults.key_filter.gets) == 2  # both attempts, no more


def test_the_jobs_s3_max_attempts_reaches_the_models_reads(bucket, moto_endpoint):
    assert ModelSpec("s.json", "p.params").s3_max_attempts == clients.S3_MAX_ATTEMPTS
    settings = {"input": f"s3://{BUCKET}/list/", "model": f"s3://{BUCKET}/model/digits",
                "output": f"s3://{BUCKET}/out/o.jsonl", "input_shape": "3,32,32", "std": "255"}
    with failing_proxy(moto_endpoint, 2, "model/digits-0000.params") as proxy:
        cfg = config.resolve(config.merge_settings(
            {**settings, "endpoint_url": proxy.endpoint, "s3_max_attempts": 2}, {}))
        assert cfg.model.s3_max_attempts == cfg.job_spec().model.s3_max_attempts == 2  # executors get it too
        with pytest.raises(JobError, match=rf"cannot load the model \(s3://{BUCKET}/model/digits-symbol.json\): "
                                           + GAVE_UP):
            checks.load_model_on_driver(cfg)
    assert proxy.counts["slowdown"] == 2

    with failing_proxy(moto_endpoint, 2, "model/digits-0000.params") as proxy:
        cfg = config.resolve(config.merge_settings(
            {**settings, "endpoint_url": proxy.endpoint, "s3_max_attempts": 3}, {}))
        assert checks.load_model_on_driver(cfg).num_classes == 10
    assert proxy.counts["slowdown"] == 2


# --- the --config s3:// read


@pytest.fixture(scope="module")
def config_uri(bucket):
    body = {"input": f"s3://{BUCKET}/list/", "model": f"s3://{BUCKET}/model/digits",
            "output": f"s3://{BUCKET}/out/cfg.jsonl", "s3_max_attempts": 9}
    bucket.put_object(Bucket=BUCKET, Key="cfg/job.yaml", Body=yaml.safe_dump(body).encode())
    return f"s3://{BUCKET}/cfg/job.yaml"


def test_load_yaml_reads_with_the_attempts_it_is_given(moto_endpoint, config_uri):
    with failing_proxy(moto_endpoint, 2, "cfg/job.yaml") as proxy:
        assert config.load_yaml(config_uri, proxy.endpoint, None, 3)["s3_max_attempts"] == 9
    assert proxy.counts["slowdown"] == 2
    with failing_proxy(moto_endpoint, 2, "cfg/job.yaml") as proxy:
        with pytest.raises(click.UsageError, match=f"cannot read --config {config_uri}: " + GAVE_UP):
            config.load_yaml(config_uri, proxy.endpoint, None, 2)
    assert proxy.counts["slowdown"] == 2


def test_the_command_lines_s3_max_attempts_reads_the_config(moto_endpoint, config_uri, monkeypatch, runner):
    ran = []
    monkeypatch.setattr(infer_main, "run_job", lambda cfg, **_: ran.append(cfg) or 0)
    with failing_proxy(moto_endpoint, 2, "cfg/job.yaml") as proxy:
        result = runner.invoke(infer_main.main, ["--config", config_uri, "--endpoint-url", proxy.endpoint,
                                                      "--s3-max-attempts", "2"])
    assert result.exit_code == 2 and not ran, result.output
    assert f"cannot read --config {config_uri}" in result.output and "SlowDown" in result.output
    assert proxy.counts["slowdown"] == 2

    with failing_proxy(moto_endpoint, 2, "cfg/job.yaml") as proxy:
        result = runner.invoke(infer_main.main, ["--config", config_uri, "--endpoint-url", proxy.endpoint,
                                                      "--s3-max-attempts", "3"])
    assert result.exit_code == 0, result.output
    assert proxy.counts["slowdown"] == 2
    [cfg] = ran
    assert cfg.s3_max_attempts == cfg.model.s3_max_attempts == 3  # the command line beats the file's 9


# --- listing: botocore's own under --s3-reader botocore; lean falls back with its reason


def before_parse_handlers(client) -> list:
    """The handlers ``before-parse`` runs for a ListObjectsV2 page, in order (on a 404, which none acts on)."""
    operation = client.meta.service_model.operation_model("ListObjectsV2")
    called = client.meta.events.emit("before-parse.s3.ListObjectsV2", operation_model=operation,
                                     response_dict={"status_code": 404, "headers": {}, "body": b""},
                                     customized_response_dict={})
    return [handler for handler, _ in called]


@pytest.fixture
def page_spy(monkeypatch):
    """Every call of the lean listing's ``before-parse`` hook, counted (clients made after this register the spy)."""
    calls = []
    real = lean_list._keys_and_sizes

    def spy(**kwargs):
        calls.append(kwargs.get("operation_model"))
        return real(**kwargs)

    monkeypatch.setattr(lean_list, "_keys_and_sizes", spy)
    return calls


def list_all(client) -> list[tuple[str, int]]:
    keys, sizes = parallel_list.list_prefix(client, BUCKET, "list/", 4, page_size=10)
    return list(listing.Listing.build(BUCKET, keys, sizes))


def test_the_botocore_listing_client_is_botocores_own_and_lists_what_lean_lists(bucket, moto_endpoint, page_spy):
    plain = boto3.session.Session().client("s3", endpoint_url=moto_endpoint)
    client = lean_list.list_client(moto_endpoint, kind="botocore")
    assert before_parse_handlers(client) == before_parse_handlers(plain)  # _handle_200_error first, as botocore has it
    assert botocore.handlers._handle_200_error in before_parse_handlers(client)
    page = client.list_objects_v2(Bucket=BUCKET, Prefix="list/")
    assert "KeysAndSizes" not in page and len(page["Contents"]) == len(KEYS)  # botocore's parser, dates and all
    from_botocore = list_all(client)
    assert not page_spy  # the lean hook never ran

    lean = lean_list.list_client(moto_endpoint, kind="lean")
    handlers = before_parse_handlers(lean)
    assert handlers.index(lean_list._keys_and_sizes) < handlers.index(botocore.handlers._handle_200_error)
    page_spy.clear()
    assert list_all(lean) == from_botocore == [(key, n % 7) for n, key in enumerate(KEYS)]
    assert page_spy  # ... and this one did use it


def test_lean_listing_without_handle_200_error_warns_once_and_lists_through_botocore(
        bucket, moto_endpoint, page_spy, monkeypatch, caplog):
    monkeypatch.delattr(botocore.handlers, "_handle_200_error")
    monkeypatch.setattr(state.counters, "listing_fallback", None)  # another test may have warned in this process
    assert "_handle_200_error" in lean_list.lean_listing_unavailable()
    with caplog.at_level(logging.WARNING, logger=lean_list.__name__):
        listed = [list_all(lean_list.list_client(moto_endpoint, kind="lean")) for _ in range(2)]
    assert listed[0] == listed[1] == [(key, n % 7) for n, key in enumerate(KEYS)]
    assert not page_spy
    [warning] = [r for r in caplog.records if r.name == lean_list.__name__]
    assert warning.levelno == logging.WARNING
    assert ("the lean listing is not available (botocore " in warning.getMessage()
            and "has no botocore.handlers._handle_200_error" in warning.getMessage()
            and "listing with botocore's own ListObjectsV2 parser instead" in warning.getMessage())


#: A listing in a fresh process whose botocore lacks botocore.compat.unquote_str, an internal alias that
#: botocore's own modules have bound by the time anything of ours is imported (as in any botocore that
#: dropped it, whose modules would not use it).
WITHOUT_UNQUOTE_STR = """
import json, logging, sys
import boto3, botocore.compat, botocore.handlers, botocore.session
del botocore.compat.unquote_str
logging.basicConfig(level=logging.WARNING)
from mxjob.s3 import lean_list, parallel_list
client = lean_list.list_client(sys.argv[1], kind="lean")
page = client.list_objects_v2(Bucket=sys.argv[2], Prefix="list/")
keys, sizes = parallel_list.list_prefix(client, sys.argv[2], "list/", 4, page_size=10)
print(json.dumps({"lean": "KeysAndSizes" in page, "listed": sorted(zip(keys.to_pylist(), sizes.to_pylist()))}))
"""


def test_the_lean_listing_needs_no_botocore_compat_unquote_str(bucket, moto_endpoint):
    done = subprocess.run([sys.executable, "-c", WITHOUT_UNQUOTE_STR, moto_endpoint, BUCKET],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["lean"]  # the lean parser, with the url-encoded keys (spaces, "+", "&", non-ASCII) decoded
    assert [tuple(pair) for pair in out["listed"]] == sorted((key, n % 7) for n, key in enumerate(KEYS))
    assert "WARNING" not in done.stderr  # nothing to fall back from


def test_list_client_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="choose one of lean, botocore"):
        lean_list.list_client(kind="fast")


# --- the lean GET reader's client is its own


def test_s3_client_never_hands_out_the_lean_readers_hooked_client(bucket, moto_endpoint):
    reader = object_reader.s3_reader(moto_endpoint, max_attempts=4, kind="lean")
    plain = clients.s3_client(moto_endpoint, max_attempts=4)
    assert reader.enabled and plain is not reader.client
    plain.get_object(Bucket=BUCKET, Key=KEYS[0])["Body"].read()
    assert getattr(reader._sent, "request", None) is None  # the hook is not on the plain client
    reader.client.get_object(Bucket=BUCKET, Key=KEYS[0])["Body"].read()
    assert reader._sent.request is not None  # ... it is on the reader's own
    reader._sent.request = None
    # The botocore reader hooks nothing, so it may share the plain client.
    assert object_reader.s3_reader(moto_endpoint, max_attempts=4, kind="botocore").client is plain


def test_the_cached_clients_of_a_process_share_one_session_and_its_loaded_service_model(monkeypatch):
    # botocore parses S3's service model once a session: a second client with other settings parses nothing.
    import botocore.loaders

    from mxjob.core import state

    monkeypatch.setattr(state, "s3_clients", state.ProcessCache("S3 clients", state.MAX_S3_CLIENTS))
    monkeypatch.setattr(state, "s3_sessions", state.ProcessCache("S3 sessions", 1))
    loaded = []
    real = botocore.loaders.JSONFileLoader.load_file
    monkeypatch.setattr(botocore.loaders.JSONFileLoader, "load_file",
                        lambda self, path: loaded.append(path) or real(self, path))
    first, _ = clients.cached_client("http://127.0.0.1:9", "us-east-1", 3, 10)
    models = [p for p in loaded if "service-2" in p]  # the model and its extras
    second, _ = clients.cached_client("http://127.0.0.1:9", "us-east-1", 5, 20, purpose="other")
    assert first is not second and models and [p for p in loaded if "service-2" in p] == models
    assert len(state.s3_sessions) == 1
    assert second.meta.config.retries["total_max_attempts"] == 5
