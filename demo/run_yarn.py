"""``make run-yarn`` and ``make submit-yarn``: the job as an EMR step runs it, on the local YARN.

``spark-submit --master yarn --deploy-mode cluster``: the driver runs inside
YARN's ApplicationMaster container, the ``make package`` zip goes as
``--py-files`` and the job config is read from S3, with ``conf/emr.yaml``'s
Spark settings scaled to the local YARN's nodes (:func:`yarn_spark_conf`).

``make run-yarn`` does it for the demo of ``make run-local`` (moto S3, the demo
model and images), waits for the application, then prints its id and final
state, the demo accuracy and where YARN keeps the containers' logs; it exits
with the job's exit code. ``make submit-yarn ARGS='...'`` submits your own job
the same way, against any S3, to rehearse an EMR step before paying for one.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import boto3
import yaml

from demo import make_demo, yarn_local
from demo.run_local import ROOT, demo_config, py_files_zip, spark_env, upload_demo
from demo.s3local import FAKE_AWS_ENV, moto_server
from demo.submit import shell_line, uses_local_s3

#: conf/emr.yaml's memory settings scaled to the local YARN's 8 GiB nodes, keeping its two rules: an
#: executor takes more than half a node (4g + 16g of 24 GiB there, 1g + 5g of 8 GiB here), so YARN never
#: places two on one node, and the cluster-mode driver (2g + 1536m there, 1g + 1g here) fits beside one.
#: The driver's overhead keeps its absolute size rather than its share: the Python driver imports MXNet
#: (about 350 MiB) however small the node.
LOCAL_MEMORY = {
    "spark.executor.memory": "1g",
    "spark.executor.memoryOverhead": "5g",
    "spark.driver.memory": "1g",
    "spark.driver.memoryOverhead": "1g",
}

#: The two local nodes share this machine's 2 cores: one MXNet thread per executor, as a node's
#: vCPUs are shared on EMR (conf/emr.yaml sets both to the node's vCPUs).
LOCAL_THREADS = {
    "spark.executorEnv.OMP_NUM_THREADS": "1",
    "spark.executorEnv.MXNET_CPU_WORKER_NTHREADS": "1",
}

SUBMITTED = re.compile(r"Submitted application (application_\d+_\d+)")
#: An ERROR or WARNING of the job's own log (infer_main.py's and the mxjob package's loggers).
JOB_LOG = re.compile(r" (ERROR|WARNING) (infer_main|mxjob[.\w]*): ")
#: The last line of a Python traceback: ``FileNotFoundError: ...``.
PYTHON_ERROR = re.compile(r"^[A-Z]\w*(Error|Exception)\b.*: ")


def emr_spark_defaults(emr_yaml: Path = ROOT / "conf" / "emr.yaml") -> dict[str, str]:
    """``conf/emr.yaml``'s spark-defaults, as strings (EMR's form)."""
    raw = yaml.safe_load(emr_yaml.read_text())
    [props] = [c["Properties"] for c in raw["configurations"] if c["Classification"] == "spark-defaults"]
    return {key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in props.items()}


#: What of pyspark's and py4j's packages goes into their zips: the files of EMR's own ``python/lib`` zips.
ARCHIVED = frozenset({".py", ".json", ".pyi", ".typed"})


def in_package(path: Path, root: Path) -> bool:
    """Whether ``path`` is in a Python package under ``root``: every folder from ``root`` to it has ``__init__.py``."""
    folder = path.parent
    while folder != root.parent:
        if not (folder / "__init__.py").is_file():
            return False
        folder = folder.parent
    return True


@functools.cache
def pyspark_archives() -> str:
    """``PYSPARK_ARCHIVES_PATH``: pyspark.zip and py4j's zip, as EMR keeps them in /usr/lib/spark/python/lib.

    spark-submit ships them to YARN's containers for their ``PYTHONPATH``; pip's
    pyspark has no ``python/lib`` folder, so they are built here from the
    installed packages (sources and data files) once per version, and given as
    ``local:`` files, which every node of this single-machine cluster has.
    """
    import py4j
    import pyspark

    folder = yarn_local.STATE / "python" / pyspark.__version__
    folder.mkdir(parents=True, exist_ok=True)
    zips = []
    for package in (pyspark, py4j):
        root = Path(package.__file__).parent
        target = folder / f"{root.name}.zip"
        if not target.exists():
            partial = target.with_suffix(".zip.partial")
            with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in sorted(root.rglob("*")):
                    # Sources and the data files they read (Spark 4: pyspark/errors/error-conditions.json), in
                    # the Python packages alone: not the jars, scripts, examples or local-cluster's work/ folder
                    # that pip's pyspark also holds.
                    if path.suffix in ARCHIVED and in_package(path, root):
                        archive.write(path, Path(root.name) / path.relative_to(root))
            os.replace(partial, target)
        zips.append(f"local:{target}")
    return ",".join(zips)


def yarn_spark_conf(overrides: dict[str, str] | None = None, env: dict[str, str] | None = None) -> dict[str, str]:
    """Spark settings for a cluster-mode run on the local YARN: conf/emr.yaml's, scaled, and what this machine needs.

    ``env`` is given to the driver's container and every executor's
    (``spark.yarn.appMasterEnv.*``, ``spark.executorEnv.*``), as EMR's
    instance profile and ``spark-env`` give them theirs.
    """
    import pyspark

    conf = emr_spark_defaults()
    conf.update(LOCAL_MEMORY)
    conf.update(LOCAL_THREADS)
    conf["spark.executor.instances"] = str(yarn_local.NODES)
    spark_home = Path(pyspark.__file__).parent
    conf.update({
        # The jars are on the node already (EMR's are too): nothing to upload per submission.
        "spark.yarn.jars": f"local:{spark_home / 'jars'}/*",
        "spark.yarn.stagingDir": f"file://{yarn_local.STATE / 'staging'}",
        # EMR's spark-env sets PYSPARK_PYTHON to the bootstrap's interpreter; here it is the venv's.
        "spark.pyspark.python": sys.executable,
        "spark.pyspark.driver.python": sys.executable,
        "spark.ui.enabled": "false",
        # YARN asked for the application's state every second, as on EMR (Spark's default), so that
        # spark-submit returns within a second of the end; a progress line every 30 of them
        # (spark.yarn.report.loggingFrequency), or when the state changes.
        "spark.yarn.report.interval": "1s",
        "spark.yarn.submit.waitAppCompletion": "true",
    })
    for name, value in (env or {}).items():
        conf[f"spark.yarn.appMasterEnv.{name}"] = value
        conf[f"spark.executorEnv.{name}"] = value
    conf.update(overrides or {})
    return conf


def container_env(local_s3: bool, endpoint: str | None = None) -> dict[str, str]:
    """The AWS environment the containers get: moto's fake keys and endpoint, or the caller's own AWS_* variables."""
    if local_s3:
        env = dict(FAKE_AWS_ENV)
        if endpoint:
            env["AWS_ENDPOINT_URL"] = endpoint
        return env
    env = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    if "HOME" in os.environ:
        # boto3 reads ~/.aws/ (profiles, SSO caches) from the home of the user the containers run as.
        env["HOME"] = os.environ["HOME"]
    return env


def submit_command(job_args: list[str], conf: dict[str, str], properties: Path,
                   main: Path = ROOT / "infer_main.py") -> list[str]:
    """The spark-submit line: the settings in ``properties`` (written here), the job file and zip as on EMR."""
    properties.parent.mkdir(parents=True, exist_ok=True)
    properties.write_text("".join(f"{key} {value}\n" for key, value in sorted(conf.items())))
    # It may hold AWS keys (container_env): readable by this user only.
    properties.chmod(0o600)
    return [str(Path(sys.executable).with_name("spark-submit")), "--master", "yarn", "--deploy-mode", "cluster",
            "--properties-file", str(properties), "--py-files", str(py_files_zip()), str(main), *job_args]


def submit_env(local_s3: bool, endpoint: str | None = None) -> dict[str, str]:
    """spark-submit's environment: ``make submit``'s (:func:`demo.run_local.spark_env`: the venv's Python, and
    moto's keys in place of every ``AWS_`` variable when ``local_s3``), the local YARN's client configuration and
    the pyspark archives; ``endpoint`` as ``AWS_ENDPOINT_URL`` for a local server, where the driver reads the
    job config from."""
    env = spark_env(fake_aws=local_s3)
    if local_s3 and endpoint:
        env["AWS_ENDPOINT_URL"] = endpoint
    env["HADOOP_CONF_DIR"] = str(yarn_local.CONF_DIR)
    env["PYSPARK_ARCHIVES_PATH"] = pyspark_archives()
    return env


class Stopped(Exception):
    """A signal reached ``make submit-yarn`` or ``make run-yarn`` while YARN ran the job."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def run_submit(command: list[str], env: dict[str, str], log: Path | None = None) -> tuple[int, str | None]:
    """Run spark-submit, echoing its output (and copying it to ``log``); its exit code and the application id.

    A SIGINT, SIGTERM or SIGHUP here (Ctrl-C, ``make`` stopped, the terminal
    closed) kills the application through YARN before it ends spark-submit:
    in cluster mode the application does not belong to spark-submit, and
    would run on without it. :class:`Stopped` then says which signal came.
    """
    app_id = None
    sink = open(log, "w") if log else None
    previous = {sig: signal.signal(sig, _raise_stopped) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with subprocess.Popen(command, env=env, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, bufsize=1, start_new_session=True) as process:
            try:
                for line in process.stdout:
                    sys.stdout.write(line)
                    if sink:
                        sink.write(line)
                    match = SUBMITTED.search(line)
                    if match and app_id is None:
                        app_id = match.group(1)
                code = process.wait()
            except Stopped as stop:
                for sig in previous:  # a second Ctrl-C must not cut the kill short
                    signal.signal(sig, signal.SIG_IGN)
                stop_application(process, app_id, stop)
                raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if sink:
            sink.close()
    return code, app_id


def stop_application(process: subprocess.Popen, app_id: str | None, stop: Stopped) -> None:
    """Kill ``app_id`` through YARN (found in spark-submit's last lines if it had not said it yet), then end
    spark-submit, saying each step: the application would otherwise run on after spark-submit is gone."""
    print(f"\n== {stop}: stopping the job", flush=True)
    if app_id is None:
        process.terminate()
        rest, _ = process.communicate(timeout=30)
        found = SUBMITTED.search(rest or "")
        app_id = found.group(1) if found else None
    if app_id is None:
        print("   YARN had accepted no application: nothing runs", flush=True)
    else:
        print(f"   killing YARN application {app_id} (yarn application -kill {app_id})", flush=True)
        try:
            yarn_local.kill_app(app_id)
        except yarn_local.YarnError as exc:
            print(f"!! could not kill {app_id}: {exc}; it may still run: {yarn_local.YARN_CLI} application "
                  f"-kill {app_id}", file=sys.stderr, flush=True)
        else:
            print(f"   {app_id} is {yarn_local.app_report(app_id)['state']}; the job's status says interrupted "
                  "and keeps every finished batch: rerun with --resume to finish it", flush=True)
    if process.poll() is None:
        process.terminate()
        process.communicate(timeout=30)  # read to its end: a full pipe would hold spark-submit's exit


def describe_application(app_id: str) -> dict[str, str]:
    """Print the application's final state and where its containers' logs are; YARN's report."""
    report = yarn_local.app_report(app_id)
    print(f"== YARN application {app_id}: {report['state']}, final status {report['final_status']}, "
          f"{report['attempts']} attempt(s)")
    if report.get("diagnostics"):
        print(f"   diagnostics: {report['diagnostics'][:500]}")
    dirs = yarn_local.container_log_dirs(app_id)
    drivers = [d for d in dirs if d.name.endswith("_000001")]
    if report["final_status"] != "SUCCEEDED":
        for folder in drivers:  # the job's own last word is in its driver's stdout, not in YARN's diagnostics
            said = job_said(folder)
            if said:
                print(f"== the job said (attempt {int(folder.name.split('_')[-2])}, {folder.name}): {said}")
    print(f"== the containers' logs (stdout, stderr), {len(dirs)} containers:")
    for folder in dirs:
        role = "the driver (ApplicationMaster)" if folder in drivers else "an executor"
        print(f"   {folder.relative_to(ROOT)}  {role}")
    return report


def job_said(container: Path) -> str | None:
    """The job's last word in a driver container's logs (``stdout`` and ``stderr``): the ``Error: ...`` or
    ``Interrupted by ...`` line it ends on, else the last ERROR of its log, else the last WARNING, else the last
    line of a Python traceback."""
    lines = []
    for name in ("stdout", "stderr"):
        with contextlib.suppress(OSError):
            lines += (container / name).read_text(errors="replace").splitlines()
    for said in (lambda line: line.startswith(("Error:", "Interrupted by")),
                 lambda line: JOB_LOG.search(line) and " ERROR " in line,
                 lambda line: JOB_LOG.search(line),
                 lambda line: PYTHON_ERROR.match(line)):  # the driver died on a traceback
        found = next((line for line in reversed(lines) if said(line)), None)
        if found:
            return found.strip()
    return None


def precheck(job_args: list[str], env: dict[str, str]) -> int:
    """The job's options and ``--config`` read as the driver will read them, here, before YARN starts anything
    (:func:`infer_main.check`): a usage error is one line in seconds, not two failed attempts; its exit code."""
    done = subprocess.run([sys.executable, "-c", "import sys, infer_main; infer_main.check(sys.argv[1:])",
                           *job_args], env=env, cwd=str(ROOT), check=False)
    return done.returncode


def job_exit_code(s3, bucket: str, output_key: str, fallback: int) -> int:
    """The job's own exit code from its status file (YARN reports only succeeded or failed)."""
    try:
        status = json.loads(s3.get_object(Bucket=bucket, Key=f"{output_key}.status.json")["Body"].read())
    except s3.exceptions.NoSuchKey:
        return fallback
    code = status.get("exit_code")
    return fallback if code is None else int(code)


def main_demo() -> int:
    """``make run-yarn``."""
    started = time.time()
    work = ROOT / "run"
    work.mkdir(exist_ok=True)
    config, bucket, image_prefix, model_key, output_key = demo_config()

    yarn_local.up()
    print("== making the demo model and images (scikit-learn digits, trained here)", flush=True)
    made = make_demo.make_demo(work / "demo")
    with moto_server(work / "moto-yarn.log") as endpoint:
        print(f"== local S3 (moto) at {endpoint}", flush=True)
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"],
                          region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"])
        count = upload_demo(s3, made, bucket, model_key, image_prefix)
        job_key = "conf/job.yaml"
        s3.put_object(Bucket=bucket, Key=job_key, Body=yaml.safe_dump(config).encode())
        print(f"   uploaded the model, {count} images and the job config s3://{bucket}/{job_key}", flush=True)

        conf = yarn_spark_conf(env=container_env(True, endpoint))
        command = submit_command(["--config", f"s3://{bucket}/{job_key}"], conf,
                                 yarn_local.STATE / "submit" / "run-yarn.conf")
        env = submit_env(True, endpoint)
        print("== " + shell_line(command, {"HADOOP_CONF_DIR": env["HADOOP_CONF_DIR"]}), flush=True)
        code, app_id = run_submit(command, env)
        if app_id is None:
            print(f"!! spark-submit exited with code {code} before YARN accepted the application", file=sys.stderr)
            return code or 1
        describe_application(app_id)
        code = job_exit_code(s3, bucket, output_key, code)
        if code != 0:
            print(f"!! the job failed with exit code {code}", file=sys.stderr)
            return code
        lines = s3.get_object(Bucket=bucket, Key=output_key)["Body"].read().decode().splitlines()
        rows = [json.loads(line) for line in lines]
        correct = sum(1 for row in rows if "predictions" in row
                      and row["predictions"][0]["class_id"] == make_demo.true_label(row["key"]))
        accuracy = correct / len(rows)
        print(f"== demo accuracy (top-1 vs the digit in each key's folder): {correct}/{len(rows)} = {accuracy:.1%}")
        print(f"== run-yarn wall time: {time.time() - started:.1f}s; the local YARN stays up (make yarn-down)")
        return 0 if accuracy >= 0.9 else 1


def main_submit(job_args: list[str]) -> int:
    """``make submit-yarn ARGS='...'``: your job, cluster mode, on the local YARN."""
    local = uses_local_s3(job_args)
    endpoint = next((arg.partition("=")[2] if arg.startswith("--endpoint-url=") else job_args[i + 1]
                     for i, arg in enumerate(job_args)
                     if arg.startswith("--endpoint-url=") or (arg == "--endpoint-url" and i + 1 < len(job_args))),
                    None)
    env = submit_env(local, endpoint)
    code = precheck(job_args, env)  # before the YARN: a usage error starts nothing
    if code != 0:
        print(f"!! refused before submitting (exit {code}): nothing was sent to YARN", file=sys.stderr)
        return code
    yarn_local.up()
    conf = yarn_spark_conf(env=container_env(local, endpoint if local else None))
    properties = yarn_local.STATE / "submit" / "submit-yarn.conf"
    command = submit_command(job_args, conf, properties)
    print("== " + shell_line(command, {"HADOOP_CONF_DIR": env["HADOOP_CONF_DIR"],
                                       "PYSPARK_ARCHIVES_PATH": env["PYSPARK_ARCHIVES_PATH"]}), flush=True)
    print(f"   (the Spark settings, conf/emr.yaml's scaled to the local YARN, are in {properties})", flush=True)
    code, app_id = run_submit(command, env)
    if app_id is not None:
        describe_application(app_id)
    return code


if __name__ == "__main__":
    try:
        sys.exit(main_demo() if sys.argv[1:2] == ["--demo"] else main_submit(sys.argv[1:]))
    except Stopped as stopped:
        sys.exit(128 + stopped.signum)
