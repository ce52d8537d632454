"""The run's live files beside the output: ``OUTPUT.status.json`` and ``OUTPUT.report.html``.

In cluster mode the driver's log is a YARN container's, out of the user's
sight until the step ends; these two objects are where anyone with
``s3:GetObject`` sees the job from (``python -m mxjob.reporting.watch``, a browser).
Both are best-effort: a failed PUT logs one warning and the job goes on, since
the output, not its status, is what the job is for.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass

from mxjob.core.errors import EXIT_FAILED, first_line
from mxjob.executor.stats import StatsFold
from mxjob.outputs.base import side_key
from mxjob.outputs.lease import conditional_refusal
from mxjob.reporting import report
from mxjob.reporting.progress import STATUS_SECONDS, Progress, Tick, Ticks, iso
from mxjob.reporting.record_fields import ABSENT, to_json
from mxjob.reporting.records import STAGES, STATES, Done, Status

log = logging.getLogger(__name__)


def status_key(output_key: str) -> str:
    """The status object's key beside ``output_key``."""
    return side_key(output_key, "status.json")


@dataclass(frozen=True)
class RunFacts:
    """What every status of a run repeats, whatever its state.

    Attributes
    ----------
    started : float
        The run's start (epoch seconds).
    where : dict
        ``output``, ``summary``, ``report`` URIs.
    resume : str or None
        The command that resumes the run (shown while it runs and when it did not finish).
    """

    started: float
    where: dict
    resume: str | None = None


@dataclass(frozen=True)
class RunEnd:
    """How a run ended, for its last status; every field ``None`` while it runs.

    Attributes
    ----------
    exit_code : int, optional
        The driver's exit code, once it is known: what ``mxjob.reporting.watch`` exits with.
    message : str, optional
        Why a failed or interrupted run ended.
    durable_batches : int, optional
        The run's batches durable when it ended (:meth:`RunMonitor.durable_batches`), in place of the last
        tick's count.
    """

    exit_code: int | None = None
    message: str | None = None
    durable_batches: int | None = None


#: The end of a run that has not ended: nothing known yet.
RUNNING = RunEnd()


def status_document(state: str, p: Progress | None, tick: Tick | None, run: RunFacts, end: RunEnd = RUNNING,
                    stage: str | None = None) -> dict:
    """The status file's content (:func:`record_fields.to_json` of a :class:`records.Status`): state, stage, done and
    total, images/s, ETA, errors so far, the resume command.

    Parameters
    ----------
    state : str
        One of :data:`STATES`.
    p, tick : Progress, Tick or None
        The latest sample (``None`` before Spark starts, or in a run with nothing to score).
    run : RunFacts
        The run's start, its files' URIs and the command that resumes it.
    end : RunEnd
        The exit code, why the run ended, its durable batches (:data:`RUNNING` while it runs).
    stage : str, optional
        One of :data:`STAGES`: what the driver is doing, or was doing when the run ended.
    """
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, got {state!r}")
    if stage is not None and stage not in STAGES:
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")
    now = time.time()
    progress = {}
    if p is not None:
        spark = p.now - p.first_start if p.first_start else None
        # An ended run has nothing left to estimate: its tick's ETA would say when a stopped run finishes.
        eta = tick if tick and state == "running" else None
        done, keys_done = p.batches_done, p.keys_done
        if end.durable_batches is not None:  # what the resume will find: its keys counted from the same batches
            done = end.durable_batches
            per_batch = -(-p.keys_total // p.batches_total) if p.batches_total else 0
            keys_done = min(done * per_batch, p.keys_total)
        progress = {
            "batches": Done(done=done, total=p.batches_total),
            "keys": Done(done=keys_done, total=p.keys_total), "errors": p.failed,
            "images_per_second": round(p.keys_done / spark, 2) if spark else None,
            "images_per_second_recent": round(tick.recent_rate, 2) if tick else None,
            "eta_seconds": round(eta.eta_seconds, 1) if eta and eta.eta_seconds is not None else None,
            "predicted_end_iso": iso(eta.predicted_end) if eta else None,
        }
    # where: the output's and its side files' URIs (RunMonitor.where); a field not given is left out.
    return to_json(Status(
        state=state, stage=stage or ABSENT, updated=now, updated_iso=iso(now), started=run.started,
        started_iso=iso(run.started), elapsed_seconds=round(now - run.started, 1), **run.where, **progress,
        exit_code=ABSENT if end.exit_code is None else end.exit_code, message=end.message or ABSENT,
        resume_command=run.resume if state != "succeeded" and run.resume else ABSENT))


class RunMonitor:
    """Writes the status file and the report: from the moment they are this run's (:meth:`claim`) at least every
    minute, on every progress tick, and once more when the run ends.

    Parameters
    ----------
    client
        boto3 S3 client for the output bucket.
    bucket, output_key : str
        The output's home: the two files go beside it (or in it, a prefix).
    started : float
        The run's start (epoch seconds).
    resume : str or None
        The command that resumes this run.
    context : dict
        Static facts for the report: ``options``, ``fingerprint``, ``input``, ``output``.
    output_uri : str, optional
        The output as the user named it (an Iceberg table's URI, not its home); default: the home's.
    """

    def __init__(self, client, bucket: str, output_key: str, started: float, resume: str | None, context: dict,
                 output_uri: str | None = None):
        self.client, self.bucket, self.output_key = client, bucket, output_key
        #: The run's lease on the output (:class:`mxjob.outputs.lease.Lease`), set by the driver: once it is
        #: lost the files are another run's, and nothing is written.
        self.lease = None
        self.started, self.resume, self.context = started, resume, context
        self.where = {"output": output_uri or f"s3://{bucket}/{output_key}",
                      "summary": f"s3://{bucket}/{side_key(output_key, 'summary.json')}",
                      "report": f"s3://{bucket}/{side_key(output_key, 'report.html')}",
                      "status": f"s3://{bucket}/{status_key(output_key)}"}
        self.ticks = Ticks()
        self.latest: tuple = (StatsFold(), None, None)
        #: One of :data:`STAGES`.
        self.stage = STAGES[0]
        #: Whether the two files are this run's to write (:meth:`claim`); until then :meth:`ended` leaves them.
        self.claimed = False
        self._warned = False
        #: Each file's ETag as this run last wrote it: the next write is conditional on it (``If-Match``), so a
        #: run whose lease another has taken never writes over that run's files, even before it learns of it.
        self._etags: dict[str, str] = {}
        #: Set when a conditional write found another run's file: this run writes neither file again.
        self._overtaken = False
        self._lock = threading.Lock()
        self._written = 0.0
        # Set by the last word (or close): the heartbeat stops, and no "running" may follow the last word.
        self._closed = threading.Event()

    def claim(self, stage: str) -> None:
        """The two files are this run's from now on: write "running" at ``stage``, then keep them fresh.

        A heartbeat thread writes them again whenever :data:`STATUS_SECONDS`
        pass without a write: before the first progress tick a listing or an
        int8 search may take many minutes, and ``mxjob.reporting.watch`` gives up on a
        running status that stops changing (the driver's death looks the same).
        """
        if not self.claimed:
            self.claimed = True
            self.enter(stage, force=True)
            threading.Thread(target=self._heartbeat, name="status-heartbeat", daemon=True).start()
        else:
            self.enter(stage)

    def enter(self, stage: str, force: bool = False) -> None:
        """The driver starts ``stage``: the status says so at once, if it is this run's."""
        changed, self.stage = stage != self.stage, stage
        if self.claimed and (changed or force):
            self.write("running")

    def on_tick(self, fold: StatsFold, p: Progress, tick: Tick) -> None:
        """A progress tick: refresh both files (one PUT each)."""
        self.latest = (fold, p, tick)
        self.stage = "scoring"
        self.write("running")

    def write(self, state: str, exit_code: int | None = None, message: str | None = None,
              summary: dict | None = None, durable_batches: int | None = None) -> dict:
        """Write the status and the report now; returns the status document."""
        fold, p, tick = self.latest
        doc = status_document(state, p, tick, RunFacts(self.started, self.where, self.resume),
                              RunEnd(exit_code, message, durable_batches), self.stage)
        page = report.render(report.view(fold, self.ticks.as_list(), doc, summary, self.context))
        with self._lock:  # the progress thread, the heartbeat and the main thread's last write must not interleave
            if state == "running" and self._closed.is_set():
                return doc  # a tick or a heartbeat late for the last word: that stays
            if state != "running":
                self._closed.set()
            self._written = time.time()
            self._put(status_key(self.output_key), json.dumps(doc, indent=1) + "\n", "application/json")
            self._put(side_key(self.output_key, "report.html"), page, "text/html; charset=utf-8")
        return doc

    def ended(self, exc: BaseException) -> None:
        """The run ends with ``exc`` (a :class:`JobError`, :class:`Interrupted`, any error): the last status, the
        report; nothing if the two files are not this run's (they are the run's that wrote an existing output),
        or if the run's last word is written already (a succeeded run's, before Spark's stop)."""
        if not self.claimed or self._closed.is_set():
            return
        signum = getattr(exc, "signum", None)
        state, code = ("interrupted", 128 + signum) if signum else ("failed", EXIT_FAILED)
        self.write(state, code, message=first_line(exc), durable_batches=self.durable_batches(exc))
        log.info("run %s; status %s, report %s", state, self.where["status"], self.where["report"])

    def durable_batches(self, exc: BaseException) -> int | None:
        """This run's batches durable now under the work prefix ``exc.work`` (set by the driver once the run's
        plan is written), or None: no tick yet, no work prefix, or it cannot be read.

        Batches go on becoming durable between the last progress tick and Spark's stop, and the resume
        skips every one of them: the last status says what the resume will find, as ``infer_main`` does.
        """
        work, p = getattr(exc, "work", None), self.latest[1]
        if work is None or p is None:
            return None
        try:
            runs = work.runs()
        except Exception as error:  # noqa: BLE001 - the last word is best-effort; the tick's count stands
            log.warning("cannot read %s for the last status (%s)", work.uri, first_line(error))
            return None
        # The last run is this one only if its plan is the tick's: else this run failed before recording it.
        return len(runs[-1].done) if runs and runs[-1].batches == p.batches_total else None

    def check_lease(self) -> None:
        """Before a durable write: raise :class:`mxjob.outputs.lease.LeaseLost` unless the output's lease is still
        this run's (one HEAD); nothing without a lease."""
        if self.lease is not None:
            self.lease.check()

    def close(self) -> None:
        """Stop the heartbeat (the run has ended, whatever ended it)."""
        self._closed.set()

    def _heartbeat(self) -> None:
        while not self._closed.wait(max(0.0, self._written + STATUS_SECONDS - time.time())):
            if time.time() - self._written >= STATUS_SECONDS:  # else a tick wrote meanwhile: wait from it
                self.write("running")

    def _put(self, key: str, text: str, content_type: str) -> None:
        if self._overtaken or (self.lease is not None and self.lease.lost):
            return  # the files are the run's that took the lease over
        condition = {"IfMatch": self._etags[key]} if key in self._etags and self.lease is not None else {}
        try:
            try:
                self._put_once(key, text, content_type, condition)
            except Exception as exc:
                if not condition or not conditional_refusal(exc):
                    raise
                if not self.lease.holds():
                    self._overtaken = True
                    log.warning("s3://%s/%s was written by another run; this run stops writing its status (its "
                                "lease is checked before the next durable write)", self.bucket, key)
                    return
                # This run's own write, whose answer was lost and which botocore sent again: S3 has it.
                self._put_once(key, text, content_type, {})
        except Exception as exc:  # noqa: BLE001 - status is best-effort; the job's output is not
            if not self._warned:
                log.warning("cannot write s3://%s/%s (%s); the job goes on without live status", self.bucket, key,
                            first_line(exc))
                self._warned = True

    def _put_once(self, key: str, text: str, content_type: str, condition: dict) -> None:
        response = self.client.put_object(Bucket=self.bucket, Key=key, Body=text.encode("utf-8"),
                                          ContentType=content_type, **condition)
        if self.lease is not None:
            self._etags[key] = response["ETag"]
