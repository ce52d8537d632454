"""The packaged job needs nothing but dist/ and S3.

In ``--deploy-mode cluster`` on EMR the driver starts on a core node, with the
job file, the ``--py-files`` zip and the job config all fetched from S3. This
runs the files ``make package`` ships in client mode on ``local-cluster``, from
an empty directory holding only them, with the config given as an ``s3://``
URI and every other input and output in (moto) S3, and with the Spark settings
of ``conf/emr.yaml`` less its memory sizes, which fit a cluster node, not this
box. Cluster mode itself, on a real YARN, is ``tests/integration/test_yarn.py``'s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "cluster-mode"
IMAGES = 100
BATCH = 16

pytestmark = pytest.mark.spark


def emr_spark_conf(emr_yaml: Path) -> dict[str, str]:
    """spark-defaults from the cluster config, sized down for two executors on two cores."""
    raw = yaml.safe_load(emr_yaml.read_text())
    [props] = [c["Properties"] for c in raw["configurations"] if c["Classification"] == "spark-defaults"]
    conf = {key: str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in props.items() if "memory" not in key.lower()}
    conf["spark.executorEnv.OMP_NUM_THREADS"] = "1"
    conf["spark.executorEnv.MXNET_CPU_WORKER_NTHREADS"] = "1"
    conf["spark.ui.enabled"] = "false"
    return conf


@pytest.fixture(scope="module")
def packaged_run(tmp_path_factory, s3, moto_endpoint, demo_dir):
    """Run the packaged job once; return (result, workdir files before, after, the job config)."""
    tmp = tmp_path_factory.mktemp("cluster_mode")
    subprocess.run(["make", "-s", "package", f"DIST={tmp / 'dist'}"], cwd=ROOT, check=True)
    workdir = tmp / "submit"
    shutil.copytree(tmp / "dist", workdir)
    before = sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*"))

    s3.create_bucket(Bucket=BUCKET)
    for path in sorted((demo_dir / "model").iterdir()):
        s3.upload_file(str(path), BUCKET, f"models/{path.name}")
    for path in sorted((demo_dir / "images").rglob("*.png")):
        s3.upload_file(str(path), BUCKET, f"digits/{path.parent.name}/{path.name}")
    job = {
        "input": f"s3://{BUCKET}/digits/",
        "model": f"s3://{BUCKET}/models/digits",
        "output": f"s3://{BUCKET}/out/digits.jsonl",
        "input_shape": "3,32,32",
        "std": "255,255,255",
        "batch_size": BATCH,
        "top_k": 3,
        "limit": IMAGES,
        "progress_seconds": 5,
    }
    s3.put_object(Bucket=BUCKET, Key="conf/job.yaml", Body=yaml.safe_dump(job).encode())

    command = [str(Path(sys.executable).with_name("spark-submit")),
               "--master", "local-cluster[2,1,1024]", "--deploy-mode", "client"]
    for key, value in emr_spark_conf(workdir / "conf" / "emr.yaml").items():
        command += ["--conf", f"{key}={value}"]
    command += ["--py-files", "mxinfer_job.zip", "infer_main.py",
                "--config", f"s3://{BUCKET}/conf/job.yaml"]
    # As on EMR, S3 is found through the default chain; here AWS_ENDPOINT_URL
    # points that chain at moto. Nothing from the checkout is importable.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("AWS_")}
    env.update({
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": moto_endpoint,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
    })
    result = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    after = sorted(p.relative_to(workdir).as_posix() for p in workdir.rglob("*"))
    return result, before, after, job


def test_packaged_job_succeeds_from_an_empty_directory(packaged_run):
    result, before, after, _ = packaged_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert before == [
        "conf", "conf/defaults.yaml", "conf/emr.yaml", "infer_main.py", "install-deps.sh",
        "mxinfer_job.zip", "requirements.txt",
    ]
    # The driver writes only to S3: nothing new beside the packaged files.
    assert after == before


def test_packaged_job_writes_every_prediction_and_a_summary_to_s3(packaged_run, s3):
    result, _, _, job = packaged_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix="digits/")["Contents"]
    expected_keys = sorted(obj["Key"] for obj in listed)[:IMAGES]

    body = s3.get_object(Bucket=BUCKET, Key="out/digits.jsonl")["Body"].read().decode()
    rows = [json.loads(line) for line in body.splitlines()]
    assert [row["key"] for row in rows] == expected_keys
    assert all(len(row["predictions"]) == job["top_k"] for row in rows)
    correct = sum(row["predictions"][0]["class_id"] == int(row["key"].split("/")[1]) for row in rows)
    assert correct >= 0.8 * IMAGES, f"top-1 right for only {correct} of {IMAGES}"

    summary = json.loads(s3.get_object(Bucket=BUCKET, Key="out/digits.jsonl.summary.json")["Body"].read())
    assert (summary["predicted"], summary["failed"]) == (IMAGES, 0)
    assert summary["batches"] == -(-IMAGES // BATCH)
    # spark.executor.cores=1 and spark.python.worker.reuse=true from conf/emr.yaml:
    # one Python worker per executor, which loaded the model once.
    workers = summary["python_workers"]
    assert sorted(name.rsplit("/", 1)[0] for name in workers) == sorted(summary["executors"])
    assert [w["model_loads"] for w in workers.values()] == [1] * len(workers)
