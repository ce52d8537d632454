"""The model's check in an executor's warm-up: the driver's facts and failures, word for word, and the sample's cost.

Under spark-submit the executors load the model early (mxjob.run.spark_start); one
of them checks it and measures the estimate's sample (warm_and_check), so the
driver never imports MXNet. Here the executor's side runs in this process, as
a warm-up task would run it, against the driver's own check of the same model.
tests/integration/test_job.py runs it through Spark.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from dataclasses import replace

import pytest

from mxjob.core import state
from mxjob.core.errors import JobError
from mxjob.executor import measure, model_check
from mxjob.executor.measure import SampleCost
from mxjob.executor.model_check import ModelFacts, WarmReport, warm_and_check
from mxjob.executor.partition import job_task
from mxjob.options import config
from mxjob.outputs import fingerprint
from mxjob.planning import estimate
from mxjob.planning.sizing import bound_batch
from mxjob.run import checks, driver, warm_up
from tests.support.helpers import bucket_with_model

BUCKET = "model-check"


@pytest.fixture
def fresh_state(monkeypatch):
    """A worker's state of its own; the threads' variables a first load sets in the environment are put back."""
    monkeypatch.setattr(state, "models", state.ProcessCache("models", state.MAX_MODELS))
    monkeypatch.setattr(state, "counters", state.Counters())
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def digits(moto_endpoint, demo_dir):
    """The demo model under s3://model-check/model/, and 8 of its digits under imgs/: ``(client, keys)``."""
    s3 = bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")
    keys = []
    for path in sorted((demo_dir / "images").rglob("*.png"))[:8]:
        s3.put_object(Bucket=BUCKET, Key=f"imgs/{path.name}", Body=path.read_bytes())
        keys.append((f"imgs/{path.name}", path.stat().st_size))
    return s3, keys


def job_config(moto_endpoint, model="model/digits", **changes):
    cfg = config.resolve(config.merge_settings(
        {"input": f"s3://{BUCKET}/imgs/", "model": f"s3://{BUCKET}/{model}", "output": f"s3://{BUCKET}/o.jsonl",
         "endpoint_url": moto_endpoint, "input_shape": "3,32,32", "std": "255", **changes}, {}))
    return replace(cfg, input_bucket=BUCKET)


@pytest.fixture
def passes(monkeypatch) -> list:
    """The items of each ``score_partition`` pass that ``mxjob.executor.measure`` runs, in order (the passes still
    run)."""
    seen: list = []
    score = measure.score_partition
    monkeypatch.setattr(measure, "score_partition", lambda index, items, job: seen.append(list(items)) or
                        score(index, items, job))
    return seen


def executor_job(cfg):
    """The ``JobSpec`` the warm-up ships (mxjob.run.warm_up.warm_up): bound at the micro-batch."""
    return replace(cfg, batch_size=bound_batch(cfg)).job_spec()


def test_the_checking_task_reports_what_the_drivers_own_check_reads(moto_endpoint, digits, fresh_state):
    _, keys = digits
    cfg = job_config(moto_endpoint)
    report = warm_and_check(0, 1, executor_job(cfg), sample=keys[:4], endpoint_url=moto_endpoint, check=True)
    local = checks.load_model_on_driver(cfg)
    assert report.failure is None and report.facts == ModelFacts.of(local)
    assert (report.facts.kind, report.facts.num_classes) == ("Classifier", 10)
    assert report.facts.model_summary() == local.model_summary()
    # What the run records from the model is the same from the executor's facts as from the driver's model.
    assert fingerprint.job_fingerprint(cfg, report.facts) == fingerprint.job_fingerprint(cfg, local)
    assert report.cost.images == report.cost.scored == 4 and report.cost.cpu_seconds_per_image > 0
    assert report.cost.model_load_seconds > 0
    # The sample is no task of the worker's: the run's first task is still its first (the ETA waits for those).
    assert state.counters.tasks_run == 0
    # It comes back through Spark's collect: picklable, and a few kB.
    assert pickle.loads(pickle.dumps(report)) == report and len(pickle.dumps(report)) < 16_000


def test_an_embedders_facts_give_the_same_table_schema_as_the_model(moto_endpoint, digits, fresh_state):
    cfg = job_config(moto_endpoint, task="embed")
    job = executor_job(cfg)
    report = warm_and_check(0, 2, job, check=True)
    local = checks.load_model_on_driver(cfg)
    assert report.facts.dimension == local.dimension and report.facts.output_layer == local.output_layer
    assert report.facts.num_classes is None and report.cost is None  # no sample asked for: nothing measured
    assert job_task(job).result_schema(job, report.facts) == job_task(job).result_schema(job, local)


def test_each_task_measures_its_share_of_the_sample_and_only_the_first_checks_the_model(moto_endpoint, digits,
                                                                                       fresh_state):
    _, keys = digits
    job = executor_job(job_config(moto_endpoint, micro_batch_size=2))  # 8 keys: two shares of two micro-batches
    second = warm_and_check(1, 3, job, sample=keys, endpoint_url=moto_endpoint, check=True)
    assert second.facts is None and second.failure is None and second.loads == 1
    # Every second key from the second (the first task's are the others): its first micro-batch builds the
    # kernels, untimed, the second is timed.
    assert (second.cost.images, second.cost.timed) == (2, 2)
    third = warm_and_check(2, 3, job, sample=keys[:2], endpoint_url=moto_endpoint, check=True)
    assert third.cost is None  # a 2-key sample is one micro-batch: the first task's alone
    plain = warm_and_check(1, 3, job, sample=keys, endpoint_url=moto_endpoint)
    assert plain == WarmReport(1, 1)  # not asked to check: it only loads (the model was cached already)


def test_a_worker_of_two_lanes_builds_each_lanes_kernels_on_a_micro_batch_of_its_own_before_it_times(
        moto_endpoint, digits, fresh_state, passes):
    """One micro-batch of the share on each lane at once, untimed: the second lane's first pass, which builds its
    kernels, no longer falls in the timed pass, and no lane idles while the other warms up."""
    _, keys = digits
    # What configure_threads leaves in a worker of two forward lanes (one executor on two vCPUs).
    state.counters.threads_set, state.counters.threads, state.counters.lanes = True, 2, 2
    job = executor_job(job_config(moto_endpoint, micro_batch_size=2))
    report = warm_and_check(0, 1, job, sample=keys, endpoint_url=moto_endpoint, check=True)  # 8 keys, one task
    assert passes == [keys[:4], keys[4:]]  # two micro-batches, one a lane, then the other two, timed
    assert (report.cost.images, report.cost.timed, report.cost.scored) == (4, 4, 4)
    assert report.loads == 1  # lane 1 bound lane 0's model again
    # Fewer lanes' worth when a micro-batch each would leave less to time; one image when even one would.
    assert [measure.warm_images(n, 16, 2) for n in (64, 48, 16)] == [32, 16, 1]
    assert measure.warm_images(64, 16, 1) == 16 and measure.warm_images(64, 1, 2) == 1


def test_a_sample_smaller_than_a_micro_batch_is_timed_as_one_whole_forward_pass_by_one_task(
        moto_endpoint, digits, fresh_state, passes):
    """A share shorter than the bound batch would cost a whole forward pass for its few images (the estimate of a
    128-image run came out 3 times the run's CPU per image): it is repeated up to a whole micro-batch instead."""
    _, keys = digits
    job = executor_job(job_config(moto_endpoint, micro_batch_size=16))
    first = warm_and_check(0, 2, job, sample=keys[:6], endpoint_url=moto_endpoint, check=True)
    assert passes == [keys[:1], [keys[i % 6] for i in range(16)]]  # the load's image, then one whole pass, in turn
    assert (first.cost.images, first.cost.timed, first.cost.scored) == (6, 16, 6)
    assert first.facts is not None
    # The second task leaves the sample to the first: it loads the model and scores nothing.
    second = warm_and_check(1, 2, job, sample=keys[:6], endpoint_url=moto_endpoint, check=True)
    assert second.cost is None and second.failure is None and len(passes) == 2
    assert measure.combined([first.cost, second.cost]).timed_images == 16


def test_whole_micro_batches_repeat_the_sample_in_turn_and_the_measurers_take_one_micro_batch_each():
    assert measure.whole_micro_batches(["a", "b", "c"], 4) == ["a", "b", "c", "a"]
    assert measure.whole_micro_batches(["a", "b", "c", "d", "e"], 2) == ["a", "b", "c", "d", "e", "a"]
    assert measure.whole_micro_batches(["a", "b"], 2) == ["a", "b"]
    assert measure.whole_micro_batches(["a", "b"], 1) == ["a", "b"]
    assert measure.whole_micro_batches([], 16) == []
    # The default sample (32) and micro-batch (16): two shares; a 128-image run's 8: one; never more than tasks.
    # One measuring task per two micro-batches (one to build its kernels, one timed), at most one per task.
    assert [model_check.measurers(n, tasks, 16) for n, tasks in ((64, 2), (8, 2), (64, 100), (33, 8), (0, 2))] == \
        [2, 1, 2, 2, 0]
    assert model_check.measurers(40, 8, 1) == 8


def test_shares_measured_at_once_combine_into_one_sample_counting_the_servers_cpu_once():
    first = SampleCost(images=4, scored=4, cpu_seconds_per_image=0.05, s3_server_cpu_seconds_per_image=0.01,
                       model_load_seconds=0.4, mxnet_import_seconds=1.1, server_cpu_window=(10.0, 10.04))
    second = SampleCost(images=4, scored=3, cpu_seconds_per_image=0.06, s3_server_cpu_seconds_per_image=0.015,
                        model_load_seconds=0.6, mxnet_import_seconds=None, server_cpu_window=(10.01, 10.07))
    both = measure.combined([first, None, second])
    # Own CPU: 4 x 0.04 + 4 x 0.045 = 0.34 s; the server's over the common window 10.00-10.07: 0.07 s, once.
    assert (both.images, both.scored) == (8, 7)
    assert both.s3_server_cpu_seconds_per_image == pytest.approx(0.07 / 8)
    assert both.cpu_seconds_per_image == pytest.approx((0.34 + 0.07) / 8)
    assert (both.model_load_seconds, both.mxnet_import_seconds) == (0.6, 1.1)  # the slowest executor's start
    alone = measure.combined([first])
    assert (alone.images, alone.scored, alone.server_cpu_window) == (4, 4, (10.0, 10.04))
    assert alone.cpu_seconds_per_image == pytest.approx(0.05)
    assert alone.s3_server_cpu_seconds_per_image == pytest.approx(0.01)
    assert measure.combined([None]) is None
    # Against real S3 there is no server to count: the shares' own CPU only.
    real = [replace(c, s3_server_cpu_seconds_per_image=0.0, server_cpu_window=None) for c in (first, second)]
    assert measure.combined(real).cpu_seconds_per_image == pytest.approx((4 * 0.05 + 4 * 0.06) / 8)
    # A share timed on its images repeated weighs as the images its pass scored.
    repeated = measure.combined([real[0], replace(real[1], timed=12)])
    assert (repeated.images, repeated.timed_images) == (8, 16)
    assert repeated.cpu_seconds_per_image == pytest.approx((4 * 0.05 + 12 * 0.06) / 16)


def test_a_model_the_driver_refuses_is_refused_by_the_executors_check_in_the_same_words(moto_endpoint, digits,
                                                                                        fresh_state):
    s3, _ = digits
    s3.put_object(Bucket=BUCKET, Key="bad/synset.txt", Body=b"zero\none\ntwo\n")
    for name in ("digits-symbol.json", "digits-0000.params"):
        s3.copy_object(Bucket=BUCKET, Key=f"bad/{name}", CopySource={"Bucket": BUCKET, "Key": f"model/{name}"})
    cfg = job_config(moto_endpoint, model="bad/digits")
    with pytest.raises(JobError) as refused:
        checks.load_model_on_driver(cfg)
    report = warm_and_check(0, 2, executor_job(cfg), check=True)
    assert report.facts is None and report.cost is None
    assert report.failure == str(refused.value)
    # The other tasks report it too rather than fail: Spark would retry them, printing errors and stacks.
    assert warm_and_check(1, 2, executor_job(cfg), check=True).failure == report.failure
    assert report.failure.startswith("model: labels file s3://model-check/bad/synset.txt has 3 lines but the model "
                                     "has 10 classes")


@pytest.mark.parametrize(("exc", "line"), [
    (FileNotFoundError("s3://b/m-0000.params does not exist"), "model file missing: s3://b/m-0000.params does not "
                                                               "exist"),
    (model_check.ModelError("input shape (3, 8, 8) does not fit"), "model: input shape (3, 8, 8) does not fit"),
    (ValueError("unexpected end of JSON\nat line 3"), "cannot load the model (s3://b/m-symbol.json): unexpected end "
                                                      "of JSON"),
])
def test_a_loads_failure_reads_the_same_wherever_it_happened(exc, line):
    assert model_check.load_failure(exc, "s3://b/m-symbol.json") == line


class Reported:
    """A started Spark whose warm-up has ended with ``reports`` (``None``: it failed, for no reason YARN gave)."""

    def __init__(self, reports):
        self.reports = reports
        self.failure = None

    def wait_reports(self):
        return self.reports


def facts_and_cost(moto_endpoint, digits):
    _, keys = digits
    report = warm_and_check(0, 1, executor_job(job_config(moto_endpoint)), sample=keys[:2], endpoint_url=moto_endpoint,
                            check=True)
    state.models.clear()
    return report


def test_the_driver_takes_the_executors_report_and_loads_no_model(moto_endpoint, digits, fresh_state, monkeypatch,
                                                                  caplog):
    s3, keys = digits
    report = facts_and_cost(moto_endpoint, digits)

    def refused(cfg):
        raise AssertionError("the driver loaded the model")

    monkeypatch.setattr(checks, "load_model_on_driver", refused)
    cfg = job_config(moto_endpoint)
    with caplog.at_level(logging.INFO, logger="mxjob.run"):
        _, checked = checks.check_on_driver(cfg, s3, keys, Reported([WarmReport(1, 1), report]))
    assert checked.classifier is None and checked.sample_cost == measure.combined([report.cost])
    assert checked.model_summary == report.facts.summary
    assert checked.fingerprint == fingerprint.job_fingerprint(cfg, report.facts)
    assert "an executor checked the model and measured the estimate's sample on 2 images" in caplog.text
    # Where the checking task's warm-up went, in the words of the split it reported.
    assert warm_up.split_words(report.seconds) in caplog.text and "MXNet's import" in caplog.text


def test_a_measuring_warm_up_reports_where_its_seconds_went_and_the_others_report_none(moto_endpoint, digits,
                                                                                       fresh_state, passes):
    _, keys = digits
    job = executor_job(job_config(moto_endpoint, micro_batch_size=2))
    started = time.perf_counter()
    report = warm_and_check(0, 1, job, sample=keys, endpoint_url=moto_endpoint, check=True)
    wall = time.perf_counter() - started
    assert list(report.seconds) == ["mxnet_import", "model_load", "first_pass", "sample"]
    assert all(seconds >= 0 for seconds in report.seconds.values())
    assert report.seconds["first_pass"] > 0 and report.seconds["sample"] > 0  # two passes ran: both timed
    assert sum(report.seconds.values()) <= wall + 0.01  # parts of the task's own time, none counted twice
    assert report.seconds["first_pass"] == round(report.cost.first[1].seconds["task"], 3)
    # A task that measured nothing (no sample asked for, or not a measurer) has no split to report.
    assert warm_and_check(0, 1, job, check=True).seconds is None
    assert warm_and_check(0, 1, job).seconds is None


def test_the_driver_refuses_the_run_with_the_executors_failure(moto_endpoint, digits, monkeypatch):
    s3, keys = digits
    monkeypatch.setattr(checks, "load_model_on_driver", lambda cfg: pytest.fail("the driver loaded the model"))
    failed = WarmReport(0, 0, failure="model: labels file s3://x/synset.txt has 3 lines but the model has 10 classes")
    with pytest.raises(JobError, match=r"^model: labels file s3://x/synset\.txt has 3 lines"):
        checks.check_on_driver(job_config(moto_endpoint), s3, keys, Reported([failed]))


def test_a_failure_on_any_executor_refuses_the_run(moto_endpoint, digits, fresh_state, monkeypatch):
    s3, keys = digits
    report = facts_and_cost(moto_endpoint, digits)
    failed = WarmReport(1, 0, failure="cannot load the model (s3://x/m-symbol.json): Connect timeout")
    with pytest.raises(JobError, match=r"^cannot load the model \(s3://x/m-symbol\.json\): Connect timeout$"):
        checks.check_on_driver(job_config(moto_endpoint), s3, keys, Reported([report, failed]))


def test_a_warm_up_that_could_not_tell_leaves_the_check_to_the_driver(moto_endpoint, digits, fresh_state, caplog):
    s3, keys = digits
    with caplog.at_level(logging.INFO, logger="mxjob.run"):
        _, checked = checks.check_on_driver(job_config(moto_endpoint), s3, keys, Reported(None))
    assert checked.classifier is not None and checked.sample_cost is None
    assert state.counters.model_loads == 1
    assert "the executors did not check the model; the driver checks it" in caplog.text


def test_the_estimate_counts_the_measuring_processs_mxnet_import(moto_endpoint, digits, fresh_state):
    # The driver imports no MXNet when an executor measured: the sample's cost carries that executor's import.
    cost = SampleCost(images=4, scored=4, cpu_seconds_per_image=0.01, s3_server_cpu_seconds_per_image=0.0,
                      model_load_seconds=0.5, mxnet_import_seconds=7.0)
    cfg = job_config(moto_endpoint, estimate_cluster="2x1")
    _, keys = digits
    _, sized = driver.size_run(cfg, keys, len(keys), measured=cost)
    slow = sized.estimate["start_seconds"]
    _, sized = driver.size_run(cfg, keys, len(keys), measured=replace(cost, mxnet_import_seconds=1.0))
    assert slow - sized.estimate["start_seconds"] == pytest.approx(6.0)
    assert state.counters.model_loads == 0  # measured elsewhere: nothing scored here


def test_a_sample_the_executors_measured_leaves_only_the_jobs_own_start_in_the_estimate(moto_endpoint, digits,
                                                                                       fresh_state):
    # They measured it once warm: the run's first batch waits for no JVM, import or load any more, only for its
    # job's submission and first task's launch, about a task's overhead.
    cost = SampleCost(images=4, scored=4, cpu_seconds_per_image=0.01, s3_server_cpu_seconds_per_image=0.0,
                      model_load_seconds=0.5, mxnet_import_seconds=1.0)
    _, keys = digits
    cfg = job_config(moto_endpoint)
    _, warm = driver.size_run(cfg, keys, len(keys), {"spark.master": "local-cluster[2,1,1024]"}, measured=cost)
    assert warm.estimate["start_seconds"] == pytest.approx(estimate.TASK_OVERHEAD_SECONDS)
    # Another cluster's estimate (--estimate-cluster) still starts cold.
    _, other = driver.size_run(replace(cfg, estimate_cluster="2x1"), keys, len(keys), measured=cost)
    assert other.estimate["start_seconds"] >= 1.5


def test_the_fingerprint_takes_the_model_files_digests_from_the_load_and_reads_no_file(moto_endpoint, digits,
                                                                                      fresh_state, monkeypatch):
    from types import SimpleNamespace

    from mxjob.model.predictor import ModelSpec

    cfg = job_config(moto_endpoint)
    facts = warm_and_check(0, 1, executor_job(cfg), check=True).facts
    assert set(facts.file_digests) == {cfg.model.symbol_uri, cfg.model.params_uri}
    read_from_s3 = fingerprint.job_fingerprint(cfg, SimpleNamespace(labels=facts.labels))  # no digests: it reads them
    reads = []
    original = ModelSpec.read
    monkeypatch.setattr(ModelSpec, "read", lambda self, uri: reads.append(uri) or original(self, uri))
    assert fingerprint.job_fingerprint(cfg, facts) == read_from_s3
    assert reads == []  # neither the symbol nor the parameters downloaded again for it
