"""The run's live files beside the output: ``OUTPUT.status.json`` and ``OUTPUT.report.html``.

In cluster mode the driver's log is a YARN container's, out of the user's
sight until the step ends; these two objects are where anyone with
``s3:GetObject`` sees the job from (``python -m mxjob.watch``, a browser).
Both are best-effort: a failed PUT logs one warning and the job goes on, since
the output, not its status, is what the job is for.
"""

from __future__ import annotations

import json
import logging
import threading
import time

from mxjob import report
from mxjob.errors import EXIT_FAILED, first_line
from mxjob.progress import Progress, Tick, Ticks, iso
from mxjob.sidecar import side_key
from mxjob.stats import StatsFold

log = logging.getLogger(__name__)

#: What ``state`` may be; ``running`` until the driver writes the last status.
STATES = ("running", "succeeded", "failed", "interrupted")


def status_key(output_key: str) -> str:
    """The status object's key beside ``output_key``."""
    return side_key(output_key, "status.json")


def report_key(output_key: str) -> str:
    """The report's key beside ``output_key``."""
    return side_key(output_key, "report.html")


def status_document(state: str, p: Progress | None, tick: Tick | None, started: float, where: dict,
                    resume: str | None, exit_code: int | None = None, message: str | None = None) -> dict:
    """The status file's content: state, done and total, images/s, ETA, errors so far, the resume command.

    Parameters
    ----------
    state : str
        One of :data:`STATES`.
    p, tick : Progress, Tick or None
        The latest sample (``None`` before Spark starts, or in a run with nothing to score).
    started : float
        The run's start (epoch seconds).
    where : dict
        ``output``, ``summary``, ``report`` URIs.
    resume : str or None
        The command that resumes the run (shown while it runs and when it did not finish).
    exit_code : int, optional
        The driver's exit code, once it is known: what ``mxjob.watch`` exits with.
    message : str, optional
        Why a failed or interrupted run ended.
    """
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
    now = time.time()
    doc = {"state": state, "updated": now, "updated_iso": iso(now), "started": started, "started_iso": iso(started),
           "elapsed_seconds": round(now - started, 1), **where}
    if p is not None:
        spark = p.now - p.first_start if p.first_start else None
        doc.update({
            "batches": {"done": p.batches_done, "total": p.batches_total},
            "keys": {"done": p.keys_done, "total": p.keys_total}, "errors": p.failed,
            "images_per_second": round(p.keys_done / spark, 2) if spark else None,
            "images_per_second_recent": round(tick.recent_rate, 2) if tick else None,
            "eta_seconds": round(tick.eta_seconds, 1) if tick and tick.eta_seconds is not None else None,
            "predicted_end_iso": iso(tick.predicted_end) if tick else None,
        })
    if exit_code is not None:
        doc["exit_code"] = exit_code
    if message:
        doc["message"] = message
    if state != "succeeded" and resume:
        doc["resume_command"] = resume
    return doc


class RunMonitor:
    """Writes the status file and the report: on every progress tick, and once more when the run ends.

    Parameters
    ----------
    client
        boto3 S3 client for the output bucket.
    bucket, output_key : str
        Where the output goes; the two files go beside it.
    started : float
        The run's start (epoch seconds).
    resume : str or None
        The command that resumes this run.
    context : dict
        Static facts for the report: ``options``, ``fingerprint``, ``input``, ``output``.
    """

    def __init__(self, client, bucket: str, output_key: str, started: float, resume: str | None, context: dict):
        self.client, self.bucket, self.output_key = client, bucket, output_key
        self.started, self.resume, self.context = started, resume, context
        self.where = {"output": f"s3://{bucket}/{output_key}",
                      "summary": f"s3://{bucket}/{side_key(output_key, 'summary.json')}",
                      "report": f"s3://{bucket}/{report_key(output_key)}",
                      "status": f"s3://{bucket}/{status_key(output_key)}"}
        self.ticks = Ticks()
        self.latest: tuple = (StatsFold(), None, None)
        self._warned = False
        self._lock = threading.Lock()

    def on_tick(self, fold: StatsFold, p: Progress, tick: Tick) -> None:
        """A progress tick: refresh both files (one PUT each)."""
        self.latest = (fold, p, tick)
        self.write("running")

    def write(self, state: str, exit_code: int | None = None, message: str | None = None,
              summary: dict | None = None) -> dict:
        """Write the status and the report now; returns the status document."""
        fold, p, tick = self.latest
        doc = status_document(state, p, tick, self.started, self.where, self.resume, exit_code, message)
        page = report.render(report.view(fold, self.ticks.as_list(), doc, summary, self.context))
        with self._lock:  # the progress thread and the main thread's last write must not interleave
            self._put(status_key(self.output_key), json.dumps(doc, indent=1) + "\n", "application/json")
            self._put(report_key(self.output_key), page, "text/html; charset=utf-8")
        return doc

    def ended(self, exc: BaseException) -> None:
        """The run ends with ``exc`` (a :class:`JobError` or :class:`Interrupted`): the last status, the report."""
        signum = getattr(exc, "signum", None)
        state, code = ("interrupted", 128 + signum) if signum else ("failed", EXIT_FAILED)
        self.write(state, code, message=first_line(exc))
        log.info("run %s; status %s, report %s", state, self.where["status"], self.where["report"])

    def _put(self, key: str, text: str, content_type: str) -> None:
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=text.encode("utf-8"), ContentType=content_type)
        except Exception as exc:  # noqa: BLE001 - status is best-effort; the job's output is not
            if not self._warned:
                log.warning("cannot write s3://%s/%s (%s); the job goes on without live status", self.bucket, key,
                            first_line(exc))
                self._warned = True
