"""The tasks over time, in bounded memory: per executor, what finished in each time bucket.

The run report (:mod:`mxjob.reporting.report`) draws images/s and where the time went
per executor from this. A job of ten million keys has ~150,000 tasks, so no
list of tasks is kept: each task is added to the bucket of its end time, and
when the buckets span more than :data:`MAX_BUCKETS`, their width doubles and
neighbours merge. Widths are powers of two seconds, so two timelines of
different widths (two executors' folds) merge exactly at the wider one.
"""

from __future__ import annotations

import math

#: Buckets a timeline spans at most: a chart 1,000 pixels wide gets a point every 4 or more pixels.
MAX_BUCKETS = 240
#: What each bucket sums per executor, in this order.
FIELDS = ("tasks", "keys", "errors", "download", "decode", "forward", "wait", "write", "task")


class Timeline:
    """Per executor, the tasks that ended in each bucket of ``width`` seconds.

    Parameters
    ----------
    width : float
        Seconds per bucket to start with (a power of two); it doubles as needed.
    """

    def __init__(self, width: float = 1.0):
        self.width = width
        #: ``{bucket index: {executor: [FIELDS...]}}``; the bucket starts at ``index * width``.
        self.buckets: dict[int, dict[str, list[float]]] = {}

    def add(self, ended: float, executor: str, values: dict) -> Timeline:
        """Add one task that ended at ``ended`` (epoch seconds); ``values`` has some of :data:`FIELDS`."""
        row = [values.get(name, 0.0) for name in FIELDS]
        _add_buckets(self.buckets, {math.floor(ended / self.width): {executor: row}}, 1)
        self._bound()
        return self

    def merge(self, other: Timeline) -> Timeline:
        """Fold ``other`` in, at the wider of the two widths."""
        while self.width < other.width:
            self._coarsen()
        _add_buckets(self.buckets, other.buckets, round(self.width / other.width))
        self._bound()
        return self

    def _bound(self) -> None:
        while self.buckets and max(self.buckets) - min(self.buckets) + 1 > MAX_BUCKETS:
            self._coarsen()

    def _coarsen(self) -> None:
        """Double the width: buckets ``2i`` and ``2i + 1`` become ``i``."""
        self.buckets, self.width = _add_buckets({}, self.buckets, 2), self.width * 2

    def series(self) -> dict:
        """Plain JSON: ``width``, ``start`` of each bucket (epoch seconds), and per executor each field's list.

        Buckets without a task are included (as zeros) so the series is evenly spaced.
        """
        if not self.buckets:
            return {"width": self.width, "start": [], "executors": {}}
        indices = range(min(self.buckets), max(self.buckets) + 1)
        names = sorted({name for executors in self.buckets.values() for name in executors})
        zero = [0.0] * len(FIELDS)
        executors = {name: {field: [round(self.buckets.get(i, {}).get(name, zero)[k], 4) for i in indices]
                            for k, field in enumerate(FIELDS)} for name in names}
        return {"width": self.width, "start": [i * self.width for i in indices], "executors": executors}


def _add_buckets(buckets: dict, other: dict, factor: int) -> dict:
    """Add ``other``'s rows into ``buckets`` (returned), its bucket ``i`` into bucket ``i // factor``."""
    for index, executors in other.items():
        bucket = buckets.setdefault(index // factor, {})
        for name, values in executors.items():
            row = bucket.setdefault(name, [0.0] * len(FIELDS))
            for i, v in enumerate(values):
                row[i] += v
    return buckets
