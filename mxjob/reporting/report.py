"""``OUTPUT.report.html``: the run as one self-contained page of charts, for a person with a browser.

No script, font or style comes from the network: the charts are inline SVG
drawn here, the style is inline CSS, and the page has no JavaScript. The data
is :func:`view`'s plain dict (the tasks' fold, the progress ticks, the status
and, at the end, the summary), so :func:`render` is a pure function a test can
call with made-up figures. Every figure a person reads carries its value in a
``data-value`` attribute and its source in ``data-field``, so a test compares
the page with the summary.
"""

from __future__ import annotations

import html
import json
import math
import time

from mxjob import tasks
from mxjob.core.errors import EXIT_TOO_MANY_ERRORS, plural
from mxjob.executor.stats import StatsFold
from mxjob.reporting.progress import duration, iso
from mxjob.reporting.summary import RATES

#: Colours of series, in order (Okabe-Ito, readable by the colour-blind).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
#: Where the time of an executor went, in drawing order, with colours.
TIME_PARTS = (("forward", "#0072B2"), ("wait", "#E69F00"), ("write", "#009E73"), ("other", "#999999"),
              ("between_tasks", "#D55E00"))
#: What the time chart's "other" and "between tasks" hold: what partition.score_partition's "task" seconds
#: measure (from the task's start in the Python worker to its part written) and what falls outside them.
TIME_PARTS_WHAT = ("other: time in the task not in forward, wait or write (setting up the worker's threads and "
                   "S3 client, reading the batch's keys, loading the model in a worker's first task or finding "
                   "it cached, building the results). between tasks: from the executor's first task's start to "
                   "its last one's end, the time outside its tasks (Spark scheduling each task, shipping it and "
                   "its batch to the Python worker, taking back its result; a new Python worker's start). The "
                   "workers table's idle s between tasks is the same, per Python worker.")
#: Labels the report lists (the most frequent first).
TOP_LABELS = 15
#: Executors drawn one by one; a larger cluster shows the whole job and these busiest ones.
MAX_EXECUTOR_LINES = 8
MB = 1024 * 1024
WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 1100, 260, 70, 20, 20, 40


# ----------------------------------------------------------------------------
# The data


def view(fold: StatsFold, ticks: list[dict], status: dict, summary: dict | None, context: dict) -> dict:
    """Everything the page shows, as plain values.

    Parameters
    ----------
    fold : StatsFold
        The tasks' stats so far.
    ticks : list of dict
        :class:`mxjob.reporting.progress.Tick` samples, oldest first.
    status : dict
        The status document (:func:`mxjob.reporting.status.status_document`).
    summary : dict or None
        The run's summary, once written; its figures are the page's headline then.
    context : dict
        ``options`` and ``fingerprint`` of the run.
    """
    return {"status": status, "summary": summary, "ticks": ticks, "timeline": fold.timeline.series(),
            "executors": executor_time(fold), "errors": dict(sorted(fold.error_kinds.items())),
            "top1": sorted(fold.top1.items(), key=lambda kv: (-kv[1], kv[0])),
            "workers": {name: fold.worker_summary(name) for name in sorted(fold.workers)},
            "options": context.get("options", {}), "fingerprint": context.get("fingerprint", {})}


def executor_time(fold: StatsFold) -> dict:
    """Per executor, seconds of its task thread by part, the time between its tasks, and its threads' I/O.

    ``other`` is task time outside forward, wait and write (reading the plan,
    the model's first load, ...); ``between_tasks`` is the executor's time from
    its first task's start to its last one's end not spent in a task: Spark's
    per-task cost (scheduling, serialising, starting the task). ``download``
    and ``decode`` are summed over the download threads, so they overlap the
    rest and are drawn apart.
    """
    windows: dict[str, list[float]] = {}
    for name, w in fold.workers.items():
        executor = name.rsplit("/", 1)[0]
        start, end = windows.get(executor, (math.inf, -math.inf))
        windows[executor] = [min(start, w["first"].started), max(end, w["last_end"])]
    out = {}
    for name, e in sorted(fold.executors.items()):
        start, end = windows.get(name, (0.0, e["task"]))
        parts = {"forward": e["forward"], "wait": e["wait"], "write": e["write"],
                 "other": max(0.0, e["task"] - e["forward"] - e["wait"] - e["write"]),
                 "between_tasks": max(0.0, (end - start) - e["task"])}
        out[name] = {"batches": e["batches"], "images": e["images"], "parts": parts,
                     "threads": {"download": e["download"], "decode": e["decode"]}}
    return out


# ----------------------------------------------------------------------------
# SVG


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _nice_max(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above ``value``: the top of an axis."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


class Axes:
    """A plot area mapping data (x, y) onto the SVG's pixels."""

    def __init__(self, x0: float, x1: float, y1: float, height: int = HEIGHT):
        self.x0, self.x1 = x0, x1 if x1 > x0 else x0 + 1
        self.y1, self.height = _nice_max(y1), height

    def px(self, x: float) -> float:
        return PAD_L + (x - self.x0) / (self.x1 - self.x0) * (WIDTH - PAD_L - PAD_R)

    def py(self, y: float) -> float:
        return self.height - PAD_B - y / self.y1 * (self.height - PAD_T - PAD_B)

    def grid(self, y_label: str, x_label, x_ticks: list | None = None) -> str:
        """Horizontal grid lines with the y values, labels along x (at ``x_ticks``, or six; one the same as the last
        one shown is left out: seconds repeat on a short run), the y axis' name."""
        out, last = [], None
        for i in range(5):
            y = self.y1 * i / 4
            out.append(f'<line class="grid" x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{self.py(y):.1f}" '
                       f'y2="{self.py(y):.1f}"/><text class="tick" x="{PAD_L - 6}" y="{self.py(y) + 4:.1f}" '
                       f'text-anchor="end">{_fmt(y)}</text>')
        for x in x_ticks if x_ticks is not None else [self.x0 + (self.x1 - self.x0) * i / 5 for i in range(6)]:
            label = x_label(x)
            if label == last:
                continue
            # The ends stay inside the picture.
            anchor = "start" if x <= self.x0 else "end" if x >= self.x1 else "middle"
            out.append(f'<text class="tick" x="{self.px(x):.1f}" y="{self.height - PAD_B + 16}" '
                       f'text-anchor="{anchor}">{_esc(label)}</text>')
            last = label
        out.append(f'<text class="axis" x="14" y="{PAD_T + (self.height - PAD_T - PAD_B) / 2:.0f}" '
                   f'transform="rotate(-90 14 {PAD_T + (self.height - PAD_T - PAD_B) / 2:.0f})" '
                   f'text-anchor="middle">{_esc(y_label)}</text>')
        return "".join(out)

    def polyline(self, xs: list, ys: list, colour: str, name: str, width: float) -> str:
        points = " ".join(f"{self.px(x):.1f},{self.py(y):.1f}" for x, y in zip(xs, ys) if y is not None)
        return (f'<polyline class="series" data-series="{_esc(name)}" fill="none" stroke="{colour}" '
                f'stroke-width="{width}" points="{points}"/>')


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def _svg(chart_id: str, body: str, height: int = HEIGHT) -> str:
    return (f'<svg id="{chart_id}" class="chart" viewBox="0 0 {WIDTH} {height}" width="100%" role="img">{body}</svg>')


def _legend(names: list[tuple[str, str]]) -> str:
    items = "".join(f'<span class="key"><i style="background:{c}"></i>{_esc(n)}</span>' for n, c in names)
    return f'<div class="legend">{items}</div>'


def line_chart(chart_id: str, series: list[tuple[str, list, list, str]], y_label: str, x_label=_clock,
               extra: tuple | None = None, x_ticks: list | None = None) -> str:
    """An SVG line chart of ``(name, xs, ys, colour)`` series over a shared x axis, with its legend; some series has
    a point (each caller says in words why it has none to draw)."""
    xs = [x for _, sx, _, _ in series for x in sx]
    ys = [y for _, _, sy, _ in series for y in sy if y is not None]
    top = max([*ys, extra[1] if extra else 0.0], default=1.0)
    axes = Axes(min(xs), max(xs), top)
    body = axes.grid(y_label, x_label, x_ticks) + "".join(axes.polyline(sx, sy, c, n, 3 if i == 0 else 1.5)
                                                 for i, (n, sx, sy, c) in enumerate(series))
    if extra:  # a dashed horizontal line at extra[1] named extra[0] (the actual finish, say)
        name, y = extra
        body += (f'<line class="actual" x1="{PAD_L}" x2="{WIDTH - PAD_R}" y1="{axes.py(y):.1f}" '
                 f'y2="{axes.py(y):.1f}" stroke="#000" stroke-dasharray="6 4"/><text class="tick" '
                 f'x="{WIDTH - PAD_R - 4}" y="{axes.py(y) - 6:.1f}" text-anchor="end">{_esc(name)}</text>')
    return _svg(chart_id, body) + _legend([(n, c) for n, _, _, c in series])


def hbar_chart(chart_id: str, rows: list[tuple[str, list[tuple[str, float, str]]]], unit: str) -> str:
    """Horizontal stacked bars: per row (at least one) a name and ``(part, value, colour)``; values printed in
    ``unit``."""
    top = _nice_max(max(sum(v for _, v, _ in parts) for _, parts in rows))
    left, bar, gap = 260, 22, 10
    height = PAD_T + len(rows) * (bar + gap) + 30
    scale = (WIDTH - left - 90) / top
    out = []
    for i, (name, parts) in enumerate(rows):
        y, x = PAD_T + i * (bar + gap), float(left)
        out.append(f'<text class="tick" x="{left - 8}" y="{y + bar * 0.7:.1f}" text-anchor="end">{_esc(name)}</text>')
        for part, value, colour in parts:
            out.append(f'<rect data-part="{_esc(part)}" data-value="{value:.3f}" x="{x:.1f}" y="{y}" '
                       f'width="{value * scale:.1f}" height="{bar}" fill="{colour}"><title>{_esc(part)}: '
                       f'{_amount(value, unit)}</title></rect>')
            x += value * scale
        out.append(f'<text class="tick" x="{x + 6:.1f}" y="{y + bar * 0.7:.1f}">'
                   f'{_amount(sum(v for _, v, _ in parts), unit)}</text>')
    return _svg(chart_id, "".join(out), height)


def _amount(value: float, unit: str) -> str:
    """``1 image``, ``2 images``, ``1.5 s``: a count's unit in the right number (``s`` stays as it is)."""
    one = value == 1 and unit.endswith("s") and len(unit) > 1
    return f"{_fmt(value)} {unit[:-1] if one else unit}"


# ----------------------------------------------------------------------------
# The charts


def _running(st: dict) -> bool:
    """Whether the status ``st`` is of a run still going (a page before its first status counts as one)."""
    return st.get("state") in (None, "running")


def _none_ran(v: dict, chart_id: str) -> str:
    """The place of a chart of the tasks when none has finished: yet, or at all in a run that has ended."""
    text = ("No task has finished yet." if _running(v["status"])
            else f"No task finished: the run {v['status']['state']} before its first.")
    return f'<p class="empty" id="{chart_id}">{_esc(text)}</p>'


def throughput_chart(v: dict) -> str:
    """Images/s over time: the whole job (thick) and each executor (keys ended in each bucket / its width)."""
    t = v["timeline"]
    if not t["start"]:
        return _none_ran(v, "chart-throughput")
    if len(t["start"]) < 2:
        return (f'<p class="empty" id="chart-throughput">Every task ended within one {t["width"]:g} s interval: '
                "images/s over time needs two.</p>")
    width, xs = t["width"], [s + t["width"] / 2 for s in t["start"]]
    total = [sum(e["keys"][i] for e in t["executors"].values()) / width for i in range(len(xs))]
    busiest = sorted(t["executors"], key=lambda n: -sum(t["executors"][n]["keys"]))[:MAX_EXECUTOR_LINES]
    series = [("whole job", xs, total, "#222222")]
    series += [(name, xs, [k / width for k in t["executors"][name]["keys"]], PALETTE[i % len(PALETTE)])
               for i, name in enumerate(sorted(busiest))]
    what = (f"Each point: keys whose task ended in that {width:g} s interval / {width:g} s. It can peak well above "
            "the headline's images/s, which is over the whole Spark job.")
    return (line_chart("chart-throughput", series, f"images/s in each {width:g} s interval")
            + f'<p class="note" id="throughput-what">{_esc(what)}</p>')


def progress_chart(v: dict) -> str:
    """Done keys and batches over time, as a share of the run's totals (from the progress ticks)."""
    ticks, status = v["ticks"], v["status"]
    if len(ticks) < 2:  # a run shorter than two progress lines draws no line: say so instead of empty axes
        return (f'<p class="empty" id="chart-progress">The run took {plural(len(ticks), "progress tick")}: too '
                f'short to draw progress over time (a tick every --progress-seconds).</p>')
    keys_total = (status.get("keys") or {}).get("total") or 1
    batches_total = (status.get("batches") or {}).get("total") or 1
    xs = [t["time"] for t in ticks]
    series = [("keys done, %", xs, [100.0 * t["keys"] / keys_total for t in ticks], PALETTE[0]),
              ("batches done, %", xs, [100.0 * t["batches"] / batches_total for t in ticks], PALETTE[1])]
    return line_chart("chart-progress", series, "% done")


def eta_chart(v: dict) -> str:
    """The finish as predicted at each tick (minutes after the start), against the actual finish."""
    ticks, started, actual = predictions(v), v["status"]["started"], actual_end(v)
    if not ticks:
        if any(t["predicted_end"] is not None for t in v["ticks"]):
            text = "No ETA was made before every batch was done."
        elif _running(v["status"]):
            text = "No ETA yet: the job is still estimating."
        else:
            text = f"No ETA was made: the run {v['status']['state']} before the job had one."
        return f'<p class="empty" id="chart-eta">{_esc(text)}</p>'
    series = [("predicted finish, minutes after the start", [t["time"] for t in ticks],
               [(t["predicted_end"] - started) / 60 for t in ticks], PALETTE[3])]
    extra = ("actual finish", (actual - started) / 60) if actual else None
    return line_chart("chart-eta", series, "minutes", extra=extra)


def predictions(v: dict) -> list[dict]:
    """The ticks that predicted a finish: made while some batch was still to do."""
    total = (v["status"].get("batches") or {}).get("total")
    return [t for t in v["ticks"] if t["predicted_end"] is not None and (total is None or t["batches"] < total)]


def actual_end(v: dict) -> float | None:
    """When the tasks ended: the last task's end, once the run is over."""
    tasks = (v["summary"] or {}).get("tasks") or {}
    return tasks.get("last_end") or None


def time_chart(v: dict) -> str:
    """Per executor, where its time went: task thread by part, then Spark's time between tasks."""
    if not v["executors"]:
        return _none_ran(v, "chart-time")
    rows = [(name, [(part, e["parts"][part], colour) for part, colour in TIME_PARTS])
            for name, e in v["executors"].items()]
    legend = _legend([(p.replace("_", " "), c) for p, c in TIME_PARTS])
    io_rows = [(name, [("download", e["threads"]["download"], PALETTE[5]), ("decode", e["threads"]["decode"],
                                                                          PALETTE[4])])
               for name, e in v["executors"].items()]
    return (hbar_chart("chart-time", rows, "s") + legend + f'<p class="note" id="time-what">{_esc(TIME_PARTS_WHAT)}</p>'
            + "<h3>On the download threads: download and decode are summed over each task&#x27;s download threads, "
            "so they overlap the above and can exceed the task&#x27;s seconds</h3>"
            + hbar_chart("chart-io", io_rows, "s") + _legend([("download", PALETTE[5]), ("decode", PALETTE[4])]))


def labels_chart(v: dict) -> str:
    """The most frequent top-1 labels."""
    rows = [(label, [("images", count, PALETTE[2])]) for label, count in v["top1"][:TOP_LABELS]]
    if not rows:
        return f'<p class="empty" id="chart-labels">{_esc(task_of(v).no_labels)}</p>'
    return hbar_chart("chart-labels", rows, "images")


def task_of(v: dict) -> tasks.Task:
    """The run's task (its options'), or the base task's words for one this process has not registered."""
    try:
        return tasks.get((v.get("options") or {}).get("task") or "classify")
    except ValueError:
        return tasks.Task()


def memory_chart(v: dict) -> str:
    """Each Python worker's resident memory after its 1st, 2nd, 5th, 10th, ... task (MB; x is the task number)."""
    series = []
    for i, (name, w) in enumerate(sorted(v["workers"].items())[:MAX_EXECUTOR_LINES]):
        after = {int(k): b for k, b in w["rss_bytes_after_task"].items() if k != "last"}
        if after and "last" in w["rss_bytes_after_task"]:
            # A worker's tasks are numbered 1, 2, ...: its last is its batches' count.
            after.setdefault(w["batches"], w["rss_bytes_after_task"]["last"])
        if after:
            xs = sorted(after)
            series.append((f"{name} ({w['threads']} threads)", [math.log10(x) for x in xs],
                           [after[x] / MB for x in xs], PALETTE[i % len(PALETTE)]))
    if not series:
        return _none_ran(v, "chart-memory")
    numbers = sorted({round(10 ** x) for _, xs, _, _ in series for x in xs})
    return line_chart("chart-memory", series, "MB resident", x_label=lambda x: f"task {10 ** x:.0f}",
                      x_ticks=spaced([math.log10(n) for n in numbers]))


#: The least distance between two labelled ticks, as a share of the axis: "task 200" and "task 219" never overlap.
MIN_TICK_GAP = 0.12


def spaced(ticks: list[float]) -> list[float]:
    """``ticks`` (sorted) thinned so that no two are closer than :data:`MIN_TICK_GAP` of their span; the first
    and the last are kept (the last replaces a kept one too close to it)."""
    if len(ticks) < 3:
        return ticks
    gap = (ticks[-1] - ticks[0]) * MIN_TICK_GAP
    kept = [ticks[0]]
    for tick in ticks[1:-1]:
        if tick - kept[-1] >= gap:
            kept.append(tick)
    if ticks[-1] - kept[-1] < gap and len(kept) > 1:
        kept.pop()
    return [*kept, ticks[-1]]


# ----------------------------------------------------------------------------
# Tables and the page


def _figure(label: str, field: str, value, shown: str | None = None) -> str:
    """A card: ``value`` shown as ``shown``, by default as a count (``1,234``)."""
    shown = f"{value:,}" if shown is None else shown
    return (f'<div class="card"><div class="label">{_esc(label)}</div><div class="figure" data-field="{_esc(field)}" '
            f'data-value="{_esc(value)}">{_esc(shown)}</div></div>')


def headline(v: dict) -> str:
    """The cards at the top: counts, the one images/s, wall time, predicted vs actual finish."""
    s, st = v["summary"], v["status"]
    if s:
        rate = s["rates"]["images_per_second_spark"]
        cards = [("keys listed", "summary.keys_listed", s["keys_listed"]),
                 ("predicted", "summary.predicted", s["predicted"]), ("failed", "summary.failed", s["failed"]),
                 ("images/s (scored / Spark job s)", "summary.rates.images_per_second_spark", rate,
                  "-" if rate is None else f"{rate:,.1f}"),
                 ("wall time", "summary.elapsed_seconds", s["elapsed_seconds"], duration(s["elapsed_seconds"]))]
        if s.get("reused"):  # a resumed run: the keys whose line an earlier run made durable, not scored again
            cards.insert(2, ("reused from the run before", "summary.reused", s["reused"]))
        if s.get("existing"):  # --skip-existing: the keys whose row the dataset held already
            cards.insert(1, ("skipped: already in the output", "summary.existing.skipped", s["existing"]["skipped"]))
    else:
        keys, batches = st.get("keys"), st.get("batches")  # none before the run's plan
        cards = [("keys done", "status.keys.done", keys and keys["done"],
                  f"{keys['done']:,} of {keys['total']:,}" if keys else "-"),
                 ("batches done", "status.batches.done", batches and batches["done"],
                  f"{batches['done']:,}" if batches else "-"),
                 ("errors so far", "status.errors", st.get("errors", 0)),
                 ("images/s since the first task", "status.images_per_second", st.get("images_per_second"),
                  "-" if st.get("images_per_second") is None else f"{st['images_per_second']:,.1f}"),
                 ("ETA", "status.eta_seconds", st.get("eta_seconds"), eta_shown(st))]
    what = f'<p class="note" id="rate-what">images/s: {_esc(RATES["images_per_second_spark"])}.</p>' if s else ""
    return '<div class="cards">' + "".join(_figure(*c) for c in cards) + "</div>" + what


def eta_shown(st: dict) -> str:
    """The ETA card's text: "every batch done" once they are (the job is assembling its output), no ETA then."""
    batches = st.get("batches") or {}
    if batches.get("total") and batches.get("done", 0) >= batches["total"]:
        return "every batch done"
    if not _running(st):  # a stopped run has no finish to estimate
        return f"none: the run {st['state']}"
    return duration(st.get("eta_seconds"))


def finish_line(v: dict) -> str:
    """Predicted vs actual finish, in words."""
    predicted, actual = predictions(v), actual_end(v)
    if not predicted:
        return ""  # the ETA chart's place says why
    first = predicted[0]
    text = (f"First ETA at {_esc(iso(first['time']))}: finish at {_esc(iso(first['predicted_end']))}"
            f" ({duration(first['eta_seconds'])} left).")
    if actual:
        text += f' The tasks actually ended at <span data-field="summary.tasks.last_end" data-value="{actual}">' \
                f"{_esc(iso(actual))}</span> ({(actual - first['predicted_end']):+.0f} s from that prediction)."
    return f"<p>{text}</p>"


def errors_table(v: dict) -> str:
    """Failed keys by stage and type, with a few example keys each."""
    if not v["errors"]:
        return '<p id="errors">No key failed.</p>'
    rows = "".join(f'<tr><td>{_esc(kind.split("/")[0])}</td><td>{_esc(kind.split("/", 1)[1])}</td>'
                   f'<td class="num" data-field="errors.{_esc(kind)}" data-value="{e["count"]}">{e["count"]:,}</td>'
                   f'<td>{"<br>".join(_esc(k) for k in e["examples"])}</td></tr>' for kind, e in v["errors"].items())
    return (f'<table id="errors"><tr><th>stage</th><th>type</th><th>keys</th><th>examples</th></tr>{rows}</table>')


def skipped_line(v: dict) -> str:
    """The listed keys that got no line, by reason, with a few examples each; known once the summary is."""
    s = v["summary"]
    if not s:
        return ""
    entries = [("summary.skipped_keys", s["skipped_keys"])] if s.get("skipped_keys") else []
    entries += [(f"summary.manifest.skipped.{reason}", entry)
                for reason, entry in ((s.get("manifest") or {}).get("skipped") or {}).items()]
    parts = [f'<span data-field="{_esc(field)}.count" data-value="{e["count"]}">{e["count"]:,}</span> '
             f'key{"" if e["count"] == 1 else "s"}, {_esc(e["why"])} (e.g. {_esc(", ".join(e["examples"][:3]))})'
             for field, e in entries if e["count"]]
    if not parts:
        return '<p id="skipped">No key was skipped.</p>'
    return f'<p id="skipped">Not scored: {"; ".join(parts)}.</p>'


def workers_table(v: dict) -> str:
    """Per Python worker: batches, threads, model loads, peak memory."""
    rows = "".join(f'<tr><td>{_esc(name)}</td><td class="num">{w["batches"]}</td><td class="num">{w["threads"]}</td>'
                   f'<td class="num">{w["model_loads"]}</td><td class="num">{w.get("max_rss_bytes", 0) / MB:,.0f}</td>'
                   f'<td class="num">{w["idle_between_tasks_seconds"]:,.1f}</td></tr>'
                   for name, w in v["workers"].items())
    return ('<table id="workers"><tr><th>worker (host/executor/pid)</th><th>batches</th><th>threads</th>'
            f'<th>model loads</th><th>peak MB</th><th>idle s between tasks</th></tr>{rows}</table>')


def settings_table(v: dict) -> str:
    """Every option of the run, and its fingerprint."""
    rows = "".join(f"<tr><td>{_esc(k)}</td><td><code>{_esc(json.dumps(val, default=str))}</code></td></tr>"
                   for k, val in sorted(v["options"].items()))
    fingerprint = _esc(json.dumps(v["fingerprint"], indent=1, default=str))
    return (f'<table id="settings"><tr><th>option</th><th>value</th></tr>{rows}</table>'
            f'<h3>Fingerprint</h3><pre id="fingerprint">{fingerprint}</pre>')


STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px 40px;color:#1d1d1f;background:#fff}
h1{font-size:24px;margin:0 0 4px}h2{font-size:19px;margin:28px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 4px;color:#444}.meta{color:#555;margin:0 0 12px}
.state{display:inline-block;padding:2px 10px;border-radius:12px;color:#fff;font-weight:600;font-size:14px}
.running{background:#0072B2}.succeeded{background:#009E73}.failed{background:#D55E00}.interrupted{background:#E69F00}
.succeeded-with-errors{background:#CC79A7}.state-errors{font-size:15px;font-weight:400;margin-left:4px}
.note{color:#555;font-size:13px;margin:2px 0 8px}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0}
.card{border:1px solid #ddd;border-radius:8px;padding:10px 16px;min-width:170px;background:#fafafa}
.label{color:#555;font-size:13px}.figure{font-size:26px;font-weight:600}
svg.chart{max-width:1100px;display:block}svg .grid{stroke:#e5e5e5}svg .tick{font-size:12px;fill:#555}
svg .axis{font-size:13px;fill:#333}.legend{margin:2px 0 8px 70px;font-size:13px}
.key{margin-right:16px}.key i{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-1px}
table{border-collapse:collapse;font-size:13px;margin:6px 0}td,th{border-bottom:1px solid #eee;padding:3px 10px;
text-align:left;vertical-align:top}.num{text-align:right}pre{background:#f6f6f6;padding:8px;font-size:12px}
.empty{color:#777;font-style:italic}code{font-size:12px}
.why{border-left:4px solid #D55E00;background:#fdf3ec;padding:6px 10px;margin:0 0 12px}
"""


def header(v: dict) -> str:
    st = v["status"]
    resume = (f'<p>Resume with: <code id="resume">{_esc(st["resume_command"])}</code></p>'
              if st.get("resume_command") and st["state"] != "running" else "")
    stage = f' (stage <code>{_esc(st["stage"])}</code>)' if st.get("stage") else ""
    why = (f'<p class="why" id="why"><b>{_esc(st["state"].capitalize())}</b>{stage}: {_esc(st["message"])}</p>'
           if st.get("message") else "")
    return (f'<h1>Batch inference run {badge(v)}</h1><p class="meta">{_esc(st.get("output", ""))} &middot; started '
            f'{_esc(st.get("started_iso"))} &middot; updated {_esc(st.get("updated_iso"))} &middot; '
            f'{duration(st.get("elapsed_seconds"))} {"so far" if st["state"] == "running" else "in all"}</p>'
            f'{why}{resume}')


def badge(v: dict) -> str:
    """The run's state; a run that succeeded with failed images says so, with their count linking to the errors."""
    state, s = v["status"]["state"], v["summary"] or {}
    if state != "succeeded" or not s.get("failed"):
        return f'<span class="state {state}" id="state" data-value="{state}">{state}</span>'
    failed = f'{s["failed"]:,} of {s["keys_listed"]:,} images failed'
    if v["status"].get("exit_code") == EXIT_TOO_MANY_ERRORS:  # the output is whole, but the step failed
        return (f'<span class="state failed" id="state" data-value="{state}">too many errors (exit '
                f'{EXIT_TOO_MANY_ERRORS})</span> <a class="state-errors" href="#errors">{failed}, more than '
                f'--max-errors allows</a>')
    return (f'<span class="state succeeded-with-errors" id="state" data-value="{state}">succeeded with errors</span> '
            f'<a class="state-errors" href="#errors">{failed}</a>')


def render(v: dict) -> str:
    """The whole page, one string of HTML with inline SVG and CSS."""
    sections = [
        header(v), headline(v),
        "<h2>Images per second over time</h2>", throughput_chart(v),
        "<h2>Progress and the ETA</h2>", progress_chart(v), finish_line(v), eta_chart(v),
        "<h2>Where the time went, per executor</h2>", time_chart(v),
        "<h2>Errors by stage and type</h2>", errors_table(v), skipped_line(v),
        "<h2>Most frequent top-1 labels</h2>", labels_chart(v),
        "<h2>Python workers: threads and memory over tasks</h2>", memory_chart(v), workers_table(v),
        "<h2>Settings</h2>", settings_table(v),
    ]
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Run report: '
            f'{_esc(v["status"].get("output", ""))}</title><style>{STYLE}</style></head><body>'
            + "\n".join(sections) + "</body></html>\n")

