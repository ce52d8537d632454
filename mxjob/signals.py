"""SIGTERM and SIGINT on the driver: one exception, raised once, that ``infer_main`` turns into a resume hint."""

from __future__ import annotations

import signal


class Interrupted(BaseException):
    """SIGTERM or SIGINT reached the driver (a ``BaseException``, like ``KeyboardInterrupt``)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: Signals this driver received: the JVM gets a terminal's Ctrl-C or YARN's SIGTERM
#: too, and its failure may reach the main thread before the signal's exception does.
received: list[int] = []


def raise_interrupted(signum, _frame):
    """The driver's SIGTERM and SIGINT handler: note the signal, ignore any second one, raise :class:`Interrupted`."""
    received.append(signum)
    # One interruption is enough: the clean-up below must not be cut short by a second one.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)
