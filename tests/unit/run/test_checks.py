"""The checks that need no listing refuse a run before the listing starts (the output's, mxjob/outputs/base.py, and
the model's, mxjob/run/checks.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mxjob.core import errors
from mxjob.inputs import manifest
from mxjob.options.config import merge_settings, resolve
from mxjob.outputs import claim, work_prefix
from mxjob.outputs.iceberg import IcebergOutput
from mxjob.run import checks, driver
from mxjob.s3 import clients, parallel_list
from tests.support.helpers import bucket_with_model

BUCKET = "preflight-bucket"


@pytest.fixture(scope="module")
def world(moto_endpoint, demo_dir):
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    s3.put_object(Bucket=BUCKET, Key="done/out.jsonl", Body=b"yesterday's results\n")
    return s3


@pytest.fixture
def listed(monkeypatch):
    """Every call of the listing or the manifest reader: a huge input's listing that must never start."""
    calls: list[str] = []

    def huge_listing(*args, **kwargs):
        calls.append("list_prefix")
        raise AssertionError("listed")

    def huge_manifest(*args, **kwargs):
        calls.append("read_manifest")
        raise AssertionError("read the manifest")

    monkeypatch.setattr(parallel_list, "list_prefix", huge_listing)
    monkeypatch.setattr(manifest, "read_manifest", huge_manifest)
    return calls


def job(endpoint: str, **options) -> object:
    values = {"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/model/digits",
              "output": f"s3://{BUCKET}/new/out.jsonl", "endpoint_url": endpoint, "input_shape": "3,32,32",
              "precision": "int8", **options}
    return resolve(merge_settings(values, {}))


@pytest.mark.parametrize("options, message", [
    ({"output": f"s3://{BUCKET}/done/out.jsonl"},
     rf"s3://{BUCKET}/done/out\.jsonl \(or its summary\) already exists; add --overwrite to replace it"),
    ({"output": "s3://no-such-output-bucket/out.jsonl"},
     r"cannot write s3://no-such-output-bucket/out\.jsonl: .*NoSuchBucket.*; the job needs an existing bucket"),
    ({"model": f"s3://{BUCKET}/model/nothing"},
     rf"model file missing: s3://{BUCKET}/model/nothing-symbol\.json does not exist"),
    ({"epoch": 7}, rf"model file missing: s3://{BUCKET}/model/digits-0007\.params does not exist"),
    ({"labels": f"s3://{BUCKET}/model/labels.txt"},
     rf"labels file missing: s3://{BUCKET}/model/labels\.txt does not exist"),
    ({"input": None, "input_manifest": "s3://preflight-bucket/keys.txt", "output": f"s3://{BUCKET}/done/out.jsonl"},
     "already exists"),
], ids=["existing-output", "no-output-bucket", "no-symbol", "no-params", "no-labels", "manifest-existing-output"])
def test_a_run_the_cheap_checks_refuse_is_refused_before_any_listing(world, moto_endpoint, listed, options,
                                                                     message):
    with pytest.raises(errors.JobError, match=message):
        driver.run_job(job(moto_endpoint, **options))
    assert listed == []


#: A loopback port nothing listens on (discard): every connection is refused at once.
DOWN_ENDPOINT = "http://127.0.0.1:9"


def test_an_s3_endpoint_that_is_down_is_named_before_any_listing_not_the_permissions(listed):
    with pytest.raises(errors.JobError) as refused:
        driver.run_job(job(DOWN_ENDPOINT, s3_max_attempts=1))
    message = str(refused.value)
    assert f"the S3 endpoint {DOWN_ENDPOINT} cannot be reached" in message and "--endpoint-url" in message
    assert "s3:PutObject" not in message and "existing bucket" not in message
    assert listed == []


def test_an_s3_endpoint_that_is_down_while_the_output_is_looked_for_is_named_not_the_permissions():
    cfg = job(DOWN_ENDPOINT, s3_max_attempts=1)
    client = clients.s3_client(cfg.endpoint_url, cfg.region, max_attempts=1)
    with pytest.raises(errors.JobError) as refused:
        claim.existing_output(cfg, client, work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key))
    message = str(refused.value)
    assert message.startswith(f"cannot write s3://{BUCKET}/new/out.jsonl: the S3 endpoint {DOWN_ENDPOINT} "
                              "cannot be reached")
    assert "s3:PutObject" not in message and "s3:ListBucket" not in message


def test_overwrite_passes_the_existing_output_check_on_to_the_listing(world, moto_endpoint, listed):
    with pytest.raises(errors.JobError, match="cannot list"):
        driver.run_job(job(moto_endpoint, output=f"s3://{BUCKET}/done/out.jsonl", overwrite=True))
    assert listed == ["list_prefix"]
    assert world.get_object(Bucket=BUCKET, Key="done/out.jsonl")["Body"].read() == b"yesterday's results\n"


def test_local_model_files_are_checked_too(tmp_path, logits_prefix):
    spec = resolve(merge_settings({"input": "s3://b/i/", "model": str(logits_prefix), "output": "s3://b/o.jsonl"},
                                  {})).model
    checks.check_model_files(spec)  # present: no error
    with pytest.raises(errors.JobError, match=r"model file missing: .*/nothing-symbol\.json does not exist"):
        checks.check_model_files(type(spec).from_prefix(str(tmp_path / "nothing")))


def test_an_iceberg_tables_home_over_what_the_run_reads_is_refused_once_located(world, moto_endpoint, listed):
    # Any other output is refused by resolve (tests/unit/options/test_config.py); a table's home is known only
    # from its catalog, so the driver asks again once it is.
    cfg = job(moto_endpoint)
    home_in_the_input = replace(cfg, output=IcebergOutput("iceberg://glue/db.preds", BUCKET, "imgs/_mxinfer/preds/"))
    with pytest.raises(errors.JobError, match=r"writes under the input s3://preflight-bucket/imgs/ "):
        driver.claim_output(home_in_the_input, world, retry=False)
    assert listed == []
    assert "Contents" not in world.list_objects_v2(Bucket=BUCKET, Prefix="imgs/_mxinfer/")


def test_a_relative_local_model_labels_and_handler_become_absolute_at_the_edge(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_handler.py").write_text("def output_handler(rows):\n    return rows\n")
    cfg = resolve(merge_settings({"input": "s3://in/", "model": "models/digits", "labels": "models/labels.txt",
                                  "handler": "my_handler.py", "output": "s3://o/p.jsonl"}, {}))
    assert cfg.model.symbol_uri == f"{tmp_path}/models/digits-symbol.json"
    assert cfg.model.labels_uri == f"{tmp_path}/models/labels.txt"
    assert cfg.handler == f"{tmp_path}/my_handler.py"
    kept = resolve(merge_settings({"input": "s3://in/", "model": "s3://m/digits", "labels": "",
                                   "output": "s3://o/p.jsonl"}, {}))
    assert kept.model.symbol_uri == "s3://m/digits-symbol.json" and kept.model.labels_uri == ""


def test_a_resume_of_a_complete_output_ends_before_any_listing_writing_nothing(world, moto_endpoint, listed, caplog):
    before = {o["Key"] for o in world.list_objects_v2(Bucket=BUCKET, Prefix="done/")["Contents"]}
    with caplog.at_level("INFO", logger="mxjob.run.driver"):
        code = driver.run_job(job(moto_endpoint, output=f"s3://{BUCKET}/done/out.jsonl", resume=True))
    assert code == 0 and listed == []
    assert f"s3://{BUCKET}/done/out.jsonl is already complete" in caplog.text and "nothing to resume" in caplog.text
    assert {o["Key"] for o in world.list_objects_v2(Bucket=BUCKET, Prefix="done/")["Contents"]} == before
