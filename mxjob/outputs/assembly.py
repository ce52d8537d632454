"""The assembly on the driver while the Spark job runs: :class:`Assembly`.

The output is the runs' durable rows merged in key order
(:func:`mxjob.outputs.merge.assemble`). Merged only after the last batch, a job of
ten million keys would wait minutes for it after its last task. So the
merge runs in a thread of the driver from the moment the run's plan is
written, and follows the run's batches as they become durable
(:class:`mxjob.outputs.merge.LiveRun`, told of each batch as its task's stats
reach the driver): batches end roughly in order, so when the last task ends
only the last parts are left to merge. A run with no batch left to score
(a resume of durable parts) merges at once.

Nothing of the output is visible before it is whole: the sink writes one
multipart upload (completed last) or, for a dataset, files that are each
complete or absent. A Spark job that fails or is interrupted cancels the
merge, which aborts its upload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from mxjob.core import state
from mxjob.core.errors import JobError, first_line
from mxjob.outputs import merge, work_prefix

log = logging.getLogger(__name__)

#: Seconds between the main thread's looks at its signals while it waits for the assembly.
JOIN_POLL_SECONDS = 0.2
#: Seconds a cancelled assembly has to abort its upload before the driver goes on without it.
CANCEL_WAIT_SECONDS = 30.0

#: ``assemble(runs, live)``: merge ``runs`` into the output, following ``live`` (or not: ``None``).
AssembleFn = Callable[[Sequence[work_prefix.Run], "merge.LiveRun | None"], merge.AssemblyCounts]


class Assembly:
    """The merge of one run's output, started with the run (``during``) or when its Spark job ends (``after``).

    Parameters
    ----------
    assemble : callable
        ``assemble(runs, live)`` merges ``runs`` into the output and returns
        its :class:`merge.AssemblyCounts`; ``live`` is the
        :class:`merge.LiveRun` to follow, or ``None`` (every part durable).
    work : work_prefix.WorkPrefix
        The output's work prefix: the runs are read from it for a merge after the job.
    runs : sequence of work_prefix.Run
        The earlier runs (a resume) and, last, the run Spark is about to score.
    during : bool
        Whether to merge while the job runs (the run has batches to score), or at :meth:`finish`.
    """

    def __init__(self, assemble: AssembleFn, work: work_prefix.WorkPrefix, runs: Sequence[work_prefix.Run],
                 during: bool):
        self.assemble, self.work = assemble, work
        self.live = merge.LiveRun(work, runs[-1]) if during and runs else None
        self.runs = list(runs)
        #: The driver's CPU seconds in the merge (its thread's, or the main thread's after the job).
        self.cpu_seconds = 0.0
        self._outcome: dict = {}
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start following the run (``during``); nothing until :meth:`finish` otherwise."""
        if self.live is not None:
            # Before Spark starts: no task's stats can reach the driver before the merge listens.
            state.durable_batches.listen(self.live.key, self.live.durable)
            self._thread = threading.Thread(target=self._follow, name="assembly", daemon=True)
            self._thread.start()

    def _follow(self) -> None:
        started = time.thread_time()
        try:
            self._outcome["counts"] = self.assemble(self.runs, self.live)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which decides
            self._outcome["error"] = exc
        finally:
            self.cpu_seconds += time.thread_time() - started

    def cancel(self) -> None:
        """The Spark job did not finish: stop the merge and let it abort its upload (waits a bounded time)."""
        if self._thread is None:
            return
        self.live.cancel()
        state.durable_batches.forget(self.live.key, self.live.durable)
        self._thread.join(CANCEL_WAIT_SECONDS)
        if self._thread.is_alive():
            log.warning("the assembly did not stop within %.0f s; its upload is left incomplete (never visible)",
                        CANCEL_WAIT_SECONDS)

    def finish(self) -> merge.AssemblyCounts:
        """The Spark job succeeded: merge what is left (the tail) and return the counts.

        A merge during the run that failed for another reason than the
        output's own (a ``JobError``: a key without a row, parts of different
        shapes) is logged and done again from the durable parts.
        """
        if self._thread is None:
            return self._after()
        self.live.finish()
        # Spark applied every task's stats before the job's action returned: no notice is left to come.
        state.durable_batches.forget(self.live.key, self.live.durable)
        try:
            while self._thread.is_alive():  # in short steps: a signal's handler runs between them
                self._thread.join(JOIN_POLL_SECONDS)
        except BaseException:
            self.cancel()
            raise
        error = self._outcome.get("error")
        if error is None:
            return self._outcome["counts"]
        if isinstance(error, (JobError, work_prefix.ResumeError)):
            raise error
        log.warning("the assembly during the run failed (%s); assembling from the durable parts again",
                    first_line(error))
        return self._after()

    def _after(self) -> merge.AssemblyCounts:
        started = time.process_time()
        try:
            return self.assemble(self.work.runs(), None)
        finally:
            self.cpu_seconds += time.process_time() - started
