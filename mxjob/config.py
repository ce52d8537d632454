"""The job's settings: every option with its type, range and default, the YAML layer, and :class:`JobConfig`.

Read once at the edge (``infer_main.main``) into a frozen :class:`JobConfig`;
everything after it takes plain values. :data:`OPTIONS` is the one table of
options: ``--help``, :data:`DEFAULTS`, the YAML layer (:func:`merge_settings`)
and ``conf/defaults.yaml`` (checked against it by ``tests/test_config.py``)
all read it. Adding an option is one entry there (its default, type and
range), a :class:`JobConfig` field, and the line of :func:`resolve` that fills it.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from typing import Any

import click
import yaml

import utils
from mxjob import durable
from mxjob.device import parse_context
from mxjob.errors import first_line
from mxjob.int8 import PRECISIONS
from mxjob.listing import DEFAULT_SUFFIXES, LIST_CONCURRENCY
from mxjob.model import ModelSpec
from mxjob.partition import JobSpec
from mxjob.preprocess import DECODE_MODES, RESIZE_MODES, Preprocess

REFUSED_SECRETS = ("access_key", "secret_key", "aws_access_key_id", "aws_secret_access_key",
                   "aws_session_token")
SECRETS_MESSAGE = (
    "AWS keys are not accepted as options: they would show in the process list, the Spark UI "
    "and the logs. Credentials come from boto3's default chain: the EMR instance role on a "
    "cluster, or AWS_PROFILE / environment variables / ~/.aws on a laptop."
)


# ----------------------------------------------------------------------------
# Configuration: read once at the edge into a frozen dataclass


@dataclass(frozen=True)
class JobConfig:
    """The resolved, validated settings of one run."""

    #: None until the manifest names it (run_job sets it from the listing).
    input_bucket: str | None
    input_prefix: str
    suffixes: tuple
    model: ModelSpec
    output_bucket: str | None
    output_key: str | None
    batch_size: int
    top_k: int
    preprocess: Preprocess
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
    #: --handler as given (path or URI).
    handler: str | None
    micro_batch_size: int
    threads: int | None
    #: --input-manifest: the keys come from this file instead of a listing.
    input_manifest: str | None
    list_concurrency: int
    resume: bool
    overwrite: bool
    #: jsonl or parquet (see :func:`durable.output_format`).
    output_format: str
    #: fp32 or int8; int8 quantizes once per job (prepare_precision), after an agreement check.
    precision: str
    calibration_images: int
    min_agreement: float
    int8_exclude: tuple
    # Not options: made on the driver once the run starts. No field above has a default of its
    # own: every option's default is in OPTIONS, and resolve() fills each field from there.
    #: The local copy of --handler (made by prepare_handler), which Spark ships to the executors.
    handler_file: str | None = None
    #: The job's int8 checkpoint, local to the driver; made by prepare_precision.
    int8_model: ModelSpec | None = None

    @property
    def handler_path(self) -> str | None:
        """The handler file the driver loads and ships: its local copy once made, else --handler as given."""
        return self.handler_file or self.handler

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

    def job_spec(self) -> JobSpec:
        return JobSpec(
            model=self.int8_model or self.model, preprocess=self.preprocess, bucket=self.input_bucket,
            batch_size=self.batch_size, top_k=self.top_k, endpoint_url=self.endpoint_url,
            region=self.region, io_threads=self.io_threads, max_in_flight=self.max_in_flight,
            max_object_bytes=self.max_object_bytes, s3_max_attempts=self.s3_max_attempts,
            s3_reader=self.s3_reader, handler=self.handler_path,
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
            parse_context(str(value))
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


def load_yaml(uri: str, endpoint_url: str | None = None, region: str | None = None,
              max_attempts: int | None = None) -> dict:
    """Read a YAML config from a path or any URI :func:`utils.read_uri` takes (s3:// in cluster mode).

    An s3:// file is read with the command line's ``--endpoint-url``,
    ``--region`` and ``--s3-max-attempts`` (``max_attempts`` ``None``:
    :data:`utils.S3_MAX_ATTEMPTS`). Returns the raw mapping;
    :func:`merge_settings` converts each value.
    """
    try:
        client = (utils.s3_client(endpoint_url, region, max_attempts=utils.S3_MAX_ATTEMPTS if max_attempts is None
                                  else max_attempts)
                  if utils.is_s3_uri(uri) else None)
        text = utils.read_uri(uri, client).decode("utf-8")
    except (OSError, utils.S3UriError) as exc:
        raise click.UsageError(f"cannot read --config {uri}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - botocore errors: no such bucket, access denied
        raise click.UsageError(f"cannot read --config {uri}: {first_line(exc)}") from None
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
        "s3_max_attempts": s["s3_max_attempts"],
    }
    if s["model"]:
        model = ModelSpec.from_prefix(s["model"], s["epoch"], **model_kwargs)
    elif s["sym_url"] and s["param_url"]:
        model = ModelSpec(s["sym_url"], s["param_url"], **model_kwargs)
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
    preprocess = Preprocess(input_shape=s["input_shape"], mean=s["mean"], std=s["std"],
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
# The options: every option, its type, range and default, in one place.
# DEFAULTS, the YAML layer and --help all read this table; conf/defaults.yaml
# is checked against it by tests/test_config.py. Adding an option is one
# entry here (its default, type and range), a JobConfig field, and the
# line of resolve that fills it.

#: Defaults the executors' JobSpec and the Preprocess recipe already hold:
#: the job takes them from there, so the library and the job cannot drift.
_JOB = {f.name: f.default for f in fields(JobSpec)}
_PREP = Preprocess()


def _csv(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _refuse_secret(ctx, param, value):
    if value is not None:
        raise click.BadParameter(SECRETS_MESSAGE, ctx=ctx, param=param)
    return value


def _count(minimum: int = 1) -> WholeNumber:
    return WholeNumber(min=minimum)


#: Every option: its flags, type, range, default and help. ``infer_main.main`` takes them as its
#: parameters; :data:`PARAMS`, :data:`DEFAULTS` and the YAML layer read them from here.
OPTIONS: list[click.Option] = [
    click.Option(["--config", "config_uri"], metavar="URI", help="YAML file of options (path or s3://); the command line overrides it."),
    click.Option(["--input"], metavar="s3://BUCKET/PREFIX", help="Where the images are."),
    click.Option(["--bucket"], help="Input bucket (the original's flag; use with --prefix)."),
    click.Option(["--prefix"], default="", show_default=False, help="Input key prefix (the original's flag)."),
    click.Option(["--input-manifest"], metavar="URI", help="Score the keys this file names (path or s3://) instead of listing: text (a key or s3://B/K a line), CSV (bucket,key[,size]) or an S3 Inventory manifest.json; --input then filters by bucket and prefix."),
    click.Option(["--list-concurrency"], type=_count(), default=LIST_CONCURRENCY, help="List calls in flight while listing --input."),
    click.Option(["--suffixes"], type=Suffixes(), default=_csv(DEFAULT_SUFFIXES), help="Comma-separated image suffixes, case-insensitive."),
    click.Option(["--model"], metavar="URI", help="Checkpoint prefix: URI-symbol.json and URI-%04d.params."),
    click.Option(["--epoch"], type=_count(0), default=0, help="Checkpoint epoch in the params file name."),
    click.Option(["--labels"], metavar="URI", show_default="synset.txt beside the model, if any", help="Labels file, one per class; '' for none."),
    click.Option(["--sym_url", "--sym-url", "sym_url"], metavar="URI", help="Symbol JSON (the original's flag)."),
    click.Option(["--param_url", "--param-url", "param_url"], metavar="URI", help="Params file (the original's flag)."),
    click.Option(["--label_url", "--label-url", "label_url"], metavar="URI", help="Labels file (the original's flag)."),
    click.Option(["--data-name"], default="data", help="Name of the model's input."),
    click.Option(["--context"], type=DeviceContext(), default="cpu", help="cpu, gpu (the GPU Spark assigned to the task, else partition modulo GPUs) or gpu:N."),
    click.Option(["--handler"], type=HandlerFile(), metavar="URI", help="Python file (path or s3://) defining input_handler(key, data) and/or output_handler(key, outputs)."),
    click.Option(["--output"], metavar="s3://BUCKET/KEY", help="JSON Lines output object; the summary goes to KEY.summary.json."),
    click.Option(["--output_s3_bucket", "--output-s3-bucket", "output_s3_bucket"], show_default="the input bucket", help="Output bucket (the original's flag)."),
    click.Option(["--output_s3_key", "--output-s3-key", "output_s3_key"], help="Output key (the original's flag)."),
    click.Option(["--batch-size", "--batch", "batch_size"], type=_count(), default=_JOB["batch_size"], help="Images per batch and per partition."),
    click.Option(["--top-k"], type=_count(), default=_JOB["top_k"], help="Predictions per image."),
    click.Option(["--input-shape"], type=NumberList(int, count=3), metavar="C,H,W", default=_csv(_PREP.input_shape), help="Model input shape; C is 3 (RGB) or 1 (greyscale)."),
    click.Option(["--mean"], type=NumberList(float), metavar="R,G,B", default=_csv(_PREP.mean), help="Subtracted from 0-255 pixel values, per channel or one for all."),
    click.Option(["--std"], type=NumberList(float, nonzero=True), metavar="R,G,B", default=_csv(_PREP.std), help="Divides after the mean, per channel or one for all."),
    click.Option(["--resize"], type=click.Choice(RESIZE_MODES), default=_PREP.resize, help="stretch to H x W, or short side to H*256/224 then centre crop."),
    click.Option(["--endpoint-url"], metavar="URL", help="S3-compatible endpoint (moto, MinIO); executors use it too."),
    click.Option(["--region"], show_default="boto3's", help="AWS region of the buckets."),
    click.Option(["--limit"], type=_count(), help="Score only the first N keys (sorted)."),
    click.Option(["--dry-run/--no-dry-run"], default=False, help="List, plan, load the model, score one image, check the output may be written; no Spark job. The plan is one JSON object on the last line of standard output."),
    click.Option(["--max-errors"], type=MaxErrors(), default="1%", help="Exit 3 if more images than this fail (still writing all output)."),
    click.Option(["--max-object-bytes"], type=_count(), default=_JOB["max_object_bytes"], help="Larger objects become error lines, undownloaded."),
    click.Option(["--max-image-pixels"], type=_count(), default=_PREP.max_image_pixels, help="Larger images become error lines, undecoded."),
    click.Option(["--io-threads"], type=_count(), default=_JOB["io_threads"], help="Download and decode threads per executor."),
    click.Option(["--max-in-flight"], type=_count(), default=_JOB["max_in_flight"], help="Images downloaded or decoded ahead of the model, per executor."),
    click.Option(["--micro-batch-size"], type=_count(), default=16, help="Images per forward pass (the module's bound batch), at most --batch-size: the model starts on the first ones while the rest download."),
    click.Option(["--threads"], type=_count(), show_default="spark.executorEnv.OMP_NUM_THREADS if set, else the host's cores divided among its executors", help="MXNet/OpenMP threads per executor."),
    click.Option(["--s3-max-attempts"], type=_count(), default=utils.S3_MAX_ATTEMPTS, help="Attempts per S3 request (botocore standard retries)."),
    click.Option(["--s3-reader"], type=click.Choice(utils.S3_READERS), default=_JOB["s3_reader"], help="How images are read: lean signs and sends most GETs itself (about 1.3 ms less CPU each); botocore uses get_object for every one."),
    click.Option(["--app-name"], default="mxnet-batch-inference", help="Spark application name."),
    click.Option(["--log-level"], type=click.Choice(("DEBUG", "INFO", "WARNING", "ERROR"), case_sensitive=False), default="INFO", help="Driver log level."),
    click.Option(["--progress-seconds"], type=FiniteNumber(min=1), default=15.0, help="Seconds between progress lines."),
    click.Option(["--resume"], is_flag=True, default=False, help="Finish an interrupted run: reuse the lines it made durable under OUTPUT.parts/ and score only the keys without one."),
    click.Option(["--overwrite"], is_flag=True, default=False, help="Replace an existing output, and discard an earlier run's progress under OUTPUT.parts/."),
    click.Option(["--output-format"], type=click.Choice(durable.OUTPUT_FORMATS), show_default="parquet if the output key ends in .parquet, else jsonl", help="Output as JSON Lines or Parquet."),
    click.Option(["--decode"], type=click.Choice(DECODE_MODES), default=_PREP.decode, help="draft: a JPEG at least twice the model's size is decoded at 1/2, 1/4 or 1/8 scale (DCT scaling), then resized; exact: every pixel."),
    click.Option(["--precision"], type=click.Choice(PRECISIONS), default="fp32", help="int8: quantize the model once (oneDNN), calibrated on the job's own images, and run only if it agrees with fp32 (--min-agreement)."),
    click.Option(["--calibration-images"], type=_count(), default=256, help="int8: images to calibrate on, and as many held out to check agreement; evenly spaced over the sorted listing."),
    click.Option(["--min-agreement"], type=FiniteNumber(min=0, max=1), default=0.99, help="int8: the share of held-out images whose top-1 class must match fp32's, or the job refuses to run."),
    click.Option(["--int8-exclude"], type=Names(), metavar="LAYER,...", default=(), show_default="none", help="int8: layers (names or shell patterns, e.g. '*conv0*') kept in fp32."),
    click.Option(["--access_key", "--access-key", "access_key"], hidden=True, expose_value=False, callback=_refuse_secret),
    click.Option(["--secret_key", "--secret-key", "secret_key"], hidden=True, expose_value=False, callback=_refuse_secret),
]


#: Every option the command line and --config take, by its setting name.
PARAMS: dict[str, click.Parameter] = {p.name: p for p in OPTIONS if p.expose_value and p.name != "config_uri"}
#: Every setting's default as --help shows it; merge_settings converts them.
DEFAULTS: dict[str, Any] = {name: p.default for name, p in PARAMS.items()}
