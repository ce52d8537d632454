"""SIGTERM and SIGINT on the driver: one exception, raised once, that ``infer_main`` turns into a resume hint."""

from __future__ import annotations

import os
import signal
import threading


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the driver (a ``BaseException``, like ``KeyboardInterrupt``).

    ``what`` says how, when it was not this process's own signal (``Interrupted by ...``).
    """

    def __init__(self, signum: int, what: str | None = None):
        super().__init__(what or signal.Signals(signum).name)
        self.signum = signum


#: How a run ends that spark-submit's JVM stopped under it: a SIGTERM or Ctrl-C to the JVM alone runs its
#: shutdown hook, which stops the SparkContext (``mxjob.run.cluster.jvm_shutting_down``). Not a failure.
JVM_SHUTDOWN = "a shutdown of spark-submit's JVM (SIGTERM or Ctrl-C to it)"


#: Signals this driver received: the JVM gets a terminal's Ctrl-C or YARN's SIGTERM
#: too, and its failure may reach the main thread before the signal's exception does.
received: list[int] = []

#: Set once the run is ending (an error or an interruption is being handled, its last status written): what
#: ``infer_main`` does when spark-submit's JVM goes must not cut that short.
ending = threading.Event()

#: What the SIGTERM this process sent itself stands for (:func:`interrupt_self`), said by the Interrupted it raises.
_self_sent: list[str] = []


def interrupt_self(what: str) -> None:
    """From another thread: stop the main thread as a SIGTERM would, its :class:`Interrupted` saying ``what``."""
    _self_sent.append(what)
    os.kill(os.getpid(), signal.SIGTERM)


def raise_interrupted(signum, _frame):
    """The driver's SIGTERM and SIGINT handler: note the signal, ignore any second one, raise :class:`Interrupted`."""
    received.append(signum)
    # One interruption is enough: the clean-up below must not be cut short by a second one.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum, _self_sent[0] if _self_sent else None)
