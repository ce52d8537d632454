"""Every setting of the job, declared once: :data:`SETTINGS`.

Each :class:`Setting` says its flags, type and range, default, help, YAML key
(its ``name``), where it goes (:attr:`Setting.to`) and whether it is part of
the fingerprint that ``--resume`` compares. Everything else is derived from
this table:

- the click options of ``infer_main.main`` (:func:`click_options`) and so ``--help``;
- the YAML layer (``mxjob.options.config.merge_settings`` converts each value with the option's type);
- :class:`mxjob.options.config.JobConfig`'s fields and :class:`mxjob.executor.partition.JobSpec`'s
  option fields (:func:`make_settings_dataclass`);
- the library's defaults (``Preprocess``, ``ModelSpec``, ``Classifier``, ``model_udf`` take
  :data:`mxjob.core.constants.DEFAULT`, generated from this table);
- the fingerprint's settings (``mxjob.outputs.claim.line_settings``);
- ``conf/defaults.yaml`` and ``docs/options.md`` (:func:`defaults_yaml`,
  :func:`options_markdown`; ``make docs`` writes both, ``tests/unit/options/test_settings.py`` checks them).

Adding an executor option is three edits: its :class:`Setting` here with
``to="executor"``, the executor code that reads ``job.<name>``, and a test;
then ``make docs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import click

from mxjob import tasks
from mxjob.core.constants import (
    AUTO,
    DECODE_MODES,
    OUTPUT_FORMATS,
    PRECISIONS,
    RESIZE_MODES,
    S3_READERS,
)
from mxjob.options.option_types import (
    BatchSize,
    CheckedText,
    DeviceContext,
    FiniteNumber,
    HandlerFile,
    Names,
    NumberList,
    OptionalText,
    PluginFiles,
    Suffixes,
    TaskName,
    cluster_shape,
    count,
    parse_max_errors,
)

# ----------------------------------------------------------------------------
# The choices some settings take are declared in mxjob.core.constants (no imports), so that the executors,
# the library and the S3 layer read them without this table; the modules that act on them import them.

#: Where a setting goes (:attr:`Setting.to`).
DESTINATIONS = ("driver", "executor", "model", "preprocess", "resolve")
#: The sections of ``--help``'s reference, ``conf/defaults.yaml`` and ``docs/options.md``, in order.
#: ``tuning`` comes last: options that change how fast the job runs, never what it writes, each kept because
#: ``make bench`` measured a gain (docs/performance.md, "Tuning knobs") or a user needs it; the defaults fit.
SECTIONS = ("input", "model", "output", "scoring", "preprocessing", "S3", "failures", "int8", "estimate", "run",
            "tuning")

REFUSED_SECRETS = ("access_key", "secret_key", "aws_access_key_id", "aws_secret_access_key", "aws_session_token")
SECRETS_MESSAGE = (
    "AWS keys are not accepted as options: they would show in the process list, the Spark UI "
    "and the logs. Credentials come from boto3's default chain: the EMR instance role on a "
    "cluster, or AWS_PROFILE / environment variables / ~/.aws on a laptop."
)


# ----------------------------------------------------------------------------
# The table


def _int8_only(values: dict) -> bool:
    """In the fingerprint only when the run is int8: an fp32 run's lines do not depend on it."""
    return values["precision"] == "int8"


def _object_metadata_only(values: dict) -> bool:
    """In the fingerprint only when on: the lines of a run without it are as they always were."""
    return bool(values["with_object_metadata"])


#: What the options table's Resume column says of a setting in the fingerprint under a condition.
_FINGERPRINT_WHEN = {_int8_only: "int8 only", _object_metadata_only: "when on"}


@dataclass(frozen=True)
class Setting:
    """One option of the job: the command line's ``--flag`` and the YAML's ``name:``.

    Parameters
    ----------
    name : str
        The setting's name: its YAML key, its ``JobConfig`` (and ``JobSpec``) field.
    flags : tuple of str
        Command-line flags, the canonical long one first (``"--dry-run/--no-dry-run"`` for a switch).
    section : str
        One of :data:`SECTIONS`: where the docs and ``conf/defaults.yaml`` list it.
    help : str
        One sentence or two for ``--help`` and the docs.
    default : object
        The value when nothing sets it, as the job uses it (a tuple, not ``"3,224,224"``).
        ``None``: unset (``show_default`` says what that means).
    type : click.ParamType, optional
        Converts and checks the command line's and the YAML's values alike; ``None``: text.
    to : str
        Where the value goes (:data:`DESTINATIONS`): ``driver``, a :class:`~mxjob.options.config.JobConfig`
        field; ``executor``, a ``JobConfig`` field and a :class:`~mxjob.executor.partition.JobSpec` field
        the executors read; ``model``, a :class:`~mxjob.model.predictor.ModelSpec` field; ``preprocess``, a
        :class:`~mxjob.model.preprocess.Preprocess` field; ``resolve``, read only by
        :func:`mxjob.options.config.resolve` to make other fields (input, output, model files).
    fingerprint : bool or callable
        Whether the value changes what a line says about an image, so that a
        ``--resume`` with another value is refused; a callable of the settings
        decides per run (``_int8_only``).
    task : str, optional
        The one task (``mxjob.tasks.names()``) the setting means something for: given
        explicitly with another task it is refused (:data:`TASK_ONLY`), and it
        is in the fingerprint of that task's runs only.
    """

    name: str
    flags: tuple
    section: str
    help: str
    default: Any = None
    type: click.ParamType | None = None
    to: str = "driver"
    fingerprint: Any = False
    task: str | None = None
    metavar: str | None = None
    #: What ``--help`` says the default is, when not the default itself (``None`` defaults).
    show_default: str | None = None
    #: A ``--flag`` that takes no value (``--resume``).
    is_flag: bool = False
    #: The library's value, when the job's default is decided at run time: ``batch_size``'s ``auto``
    #: is a choice the driver makes, so ``Classifier``, ``model_udf`` and ``JobSpec`` take the number
    #: the job falls back to when nothing could be measured. ``None``: the default itself.
    fallback: Any = None

    @property
    def library_default(self) -> Any:
        """The default the library and an executor's ``JobSpec`` use: :attr:`fallback`, else :attr:`default`."""
        return self.default if self.fallback is None else self.fallback

    def __post_init__(self):
        if self.to not in DESTINATIONS:
            raise ValueError(f"{self.name}: to must be one of {DESTINATIONS}, got {self.to!r}")
        if self.section not in SECTIONS:
            raise ValueError(f"{self.name}: section must be one of {SECTIONS}, got {self.section!r}")
        if self.task is not None and self.task not in tasks.names():
            raise ValueError(f"{self.name}: task must be one of {tasks.names()}, got {self.task!r}")
        if self.fingerprint and self.to == "resolve":  # line_settings reads only what reaches a JobConfig
            raise ValueError(f"{self.name}: a to='resolve' setting cannot be in the fingerprint")

    @property
    def flag(self) -> str:
        """The canonical flag: ``--batch-size``."""
        return self.flags[0].split("/")[0]

    def in_fingerprint(self, values: dict) -> bool:
        """Whether this run's fingerprint holds the setting (``values``: every setting of the run)."""
        if self.task is not None and values["task"] != self.task:
            return False  # another task's lines do not depend on it
        return self.fingerprint(values) if callable(self.fingerprint) else bool(self.fingerprint)

    def default_text(self) -> str | None:
        """The default as a command line would give it (``"3,224,224"``); ``None`` when unset."""
        if self.default is None:
            return None
        if isinstance(self.default, bool):
            return "true" if self.default else "false"
        if isinstance(self.default, (tuple, list)):
            return ",".join(_number(v) for v in self.default)
        return _number(self.default)

    def click_option(self) -> click.Option:
        """This setting as the command line's option."""
        show_default = self.show_default
        if show_default is None and self.default in ("", ()):
            show_default = False if self.default == "" else "none"
        default = bool(self.default) if self.is_flag or isinstance(self.default, bool) else self.default_text()
        flag = {"is_flag": True} if self.is_flag else {}  # is_flag=False would stop click seeing --x/--no-x as one
        # named as the table names it, whatever the flags
        return click.Option([*self.flags, self.name], help=self.help, default=default, type=self.type,
                            metavar=self.metavar, show_default=show_default, **flag)


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _s(name, flags, section, help, **kwargs) -> Setting:
    return Setting(name, tuple(flags.split()) if isinstance(flags, str) else tuple(flags), section, help, **kwargs)


def _task_setting(task: tasks.Task, option: tasks.TaskOption) -> Setting:
    """A task's own option (:class:`mxjob.tasks.TaskOption`) as the table's: in the fingerprint of its task's runs."""
    types = {"count": lambda: count(int(option.minimum)), "flag": lambda: None, "text": lambda: None,
             "number": lambda: FiniteNumber(min=option.minimum, max=option.maximum),
             "choice": lambda: click.Choice(option.choices)}
    return Setting(option.name, (option.flag,), "scoring", option.help, default=option.default,
                   type=types[option.kind](), to=option.to, fingerprint=True, task=task.name, metavar=option.metavar,
                   show_default=option.show_default, is_flag=option.kind == "flag")


#: Where the flags with ``_`` in their names come from: kept so that its commands still run.
_ORIGINAL = "from the original mxnet-spark job's command line"

#: Every setting, in the order ``--help`` and the docs show them.
#: The bounds of the numeric options, each from what a machine or S3 allows, so that a typo (--io-threads 1000000000)
#: is refused at the command line, naming the bound, instead of exhausting the driver or every executor.
#: List calls in flight: S3 serves thousands of LISTs a second per prefix, and each call holds a connection.
MAX_LIST_CALLS = 1024
#: Download and decode threads in one executor: each holds a connection and an image in memory.
MAX_IO_THREADS = 256
#: MXNet threads in one executor: more than the largest EC2 instance's vCPUs (448).
MAX_THREADS = 512
#: Images in one batch, in flight, or in one forward pass: a batch of 3x224x224 float32 inputs this large is 60 GB.
MAX_BATCH = 100_000
#: Images in a sample the driver or an executor scores before the run (the estimate, int8's calibration).
MAX_SAMPLE = 100_000
#: S3's largest object (5 TiB).
MAX_OBJECT_BYTES = 5 * 1024 ** 4

SETTINGS: tuple[Setting, ...] = (
    # --- input
    _s("input", "--input", "input", "Where the images are.", metavar="s3://BUCKET/PREFIX", to="resolve"),
    _s("bucket", "--bucket", "input",
       f"Input bucket ({_ORIGINAL}; use with --prefix).", to="resolve"),
    _s("prefix", "--prefix", "input", f"Input key prefix ({_ORIGINAL}; use with --bucket).", default="",
       to="resolve"),
    _s("input_manifest", "--input-manifest", "input",
       "Score the keys this file names (path or s3://) instead of listing: text (a key or s3://B/K a line), CSV "
       "(bucket,key[,size]) or an S3 Inventory manifest.json; --input then filters by bucket and prefix.",
       metavar="URI", to="resolve"),
    _s("suffixes", "--suffixes", "input", "Comma-separated image suffixes, case-insensitive.",
       default=(".jpg", ".jpeg", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp"), type=Suffixes()),
    _s("limit", "--limit", "input", "Score only the first N keys (sorted).", type=count()),
    # --- model
    _s("model", "--model", "model", "Checkpoint prefix: URI-symbol.json and URI-%04d.params.", metavar="URI",
       to="resolve"),
    _s("epoch", "--epoch", "model", "Checkpoint epoch in the params file name.", default=0, type=count(0, 9999),
       to="resolve"),
    _s("labels", "--labels", "model", "Labels file, one per class; '' for none.", metavar="URI",
       show_default="synset.txt beside the model, if any", to="resolve"),
    _s("sym_url", "--sym_url --sym-url", "model", f"Symbol JSON ({_ORIGINAL}).", metavar="URI", to="resolve"),
    _s("param_url", "--param_url --param-url", "model", f"Params file ({_ORIGINAL}).", metavar="URI", to="resolve"),
    _s("label_url", "--label_url --label-url", "model", f"Labels file ({_ORIGINAL}).", metavar="URI", to="resolve"),
    _s("data_name", "--data-name", "model", "Name of the model's input.", default="data", to="model",
       fingerprint=True),
    _s("context", "--context", "model",
       "cpu, gpu (the GPU Spark assigned to the task, else partition modulo GPUs) or gpu:N.", default="cpu",
       type=DeviceContext(), to="model"),
    _s("handler", "--handler", "model",
       "Python file (path or s3://) defining input_handler(key, data) and/or output_handler(key, outputs).",
       metavar="URI", type=HandlerFile()),
    _s("plugin", "--plugin", "model",
       "Python files (paths or s3://, comma-separated) that add tasks or kinds of output: each calls "
       "mxjob.tasks.register or mxjob.outputs.register as it is imported. Imported before --task and --output are "
       "read, and shipped to the executors.", default=(), type=PluginFiles(), metavar="URI[,URI]"),
    # --- output
    _s("output", "--output", "output",
       "Output object (the summary goes to KEY.summary.json), or with a trailing slash a Parquet dataset: files "
       "PREFIX/part-NNNNN.parquet that appear as the job runs, PREFIX/_SUCCESS and PREFIX/_summary.json at its end; "
       "or an Apache Iceberg table, iceberg://CATALOG/NAMESPACE.TABLE (a pyiceberg catalog: .pyiceberg.yaml or "
       "PYICEBERG_CATALOG__<NAME>__* variables), created when absent, its files committed exactly once.",
       metavar="s3://BUCKET/KEY", to="resolve"),
    _s("output_s3_bucket", "--output_s3_bucket --output-s3-bucket", "output",
       f"Output bucket ({_ORIGINAL}).", show_default="the input bucket", to="resolve"),
    _s("output_s3_key", "--output_s3_key --output-s3-key", "output", f"Output key ({_ORIGINAL}).", to="resolve"),
    _s("output_format", "--output-format", "output", "Output as JSON Lines or Parquet.",
       type=click.Choice(OUTPUT_FORMATS, case_sensitive=False),
       show_default="parquet if the output key ends in .parquet, else jsonl",
       to="resolve"),
    _s("with_object_metadata", "--with-object-metadata", "output",
       "Add each object's etag and size in bytes to every output row, as the GET that scored it read them (for an "
       "image whose download failed: the listing's, or null where a manifest names none).",
       default=False, is_flag=True, fingerprint=_object_metadata_only, to="executor"),
    _s("rows_per_file", "--rows-per-file", "output",
       "Rows in each file of a dataset output (--output s3://BUCKET/PREFIX/); auto: files of about 128 MiB, from the "
       "size of a row (the keys, --top-k, the vector's length). A resume keeps the first run's number.",
       default=AUTO, type=BatchSize(), metavar="N|auto", to="driver"),
    _s("resume", "--resume", "output",
       "Finish an interrupted run: reuse the lines it made durable under OUTPUT.parts/ and score only the keys "
       "without one.", default=False, is_flag=True),
    _s("overwrite", "--overwrite", "output",
       "Replace an existing output, and discard an earlier run's progress under OUTPUT.parts/.", default=False,
       is_flag=True),
    _s("skip_existing", "--skip-existing", "output",
       "With a dataset output (--output s3://BUCKET/PREFIX/) or an Iceberg table: score only the listed keys that "
       "have no row in it yet and add their rows (a dataset: as files of this run's own beside the earlier runs'), "
       "after reading its key column once. Nothing new: exit 0 without a Spark job. Refused with a single-object "
       "output and with --overwrite.", default=False, is_flag=True),
    _s("rescore_errors", "--rescore-errors", "output",
       "With --skip-existing: also score again the keys whose row is an error; their new rows replace the error "
       "rows: in a dataset, in the earlier files, each rewritten whole under its own key once this run's files are "
       "complete; in an Iceberg table, in the commit that adds them.", default=False, is_flag=True),
    _s("commit_seconds", "--commit-seconds", "output",
       "With an Iceberg table output: commit the rows written so far at least this often while the job runs (each "
       "commit a snapshot readers see), and at its end; 0: as soon as each file is written.", default=300,
       type=count(0, 86_400), metavar="SECONDS"),
    _s("accept_other_fingerprint", "--accept-other-fingerprint", "output",
       "With an Iceberg table output: add rows to a table whose rows were made with another model or other "
       "settings (its mxinfer.fingerprint property differs, or it has none), instead of refusing. The table keeps "
       "the fingerprint it was created with.", default=False, is_flag=True),
    # --- scoring
    _s("batch_size", "--batch-size --batch", "scoring",
       "Images per batch and per partition (one Spark task); auto: the driver measures its sample and picks a batch "
       "that keeps Spark's per-task cost under 5% of a task, with several batches per executor (64 when nothing "
       "is measured).", default=AUTO, fallback=64, type=BatchSize(MAX_BATCH), metavar="N|auto", to="executor"),
    _s("task", "--task", "scoring",
       "What to make of each image. " + "; ".join(f"{t.name}: {t.summary}" for t in map(tasks.get, tasks.names()))
       + ".", default="classify", type=TaskName(), to="executor", fingerprint=True),
    *(_task_setting(task, option) for task in tasks.every() for option in task.options),
    # --- preprocessing
    _s("input_shape", "--input-shape", "preprocessing", "Model input shape; C is 3 (RGB) or 1 (greyscale).",
       default=(3, 224, 224), type=NumberList(int, count=3), metavar="C,H,W", to="preprocess", fingerprint=True),
    _s("mean", "--mean", "preprocessing", "Subtracted from 0-255 pixel values, per channel or one for all.",
       default=(0.0,), type=NumberList(float), metavar="R,G,B", to="preprocess", fingerprint=True),
    _s("std", "--std", "preprocessing", "Divides after the mean, per channel or one for all.",
       default=(1.0,), type=NumberList(float, nonzero=True), metavar="R,G,B", to="preprocess", fingerprint=True),
    _s("resize", "--resize", "preprocessing", "stretch to H x W, or short side to H*256/224 then centre crop.",
       default="stretch", type=click.Choice(RESIZE_MODES, case_sensitive=False), to="preprocess", fingerprint=True),
    _s("max_image_pixels", "--max-image-pixels", "preprocessing",
       "Larger images become error lines, undecoded (a 64 MP photo passes).", default=64_000_000, type=count(),
       to="preprocess", fingerprint=True),
    _s("decode", "--decode", "preprocessing",
       "draft: a JPEG at least twice the model's size is decoded at 1/2, 1/4 or 1/8 scale (DCT scaling), then "
       "resized; exact: every pixel.", default="draft", type=click.Choice(DECODE_MODES, case_sensitive=False),
       to="preprocess",
       fingerprint=True),
    # --- S3
    _s("endpoint_url", "--endpoint-url", "S3", "S3-compatible endpoint (moto, MinIO); executors use it too.",
       metavar="URL", type=OptionalText(), to="executor"),
    _s("region", "--region", "S3", "AWS region of the buckets.", show_default="boto3's", type=OptionalText(),
       to="executor"),
    _s("s3_max_attempts", "--s3-max-attempts", "S3",
       "Attempts per S3 request (botocore standard retries), for every S3 client of the job.",
       default=5, type=count(1, 100), to="executor"),
    # --- failures
    _s("max_errors", "--max-errors", "failures",
       "Exit 3 if more images than this fail (still writing all output).", default="1%",
       type=CheckedText("N|P%", parse_max_errors)),
    _s("max_object_bytes", "--max-object-bytes", "failures", "Larger objects become error lines, undownloaded.",
       default=50 * 1024 * 1024, type=count(1, MAX_OBJECT_BYTES), to="executor", fingerprint=True),
    # --- int8
    _s("precision", "--precision", "int8",
       "int8: quantize the model once (oneDNN), calibrated on the job's own images, and run only if it agrees "
       "with fp32 (--min-agreement).", default="fp32", type=click.Choice(PRECISIONS, case_sensitive=False),
       to="executor",
       fingerprint=True),
    _s("calibration_images", "--calibration-images", "int8",
       "int8: images to calibrate on, and as many held out to check agreement; evenly spaced over the sorted "
       "listing.", default=256, type=count(1, MAX_SAMPLE), fingerprint=_int8_only),
    _s("min_agreement", "--min-agreement", "int8",
       "int8: the share of held-out images whose top-1 class must match fp32's, or the job refuses to run.",
       default=0.99, type=FiniteNumber(min=0, max=1)),
    _s("int8_exclude", "--int8-exclude", "int8",
       "int8: layers (names or shell patterns, e.g. '*conv0*') kept in fp32; 'auto': the driver searches for the "
       "fewest that pass --min-agreement while int8 stays faster than fp32 (--int8-search-seconds).", default=(),
       type=Names(), metavar="LAYER,...|auto", fingerprint=_int8_only),
    _s("int8_search_seconds", "--int8-search-seconds", "int8",
       "int8: the time --int8-exclude auto may spend trying configurations on the driver, after its one "
       "calibration pass; when it runs out, the job refuses with the best configuration found.", default=120.0,
       type=FiniteNumber(min=0, max=86_400), metavar="SECONDS"),
    # --- estimate
    _s("estimate_images", "--estimate-images", "estimate",
       "Images scored before the run (by the executors as they load the model, else and in --dry-run by the "
       "driver) to estimate its time and cost, at most a sixteenth of the keys to score (never under 8), in "
       "whole micro-batches; 0: no estimate.",
       default=32, type=count(0, MAX_SAMPLE)),
    _s("estimate_cluster", "--estimate-cluster", "estimate",
       "Estimate for a cluster of NODES nodes of VCPUS vCPUs (e.g. 10x16), one executor of VCPUS threads per node "
       "(the layout conf/emr.yaml makes).",
       type=CheckedText("NxVCPUS", cluster_shape),
       show_default="the Spark configuration in force (its executors times their threads)"),
    _s("node_price", "--node-price", "estimate",
       "USD per core node-hour (m5.2xlarge in conf/emr.yaml): the estimate then gives what the cluster bills, "
       "from its start-up to its idle timeout, part by part.",
       type=FiniteNumber(min=0), metavar="USD"),
    _s("master_price", "--master-price", "estimate",
       "USD per master node-hour (m5.xlarge in conf/emr.yaml, about half a core node), with --node-price.",
       type=FiniteNumber(min=0), metavar="USD", show_default="--node-price"),
    # --- run
    _s("dry_run", "--dry-run/--no-dry-run", "run",
       "List, plan, load the model, score one image, check the output may be written; no Spark job. The plan is "
       "one JSON object on the last line of standard output.", default=False),
    _s("app_name", "--app-name", "run", "Spark application name.", default="mxnet-batch-inference"),
    _s("log_level", "--log-level", "run", "Driver log level.", default="INFO",
       type=click.Choice(("DEBUG", "INFO", "WARNING", "ERROR"), case_sensitive=False)),
    _s("progress_seconds", "--progress-seconds", "run", "Seconds between progress lines.", default=15.0,
       type=FiniteNumber(min=1, max=3600)),
    # --- tuning
    _s("list_concurrency", "--list-concurrency", "tuning",
       "List calls in flight while listing --input: enough to hide S3's per-page latency, far below its request "
       "rate per prefix.", default=16, type=count(1, MAX_LIST_CALLS)),
    _s("s3_reader", "--s3-reader", "tuning",
       "lean: most GETs signed and sent by the job itself (about 1.3 ms less CPU each) and a faster listing "
       "parser, both with botocore's internals; botocore: only boto3's public API.",
       default=S3_READERS[0], type=click.Choice(S3_READERS, case_sensitive=False),
       to="executor"),
    _s("io_threads", "--io-threads", "tuning",
       "Download and decode threads per executor: enough requests in flight to hide S3's latency.", default=16,
       type=count(1, MAX_IO_THREADS), to="executor"),
    _s("max_in_flight", "--max-in-flight", "tuning",
       "Images downloaded or decoded ahead of the model, per executor (bounds memory).", default=128,
       type=count(1, MAX_BATCH), to="executor"),
    _s("micro_batch_size", "--micro-batch-size", "tuning",
       "Images per forward pass (the module's bound batch), at most --batch-size: the model starts on the first "
       "ones while the rest download.", default=16, type=count(1, MAX_BATCH), to="executor"),
    _s("threads", "--threads", "tuning", "MXNet/OpenMP threads per executor.", type=count(1, MAX_THREADS),
       to="executor",
       show_default="spark.executorEnv.OMP_NUM_THREADS if set, else the host's cores divided among its executors"),
    _s("forward_lanes", "--forward-lanes", "tuning",
       "Forward passes an executor runs at once, each on its own copy of the model with --threads / lanes "
       "MXNet threads: a pass on several threads stalls whenever one of them is preempted, independent passes "
       "do not. Each lane adds a copy of the model and its activations to the executor's memory.",
       type=count(1, MAX_THREADS), to="executor",
       show_default="the largest divisor of the threads up to 4; 1 on a GPU or with --handler"),
)

#: Every setting by name.
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}

#: The settings that mean something for one task only (:attr:`Setting.task`): given explicitly with another
#: task, they are refused (a --config file's yield to a --task on the command line: ``config.yielding_to_task``).
TASK_ONLY: dict[str, str] = {s.name: s.task for s in SETTINGS if s.task is not None}


def going_to(*destinations: str) -> tuple[Setting, ...]:
    """The settings whose :attr:`Setting.to` is one of ``destinations``, in table order."""
    return tuple(s for s in SETTINGS if s.to in destinations)


def _refuse_secret(ctx, param, value):
    if value is not None:
        raise click.BadParameter(SECRETS_MESSAGE, ctx=ctx, param=param)
    return value


def click_options() -> list[click.Option]:
    """``--config``, every setting's option, and the refused key options: ``infer_main.main``'s parameters."""
    return [
        click.Option(["--config", "config_uri"], metavar="URI",
                     help="YAML file of options (path or s3://); the command line overrides it."),
        *(s.click_option() for s in SETTINGS),
        *(click.Option([f"--{key}", f"--{key.replace('_', '-')}", key], hidden=True, expose_value=False,
                       callback=_refuse_secret) for key in ("access_key", "secret_key")),
    ]


def make_settings_dataclass(name: str, base: type, settings: Iterable[Setting], module: str,
                            extra: Iterable[tuple] = (), with_defaults: bool = True) -> type:
    """A frozen dataclass ``name``: ``base``'s fields, then one field per setting, then ``extra``.

    This is how ``JobConfig`` and ``JobSpec`` get a field for each setting
    without a declaration of their own: the table is the declaration. With
    ``with_defaults``, each field's default is the setting's (the library's
    defaults are the job's, or :attr:`Setting.library_default` where the
    job decides at run time). The class is made importable as
    ``module.name`` so that it pickles to the executors.
    """
    fields = [(s.name, Any, dataclasses.field(metadata={"help": s.help, "flag": s.flag},
                                              **({"default": s.library_default} if with_defaults else {})))
              for s in settings]
    cls = dataclasses.make_dataclass(name, [*fields, *extra], bases=(base,), frozen=True,
                                     namespace={"__doc__": base.__doc__})
    cls.__module__ = module
    cls.__qualname__ = name
    return cls


# ----------------------------------------------------------------------------
# What is generated from the table: conf/defaults.yaml and docs/options.md


