"""The checks that need no listing, made before it: they fail in seconds, whatever the input's size.

An existing output (without ``--overwrite`` or ``--resume``), an output that
cannot be written (no such bucket, no ``s3:PutObject``) and a model file that
is not there are each one or two requests away. Made after the listing, the
model load and the int8 quantization, they would be reported after minutes
or hours of a large input. :func:`check_before_listing` makes them first;
``mxjob.outputs.claim.plan_output`` still decides between a fresh run and a resume
once the keys are known.
"""

from __future__ import annotations

import os
import urllib.parse

from mxjob.core.errors import JobError, first_line
from mxjob.model.predictor import ModelSpec
from mxjob.options.config import JobConfig
from mxjob.outputs import dataset
from mxjob.s3 import access, clients, uris


def check_before_listing(cfg: JobConfig, client, yarn_retry: bool = False) -> None:
    """The output and the model's files, checked before any listing; a problem raises :class:`JobError`.

    ``yarn_retry``: this driver is YARN's next attempt, which may resume what
    the earlier attempt left (``plan_output`` decides), so an existing output
    is not refused here.
    """
    check_output(cfg, client, yarn_retry)
    check_model_files(cfg.model)


def check_output(cfg: JobConfig, client, yarn_retry: bool = False) -> None:
    """The output's half of :func:`check_before_listing`: writable, no foreign objects, not there unless replaced
    (or added to: ``--skip-existing``).

    The driver makes it first: once it passes, the run may write the status
    beside the output (``mxjob.run.driver.open_status``).
    """
    if cfg.output_key:
        check_output_writable(cfg, client)
        if cfg.table:  # a table's home holds only the job's own files; its rows are the table's
            if not (cfg.resume or cfg.skip_existing or yarn_retry):
                from mxjob.outputs import iceberg_run  # pyiceberg, for a table output only

                iceberg_run.refuse_rows(cfg)
            return
        found = dataset_contents(cfg, client) if cfg.dataset else None  # one listing for both checks
        if found is not None:  # objects the job did not write are refused whatever the flags
            dataset.refuse_foreign(found, cfg.output_uri)
        # --skip-existing adds to a dataset that exists (mxjob.outputs.existing): it is this run's to find there.
        if not (cfg.overwrite or cfg.resume or cfg.skip_existing or yarn_retry):
            refuse_existing_output(cfg, client, found)


def check_output_writable(cfg: JobConfig, client) -> None:
    """Write and delete a probe beside the output key (:func:`access.check_writable`)."""
    try:
        access.check_writable(client, cfg.output_bucket, cfg.output_key)
    except access.OutputNotWritableError as exc:
        raise JobError(str(exc)) from exc


def dataset_contents(cfg: JobConfig, client) -> dataset.Contents:
    """What is under a dataset output's prefix (:func:`dataset.contents`); unreadable raises :class:`JobError`."""
    try:
        return dataset.contents(client, cfg.output_bucket, cfg.output_key)
    except clients.S3_ERRORS as exc:
        raise JobError(f"cannot list {cfg.output_uri}: {first_line(exc)}; the job needs s3:ListBucket and "
                       "s3:GetObject on the output bucket") from exc


def output_exists(cfg: JobConfig, client) -> bool:
    """Whether the output is there: the object or its summary; for a dataset, its files, ``_SUCCESS`` or summary."""
    if cfg.dataset:
        return dataset_contents(cfg, client).output_exists
    return any(access.object_exists(client, cfg.output_bucket, key) for key in (cfg.output_key, cfg.summary_key))


def refuse_existing_output(cfg: JobConfig, client, found: dataset.Contents | None = None) -> None:
    """An output (or its summary) that exists is refused: replacing it takes ``--overwrite``.

    ``found``: a dataset prefix's contents, when the caller has listed them already.
    """
    try:
        exists = found.output_exists if found is not None else output_exists(cfg, client)
    except clients.S3_ERRORS as exc:
        raise JobError(f"cannot read {cfg.output_uri}: {first_line(exc)}; the job needs s3:GetObject and "
                       "s3:ListBucket on the output bucket") from exc
    if exists:
        raise JobError(f"{cfg.output_uri} (or its summary) already exists; add --overwrite to replace it")


def check_model_files(spec: ModelSpec) -> None:
    """The symbol and params files (and a labels file given by ``--labels``) exist: one HEAD or stat each.

    ``http(s)://`` files are left to the model's load, as are a file's contents.
    """
    files = [spec.symbol_uri, spec.params_uri]
    if spec.labels_uri:  # given by --labels: it must exist (synset.txt beside the model is optional)
        files.append(spec.labels_uri)
    for uri in files:
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
