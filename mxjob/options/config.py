"""The job's settings resolved: the YAML layer, :func:`merge_settings`, :func:`resolve` and :class:`JobConfig`.

Read once at the edge (``infer_main.main``) into a frozen :class:`JobConfig`;
everything after it takes plain values. Every option is declared once, in
:data:`mxjob.options.settings.SETTINGS`: ``--help`` (:data:`OPTIONS`), the YAML layer
(:func:`merge_settings` converts each value with its option's type), the
fields of :class:`JobConfig` and of the executors' ``JobSpec`` all come from
that table. :func:`resolve` checks the settings together and builds what
several of them make at once: the input, the output, the model, the recipe.
"""

from __future__ import annotations

import atexit
import difflib
import io
import math
import os
import shutil
import tempfile
from dataclasses import asdict, fields, is_dataclass
from typing import Any

import click
import yaml

from mxjob import outputs
from mxjob.core import plugins
from mxjob.core.errors import first_line, plural
from mxjob.core.secrets import redact_values
from mxjob.executor.partition import JobSpec
from mxjob.model.predictor import ModelSpec
from mxjob.model.preprocess import Preprocess
from mxjob.options import settings as table
from mxjob.options.option_types import parse_max_errors
from mxjob.options.settings import REFUSED_SECRETS, SECRETS_MESSAGE
from mxjob.s3 import clients, reads, uris

#: ``infer_main.main``'s parameters: ``--config``, one option per setting, the refused key options.
OPTIONS: list[click.Option] = table.click_options()
#: Every option the command line and --config take, by its setting name.
PARAMS: dict[str, click.Parameter] = {p.name: p for p in OPTIONS if p.expose_value and p.name != "config_uri"}
#: Every setting's default, as the job uses it.
DEFAULTS: dict[str, Any] = {s.name: s.default for s in table.SETTINGS}


# ----------------------------------------------------------------------------
# Configuration: read once at the edge into a frozen dataclass


class _JobConfigBase:
    """The resolved, validated settings of one run.

    One field per setting that goes to the driver or the executors
    (:data:`mxjob.options.settings.SETTINGS`, ``to="driver"`` or ``"executor"``),
    plus what :func:`resolve` makes of the others: the input bucket and
    prefix or manifest, the output bucket, key and format, the model and the
    preprocessing recipe. Three fields are not options: ``handler_file`` (the
    driver's local copy of ``--handler``, made by ``prepare_handler``, which
    Spark ships to the executors), ``plugin_files`` (the same of each
    ``--plugin``: :func:`load_plugins`) and ``int8_model`` (the job's int8
    checkpoint, local to the driver; made by ``prepare_precision``).
    """

    @property
    def handler_path(self) -> str | None:
        """The handler file the driver loads and ships: its local copy once made, else --handler as given."""
        return self.handler_file or self.handler

    @property
    def input_uri(self) -> str:
        return self.input_manifest or f"s3://{self.input_bucket}/{self.input_prefix}"

    @property
    def output_uri(self) -> str | None:
        """The output as the user named it (``s3://BUCKET/KEY``, an Iceberg table's ``iceberg://`` URI, ...)."""
        return self.output.uri if self.output is not None else None

    @property
    def output_bucket(self) -> str | None:
        """The bucket of the output's home (:class:`mxjob.outputs.Output`): where its own files go."""
        return self.output.bucket if self.output is not None else None

    @property
    def output_key(self) -> str | None:
        """The key of the output's home: its object's, or a prefix (a dataset's, an Iceberg table's home)."""
        return self.output.key if self.output is not None else None

    @property
    def output_format(self) -> str:
        """The rows' format: ``jsonl`` or ``parquet`` (JSON Lines when a dry run names no output)."""
        return self.output.format if self.output is not None else "jsonl"

    @property
    def summary_key(self) -> str:
        """``KEY.summary.json`` beside one output object, ``PREFIX/_summary.json`` in a prefix."""
        return self.output.side_key("summary.json")

    def line_settings(self) -> dict:
        """Every setting that changes what a line says about an image: those the table marks ``fingerprint``.

        The recipe's settings are one entry, ``preprocess``.
        """
        holders = {"model": self.model, "preprocess": self.preprocess}  # where each setting's value is held
        values = {s.name: getattr(holders.get(s.to, self), s.name) for s in table.SETTINGS if s.to != "resolve"}
        held = ["preprocess" if s.to == "preprocess" else s.name for s in table.SETTINGS if s.in_fingerprint(values)]
        values["preprocess"] = asdict(self.preprocess)
        return {name: values[name] for name in held}

    def job_spec(self) -> JobSpec:
        """What the executors need: every executor setting, the model (int8 once quantized) and the recipe."""
        return JobSpec(model=self.int8_model or self.model, preprocess=self.preprocess, bucket=self.input_bucket,
                       handler=self.handler_path, plugins=self.plugin_files, json_lines=self.output_format == "jsonl",
                       **{s.name: getattr(self, s.name) for s in table.going_to("executor")})

    def options(self) -> dict:
        """The settings as plain JSON values, for the summary: the output as its URI, kind, format and home;
        credentials masked."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {name: asdict(value) if is_dataclass(value) else value for name, value in values.items()}
        if self.output is not None:
            out.update(output=self.output.uri, output_kind=self.output.kind, output_format=self.output_format,
                       output_bucket=self.output_bucket, output_key=self.output_key)
        return redact_values(out)  # a password in --endpoint-url never reaches the summary, status or report


#: What :func:`resolve` makes of the ``to="resolve"``, ``"model"`` and ``"preprocess"`` settings.
_RESOLVED_FIELDS = [
    #: None until the manifest names it (run_job sets it from the listing).
    ("input_bucket", "str | None"), ("input_prefix", str),
    #: --input-manifest: the keys come from this file instead of a listing.
    ("input_manifest", "str | None"),
    ("model", ModelSpec),
    #: Where the rows go (:mod:`mxjob.outputs`), resolved from --output; None for a dry run without one.
    ("output", "outputs.Output | None"), ("preprocess", Preprocess),
]

JobConfig = table.make_settings_dataclass(
    "JobConfig", _JobConfigBase, table.going_to("driver", "executor"), __name__, with_defaults=False,
    extra=[*_RESOLVED_FIELDS, ("handler_file", "str | None", None), ("int8_model", "ModelSpec | None", None),
           ("plugin_files", tuple, ())])


def allowed_errors(max_errors: str, keys: int) -> int:
    number, percent = parse_max_errors(max_errors)
    return math.floor(number * keys / 100) if percent else int(number)


def load_yaml(uri: str, endpoint_url: str | None = None, region: str | None = None,
              max_attempts: int | None = None) -> dict:
    """Read a YAML config from a path or any URI :func:`reads.read_uri` takes (s3:// in cluster mode).

    An s3:// file is read with the command line's ``--endpoint-url``,
    ``--region`` and ``--s3-max-attempts`` (``max_attempts`` ``None``:
    :data:`clients.S3_MAX_ATTEMPTS`). Returns the raw mapping;
    :func:`merge_settings` converts each value.
    """
    try:
        attempts = clients.S3_MAX_ATTEMPTS if max_attempts is None else max_attempts
        client = clients.s3_client(endpoint_url, region, max_attempts=attempts) if uris.is_s3_uri(uri) else None
        text = reads.read_uri(uri, client).decode("utf-8")
    except (OSError, uris.S3UriError) as exc:
        raise click.UsageError(f"cannot read --config {uri}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - botocore errors: no such bucket, access denied
        raise click.UsageError(f"cannot read --config {uri}: {first_line(exc)}") from None
    stream = io.StringIO(text)
    stream.name = uri  # YAML's error marks name the file, not "<unicode string>"
    try:
        data = yaml.load(stream, Loader=_UniqueKeyLoader) or {}
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
        raise click.UsageError(f"--config {uri} has {plural(len(unknown), 'unknown option')}: "
                               f"{'; '.join(map(unknown_key, unknown))}; known options are those of --help "
                               "(with _ for -)")
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key given twice in one mapping (PyYAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"found the key {key!r} twice (first on line {seen[key].line + 1}): give it once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def load_plugins(cli: dict, yaml_settings: dict, config: str = "--config") -> tuple[str, ...]:
    """Import the ``--plugin`` files (the command line's, else the YAML's) before the other options are read, so
    their tasks and outputs are there to check ``--task`` and ``--output`` against; return the driver's local
    copies, which the run ships to the executors (``JobConfig.plugin_files``)."""
    given = cli.get("plugin") if cli.get("plugin") is not None else yaml_settings.get("plugin")
    where = "'--plugin'" if cli.get("plugin") is not None else f"'plugin' in {config}"
    if not given:
        return ()
    files = convert_option("plugin", given, where)
    client = None
    copies = []
    for uri in files:
        if uris.is_s3_uri(uri) and client is None:
            client = clients.s3_client(cli.get("endpoint_url"), cli.get("region"),
                                       max_attempts=cli.get("s3_max_attempts") or clients.S3_MAX_ATTEMPTS)
        try:
            copies.append(user_file_copy(uri, client, "plugin"))
        except Exception as exc:  # noqa: BLE001 - botocore's errors: no such key, access denied
            raise click.UsageError(f"cannot read --plugin {uri}: {first_line(exc)}") from None
    try:
        plugins.load(copies)
    except plugins.PluginError as exc:
        raise click.UsageError(f"--plugin: {exc}") from None
    return tuple(copies)


def user_file_copy(uri: str, client, kind: str) -> str:
    """A local copy of a user's file (a path, or any URI :func:`reads.read_uri` takes), kept until the driver
    exits: the executors fetch it from the driver while the job runs. Named ``mxinfer_<kind>_<its name>``:
    ``SparkContext.addFile`` puts files beside the ``--py-files``, where a file called ``utils.py`` would clash
    with ours (and Spark refuses a second file of one name with different contents)."""
    data = reads.read_uri(uri, client if uris.is_s3_uri(uri) else None)
    folder = tempfile.mkdtemp(prefix=f"mxinfer-{kind}-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = os.path.join(folder, f"mxinfer_{kind}_" + uri.rsplit("/", 1)[-1])
    with open(path, "wb") as handle:
        handle.write(data)
    return path


def unknown_key(key: str) -> str:
    """``key``, with the option it is probably a misspelling of: ``batchsize (did you mean batch_size?)``."""
    close = difflib.get_close_matches(key, list(DEFAULTS), n=2)
    return f"{key} (did you mean {' or '.join(close)}?)" if close else key


class Settings(dict):
    """Merged option values, each converted by its option's click type.

    :meth:`name` says how the user wrote an option, so a message about a YAML
    value names its key and file, and one about a command-line value its flag.
    ``given`` holds the settings the YAML or the command line set (the others
    are defaults). ``notes`` are lines for the INFO log, which the CLI
    configures only once the settings are resolved (their ``log_level``).
    """

    def __init__(self, values: dict, names: dict[str, str], given: frozenset = frozenset(),
                 notes: tuple[str, ...] = ()):
        super().__init__(values)
        self.names, self.given, self.notes = names, given, notes

    def name(self, key: str) -> str:
        return self.names.get(key) or option_flag(key)


def option_flag(key: str) -> str:
    """The first long flag of the option that sets ``key`` (``batch_size`` -> ``--batch-size``)."""
    return PARAMS[key].opts[0] if key in PARAMS else f"--{key.replace('_', '-')}"


def convert_option(key: str, value, hint: str):
    """``value`` converted by the click type of the option ``key``; a bad one raises ``BadParameter`` naming ``hint``.
    """
    if isinstance(value, (dict, list)) and not getattr(PARAMS[key].type, "takes_lists", False):
        # A YAML list or mapping where one value belongs (``batch_size: [1, 2]``): the type would fail unhelpfully.
        raise click.BadParameter(f"expected one {PARAMS[key].type.name} value, got a YAML "
                                 f"{'list' if isinstance(value, list) else 'mapping'}: {value!r}", param_hint=hint)
    try:
        return PARAMS[key].type.convert(value, None, None)
    except click.BadParameter as exc:
        raise click.BadParameter(exc.message, param_hint=hint) from None
    except (TypeError, ValueError, AttributeError) as exc:  # a YAML value of a type the option never takes
        raise click.BadParameter(f"expected a {PARAMS[key].type.name} value, got {type(value).__name__} {value!r}",
                                 param_hint=hint) from exc


def merge_settings(cli: dict, yaml_settings: dict, config: str = "--config") -> Settings:
    """The defaults, then the YAML, then the options given on the command line, all typed.

    Every value goes through its option's click type, so the YAML layer has
    the command line's types and ranges; a YAML ``null`` keeps the default.
    The YAML's options of a task other than the command line's ``--task`` are
    left out (:func:`yielding_to_task`), each with a line in ``notes``.
    """
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    given: set[str] = set()
    for key, default in DEFAULTS.items():
        values[key] = None if default is None else convert_option(key, default, f"the default of {option_flag(key)}")
    left_out = yielding_to_task(cli, yaml_settings)
    for key, value in yaml_settings.items():
        if value is not None and key not in left_out:
            names[key] = f"{key} in {config}"
            given.add(key)
            values[key] = convert_option(key, value, f"{key!r} in {config}")
    for key, value in cli.items():
        if value is not None:
            names.pop(key, None)
            given.add(key)
            values[key] = convert_option(key, value, f"'{option_flag(key)}'")
    notes = tuple(f"{key} in {config} applies to --task {table.TASK_ONLY[key]} only: left out, since the command "
                  f"line chose --task {cli['task']}" for key in left_out)
    return Settings(values, names, frozenset(given), notes)


def yielding_to_task(cli: dict, yaml_settings: dict) -> list[str]:
    """The YAML's task-only options that the command line's ``--task`` overrides: for another task, not on the CLI.

    A file is shared by runs (``conf/demo.yaml`` sets classify's ``top_k``);
    choosing another task on the command line overrides the file's task, and
    so its options for that task. Given with another task on the command line
    itself, or in the same file as that task, they are still refused
    (:func:`check_task_options`).
    """
    task = cli.get("task")
    if task is None:
        return []
    return sorted(key for key, value in yaml_settings.items()
                  if value is not None and cli.get(key) is None and table.TASK_ONLY.get(key, task) != task)


def resolve(settings: Settings) -> JobConfig:
    """Check the merged settings together into a :class:`JobConfig`; a problem raises ``click.UsageError``.

    Settings that go to the driver or the executors are copied as they are;
    the others are read by one named step each: the input, the output, the
    model, the preprocessing recipe.
    """
    in_bucket, in_prefix, input_manifest = resolve_input(settings)
    check_run_mode(settings)
    output = resolve_output(settings, in_bucket)
    plain = {s.name: settings[s.name] for s in table.going_to("driver", "executor")}
    plain["handler"] = local_absolute(plain.get("handler"))
    cfg = JobConfig(**plain, input_bucket=in_bucket, input_prefix=in_prefix, input_manifest=input_manifest,
                    output=output, model=resolve_model(settings), preprocess=resolve_preprocess(settings))
    problem = own_inputs_problem(cfg)
    if problem:
        raise click.UsageError(problem)
    return cfg


def resolve_input(s: Settings) -> tuple[str | None, str, str | None]:
    """``(bucket, prefix, manifest)``: from --input, the original's --bucket/--prefix, or --input-manifest."""
    name = s.name
    if s["input"] and s["bucket"]:
        raise click.UsageError(f"{name('input')} and {name('bucket')} both set the input: give either "
                               "--input s3://BUCKET/PREFIX or --bucket/--prefix, not both")
    if s["input"]:
        refuse_empty_segment(name("input"), s["input"])
        try:
            bucket, prefix = uris.parse_s3_uri(s["input"])
        except uris.S3UriError as exc:
            raise click.UsageError(f"{name('input')}: {exc}") from None
    elif s["bucket"]:
        bucket, prefix = s["bucket"], s["prefix"] or ""
    elif s["input_manifest"]:
        bucket, prefix = None, ""  # the manifest names the bucket
    else:
        raise click.UsageError("no input: give --input s3://BUCKET/PREFIX (or --bucket and --prefix), "
                               "or --input-manifest URI")
    manifest = str(s["input_manifest"]) if s["input_manifest"] else None
    if manifest and "://" not in manifest and not os.path.isfile(manifest):
        raise click.UsageError(f"--input-manifest {manifest}: no such file (in cluster mode give an s3:// URI)")
    return bucket, prefix, manifest


def refuse_empty_segment(flag: str, uri: str) -> None:
    """Refuse an S3 URI with an empty path segment (``s3://B//x.jsonl``): S3 keys keep every ``/``, so what the
    user meant and what would be written differ; say the URI to write instead."""
    scheme, _, rest = uri.partition("://")
    if scheme.startswith("s3") and "//" in rest:
        fixed = f"{scheme}://" + "/".join(part for part in rest.split("/") if part) + ("/" if uri.endswith("/") else "")
        raise click.UsageError(f"{flag} {uri}: an empty path segment (//) names another key than it seems; "
                               f"did you mean {fixed}?")


def resolve_output(s: Settings, in_bucket: str | None) -> outputs.Output | None:
    """The run's output (:func:`mxjob.outputs.resolve`): from --output, or the original's --output_s3_bucket (default:
    the input's) and --output_s3_key; ``None`` only for a dry run."""
    name = s.name
    if s["output"] and (s["output_s3_key"] or s["output_s3_bucket"]):
        other = "output_s3_key" if s["output_s3_key"] else "output_s3_bucket"
        raise click.UsageError(f"{name('output')} and {name(other)} both set the output: give either "
                               "--output s3://BUCKET/KEY or --output_s3_bucket/--output_s3_key")
    uri = s["output"]
    if not uri and s["output_s3_key"]:
        bucket = s["output_s3_bucket"] or in_bucket
        if bucket is None:
            raise click.UsageError("--output_s3_key needs --output_s3_bucket with --input-manifest (or use --output)")
        uri = f"s3://{bucket}/{s['output_s3_key'].lstrip('/')}"
    elif not uri and s["output_s3_bucket"]:
        raise click.UsageError(f"{name('output_s3_bucket')} needs --output_s3_key")
    if not uri:
        if not s["dry_run"]:
            raise click.UsageError("no output: give --output s3://BUCKET/KEY (for example predictions.jsonl)")
        if s["skip_existing"]:
            raise click.UsageError(f"{name('skip_existing')} adds rows to an output, and this run has none: give "
                                   "--output")
        return None
    refuse_empty_segment(name("output"), uri)
    try:
        return outputs.resolve(uri, s)
    except outputs.OutputError as exc:
        raise click.UsageError(str(exc)) from None


def own_inputs_problem(cfg: JobConfig) -> str | None:
    """Why the output would overwrite what the run reads or be read by the next run, if it would.

    What the run writes is the output's home: an object and the files beside it (``KEY``, ``KEY.*``), or a
    prefix and everything under it (a dataset, a table's home). None of the model's files, the labels, the
    handler or the manifest may be there, and none of it may be under the input prefix, where the next run
    would list it as input. No request: the URIs alone decide, so :func:`resolve` refuses it as a usage error;
    an Iceberg table's home is known only from its catalog, and the driver asks again once it is.
    """
    bucket, key = cfg.output_bucket, cfg.output_key
    if bucket is None:
        return None

    def written(uri: str) -> bool:
        other_bucket, other_key = uris.parse_s3_uri(uri)
        if other_bucket != bucket:
            return False
        return other_key.startswith(key) if key.endswith("/") else other_key == key or other_key.startswith(key + ".")

    reads = [("the model's symbol file", cfg.model.symbol_uri), ("the model's params file", cfg.model.params_uri),
             ("--labels", cfg.model.labels_uri), ("--handler", cfg.handler), ("--input-manifest", cfg.input_manifest)]
    for what, uri in reads:
        if uri and uris.is_s3_uri(uri) and written(uri):
            return (f"--output {cfg.output_uri} would overwrite {what} ({uri}), which this run reads; write the "
                    "output elsewhere")
    if not cfg.input_manifest and cfg.input_bucket == bucket and key.startswith(cfg.input_prefix):
        return (f"--output {cfg.output_uri} writes under the input s3://{bucket}/{cfg.input_prefix} "
                f"(at s3://{bucket}/{key}): the next run would list the job's own files as input, and one "
                "of them may be an input key; write the output outside the input prefix")
    return None


def check_run_mode(s: Settings) -> None:
    """The settings that exclude each other: --resume and --overwrite; int8 on a GPU; another task's options;
    --skip-existing's; --master-price without --node-price."""
    check_task_options(s)
    if s["resume"] and s["overwrite"]:
        raise click.UsageError("give --resume (finish an earlier run) or --overwrite (start again), not both")
    if s["precision"] == "int8" and s["context"] != "cpu":
        raise click.UsageError(f"{s.name('precision')} int8 runs on CPUs (oneDNN); use --context cpu, or "
                               "--precision fp32 on GPUs")
    if s["rescore_errors"] and not s["skip_existing"]:
        raise click.UsageError(f"{s.name('rescore_errors')} scores again the error rows that --skip-existing would "
                               "keep: give it with --skip-existing")
    if s["skip_existing"] and s["overwrite"]:
        raise click.UsageError(f"{s.name('skip_existing')} keeps the output's rows and adds the new keys; "
                               "--overwrite replaces the output: give one or the other")
    if s["master_price"] is not None and s["node_price"] is None:
        raise click.UsageError(f"{s.name('master_price')} prices the master beside the core nodes: give the core "
                               "nodes' --node-price too")


def check_task_options(s: Settings) -> None:
    """Refuse an option of one task given with another (``--top-k`` with ``--task embed``): it would do nothing."""
    for key, task in table.TASK_ONLY.items():
        if key in s.given and s["task"] != task:
            raise click.UsageError(f"{s.name(key)} applies to --task {task} only, and this run's task is "
                                   f"{s['task']}: leave it out")


def resolve_model(s: Settings) -> ModelSpec:
    """The :class:`ModelSpec`: --model PREFIX, or the original's --sym_url/--param_url; labels; the model settings."""
    name = s.name
    if s["model"] and (s["sym_url"] or s["param_url"]):
        raise click.UsageError(f"{name('model')} and {name('sym_url' if s['sym_url'] else 'param_url')} both "
                               "set the model: give either --model PREFIX or --sym_url and --param_url")
    if s["labels"] and s["label_url"]:
        raise click.UsageError(f"{name('labels')} and {name('label_url')} both set the labels: give one")
    # labels_uri "" means no labels at all; None means synset.txt beside the model if it exists.
    kwargs = {"labels_uri": local_absolute(s["labels"] if s["labels"] is not None else s["label_url"]),
              "endpoint_url": s["endpoint_url"], "region": s["region"], "s3_max_attempts": s["s3_max_attempts"],
              **{m.name: s[m.name] for m in table.going_to("model")}}
    if s["model"]:
        return ModelSpec.from_prefix(local_absolute(s["model"]), s["epoch"], **kwargs)
    if s["sym_url"] and s["param_url"]:
        return ModelSpec(local_absolute(s["sym_url"]), local_absolute(s["param_url"]), **kwargs)
    raise click.UsageError("no model: give --model PREFIX (PREFIX-symbol.json, PREFIX-0000.params) "
                           "or --sym_url and --param_url")


def local_absolute(value: str | None) -> str | None:
    """A local path made absolute here, at the command line's edge: the executors, and a cluster-mode driver's
    checks, run in other folders. A URI (``s3://``, ``file://``, ``http://``), an absolute path, ``""`` and
    ``None`` stay as they are."""
    if not value or "://" in value or os.path.isabs(value):
        return value
    return os.path.abspath(value)


def resolve_preprocess(s: Settings) -> Preprocess:
    """The :class:`Preprocess` recipe from the ``to="preprocess"`` settings, checked together."""
    name = s.name
    channels = s["input_shape"][0]
    if channels not in (1, 3):
        raise click.UsageError(f"{name('input_shape')}: C (the first of C,H,W) must be 3 (RGB) or 1 "
                               f"(greyscale), got {channels}")
    for key in ("mean", "std"):
        if len(s[key]) not in (1, channels):
            raise click.UsageError(f"{name(key)} needs 1 or {channels} values (one per channel of "
                                   f"{name('input_shape')}), got {len(s[key])}")
    return Preprocess(**{p.name: s[p.name] for p in table.going_to("preprocess")})
