"""Create the EMR cluster and submit the inference job to it, with the AWS CLI.

The settings come from ``conf/emr.yaml``; ``S3`` is the prefix ``make upload``
copied ``dist/`` to::

    python deploy/emr.py create-cluster --s3 s3://bucket/prefix
    python deploy/emr.py add-step --s3 s3://bucket/prefix --cluster-id j-XXXXXXXXXXXXX \\
        [--job-config s3://bucket/prefix/job.yaml] [--job-file my-job.yaml] [-- EXTRA JOB OPTIONS]
    python deploy/emr.py run-job --s3 s3://bucket/prefix [-- EXTRA JOB OPTIONS]    # a cluster for one run
    python deploy/emr.py check-job --job-file my-job.yaml [-- EXTRA JOB OPTIONS]

The job's options (and its config file, when it is here rather than on S3)
are checked by ``infer_main.py``'s own parser and settings code before any
``aws`` call, so a typo is refused here rather than in a YARN container log.

Each command prints the exact ``aws emr ...`` line before running it, so it can
be rerun or adapted by hand. The AWS CLI takes credentials from its default
chain and honours ``AWS_ENDPOINT_URL``, which is how the tests aim it at moto.
Runs on Python 3.9.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click
import yaml
from click.core import ParameterSource

#: The checkout's root: conf/, and the job's own modules (infer_main.py, mxjob/).
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = ROOT / "conf" / "emr.yaml"
ZIP_NAME = "mxinfer_job.zip"
MAIN_NAME = "infer_main.py"
JOB_CONFIG_NAME = "job.yaml"


@dataclass(frozen=True)
class InstanceGroup:
    """One EMR instance group: its EC2 type, how many, (core and task) its vCPUs, and on-demand or spot."""

    instance_type: str
    count: int
    vcpus: int | None = None
    #: ``ON_DEMAND`` or ``SPOT`` (EMR's ``Market``): task nodes may be spot, the core nodes should not.
    market: str = "ON_DEMAND"


@dataclass(frozen=True)
class EmrConfig:
    """Everything ``conf/emr.yaml`` holds, checked once when it is loaded."""

    name: str
    region: str
    release_label: str
    applications: tuple[str, ...]
    log_uri: str
    subnet: str
    key_pair: str
    service_role: str
    instance_profile: str
    idle_timeout_seconds: int | None
    master: InstanceGroup
    core: InstanceGroup
    bootstrap: dict[str, Any]
    step: dict[str, str]
    configurations: tuple[dict[str, Any], ...]
    #: Optional task nodes (often spot): one executor each, like a core node.
    task: InstanceGroup | None = None


def _emr_value(value: Any, where: str) -> str:
    """EMR takes configuration property values as strings only."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ValueError(f"{where}: expected a string, number or boolean, got {value!r}")


def _stringify_configurations(configurations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn YAML numbers and booleans in every ``Properties`` into EMR's strings."""
    out = []
    for conf in configurations:
        conf = dict(conf)
        where = f"configurations[{conf.get('Classification')}]"
        if "Properties" in conf:
            conf["Properties"] = {
                key: _emr_value(value, f"{where}.{key}")
                for key, value in conf["Properties"].items()
            }
        if "Configurations" in conf:
            conf["Configurations"] = _stringify_configurations(conf["Configurations"])
        out.append(conf)
    return out


def spark_defaults(configurations: tuple[dict[str, Any], ...]) -> dict[str, str]:
    """The ``spark-defaults`` properties of an EMR Configurations list."""
    for conf in configurations:
        if conf.get("Classification") == "spark-defaults":
            return dict(conf.get("Properties", {}))
    return {}


def check_one_executor_per_node(conf: EmrConfig) -> None:
    """Raise ValueError unless spark-defaults give one single-task executor per core node.

    MXNet parallelises each batch over the node's vCPUs by itself, so the job
    wants exactly one executor per core node running one task at a time, with
    MXNet's thread pools as wide as the node. The executor count and thread
    counts live in ``spark-defaults`` and must follow ``core`` when it changes.
    """
    props = spark_defaults(conf.configurations)
    if conf.task is not None and conf.task.vcpus != conf.core.vcpus:
        raise ValueError(f"task.vcpus is {conf.task.vcpus}, core.vcpus {conf.core.vcpus}: MXNet's threads are "
                         "set once for every executor, so task nodes need the core nodes' vCPUs")
    want = {
        "spark.dynamicAllocation.enabled": "false",
        "spark.executor.cores": "1",
        "spark.executor.instances": str(conf.core.count + (conf.task.count if conf.task else 0)),
        "spark.executorEnv.OMP_NUM_THREADS": str(conf.core.vcpus),
        "spark.executorEnv.MXNET_CPU_WORKER_NTHREADS": str(conf.core.vcpus),
    }
    wrong = [
        f"{key} is {props.get(key)!r}, want {value!r}"
        for key, value in want.items()
        if props.get(key) != value
    ]
    if wrong:
        raise ValueError(
            "spark-defaults must give one executor per core node "
            f"(core: {conf.core.count} x {conf.core.instance_type}, {conf.core.vcpus} vCPUs): "
            + "; ".join(wrong)
        )


def _instance_group(raw: Any, where: str, *, needs_vcpus: bool) -> InstanceGroup:
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping with instance_type and count")
    unknown = set(raw) - {f.name for f in fields(InstanceGroup)}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    group = InstanceGroup(**raw)
    if group.market not in ("ON_DEMAND", "SPOT"):
        raise ValueError(f"{where}.market: expected ON_DEMAND or SPOT, got {group.market!r}")
    if not isinstance(group.count, int) or group.count < 1:
        raise ValueError(f"{where}.count: expected a positive integer, got {group.count!r}")
    if needs_vcpus and (not isinstance(group.vcpus, int) or group.vcpus < 1):
        raise ValueError(
            f"{where}.vcpus: expected the vCPU count of {group.instance_type}, got {group.vcpus!r}"
        )
    return group


def read_layered(path: Path) -> dict[str, Any]:
    """The YAML mapping at ``path``, laid over the file its ``extends:`` names (beside it), if any.

    ``conf/emr8.yaml`` is ``conf/emr.yaml`` with what EMR 8 changes, so that
    every other setting is declared once. A key of the upper file replaces the
    lower one's, but ``bootstrap`` and ``step`` are merged key by key, and
    ``configurations`` classification by classification (their ``Properties``
    key by key, a property set to null removed; nested ``Configurations``
    the same way).
    """
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path.name}: expected a YAML mapping")
    base = raw.pop("extends", None)
    if base is None:
        return raw
    lower = read_layered(path.parent / base)
    merged = {**lower, **raw}
    for section in ("bootstrap", "step"):
        if section in raw and section in lower:
            merged[section] = {**lower[section], **raw[section]}
    if "configurations" in raw:
        merged["configurations"] = _overlay_classifications(lower.get("configurations", []), raw["configurations"])
    return merged


def _overlay_classifications(lower: list[dict[str, Any]], upper: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """EMR classifications ``upper`` laid over ``lower`` by ``Classification`` (see :func:`read_layered`)."""
    out = {c["Classification"]: dict(c) for c in lower}
    for layer in upper:
        name = layer["Classification"]
        entry = out.setdefault(name, {"Classification": name})
        if "Properties" in layer:
            properties = {**entry.get("Properties", {}), **layer["Properties"]}
            entry["Properties"] = {key: value for key, value in properties.items() if value is not None}
        if "Configurations" in layer:
            entry["Configurations"] = _overlay_classifications(entry.get("Configurations", []),
                                                               layer["Configurations"])
    return list(out.values())


def load_config(path: Path) -> EmrConfig:
    """Read and check ``conf/emr.yaml``.

    Parameters
    ----------
    path : Path
        The YAML file; see ``conf/emr.yaml`` for every key (``conf/emr8.yaml``
        extends it: :func:`read_layered`).

    Returns
    -------
    EmrConfig
        With configuration property values turned into strings.

    Raises
    ------
    ValueError
        On a missing or unknown key, or Spark settings that do not give one
        executor per core node.
    """
    raw = read_layered(path)
    names = {f.name for f in fields(EmrConfig)}
    missing = names - set(raw) - {"idle_timeout_seconds", "task"}
    unknown = set(raw) - names
    if missing or unknown:
        raise ValueError(f"missing keys {sorted(missing)}, unknown keys {sorted(unknown)}")
    for section, keys in (("bootstrap", ("name", "path")), ("step", ("name", "action_on_failure"))):
        if not isinstance(raw[section], dict) or not all(key in raw[section] for key in keys):
            raise ValueError(f"{section} needs the keys {', '.join(keys)}")
    conf = EmrConfig(
        **{
            **raw,
            "idle_timeout_seconds": raw.get("idle_timeout_seconds"),
            "applications": tuple(raw["applications"]),
            "master": _instance_group(raw["master"], "master", needs_vcpus=False),
            "core": _instance_group(raw["core"], "core", needs_vcpus=True),
            "task": _instance_group(raw["task"], "task", needs_vcpus=True) if raw.get("task") else None,
            "configurations": tuple(_stringify_configurations(raw["configurations"])),
        }
    )
    check_one_executor_per_node(conf)
    return conf


def resolve(template: str, s3: str) -> str:
    """Put the upload prefix in place of ``{s3}``: ``"{s3}/x.sh"`` -> ``"s3://b/p/x.sh"``."""
    return template.replace("{s3}", s3.rstrip("/"))


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _market(group: InstanceGroup) -> dict[str, str]:
    """The instance group's spot request: the CLI asks for spot by a bid, capped here at the on-demand price."""
    return {"BidPrice": "OnDemandPrice"} if group.market == "SPOT" else {}


#: What conf/emr.yaml ships in place of the account's own values, and what each key wants instead.
PLACEHOLDER = "CHANGE-ME"
_ACCOUNT_KEYS = {
    "subnet": "a subnet id of your VPC (subnet-0123456789abcdef0)",
    "key_pair": "the name of an EC2 key pair in the region",
    "log_uri": "an s3:// prefix of a bucket of yours for EMR's logs",
}


def placeholders(conf: EmrConfig) -> list[str]:
    """One message per account setting that still holds the shipped placeholder, naming the key and what it wants."""
    return [f"{key}: {getattr(conf, key)!r} (set {key} to {wanted})" for key, wanted in _ACCOUNT_KEYS.items()
            if PLACEHOLDER.lower() in str(getattr(conf, key)).lower()]


def create_cluster_command(conf: EmrConfig, s3: str, aws: str = "aws", steps: Sequence[dict[str, Any]] = ()
                           ) -> list[str]:
    """The ``aws emr create-cluster`` command line for ``conf``.

    Parameters
    ----------
    conf : EmrConfig
        From :func:`load_config`.
    s3 : str
        The prefix ``make upload`` copied ``dist/`` to, replacing ``{s3}``.
    aws : str
        The AWS CLI executable.
    steps : sequence of dict
        Steps (:func:`step_definition`) for the cluster to run once it is up;
        with any, it terminates after the last one instead of idling.

    Returns
    -------
    list of str
        The argument vector, ready for :func:`subprocess.run`.
    """
    groups = [
        {"Name": "master", "InstanceGroupType": "MASTER",
         "InstanceType": conf.master.instance_type, "InstanceCount": conf.master.count},
        {"Name": "core", "InstanceGroupType": "CORE",
         "InstanceType": conf.core.instance_type, "InstanceCount": conf.core.count, **_market(conf.core)},
    ]
    if conf.task is not None:
        groups.append({"Name": "task", "InstanceGroupType": "TASK", "InstanceType": conf.task.instance_type,
                       "InstanceCount": conf.task.count, **_market(conf.task)})
    bootstrap = {
        "Name": conf.bootstrap["name"],
        "Path": resolve(conf.bootstrap["path"], s3),
        "Args": [resolve(arg, s3) for arg in conf.bootstrap.get("args", [])],
    }
    command = [
        aws, "emr", "create-cluster",
        "--region", conf.region,
        "--output", "json",
        "--name", conf.name,
        "--release-label", conf.release_label,
        "--applications", *[f"Name={app}" for app in conf.applications],
        "--log-uri", conf.log_uri,
        "--service-role", conf.service_role,
        "--ec2-attributes", _json({
            "InstanceProfile": conf.instance_profile,
            "SubnetId": conf.subnet,
            "KeyName": conf.key_pair,
        }),
        "--instance-groups", _json(groups),
        "--bootstrap-actions", _json([bootstrap]),
        "--configurations", _json(list(conf.configurations)),
    ]  # fmt: skip
    if steps:  # the cluster ends with its last step, so it never idles and needs no idle timeout
        command += ["--steps", _json(list(steps)), "--auto-terminate"]
    elif conf.idle_timeout_seconds:
        command += ["--auto-termination-policy", f"IdleTimeout={conf.idle_timeout_seconds}"]
    return command


def spark_submit_args(s3: str, job_config: str, job_args: tuple[str, ...] = ()) -> list[str]:
    """The ``spark-submit`` line the step runs: cluster mode, everything read from S3.

    In cluster mode the driver starts on a core node, so the job file, the
    ``--py-files`` zip and the job config are all S3 URIs; nothing is read from
    the machine that submitted the step.
    """
    prefix = s3.rstrip("/")
    return [
        "spark-submit",
        "--deploy-mode", "cluster",
        "--master", "yarn",
        "--py-files", f"{prefix}/{ZIP_NAME}",
        f"{prefix}/{MAIN_NAME}",
        "--config", job_config,
        *job_args,
    ]  # fmt: skip


def step_definition(
    conf: EmrConfig, s3: str, job_config: str, job_args: tuple[str, ...] = (), action_on_failure: str | None = None
) -> dict[str, Any]:
    """One ``command-runner.jar`` step running :func:`spark_submit_args`, as add-steps and create-cluster take it.

    ``action_on_failure`` replaces ``conf.step``'s (CONTINUE, for a cluster that outlives its step).
    """
    return {
        "Type": "CUSTOM_JAR",
        "Name": conf.step["name"],
        "ActionOnFailure": action_on_failure or conf.step["action_on_failure"],
        "Jar": "command-runner.jar",
        "Args": spark_submit_args(s3, job_config, job_args),
    }


def add_steps_command(
    conf: EmrConfig,
    cluster_id: str,
    s3: str,
    job_config: str,
    job_args: tuple[str, ...] = (),
    aws: str = "aws",
) -> list[str]:
    """The ``aws emr add-steps`` command line: one ``command-runner.jar`` step."""
    step = step_definition(conf, s3, job_config, job_args)
    return [
        aws, "emr", "add-steps",
        "--region", conf.region,
        "--output", "json",
        "--cluster-id", cluster_id,
        "--steps", _json([step]),
    ]  # fmt: skip


def run_job_command(
    conf: EmrConfig, s3: str, job_config: str, job_args: tuple[str, ...] = (), aws: str = "aws"
) -> list[str]:
    """``aws emr create-cluster`` with the job as its one step, terminating when the step ends (``make emr-run``).

    The step's ActionOnFailure is TERMINATE_CLUSTER: this cluster exists for
    the one run, so a failed step ends it at once, even with other steps
    queued behind it meanwhile; its logs stay in ``log_uri``.
    """
    step = step_definition(conf, s3, job_config, job_args, action_on_failure="TERMINATE_CLUSTER")
    return create_cluster_command(conf, s3, aws, steps=[step])


def _job_cli() -> tuple[click.Command, Any]:
    """``infer_main.main`` and ``mxjob.options.config``, imported from the checkout's root.

    This file runs as a script, with ``deploy/`` on ``sys.path``, not the root
    the job's modules live in; imported here, not at the top, because only the
    step commands need them (they import boto3 and pyarrow: most of a second).
    """
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import infer_main
    from mxjob.options import config

    return infer_main.main, config


def check_job_args(args: Sequence[str], job_file: Path | None = None) -> str | None:
    """Check the job's options, and its config file if it is here, as ``infer_main.py`` reads them.

    The job's own click parser and :func:`mxjob.options.config.merge_settings` take
    the options, so an unknown one or a bad value is refused with the job's
    message; nothing is listed, no model is read, and Spark does not start.

    Parameters
    ----------
    args : sequence of str
        The options the step gives ``infer_main.py`` after ``--config``.
    job_file : Path, optional
        The local copy of the job config the step reads (``make upload
        JOB=``). Then the file and the options are resolved together
        (:func:`mxjob.options.config.resolve`), as the job will: a missing input,
        model or output, or options that exclude each other, are refused too.
        Without it (the config is on S3), the options are checked alone: their
        names, types and ranges.

    Returns
    -------
    str or None
        The run's output URI, if the options or the file name it.

    Raises
    ------
    click.UsageError
        click's own (``NoSuchOption``, ``BadParameter``, ...): exit code 2.
    """
    main, config = _job_cli()
    ctx = main.make_context("infer_main.py", list(args))
    # Only what the step's command line gives: this machine's environment is not the cluster's.
    given = {key: value for key, value in ctx.params.items()
             if key != "config_uri" and ctx.get_parameter_source(key) == ParameterSource.COMMANDLINE}
    try:
        if job_file is None or ctx.params["config_uri"]:  # a --config in the options is read on the cluster, not here
            return config.merge_settings(given, {})["output"]
        settings = config.merge_settings(given, config.load_yaml(str(job_file)), str(job_file))
        return config.resolve(settings).output_uri
    except click.UsageError as exc:
        exc.ctx = exc.ctx or ctx  # shown with the job's usage line, as the job itself would show it
        raise


def default_aws() -> str:
    """The pinned CLI beside this interpreter (``.venv`` or ``.venv-ops``), else ``aws`` on PATH."""
    beside = Path(sys.executable).parent / "aws"
    if beside.is_file():
        return str(beside)
    return shutil.which("aws") or "aws"


def run(command: list[str], *, dry_run: bool) -> dict[str, Any] | None:
    """Print ``command`` as a shell line, run it, and return its JSON output."""
    click.echo(f"+ {shlex.join(command)}")
    if dry_run:
        return None
    try:
        result = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=False)
    except FileNotFoundError as exc:
        raise click.ClickException(
            f"{command[0]} not found: install awscli (make venv-ops, or requirements-ops.txt) or pass --aws"
        ) from exc
    click.echo(result.stdout, nl=False)
    if result.returncode != 0:
        raise click.ClickException(f"{command[1]} {command[2]} failed (exit {result.returncode})")
    return json.loads(result.stdout) if result.stdout.strip() else {}


def _s3_prefix(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not value.startswith("s3://") or len(value.rstrip("/")) <= len("s3://"):
        raise click.BadParameter(f"expected s3://bucket[/prefix], got {value!r}")
    return value.rstrip("/")


def _cluster_id(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    if not re.fullmatch(r"j-[A-Z0-9]+", value):
        raise click.BadParameter(f"expected an EMR cluster id like j-2AXXXXXXGAPLF, got {value!r}")
    return value


def _load(path: Path) -> EmrConfig:
    try:
        return load_config(path)
    except (ValueError, yaml.YAMLError) as exc:
        raise click.ClickException(f"{path}: {exc}") from exc


def _load_for_new_cluster(path: Path, dry_run: bool = False) -> EmrConfig:
    """:func:`_load`, refusing the shipped placeholders (EMR would fail minutes later, or log to another's bucket);
    a ``--dry-run`` preview prints the command with them, after a warning naming each."""
    conf = _load(path)
    unset = placeholders(conf)
    if unset and dry_run:
        click.echo(f"warning: {path} still has placeholders for your account, shown as they are in the command "
                   f"below; set them before running it: {'; '.join(unset)}", err=True)
    elif unset:
        raise click.ClickException(f"{path} still has {'a placeholder' if len(unset) == 1 else 'placeholders'}"
                                   f" for your account: {'; '.join(unset)}")
    return conf


config_option = click.option(
    "--config", "config_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG, show_default=True, help="Cluster settings.",
)  # fmt: skip
s3_option = click.option(
    "--s3", required=True, callback=_s3_prefix, envvar="S3",
    help="Prefix that `make upload` copied dist/ to (s3://bucket/prefix).",
)  # fmt: skip
aws_option = click.option(
    "--aws", default=default_aws, envvar="AWS_CLI", show_default="awscli beside this python",
    help="AWS CLI executable.",
)  # fmt: skip
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Print the aws command without running it."
)
job_file_option = click.option(
    "--job-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
    help="Local copy of the job config the step reads (make upload's JOB=): checked with JOB_ARGS.",
)  # fmt: skip
job_args_argument = click.argument("job_args", nargs=-1, type=click.UNPROCESSED)


def step_options(command):
    """The options of a command that makes the job's step: its config on S3, its local copy, JOB_ARGS."""
    for option in reversed((
        click.option("--job-config", default=None,
                     help=f"Job config URI for infer_main.py --config  [default: S3/{JOB_CONFIG_NAME}]"),
        job_file_option,
        job_args_argument,
    )):  # fmt: skip
        command = option(command)
    return command


@click.group()
def cli() -> None:
    """Create an EMR cluster for the inference job and submit the job to it."""


@cli.command("create-cluster")
@config_option
@s3_option
@aws_option
@dry_run_option
def create_cluster(config_path: Path, s3: str, aws: str, dry_run: bool) -> None:
    """Start the cluster described by --config, bootstrapped from --s3."""
    conf = _load_for_new_cluster(config_path, dry_run)
    output = run(create_cluster_command(conf, s3, aws), dry_run=dry_run)
    if output and "ClusterId" in output:
        click.echo(f"next: make emr-submit CLUSTER_ID={output['ClusterId']} S3={s3}")


@cli.command("add-step")
@config_option
@s3_option
@aws_option
@dry_run_option
@click.option(
    "--cluster-id", required=True, callback=_cluster_id, envvar="CLUSTER_ID",
    help="From create-cluster's output, or `aws emr list-clusters --active`.",
)  # fmt: skip
@step_options
def add_step(  # noqa: PLR0913 - click passes each option as an argument
    config_path: Path,
    s3: str,
    aws: str,
    dry_run: bool,
    cluster_id: str,
    job_config: str | None,
    job_file: Path | None,
    job_args: tuple[str, ...],
) -> None:
    """Add a cluster-mode spark-submit step; JOB_ARGS (after --) go to infer_main.py, which checks them first."""
    conf = _load(config_path)
    check_job_args(job_args, job_file)
    job_config = job_config or f"{s3}/{JOB_CONFIG_NAME}"
    run(add_steps_command(conf, cluster_id, s3, job_config, job_args, aws), dry_run=dry_run)


@cli.command("run-job")
@config_option
@s3_option
@aws_option
@dry_run_option
@step_options
def run_job(
    config_path: Path,
    s3: str,
    aws: str,
    dry_run: bool,
    job_config: str | None,
    job_file: Path | None,
    job_args: tuple[str, ...],
) -> None:
    """Start a cluster that runs the job as its one step and terminates when it ends; JOB_ARGS as for add-step."""
    conf = _load_for_new_cluster(config_path, dry_run)
    output = check_job_args(job_args, job_file)
    job_config = job_config or f"{s3}/{JOB_CONFIG_NAME}"
    created = run(run_job_command(conf, s3, job_config, job_args, aws), dry_run=dry_run)
    if created and "ClusterId" in created:
        cluster = f"--region {conf.region} --cluster-id {created['ClusterId']}"
        click.echo(f"cluster {created['ClusterId']} runs the job, then terminates, whether the step succeeds or fails\n"
                   f"watch the job: make watch OUTPUT={output or f'<the output in {job_config}>'}\n"
                   f"the step: aws emr list-steps {cluster}\n"
                   f"until the cluster is gone: aws emr wait cluster-terminated {cluster}")


@cli.command("check-job")
@job_file_option
@job_args_argument
def check_job(job_file: Path | None, job_args: tuple[str, ...]) -> None:
    """Check --job-file and JOB_ARGS (after --) as infer_main.py reads them, with no S3 or Spark; exit 2 if refused."""
    check_job_args(job_args, job_file)
    what = " with ".join(part for part in (str(job_file or ""), shlex.join(job_args)) if part)
    click.echo(f"{what or 'no options'}: infer_main.py accepts them")


if __name__ == "__main__":
    cli()
