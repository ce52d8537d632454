"""``make bench-scale``: the driver and Spark's per-task cost at 100,000 and 1,000,000 keys, with a fake scorer.

Not a test: it prints measurements. For each ``--keys`` count it

1. writes a manifest, a local CSV of ``bucket,key,size`` rows
   (ImageNet-like keys, as ``bench.listing.layout_keys`` makes them); no object is
   stored under those keys, because the executors never fetch one;
2. runs the real job through ``spark-submit`` on ``make run-local``'s master (``--master``)
   with ``conf/spark-local.conf``, built as ``demo/run_local.py`` builds it,
   with ``--input-manifest``, against a moto S3 server (``demo/s3local.py``)
   that holds only the model and receives the output;
3. with a **fake fast scorer** on the executors (``bench/fake_daemon.py``,
   through ``spark.python.daemon.module``): no S3 GET, no decoding, no MXNet;
   every key gets the same top-1 line. Everything else is real: the task
   itself, its per-batch PUT of the part (mxjob.results.part_format) to S3, the driver (reading the
   manifest, loading a real small model for its model check, planning, the
   Spark job, the assembly of the output, the summary). The bench checks
   the output's first line to prove the fake ran;
4. polls the process tree with psutil (``bench.run_bench.ProcessWatch``) for
   the peak RSS of the driver's Python process and of its JVM.

It prints one row per key count and a row extrapolated to 10,000,000 keys
(linear, through the two largest measured counts below it), and compares the
driver's memory with ``spark.driver.memory`` in ``conf/emr.yaml``. The three
per-batch columns (the two overheads and in-task) are averages, so their
totals (value x batches: a fixed cost plus one per batch) are extrapolated
and divided by the batches at 10,000,000 keys; extrapolating the averages
themselves would follow the fixed cost's dilution below zero.

Times come from the job's summary (``OUTPUT.summary.json``): ``seconds.listing``
(reading the manifest), ``seconds.model_check``, ``seconds.plan``,
``seconds.spark`` (the whole Spark part: SparkContext start, executors,
tasks, stop) and ``seconds.assembly``; a key the job does not write yet is
printed as ``n/a``. ``manifest write`` is the bench's own time to write the
CSV, not the job's.

Per-task overhead, two ways (ms per batch; one task per batch):

- **window**: ``(tasks.seconds x executors - sum of python_workers[*].task_seconds) / batches``.
  ``tasks.seconds`` runs from the first task's start to the last task's end
  (as the Python workers clock them); times the executors, that is the
  executor time the Spark job had; minus the time spent inside
  ``score_partition``, what is left is everything around the tasks: the
  scheduler, serializing and sending each task, the worker reading and
  unpickling it, returning its result, PySpark's ``gc.collect()`` after each
  task, and also an executor that starts late or runs out of tasks early.
  It is the cost per batch that a cluster pays, an upper bound.
- **idle**: ``sum of python_workers[*].idle_between_tasks_seconds / batches``:
  only the gaps between one worker's consecutive tasks (from its first
  task's start to its last task's end, minus its time in tasks), so the
  hand-over from one task to the next without the start and end skew.

``in-task`` is ``sum of task_seconds / batches``: what ``score_partition``
costs with the fake scorer (the part's encoding and PUT, the S3 client, the
bookkeeping), so the three add up to the executor time per batch.

Two opt-in rows measure instead of extrapolating:

- ``--ten-million``: the job on a manifest of 10,000,000 keys, fake scorer,
  batch ``--ten-million-batch`` (default 1,024: 9,766 tasks, about 18 minutes
  of Spark on this 2-vCPU machine at 0.15 s a task, where batch 64 would take
  3.5 hours). 1,024 is a real job's batch for a fast model (docs/input.md: 160
  or more keeps the per-task overhead under 5%), and the driver's work (manifest,
  sort, plan, assembly) depends on the keys, not the batch. It prints the
  driver's peak RSS (Python and JVM), each driver stage, the Spark job, the
  per-task overhead, the time from the last task's end to spark-submit's exit,
  and checks them against the targets (:data:`TEN_MILLION_TARGETS`).
- ``--hundred-million``: ``--dry-run`` over a manifest of 100,000,000 keys,
  run as plain Python (no Spark job: the dry run starts none): it reads the
  manifest, plans every batch (the plan's size, written nowhere), loads the
  model and scores one key; it prints the plan, the peak RSS and the time.

``--row-keys N`` runs either row at N keys instead, to check the bench itself
at a small size.

A third, ``--existing-keys N`` (say 10,000,000), measures ``--skip-existing``
(mxjob/outputs/existing.py) over a dataset that already holds N keys: the job on 100
keys gives the dataset its fingerprint and rows per file, the bench writes N
keys' rows through the job's own sink (``bench/existing_keys.py``), then runs
the job with ``--skip-existing`` on a manifest of those keys and 1% more, spread
evenly, batch ``--ten-million-batch``. It prints the keys existing and new, the
summary's ``existing`` (seconds to find the new keys, files and rows read),
the driver's peak RSS (Python and JVM) against the ten-million row's target
and ``conf/emr.yaml``'s driver memory, the job's time, and whether the run's
files hold exactly the new keys.

Usage::

    python -m bench.scale                          # 100,000 and 1,000,000 keys
    python -m bench.scale --quick                  # 10,000 and 20,000 keys: a smoke run
    python -m bench.scale --keys 100000,1000000,10000000
    python -m bench.scale --ten-million            # measured, about an hour
    python -m bench.scale --hundred-million        # the dry run's plan
    python -m bench.scale --ten-million --hundred-million --row-keys 200000   # the rows, small
    python -m bench.scale --existing-keys 10000000  # --skip-existing over ten million keys in the output
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import boto3
import psutil
import pyarrow.parquet as pq
import yaml

from mxjob.outputs import dataset_files
from mxjob.s3 import parallel_list

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import existing_keys  # noqa: E402
from bench import models as bench_models  # noqa: E402
from bench.fake_daemon import FAKE_PREDICTIONS  # noqa: E402
from bench.listing import PREFIX as LISTING_PREFIX  # noqa: E402
from bench.run_bench import MIB, ProcessWatch, log  # noqa: E402
from demo.run_local import MASTER, spark_env, spark_submit_command  # noqa: E402
from demo.s3local import FAKE_AWS_ENV, moto_server  # noqa: E402

BUCKET = "bench-scale"
DAEMON_MODULE = "bench.fake_daemon"
TARGET = 10_000_000
MODEL = bench_models.RESNET20  # 3x32x32: the driver's model check loads it for real
#: Bytes per object the manifest claims (the fake scorer never reads one).
OBJECT_SIZE = 65_536
TEN_MILLION = 10_000_000
HUNDRED_MILLION = 100_000_000
#: The ten-million-key row's targets: driver peak (Python + JVM) and manifest read + plan.
TEN_MILLION_TARGETS = {"driver_total_mib": 1536, "read_and_plan_s": 120}
#: The hundred-million-key dry run's targets: its peak RSS and its time.
HUNDRED_MILLION_TARGETS = {"peak_mib": 4096, "seconds": 900}

#: The table's columns after ``keys`` and ``batches``: (row field, header, decimals).
COLUMNS = (
    ("manifest_write_s", "manifest write s (bench)", 1),
    ("listing_s", "manifest read s", 1),
    ("model_check_s", "model check s", 1),
    ("plan_s", "plan s", 1),
    ("spark_s", "Spark job s", 1),
    ("tasks_s", "tasks window s", 1),
    ("overhead_window_ms", "per-task overhead ms (window)", 1),
    ("overhead_idle_ms", "per-task overhead ms (idle)", 1),
    ("in_task_ms", "in-task ms", 1),
    ("assembly_s", "assembly s", 1),
    ("assembly_cpu_s", "assembly driver CPU s", 1),
    ("elapsed_s", "job elapsed s", 1),
    ("wall_s", "spark-submit wall s", 1),
    ("last_task_to_exit_s", "last task to exit s", 1),
    ("driver_python_mib", "driver python peak MiB", 0),
    ("driver_jvm_mib", "driver JVM peak MiB", 0),
    ("driver_total_mib", "python + JVM MiB", 0),
)


#: Columns that are averages per batch: extrapolated as totals (value x batches), then divided by the batches.
PER_BATCH = ("overhead_window_ms", "overhead_idle_ms", "in_task_ms")


class Watch(ProcessWatch):
    """:class:`ProcessWatch` that also knows the fake daemon and its forks as Python workers."""

    @staticmethod
    def role(process: psutil.Process) -> str:
        role = ProcessWatch.role(process)
        if role.startswith("python") and DAEMON_MODULE in " ".join(process.cmdline()):
            return "python worker"
        return role


# ----------------------------------------------------------------------------
# Arithmetic (tests/bench/test_bench.py checks it on a hand-made summary)


def task_overhead(summary: dict, executors: int) -> dict:
    """Per-task overhead (window, idle) and in-task time, in ms per batch; see the module's docstring."""
    batches = summary.get("batches") or 0
    window = (summary.get("tasks") or {}).get("seconds")
    workers = list((summary.get("python_workers") or {}).values())
    in_tasks = sum(w.get("task_seconds", 0.0) for w in workers)
    idle = sum(w.get("idle_between_tasks_seconds", 0.0) for w in workers)
    if not batches or not workers:
        return {"overhead_window_ms": None, "overhead_idle_ms": None, "in_task_ms": None}
    return {
        "overhead_window_ms": 1000 * (window * executors - in_tasks) / batches if window else None,
        "overhead_idle_ms": 1000 * idle / batches,
        "in_task_ms": 1000 * in_tasks / batches,
    }


def extrapolate(points: Sequence[tuple[float, float | None]], target: float) -> float | None:
    """The value at ``target`` on the straight line through two points ``(x, y)``; ``None`` if a ``y`` is."""
    (x1, y1), (x2, y2) = points
    if y1 is None or y2 is None or x1 == x2:
        return None
    return y2 + (y2 - y1) / (x2 - x1) * (target - x2)


def extrapolated_row(rows: Sequence[dict], target: int, batch_size: int) -> dict | None:
    """Every column at ``target`` keys, from the two largest measured key counts below it (``None``: fewer)."""
    below = sorted((r for r in rows if r["keys"] < target), key=lambda r: r["keys"])[-2:]
    if len(below) < 2:
        return None
    batches = math.ceil(target / batch_size)
    out = {"keys": target, "batches": batches, "from": [r["keys"] for r in below]}
    for field, _, _ in COLUMNS:
        if field in PER_BATCH:
            # An average per batch: extrapolate its total (fixed costs plus a cost per batch), then divide.
            totals = [(r["keys"], None if r.get(field) is None else r[field] * r["batches"]) for r in below]
            total = extrapolate(totals, target)
            out[field] = None if total is None else total / batches
        else:
            out[field] = extrapolate([(r["keys"], r.get(field)) for r in below], target)
    return out


def mebibytes(value: str) -> float:
    """A JVM memory setting (``2g``, ``512m``, ``1024k``, bytes) in MiB."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)b?\s*", str(value).lower())
    if not match:
        raise ValueError(f"not a memory size: {value!r}")
    number, unit = float(match.group(1)), match.group(2)
    return number * {"": 1 / MIB, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]


def emr_driver_memory(path: Path = ROOT / "conf" / "emr.yaml", name: str = "spark.driver.memory") -> str | None:
    """Setting ``name`` of the ``spark-defaults`` classification in ``conf/emr.yaml``."""
    config = yaml.safe_load(path.read_text())
    for item in config.get("configurations") or []:
        if item.get("Classification") == "spark-defaults":
            value = (item.get("Properties") or {}).get(name)
            return None if value is None else str(value)
    return None


# ----------------------------------------------------------------------------
# One run


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown CPU"
    for line in out.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "Model name":
            return value.strip()
    return "unknown CPU"


#: Keys per folder of the manifest's layout (``bench.listing.layout_keys("nested", ...)``).
FOLDER_KEYS = 1000


def manifest_key(i: int) -> str:
    """The manifest's key ``i`` (from 0): ``bench.listing.layout_keys("nested", ...)[i]``."""
    folder = f"n{1440000 + i // FOLDER_KEYS:08d}"
    return f"{LISTING_PREFIX}{folder}/{folder}_{i % FOLDER_KEYS}.JPEG"


def manifest_keys(count: int) -> Iterator[str]:
    """``bench.listing.layout_keys("nested", count)``, one key at a time (10,000,000 keys need no list)."""
    return map(manifest_key, range(count))


#: A folder's key numbers in the order of their keys' bytes, the job's order: ``_10.JPEG`` before ``_2.JPEG``.
_FOLDER_ORDER = sorted(range(FOLDER_KEYS), key=lambda j: f"{j}.JPEG")


def sorted_manifest_keys(count: int, leave_out: frozenset = frozenset()) -> Iterator[str]:
    """The keys of :func:`manifest_keys` in the job's (byte) order, less the positions in ``leave_out``.

    A folder at a time: folders sort as their numbers (zero-padded), so no list of ``count`` keys is sorted.
    """
    for start in range(0, count, FOLDER_KEYS):
        for j in _FOLDER_ORDER:
            i = start + j
            if i < count and i not in leave_out:
                yield manifest_key(i)


#: The manifests this run of the bench has written (a row at the same key count reuses its manifest).
WRITTEN: set = set()


def write_manifest(path: Path, count: int) -> float:
    """A ``bucket,key,size`` CSV of ``count`` keys (with the header); the seconds it took."""
    started = time.perf_counter()
    with open(path, "w", newline="") as out:
        out.write("bucket,key,size\n")
        out.writelines(f"{BUCKET},{key},{OBJECT_SIZE}\n" for key in manifest_keys(count))
    return time.perf_counter() - started


def first_row(s3, output_key: str, dataset: bool) -> dict:
    """The output's first row: the JSON Lines object's first line, or the dataset's first file's first row."""
    if not dataset:
        first = s3.get_object(Bucket=BUCKET, Key=output_key, Range="bytes=0-1023")["Body"].read()
        return json.loads(first.split(b"\n", 1)[0])
    body = s3.get_object(Bucket=BUCKET, Key=f"{output_key}part-00000.parquet")["Body"].read()
    row = pq.read_table(io.BytesIO(body)).slice(0, 1).to_pylist()[0]
    # Parquet has the label column (null without labels) and float32 probabilities: as the JSON line has them.
    row["predictions"] = [{k: v for k, v in p.items() if v is not None} for p in row["predictions"] or []]
    return row


def spark_stop_seconds(log_text: str) -> float | None:
    """The driver's "Spark stopped in X s" (the SparkContext's stop, which overlaps the assembly's tail)."""
    match = re.search(r"Spark stopped in ([\d.]+) s", log_text)
    return float(match.group(1)) if match else None


def executors_of(master: str) -> int | None:
    match = re.fullmatch(r"local-cluster\[(\d+),.*\]", master)
    return int(match.group(1)) if match else None


def submit(job_args: list[str], args, endpoint: str, log_path: Path, what: str) -> tuple[Watch, float, float]:
    """spark-submit the job with ``job_args`` and the fake scorer, watched: ``(watch, started, exited)``.

    Raises ``RuntimeError`` naming ``what`` and the log if it exits non-zero.
    """
    command = spark_submit_command(job_args, args.master)
    settings = [f"spark.python.daemon.module={DAEMON_MODULE}", f"spark.executorEnv.PYTHONPATH={ROOT}",
                *args.spark_conf]
    for setting in reversed(settings):  # after "spark-submit --master M": over conf/spark-local.conf
        command[3:3] = ["--conf", setting]
    started = time.time()
    port = endpoint.rsplit(":", 1)[1]
    servers = [p for p in psutil.process_iter(["cmdline"])
               if "moto_server" in " ".join(p.info["cmdline"] or []) and port in (p.info["cmdline"] or [])]
    moto = {"S3 stand-in: moto": servers[0]} if servers else {}
    with open(log_path, "w") as out:
        process = subprocess.Popen(command, env=spark_env(), cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT)
        with Watch(process.pid, fixed=moto, every=0.5) as watch:
            code = process.wait()
    exited = time.time()
    if code != 0:
        raise RuntimeError(f"{what} exited {code}; see {log_path}")
    return watch, started, exited


def run_point(s3, endpoint: str, keys: int, args, batch_size: int | None = None,
              dataset: bool = False) -> dict:
    """Write the manifest, run the job on it, read its summary and output: one row of the table.

    Its files go in ``args.work``. ``dataset``: the output is a Parquet dataset (``out/scale-N-dataset/``), not one
    JSON Lines object.
    """
    work = args.work
    batch_size = batch_size or args.batch_size
    manifest = work / f"manifest-{keys}.csv"
    if manifest in WRITTEN:
        manifest_seconds = None  # written for an earlier row of this run
    else:
        log(f"{keys:,} keys: writing {manifest}")
        manifest_seconds = write_manifest(manifest, keys)
        WRITTEN.add(manifest)
    label = "dataset" if dataset else "object"
    output_key = f"out/scale-{keys}-dataset/" if dataset else f"out/scale-{keys}.jsonl"
    summary_key = f"{output_key}_summary.json" if dataset else f"{output_key}.summary.json"
    job_args = ["--input-manifest", str(manifest), "--model", f"s3://{BUCKET}/models/{MODEL.name}",
                "--output", f"s3://{BUCKET}/{output_key}", "--endpoint-url", endpoint,
                "--input-shape", MODEL.shape_arg, "--batch-size", str(batch_size), "--top-k", "1",
                "--progress-seconds", "30"]
    log_path = work / f"scale-{keys}-{label}.log"
    log(f"{keys:,} keys: spark-submit on {args.master}, batch {batch_size} "
        f"({math.ceil(keys / batch_size):,} tasks), fake scorer; log in {log_path}")
    watch, started, exited = submit(job_args, args, endpoint, log_path, f"the {keys:,}-key job")
    wall = exited - started
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=summary_key)["Body"].read())
    (work / f"scale-{keys}-{label}.summary.json").write_text(json.dumps(summary, indent=2))
    first_line = first_row(s3, output_key, dataset)
    if first_line.get("predictions") != FAKE_PREDICTIONS:
        raise RuntimeError(f"the output's first line is not the fake scorer's: {first_line}; was "
                           f"spark.python.daemon.module={DAEMON_MODULE} used? see {log_path}")
    if summary.get("keys_listed") != keys or summary.get("predicted") != keys:
        raise RuntimeError(f"the job listed {summary.get('keys_listed')} keys and predicted "
                           f"{summary.get('predicted')}, not {keys}; see {log_path}")
    # moto keeps objects in memory
    for key in ([k for k, _ in parallel_list.list_objects(s3, BUCKET, output_key)] if dataset else [output_key]):
        s3.delete_object(Bucket=BUCKET, Key=key)
    seconds = summary.get("seconds") or {}
    python, jvm = watch.peak("driver python"), watch.peak("driver JVM")
    row = {
        "keys": keys, "batch_size": batch_size, "batches": summary.get("batches"),
        "output": "dataset" if dataset else "single object",
        "manifest_write_s": manifest_seconds,
        "listing_s": seconds.get("listing"), "model_check_s": seconds.get("model_check"),
        "plan_s": seconds.get("plan"), "spark_s": seconds.get("spark"),
        "tasks_s": (summary.get("tasks") or {}).get("seconds"), "assembly_s": seconds.get("assembly"),
        "assembly_cpu_s": seconds.get("assembly_cpu"),
        "output_close_s": seconds.get("output_close"),
        # From the last task's end to the output's (and the summary's) completion, as the driver clocks it.
        "output_after_last_task_s": seconds.get("output_after_last_task"),
        "spark_stop_s": spark_stop_seconds(log_path.read_text(errors="replace")),
        "elapsed_s": summary.get("elapsed_seconds"), "wall_s": wall,
        # From the last task's end to spark-submit's exit: SparkContext stop, the assembly, the summary, JVM exit.
        "last_task_to_exit_s": exited - (summary.get("tasks") or {}).get("last_end", exited),
        "driver_python_mib": python / MIB if python else None, "driver_jvm_mib": jvm / MIB if jvm else None,
        "driver_total_mib": (python + jvm) / MIB if python and jvm else None,
        "summary_seconds_keys": sorted(seconds),
        "worker_peak_mib": [w["max_rss_bytes"] / MIB for w in (summary.get("python_workers") or {}).values()
                            if w.get("max_rss_bytes")],
    }
    executors = executors_of(args.master) or len(summary.get("executors") or {}) or 1
    row.update(task_overhead(summary, executors))
    tasks = summary.get("tasks") or {}
    if tasks.get("first_start") and summary.get("batches"):
        # What each process spent per task while the tasks ran: Spark's share, the workers', moto's.
        cpu = watch.cpu_between(tasks["first_start"], tasks["last_end"])
        row["cpu_ms_per_task"] = {role: 1000 * seconds / summary["batches"] for role, seconds in cpu.items()
                                  if seconds > 0}
    log(f"{keys:,} keys: done in {wall:.0f} s (Spark job {row['spark_s'] or 0:.0f} s)")
    return row


# ----------------------------------------------------------------------------
# The report


def _cell(value, decimals: int) -> str:
    return "n/a" if value is None else f"{value:,.{decimals}f}"


def report(rows: list[dict], args, cpu: str, started: float) -> str:
    out = [f"CPU: {cpu} ({os.cpu_count()} vCPUs), {psutil.virtual_memory().total / 2**30:.1f} GiB",
           f"FAKE SCORER on the executors ({DAEMON_MODULE}: no S3 GET, no decode, no MXNet; one fixed top-1 "
           f"line per key); the driver, the tasks' part PUTs and the assembly are real.",
           f"spark-submit --master '{args.master}' with conf/spark-local.conf"
           + (f" and {' '.join(args.spark_conf)}" if args.spark_conf else "")
           + f"; batch {args.batch_size}; model check on {MODEL.name} {MODEL.shape_arg} (random weights)", ""]
    header = "| keys | batches | " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    out += [header, "|" + "---:|" * (2 + len(COLUMNS))]
    extra = extrapolated_row(rows, TARGET, args.batch_size)
    for row in sorted(rows, key=lambda r: r["keys"]) + ([extra] if extra else []):
        label = f"{row['keys']:,}"
        if "from" in row:
            label = f"{label} EXTRAPOLATED (linear from {row['from'][0]:,} and {row['from'][1]:,})"
        out.append(f"| {label} | {row['batches']:,} | "
                   + " | ".join(_cell(row.get(field), d) for field, _, d in COLUMNS) + " |")
    if extra is None:
        out.append(f"(no extrapolation to {TARGET:,} keys: it needs two measured key counts below it)")
    elif extra["from"][1] < 100_000:
        out.append(f"(a smoke run: from {extra['from'][0]:,} and {extra['from'][1]:,} keys the slopes are mostly "
                   "noise, and the extrapolated row means little; run the default key counts for figures)")
    out.append("")
    out.append("per-task overhead (window) = (tasks.seconds x executors - sum of python_workers task_seconds) "
               "/ batches; (idle) = sum of python_workers idle_between_tasks_seconds / batches; "
               "in-task = sum of task_seconds / batches")
    for row in sorted(rows, key=lambda r: r["keys"]):
        cpu = row.get("cpu_ms_per_task")
        if cpu:
            total = sum(cpu.values())
            out.append(f"CPU per task while the tasks ran, {row['keys']:,} keys (ms): "
                       + ", ".join(f"{role} {ms:.1f}" for role, ms in sorted(cpu.items(), key=lambda x: -x[1]))
                       + f"; total {total:.1f} -> at most {1000 * (os.cpu_count() or 1) / total:.1f} tasks/s "
                       f"on {os.cpu_count()} cores")
    out.append("extrapolated per-task columns: their totals (ms x batches) extrapolated, divided by the batches")
    workers = "; ".join(f"{r['keys']:,} keys: " + " / ".join(f"{m:.0f}" for m in r["worker_peak_mib"]) for r in rows)
    out.append(f"Python worker peak RSS MiB (no MXNet under the fake scorer): {workers}")
    missing = sorted({k for k in ("listing", "model_check", "plan", "spark", "assembly")
                      if any(k not in r["summary_seconds_keys"] for r in rows)})
    if missing:
        out.append(f"n/a: the job's summary has no seconds.{', seconds.'.join(missing)} "
                   f"(its seconds: {', '.join(rows[0]['summary_seconds_keys'])})")
    emr = emr_driver_memory()
    overhead = emr_driver_memory(name="spark.driver.memoryOverhead") or "384m"
    local = next((s.split("=", 1)[1] for s in args.spark_conf if s.startswith("spark.driver.memory=")), None)
    if emr:
        largest = max(rows, key=lambda r: r["keys"])
        line = (f"driver memory: spark.driver.memory in conf/emr.yaml is {emr} ({mebibytes(emr):,.0f} MiB, the "
                f"driver JVM's heap) and spark.driver.memoryOverhead {overhead}: the YARN container holds "
                f"{mebibytes(emr) + mebibytes(overhead):,.0f} MiB, the Python driver included. Python + JVM peak "
                f"here: "
                f"{_cell(largest['driver_total_mib'], 0)} MiB at {largest['keys']:,} keys")
        if extra:
            line += f", {_cell(extra['driver_total_mib'], 0)} MiB extrapolated to {TARGET:,}"
        out.append(line + ".")
    out.append(f"The local driver JVM ran with spark.driver.memory {local or '1g (Spark default)'}: "
               "its heap stops there, so its RSS does not grow without bound.")
    out.append(f"bench wall time: {time.time() - started:.0f} s")
    return "\n".join(out)


# ----------------------------------------------------------------------------
# The opt-in rows: ten million keys measured, a hundred million planned


def ten_million_report(row: dict) -> str:
    """The ten-million-key row (or its ``--row-keys`` stand-in), each figure against its target."""
    read_and_plan = (row.get("listing_s") or 0) + (row.get("plan_s") or 0)
    targets = TEN_MILLION_TARGETS
    lines = [f"{row['keys']:,} keys MEASURED, batch {row['batch_size']:,} ({row['batches']:,} tasks), fake scorer:",
             f"  driver peak RSS: Python {_cell(row['driver_python_mib'], 0)} MiB + JVM "
             f"{_cell(row['driver_jvm_mib'], 0)} MiB = {_cell(row['driver_total_mib'], 0)} MiB "
             f"(target <= {targets['driver_total_mib']:,} MiB: "
             f"{_verdict(row['driver_total_mib'], targets['driver_total_mib'])})",
             f"  driver stages s: manifest read {_cell(row['listing_s'], 1)}, model check "
             f"{_cell(row['model_check_s'], 1)}, plan {_cell(row['plan_s'], 1)}, Spark job {_cell(row['spark_s'], 1)}, "
             f"assembly {_cell(row['assembly_s'], 1)} (driver CPU {_cell(row['assembly_cpu_s'], 1)})",
             f"  manifest read + plan: {read_and_plan:.1f} s (target <= {targets['read_and_plan_s']} s: "
             f"{_verdict(read_and_plan, targets['read_and_plan_s'])})",
             f"  per-task overhead ms: {_cell(row.get('overhead_window_ms'), 1)} (window), "
             f"{_cell(row.get('overhead_idle_ms'), 1)} (idle); in-task {_cell(row.get('in_task_ms'), 1)} ms",
             f"  last task's end to spark-submit's exit: {_cell(row['last_task_to_exit_s'], 1)} s; "
             f"spark-submit wall {_cell(row['wall_s'], 1)} s"]
    if row["keys"] != TEN_MILLION:
        lines.append(f"  (at {row['keys']:,} keys, not {TEN_MILLION:,}: the targets are for ten million)")
    return "\n".join(lines)


def _verdict(value: float | None, limit: float) -> str:
    return "n/a" if value is None else "MET" if value <= limit else "MISSED"


def dry_run_point(s3, endpoint: str, keys: int, args) -> dict:
    """``--dry-run`` over a manifest of ``keys`` keys as plain Python: its plan, peak RSS and time (files in
    ``args.work``)."""
    work = args.work
    manifest = work / f"manifest-{keys}.csv"
    if not manifest.exists():
        log(f"{keys:,} keys: writing {manifest}")
        write_manifest(manifest, keys)
    command = [sys.executable, str(ROOT / "infer_main.py"), "--input-manifest", str(manifest),
               "--model", f"s3://{BUCKET}/models/{MODEL.name}", "--output", f"s3://{BUCKET}/out/dry-{keys}.jsonl",
               "--endpoint-url", endpoint, "--input-shape", MODEL.shape_arg,
               "--batch-size", str(args.batch_size), "--top-k", "1", "--dry-run"]
    log(f"{keys:,} keys: --dry-run (no Spark), batch {args.batch_size}")
    started = time.time()
    with open(work / f"dry-{keys}.log", "w") as errors:
        process = subprocess.Popen(command, env=spark_env(), cwd=str(ROOT), stdout=subprocess.PIPE, stderr=errors,
                                   text=True)
        with Watch(process.pid, every=0.5) as watch:
            out, _ = process.communicate()
    seconds = time.time() - started
    if process.returncode != 0:
        raise RuntimeError(f"the {keys:,}-key dry run exited {process.returncode}; see {work / f'dry-{keys}.log'}")
    plan = json.loads(out.strip().splitlines()[-1])
    peak = max((watch.peak(role) or 0) for role in ("driver python", "python", "other"))
    return {"keys": keys, "seconds": seconds, "peak_mib": peak / MIB, "plan": plan}


def hundred_million_report(row: dict) -> str:
    """The dry run's row: what it planned, its peak RSS and time, against the targets."""
    plan, targets = row["plan"], HUNDRED_MILLION_TARGETS
    shown = {k: plan.get(k) for k in ("images", "to_score", "batch_size", "batches", "plan_bytes", "first_key",
                                      "last_key", "sample_seconds")}
    lines = [f"{row['keys']:,} keys PLANNED (--dry-run, no Spark job): {json.dumps(shown)}",
             f"  peak RSS {row['peak_mib']:,.0f} MiB (target <= {targets['peak_mib']:,} MiB: "
             f"{_verdict(row['peak_mib'], targets['peak_mib'])}); time {row['seconds']:.1f} s "
             f"(target <= {targets['seconds']} s: {_verdict(row['seconds'], targets['seconds'])})"]
    if row["keys"] != HUNDRED_MILLION:
        lines.append(f"  (at {row['keys']:,} keys, not {HUNDRED_MILLION:,}: the targets are for a hundred million)")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# The opt-in row: --skip-existing over a dataset that holds N keys

#: Keys of the run that gives the existing dataset its fingerprint (bench.existing_keys).
SEED_KEYS = 100


def _delete_prefix(s3, prefix: str) -> None:
    """Delete every object under ``prefix`` (moto keeps objects in memory)."""
    for key, _ in parallel_list.list_objects(s3, BUCKET, prefix):
        s3.delete_object(Bucket=BUCKET, Key=key)


def _manifest(work: Path, keys: int) -> Path:
    manifest = work / f"manifest-{keys}.csv"
    if manifest not in WRITTEN:
        log(f"{keys:,} keys: writing {manifest}")
        write_manifest(manifest, keys)
        WRITTEN.add(manifest)
    return manifest


def existing_point(s3, endpoint: str, existing: int, args) -> dict:
    """``--existing-keys``: a dataset of ``existing`` keys, then ``--skip-existing`` over them and 1% more.

    1. the job on :data:`SEED_KEYS` keys to a dataset of its own: its file's ``mxinfer.fingerprint`` and its
       ``--rows-per-file auto``;
    2. the existing dataset, written by the bench through the job's sink (:mod:`bench.existing_keys`), its
       first file's schema checked against the job's;
    3. the job with ``--skip-existing`` on a manifest of the existing keys and the new ones, watched; its
       summary's counts and its files' keys checked against the new keys.
    """
    work, batch_size = args.work, args.ten_million_batch
    row_started = time.time()
    common = ["--model", f"s3://{BUCKET}/models/{MODEL.name}", "--endpoint-url", endpoint,
              "--input-shape", MODEL.shape_arg, "--batch-size", str(batch_size), "--top-k", "1",
              "--progress-seconds", "30"]

    seed = "out/existing-seed/"
    log_path = work / "existing-seed.log"
    log(f"--existing-keys: the job on {SEED_KEYS} keys, for the dataset's fingerprint; log in {log_path}")
    submit(["--input-manifest", str(_manifest(work, SEED_KEYS)), "--output", f"s3://{BUCKET}/{seed}", *common],
           args, endpoint, log_path, f"the {SEED_KEYS}-key run")
    seed_body = s3.get_object(Bucket=BUCKET, Key=f"{seed}part-00000.parquet")["Body"].read()
    seed_summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{seed}_summary.json")["Body"].read())
    rows_per_file = seed_summary["dataset"]["rows_per_file"]
    _delete_prefix(s3, seed)

    total, positions = existing_keys.layout(existing)
    new = frozenset(positions.tolist())
    prefix = f"out/existing-{existing}/"
    log(f"--existing-keys: writing {existing:,} keys under s3://{BUCKET}/{prefix}, {rows_per_file:,} rows a file")
    started = time.time()
    files = existing_keys.write_dataset(s3, BUCKET, prefix, sorted_manifest_keys(total, new), rows_per_file,
                                        existing_keys.provenance(seed_body))
    write_seconds = time.time() - started
    ours = pq.ParquetFile(io.BytesIO(s3.get_object(Bucket=BUCKET, Key=files[0]["key"])["Body"].read())).schema_arrow
    if not ours.equals(pq.ParquetFile(io.BytesIO(seed_body)).schema_arrow, check_metadata=True):
        raise RuntimeError(f"the bench's dataset files are not the job's: {ours} against the job's file")

    manifest = _manifest(work, total)
    log_path = work / f"existing-{existing}.log"
    log(f"--existing-keys: --skip-existing over {total:,} keys ({len(new):,} new), batch {batch_size:,}; "
        f"log in {log_path}")
    watch, started, exited = submit(["--input-manifest", str(manifest), "--output", f"s3://{BUCKET}/{prefix}",
                                     "--skip-existing", *common], args, endpoint, log_path,
                                    f"the --skip-existing run over {total:,} keys")
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{prefix}_summary.json")["Body"].read())
    (work / f"existing-{existing}.summary.json").write_text(json.dumps(summary, indent=2))
    found = summary.get("existing") or {}
    run_files = [key for key, _ in parallel_list.list_objects(s3, BUCKET, prefix)
                 if (dataset_files.file_id(key, prefix) or (None,))[0] is not None]
    scored = [k for key in sorted(run_files) for k in pq.read_table(
        io.BytesIO(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()), columns=["key"]).column("key").to_pylist()]
    expected = sorted(manifest_key(i) for i in new)
    exact = (scored == expected and summary.get("predicted") == len(new) and summary.get("keys_listed") == total
             and found.get("keys_in_output") == found.get("skipped") == found.get("rows_read") == existing
             and found.get("new_keys") == len(new) and found.get("files_read") == len(files))
    _delete_prefix(s3, prefix)
    python, jvm = watch.peak("driver python"), watch.peak("driver JVM")
    seconds = summary.get("seconds") or {}
    row = {"existing": existing, "new": len(new), "total": total, "batch_size": batch_size,
           "rows_per_file": rows_per_file, "files_written": len(files), "write_s": write_seconds,
           "summary_existing": found, "predicted": summary.get("predicted"), "keys_listed": summary.get("keys_listed"),
           "scored_keys_read_back": len(scored), "exactly_the_new_keys": exact,
           "listing_s": seconds.get("listing"), "existing_s": seconds.get("existing"),
           "model_check_s": seconds.get("model_check"), "plan_s": seconds.get("plan"), "spark_s": seconds.get("spark"),
           "assembly_s": seconds.get("assembly"), "elapsed_s": summary.get("elapsed_seconds"),
           "wall_s": exited - started, "row_wall_s": time.time() - row_started,
           "driver_python_mib": python / MIB if python else None, "driver_jvm_mib": jvm / MIB if jvm else None,
           "driver_total_mib": (python + jvm) / MIB if python and jvm else None}
    log(f"--existing-keys: done in {row['row_wall_s']:.0f} s (the run {row['wall_s']:.0f} s)")
    return row


def existing_report(row: dict, args) -> str:
    """The ``--existing-keys`` row: what was found and scored, the driver's peak against the memory targets."""
    found, target = row["summary_existing"], TEN_MILLION_TARGETS["driver_total_mib"]
    heap = emr_driver_memory() or "n/a"
    overhead = emr_driver_memory(name="spark.driver.memoryOverhead") or "384m"
    local = next((s.split("=", 1)[1] for s in args.spark_conf if s.startswith("spark.driver.memory=")), None)
    lines = [f"--skip-existing over a dataset of {row['existing']:,} keys MEASURED: a manifest of {row['total']:,} "
             f"keys, 1% new spread evenly, batch {row['batch_size']:,}, fake scorer:",
             "| keys existing | keys new | find the new keys s | files read | rows read | keys scored "
             "| exactly the new keys | driver python peak MiB | driver JVM peak MiB | python + JVM MiB "
             "| job elapsed s | spark-submit wall s |",
             "|---:|---:|---:|---:|---:|---:|:---:|---:|---:|---:|---:|---:|",
             f"| {row['existing']:,} | {row['new']:,} | {_cell(found.get('seconds'), 1)} | "
             f"{_cell(found.get('files_read'), 0)} | {_cell(found.get('rows_read'), 0)} | "
             f"{_cell(row['predicted'], 0)} | "
             f"{'yes' if row['exactly_the_new_keys'] else 'NO'} | {_cell(row['driver_python_mib'], 0)} | "
             f"{_cell(row['driver_jvm_mib'], 0)} | {_cell(row['driver_total_mib'], 0)} | "
             f"{_cell(row['elapsed_s'], 1)} | {_cell(row['wall_s'], 1)} |",
             f"  the dataset before: {row['files_written']:,} file{'s' * (row['files_written'] != 1)} of up to "
             f"{row['rows_per_file']:,} rows (the job's --rows-per-file auto), written by the bench through the "
             f"job's sink in {row['write_s']:.1f} s, with the fingerprint of a {SEED_KEYS}-key run of the job",
             f"  summary existing: {json.dumps(found)}; keys listed {row['keys_listed']:,}, predicted "
             f"{row['predicted']:,}; the run's files hold {row['scored_keys_read_back']:,} keys",
             f"  driver stages s: manifest read {_cell(row['listing_s'], 1)}, finding the new keys "
             f"{_cell(row['existing_s'], 1)}, model check {_cell(row['model_check_s'], 1)}, plan "
             f"{_cell(row['plan_s'], 1)}, Spark job {_cell(row['spark_s'], 1)}, assembly {_cell(row['assembly_s'], 1)}",
             f"  memory target: the driver's Python + JVM peak <= {target:,} MiB (the ten-million row's): "
             f"{_verdict(row['driver_total_mib'], target)}; on EMR (conf/emr.yaml) spark.driver.memory is {heap} "
             f"(the JVM's heap) and spark.driver.memoryOverhead {overhead}, where the Python driver lives: Python "
             f"{_cell(row['driver_python_mib'], 0)} MiB of {mebibytes(overhead):,.0f} MiB: "
             f"{_verdict(row['driver_python_mib'], mebibytes(overhead))}",
             f"  the local driver JVM ran with spark.driver.memory {local or '1g (Spark default)'}; the row's wall "
             f"time (the {SEED_KEYS}-key run, writing the dataset, the run): {row['row_wall_s']:.0f} s"]
    if row["existing"] != TEN_MILLION:
        lines.append(f"  (at {row['existing']:,} existing keys, not {TEN_MILLION:,}: the target is for ten million)")
    return "\n".join(lines)


def existing_row(s3, endpoint: str, args) -> str:
    """``--existing-keys``: run the row (:func:`existing_point`), keep it in ``existing-keys.json``; its report."""
    row = existing_point(s3, endpoint, args.existing_keys, args)
    (args.work / "existing-keys.json").write_text(json.dumps(row, indent=2))
    return existing_report(row, args)


def _positive(text: str) -> int:
    value = int(text.replace("_", ""))
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a positive key count")
    return value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Driver and per-task cost at scale, with a fake fast scorer.")
    parser.add_argument("--keys", default=None,
                        help="comma-separated key counts [default: 100000,1000000, unless only the opt-in rows run]")
    parser.add_argument("--ten-million", action="store_true",
                        help="also run the job on 10,000,000 keys (about an hour) and check the targets")
    parser.add_argument("--ten-million-batch", type=int, default=1024,
                        help="--batch-size of the ten-million row [default: 1024, see the module's docstring]")
    parser.add_argument("--hundred-million", action="store_true",
                        help="also --dry-run over 100,000,000 keys: read, plan every batch, print the plan")
    parser.add_argument("--existing-keys", type=_positive, default=None, metavar="N",
                        help="also run --skip-existing over a dataset that holds N keys (say 10000000) and a "
                             "manifest of 1%% more: the time to find the new keys, the driver's peak; batch "
                             "--ten-million-batch")
    parser.add_argument("--row-keys", type=int, default=None,
                        help="run the opt-in rows at this many keys instead, to check the bench at a small size")
    parser.add_argument("--quick", action="store_true", help="smoke run: 10,000 and 20,000 keys")
    parser.add_argument("--batch-size", type=int, default=64, help="the job's --batch-size (one task per batch)")
    parser.add_argument("--master", default=MASTER)
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting, over conf/spark-local.conf (repeatable), "
                             "e.g. spark.driver.memory=2g")
    parser.add_argument("--work", type=Path, default=ROOT / "run" / "bench-scale",
                        help="folder for the manifests, model, logs, summaries and results.json")
    args = parser.parse_args(argv)
    opt_in = args.ten_million or args.hundred_million or args.existing_keys
    keys = args.keys if args.keys is not None else ("" if opt_in else "100000,1000000")
    counts = [10_000, 20_000] if args.quick else [int(x.replace("_", "")) for x in keys.split(",") if x]
    if (not counts and not opt_in) or min(counts, default=1) < 1:
        parser.error("--keys: give positive key counts")
    started = time.time()
    cpu = cpu_model()
    print(f"CPU: {cpu}; FAKE SCORER on the executors ({DAEMON_MODULE})", flush=True)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    prefix = bench_models.export(MODEL, work / "models")
    rows = []
    with moto_server(work / "moto.log") as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name=FAKE_AWS_ENV["AWS_DEFAULT_REGION"],
                          aws_access_key_id=FAKE_AWS_ENV["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=FAKE_AWS_ENV["AWS_SECRET_ACCESS_KEY"])
        s3.create_bucket(Bucket=BUCKET)
        for suffix in ("-symbol.json", "-0000.params"):
            path = prefix.with_name(prefix.name + suffix)
            # One PUT (see bench.run_bench.upload: moto and multipart checksums).
            s3.put_object(Bucket=BUCKET, Key=f"models/{path.name}", Body=path.read_bytes())
        for count in sorted(set(counts)):
            rows.append(run_point(s3, endpoint, count, args))
        extra = []
        if args.ten_million:
            big = run_point(s3, endpoint, args.row_keys or TEN_MILLION, args, args.ten_million_batch)
            extra.append(ten_million_report(big))
            (work / "ten-million.json").write_text(json.dumps(big, indent=2))
        if args.existing_keys:
            extra.append(existing_row(s3, endpoint, args))
        if args.hundred_million:
            extra.append(hundred_million_report(dry_run_point(s3, endpoint, args.row_keys or HUNDRED_MILLION,
                                                              args)))
    text = report(rows, args, cpu, started) if rows else ""
    print("\n" + "\n\n".join([t for t in (text, *extra) if t]), flush=True)
    (work / "results.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
