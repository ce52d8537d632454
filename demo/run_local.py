"""``make run-local``: the whole job on this machine, exactly as on EMR but for the master.

Starts a moto S3 server on a free loopback port, makes the demo model and
images, uploads them, runs ``spark-submit --master 'local-cluster[1,1,2048]'``
with ``--py-files``, keeps a copy of the output and its summary under
``run/output/``, prints some predictions, the summary and the demo's
accuracy, and stops the server (also when the job fails, and on Ctrl-C or
SIGTERM). With ``--keep-s3`` (``make run-local KEEP_S3=1``) the server stays
up until Ctrl-C or SIGTERM, and the ``make submit`` line printed after the run
reruns the job against it. With ``--iceberg`` (``make run-local ICEBERG=1``)
the output is the Apache Iceberg table ``iceberg://local/demo.digits`` in a
SQL catalog on SQLite (``run/iceberg/catalog.db``, its files in the local S3
bucket's ``warehouse/``), configured as a user would, by
``PYICEBERG_CATALOG__LOCAL__*`` variables; a copy of its rows stays in
``run/output/digits.parquet``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import yaml

from demo import jvm_options, make_demo
from demo.s3local import FAKE_AWS_ENV, moto_server
from deploy.package import build_zip

ROOT = Path(__file__).resolve().parent.parent
#: One executor for this host, as EMR runs one per node (conf/emr.yaml): its Python worker takes the host's
#: cores in forward lanes (mxjob.model.worker). Two one-core executors on two vCPUs (the layout before) paid a second
#: JVM and a second MXNet start for nothing: make bench-peers prints both layouts.
MASTER = "local-cluster[1,1,2048]"


#: Where run-local, make submit and the tests keep the --py-files zip: it outlives the run, so
#: the spark-submit line make submit prints works as it is.
PY_FILES_ZIP = ROOT / "run" / "py-files" / "mxinfer_job.zip"


@functools.cache
def py_files_zip() -> Path:
    """The ``--py-files`` zip of ``make package`` (``deploy/package.py``), built from the sources once per process.

    Written beside and then renamed over :data:`PY_FILES_ZIP`, so a job that
    another process started meanwhile never reads half a zip.
    """
    PY_FILES_ZIP.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=PY_FILES_ZIP.parent, suffix=".zip.partial")
    os.close(fd)
    os.replace(build_zip(partial), PY_FILES_ZIP)
    return PY_FILES_ZIP


def spark_submit_command(job_args: list[str], master: str = MASTER) -> list[str]:
    """The spark-submit line: the same files and flags a cluster gets, and the local JVMs' archives."""
    python_bin = Path(sys.executable).parent
    # The JVMs' class-data sharing archives, where `make jvm-archives` made them (demo/jvm_options.py).
    log4j = f"-Dlog4j2.configurationFile=file:{ROOT / 'conf' / 'log4j2.properties'}"
    driver_java = f"{log4j} {jvm_options.driver_options()}"
    executor_java = jvm_options.executor_options()
    return [
        str(python_bin / "spark-submit"), "--master", master,
        "--properties-file", str(ROOT / "conf" / "spark-local.conf"),
        "--driver-java-options", driver_java.strip(),
        *(["--conf", f"spark.executor.defaultJavaOptions={executor_java}"] if executor_java else []),
        "--py-files", str(py_files_zip()),
        str(ROOT / "infer_main.py"), *job_args,
    ]


def spark_env(extra: dict | None = None, fake_aws: bool = True) -> dict:
    """Environment for spark-submit: our venv's Python on driver and executors, fake AWS keys.

    ``PYSPARK_PYTHON`` is what lets ``.venv/bin/spark-submit`` run from a shell
    without the venv activated: unset, PySpark's launcher uses the first
    ``python3`` on PATH, which has no pyspark. ``fake_aws`` replaces every
    ``AWS_`` variable with moto's fake keys (never a real key near moto).
    """
    env = dict(os.environ)
    if fake_aws:
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
        env.update(FAKE_AWS_ENV)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    env.update(jvm_options.launcher_env())
    env.update(extra or {})
    return env


def rerun_command(job_args: list[str], env: dict | None = None) -> str:
    """What a user types to run the job again by hand, from any shell (see demo/submit.py).

    With ``--overwrite``: the run that printed it has written the output, and
    the job refuses to replace an output without it; a ``--skip-existing``
    run adds to its output instead. ``env``: variables the job needs that a
    new shell lacks (the Iceberg catalog's), set in front of the command.
    """
    extra = [] if "--skip-existing" in job_args else ["--overwrite"]
    prefix = "".join(f"{name}={shlex.quote(value)} " for name, value in (env or {}).items())
    return f"{prefix}make submit ARGS={shlex.quote(shlex.join([*job_args, *extra]))}"


def submit_job(job_args: list[str]) -> int:
    """Run the job through spark-submit, printing first the line that runs (the rerun line comes after the run)."""
    command = spark_submit_command(job_args)
    print(f"== running spark-submit on {MASTER}: {shlex.join(command)}", flush=True)
    return subprocess.call(command, env=spark_env(), cwd=str(ROOT))


def keep_s3_message(endpoint: str, job_args: list[str], env: dict | None = None) -> str:
    """What ``--keep-s3`` prints once the run is over: where the server stays, then how to rerun the job."""
    return (f"\n== the local S3 server stays at {endpoint} until Ctrl-C or SIGTERM;\n"
            f"   rerun the job with:\n   {rerun_command(job_args, env)}")


class Terminated(Exception):
    """SIGTERM, raised in the main thread so that every ``finally`` on the way out runs (the moto server's stop)."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated`: by default it would end the process, server left up."""
    def raise_terminated(signum, _frame):
        raise Terminated(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_until_stopped() -> str:
    """Wait for Ctrl-C or SIGTERM (``--keep-s3`` keeps the server up meanwhile); return which came."""
    with sigterm_raises():
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return "Ctrl-C"
        except Terminated:
            return "SIGTERM"


def upload_demo(s3, made: dict, bucket: str, model_key: str, image_prefix: str) -> int:
    s3.create_bucket(Bucket=bucket)
    model_dir = Path(made["model_prefix"]).parent
    for path in sorted(model_dir.iterdir()):
        s3.upload_file(str(path), bucket, f"{model_key.rsplit('/', 1)[0]}/{path.name}")
    count = 0
    for path in sorted(Path(made["images"]).rglob("*.png")):
        s3.put_object(Bucket=bucket, Key=f"{image_prefix}{path.parent.name}/{path.name}", Body=path.read_bytes())
        count += 1
    return count


def demo_config() -> tuple[dict, str, str, str, str]:
    """``conf/demo.yaml`` and where it puts things: ``(config, bucket, image prefix, model key, output key)``."""
    config = yaml.safe_load((ROOT / "conf" / "demo.yaml").read_text())
    bucket, _, image_prefix = config["input"][len("s3://"):].partition("/")
    _, _, model_key = config["model"][len("s3://"):].partition("/")
    _, _, output_key = config["output"][len("s3://"):].partition("/")
    return config, bucket, image_prefix, model_key, output_key


#: The table ``make run-local ICEBERG=1`` writes, and its catalog's name.
ICEBERG_TABLE, ICEBERG_CATALOG = "iceberg://local/demo.digits", "local"


def iceberg_env(work: Path, bucket: str) -> dict:
    """The local SQL catalog's variables, a fresh catalog each run (the local S3 server starts empty each time)."""
    folder = work / "iceberg"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    name = ICEBERG_CATALOG.upper()
    return {f"PYICEBERG_CATALOG__{name}__URI": f"sqlite:///{folder / 'catalog.db'}",
            f"PYICEBERG_CATALOG__{name}__WAREHOUSE": f"s3://{bucket}/warehouse"}


def main(keep_s3: bool = False, iceberg: bool = False) -> int:
    started = time.time()
    work = ROOT / "run"
    work.mkdir(exist_ok=True)
    config, bucket, image_prefix, model_key, output_key = demo_config()
    if iceberg:  # spark-submit's driver and this process read the catalog from the environment, as users set it
        os.environ.update(iceberg_env(work, bucket))
        config = {**config, "output": ICEBERG_TABLE}

    print("== making the demo model and images (scikit-learn digits, trained here)", flush=True)
    made = make_demo.make_demo(work / "demo")
    print(f"   trained on {made['train']} digits; {made['test']} held out as PNG images", flush=True)

    with moto_server(work / "moto.log") as endpoint:
        print(f"== local S3 (moto) at {endpoint}", flush=True)
        s3 = boto3.client("s3", endpoint_url=endpoint, **{
            "aws_access_key_id": FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
            "region_name": FAKE_AWS_ENV["AWS_DEFAULT_REGION"],
        })
        count = upload_demo(s3, made, bucket, model_key, image_prefix)
        print(f"   uploaded the model and {count} images to {config['input']}", flush=True)

        job_args = ["--config", "conf/demo.yaml", "--endpoint-url", endpoint]
        if iceberg:  # --skip-existing: a rerun against the kept server adds only new images
            job_args += ["--output", ICEBERG_TABLE, "--skip-existing"]
        code = submit_job(job_args)
        if code != 0:
            print(f"!! the job failed with exit code {code}", file=sys.stderr)
            return code

        # The server stops with this script: keep copies where the user can still read them.
        kept = work / "output"
        kept.mkdir(exist_ok=True)
        if iceberg:
            lines, summary_text, sidecars = iceberg_output(s3, endpoint, kept)
        else:
            lines = s3.get_object(Bucket=bucket, Key=output_key)["Body"].read().decode().splitlines()
            (kept / Path(output_key).name).write_text("\n".join(lines) + "\n")
            sidecars = f"{output_key}.", f"{Path(output_key).name}."
            summary_text = s3.get_object(Bucket=bucket, Key=f"{output_key}.summary.json")["Body"].read().decode()
        summary = json.loads(summary_text)
        summary_copy = kept / f"{sidecars[1]}summary.json"
        summary_copy.write_text(summary_text)
        # A table's runs keep their summary under its _mxinfer/ home, not beside its name.
        summary_uri = f"s3://{bucket}/{sidecars[0]}summary.json"
        report_copy = kept / f"{sidecars[1]}report.html"
        s3.download_file(bucket, f"{sidecars[0]}report.html", str(report_copy))
        if keep_s3:
            code = report(lines, summary, summary_copy, summary_uri, config, started)
            catalog = {k: v for k, v in os.environ.items() if k.startswith("PYICEBERG_CATALOG__")} if iceberg else None
            print(keep_s3_message(endpoint, job_args, catalog), flush=True)
            print(f"\n== {wait_until_stopped()}: stopping the local S3 server", flush=True)
            return code
    return report(lines, summary, summary_copy, summary_uri, config, started)


def iceberg_output(s3, endpoint: str, kept: Path) -> tuple[list[str], str, tuple[str, str]]:
    """The table's rows as JSON lines (for the accuracy), its run's summary, and where the report is.

    Read with pyiceberg, as any reader of the table would; a copy of the
    rows goes to ``run/output/digits.parquet``; the summary is read with
    ``s3``, the demo's client of the local server. Returns ``(lines, summary
    JSON, (key prefix of the sidecars in the bucket, local name prefix))``.
    """
    import pyarrow.parquet as pq

    from mxjob.outputs import iceberg_catalog, iceberg_run

    table = iceberg_catalog.load_catalog(ICEBERG_CATALOG, endpoint_url=endpoint).load_table("demo.digits")
    rows = table.scan().to_arrow()
    pq.write_table(rows, kept / "digits.parquet")
    bucket, home = iceberg_run.home_of(table.location())
    summary_text = s3.get_object(Bucket=bucket, Key=f"{home}_summary.json")["Body"].read().decode()
    commits = iceberg_catalog.snapshot_summaries(table)
    print(f"\n== the Iceberg table {ICEBERG_TABLE} at {table.location()}: {rows.num_rows} rows in "
          f"{len(commits)} snapshots (read with pyiceberg; a copy in {(kept / 'digits.parquet').relative_to(ROOT)})")
    lines = [json.dumps({k: v for k, v in row.items() if v is not None and v != []}, default=str)
             for row in rows.sort_by("key").to_pylist()]
    return lines, summary_text, (home + "_", "digits.")


def report(lines: list[str], summary: dict, summary_copy: Path, summary_uri: str, config: dict,
           started: float) -> int:
    """Print the first lines, the summary and the demo's accuracy; 0 if the accuracy is as expected."""
    print(f"\n== {len(lines)} lines in {config['output']}; the first five:")
    for line in lines[:5]:
        print("   " + line)
    print("\n== summary")
    brief = {k: summary[k] for k in ("keys_listed", "predicted", "failed", "batches", "elapsed_seconds",
                                     "images_per_second", "seconds")}
    brief["while_tasks_ran"] = {k: summary["tasks"][k] for k in ("seconds", "images_per_second")}
    brief["python_workers"] = {name: {k: worker[k] for k in ("batches", "model_loads")}
                               for name, worker in summary["python_workers"].items()}
    print(json.dumps(brief, indent=2))
    print("   (the whole summary, with per-executor timing and memory, is in "
          f"{summary_copy.relative_to(ROOT)}, a copy of {summary_uri})")
    rows = [json.loads(line) for line in lines]
    correct = sum(1 for row in rows if "predictions" in row
                  and row["predictions"][0]["class_id"] == make_demo.true_label(row["key"]))
    accuracy = correct / len(rows)
    print(f"\n== demo accuracy (top-1 vs the digit in each key's folder): {correct}/{len(rows)} = {accuracy:.1%}")
    report_copy = summary_copy.with_name(summary_copy.name.replace(".summary.json", ".report.html"))
    print(f"== the run's report: open {report_copy.relative_to(ROOT)} in a browser")
    print(f"== run-local wall time: {time.time() - started:.1f}s")
    return 0 if accuracy >= 0.9 else 1


def cli(argv: list[str]) -> int:
    """``python -m demo.run_local [--keep-s3]``: a SIGTERM at any point ends it through the same clean-up as Ctrl-C."""
    with sigterm_raises():
        try:
            return main(keep_s3="--keep-s3" in argv, iceberg="--iceberg" in argv)
        except Terminated:
            print("\n!! stopped by SIGTERM; the local S3 server is stopped", file=sys.stderr, flush=True)
            return 128 + signal.SIGTERM


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
