"""Score every image under an S3 prefix with an MXNet model on Spark; write top-k to S3.

Run it on a cluster (EMR/YARN) with::

    spark-submit --master yarn --deploy-mode cluster \\
        --conf spark.executor.cores=1 --conf spark.dynamicAllocation.enabled=false \\
        --py-files utils.py,mxinfer.py,listing.py,manifest.py infer_main.py \\
        --input s3://my-bucket/photos/ \\
        --model s3://my-bucket/models/resnet-18 \\
        --output s3://my-bucket/predictions/photos.jsonl

or with the original article's flags::

    spark-submit --py-files utils.py,mxinfer.py,listing.py,manifest.py infer_main.py \\
        --sym_url s3://B/resnet-18-symbol.json --param_url s3://B/resnet-18-0000.params \\
        --label_url s3://B/synset.txt --batch 64 --bucket B --prefix cifar10/test \\
        --output_s3_bucket B --output_s3_key predictions.jsonl

The driver lists the keys (an Arrow :class:`listing.Listing`), writes the
run's plan (whole batches, the last one short) to the work prefix beside the
output, and runs one Spark partition per batch; executors
(``spark.executor.cores=1``: MXNet uses the node's cores itself) read their
batch's keys from the plan, download, decode and score them and write their
lines to S3 (``mxinfer.score_partition``); the driver then merges every line
into the output in key order, each key once (``durable.assemble``), and writes
a summary next to it. Exit codes: 0 done, 1 failed, 2 usage error, 3 done but more failed
images than ``--max-errors`` allows.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import click
import numpy as np
import yaml
from click.core import ParameterSource

import durable
import listing
import manifest
import mxinfer
import utils

log = logging.getLogger("infer_main")

EXIT_FAILED, EXIT_USAGE, EXIT_TOO_MANY_ERRORS = 1, 2, 3

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

    #: None until the manifest names it (run_job sets it from the listing).
    input_bucket: str | None
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
    s3_reader: str
    app_name: str
    log_level: str
    progress_seconds: float
    #: --handler as given (path or URI), and the local file run_job made of it.
    handler: str | None = None
    handler_file: str | None = None
    micro_batch_size: int | None = None
    threads: int | None = None
    #: --input-manifest: the keys come from this file instead of a listing.
    input_manifest: str | None = None
    list_concurrency: int = 16
    resume: bool = False
    overwrite: bool = False
    #: jsonl or parquet (see :func:`durable.output_format`).
    output_format: str = "jsonl"
    #: fp32 or int8; int8 quantizes once per job (prepare_precision), after an agreement check.
    precision: str = "fp32"
    calibration_images: int = 256
    min_agreement: float = 0.99
    int8_exclude: tuple = ()
    #: The job's int8 checkpoint, local to the driver; made by prepare_precision, not an option.
    int8_model: mxinfer.ModelSpec | None = None

    @property
    def input_uri(self) -> str:
        if self.input_manifest:
            return self.input_manifest
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
            s3_reader=self.s3_reader, handler=self.handler_file or self.handler,
            micro_batch_size=self.micro_batch_size, threads=self.threads, precision=self.precision,
        )

    def options(self) -> dict:
        """The settings as plain JSON values, for the summary."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = asdict(value) if hasattr(value, "__dataclass_fields__") else value
        return out


# ----------------------------------------------------------------------------
# Option types: the command line and the YAML layer convert through the same
# ones (merge_settings), so a value means the same and fails the same in both.


class WholeNumber(click.IntRange):
    """``click.IntRange`` that refuses a non-whole number instead of cutting it.

    click's own ``INT`` calls ``int(8.9)`` and gets 8; a YAML ``batch_size: 8.9``
    or ``top_k: 2.7`` must be refused, not silently changed. ``True`` is no
    number either, though Python says ``int(True) == 1``.
    """

    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            self.fail(f"{value!r} is not a whole number", param, ctx)
        return super().convert(value, param, ctx)


class FiniteNumber(click.FloatRange):
    """``click.FloatRange`` that refuses booleans, NaN and infinities."""

    def convert(self, value, param, ctx):
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class NumberList(click.ParamType):
    """Comma-separated numbers, or a YAML list, to a tuple: ``"3,224,224"`` -> ``(3, 224, 224)``.

    Parameters
    ----------
    kind : {int, float}
        Whole numbers at least 1 (``int``), or any finite numbers (``float``).
    count : int, optional
        The exact number of values.
    nonzero : bool
        Refuse zeros (a divisor).
    """

    name = "numbers"

    def __init__(self, kind: type = float, count: int | None = None, nonzero: bool = False):
        self.kind, self.count, self.nonzero = kind, count, nonzero
        self._element = WholeNumber(min=1) if kind is int else FiniteNumber()

    def convert(self, value, param, ctx):
        if isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            parts = [p for p in str(value).replace(" ", "").split(",") if p]
        what = "whole numbers of at least 1" if self.kind is int else "numbers"
        try:
            numbers = tuple(self._element.convert(p, None, None) for p in parts)
        except click.BadParameter:
            self.fail(f"needs comma-separated {what}, got {value!r}", param, ctx)
        if self.count is not None and len(numbers) != self.count:
            self.fail(f"needs {self.count} comma-separated {what}, got {value!r}", param, ctx)
        if not numbers:
            self.fail("needs at least one number", param, ctx)
        if self.nonzero and any(n == 0 for n in numbers):
            self.fail(f"values must be non-zero, got {value!r}", param, ctx)
        return numbers


class Suffixes(click.ParamType):
    """Comma-separated key suffixes, or a YAML list, to a tuple of strings."""

    name = "suffixes"

    def convert(self, value, param, ctx):
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        suffixes = tuple(s for s in (str(x).strip() for x in items) if s)
        if not suffixes:
            self.fail("no suffix given, so no key could match; give some, such as .jpg,.png", param, ctx)
        return suffixes


class Names(click.ParamType):
    """Comma-separated names, or a YAML list, to a tuple of strings; empty is allowed."""

    name = "names"

    def convert(self, value, param, ctx):
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        return tuple(s for s in (str(x).strip() for x in items) if s)


class MaxErrors(click.ParamType):
    """A count (``10``) or a percentage (``1%``) of the listed keys, kept as text."""

    name = "N|P%"

    def convert(self, value, param, ctx):
        try:
            parse_max_errors(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return str(value).strip()


class DeviceContext(click.ParamType):
    """``cpu``, ``gpu`` or ``gpu:N``, checked by the grammar the executors use."""

    name = "context"

    def convert(self, value, param, ctx):
        try:
            mxinfer.choose_context(str(value), None, 0, 1)
        except ValueError:
            self.fail(f"must be cpu, gpu or gpu:N, got {value!r}", param, ctx)
        return str(value)


class HandlerFile(click.ParamType):
    """A ``.py`` file: a local path that exists, or a URI the driver downloads."""

    name = "FILE.py"

    def convert(self, value, param, ctx):
        path = str(value)
        if not path.endswith(".py"):
            self.fail(f"must be a Python file ending in .py, got {path!r}", param, ctx)
        if "://" not in path and not os.path.isfile(path):
            self.fail(f"{path}: no such file (in cluster mode give an s3:// URI)", param, ctx)
        return path


def parse_max_errors(value) -> tuple[float, bool]:
    """``"10"`` -> (10, False); ``"2.5%"`` -> (2.5, True); anything else raises ``ValueError``."""
    text = str(value).strip()
    percent = text.endswith("%")
    try:
        number = float(text.rstrip("%"))
    except ValueError:
        raise ValueError(f"must be a count (10) or a percentage (1%), got {value!r}") from None
    if not math.isfinite(number) or number < 0 or (percent and number > 100):
        raise ValueError(f"out of range (0 or more, at most 100%), got {value!r}")
    return number, percent


def allowed_errors(max_errors: str, keys: int) -> int:
    number, percent = parse_max_errors(max_errors)
    return math.floor(number * keys / 100) if percent else int(number)


def load_yaml(uri: str, endpoint_url: str | None = None, region: str | None = None) -> dict:
    """Read a YAML config from a path or any URI :func:`utils.read_uri` takes (s3:// in cluster mode).

    Returns the raw mapping; :func:`merge_settings` converts each value.
    """
    try:
        client = utils.s3_client(endpoint_url, region) if utils.is_s3_uri(uri) else None
        text = utils.read_uri(uri, client).decode("utf-8")
    except (OSError, utils.S3UriError) as exc:
        raise click.UsageError(f"cannot read --config {uri}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - botocore errors: no such bucket, access denied
        raise click.UsageError(f"cannot read --config {uri}: {mxinfer.first_line(exc)}") from None
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


class Settings(dict):
    """Merged option values, each converted by its option's click type.

    :meth:`name` says how the user wrote an option, so a message about a YAML
    value names its key and file, and one about a command-line value its flag.
    """

    def __init__(self, values: dict, names: dict[str, str]):
        super().__init__(values)
        self.names = names

    def name(self, key: str) -> str:
        return self.names.get(key) or option_flag(key)


def option_flag(key: str) -> str:
    """The first long flag of the option that sets ``key`` (``batch_size`` -> ``--batch-size``)."""
    return PARAMS[key].opts[0] if key in PARAMS else f"--{key.replace('_', '-')}"


def convert_option(key: str, value, hint: str):
    """``value`` converted by the click type of the option ``key``; a bad one raises ``BadParameter`` naming ``hint``."""
    try:
        return PARAMS[key].type.convert(value, None, None)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=hint) from None


def merge_settings(cli: dict, yaml_settings: dict, config: str = "--config") -> Settings:
    """The defaults, then the YAML, then the options given on the command line, all typed.

    Every value goes through its option's click type, so the YAML layer has
    the command line's types and ranges; a YAML ``null`` keeps the default.
    """
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for key, default in DEFAULTS.items():
        values[key] = None if default is None else convert_option(key, default, f"the default of {option_flag(key)}")
    for key, value in yaml_settings.items():
        if value is not None:
            names[key] = f"{key} in {config}"
            values[key] = convert_option(key, value, f"{key!r} in {config}")
    for key, value in cli.items():
        if value is not None:
            names.pop(key, None)
            values[key] = convert_option(key, value, f"'{option_flag(key)}'")
    return Settings(values, names)


def resolve(settings: Settings) -> JobConfig:
    """Check the merged settings together into a :class:`JobConfig`; a problem raises ``click.UsageError``."""
    s = settings
    name = s.name
    # Input: --input, or the original's --bucket/--prefix.
    if s["input"] and s["bucket"]:
        raise click.UsageError(f"{name('input')} and {name('bucket')} both set the input: give either "
                               "--input s3://BUCKET/PREFIX or --bucket/--prefix, not both")
    if s["input"]:
        try:
            in_bucket, in_prefix = utils.parse_s3_uri(s["input"])
        except utils.S3UriError as exc:
            raise click.UsageError(f"{name('input')}: {exc}") from None
    elif s["bucket"]:
        in_bucket, in_prefix = s["bucket"], s["prefix"] or ""
    elif s["input_manifest"]:
        in_bucket, in_prefix = None, ""  # the manifest names the bucket
    else:
        raise click.UsageError("no input: give --input s3://BUCKET/PREFIX (or --bucket and --prefix), "
                               "or --input-manifest URI")
    input_manifest = str(s["input_manifest"]) if s["input_manifest"] else None
    if input_manifest and "://" not in input_manifest and not os.path.isfile(input_manifest):
        raise click.UsageError(f"--input-manifest {input_manifest}: no such file (in cluster mode give an s3:// URI)")

    # Output: --output, or the original's --output_s3_bucket/--output_s3_key (bucket defaults to input's).
    if s["output"] and (s["output_s3_key"] or s["output_s3_bucket"]):
        other = "output_s3_key" if s["output_s3_key"] else "output_s3_bucket"
        raise click.UsageError(f"{name('output')} and {name(other)} both set the output: give either "
                               "--output s3://BUCKET/KEY or --output_s3_bucket/--output_s3_key")
    out_bucket = out_key = None
    if s["output"]:
        try:
            out_bucket, out_key = utils.parse_s3_uri(s["output"], need_key=True)
        except utils.S3UriError as exc:
            raise click.UsageError(f"{name('output')}: {exc}") from None
    elif s["output_s3_key"]:
        out_bucket, out_key = s["output_s3_bucket"] or in_bucket, s["output_s3_key"].lstrip("/")
        if out_bucket is None:
            raise click.UsageError("--output_s3_key needs --output_s3_bucket with --input-manifest (or use --output)")
    elif s["output_s3_bucket"]:
        raise click.UsageError(f"{name('output_s3_bucket')} needs --output_s3_key")
    if out_key is None and not s["dry_run"]:
        raise click.UsageError("no output: give --output s3://BUCKET/KEY (for example predictions.jsonl)")
    if s["resume"] and s["overwrite"]:
        raise click.UsageError("give --resume (finish an earlier run) or --overwrite (start again), not both")
    if s["output_format"] is not None and s["output_format"] not in durable.OUTPUT_FORMATS:
        raise click.UsageError(f"output_format must be one of {', '.join(durable.OUTPUT_FORMATS)}, "
                               f"got {s['output_format']!r}")

    # Model: --model prefix, or the original's --sym_url/--param_url.
    if s["model"] and (s["sym_url"] or s["param_url"]):
        raise click.UsageError(f"{name('model')} and {name('sym_url' if s['sym_url'] else 'param_url')} both "
                               "set the model: give either --model PREFIX or --sym_url and --param_url")
    if s["labels"] and s["label_url"]:
        raise click.UsageError(f"{name('labels')} and {name('label_url')} both set the labels: give one")
    model_kwargs = {
        # "" means no labels at all; None means synset.txt beside the model if it exists.
        "labels_uri": s["labels"] if s["labels"] is not None else s["label_url"], "data_name": s["data_name"],
        "context": s["context"], "endpoint_url": s["endpoint_url"], "region": s["region"],
    }
    if s["model"]:
        model = mxinfer.ModelSpec.from_prefix(s["model"], s["epoch"], **model_kwargs)
    elif s["sym_url"] and s["param_url"]:
        model = mxinfer.ModelSpec(s["sym_url"], s["param_url"], **model_kwargs)
    else:
        raise click.UsageError("no model: give --model PREFIX (PREFIX-symbol.json, PREFIX-0000.params) "
                               "or --sym_url and --param_url")

    channels = s["input_shape"][0]
    if channels not in (1, 3):
        raise click.UsageError(f"{name('input_shape')}: C (the first of C,H,W) must be 3 (RGB) or 1 "
                               f"(greyscale), got {channels}")
    for key in ("mean", "std"):
        if len(s[key]) not in (1, channels):
            raise click.UsageError(f"{name(key)} needs 1 or {channels} values (one per channel of "
                                   f"{name('input_shape')}), got {len(s[key])}")
    preprocess = mxinfer.Preprocess(input_shape=s["input_shape"], mean=s["mean"], std=s["std"],
                                    resize=s["resize"], max_image_pixels=s["max_image_pixels"], decode=s["decode"])
    if s["precision"] == "int8" and s["context"] != "cpu":
        raise click.UsageError(f"{name('precision')} int8 runs on CPUs (oneDNN); use --context cpu, or "
                               "--precision fp32 on GPUs")
    return JobConfig(
        input_bucket=in_bucket, input_prefix=in_prefix, suffixes=s["suffixes"], model=model,
        output_bucket=out_bucket, output_key=out_key, batch_size=s["batch_size"], top_k=s["top_k"],
        preprocess=preprocess, endpoint_url=s["endpoint_url"] or None, region=s["region"] or None,
        limit=s["limit"], dry_run=s["dry_run"], max_errors=s["max_errors"],
        max_object_bytes=s["max_object_bytes"], io_threads=s["io_threads"], max_in_flight=s["max_in_flight"],
        s3_max_attempts=s["s3_max_attempts"], s3_reader=s["s3_reader"], app_name=s["app_name"], log_level=s["log_level"],
        progress_seconds=s["progress_seconds"], handler=s["handler"] or None,
        micro_batch_size=s["micro_batch_size"], threads=s["threads"],
        resume=s["resume"], overwrite=s["overwrite"],
        output_format=durable.output_format(s["output_format"], out_key or ""),
        precision=s["precision"], calibration_images=s["calibration_images"], min_agreement=s["min_agreement"],
        int8_exclude=s["int8_exclude"],
        input_manifest=input_manifest, list_concurrency=s["list_concurrency"],
    )


# ----------------------------------------------------------------------------
# Extract: list and plan


def list_images(client, cfg: JobConfig) -> listing.Listing:
    """Every image key of the input with its size, sorted, limited: a compact :class:`listing.Listing`.

    The keys under the input prefix, listed with ``--list-concurrency`` calls
    in flight, or those ``--input-manifest`` names (``client`` reads it). The
    listing's ``bucket`` is the one to read the images from.
    """
    if cfg.input_manifest:
        try:
            return manifest.read_manifest(cfg.input_manifest, client, bucket=cfg.input_bucket,
                                          prefix=cfg.input_prefix, suffixes=cfg.suffixes, limit=cfg.limit)
        except manifest.ManifestError as exc:
            raise JobError(str(exc)) from exc
        except OSError as exc:  # unreadable file, full disk for the downloaded copy
            raise JobError(f"cannot read --input-manifest {cfg.input_manifest}: {exc}") from exc
    try:
        # Its own client: one whose parser skips the dates, with a connection per list call in flight.
        lister = listing.list_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts,
                                     max_pool_connections=max(10, cfg.list_concurrency))
        keys, sizes = listing.list_prefix(lister, cfg.input_bucket, cfg.input_prefix, cfg.list_concurrency)
        images = listing.Listing.build(cfg.input_bucket, keys, sizes, suffixes=cfg.suffixes, limit=cfg.limit)
    except Exception as exc:  # NoSuchBucket, AccessDenied, endpoint unreachable
        raise JobError(f"cannot list {cfg.input_uri}: {mxinfer.first_line(exc)}") from exc
    if not len(images):
        raise JobError(f"no images under {cfg.input_uri} (looked for keys ending in "
                       f"{' '.join(cfg.suffixes)}); check --input and --suffixes")
    return images


# ----------------------------------------------------------------------------
# Transform: the Spark job


def run_spark(cfg: JobConfig, run: durable.Run, plan_key: str, spark_conf: dict | None = None) -> mxinfer.StatsFold:
    """Score one partition per batch of ``run`` on the cluster; return the tasks' stats, folded.

    Each partition holds one ``(offset, length)`` span of the run's plan
    (``plan_key``): the task reads its keys from there and writes its lines
    under the run's prefix (:func:`mxinfer.part_key`). The keys never pass
    through Py4J, and nothing but an accumulator of stats comes back here.
    """
    from pyspark import SparkConf, SparkContext

    conf = SparkConf().setAppName(cfg.app_name)
    for key, value in (spark_conf or {}).items():
        conf.set(key, value)
    sc = SparkContext.getOrCreate(conf)
    if signal.getsignal(signal.SIGTERM) is _raise_interrupted and threading.current_thread() is threading.main_thread():
        # PySpark's SparkContext puts its own SIGINT handler in (cancel the jobs, then
        # KeyboardInterrupt, with Py4J's stacks): Ctrl-C must end as SIGTERM does.
        signal.signal(signal.SIGINT, _raise_interrupted)
    sc.setLogLevel("WARN")
    log.info("Spark %s, master %s, app %s: %d partitions", sc.version, sc.master, sc.applicationId, run.batches)
    rdd = sc.parallelize(run.spans, run.batches)
    job = replace(cfg.job_spec(), output_bucket=cfg.output_bucket, parts_prefix=run.prefix, plan_key=plan_key,
                  thread_plan=thread_plan(sc))
    if job.handler:
        sc.addFile(job.handler)  # executors load their copy by name (mxinfer.get_handlers)
    for path in job.model.shipped_files():  # the int8 checkpoint: read by name (mxinfer.ModelSpec.read)
        sc.addFile(path)
    stats = sc.accumulator(mxinfer.StatsFold(), mxinfer.StatsAccumulator())
    score = functools.partial(mxinfer.score_into, job=job, stats=stats)
    stop = threading.Event()
    reporter = threading.Thread(target=_report_progress, args=(stats, run.batches, run.keys, cfg.progress_seconds,
                                                                 stop), daemon=True)
    reporter.start()
    try:
        rdd.mapPartitionsWithIndex(score).sum()
        return stats.value
    except Exception as exc:
        raise JobError(f"the Spark job failed: {spark_failure_reason(exc)}") from exc
    finally:
        stop.set()
        # Release the executors before the assembly rather than letting the
        # JVM's shutdown race them. After a signal the JVM may be gone already.
        try:
            sc.stop()
        except Exception as exc:  # noqa: BLE001 - nothing left to stop
            log.debug("stopping Spark: %s", exc)


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
                    "if the summary warns", mxinfer.first_line(exc))
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


def _report_progress(stats, batches: int, images: int, every: float, stop: threading.Event) -> None:
    """Log done/total batches, images/s (last interval and overall), failed images and an ETA while the job runs.

    ``stats`` is the job's accumulator: Spark merges each task's stats into it as the task ends.
    """
    started = last_time = time.time()
    last_keys = 0
    while not stop.wait(every):
        fold = stats.value
        done, keys, failed = fold.tasks, fold.keys, sum(fold.errors.values())
        now = time.time()
        if not done:
            continue
        recent = (keys - last_keys) / (now - last_time)
        overall = keys / (now - started)
        # The recent rate is the steady one once the workers have loaded the model.
        rate = recent if recent > 0 else overall
        left = (images - keys) / rate if rate > 0 else float("nan")
        log.info("progress: %d of %d batches done (%.0f%%), %d of %d images, %d failed; %.1f images/s in the "
                 "last %.0f s, %.1f overall; about %s left", done, batches, 100.0 * done / batches, keys, images,
                 failed, recent, now - last_time, overall, _duration(left))
        last_time, last_keys = now, keys


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "an unknown time"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def spark_failure_reason(exc: BaseException) -> str:
    """The Python exception line inside a Py4J error, not 200 lines of JVM stack."""
    text = str(exc)
    python_lines = [line.strip() for line in text.splitlines()
                    if line.strip() and ("Error:" in line or "Exception:" in line)
                    and not line.strip().startswith(("at ", "py4j", "org.apache", "Caused by: org.apache"))]
    if python_lines:
        return python_lines[-1][:1000]
    return mxinfer.first_line(exc)[:1000]


# ----------------------------------------------------------------------------
# Load: durable progress, resume, assembly, summary


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the driver (a ``BaseException``, like ``KeyboardInterrupt``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals this driver received: the JVM gets a terminal's Ctrl-C or YARN's SIGTERM
#: too, and its failure may reach the main thread before the signal's exception does.
_signals_received: list[int] = []


def _raise_interrupted(signum, _frame):
    _signals_received.append(signum)
    # One interruption is enough: the clean-up below must not be cut short by a second one.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


class _Console:
    """Where the last word of a run that did not finish goes, even if spark-submit's JVM is gone.

    In client mode spark-submit's JVM starts this driver and copies its output
    to the JVM's own. Ctrl-C or a SIGTERM to the process group reaches the
    JVM too, and it may exit before it copies the one line that says how to
    resume. So when the parent is a JVM, its stderr is opened at start
    (``/proc/PPID/fd/2``, append-only, so it outlives the JVM) and that line
    goes there once the JVM is gone or going.
    """

    def __init__(self):
        self.parent, self.fd = os.getppid(), None
        try:
            with open(f"/proc/{self.parent}/cmdline", "rb") as handle:
                if b"java" in handle.read().split(b"\0", 1)[0]:
                    self.fd = os.open(f"/proc/{self.parent}/fd/2", os.O_WRONLY | os.O_APPEND)
        except OSError:  # not Linux, not a JVM parent, or its stderr cannot be opened: use ours
            self.fd = None

    def say(self, line: str, parent_going: bool = False) -> None:
        """Print ``line`` once, where the user sees it: through the JVM while it lives, else straight."""
        if self.fd is not None and (parent_going or os.getppid() != self.parent):
            try:
                os.write(self.fd, (line + "\n").encode("utf-8", "replace"))
                return
            except OSError:
                pass
        click.echo(line, err=True)


def resume_command(argv: Sequence[str]) -> str:
    """The command line that resumes this run: the same arguments, ``--overwrite`` dropped, ``--resume`` added."""
    args = [a for a in argv[1:] if a != "--overwrite"]
    if "--resume" not in args:
        args.append("--resume")
    return "spark-submit [the same spark options] " + shlex.join([os.path.basename(argv[0]), *args])


def yarn_attempt() -> tuple[str | None, int]:
    """``(application id, attempt number)`` of this YARN container from ``CONTAINER_ID``, else ``(None, 1)``.

    YARN names a container ``container[_eE]_<cluster ts>_<app>_<attempt>_<n>``:
    the application master of attempt 2 runs in ``..._0001_02_000001``.
    """
    match = re.match(r"container_(?:e\d+_)?(\d+)_(\d+)_(\d+)_\d+$", os.environ.get("CONTAINER_ID", ""))
    if not match:
        return None, 1
    return f"application_{match.group(1)}_{match.group(2)}", int(match.group(3))


def line_settings(cfg: JobConfig) -> dict:
    """Every setting that changes what a line says about an image (the fingerprint's settings)."""
    settings = {"data_name": cfg.model.data_name, "preprocess": asdict(cfg.preprocess), "top_k": cfg.top_k,
                "max_object_bytes": cfg.max_object_bytes, "precision": cfg.precision}
    if cfg.precision == "int8":
        settings.update(calibration_images=cfg.calibration_images, int8_exclude=cfg.int8_exclude)
    return settings


def job_fingerprint(cfg: JobConfig, classifier: mxinfer.Predictor) -> dict:
    """:func:`durable.fingerprint` of this run: settings, model files, labels and handler by content."""
    labels = getattr(classifier, "labels", None)
    handler = cfg.handler_file or cfg.handler
    files = {
        "model_symbol": cfg.model.read(cfg.model.symbol_uri),
        "model_params": cfg.model.read(cfg.model.params_uri),
        "labels": "\n".join(labels).encode("utf-8") if labels else None,
        "handler": utils.read_uri(handler) if handler else None,
        # The quantized model itself: calibrated on the job's own sample, it is part of what made the lines.
        "int8_params": cfg.int8_model.read(cfg.int8_model.params_uri) if cfg.int8_model else None,
    }
    return durable.fingerprint(line_settings(cfg), files)


@dataclass
class Plan:
    """What this run does: the earlier runs it reuses and the keys it scores (a :class:`listing.Listing`)."""

    runs: list
    todo: listing.Listing
    number: int
    resumed: bool


def plan_output(cfg: JobConfig, client, work: durable.WorkPrefix, images: listing.Listing, fingerprint: dict,
                dry: bool = False) -> Plan:
    """Decide between a fresh run and a resume; refuse what would overwrite or mix results.

    Raises :class:`JobError` with what to do: the output exists (``--overwrite``),
    an earlier run's progress exists (``--resume`` or ``--overwrite``), or the
    earlier run's fingerprint differs from this one's; :class:`Completed` for
    a resume of a finished output. A fresh run records its fingerprint, and
    ``--overwrite`` removes the earlier progress, unless ``dry``.
    """
    try:
        output_exists = any(utils.object_exists(client, cfg.output_bucket, key)
                            for key in (cfg.output_key, cfg.summary_key))
        work_exists = work.exists()
    except Exception as exc:
        raise JobError(f"cannot write {cfg.output_uri}: {mxinfer.first_line(exc)}; the job needs "
                       "s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject on the output bucket") from exc
    resume = cfg.resume
    app, attempt = yarn_attempt()
    if cfg.overwrite:
        if work_exists and not dry:
            log.info("--overwrite: removing %d objects of the earlier run under %s", work.remove(), work.uri)
        work_exists = False
    elif work_exists and not resume and attempt > 1:
        runs = work.runs()
        if runs and runs[-1].application == app:
            log.warning("YARN attempt %d of %s: resuming the progress the earlier attempt made durable under %s",
                        attempt, app, work.uri)
            resume = True
    if work_exists and not resume:
        runs = work.runs()
        done = sum(len(run.done) for run in runs)
        raise JobError(f"{work.uri} holds an earlier run's progress ({done} durable batches in {len(runs)} "
                       "run(s)); add --resume to finish it, or --overwrite to discard it and start again")
    if output_exists and not cfg.overwrite and not (resume and work_exists):
        if resume:
            raise Completed(cfg.output_uri)
        raise JobError(f"{cfg.output_uri} (or its summary) already exists; add --overwrite to replace it")
    if not work_exists:
        if resume:
            log.info("--resume: nothing under %s yet; scoring every key", work.uri)
        if dry:
            return Plan(runs=[], todo=images, number=1, resumed=False)
        try:
            work.write_job(fingerprint, cfg.output_uri)
        except Exception as exc:
            raise JobError(f"cannot write {work.uri}: {mxinfer.first_line(exc)}; the job needs s3:PutObject, "
                           "s3:GetObject, s3:ListBucket and s3:DeleteObject on the output key and the "
                           "prefix beside it") from exc
        return Plan(runs=[], todo=images, number=1, resumed=False)
    job = work.read_job()
    if job is None:
        raise JobError(f"{work.uri} has no job.json, so what made its lines is unknown; "
                       "add --overwrite to discard it and start again")
    differ = durable.differences(job["fingerprint"], fingerprint)
    if differ:
        raise JobError(f"cannot resume: the earlier run under {work.uri} used different settings or files, "
                       f"and one output must not mix them: {'; '.join(differ)}. Rerun with the earlier "
                       "settings, or add --overwrite (instead of --resume) to start again")
    runs = work.runs()
    todo = images.filter(durable.remaining_keys(work, runs, images))
    log.info("--resume: %d of %d keys already have a durable line (%d runs under %s); scoring %d",
             len(images) - len(todo), len(images), len(runs), work.uri, len(todo))
    return Plan(runs=runs, todo=todo, number=max((run.number for run in runs), default=0) + 1, resumed=True)


class Completed(Exception):
    """``--resume`` of an output that an earlier run already completed: nothing to do."""


def assemble_output(cfg: JobConfig, client, work: durable.WorkPrefix,
                    images: listing.Listing) -> durable.AssemblyCounts:
    """Merge every durable line into the output object (one multipart upload, completed only when whole)."""
    try:
        writer = utils.MultipartWriter(client, cfg.output_bucket, cfg.output_key,
                                       content_type="application/vnd.apache.parquet"
                                       if cfg.output_format == "parquet" else "application/x-ndjson")
    except Exception as exc:
        raise JobError(f"cannot write {cfg.output_uri}: {mxinfer.first_line(exc)}; the job needs "
                       "s3:PutObject on the output key") from exc
    with_result = bool(cfg.handler) and mxinfer.get_handlers(cfg.handler_file or cfg.handler).output_handler
    sink = (durable.ParquetSink(writer, with_result=bool(with_result)) if cfg.output_format == "parquet"
            else durable.JsonLinesSink(writer))
    try:
        reader = utils.s3_reader(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts, kind=cfg.s3_reader)
        counts = durable.assemble(work, work.runs(), images, sink, reader=reader)
        sink.close()
    except durable.ResumeError as exc:
        sink.abort()
        raise JobError(str(exc)) from exc
    except BaseException:
        sink.abort()
        raise
    return counts


def summarize(cfg: JobConfig, images: int, batches: int, stats, counts: durable.AssemblyCounts,
              elapsed: float, model_summary: dict, seconds: dict, plan: Plan, fingerprint: dict) -> dict:
    """The run's summary: what was scored and reused, where the time went, per executor and per worker.

    ``stats`` is the tasks' :class:`mxinfer.StatsFold` (or their stats dicts).
    """
    fold = stats if isinstance(stats, mxinfer.StatsFold) else mxinfer.StatsFold.of(stats)
    executors = {name: {k: round(v, 3) if isinstance(v, float) else v for k, v in e.items()}
                 for name, e in fold.executors.items()}
    workers = {name: fold.worker_summary(name) for name in sorted(fold.workers)}
    # Throughput while tasks ran: from the first task's start to the last one's end
    # (elapsed_seconds also counts listing, Spark start-up and the assembly).
    window = fold.last_end - fold.first_start if fold.first_start is not None else None
    scored = fold.keys
    return {
        "input": cfg.input_uri, "output": cfg.output_uri, "output_format": cfg.output_format,
        "keys_listed": images, "predicted": counts.predicted, "failed": counts.failed,
        # reused: keys whose line an earlier run made durable; scored: keys this run scored.
        "reused": images - len(plan.todo), "scored": scored, "resumed": plan.resumed, "runs": plan.number,
        "errors_by_stage": dict(fold.errors), "batches": batches, "batch_size": cfg.batch_size,
        "elapsed_seconds": round(elapsed, 3),
        "images_per_second": round(scored / elapsed, 2) if elapsed > 0 else None,
        "seconds": {**{k: round(sum(e[k] for e in fold.executors.values()), 3) for k in fold.STAGES},
                    **{k: round(v, 3) for k, v in seconds.items()}},
        "assembly": {"parts_read": counts.parts_read, "bytes_read": counts.bytes_read,
                     "lines_dropped": counts.dropped, "lines_superseded": counts.superseded},
        "executors": executors,
        "s3_retries": dict(fold.s3_retries),
        "python_workers": workers,
        "tasks": {"first_start": fold.first_start, "last_end": fold.last_end,
                  "seconds": round(window, 3) if window else None,
                  "images_per_second": round(scored / window, 2) if window else None},
        "driver_max_rss_bytes": mxinfer.memory_bytes()["max_rss"],
        # Batches whose result came from a retried task (lost worker or executor, ...).
        "retried_batches": fold.retried,
        "model": {"symbol": cfg.model.symbol_uri, "params": cfg.model.params_uri,
                  "labels": cfg.model.labels_uri, **model_summary},
        "fingerprint": fingerprint,
        "options": cfg.options(),
        "threads": thread_fit(fold),
    }


def thread_fit(stats) -> dict:
    """Per host: its cores, executors, MXNet threads in all, and a warning when threads x executors differ from the cores.

    ``stats`` is a :class:`mxinfer.StatsFold` (or task stats dicts). The
    executors are those that ran tasks, or as many as the driver's plan
    put on the host if more (an executor may get no task in a small job).
    Assumes one task at a time per executor (``spark.executor.cores=1``, the
    job's shape); an executor's threads are the most any of its workers used.
    """
    fold = stats if isinstance(stats, mxinfer.StatsFold) else mxinfer.StatsFold.of(stats)
    out: dict[str, Any] = {"hosts": {}, "warnings": []}
    for host, h in sorted(fold.hosts.items()):
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
    """List, plan, check the model, score on Spark, assemble; return the exit code."""
    started = time.time()
    seconds: dict[str, float] = {}
    client = utils.s3_client(cfg.endpoint_url, cfg.region, max_attempts=cfg.s3_max_attempts)
    cfg = prepare_handler(cfg, client)
    images = list_images(client, cfg)
    cfg = replace(cfg, input_bucket=images.bucket)  # a manifest names the bucket the executors read
    seconds["listing"] = time.time() - started
    # Load the model here first: a bad checkpoint, shape or labels file fails
    # now, with its cause, instead of in every task after the cluster spun up.
    check_started = time.time()
    classifier = load_model_on_driver(cfg)
    summary_model = classifier.model_summary()
    if isinstance(classifier, mxinfer.Classifier) and cfg.top_k > classifier.num_classes:
        raise JobError(f"--top-k {cfg.top_k} is larger than the model's {classifier.num_classes} classes")
    cfg, precision = prepare_precision(cfg, client, images, classifier)
    fingerprint = job_fingerprint(cfg, classifier)
    if cfg.dry_run:
        return dry_run(cfg, images, classifier, client, fingerprint)
    del classifier  # checked: the driver needs the model no more
    seconds["model_check"] = time.time() - check_started
    plan_started = time.time()
    work = durable.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    try:
        plan = plan_output(cfg, client, work, images, fingerprint)
    except Completed:
        log.info("%s is already complete (its summary is s3://%s/%s); nothing to resume", cfg.output_uri,
                 cfg.output_bucket, cfg.summary_key)
        return 0
    batches = plan.todo.num_batches(cfg.batch_size)
    log.info("%d images under %s: %s%d batches of up to %d", len(images), cfg.input_uri,
             f"{len(images) - len(plan.todo)} already scored, " if plan.resumed else "", batches, cfg.batch_size)
    stats = mxinfer.StatsFold()
    try:
        if batches:
            application, _ = yarn_attempt()
            run = work.start_run(plan.number, plan.todo, cfg.batch_size, application)
            seconds["plan"] = time.time() - plan_started
            spark_started = time.time()
            stats = run_spark(cfg, run, work.plan_key(run), spark_conf)
            seconds["spark"] = time.time() - spark_started
        else:
            seconds["plan"] = time.time() - plan_started
        assembly_started, assembly_cpu = time.time(), time.process_time()
        counts = assemble_output(cfg, client, work, images)
        seconds["assembly"] = time.time() - assembly_started
        # The driver's own CPU in the assembly (merging, checking, compressing); the rest is waiting for S3.
        seconds["assembly_cpu"] = time.process_time() - assembly_cpu
    except (JobError, Interrupted) as exc:
        exc.work = work  # main() says what is durable and how to resume
        raise
    log.info("assembled %s from %d parts in %.1f s", cfg.output_uri, counts.parts_read, seconds["assembly"])
    elapsed = time.time() - started
    summary = summarize(cfg, len(images), batches, stats, counts, elapsed, summary_model, seconds, plan,
                        fingerprint)
    summary["precision"] = precision
    utils.put_text(client, cfg.output_bucket, cfg.summary_key, json.dumps(summary, indent=2) + "\n")
    for warning in summary["threads"]["warnings"]:
        log.warning("%s", warning)
    removed = work.remove()
    log.info("summary: %s", json.dumps({k: summary[k] for k in (
        "keys_listed", "predicted", "failed", "reused", "scored", "batches", "elapsed_seconds")}))
    log.info("wrote %s and s3://%s/%s; removed %d work objects under %s", cfg.output_uri, cfg.output_bucket,
             cfg.summary_key, removed, work.uri)
    limit = allowed_errors(cfg.max_errors, len(images))
    if counts.failed > limit:
        log.error("%d images failed, more than --max-errors %s allows (%d); see the error lines in %s",
                  counts.failed, cfg.max_errors, limit, cfg.output_uri)
        return EXIT_TOO_MANY_ERRORS
    return 0


def durable_status(work: durable.WorkPrefix | None) -> str:
    """``N of M batches are durable under URI`` for the messages of a run that did not finish."""
    if work is None:
        return ""
    try:
        runs = work.runs()
    except Exception as exc:  # noqa: BLE001 - S3 unreachable: say so instead of hiding the first error
        return f"could not read {work.uri} ({mxinfer.first_line(exc)})"
    if not runs:
        return f"nothing was durable yet under {work.uri}"
    last = runs[-1]
    return (f"{len(last.done)} of {last.batches} batches of this run are durable under {work.uri}"
            + (f" (and {sum(len(r.done) for r in runs[:-1])} of earlier runs)" if len(runs) > 1 else ""))


#: The name the driver gives its copy of ``--handler``, before the file's own name.
HANDLER_PREFIX = "mxinfer_handler_"


def prepare_handler(cfg: JobConfig, client) -> JobConfig:
    """Check --handler on the driver, downloading a URI first; return ``cfg`` with its local file.

    A handler that is missing, fails to import or defines neither function
    stops the run here, before any listing or Spark work.
    """
    if not cfg.handler:
        return cfg
    path = cfg.handler
    try:
        data = utils.read_uri(path, client if utils.is_s3_uri(path) else None)
    except FileNotFoundError:
        raise JobError(f"--handler: {path} does not exist") from None
    except Exception as exc:
        raise JobError(f"cannot read --handler {path}: {mxinfer.first_line(exc)}") from exc
    folder = tempfile.mkdtemp(prefix="mxinfer-handler-")
    # Kept until the driver exits: executors fetch it from the driver while the job runs.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    # Shipped under a name of its own: SparkContext.addFile puts files side by side with
    # the --py-files, so a handler called utils.py would clash with ours (and Spark
    # refuses a second file of one name with different contents).
    path = os.path.join(folder, HANDLER_PREFIX + path.rsplit("/", 1)[-1])
    with open(path, "wb") as handle:
        handle.write(data)
    try:
        handlers = mxinfer.get_handlers(path)
    except mxinfer.HandlerError as exc:
        raise JobError(f"--handler: {str(exc).replace(path, cfg.handler)}") from exc
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
            log.debug("int8 sample: %s left out: %s", key, mxinfer.first_line(exc))
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
        raise JobError(f"cannot quantize the model to int8: {mxinfer.first_line(exc)}; keep the layer it names "
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
        raise JobError(f"cannot load the model ({cfg.model.symbol_uri}): {mxinfer.first_line(exc)}") from exc


def dry_run(cfg: JobConfig, images: list, classifier: mxinfer.Classifier, client, fingerprint: dict) -> int:
    """Make every check the real run makes before Spark, score one image on the driver's CPU, print the plan.

    Starts no Spark job and leaves nothing behind. The checks: the output may
    be written, and :func:`plan_output`'s (an existing output, an earlier
    run's progress, a resume with other settings). The plan is one JSON object
    on the last line of standard output: under spark-submit the driver's log
    and MXNet's own messages share that stream, so a script reads the last
    line only.
    """
    to_score = len(images)
    if cfg.output_key:
        try:
            utils.check_writable(client, cfg.output_bucket, cfg.output_key)
        except utils.OutputNotWritableError as exc:
            raise JobError(str(exc)) from exc
        work = durable.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
        try:
            to_score = len(plan_output(cfg, client, work, images, fingerprint, dry=True).todo)
        except Completed:
            to_score = 0
    job = cfg.job_spec()
    job = replace(job, model=replace(job.model, context="cpu"))
    [(_, _, blob, stats)] = mxinfer.score_partition(0, images[:1], job)
    batches = math.ceil(len(images) / cfg.batch_size)
    plan = {
        "input": cfg.input_uri, "output": cfg.output_uri, "output_format": cfg.output_format,
        "output_writable": bool(cfg.output_key) or None,
        # keys an earlier run made durable (--resume) are not scored again
        "images": len(images), "to_score": to_score, "batch_size": cfg.batch_size, "batches": batches,
        "partitions": batches,
        "first_key": images[0][0], "last_key": images[-1][0],
        "model": classifier.model_summary(),
        "sample": json.loads(zlib.decompress(blob).decode("utf-8")),
        "sample_seconds": stats["seconds"],
    }
    # Whatever was logged or printed before ends its line first, so the plan is a line of its own.
    sys.stderr.flush()
    click.echo(json.dumps(plan, ensure_ascii=False))
    sys.stdout.flush()
    return 0


# ----------------------------------------------------------------------------
# The command line: every option, its type, range and default, in one place.
# DEFAULTS, the YAML layer and --help all read this table; conf/defaults.yaml
# is checked against it by tests/test_config.py. Adding an option is one
# decorator here (its default, type and range), a JobConfig field, and the
# line of resolve that fills it.

#: Defaults the executors' JobSpec and the Preprocess recipe already hold:
#: the job takes them from there, so the library and the job cannot drift.
_JOB = {f.name: f.default for f in fields(mxinfer.JobSpec)}
_PREP = mxinfer.Preprocess()


def _csv(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _refuse_secret(ctx, param, value):
    if value is not None:
        raise click.BadParameter(SECRETS_MESSAGE, ctx=ctx, param=param)
    return value


def _count(minimum: int = 1) -> WholeNumber:
    return WholeNumber(min=minimum)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100,
                                 "show_default": True})
@click.option("--config", "config_uri", metavar="URI", help="YAML file of options (path or s3://); the command line overrides it.")
@click.option("--input", metavar="s3://BUCKET/PREFIX", help="Where the images are.")
@click.option("--bucket", help="Input bucket (the original's flag; use with --prefix).")
@click.option("--prefix", default="", show_default=False, help="Input key prefix (the original's flag).")
@click.option("--input-manifest", metavar="URI", help="Score the keys this file names (path or s3://) instead of listing: text (a key or s3://B/K a line), CSV (bucket,key[,size]) or an S3 Inventory manifest.json; --input then filters by bucket and prefix.")
@click.option("--list-concurrency", type=_count(), default=16, help="List calls in flight while listing --input.")
@click.option("--suffixes", type=Suffixes(), default=_csv(mxinfer.DEFAULT_SUFFIXES), help="Comma-separated image suffixes, case-insensitive.")
@click.option("--model", metavar="URI", help="Checkpoint prefix: URI-symbol.json and URI-%04d.params.")
@click.option("--epoch", type=_count(0), default=0, help="Checkpoint epoch in the params file name.")
@click.option("--labels", metavar="URI", show_default="synset.txt beside the model, if any", help="Labels file, one per class; '' for none.")
@click.option("--sym_url", "--sym-url", "sym_url", metavar="URI", help="Symbol JSON (the original's flag).")
@click.option("--param_url", "--param-url", "param_url", metavar="URI", help="Params file (the original's flag).")
@click.option("--label_url", "--label-url", "label_url", metavar="URI", help="Labels file (the original's flag).")
@click.option("--data-name", default="data", help="Name of the model's input.")
@click.option("--context", type=DeviceContext(), default="cpu", help="cpu, gpu (the GPU Spark assigned to the task, else partition modulo GPUs) or gpu:N.")
@click.option("--handler", type=HandlerFile(), metavar="URI", help="Python file (path or s3://) defining input_handler(key, data) and/or output_handler(key, outputs).")
@click.option("--output", metavar="s3://BUCKET/KEY", help="JSON Lines output object; the summary goes to KEY.summary.json.")
@click.option("--output_s3_bucket", "--output-s3-bucket", "output_s3_bucket", show_default="the input bucket", help="Output bucket (the original's flag).")
@click.option("--output_s3_key", "--output-s3-key", "output_s3_key", help="Output key (the original's flag).")
@click.option("--batch-size", "--batch", "batch_size", type=_count(), default=_JOB["batch_size"], help="Images per batch and per partition.")
@click.option("--top-k", type=_count(), default=_JOB["top_k"], help="Predictions per image.")
@click.option("--input-shape", type=NumberList(int, count=3), metavar="C,H,W", default=_csv(_PREP.input_shape), help="Model input shape; C is 3 (RGB) or 1 (greyscale).")
@click.option("--mean", type=NumberList(float), metavar="R,G,B", default=_csv(_PREP.mean), help="Subtracted from 0-255 pixel values, per channel or one for all.")
@click.option("--std", type=NumberList(float, nonzero=True), metavar="R,G,B", default=_csv(_PREP.std), help="Divides after the mean, per channel or one for all.")
@click.option("--resize", type=click.Choice(mxinfer.RESIZE_MODES), default=_PREP.resize, help="stretch to H x W, or short side to H*256/224 then centre crop.")
@click.option("--endpoint-url", metavar="URL", help="S3-compatible endpoint (moto, MinIO); executors use it too.")
@click.option("--region", show_default="boto3's", help="AWS region of the buckets.")
@click.option("--limit", type=_count(), help="Score only the first N keys (sorted).")
@click.option("--dry-run/--no-dry-run", default=False, help="List, plan, load the model, score one image, check the output may be written; no Spark job. The plan is one JSON object on the last line of standard output.")
@click.option("--max-errors", type=MaxErrors(), default="1%", help="Exit 3 if more images than this fail (still writing all output).")
@click.option("--max-object-bytes", type=_count(), default=_JOB["max_object_bytes"], help="Larger objects become error lines, undownloaded.")
@click.option("--max-image-pixels", type=_count(), default=_PREP.max_image_pixels, help="Larger images become error lines, undecoded.")
@click.option("--io-threads", type=_count(), default=_JOB["io_threads"], help="Download and decode threads per executor.")
@click.option("--max-in-flight", type=_count(), default=_JOB["max_in_flight"], help="Images downloaded or decoded ahead of the model, per executor.")
@click.option("--micro-batch-size", type=_count(), default=16, help="Images per forward pass (the module's bound batch), at most --batch-size: the model starts on the first ones while the rest download.")
@click.option("--threads", type=_count(), show_default="spark.executorEnv.OMP_NUM_THREADS if set, else the host's cores divided among its executors", help="MXNet/OpenMP threads per executor.")
@click.option("--s3-max-attempts", type=_count(), default=_JOB["s3_max_attempts"], help="Attempts per S3 request (botocore standard retries).")
@click.option("--s3-reader", type=click.Choice(utils.S3_READERS), default=_JOB["s3_reader"], help="How images are read: lean signs and sends most GETs itself (about 1.3 ms less CPU each); botocore uses get_object for every one.")
@click.option("--app-name", default="mxnet-batch-inference", help="Spark application name.")
@click.option("--log-level", type=click.Choice(("DEBUG", "INFO", "WARNING", "ERROR"), case_sensitive=False), default="INFO", help="Driver log level.")
@click.option("--progress-seconds", type=FiniteNumber(min=1), default=15.0, help="Seconds between progress lines.")
@click.option("--resume", is_flag=True, default=False, help="Finish an interrupted run: reuse the lines it made durable under OUTPUT.parts/ and score only the keys without one.")
@click.option("--overwrite", is_flag=True, default=False, help="Replace an existing output, and discard an earlier run's progress under OUTPUT.parts/.")
@click.option("--output-format", type=click.Choice(durable.OUTPUT_FORMATS), show_default="parquet if the output key ends in .parquet, else jsonl", help="Output as JSON Lines or Parquet.")
@click.option("--decode", type=click.Choice(mxinfer.DECODE_MODES), default=_PREP.decode, help="draft: a JPEG at least twice the model's size is decoded at 1/2, 1/4 or 1/8 scale (DCT scaling), then resized; exact: every pixel.")
@click.option("--precision", type=click.Choice(mxinfer.PRECISIONS), default="fp32", help="int8: quantize the model once (oneDNN), calibrated on the job's own images, and run only if it agrees with fp32 (--min-agreement).")
@click.option("--calibration-images", type=_count(), default=256, help="int8: images to calibrate on, and as many held out to check agreement; evenly spaced over the sorted listing.")
@click.option("--min-agreement", type=FiniteNumber(min=0, max=1), default=0.99, help="int8: the share of held-out images whose top-1 class must match fp32's, or the job refuses to run.")
@click.option("--int8-exclude", type=Names(), metavar="LAYER,...", default=(), show_default="none", help="int8: layers (names or shell patterns, e.g. '*conv0*') kept in fp32.")
@click.option("--access_key", "--access-key", "access_key", hidden=True, expose_value=False, callback=_refuse_secret)
@click.option("--secret_key", "--secret-key", "secret_key", hidden=True, expose_value=False, callback=_refuse_secret)
def main(config_uri, **values):
    """Score every image under an S3 prefix with an MXNet model; write top-k JSON Lines to S3.

    Credentials come from boto3's default chain (the instance role on EMR);
    no option takes AWS keys.
    """
    ctx = click.get_current_context()
    given = {k: v for k, v in values.items()
             if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    yaml_settings = load_yaml(config_uri, given.get("endpoint_url"), given.get("region")) if config_uri else {}
    cfg = resolve(merge_settings(given, yaml_settings, config_uri or "--config"))
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    console = _Console()
    previous = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = run_job(cfg)
    except Interrupted as exc:
        _exit_interrupted(exc, cfg, console)
    except JobError as exc:
        if _signals_received:  # the JVM failed first, because it was signalled too
            interrupted = Interrupted(_signals_received[0])
            interrupted.work = getattr(exc, "work", None)
            _exit_interrupted(interrupted, cfg, console)
        work = getattr(exc, "work", None)
        status = durable_status(work) if work is not None else ""
        hint = f" ({status}; once the cause is fixed, resume with: {resume_command(sys.argv)})" if status else ""
        log.debug("failed here", exc_info=True)
        # Once, as click prints a usage error: not also as an ERROR log line
        # (under spark-submit both land in the same stream).
        console.say(f"Error: {exc}{hint}")
        sys.exit(EXIT_FAILED)
    finally:
        for sig, handler in previous.items():  # main() may run inside a test or a notebook
            signal.signal(sig, handler)
    sys.exit(code)


def _exit_interrupted(exc: Interrupted, cfg: JobConfig, console: _Console):
    """One line, not Py4J's and the JVM's stacks: what happened, what is kept, what to run; exit 128+N."""
    status = durable_status(getattr(exc, "work", None))
    console.say(f"Interrupted by {exc}: {status + '; ' if status else ''}nothing was written to "
                f"{cfg.output_uri}. Resume with: {resume_command(sys.argv)}", parent_going=True)
    log.debug("interrupted here", exc_info=True)
    sys.exit(128 + exc.signum)


#: Every option the command line and --config take, by its setting name.
PARAMS: dict[str, click.Parameter] = {p.name: p for p in main.params if p.expose_value and p.name != "config_uri"}
#: Every setting's default as --help shows it; merge_settings converts them.
DEFAULTS: dict[str, Any] = {name: p.default for name, p in PARAMS.items()}


if __name__ == "__main__":
    main()
