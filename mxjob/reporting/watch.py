"""Watch a running job from anywhere: ``python -m mxjob.reporting.watch s3://bucket/predictions/photos.jsonl``.

Reads ``OUTPUT.status.json`` (which the driver refreshes at least every
minute), prints a line whenever it changes, and exits with the job's outcome
once the driver writes its last status. Needs only ``s3:GetObject`` on the
status file, and works with the job in cluster mode, where the driver's own log
is a YARN container's. Exit codes:

====  =====================================================================
0     the job succeeded
1     the job failed
3     the job finished, but more images failed than ``--max-errors`` allows
130   the job was interrupted by SIGINT (143: SIGTERM); 128 + the signal
4     no status appeared within ``--wait-seconds``, or it stopped changing
      for ``--stale-seconds`` while "running" (the driver died unannounced)
2     usage error, or the status cannot be read at all: no AWS credentials,
      or the S3 endpoint cannot be reached
====  =====================================================================

Any code but 0 and 2 is also printed as the last line (``exit 3: more images failed
than --max-errors allows``): ``make watch`` itself exits 2 on any failure, as
make does whenever a command fails.
"""

from __future__ import annotations

import ipaddress
import json
import sys
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import boto3
import botocore.exceptions
import click

from mxjob import outputs
from mxjob.core.errors import EXIT_MEANINGS, EXIT_USAGE, exit_line, first_line
from mxjob.reporting.progress import duration
from mxjob.s3 import clients, uris

#: Exit code when the watch gives up: no status, or one that stopped changing.
EXIT_NO_STATUS = 4
#: The job's exit code by final state, when the status has no ``exit_code``.
EXIT_BY_STATE = {"succeeded": 0, "failed": 1, "interrupted": 130}
#: The watch's codes in its last line: the job's, and its own 4.
WATCH_EXIT_MEANINGS = {**EXIT_MEANINGS, EXIT_NO_STATUS: "no status, or it stopped changing while running"}
#: The keys a moto server accepts (any would do): ``make submit`` gives the job the same for a local endpoint.
LOCAL_S3_KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
#: Error codes with which S3 refuses the keys themselves: the status may exist, the credentials are wrong.
REFUSED_CREDENTIALS = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"})


def status_location(uri: str, endpoint_url: str | None = None, region: str | None = None) -> tuple[str, str]:
    """``(bucket, key)`` of the status of the output ``uri`` (or of ``uri`` itself if it is a status file), as the
    kind of output that claims it keeps it (:meth:`mxjob.outputs.Output.status_location`)."""
    try:
        return outputs.kind_of(uri).status_location(uri, endpoint_url, region)
    except outputs.OutputError as exc:
        raise uris.S3UriError(str(exc)) from None


def is_loopback(endpoint_url: str | None) -> bool:
    """Whether ``endpoint_url`` names a server on this machine (``localhost``, ``127.0.0.1``, ``[::1]``)."""
    host = urlsplit(endpoint_url).hostname if endpoint_url else None
    try:
        return host == "localhost" or (host is not None and ipaddress.ip_address(host).is_loopback)
    except ValueError:  # a DNS name
        return False


def status_client(endpoint_url: str | None, region: str | None):
    """The S3 client to read the status with: the default credential chain's, or moto's keys for a local server.

    The fallback lives here, not in the Makefile's ``watch`` target, because
    the docs run ``python -m mxjob.reporting.watch --endpoint-url http://127.0.0.1:5000``
    without make too, and mxjob cannot import ``demo`` (it is not shipped). It
    applies only when boto3 finds no credentials at all, so a local server
    that checks keys (MinIO with a profile's keys, say) still gets the real ones.
    """
    if is_loopback(endpoint_url) and boto3.session.Session().get_credentials() is None:
        session = boto3.session.Session(**LOCAL_S3_KEYS)
        return session.client("s3", endpoint_url=endpoint_url, region_name=region, config=clients.client_config())
    return clients.s3_client(endpoint_url, region)


def access_problem(exc: Exception) -> str | None:
    """One line for an error that keeps every read of the status from working (credentials, endpoint); else None."""
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return ("no AWS credentials to read the status with: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                "(or AWS_PROFILE), or run where an instance role applies")
    if isinstance(exc, (botocore.exceptions.PartialCredentialsError, botocore.exceptions.CredentialRetrievalError)):
        return f"incomplete AWS credentials ({first_line(exc)}): set both keys, or fix the profile"
    if isinstance(exc, botocore.exceptions.ConnectionError):
        return f"cannot reach S3 ({first_line(exc)}): is the server up, and is --endpoint-url right?"
    code = exc.response["Error"].get("Code") if isinstance(exc, botocore.exceptions.ClientError) else None
    if code in REFUSED_CREDENTIALS:
        return f"S3 refused the credentials ({code}): set valid AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    return None


def describe(status: dict) -> str:
    """One line for a status document: state, done and total, images/s, errors, ETA."""
    state = status["state"]
    if "keys" not in status:  # before the plan: the stage says what the driver is doing (or failed at)
        label = f"{state} ({status['stage']})" if status.get("stage") else state
        scored = "no batch has been scored yet" if state == "running" else "no batch was scored"
        return f"{label}: {scored} ({duration(status.get('elapsed_seconds'))} since the start)"
    keys, batches, rate = status["keys"], status["batches"], status.get("images_per_second")
    eta = ("" if state != "running" else
           f"; ETA {duration(status.get('eta_seconds'))}"
           + (f" (at {status['predicted_end_iso']})" if status.get("eta_seconds") is not None else ""))
    return (f"{state}: {batches['done']:,} of {batches['total']:,} batches, {keys['done']:,} of {keys['total']:,} "
            f"images, {status.get('errors', 0):,} errors; "
            f"{'-' if rate is None else f'{rate:,.1f}'} images/s{eta}")


def exit_code(status: dict) -> int:
    """The job's exit code as the status says: its ``exit_code``, else by state."""
    code = status.get("exit_code")
    return int(code) if code is not None else EXIT_BY_STATE[status["state"]]


def read_status(client, bucket: str, key: str) -> dict | None:
    """The status document, or ``None`` while it does not exist."""
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    return json.loads(body)


def final_lines(status: dict) -> list[str]:
    """What to print once the job has ended: the outcome, the message, where the report is, how to resume."""
    lines = [f"{describe(status)}; exit {exit_code(status)}"]
    if status.get("message"):
        lines.append(f"  {status['message']}")
    lines.append(f"  report: {status.get('report')}")
    if status.get("resume_command"):
        lines.append(f"  resume with: {status['resume_command']}")
    return lines


@dataclass(frozen=True)
class Polling:
    """How often the watch reads the status (``every`` seconds), and when it gives up (exit 4): no status after
    ``wait_seconds``, or a running status unchanged for ``stale_seconds``. The command's three options."""

    every: float
    wait_seconds: float
    stale_seconds: float


def watch(client, bucket: str, key: str, polling: Polling, echo=click.echo, sleep=time.sleep, clock=time.time) -> int:
    """Print the status as it changes until the job ends; return the exit code (see the module's table)."""
    wait_seconds, stale_seconds = polling.wait_seconds, polling.stale_seconds
    started = last_change = clock()
    last_updated, said_waiting = None, False
    while True:
        status = read_status(client, bucket, key)
        now = clock()
        if status is None:
            if not said_waiting:  # at once: a mistyped output must not look like a job that is starting
                echo(f"no status at s3://{bucket}/{key} yet: waiting up to {wait_seconds:.0f} s for a job writing "
                     "this --output to start (a run writes its status within seconds of starting; check the "
                     "output's spelling if it is running already)", err=True)
                said_waiting = True
            if now - started > wait_seconds:
                echo(f"no status at s3://{bucket}/{key} after {wait_seconds:.0f} s: is the job running, and is "
                     "this its --output?", err=True)
                return EXIT_NO_STATUS
        elif status["state"] != "running":
            for line in final_lines(status):
                echo(line)
            return exit_code(status)
        elif status["updated"] != last_updated:
            echo(describe(status))
            last_updated, last_change = status["updated"], now
        elif now - last_change > stale_seconds:
            echo(f"the status has not changed for {stale_seconds:.0f} s while running: the driver may have died; "
                 f"resume with: {status.get('resume_command')}", err=True)
            return EXIT_NO_STATUS
        sleep(polling.every)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.argument("output")
@click.option("--endpoint-url", default=None, help="S3 endpoint (a moto server, say).")
@click.option("--region", default=None, help="AWS region of the bucket.")
@click.option("--every", default=5.0, type=click.FloatRange(min=0.1), help="Seconds between reads of the status.")
@click.option("--wait-seconds", default=900.0, type=click.FloatRange(min=0),
              help="Give up (exit 4) if no status appears within this long.")
@click.option("--stale-seconds", default=300.0, type=click.FloatRange(min=1),
              help="Give up (exit 4) if a running job's status does not change for this long.")
def main(output, endpoint_url, region, every, wait_seconds, stale_seconds):
    """Print the progress of the job writing OUTPUT (s3://bucket/key, or iceberg://CATALOG/NAMESPACE.TABLE) until it
    ends; exit with its outcome."""
    try:
        bucket, key = status_location(output, endpoint_url, region)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="OUTPUT") from exc
    try:
        code = watch(status_client(endpoint_url, region), bucket, key, Polling(every, wait_seconds, stale_seconds))
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
        problem = access_problem(exc)
        if problem is None:
            raise
        # One line, as click prints a usage error: botocore's 40-line stack says nothing more to the user.
        click.echo(f"Error: {problem}", err=True)
        code = EXIT_USAGE
    # make watch exits 2 for any failure: the last line keeps the job's code. A usage error's 2 is make's
    # own, and its one "Error:" line (as click prints one) says all.
    if code not in (0, EXIT_USAGE):
        click.echo(exit_line(code, WATCH_EXIT_MEANINGS), err=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
