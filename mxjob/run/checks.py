"""The driver's checks that need no listing: the model's files, made before it, in seconds whatever the input's size.

An output that is refused or cannot be written is the output's to say
(:meth:`mxjob.outputs.Output.check`); a model file that is not there is one
request away. Made after the listing, the model load and the int8
quantization, they would be reported after minutes or hours of a large input.
"""

from __future__ import annotations

import os
import urllib.parse

from mxjob.core.errors import JobError, first_line
from mxjob.model.predictor import ModelSpec
from mxjob.s3 import access, clients, uris


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
