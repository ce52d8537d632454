"""The driver's checks: the model's files and the handler before the listing, the model itself once the keys are known.

The first ones need no listing, so they take seconds whatever the input's
size: an output that is refused or cannot be written is the output's to say
(:meth:`mxjob.outputs.Output.check`); a model file that is not there is one
request away. Made after the listing, the model load and the int8
quantization, they would be reported after minutes or hours of a large input.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import urllib.parse
from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from mxjob.core import state
from mxjob.core.errors import JobError, first_line
from mxjob.executor.measure import SampleCost
from mxjob.executor.model_check import ModelFacts, load_failure
from mxjob.executor.partition import job_task
from mxjob.inputs import listing
from mxjob.int8.int8_prep import prepare_precision
from mxjob.model.handlers import HandlerError, get_handlers
from mxjob.model.predictor import ModelSpec, Predictor, get_model
from mxjob.model.worker import import_mxnet
from mxjob.options.config import JobConfig
from mxjob.outputs import dataset
from mxjob.outputs.fingerprint import carried_names, job_fingerprint
from mxjob.planning.sizing import bound_batch
from mxjob.run.keys import carried_columns
from mxjob.run.spark_start import SparkStart
from mxjob.run.warm_up import executors_report, killed_for_memory
from mxjob.s3 import access, clients, reads, uris
from mxjob.tasks import Task

log = logging.getLogger(__name__)


def check_model_files(spec: ModelSpec) -> None:
    """The symbol and params files (and a labels file given by ``--labels``) exist: one HEAD or stat each.

    ``http(s)://`` files are left to the model's load, as are a file's contents.
    """
    # A labels file given by --labels must exist (synset.txt beside the model is optional).
    for uri in [spec.symbol_uri, spec.params_uri, *([spec.labels_uri] if spec.labels_uri else [])]:
        if uris.is_s3_uri(uri):
            exists = _s3_file_exists(spec, uri)
        elif uri.startswith(("http://", "https://")):
            continue
        else:
            exists = os.path.isfile(urllib.parse.urlparse(uri).path if uri.startswith("file://") else uri)
        if not exists:
            what = "labels file" if uri == spec.labels_uri else "model file"
            raise JobError(f"{what} missing: {uri} does not exist; check --model (and --epoch) or --labels")


def _s3_file_exists(spec: ModelSpec, uri: str) -> bool:
    """HEAD ``uri`` with the model's S3 settings; an answer other than found or not found raises :class:`JobError`."""
    try:
        bucket, key = uris.parse_s3_uri(uri, need_key=True)
    except uris.S3UriError as exc:
        raise JobError(f"model: {exc}") from None
    client = clients.s3_client(spec.endpoint_url, spec.region, max_attempts=spec.s3_max_attempts)
    try:
        return access.object_exists(client, bucket, key)
    except clients.S3_ERRORS as exc:  # 403: missing without s3:ListBucket, or no s3:GetObject; no such bucket
        raise JobError(f"cannot read the model file {uri}: {first_line(exc)}; it may be missing, or the job "
                       "lacks s3:GetObject on it (and s3:ListBucket on its bucket)") from exc


@dataclass
class DriverCheck:
    """What the driver's checks found: the model loaded here, its summary, the precision report, the fingerprint."""

    #: The model the driver loaded for its check; ``None`` when an executor checked it (:func:`executors_check`).
    classifier: Predictor | None
    model_summary: dict
    precision: dict
    fingerprint: dict
    #: ``--rows-per-file auto``'s ``(rows, why)`` for this model and key list (used by a dataset output only).
    auto_rows: tuple = (0, "")
    #: The estimate's sample, measured by the executor that checked the model; ``None``: the driver measures it.
    sample_cost: SampleCost | None = None


def check_on_driver(cfg: JobConfig, client, images: listing.Listing,
                    start: SparkStart | None = None) -> tuple[JobConfig, DriverCheck]:
    """Load the model, check --top-k against it, quantize for int8, and take the run's fingerprint.

    Before any batch: a bad checkpoint, shape or labels file fails now,
    with its cause, instead of in every task. With ``start``, one executor's
    warm-up has loaded and checked the model and measured the sample
    (:func:`mxjob.executor.model_check.warm_and_check`): its report stands for the
    driver's load, which happens here only if the warm-up could not tell.
    """
    report = executors_report(start)
    if report is not None and report.failure is not None:
        raise JobError(report.failure)
    classifier = load_model_on_driver(cfg) if report is None else None
    killed = killed_for_memory(start)
    if killed is not None:  # the run's tasks would be killed as the warm-up's were
        raise JobError(killed)
    model = ModelFacts.of(classifier) if report is None else report.facts
    task = run_task(cfg)
    for warning in task.warnings(cfg, cfg.output_format == "parquet"):
        log.warning("%s", warning)
    try:
        task.check(cfg, model)
    except ValueError as exc:
        raise JobError(str(exc)) from None
    # What the check found that the executors must load too (an embedding's layer); the fingerprint names it.
    cfg = replace(cfg, model=task.checked_spec(cfg.model, model))
    cfg, precision = prepare_precision(cfg, client, images, classifier)
    summary = model.model_summary()
    fingerprint = job_fingerprint(cfg, model, carried_names(cfg, images))
    # What must exist with the run's columns and fingerprint (an Iceberg table), made or refused before any Spark work.
    if cfg.output is not None:
        cfg.output.open(cfg, row_schema(cfg, task, model, images), fingerprint)
    # Only a dataset or a table cuts files: the keys' mean length costs a pass over every key.
    cuts_files = cfg.output is not None and cfg.output.cuts_files
    auto_rows = auto_rows_per_file(cfg, task, images, summary) if cuts_files else (0, "")
    if classifier is not None:
        keep_for_sample(cfg, classifier)
    return cfg, DriverCheck(classifier, summary, precision, fingerprint, auto_rows,
                            report.cost if report is not None else None)


def keep_for_sample(cfg: JobConfig, classifier: Predictor) -> None:
    """Drop the check's copy of the model from the process's cache unless the driver's sample scores with it.

    The sample loads the model the executors load: int8's quantized one, or
    an embedding's with the layer the check found, are other models; the
    check's copy would then only double the driver's memory while it samples.
    """
    if replace(cfg.job_spec().model, context="cpu") != classifier.spec:
        state.models.clear()


def row_schema(cfg: JobConfig, task: Task, model, images: listing.Listing) -> pa.Schema:
    """The schema of the output's rows: the task's columns for this model, then the carried ones
    (:func:`carried_columns`)."""
    schema = task.result_schema(cfg.job_spec(), model)
    carried = carried_columns(cfg, images)
    return pa.schema(list(schema) + (list(carried.schema) if carried is not None else []),
                     metadata=schema.metadata)


def auto_rows_per_file(cfg: JobConfig, task: Task, images, model_summary: dict) -> tuple[int, str]:
    """``--rows-per-file auto`` for this run (:func:`dataset.auto_rows_per_file`): the keys' mean length, the task's
    row (:meth:`Task.row_bytes`)."""
    keys = getattr(images, "keys", None)
    count = len(images)
    key_bytes = (pc.sum(pc.binary_length(keys)).as_py() or 0) / count if keys is not None and count else 64.0
    return dataset.auto_rows_per_file(key_bytes, *task.row_bytes(cfg, model_summary))


def run_task(cfg: JobConfig) -> Task:
    """The run's task (:func:`mxjob.executor.partition.job_task`); a ``--handler`` it cannot use raises
    :class:`JobError`."""
    try:
        return job_task(cfg.job_spec())
    except HandlerError as exc:
        raise JobError(f"--handler: {exc}") from exc


def prepare_handler(cfg: JobConfig, client) -> JobConfig:
    """Check --handler on the driver, downloading a URI first; return ``cfg`` with its local file.

    A handler that is missing, fails to import or defines neither function
    stops the run here, before any listing or Spark work.
    """
    if not cfg.handler:
        return cfg
    path = cfg.handler
    try:
        data = reads.read_uri(path, client if uris.is_s3_uri(path) else None)
    except FileNotFoundError:
        raise JobError(f"--handler: {path} does not exist") from None
    except Exception as exc:
        raise JobError(f"cannot read --handler {path}: {first_line(exc)}") from exc
    folder = tempfile.mkdtemp(prefix="mxinfer-handler-")
    # Kept until the driver exits: executors fetch it from the driver while the job runs.
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    # Shipped under a name of its own: SparkContext.addFile puts files side by side with
    # the --py-files, so a handler called utils.py would clash with ours (and Spark
    # refuses a second file of one name with different contents).
    path = os.path.join(folder, "mxinfer_handler_" + path.rsplit("/", 1)[-1])
    with open(path, "wb") as handle:
        handle.write(data)
    try:
        handlers = get_handlers(path)
    except HandlerError as exc:
        raise JobError(f"--handler: {str(exc).replace(path, cfg.handler)}") from exc
    log.info("handler %s defines %s", cfg.handler, " and ".join(
        name for name in ("input_handler", "output_handler") if getattr(handlers, name) is not None))
    return replace(cfg, handler_file=path)


def load_model_on_driver(cfg: JobConfig) -> Predictor:
    """The model, loaded on the driver's CPU (the driver need not have a GPU) to check it."""
    import_mxnet()  # timed: the estimate counts each executor's import of MXNet as this one took
    kind = run_task(cfg).model_class
    try:
        # Bound as the executors bind it (at the micro-batch), so the check costs the driver no more memory; and
        # through the worker's cache, where the driver's sample (mxjob.executor.measure.measure) finds it instead of
        # reading and binding the model a second time. size_run drops it.
        return get_model(replace(cfg.model, context="cpu"), cfg.preprocess.input_shape, bound_batch(cfg), kind)
    except Exception as exc:
        raise JobError(load_failure(exc, cfg.model.symbol_uri)) from exc
