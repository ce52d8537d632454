"""The run's records, each declared once in mxjob/reporting/records.py: the summary, the status file and the
dry-run plan.

Here: what the builders make checks against its declaration, and the checker refuses a bad document naming the
field. What real runs write is checked where those runs are: tests/integration/test_report.py's run on
local-cluster (the summary and every status it wrote), tests/integration/test_dataset.py's resumed dataset run (its
summary), tests/unit/outputs/test_dataset.py's dry run (its plan), test_config.py's dry run (its plan),
test_status.py's runs that fail before their plan (their status).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import replace

import pytest

from mxjob.executor.stats import StatsFold, TaskStats
from mxjob.inputs import listing
from mxjob.options import config
from mxjob.outputs import work_prefix
from mxjob.outputs.merge import AssemblyCounts
from mxjob.reporting import record_fields, records, status
from mxjob.reporting.progress import Progress, Tick
from mxjob.reporting.summary import RunOutcome, summarize

BASE = {"input": "s3://in/p/", "model": "s3://m/r", "output": "s3://o/k.jsonl"}
WHERE = {"output": "s3://o/k.jsonl", "summary": "s3://o/k.jsonl.summary.json",
         "report": "s3://o/k.jsonl.report.html", "status": "s3://o/k.jsonl.status.json"}
T0 = 1_700_000_000.0
WORKER = "host/1/7"
#: What the driver adds to the summary after summarize, in its order (scoring.end_run).
DRIVER_FIELDS = {
    "precision": {"precision": "fp32"},
    "batch_size_choice": {"chosen": 64, "requested": 64, "why": "--batch-size 64"},
    "estimate": None,
    "manifest": {"keys_named": 640},
    "files": {**WHERE},
    "dataset": {"files": 2, "rows_per_file": 500, "kept_from_an_earlier_run": 0, "bytes": 1234,
                "first": "p/part-00000.parquet", "last": "p/part-00001.parquet", "rows_per_file_why": "auto"},
    # skipped 0 (every key found was an error row, scored again): keys_listed stays the keys scored
    "existing": {"keys_in_output": 5, "skipped": 0, "rescored_errors": 5, "new_keys": 635, "files_read": 2,
                 "rows_read": 5, "seconds": 0.5},
    "table": {"table": "iceberg://glue/ns.t", "location": "s3://b/wh/ns.db/t", "run": "20261126T101500Z-a1b2c3",
              "files": 2, "rows": 640, "bytes": 4321, "commits": 2, "snapshot_ids": [11, 12], "commit_seconds": 300,
              "rows_per_file": 500, "rows_per_file_why": "auto", "error_rows_replaced": 0,
              "resumed": {"run": "20261126T101500Z-a1b2c3", "files_committed_before": 1,
                          "files_committed_on_resume": 1, "keys_in_its_files": 320}},
    "lease": {"key": "s3://o/k.jsonl.lease.json", "run_id": "a1b2c3d4e5f6", "lease_seconds": 300.0, "requests": 7,
              "seconds": 0.042, "renewals": 2},
}
SPARK = {"version": "3.5.7", "python": "3.9.20", "master": "yarn", "deploy_mode": "cluster",
         "application_id": "application_1_0001",
         "executor_container": {"limit_mib": 3456, "memory_mib": 2048, "memory_overhead_mib": 1024,
                                "pyspark_memory_mib": 384, "python_worker_peak_rss_mib": 612.5,
                                "python_worker_peak_share_of_limit": 0.177},
         "yarn_attempt": 1}
DRIVER_SECONDS = {"listing": 0.4, "model_check": 1.3, "plan": 0.3, "spark": 8.7, "assembly": 0.03,
                  "assembly_cpu": 0.2, "output_close": 0.02, "output_after_last_task": 0.08}


def task(n: int) -> TaskStats:
    """Worker 7's task ``n``: 64 keys, one of them failed to decode, every stage timed."""
    return TaskStats(partition=n, executor="host/1", worker_pid=7, attempt=0, keys=64,
                     errors={"download": 0, "decode": 1, "predict": 0},
                     seconds={"download": 1.0, "decode": 0.5, "forward": 2.0, "wait": 0.1, "write": 0.1, "task": 1.0,
                              "cpu": 1.5, "download_cpu": 0.1, "decode_cpu": 0.3, "task_thread_cpu": 0.2},
                     s3_retries={"request": 1, "body": 0}, model_loads=1, started=T0 + n, ended=T0 + n + 0.9,
                     threads=2, worker_task=n, memory={"rss": 500 + n, "max_rss": 600}, host={"cores": 2, "workers": 2})


def summary_of(**driver_fields) -> dict:
    """A summary as summarize makes it from ten tasks, with ``driver_fields`` given to it, as JSON reads it back."""
    cfg = replace(config.resolve(config.merge_settings({**BASE, "batch_size": 64}, {})), batch_size=64)
    keys = listing.Listing.build("b", [f"p/{i:04d}.png" for i in range(640)])
    made = summarize(cfg, RunOutcome(
        images=640, batches=10, fold=StatsFold.of(task(n) for n in range(1, 11)),
        counts=AssemblyCounts(predicted=630, failed=10, parts_read=10, bytes_read=4096), elapsed=12.5,
        model_summary={"num_classes": 10}, seconds=dict(DRIVER_SECONDS),
        workload=work_prefix.Workload(runs=[], todo=keys, number=1, resumed=False), fingerprint={"task": "classify"},
        spark=copy.deepcopy(SPARK), skipped_keys={"count": 1, "why": "not ending in .png", "examples": ["p/x.txt"]},
        **copy.deepcopy(driver_fields)))
    return json.loads(json.dumps(made))


@pytest.fixture(scope="module")
def summary_doc() -> dict:
    return summary_of(**DRIVER_FIELDS)


def status_doc(**kwargs) -> dict:
    p = Progress(now=T0 + 10, batches_done=3, batches_total=10, keys_done=192, keys_total=640, failed=2,
                 first_start=T0 + 1)
    tick = Tick(time=T0 + 10, batches=3, keys=192, failed=2, recent_rate=19.2, eta_seconds=40.0,
                predicted_end=T0 + 50)
    args = {"state": "running", "p": p, "tick": tick, "run": status.RunFacts(T0, WHERE, "x --resume"),
            "stage": "scoring", **kwargs}
    return json.loads(json.dumps(status.status_document(**args)))


def test_the_summary_summarize_makes_is_valid_and_in_the_declared_order(summary_doc):
    made = record_fields.from_json(records.Summary, summary_doc)
    assert list(summary_doc) == [f.name for f in dataclasses.fields(records.Summary)]
    assert made.python_workers[WORKER].first_task.cpu == 1.5 and made.spark.executor_container.limit_mib == 3456
    assert record_fields.to_json(made) == summary_doc  # read and written back: the same document


def test_fields_the_driver_adds_after_summarize_give_the_bytes_summarize_gives_them():
    """The driver still sets precision ... dataset on summarize's dict; passed to summarize, the JSON is the same."""
    added = summary_of()
    assert not set(DRIVER_FIELDS) & set(added)
    added.update(copy.deepcopy(DRIVER_FIELDS))
    made = summary_of(**DRIVER_FIELDS)
    for doc in (added, made):
        doc.pop("driver_max_rss_bytes")  # the peak of this process, which grows between the two calls
    assert json.dumps(added, indent=2) == json.dumps(made, indent=2)


@pytest.mark.parametrize(("change", "match"), [
    (lambda d: d["tasks"].pop("seconds"), r"summary: required field 'tasks\.seconds' is missing"),
    (lambda d: d.pop("files"), r"summary: required field 'files' is missing"),
    (lambda d: d["python_workers"][WORKER]["first_task"].update(cpu="1.5"),
     r"summary: field 'python_workers\.host/1/7\.first_task\.cpu' must be a number, got '1\.5' \(str\)"),
    (lambda d: d.update(keys_listed=True), r"field 'keys_listed' must be an integer, got True \(bool\)"),
    (lambda d: d.update(batches=10.0), r"field 'batches' must be an integer, got 10\.0"),
    (lambda d: d.update(elapsed_seconds=None), r"field 'elapsed_seconds' must be a number, got None"),
    (lambda d: d["threads"].update(warnings=[3]), r"field 'threads\.warnings\[0\]' must be a string"),
    (lambda d: d["spark"].update(yarn_attempt="1"), r"field 'spark\.yarn_attempt' must be an integer"),
    (lambda d: d["seconds"].update(gpu=1.0), r"summary: unknown field 'seconds\.gpu'"),
    (lambda d: d.update(images=640), r"summary: unknown field 'images'"),
])
def test_a_bad_summary_is_refused_naming_the_field(summary_doc, change, match):
    doc = copy.deepcopy(summary_doc)
    change(doc)
    with pytest.raises(ValueError, match=match):
        record_fields.from_json(records.Summary, doc)


def test_optional_fields_may_be_left_out_and_nullable_ones_may_be_null(summary_doc):
    doc = copy.deepcopy(summary_doc)
    for name in ("manifest", "dataset"):  # written with --input-manifest, for a dataset
        doc.pop(name)
    doc["seconds"].pop("spark")  # no Spark job
    doc["python_workers"][WORKER].pop("max_rss_bytes")
    doc.update(skipped_keys=None, spark=None, estimate=None, images_per_second=None)
    assert record_fields.to_json(record_fields.from_json(records.Summary, doc)) == doc


def test_the_status_status_document_makes_is_valid_and_a_bad_one_is_refused():
    for doc in (status_doc(), status_doc(state="failed", end=status.RunEnd(1, "boom", 3)),
                status_doc(p=None, tick=None, stage="listing")):
        assert record_fields.to_json(record_fields.from_json(records.Status, doc)) == doc
    assert "batches" not in status_doc(p=None, tick=None)  # before the first tick: no counts at all
    assert status_doc(state="succeeded")["eta_seconds"] is None  # there, and null
    bad = [({**status_doc(), "state": "done"}, r"status: field 'state' must be one of running, succeeded"),
           ({**status_doc(), "stage": "lunch"}, r"status: field 'stage' must be one of starting, listing"),
           ({k: v for k, v in status_doc().items() if k != "status"}, r"required field 'status' is missing"),
           ({**status_doc(), "errors": None}, r"field 'errors' must be an integer, got None"),
           ({**status_doc(), "batches": {"done": 1}}, r"required field 'batches\.total' is missing"),
           ({**status_doc(), "eta": 3.0}, r"status: unknown field 'eta'"),
           ([status_doc()], r"status: field '\(the document\)' must be an object")]
    for doc, match in bad:
        with pytest.raises(ValueError, match=match):
            record_fields.from_json(records.Status, doc)


def test_a_bad_plan_is_refused_naming_the_field():
    workload = {"input": "s3://in/p/", "output": None, "output_format": "jsonl", "output_writable": None, "images": 5,
            "to_score": 5, "batch_size": 2, "batch_size_choice": {}, "batches": 3, "partitions": 3,
            "plan_bytes": 24, "first_key": "p/0.png", "last_key": "p/4.png", "model": {}, "sample": {"key": "p/0.png"},
            "sample_seconds": {"task": 0.2}, "estimate": None}
    assert record_fields.to_json(record_fields.from_json(records.Plan, workload)) == workload
    with pytest.raises(ValueError, match=r"plan: required field 'dataset\.files_kept' is missing"):
        record_fields.from_json(records.Plan, {**workload, "dataset": {"rows_per_file": 2, "why": "w", "files": 3}})
    with pytest.raises(ValueError, match=r"plan: field 'sample_seconds\.task' must be a number, got '0\.2'"):
        record_fields.from_json(records.Plan, {**workload, "sample_seconds": {"task": "0.2"}})


def test_a_field_left_out_is_not_written_and_none_is_written_as_null():
    assert record_fields.to_json(records.Done(done=3)) == {"done": 3}
    assert record_fields.to_json(records.TimesIso(started=None, ended="x")) == {"started": None, "ended": "x"}


def test_the_summarys_task_seconds_are_the_stats_stages_in_their_order():
    assert [name for name, _ in records.TASK_SECONDS] == list(StatsFold.STAGES)
    assert list(records.Summary.__dataclass_fields__["seconds"].type.__dataclass_fields__)[:10] == \
        list(StatsFold.STAGES)


@pytest.mark.parametrize("record", [records.Summary, records.Status, records.Plan])
def test_every_field_has_a_meaning_and_every_choice_is_named_in_it(record):
    rows = record_fields.field_rows(record)
    assert all(doc.strip() for _, _, _, doc in rows)
    assert len({name for name, _, _, _ in rows}) == len(rows)
    for f in dataclasses.fields(record):
        for value in f.metadata.get("choices", ()):
            assert f"`{value}`" in f.metadata["doc"], (f.name, value)
