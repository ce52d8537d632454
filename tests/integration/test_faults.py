"""Nothing lost, nothing leaked: bad objects, S3 faults, lost workers, unloadable models, secrets.

The first part scores one partition in-process (``mxinfer.score_partition``,
the executors' own code) against the moto server behind the fault proxy; the
second part runs the whole job through spark-submit on local-cluster.
"""

from __future__ import annotations

import io
import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import botocore.exceptions
import numpy as np
import psutil
import pyspark
import pytest
from PIL import Image

import mxinfer
from demo import make_demo
from demo.run_local import spark_env, spark_submit_command
from mxjob.executor import partition
from mxjob.inputs import listing
from mxjob.outputs import work_prefix
from mxjob.s3 import access, clients, parallel_list
from tests.support import event_logs
from tests.support.fault_proxy import FaultProxy, Faults
from tests.support.helpers import (
    MASTER,
    ROOT,
    bucket_with_model,
    encode,
    make_s3_client,
    part_lines,
    scored_lines,
    spark_submit,
)
from tests.unit.model.test_decode import png_declaring

BUCKET = "fault-bucket"


def digit(i: int) -> Image.Image:
    (_, _), (test_x, _) = make_demo.digits_split()
    return Image.open(io.BytesIO(make_demo.digit_png(test_x[i]))).convert("RGB")


@pytest.fixture(scope="module")
def bucket(moto_endpoint, demo_dir):
    return bucket_with_model(moto_endpoint, BUCKET, demo_dir / "model")


def job_spec(endpoint: str, demo_dir: Path, **changes) -> mxinfer.JobSpec:
    model = mxinfer.ModelSpec.from_prefix(str(demo_dir / "model" / "digits"))
    settings = {"model": model, "preprocess": make_demo.PREPROCESS, "bucket": BUCKET, "batch_size": 4,
                "top_k": 3, "endpoint_url": endpoint, "io_threads": 4, "max_object_bytes": 200_000}
    settings.update(changes)
    return mxinfer.JobSpec(**settings)


def run_partition(job: mxinfer.JobSpec, items) -> tuple[dict, dict]:
    [(_, count, blob, stats)] = mxinfer.score_partition(0, items, job)
    rows = [json.loads(line) for line in part_lines(blob)] if count else []
    return {row["key"]: row for row in rows}, stats


# --- 1. Bad objects become error lines, never crashes or gaps


def bad_and_good_objects() -> dict[str, bytes]:
    anim = io.BytesIO()
    frames = [digit(3), Image.new("RGB", (48, 48), (255, 0, 0))]
    frames[0].save(anim, format="GIF", save_all=True, append_images=frames[1:])
    jpeg = encode(digit(5), "JPEG", quality=95)
    png = encode(digit(6), "PNG")
    noise = Image.fromarray(np.random.RandomState(0).randint(0, 255, (400, 400, 3), dtype=np.uint8))
    return {
        "cases/good-1.jpg": encode(digit(1), "JPEG", quality=95),
        "cases/good-2.png": encode(digit(2), "PNG"),
        "cases/anim.gif": anim.getvalue(),
        "cases/grey16.png": encode(Image.fromarray(np.asarray(digit(4).convert("L"), np.uint16) * 257), "PNG"),
        "cases/cmyk.jpg": encode(digit(7).convert("CMYK"), "JPEG", quality=95),
        "cases/empty.jpg": b"",
        "cases/html.jpg": b"<html><body>Not Found</body></html>",
        "cases/trunc.jpg": jpeg[: len(jpeg) * 2 // 3],
        "cases/trunc.png": png[: len(png) * 2 // 3],
        "cases/bomb.png": png_declaring(30000, 30000),
        "cases/huge.png": encode(noise, "PNG"),  # ~480 KB, over max_object_bytes=200000
        "cases/deleted.jpg": encode(digit(8), "JPEG"),
        "cases/denied.jpg": encode(digit(9), "JPEG"),
        "cases/archived.jpg": encode(digit(10), "JPEG"),
    }


EXPECTED_ERRORS = {
    "cases/empty.jpg": ("decode", "ValueError", "empty object"),
    "cases/html.jpg": ("decode", "UnidentifiedImageError", "cannot identify image"),
    "cases/trunc.jpg": ("decode", "OSError", "truncated"),
    "cases/trunc.png": ("decode", "OSError", "truncated"),
    "cases/bomb.png": ("decode", "ImageTooLargeError", "over --max-image-pixels 64,000,000"),
    "cases/huge.png": ("download", "ObjectTooLargeError", "over max_object_bytes=200000"),
    "cases/deleted.jpg": ("download", "NoSuchKey", "NoSuchKey"),
    "cases/denied.jpg": ("download", "AccessDenied", "Access Denied"),
    "cases/archived.jpg": ("download", "InvalidObjectState", "InvalidObjectState"),
}


def test_every_bad_object_is_one_error_line_and_its_batch_mates_are_unharmed(bucket, moto_endpoint, demo_dir):
    objects = bad_and_good_objects()
    for key, body in objects.items():
        extra = {"StorageClass": "GLACIER"} if key.endswith("archived.jpg") else {}
        bucket.put_object(Bucket=BUCKET, Key=key, Body=body, **extra)
    deny = lambda method, path: "denied.jpg" in path  # noqa: E731
    with FaultProxy(moto_endpoint, deny=deny) as proxy:
        job = job_spec(proxy.endpoint, demo_dir)
        client = clients.s3_client(proxy.endpoint)
        items = sorted(parallel_list.list_objects(client, BUCKET, "cases/"))
        bucket.delete_object(Bucket=BUCKET, Key="cases/deleted.jpg")  # gone between listing and reading
        rows, stats = run_partition(job, items)
    assert sorted(rows) == sorted(objects)  # one line per listed key, none lost
    for key, (stage, kind, text) in EXPECTED_ERRORS.items():
        error = rows[key]["error"]
        assert "predictions" not in rows[key]
        assert error["stage"] == stage, (key, error)
        assert kind in error["type"] and text in error["message"], (key, error)
    assert stats.errors == {"download": 4, "decode": 5, "predict": 0}
    # The good images share batches with the bad ones yet get what they get alone.
    classifier = mxinfer.get_classifier(job.model, make_demo.INPUT_SHAPE, job.batch_size)
    for key in ("cases/good-1.jpg", "cases/good-2.png", "cases/anim.gif", "cases/grey16.png", "cases/cmyk.jpg"):
        alone = mxinfer.decode_image(objects[key], make_demo.PREPROCESS)
        [line] = scored_lines(classifier, [key], [alone], top_k=3)
        assert rows[key] == json.loads(line), key


def test_a_task_splits_its_cpu_into_gets_decoding_its_own_thread_and_the_rest(bucket, demo_dir, moto_endpoint):
    keys = [f"cpu/{i}.jpg" for i in range(12)]
    for i, key in enumerate(keys):
        bucket.put_object(Bucket=BUCKET, Key=key, Body=encode(digit(i).resize((400, 300)), "JPEG", quality=90))
    _, stats = run_partition(job_spec(moto_endpoint, demo_dir), [(key, -1) for key in keys])
    seconds = stats.seconds
    parts = [seconds[k] for k in ("download_cpu", "decode_cpu", "task_thread_cpu")]
    assert all(part > 0 for part in parts), seconds
    # Thread CPU of the pool's threads and of the task's own: parts of the process's CPU in the task, not more.
    assert sum(parts) <= seconds["cpu"] + 0.002, seconds
    # The download threads' wall clock holds their CPU.
    assert seconds["download_cpu"] <= seconds["download"] + 0.002 and seconds["decode_cpu"] <= seconds["decode"] + 0.002


def test_a_task_reads_its_keys_and_sizes_from_the_runs_plan_and_writes_its_part(bucket, demo_dir, moto_endpoint):
    keys = [f"plan/{name}.png" for name in ("a", "b", "c", "d", "é")]
    for i, key in enumerate(keys):
        bucket.put_object(Bucket=BUCKET, Key=key, Body=encode(digit(i), "PNG"))
    # The plan says c.png is over max_object_bytes: the task goes by the plan's size, not the object's.
    images = listing.Listing.build(BUCKET, keys, [100, 100, 10**9, 100, 100])
    work = work_prefix.WorkPrefix(bucket, BUCKET, "plan-out/out.jsonl")
    run = work.start_run(1, images, 2, None)
    assert run.batches == 3 and len(run.spans) == 3
    job = job_spec(moto_endpoint, demo_dir, output_bucket=BUCKET, parts_prefix=run.prefix,
                   batches_key=work.batches_key(run))
    [(index, count, blob, stats)] = mxinfer.score_partition(1, [run.spans[1]], job)
    part = bucket.get_object(Bucket=BUCKET, Key=partition.part_key(run.prefix, 1))["Body"].read()
    rows = [json.loads(line) for line in part_lines(part)]
    assert (index, count, blob, stats.keys) == (1, 2, None, 2)
    assert [row["key"] for row in rows] == ["plan/c.png", "plan/d.png"]
    assert rows[0]["error"]["type"] == "ObjectTooLargeError" and "predictions" in rows[1]
    # The last, short batch holds the unicode key; every key of the plan is read back once, in order.
    [(_, count, _, _)] = mxinfer.score_partition(2, [run.spans[2]], job)
    assert count == 1 and [key for batch in work.run_batches(run) for key in batch.column(0).to_pylist()] == keys


def test_without_a_listed_size_an_object_over_max_bytes_is_refused_from_its_content_length(
        bucket, moto_endpoint, demo_dir):
    objects = bad_and_good_objects()
    for key in ("cases/good-1.jpg", "cases/huge.png"):
        bucket.put_object(Bucket=BUCKET, Key=key, Body=objects[key])
    # Size -1: a manifest without sizes. The executor learns the size from the GET's Content-Length.
    rows, stats = run_partition(job_spec(moto_endpoint, demo_dir), [("cases/good-1.jpg", -1), ("cases/huge.png", -1)])
    assert rows["cases/huge.png"]["error"] == {
        "stage": "download", "type": "ObjectTooLargeError",
        "message": f"object is {len(objects['cases/huge.png'])} bytes, over max_object_bytes=200000"}
    assert rows["cases/good-1.jpg"]["predictions"]
    assert stats.errors == {"download": 1, "decode": 0, "predict": 0}


def test_animated_gif_is_scored_on_its_first_frame(bucket, moto_endpoint, demo_dir):
    objects = bad_and_good_objects()
    job = job_spec(moto_endpoint, demo_dir)
    classifier = mxinfer.get_classifier(job.model, make_demo.INPUT_SHAPE, job.batch_size)
    first_frame = mxinfer.decode_image(encode(digit(3), "PNG"), make_demo.PREPROCESS)[np.newaxis]
    from_gif = mxinfer.decode_image(objects["cases/anim.gif"], make_demo.PREPROCESS)[np.newaxis]
    assert (classifier.probabilities(from_gif).argmax() == classifier.probabilities(first_frame).argmax())


# --- 2. Transient S3 faults are retried, bounded and counted


def test_faults_that_outlast_the_retries_become_an_error_line_with_the_cause(bucket, moto_endpoint, demo_dir):
    bucket.put_object(Bucket=BUCKET, Key="flaky/a.png", Body=encode(digit(11), "PNG"))
    bucket.put_object(Bucket=BUCKET, Key="flaky/b.png", Body=encode(digit(12), "PNG"))
    always = lambda method, path: method == "GET" and path.endswith("/flaky/b.png")  # noqa: E731
    with FaultProxy(moto_endpoint, faults=Faults(rate=1.0, kinds=("slowdown",), key_filter=always)) as proxy:
        job = job_spec(proxy.endpoint, demo_dir, s3_max_attempts=2)
        rows, _ = run_partition(job, [("flaky/a.png", 1), ("flaky/b.png", 1)])
    assert "predictions" in rows["flaky/a.png"]
    error = rows["flaky/b.png"]["error"]
    assert error["stage"] == "download" and "SlowDown" in error["message"], error
    assert proxy.counts["slowdown"] == 2  # bounded: max_attempts=2, no more


def test_the_proxy_relays_a_heads_content_length_the_objects_size(bucket, moto_endpoint):
    """pyarrow's S3 files (pyiceberg's table metadata) take an object's size from its HEAD: the proxy's HEAD
    must say the object's length, not its own empty body's."""
    import pyarrow.fs as pafs

    body = b'{"metadata": "of a table"}'
    bucket.put_object(Bucket=BUCKET, Key="head/a.json", Body=body)
    with FaultProxy(moto_endpoint) as proxy:
        head = make_s3_client(proxy.endpoint).head_object(Bucket=BUCKET, Key="head/a.json")
        fs = pafs.S3FileSystem(endpoint_override=proxy.endpoint.split("://", 1)[1], scheme="http",
                               region="us-east-1")
        with fs.open_input_file(f"{BUCKET}/head/a.json") as handle:
            data = handle.read()
    assert head["ContentLength"] == len(body) and data == body


def test_cut_bodies_are_read_again(bucket, moto_endpoint, demo_dir):
    bucket.put_object(Bucket=BUCKET, Key="cut/a.png", Body=encode(digit(13), "PNG"))
    with FaultProxy(moto_endpoint, faults=Faults(rate=0.6, kinds=("cut",), seed=3)) as proxy:
        job = job_spec(proxy.endpoint, demo_dir, s3_max_attempts=8)
        rows, stats = run_partition(job, [("cut/a.png", 1)])
    assert "predictions" in rows["cut/a.png"], rows
    assert proxy.counts["cut"] >= 1
    assert stats.s3_retries["body"] + stats.s3_retries["request"] >= proxy.counts["cut"]


# --- Through spark-submit on local-cluster


def upload_digits(s3, prefix: str, count: int, start: int = 0) -> list[str]:
    keys = []
    for i in range(start, start + count):
        key = f"{prefix}{i:03d}.png"
        s3.put_object(Bucket=BUCKET, Key=key, Body=encode(digit(i), "PNG"))
        keys.append(key)
    return keys


def job_args(endpoint: str, prefix: str, output_key: str, *extra: str) -> list[str]:
    return ["--input", f"s3://{BUCKET}/{prefix}", "--model", f"s3://{BUCKET}/model/digits",
            "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", endpoint,
            "--input-shape", "3,32,32", "--std", "255", "--top-k", "2", *extra]


def read_lines(s3, key: str) -> list[dict]:
    return [json.loads(line) for line in s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode().splitlines()]


def read_summary(s3, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=f"{key}.summary.json")["Body"].read())


def assert_exactly_one_clean_line_per_key(rows: list[dict], keys: list[str]) -> None:
    assert [row["key"] for row in rows] == sorted(keys)  # M keys in, M lines out, sorted, no duplicates
    assert all("predictions" in row for row in rows), [row for row in rows if "error" in row]


@pytest.mark.spark
def test_job_completes_through_20_percent_s3_faults_and_counts_the_retries(bucket, moto_endpoint):
    keys = upload_digits(bucket, "faulty/", 40)
    bucket.put_object(Bucket=BUCKET, Key="out/faulty.jsonl", Body=b"stale output of an earlier run\n")
    with FaultProxy(moto_endpoint, faults=Faults(rate=0.2, seed=7)) as proxy:
        result = spark_submit(job_args(proxy.endpoint, "faulty/", "out/faulty.jsonl", "--batch-size", "8",
                                       "--s3-max-attempts", "8", "--overwrite"))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    rows = read_lines(bucket, "out/faulty.jsonl")  # the stale object was replaced whole
    assert_exactly_one_clean_line_per_key(rows, keys)
    summary = read_summary(bucket, "out/faulty.jsonl")
    injected = sum(proxy.counts[f] for f in ("slowdown", "internal", "reset", "cut"))
    assert injected >= 10, proxy.counts
    retried = summary["s3_retries"]["request"] + summary["s3_retries"]["body"]
    assert retried >= 1, summary["s3_retries"]
    assert bucket.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []


def python_workers() -> list[psutil.Process]:
    """PySpark's forked Python workers: children of a ``pyspark.daemon`` process."""
    workers = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "pyspark.daemon" in cmdline:
            try:
                workers.extend(proc.children())
            except psutil.NoSuchProcess:
                pass
    return workers


def executors() -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if "CoarseGrainedExecutorBackend" in " ".join(p.info["cmdline"] or [])]


def run_with_a_kill(bucket, moto_endpoint, prefix: str, output_key: str, kill) -> tuple:
    """Run the job slowly (0.15 s per request) and call ``kill`` while the 12th image is being fetched.

    The kill runs inside the proxy's request handler, before the answer, so the
    process that asked is certainly in the middle of a task.
    """
    keys = upload_digits(bucket, prefix, 32, start=40)
    fired = threading.Event()
    gets = []

    def on_request(method: str, path: str) -> bool:
        if method == "GET" and path.endswith(".png") and f"/{prefix}" in path:
            gets.append(path)
            if len(gets) == 12 and not fired.is_set():
                killed = kill()
                assert killed, "nothing to kill"
                fired.set()
        return False  # deny nothing: this is only a hook

    with FaultProxy(moto_endpoint, latency=0.15, deny=on_request) as proxy:
        # No estimate: its sample's GETs on the driver would reach the 12th before any executor ran.
        result = spark_submit(job_args(proxy.endpoint, prefix, output_key, "--batch-size", "4",
                                       "--io-threads", "1", "--max-in-flight", "1", "--estimate-images", "0"))
    assert fired.is_set()
    return result, keys


def kill_python_workers() -> list:
    victims = python_workers()
    for proc in victims:
        proc.send_signal(signal.SIGKILL)
    return victims


def kill_one_executor() -> list:
    victims = executors()[:1]
    for proc in victims:
        proc.send_signal(signal.SIGKILL)
    return victims


@pytest.mark.spark
@pytest.mark.parametrize("prefix, kill", [("killworker/", kill_python_workers), ("killexec/", kill_one_executor)],
                         ids=["python-worker", "executor"])
def test_a_killed_worker_or_executor_changes_nothing_in_the_output(bucket, moto_endpoint, prefix, kill):
    output_key = f"out/{prefix.rstrip('/')}.jsonl"
    result, keys = run_with_a_kill(bucket, moto_endpoint, prefix, output_key, kill)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert_exactly_one_clean_line_per_key(read_lines(bucket, output_key), keys)
    assert read_summary(bucket, output_key)["retried_batches"] >= 1


# --- 3. Executors that cannot load the model fail the job fast, with the cause; 5. atomically


@pytest.mark.spark
def test_weights_unreachable_from_executors_fail_fast_with_the_cause_and_leave_no_output(bucket, moto_endpoint):
    upload_digits(bucket, "nomodel/", 8)
    params_reads = []

    def deny_params(method: str, path: str) -> bool:
        # The executors load the model as they warm up and one checks it for the driver
        # (mxjob.executor.model_check); the driver reads no parameters itself (the fingerprint takes their digest
        # from that load).
        if method == "GET" and path.endswith("/model/digits-0000.params"):
            params_reads.append(path)
            return True
        return False

    started = time.time()
    with FaultProxy(moto_endpoint, deny=deny_params) as proxy:
        result = spark_submit(job_args(proxy.endpoint, "nomodel/", "out/nomodel.jsonl", "--batch-size", "4",
                                       "--estimate-images", "0"))
    elapsed = time.time() - started
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    # The executor's own words: its host, the file it could not read, the error.
    assert re.search(r"executor \S+ cannot load the model s3://\S+/model/digits-0000\.params: \w+: .*AccessDenied",
                     output), output[-3000:]
    assert "loaded the model in" not in output
    assert params_reads and elapsed < 150
    # Refused at the check, before any plan or batch: no Spark errors or stacks for the user, nothing to resume.
    assert "Traceback" not in output and "TaskSetManager" not in output and "resume with:" not in output
    assert not access.object_exists(bucket, BUCKET, "out/nomodel.jsonl")  # no output
    assert not access.object_exists(bucket, BUCKET, "out/nomodel.jsonl.summary.json")  # no summary
    assert bucket.list_objects_v2(Bucket=BUCKET, Prefix="out/nomodel.jsonl.parts/").get("KeyCount") == 0  # no plan
    assert bucket.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []) == []  # no orphaned parts


# --- 6. Secrets never leak


@pytest.mark.spark
def test_canary_credentials_appear_in_no_process_list_log_or_event_log(bucket, moto_endpoint, tmp_path):
    keys = upload_digits(bucket, "canary/", 8)
    key_id, secret = "AKIACANARY7Q2X9ZP4LM", "canary/Secret+Do-Not-Leak-8f3a1c2e9b7d"
    events = tmp_path / "events"
    events.mkdir()
    properties = tmp_path / "spark.conf"
    properties.write_text((ROOT / "conf" / "spark-local.conf").read_text() + "\n".join([
        "", "spark.eventLog.enabled true", f"spark.eventLog.dir file://{events}",
        # A user who ships the key in Spark's own config: redaction must hide it.
        f"spark.executorEnv.AWS_SECRET_ACCESS_KEY {secret}", ""]))
    command = spark_submit_command(job_args(moto_endpoint, "canary/", "out/canary.jsonl", "--batch-size", "4"), MASTER)
    command[command.index("--properties-file") + 1] = str(properties)
    env = spark_env({"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret})
    env.pop("AWS_SESSION_TOKEN", None)
    process = subprocess.Popen(command, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    snapshots = []
    reader = threading.Thread(target=lambda: snapshots.append(process.stdout.read()))
    reader.start()
    while process.poll() is None:
        ps = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True, check=False)
        snapshots.append(ps.stdout)
        time.sleep(0.3)
    reader.join()
    log = snapshots[-1]
    assert process.returncode == 0, log[-3000:]
    assert len(snapshots) > 5
    assert_exactly_one_clean_line_per_key(read_lines(bucket, "out/canary.jsonl"), keys)
    texts = {"process list": "\n".join(snapshots[:-1]), "driver log": log}
    # The event log decompressed (Spark 4 rolls and compresses it), and each executor's stdout and stderr, which
    # local-cluster keeps under SPARK_HOME/work/APP_ID/EXECUTOR_ID.
    texts.update({f"events {path}": text for path, text in event_logs.event_logs(events).items()})
    [app_id] = event_logs.application_ids(events)
    executor_logs = Path(pyspark.__file__).parent / "work" / app_id
    for path in [*executor_logs.rglob("stdout"), *executor_logs.rglob("stderr")]:
        if path.is_file():
            texts[str(path)] = path.read_text(errors="replace")
    texts["summary"] = json.dumps(read_summary(bucket, "out/canary.jsonl"))
    assert any("eventLog" in name or "events" in name for name in texts), list(texts)
    assert any(name.endswith("stderr") for name in texts), list(texts)  # executor logs were read
    for name, text in texts.items():
        assert secret not in text, f"secret leaked into {name}"
        assert key_id not in text, f"key id leaked into {name}"
    assert "redacted" in "".join(t for n, t in texts.items() if "events" in n)



def test_implicit_synset_that_s3_refuses_is_skipped_but_an_explicit_one_is_an_error(bucket, moto_endpoint):
    deny = lambda method, path: path.endswith("/model/synset.txt")  # noqa: E731
    with FaultProxy(moto_endpoint, deny=deny) as proxy:
        implicit = mxinfer.ModelSpec.from_prefix(f"s3://{BUCKET}/model/digits", endpoint_url=proxy.endpoint)
        assert mxinfer.Classifier(implicit, make_demo.INPUT_SHAPE, batch_size=2).labels is None
        explicit = mxinfer.ModelSpec.from_prefix(f"s3://{BUCKET}/model/digits", endpoint_url=proxy.endpoint,
                                                 labels_uri=f"s3://{BUCKET}/model/synset.txt")
        with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
            mxinfer.Classifier(explicit, make_demo.INPUT_SHAPE, batch_size=2)
