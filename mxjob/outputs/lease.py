"""The output's lease: one run at a time on one output, claimed with S3 conditional writes.

A run takes the lease (``OUTPUT.lease.json``, ``PREFIX/_lease.json`` in a
dataset or a table's home) before it writes anything beside the output:
``PutObject`` with ``If-None-Match: *`` creates it only if it is absent. The
lease names its run (run id, host, YARN application, start) and when it
expires. The status heartbeat renews it with ``If-Match`` on its ETag, so a
renewal fails once another run has taken it; before every durable write the
driver checks that the lease is still its own (:meth:`Lease.check`). A run
that finds a live lease is refused before any work and told whose it is. A
lease not renewed for :data:`LEASE_SECONDS` is a dead run's: the next run
takes it over with ``If-Match`` on the dead one's ETag, so of two runs taking
over at once only one wins. YARN's next attempt of the same application takes
over its first attempt's lease at once, and so does a run on the host of a
killed driver whose process is gone. S3 has had both conditions since 2024.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from botocore.exceptions import BotoCoreError, ClientError
from urllib3.exceptions import ProtocolError

from mxjob.core.errors import JobError, first_line

log = logging.getLogger(__name__)

#: A lease not renewed for this long is a dead run's: five of the status heartbeat's minutes
#: (mxjob.reporting.progress.STATUS_SECONDS), so a driver paused by a long garbage collection keeps it.
LEASE_SECONDS = 300.0
#: How often a run tries to take a lease that changes hands under it (released, taken over) before it gives up.
_TRIES = 3


class LeaseHeld(JobError):
    """Another run holds the output's lease: this run is refused before it writes anything."""


class LeaseLost(JobError):
    """This run's lease was taken over (it expired while the run hung) or deleted: the run stops, publishing
    nothing."""


#: A connection cut or a body cut off: what a flaky network does to a request whose answer botocore has begun.
_CUT = (ProtocolError, BotoCoreError)


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _precondition_failed(exc: ClientError) -> bool:
    return _error_code(exc) in ("PreconditionFailed", "412", "ConditionalRequestConflict")


def _missing(exc: ClientError) -> bool:
    return _error_code(exc) in ("NoSuchKey", "404", "NotFound")


def conditional_refusal(exc: BaseException) -> bool:
    """Whether S3 refused a conditional write because the object is not as the condition said: another ETag
    (``If-Match``), one there already (``If-None-Match``), or none at all."""
    return isinstance(exc, ClientError) and (_precondition_failed(exc) or _missing(exc))


def holder_facts(run_id: str, output_uri: str, application: str | None, attempt: int) -> dict:
    """What the lease says about the run that holds it."""
    now = time.time()
    return {"run_id": run_id, "output": output_uri, "host": socket.gethostname(), "pid": os.getpid(),
            "yarn_application": application, "yarn_attempt": attempt, "started": round(now, 3),
            "started_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}


def dead_here(holder: dict) -> bool:
    """Whether the lease's run was on this host and its process is gone (killed, crashed): no need to wait for the
    lease to expire. A run on another host is judged by the expiry alone."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid == os.getpid():
        return False
    import psutil  # here: the watch's ops venv imports this module and has no psutil; only the driver asks

    try:  # a killed driver whose parent died with it may linger as a zombie until something reaps it
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # another user's process: alive, as far as can be told
        return False


def _takeover_reason(holder: dict, other: dict, now: float) -> str | None:
    """Why this run may take ``other``'s lease at once, or None: the same YARN application's earlier attempt, a run
    that stopped renewing it (expired), or a dead process on this host."""
    if other.get("yarn_application") and other.get("yarn_application") == holder.get("yarn_application"):
        return "this YARN application's earlier attempt"
    if float(other.get("expires", 0)) <= now:
        return "a run that stopped renewing it"
    if dead_here(other):
        return "a run on this host whose process is gone"
    return None


def describe(holder: dict, now: float | None = None) -> str:
    """``run R on host H (YARN application A), started T, lease renewed N s ago``: whose a lease is."""
    now = time.time() if now is None else now
    app = f" (YARN application {holder['yarn_application']})" if holder.get("yarn_application") else ""
    renewed = f", lease renewed {max(0.0, now - float(holder['renewed'])):.0f} s ago" if "renewed" in holder else ""
    return (f"run {holder.get('run_id', '?')} on host {holder.get('host', '?')}{app}, started "
            f"{holder.get('started_iso', '?')}{renewed}")


@dataclass
class Lease:
    """This run's lease on its output: taken by :meth:`take`, renewed, checked and released by the run."""

    client: object
    bucket: str
    key: str
    holder: dict
    etag: str = ""
    seconds: float = LEASE_SECONDS
    #: Set when a renewal or a check finds the lease another's: every later check raises at once.
    lost: str = ""
    renewals: int = 0
    #: The S3 requests this lease made, and the seconds they took (the summary's ``lease``).
    requests: int = 0
    spent: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    #: A renewal and the release never overlap (the release must see the ETag the last renewal got).
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    @property
    def run_id(self) -> str:
        """This run's id, which its lease names and its folder under the work prefix carries."""
        return self.holder["run_id"]

    def _body(self, now: float) -> bytes:
        doc = dict(self.holder, renewed=round(now, 3), expires=round(now + self.seconds, 3), lease_seconds=self.seconds)
        return (json.dumps(doc, indent=1) + "\n").encode("utf-8")

    def _call(self, operation: str, **params):
        """One S3 request, counted and timed; a GET's body read whole. A connection cut mid-answer (which
        botocore's own retries leave to the caller once the headers are in) is tried again, twice."""
        for attempt in range(_TRIES):
            started = time.monotonic()
            try:
                response = getattr(self.client, operation)(Bucket=self.bucket, Key=self.key, **params)
                if operation == "get_object":
                    response = {**response, "Body": response["Body"].read()}
                return response
            except _CUT as exc:
                if attempt == _TRIES - 1:
                    raise
                log.debug("lease %s: %s cut off (%s); trying again", self.uri, operation, first_line(exc))
                time.sleep(0.2 * 2 ** attempt)
            finally:
                self.requests += 1
                self.spent += time.monotonic() - started
        raise AssertionError("unreachable")

    def _adopt(self, found: tuple[dict, str] | None) -> bool:
        """Whether ``found`` (:meth:`_read`) is this run's own lease (a write whose answer was lost, then retried,
        changed it itself); if so, its ETag is taken as this run's."""
        if found is None or found[0].get("run_id") != self.holder["run_id"]:
            return False
        self.etag = found[1]
        return True

    def _still_mine(self) -> bool:
        """After the ETag was found changed: read the lease once; this run's (:meth:`_adopt`), or lost."""
        found = self._read()
        if self._adopt(found):
            return True
        why = "taken over or deleted while this run held it"
        self.lost = f"{why}; now {describe(found[0])}" if found else why
        log.error("lease %s lost: %s", self.uri, self.lost)
        return False

    def _put(self, **condition) -> None:
        response = self._call("put_object", Body=self._body(time.time()), ContentType="application/json", **condition)
        self.etag = response["ETag"]

    def _read(self) -> tuple[dict, str] | None:
        """The lease there now and its ETag; None if there is none."""
        try:
            response = self._call("get_object")
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        try:
            doc = json.loads(response["Body"])
        except ValueError:
            doc = {}
        return (doc if isinstance(doc, dict) else {}), response["ETag"]

    def take(self, *, resume: bool, output_uri: str) -> None:
        """Take the lease, or raise :class:`LeaseHeld` naming the run that holds it (:class:`JobError` if S3
        cannot be asked)."""
        with self._asking_s3():
            self._take(resume=resume, output_uri=output_uri)

    @contextlib.contextmanager
    def _asking_s3(self):
        """S3's refusal or a connection lost, as one line saying what the lease needs."""
        try:
            yield
        except (ClientError, *_CUT) as exc:
            raise JobError(f"cannot take the output's lease {self.uri}: {first_line(exc)}; the job needs "
                           "s3:GetObject, s3:PutObject and s3:DeleteObject beside the output") from exc

    def _take(self, *, resume: bool, output_uri: str) -> None:
        for _ in range(_TRIES):
            try:
                self._put(IfNoneMatch="*")
                return
            except ClientError as exc:
                if not _precondition_failed(exc):
                    raise
            found = self._read()
            if self._adopt(found):
                return
            if found is None:
                continue  # released meanwhile: try to create it again
            other, etag = found
            now = time.time()
            why = _takeover_reason(self.holder, other, now)
            if why is not None:
                try:
                    self._put(IfMatch=etag)
                except ClientError as exc:
                    if conditional_refusal(exc):
                        continue  # another run took it over first: read it again
                    raise
                log.warning("took over the lease on %s from %s (%s)", output_uri, why, describe(other, now))
                return
            raise LeaseHeld(self._held_message(other, now, resume=resume, output_uri=output_uri))
        raise LeaseHeld(f"the lease on {output_uri} ({self.uri}) changed hands {_TRIES} times while this run tried "
                        f"to take it: another run is starting on this output; wait for it, then run again")

    def refuse_if_held(self, *, resume: bool, output_uri: str) -> None:
        """Raise :class:`LeaseHeld` if another run holds a live lease; reads only (a dry run, and every run before
        its read-only refusals, so that those never describe a live run's work as an earlier run's)."""
        with self._asking_s3():
            found = self._read()
        if found is None:
            return
        other, now = found[0], time.time()
        if _takeover_reason(self.holder, other, now) is None:
            raise LeaseHeld(self._held_message(other, now, resume=resume, output_uri=output_uri))

    def _held_message(self, other: dict, now: float, *, resume: bool, output_uri: str) -> str:
        left = max(0.0, float(other.get("expires", 0)) - now)
        then = "--resume then takes it over" if resume else "a run started then takes it over"
        return (f"{output_uri} is being written by another run: {describe(other, now)}. This run wrote nothing. "
                f"Wait for it to end (follow it with: make watch OUTPUT={output_uri}, or python -m "
                f"mxjob.reporting.watch {output_uri}); if that run is dead, its lease expires in {left:.0f} s "
                f"without renewal, and {then}")

    def renew(self) -> bool:
        """Renew the lease (``If-Match`` on its ETag); False, and :attr:`lost` set, if it is no longer ours."""
        with self._lock:
            if self.lost or self._stop.is_set():
                return False
            try:
                try:
                    self._put(IfMatch=self.etag)
                except ClientError as exc:
                    if not conditional_refusal(exc):
                        raise
                    if not self._still_mine():
                        return False
            except (ClientError, *_CUT) as exc:  # S3 unreachable for now: the lease lasts five heartbeats
                log.warning("cannot renew the lease %s (%s); trying again at the next heartbeat", self.uri,
                            first_line(exc))
                return True
            self.renewals += 1
            return True

    def keep_renewed(self, every: float) -> None:
        """Renew the lease every ``every`` seconds in a thread of its own until :meth:`release` or its loss:
        one conditional PUT each time (the status heartbeat's period: :data:`mxjob.reporting.progress.STATUS_SECONDS`).
        """
        def renew_until_stopped():
            while not self._stop.wait(every) and self.renew():
                pass

        threading.Thread(target=renew_until_stopped, name="lease-renewal", daemon=True).start()

    def check(self) -> None:
        """Raise :class:`LeaseLost` unless the lease is still this run's (one HEAD): before a durable write."""
        if not self.lost:
            try:
                etag = self._call("head_object")["ETag"]
            except ClientError as exc:
                if not _missing(exc):
                    raise
                etag = ""
            if etag != self.etag:
                self._still_mine()
        if self.lost:
            raise LeaseLost(f"this run lost its lease on the output ({self.uri}: {self.lost}); it stops and "
                            f"publishes nothing. Another run may be writing the output: see its status beside it")

    def holds(self) -> bool:
        """Whether the lease is still this run's (:meth:`check` without raising; unknown while S3 cannot be asked,
        taken as yes: it lasts five heartbeats)."""
        try:
            self.check()
        except LeaseLost:
            return False
        except (ClientError, *_CUT):
            return True
        return True

    def entry(self) -> dict:
        """The summary's ``lease``: its key, run, length, and what it cost so far (the release comes after)."""
        return {"key": self.uri, "run_id": self.holder["run_id"], "lease_seconds": self.seconds,
                "requests": self.requests, "seconds": round(self.spent, 3), "renewals": self.renewals}

    def release(self) -> None:
        """Stop renewing; delete the lease if it is still this run's. A failure is a warning: it expires anyway."""
        self._stop.set()
        with self._lock:
            try:
                if not self.lost and self._call("head_object")["ETag"] == self.etag:
                    self._call("delete_object")
            except Exception as exc:  # noqa: BLE001 - the run has ended; an unreleased lease only expires later
                if not (isinstance(exc, ClientError) and _missing(exc)):
                    log.warning("cannot delete the lease %s (%s); it expires %.0f s after its last renewal",
                                self.uri, first_line(exc), self.seconds)


def new_run_id() -> str:
    """A run's id in its lease: unique, short."""
    return uuid.uuid4().hex[:12]
