"""Score every image under an S3 prefix with an MXNet model on Spark; write top-k to S3.

Run it on a cluster (EMR/YARN) with::

    spark-submit --master yarn --deploy-mode cluster \\
        --conf spark.executor.cores=1 --conf spark.dynamicAllocation.enabled=false \\
        --py-files utils.py,mxinfer.py infer_main.py \\
        --input s3://my-bucket/photos/ \\
        --model s3://my-bucket/models/resnet-18 \\
        --output s3://my-bucket/predictions/photos.jsonl

or with the original article's flags::

    spark-submit --py-files utils.py,mxinfer.py infer_main.py \\
        --sym_url s3://B/resnet-18-symbol.json --param_url s3://B/resnet-18-0000.params \\
        --label_url s3://B/synset.txt --batch 64 --bucket B --prefix cifar10/test \\
        --output_s3_bucket B --output_s3_key predictions.jsonl

The driver lists the keys, pads them to whole batches and runs one Spark
partition per batch; executors (``spark.executor.cores=1``, because MXNet uses
every core of its node itself) download, decode and score their batch
(``mxinfer.score_partition``); the driver checks that every key came back once,
streams the JSON lines to S3 with a multipart upload and writes a summary next
to them. Exit codes: 0 done, 1 failed, 2 usage error, 3 done but more failed
images than ``--max-errors`` allows.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import click
import numpy as np
import yaml

import mxinfer
import utils

log = logging.getLogger("infer_main")

EXIT_FAILED, EXIT_USAGE, EXIT_TOO_MANY_ERRORS = 1, 2, 3

#: Every setting, its default, and what it means; conf/defaults.yaml mirrors this
#: (a test keeps them equal). Command line beats --config YAML beats these.
DEFAULTS: dict[str, Any] = {
    "input": None, "bucket": None, "prefix": "",
    "suffixes": list(mxinfer.DEFAULT_SUFFIXES),
    "model": None, "epoch": 0, "labels": None,
    "sym_url": None, "param_url": None, "label_url": None,
    "data_name": "data", "context": "cpu", "handler": None,
    "output": None, "output_s3_bucket": None, "output_s3_key": None,
    "batch_size": 64, "top_k": 5,
    "input_shape": "3,224,224", "mean": "0", "std": "1", "resize": "stretch",
    "endpoint_url": None, "region": None,
    "limit": None, "dry_run": False,
    "max_errors": "1%", "max_object_bytes": 50 * 1024 * 1024, "max_image_pixels": 64_000_000,
    "io_threads": 16, "max_in_flight": 128, "s3_max_attempts": 5,
    "micro_batch_size": 16, "threads": None,
    "app_name": "mxnet-batch-inference", "log_level": "INFO", "progress_seconds": 15,
    # Speed per dollar (issue 12).
    "decode": "draft", "precision": "fp32", "calibration_images": 256, "min_agreement": 0.99, "int8_exclude": [],
}

REFUSED_SECRETS = ("access_key", "secret_key", "aws_access_key_id", "aws_secret_access_key",
                   "aws_session_token")
SECRETS_MESSAGE = (
    "AWS keys are not accepted as options: they would show in the process list, the Spark UI "
    "and the logs. Credentials come from boto3's default chain: the EMR instance role on a "
    "cluster, or AWS_PROFILE / environment variables / ~/.aws on a laptop."
)


class JobError(Exception):
    """A failure with a message for the user; the job exits 1 with it."""


# ----------------------------------------------------------------------------
# Configuration: read once at the edge into a frozen dataclass


@dataclass(frozen=True)
class JobConfig:
    """The resolved, validated settings of one run."""

    input_bucket: str
    input_prefix: str
    suffixes: tuple
    model: mxinfer.ModelSpec
    output_bucket: str | None
    output_key: str | None
    batch_size: int
    top_k: int
    preprocess: mxinfer.Preprocess
    endpoint_url: str | None
    region: str | None
    limit: int | None
    dry_run: bool
    max_errors: str
    max_object_bytes: int
    io_threads: int
    max_in_flight: int
    s3_max_attempts: int
    app_name: str
    log_level: str
    progress_seconds: float
    #: --handler as given (path or URI), and the local file run_job made of it.
    handler: str | None = None
    handler_file: str | None = None
    micro_batch_size: int | None = None
    threads: int | None = None
    #: fp32 or int8; int8 quantizes once per job (prepare_precision), after an agreement check.
    precision: str = "fp32"
    calibration_images: int = 256
    min_agreement: float = 0.99
    int8_exclude: tuple = ()
    #: The job's int8 checkpoint, local to the driver; made by prepare_precision, not an option.
    int8_model: mxinfer.ModelSpec | None = None

    @property
    def input_uri(self) -> str:
        return f"s3://{self.input_bucket}/{self.input_prefix}"

    @property
    def output_uri(self) -> str | None:
        return f"s3://{self.output_bucket}/{self.output_key}" if self.output_key else None

    @property
    def summary_key(self) -> str:
        return f"{self.output_key}.summary.json"

    def job_spec(self) -> mxinfer.JobSpec:
        return mxinfer.JobSpec(
            model=self.int8_model or self.model, preprocess=self.preprocess, bucket=self.input_bucket,
            batch_size=self.batch_size, top_k=self.top_k, endpoint_url=self.endpoint_url,
            region=self.region, io_threads=self.io_threads, max_in_flight=self.max_in_flight,
            max_object_bytes=self.max_object_bytes, s3_max_attempts=self.s3_max_attempts,
            handler=self.handler_file or self.handler,
            micro_batch_size=self.micro_batch_size, threads=self.threads, precision=self.precision,
        )

    def options(self) -> dict:
        """The settings as plain JSON values, for the summary."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = asdict(value) if hasattr(value, "__dataclass_fields__") else value
        return out


def _numbers(value, name: str, kind=float, count: int | None = None) -> tuple:
    if isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        parts = [p for p in str(value).replace(" ", "").split(",") if p]
    try:
        numbers = tuple(kind(p) for p in parts)
    except (TypeError, ValueError):
        raise click.UsageError(f"{name} must be comma-separated numbers, got {value!r}") from None
    if count is not None and len(numbers) != count:
        raise click.UsageError(f"{name} needs {count} comma-separated values, got {value!r}")
    return numbers


def _positive(settings: dict, name: str, allow_none: bool = False) -> int | None:
    value = settings[name]
    if value is None and allow_none:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise click.UsageError(f"{name} must be a whole number, got {value!r}") from None
    if number < 1:
        raise click.UsageError(f"{name} must be at least 1, got {number}")
    return number


def parse_max_errors(value: str) -> tuple[float, bool]:
    """``"10"`` -> (10, False); ``"2.5%"`` -> (2.5, True)."""
    text = str(value).strip()
    percent = text.endswith("%")
    try:
        number = float(text.rstrip("%"))
    except ValueError:
        raise click.UsageError(f"max_errors must be a count (10) or a percentage (1%), got {value!r}") from None
    if number < 0 or (percent and number > 100):
        raise click.UsageError(f"max_errors out of range: {value!r}")
    return number, percent


def allowed_errors(max_errors: str, keys: int) -> int:
    number, percent = parse_max_errors(max_errors)
    return math.floor(number * keys / 100) if percent else int(number)


def load_yaml(uri: str, endpoint_url: str | None = None, region: str | None = None) -> dict:
    """Read a YAML config from a path or any URI :func:`utils.read_uri` takes (s3:// in cluster mode)."""
    try:
        client = utils.s3_client(endpoint_url, region) if utils.is_s3_uri(uri) else None
        text = utils.read_uri(uri, client).decode("utf-8")
    except (OSError, utils.S3UriError) as exc:
        raise click.UsageError(f"cannot read --config {uri}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - botocore errors: no such bucket, access denied
        raise click.UsageError(f"cannot read --config {uri}: {mxinfer._first_line(exc)}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise click.UsageError(f"--config {uri} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise click.UsageError(f"--config {uri} must be a mapping of option: value")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    secrets = sorted(set(data) & set(REFUSED_SECRETS))
    if secrets:
        raise click.UsageError(f"--config {uri} sets {', '.join(secrets)}. {SECRETS_MESSAGE}")
    unknown = sorted(set(data) - set(DEFAULTS))
    if unknown:
        raise click.UsageError(f"--config {uri} has unknown option(s): {', '.join(unknown)}; "
                               f"known options are those of --help (with _ for -)")
    return data


def merge_settings(cli: dict, yaml_settings: dict) -> dict:
    """Defaults, then YAML, then the options given on the command line."""
    settings = dict(DEFAULTS)
    settings.update(yaml_settings)
    settings.update({k: v for k, v in cli.items() if v is not None})
    return settings


def resolve(settings: dict) -> JobConfig:
    """Validate merged settings into a :class:`JobConfig`; a problem raises ``click.UsageError``."""
    s = settings
    # Input: --input, or the original's --bucket/--prefix.
    if s["input"] and s["bucket"]:
        raise click.UsageError("give either --input s3://BUCKET/PREFIX or --bucket/--prefix, not both")
    if s["input"]:
        try:
            in_bucket, in_prefix = utils.parse_s3_uri(s["input"])
        except utils.S3UriError as exc:
            raise click.UsageError(f"--input: {exc}") from None
    elif s["bucket"]:
        in_bucket, in_prefix = s["bucket"], s["prefix"] or ""
    else:
        raise click.UsageError("no input: give --input s3://BUCKET/PREFIX (or --bucket and --prefix)")

    # Output: --output, or the original's --output_s3_bucket/--output_s3_key (bucket defaults to input's).
    if s["output"] and (s["output_s3_key"] or s["output_s3_bucket"]):
        raise click.UsageError("give either --output s3://BUCKET/KEY or --output_s3_bucket/--output_s3_key")
    out_bucket = out_key = None
    if s["output"]:
        try:
            out_bucket, out_key = utils.parse_s3_uri(s["output"], need_key=True)
        except utils.S3UriError as exc:
            raise click.UsageError(f"--output: {exc}") from None
    elif s["output_s3_key"]:
        out_bucket, out_key = s["output_s3_bucket"] or in_bucket, s["output_s3_key"].lstrip("/")
    elif s["output_s3_bucket"]:
        raise click.UsageError("--output_s3_bucket needs --output_s3_key")
    if out_key is None and not s["dry_run"]:
        raise click.UsageError("no output: give --output s3://BUCKET/KEY (for example predictions.jsonl)")

    # Model: --model prefix, or the original's --sym_url/--param_url.
    if s["model"] and (s["sym_url"] or s["param_url"]):
        raise click.UsageError("give either --model PREFIX or --sym_url and --param_url, not both")
    if s["labels"] and s["label_url"]:
        raise click.UsageError("give either --labels or --label_url, not both")
    try:
        epoch = int(s["epoch"])
    except (TypeError, ValueError):
        raise click.UsageError(f"epoch must be a whole number, got {s['epoch']!r}") from None
    model_kwargs = {
        # "" means no labels at all; None means synset.txt beside the model if it exists.
        "labels_uri": s["labels"] if s["labels"] is not None else s["label_url"], "data_name": str(s["data_name"]),
        "context": str(s["context"]), "endpoint_url": s["endpoint_url"], "region": s["region"],
    }
    try:
        mxinfer.choose_context(str(s["context"]), None, 0, 1)
    except ValueError:
        raise click.UsageError(f"context must be cpu, gpu or gpu:N, got {s['context']!r}") from None
    if s["model"]:
        model = mxinfer.ModelSpec.from_prefix(str(s["model"]), epoch, **model_kwargs)
    elif s["sym_url"] and s["param_url"]:
        model = mxinfer.ModelSpec(str(s["sym_url"]), str(s["param_url"]), **model_kwargs)
    else:
        raise click.UsageError("no model: give --model PREFIX (PREFIX-symbol.json, PREFIX-0000.params) "
                               "or --sym_url and --param_url")

    input_shape = _numbers(s["input_shape"], "input_shape", int, 3)
    mean = _numbers(s["mean"], "mean")
    std = _numbers(s["std"], "std")
    try:
        preprocess = mxinfer.Preprocess(
            input_shape=input_shape, mean=mean, std=std, resize=str(s["resize"]),
            max_image_pixels=_positive(s, "max_image_pixels"), decode=str(s["decode"]),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    suffixes = s["suffixes"]
    if isinstance(suffixes, str):
        suffixes = [x for x in suffixes.replace(" ", "").split(",") if x]
    if not suffixes:
        raise click.UsageError("suffixes is empty: no key could match")
    parse_max_errors(s["max_errors"])
    handler = str(s["handler"]) if s["handler"] else None
    if handler is not None:
        if not handler.endswith(".py"):
            raise click.UsageError(f"handler must be a Python file ending in .py, got {handler!r}")
        if "://" not in handler and not os.path.isfile(handler):
            raise click.UsageError(f"handler {handler}: no such file (in cluster mode give an s3:// URI)")
    if s["precision"] not in mxinfer.PRECISIONS:
        raise click.UsageError(f"precision must be fp32 or int8, got {s['precision']!r}")
    try:
        min_agreement = float(s["min_agreement"])
    except (TypeError, ValueError):
        raise click.UsageError(f"min_agreement must be a number from 0 to 1, got {s['min_agreement']!r}") from None
    if not 0 <= min_agreement <= 1:
        raise click.UsageError(f"min_agreement must be from 0 to 1 (0.99: 99% of top-1 labels), got {min_agreement}")
    if s["precision"] == "int8" and str(s["context"]) != "cpu":
        raise click.UsageError("precision int8 runs on CPUs (oneDNN); use --context cpu, or --precision fp32 on GPUs")
    int8_exclude = s["int8_exclude"] or []
    if isinstance(int8_exclude, str):
        int8_exclude = [x for x in int8_exclude.replace(" ", "").split(",") if x]
    level = str(s["log_level"]).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise click.UsageError(f"log_level must be DEBUG, INFO, WARNING or ERROR, got {s['log_level']!r}")
    return JobConfig(
        input_bucket=in_bucket, input_prefix=in_prefix, suffixes=tuple(suffixes), model=model,
        output_bucket=out_bucket, output_key=out_key,
        batch_size=_positive(s, "batch_size"), top_k=_positive(s, "top_k"), preprocess=preprocess,
        endpoint_url=s["endpoint_url"] or None, region=s["region"] or None,
        limit=_positive(s, "limit", allow_none=True), dry_run=bool(s["dry_run"]),
        max_errors=str(s["max_errors"]), max_object_bytes=_positive(s, "max_object_bytes"),
        io_threads=_positive(s, "io_threads"), max_in_flight=_positive(s, "max_in_flight"),
        s3_max_attempts=_positive(s, "s3_max_attempts"), app_name=str(s["app_name"]),
        log_level=level, progress_seconds=float(s["progress_seconds"]), handler=handler,
        micro_batch_size=_positive(s, "micro_batch_size", allow_none=True),
        threads=_positive(s, "threads", allow_none=True),
        precision=str(s["precision"]), calibration_images=_positive(s, "calibration_images"),
        min_agreement=min_agreement, int8_exclude=tuple(str(x) for x in int8_exclude),
    )


# ----------------------------------------------------------------------------
# Extract: list and plan


def list_images(client, cfg: JobConfig) -> list[tuple[str, int]]:
    """Every image key under the input prefix with its size, sorted, limited."""
    try:
        objects = utils.list_objects(client, cfg.input_bucket, cfg.input_prefix)
        images = sorted(utils.keep_suffixes(objects, cfg.suffixes))
    except Exception as exc:  # NoSuchBucket, AccessDenied, endpoint unreachable
        raise JobError(f"cannot list {cfg.input_uri}: {mxinfer._first_line(exc)}") from exc
    if not images:
        raise JobError(f"no images under {cfg.input_uri} (looked for keys ending in "
                       f"{' '.join(cfg.suffixes)}); check --input and --suffixes")
    return images[: cfg.limit] if cfg.limit else images


def plan_batches(items: list, batch_size: int) -> list:
    """Pad ``items`` with ``None`` to a whole number of batches.

    ``sc.parallelize(padded, len(padded) // batch_size)`` then puts exactly one
    batch in each partition; the ``None`` slots download nothing and yield
    nothing, so padding never reaches the output.
    """
    batches = math.ceil(len(items) / batch_size)
    return list(items) + [None] * (batches * batch_size - len(items))


# ----------------------------------------------------------------------------
# Transform: the Spark job


def run_spark(cfg: JobConfig, padded: list, spark_conf: dict | None = None) -> list[tuple]:
    """Run one partition per batch on the cluster; return each partition's result."""
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAppName(cfg.app_name)
    for key, value in (spark_conf or {}).items():
        conf.set(key, value)
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("WARN")
    batches = len(padded) // cfg.batch_size
    log.info("Spark %s, master %s, app %s: %d partitions", sc.version, sc.master, sc.applicationId, batches)
    rdd = sc.parallelize(padded, batches)
    job = replace(cfg.job_spec(), thread_plan=thread_plan(sc))
    if job.handler:
        sc.addFile(job.handler)  # executors load their copy by name (mxinfer.get_handlers)
    for path in job.model.shipped_files():  # the int8 checkpoint: read by name (mxinfer.ModelSpec.read)
        sc.addFile(path)
    score = functools.partial(mxinfer.score_partition, job=job)
    stop = threading.Event()
    reporter = threading.Thread(target=_report_progress, args=(sc, batches, cfg.batch_size,
                                                               cfg.progress_seconds, stop), daemon=True)
    reporter.start()
    try:
        return rdd.mapPartitionsWithIndex(score).collect()
    except Exception as exc:
        raise JobError(f"the Spark job failed: {spark_failure_reason(exc)}") from exc
    finally:
        stop.set()
        # Results are on the driver now; release the executors before the
        # upload rather than letting the JVM's shutdown race them.
        sc.stop()


def expected_executors(conf: dict) -> int | None:
    """Executors the cluster will start: ``local-cluster[N,...]``'s N, else ``spark.executor.instances``.

    ``None`` with dynamic allocation, or when nothing says (standalone, Kubernetes).
    """
    master = conf.get("spark.master", "")
    if master.startswith("local-cluster["):
        return int(master[len("local-cluster["):].split(",")[0])
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).lower() == "true":
        return None
    instances = conf.get("spark.executor.instances")
    return int(instances) if instances and str(instances).isdigit() else None


def executor_hosts(sc) -> list[str]:
    """The host of each registered executor (not the driver), from the SparkContext's JVM."""
    jsc = sc._jsc.sc()
    driver = jsc.env().blockManager().blockManagerId()
    return [info.host() for info in jsc.statusTracker().getExecutorInfos()
            if (info.host(), info.port()) != (driver.host(), driver.port())]


def thread_plan(sc, wait_seconds: float = 30.0) -> mxinfer.ThreadPlan | None:
    """What the workers need to size their threads (:func:`mxinfer.worker_threads`).

    Executors register a few seconds after the SparkContext starts; this waits
    (up to ``wait_seconds``) for the expected number, or for the first one if
    the number is unknown, so two executors on one host do not both take
    every core.
    """
    conf = dict(sc.getConf().getAll())
    wanted = expected_executors(conf)
    deadline = time.monotonic() + wait_seconds
    try:
        hosts = executor_hosts(sc)
        while len(hosts) < (wanted or 1) and time.monotonic() < deadline:
            time.sleep(0.25)
            hosts = executor_hosts(sc)
    except Exception as exc:  # noqa: BLE001 - a JVM API that changed must not stop the job
        log.warning("cannot list the executors (%s); workers size their threads without them: set --threads "
                    "if the summary warns", mxinfer._first_line(exc))
        return None
    return plan_threads(conf, hosts)


def plan_threads(conf: dict, hosts: list[str]) -> mxinfer.ThreadPlan:
    """The :class:`mxinfer.ThreadPlan` for a Spark conf and the executors' hosts (pure)."""
    master = conf.get("spark.master", "")
    cores = conf.get("spark.executor.cores")
    if cores is None and master.startswith("local-cluster["):
        cores = master[len("local-cluster["):].split(",")[1]
    tasks = max(1, int(cores or 1) // max(1, int(conf.get("spark.task.cpus", 1))))
    counts: dict[str, int] = {}
    for host in hosts:
        counts[host] = counts.get(host, 0) + 1
    return mxinfer.ThreadPlan(omp_from_user="spark.executorEnv.OMP_NUM_THREADS" in conf,
                              executors_by_host=tuple(sorted(counts.items())), tasks_per_executor=tasks)


def _report_progress(sc, batches: int, batch_size: int, every: float, stop: threading.Event) -> None:
    """Log finished batches and throughput while the job runs, so users can see it move."""
    started = time.time()
    tracker = sc.statusTracker()
    while not stop.wait(every):
        done = 0
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                done += info.numCompletedTasks
        if done:
            elapsed = time.time() - started
            log.info("progress: %d of %d batches done (%.0f%%), about %.1f images/s",
                     done, batches, 100.0 * done / batches, done * batch_size / elapsed)


def spark_failure_reason(exc: BaseException) -> str:
    """The Python exception line inside a Py4J error, not 200 lines of JVM stack."""
    text = str(exc)
    python_lines = [line.strip() for line in text.splitlines()
                    if line.strip() and ("Error:" in line or "Exception:" in line)
                    and not line.strip().startswith(("at ", "py4j", "org.apache", "Caused by: org.apache"))]
    if python_lines:
        return python_lines[-1][:1000]
    return mxinfer._first_line(exc)[:1000]


# ----------------------------------------------------------------------------
# Load: check, stream out, summarise


def iter_checked_lines(results: list[tuple], padded: list, batch_size: int):
    """Yield ``(line, failed)`` for every output line in key order, checking one line per key.

    Partitions are matched to their batch by index and lines to keys by key,
    never by position, so a retried or reordered task cannot shift a result.
    """
    by_index = {index: (count, blob, stats) for index, count, blob, stats in results}
    batches = len(padded) // batch_size
    if sorted(by_index) != list(range(batches)):
        raise JobError(f"expected results for {batches} batches, got {len(by_index)}")
    for index in range(batches):
        count, blob, _ = by_index[index]
        expected = sorted(key for key, _ in filter(None, padded[index * batch_size: (index + 1) * batch_size]))
        lines = zlib.decompress(blob).decode("utf-8").split("\n") if count else []
        parsed = [json.loads(line) for line in lines]
        got = [obj["key"] for obj in parsed]
        if got != expected:
            missing = sorted(set(expected) - set(got))[:3]
            extra = sorted(set(got) - set(expected))[:3]
            raise JobError(f"batch {index}: {len(got)} lines for {len(expected)} keys "
                           f"(missing {missing}, unexpected {extra})")
        for line, obj in zip(lines, parsed):
            yield line, "error" in obj


def write_output(cfg: JobConfig, writer: utils.MultipartWriter, results, padded) -> dict:
    """Stream the checked lines into ``writer``; return counts of predicted and failed keys."""
    predicted = failed = 0
    chunk: list[str] = []
    for line, is_error in iter_checked_lines(results, padded, cfg.batch_size):
        failed += is_error
        predicted += not is_error
        chunk.append(line)
        if len(chunk) >= 10_000:
            writer.write(("\n".join(chunk) + "\n").encode("utf-8"))
            chunk.clear()
    if chunk:
        writer.write(("\n".join(chunk) + "\n").encode("utf-8"))
    return {"predicted": predicted, "failed": failed}


def summarize(cfg: JobConfig, images: int, batches: int, results: list, counts: dict,
              elapsed: float, model_summary: dict, upload_seconds: float) -> dict:
    stats = [r[3] for r in results]
    stages = ("download", "decode", "forward", "wait", "task", "cpu")
    executors: dict[str, dict] = {}
    for s in stats:
        e = executors.setdefault(s["executor"], {"batches": 0, "images": 0, **{k: 0.0 for k in stages}})
        e["batches"] += 1
        e["images"] += s["keys"]
        for k in stages:
            e[k] = round(e[k] + s["seconds"].get(k, 0.0), 3)
    workers: dict[str, dict] = {}
    for s in sorted(stats, key=lambda s: s.get("worker_task", 0)):
        w = workers.setdefault(f"{s['executor']}/{s['worker_pid']}", {"batches": 0, "model_loads": 0})
        w["batches"] += 1
        w["model_loads"] = max(w["model_loads"], s["model_loads"])
        if "worker_task" not in s:
            continue
        w["threads"] = s["threads"]
        if w["batches"] == 1:  # includes loading the model: steady state starts after it
            w["first_task"] = {"started": s["started"], "ended": s["ended"], "images": s["keys"]}
        # In tasks, and idle between them (Spark handing over the next task).
        w["task_seconds"] = round(w.get("task_seconds", 0.0) + s["ended"] - s["started"], 3)
        w["idle_between_tasks_seconds"] = round(s["ended"] - w["first_task"]["started"] - w["task_seconds"], 3)
        memory = s["memory"]
        if memory["max_rss"]:
            w["max_rss_bytes"] = max(w.get("max_rss_bytes", 0), memory["max_rss"])
        # Resident memory after the worker's 1st, 2nd, 5th, 10th, 20th, ... task and its last:
        # flat once warm, or it leaks.
        after = w.setdefault("rss_bytes_after_task", {})
        if memory["rss"] is not None:
            if str(s["worker_task"]).strip("0") in ("1", "2", "5"):
                after[str(s["worker_task"])] = memory["rss"]
            after["last"] = memory["rss"]
    # Throughput while tasks ran: from the first task's start to the last one's end
    # (elapsed_seconds also counts listing, Spark start-up and the upload).
    starts = [s["started"] for s in stats if "started" in s]
    ends = [s["ended"] for s in stats if "ended" in s]
    task_window = max(ends) - min(starts) if starts and ends else None
    errors_by_stage = {stage: sum(s["errors"][stage] for s in stats) for stage in ("download", "decode", "predict")}
    return {
        "input": cfg.input_uri, "output": cfg.output_uri,
        "keys_listed": images, "predicted": counts["predicted"], "failed": counts["failed"],
        "errors_by_stage": errors_by_stage, "batches": batches, "batch_size": cfg.batch_size,
        "elapsed_seconds": round(elapsed, 3),
        "images_per_second": round(images / elapsed, 2) if elapsed > 0 else None,
        "seconds": {**{k: round(sum(e[k] for e in executors.values()), 3) for k in stages},
                    "upload": round(upload_seconds, 3)},
        "executors": executors,
        "s3_retries": {"request": sum(s["s3_retries"]["request"] for s in stats),
                       "body": sum(s["s3_retries"]["body"] for s in stats)},
        "python_workers": workers,
        "tasks": {"first_start": min(starts) if starts else None, "last_end": max(ends) if ends else None,
                  "seconds": round(task_window, 3) if task_window else None,
                  "images_per_second": round(images / task_window, 2) if task_window else None},
        "driver_max_rss_bytes": mxinfer.memory_bytes()["max_rss"],
        # Batches whose result came from a retried task (lost worker or executor, ...).
        "retried_batches": sum(1 for s in stats if s.get("attempt", 0) > 0),
        "model": {"symbol": cfg.model.symbol_uri, "params": cfg.model.params_uri,
                  "labels": cfg.model.labels_uri, **model_summary},
        "options": cfg.options(),
        "threads": thread_fit(stats),
    }


def thread_fit(stats: list[dict]) -> dict:
    """Per host: its cores, executors, MXNet threads in all, and a warning when threads x executors differ from the cores.

    The executors are those that ran tasks, or as many as the driver's plan
    put on the host if more (an executor may get no task in a small job).
    Assumes one task at a time per executor (``spark.executor.cores=1``, the
    job's shape); an executor's threads are the most any of its workers used.
    """
    hosts: dict[str, dict] = {}
    for s in stats:
        share = s.get("host") or {}
        if s.get("threads") is None or share.get("cores") is None:
            continue
        host = s["executor"].rsplit("/", 1)[0]
        h = hosts.setdefault(host, {"cores": share["cores"], "planned": 0, "executors": {}})
        h["planned"] = max(h["planned"], share.get("workers") or 0)
        h["executors"][s["executor"]] = max(h["executors"].get(s["executor"], 0), s["threads"])
    out: dict[str, Any] = {"hosts": {}, "warnings": []}
    for host, h in sorted(hosts.items()):
        executors = max(len(h["executors"]), h["planned"])
        total = max(h["executors"].values()) * executors
        out["hosts"][host] = {"cores": h["cores"], "executors": executors, "threads": total}
        if total != h["cores"]:
            out["warnings"].append(
                f"host {host}: {executors} executor(s) x {max(h['executors'].values())} MXNet threads = {total} "
                f"on {h['cores']} cores ({'cores left idle' if total < h['cores'] else 'threads wait for cores'}); "
                f"leave --threads and spark.executorEnv.OMP_NUM_THREADS unset to fit the node, or set them "
                f"to cores / executors per host")
    return out


def run_job(cfg: JobConfig, spark_conf: dict | None = None) -> int:
    """List, plan, check the model, score on Spark, upload; return the exit code."""
    started = time.time()
    client = utils.s3_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts)
    cfg = prepare_handler(cfg, client)
    images = list_images(client, cfg)
    padded = plan_batches(images, cfg.batch_size)
    batches = len(padded) // cfg.batch_size
    log.info("%d images under %s: %d batches of %d (%d padding slots)",
             len(images), cfg.input_uri, batches, cfg.batch_size, len(padded) - len(images))
    # Load the model here first: a bad checkpoint, shape or labels file fails
    # now, with its cause, instead of in every task after the cluster spun up.
    classifier = load_model_on_driver(cfg)
    summary_model = classifier.model_summary()
    if isinstance(classifier, mxinfer.Classifier) and cfg.top_k > classifier.num_classes:
        raise JobError(f"--top-k {cfg.top_k} is larger than the model's {classifier.num_classes} classes")
    cfg, precision = prepare_precision(cfg, client, images, classifier)
    if cfg.dry_run:
        return dry_run(cfg, images, padded, classifier)
    try:
        writer = utils.MultipartWriter(client, cfg.output_bucket, cfg.output_key)
    except Exception as exc:
        raise JobError(f"cannot write {cfg.output_uri}: {mxinfer._first_line(exc)}; the job needs "
                       "s3:PutObject on the output key") from exc
    try:
        results = run_spark(cfg, padded, spark_conf)
        upload_started = time.time()
        counts = write_output(cfg, writer, results, padded)
        writer.close()
    except BaseException:
        writer.abort()
        raise
    upload_seconds = time.time() - upload_started
    elapsed = time.time() - started
    summary = summarize(cfg, len(images), batches, results, counts, elapsed, summary_model, upload_seconds)
    summary["precision"] = precision
    utils.put_text(client, cfg.output_bucket, cfg.summary_key, json.dumps(summary, indent=2) + "\n")
    for warning in summary["threads"]["warnings"]:
        log.warning("%s", warning)
    log.info("summary: %s", json.dumps({k: summary[k] for k in (
        "keys_listed", "predicted", "failed", "batches", "elapsed_seconds", "images_per_second")}))
    log.info("wrote %s and s3://%s/%s", cfg.output_uri, cfg.output_bucket, cfg.summary_key)
    limit = allowed_errors(cfg.max_errors, len(images))
    if counts["failed"] > limit:
        log.error("%d images failed, more than --max-errors %s allows (%d); see the error lines in %s",
                  counts["failed"], cfg.max_errors, limit, cfg.output_uri)
        return EXIT_TOO_MANY_ERRORS
    return 0


def prepare_handler(cfg: JobConfig, client) -> JobConfig:
    """Check --handler on the driver, downloading a URI first; return ``cfg`` with its local file.

    A handler that is missing, fails to import or defines neither function
    stops the run here, before any listing or Spark work.
    """
    if not cfg.handler:
        return cfg
    path = cfg.handler
    if "://" in path:
        try:
            data = utils.read_uri(path, client if utils.is_s3_uri(path) else None)
        except Exception as exc:
            raise JobError(f"cannot read --handler {path}: {mxinfer._first_line(exc)}") from exc
        folder = tempfile.mkdtemp(prefix="mxinfer-handler-")
        # Kept until the driver exits: executors fetch it from the driver while the job runs.
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = os.path.join(folder, path.rsplit("/", 1)[-1])
        with open(path, "wb") as handle:
            handle.write(data)
    try:
        handlers = mxinfer.get_handlers(path)
    except mxinfer.HandlerError as exc:
        raise JobError(f"--handler: {exc}") from exc
    log.info("handler %s defines %s", cfg.handler, " and ".join(
        name for name in ("input_handler", "output_handler") if getattr(handlers, name) is not None))
    return replace(cfg, handler_file=path)


def sample_keys(images: list, count: int) -> tuple[list, list]:
    """The int8 samples: ``(calibration, held_out)``, each up to ``count`` keys of the sorted listing.

    ``2 * count`` keys evenly spaced over the whole listing (the ``i * n //
    (2 * count)``-th of ``n``), so they span every folder and date; the even
    ones calibrate, the odd ones are held out to check agreement, so no image
    does both. A job of one image uses it for both.
    """
    n = min(2 * count, len(images))
    picked = [images[i * len(images) // n] for i in range(n)]
    calibration, held_out = picked[0::2], picked[1::2]
    return calibration, held_out or calibration


def sample_arrays(cfg: JobConfig, client, items: list) -> np.ndarray:
    """Download and decode ``items`` as the executors do; images that fail are left out (they fail in the job too)."""
    handlers = mxinfer.get_handlers(cfg.handler_file or cfg.handler)

    def one(item):
        key, _ = item
        try:
            data = utils.read_object(client, cfg.input_bucket, key)
            if handlers is not None and handlers.input_handler is not None:
                return handlers.decode(key, data, cfg.preprocess.input_shape)
            return mxinfer.decode_image(data, cfg.preprocess)
        except Exception as exc:  # noqa: BLE001 - the job records it as this key's error line
            log.debug("int8 sample: %s left out: %s", key, mxinfer._first_line(exc))
            return None

    with ThreadPoolExecutor(cfg.io_threads) as pool:
        arrays = [a for a in pool.map(one, items) if a is not None]
    return np.stack(arrays) if arrays else np.zeros((0, *cfg.preprocess.input_shape), np.float32)


def prepare_precision(cfg: JobConfig, client, images: list, classifier: mxinfer.Predictor) -> tuple[JobConfig, dict]:
    """For ``--precision int8``: quantize on the driver, check agreement, return ``cfg`` with the int8 model.

    The driver quantizes once (:func:`mxinfer.quantize_int8`), calibrated on
    :func:`sample_keys`' calibration images, and scores the held-out ones in
    fp32 and int8. Below ``--min-agreement`` the job refuses (``JobError``)
    with the figures and what to try; otherwise the executors get the int8
    checkpoint through ``SparkContext.addFile`` and load it through the same
    per-worker cache. Returns the summary's ``precision`` entry.
    """
    if cfg.precision == "fp32":
        return cfg, {"precision": "fp32"}
    if not isinstance(classifier, mxinfer.Classifier):
        raise JobError("--precision int8 checks that int8 and fp32 agree on the top-1 class, so it needs a "
                       "classifier; with an output_handler use --precision fp32")
    started = time.time()
    calibration_keys, held_out_keys = sample_keys(images, cfg.calibration_images)
    calibration = sample_arrays(cfg, client, calibration_keys)
    held_out = sample_arrays(cfg, client, held_out_keys)
    if not len(calibration) or not len(held_out):
        raise JobError(f"--precision int8: none of the {len(calibration_keys) + len(held_out_keys)} sampled "
                       f"images could be read and decoded; check the input, or use --precision fp32")
    try:
        symbol_json = cfg.model.read(cfg.model.symbol_uri).decode("utf-8")
        exclude = mxinfer.int8_excluded(symbol_json, cfg.int8_exclude)
    except mxinfer.ModelError as exc:
        raise JobError(str(exc)) from exc
    folder = tempfile.mkdtemp(prefix="mxinfer-int8-")
    # Kept until the driver exits: executors fetch the files from the driver while the job runs.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    forward_batch = cfg.job_spec().forward_batch
    try:
        spec = mxinfer.quantize_int8(cfg.model, cfg.preprocess.input_shape, calibration,
                                     os.path.join(folder, "model-int8"), exclude, forward_batch)
    except Exception as exc:  # MXNetError from the quantization pass or the calibration run
        raise JobError(f"cannot quantize the model to int8: {mxinfer._first_line(exc)}; keep the layer it names "
                       f"in fp32 with --int8-exclude, or use --precision fp32") from exc
    labels_uri = ""
    if classifier.labels:
        labels_uri = os.path.join(folder, "synset.txt")
        with open(labels_uri, "w", encoding="utf-8") as handle:
            handle.write("\n".join(classifier.labels) + "\n")
    spec = replace(spec, labels_uri=labels_uri, context=cfg.model.context)
    int8 = mxinfer.Classifier(spec, cfg.preprocess.input_shape, forward_batch, context="cpu")
    figures = mxinfer.agreement(classifier.probabilities(held_out), int8.probabilities(held_out))
    layers = mxinfer.weight_layers(symbol_json)
    report = {"precision": "int8", **figures, "min_agreement": cfg.min_agreement,
              "calibration_images": len(calibration), "excluded_layers": exclude,
              "quantize_seconds": round(time.time() - started, 2)}
    log.info("int8: top-1 agreement with fp32 %.2f%% on %d held-out images, largest probability difference "
             "%.4f (calibrated on %d images, %d layer(s) kept in fp32, %.1fs)",
             100 * figures["top1_agreement"], figures["images"], figures["max_probability_difference"],
             len(calibration), len(exclude), report["quantize_seconds"])
    if figures["top1_agreement"] < cfg.min_agreement:
        raise JobError(
            f"int8 agrees with fp32 on only {figures['top1_agreement']:.2%} of top-1 classes "
            f"({figures['images']} held-out images; largest probability difference "
            f"{figures['max_probability_difference']:.4f}), under --min-agreement {cfg.min_agreement}. "
            f"Nothing was scored. Try keeping layers in fp32 with --int8-exclude (the first and last are "
            f"{layers[0] if layers else '?'} and {layers[-1] if layers else '?'}; patterns such as '*conv*' work), "
            f"more --calibration-images (now {cfg.calibration_images}), or --precision fp32")
    return replace(cfg, int8_model=spec), report


def load_model_on_driver(cfg: JobConfig) -> mxinfer.Predictor:
    """The model, loaded on the driver's CPU (the driver need not have a GPU) to check it."""
    kind = mxinfer.model_class(mxinfer.get_handlers(cfg.handler_file or cfg.handler))
    try:
        # Bound as the executors bind it (at the micro-batch), so the check costs the driver no more memory.
        return kind(cfg.model, cfg.preprocess.input_shape, cfg.job_spec().forward_batch, context="cpu")
    except mxinfer.ModelError as exc:
        raise JobError(f"model: {exc}") from exc
    except FileNotFoundError as exc:
        raise JobError(f"model file missing: {exc}") from exc
    except Exception as exc:
        raise JobError(f"cannot load the model ({cfg.model.symbol_uri}): {mxinfer._first_line(exc)}") from exc


def dry_run(cfg: JobConfig, images: list, padded: list, classifier: mxinfer.Classifier) -> int:
    """Print the plan and one scored image (on the driver's CPU); start no Spark job."""
    job = cfg.job_spec()
    job = replace(job, model=replace(job.model, context="cpu"))
    [(_, _, blob, stats)] = mxinfer.score_partition(0, images[:1], job)
    plan = {
        "input": cfg.input_uri, "output": cfg.output_uri, "images": len(images),
        "batch_size": cfg.batch_size, "batches": len(padded) // cfg.batch_size,
        "partitions": len(padded) // cfg.batch_size, "padding_slots": len(padded) - len(images),
        "first_key": images[0][0], "last_key": images[-1][0],
        "model": classifier.model_summary(),
        "sample": json.loads(zlib.decompress(blob).decode("utf-8")),
        "sample_seconds": stats["seconds"],
    }
    click.echo(json.dumps(plan, indent=2, ensure_ascii=False))
    return 0


# ----------------------------------------------------------------------------
# The command line


def _refuse_secret(ctx, param, value):
    if value is not None:
        raise click.BadParameter(SECRETS_MESSAGE, ctx=ctx, param=param)
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "config_uri", metavar="URI", help="YAML file of options (path or s3://); the command line overrides it.")
@click.option("--input", metavar="s3://BUCKET/PREFIX", help="Where the images are.")
@click.option("--bucket", help="Input bucket (the original's flag; use with --prefix).")
@click.option("--prefix", help="Input key prefix (the original's flag).")
@click.option("--suffixes", help="Comma-separated image suffixes, case-insensitive. [default: .jpg,.jpeg,.png,.gif,.bmp,.tif,.tiff,.webp]")
@click.option("--model", metavar="URI", help="Checkpoint prefix: URI-symbol.json and URI-%04d.params.")
@click.option("--epoch", type=int, help="Checkpoint epoch in the params file name. [default: 0]")
@click.option("--labels", metavar="URI", help="Labels file, one per class. [default: synset.txt beside the model, if any]")
@click.option("--sym_url", "--sym-url", "sym_url", metavar="URI", help="Symbol JSON (the original's flag).")
@click.option("--param_url", "--param-url", "param_url", metavar="URI", help="Params file (the original's flag).")
@click.option("--label_url", "--label-url", "label_url", metavar="URI", help="Labels file (the original's flag).")
@click.option("--data-name", help="Name of the model's input. [default: data]")
@click.option("--context", help="cpu, gpu (the GPU Spark assigned to the task, else partition modulo GPUs) or gpu:N. [default: cpu]")
@click.option("--handler", metavar="URI", help="Python file (path or s3://) defining input_handler(key, data) and/or output_handler(key, outputs).")
@click.option("--output", metavar="s3://BUCKET/KEY", help="JSON Lines output object; the summary goes to KEY.summary.json.")
@click.option("--output_s3_bucket", "--output-s3-bucket", "output_s3_bucket", help="Output bucket (the original's flag). [default: the input bucket]")
@click.option("--output_s3_key", "--output-s3-key", "output_s3_key", help="Output key (the original's flag).")
@click.option("--batch-size", "--batch", "batch_size", type=int, help="Images per batch and per partition. [default: 64]")
@click.option("--top-k", type=int, help="Predictions per image. [default: 5]")
@click.option("--input-shape", metavar="C,H,W", help="Model input shape. [default: 3,224,224]")
@click.option("--mean", metavar="R,G,B", help="Subtracted from 0-255 pixel values, per channel or one for all. [default: 0]")
@click.option("--std", metavar="R,G,B", help="Divides after the mean, per channel or one for all. [default: 1]")
@click.option("--resize", type=click.Choice(mxinfer.RESIZE_MODES), help="stretch to H x W, or short side to H*256/224 then centre crop. [default: stretch]")
@click.option("--endpoint-url", metavar="URL", help="S3-compatible endpoint (moto, MinIO); executors use it too.")
@click.option("--region", help="AWS region of the buckets. [default: boto3's]")
@click.option("--limit", type=int, help="Score only the first N keys (sorted).")
@click.option("--dry-run", is_flag=True, default=None, help="List, plan, load the model, score one image; no Spark job.")
@click.option("--max-errors", metavar="N|P%", help="Exit 3 if more images than this fail (still writing all output). [default: 1%]")
@click.option("--max-object-bytes", type=int, help="Larger objects become error lines, undownloaded. [default: 52428800]")
@click.option("--max-image-pixels", type=int, help="Larger images become error lines, undecoded. [default: 64000000]")
@click.option("--io-threads", type=int, help="Download and decode threads per executor. [default: 16]")
@click.option("--max-in-flight", type=int, help="Images downloaded or decoded ahead of the model, per executor. [default: 128]")
@click.option("--micro-batch-size", type=int, help="Images per forward pass (the module's bound batch), at most --batch-size: the model starts on the first ones while the rest download. [default: 16]")
@click.option("--threads", type=int, help="MXNet/OpenMP threads per executor. [default: spark.executorEnv.OMP_NUM_THREADS if set, else the host's cores divided among its executors]")
@click.option("--s3-max-attempts", type=int, help="Attempts per S3 request (botocore standard retries). [default: 5]")
@click.option("--app-name", help="Spark application name. [default: mxnet-batch-inference]")
@click.option("--log-level", help="DEBUG, INFO, WARNING or ERROR. [default: INFO]")
@click.option("--progress-seconds", type=float, help="Seconds between progress lines. [default: 15]")
# --- speed per dollar (issue 12)
@click.option("--decode", type=click.Choice(mxinfer.DECODE_MODES), help="draft: a JPEG at least twice the model's size is decoded at 1/2, 1/4 or 1/8 scale (DCT scaling), then resized; exact: every pixel. [default: draft]")
@click.option("--precision", type=click.Choice(mxinfer.PRECISIONS), help="int8: quantize the model once (oneDNN), calibrated on the job's own images, and run only if it agrees with fp32 (--min-agreement). [default: fp32]")
@click.option("--calibration-images", type=int, help="int8: images to calibrate on, and as many held out to check agreement; evenly spaced over the sorted listing. [default: 256]")
@click.option("--min-agreement", type=float, help="int8: the share of held-out images whose top-1 class must match fp32's, or the job refuses to run. [default: 0.99]")
@click.option("--int8-exclude", metavar="LAYER,...", help="int8: layers (names or shell patterns, e.g. '*conv0*') kept in fp32. [default: none]")
# --- end speed per dollar
@click.option("--access_key", "--access-key", "access_key", hidden=True, expose_value=False, callback=_refuse_secret)
@click.option("--secret_key", "--secret-key", "secret_key", hidden=True, expose_value=False, callback=_refuse_secret)
def main(config_uri, **cli):
    """Score every image under an S3 prefix with an MXNet model; write top-k JSON Lines to S3.

    Credentials come from boto3's default chain (the instance role on EMR);
    no option takes AWS keys.
    """
    yaml_settings = load_yaml(config_uri, cli.get("endpoint_url"), cli.get("region")) if config_uri else {}
    cfg = resolve(merge_settings(cli, yaml_settings))
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    try:
        code = run_job(cfg)
    except JobError as exc:
        log.error("%s", exc)
        click.echo(f"Error: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    sys.exit(code)


if __name__ == "__main__":
    main()
