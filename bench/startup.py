"""``make bench-startup``: where a small run's start-up goes, from spark-submit's start to its first durable batch.

Not a test: it prints measurements. It uploads ``--images`` JPEGs and the
checkpoint to a moto bucket (as ``bench/peers.py`` does), runs the job
``--runs`` times through ``spark-submit`` on ``make run-local``'s master,
each from a cold start, and for each run takes the time of each step's end,
in seconds from spark-submit's start:

- from the process tree, sampled every 0.1 s (:class:`bench.peers.TreeCpu`):
  when the Python driver, the first executor's JVM and the first Python
  worker started (their processes' creation times, put on the wall clock by
  spark-submit's own: :meth:`bench.peers.Watched.wall_clock`);
- from the driver's log (its lines carry their times): when the listing
  began and ended, and when the executors had loaded the model
  (``mxjob.run.spark_start``'s line); going back from there by the checking
  warm-up task's own split (``mxjob.run.warm_up``'s line: the estimate's
  sample, the first forward pass, the model's load, MXNet's import), when
  each of those began, and so when the warm-up's task reached the worker;
- from the run's summary: when its first batch began and when the first one
  was durable (its part written), and the job's end.

It prints each step's median over the runs, the step's share of the time
to the first durable batch, and the CPU the run's processes used by group
over the whole run, with the CPU's name.

Usage::

    python -m bench.startup                    # 64 images, 3 runs (about 2 minutes)
    python -m bench.startup --images 16 --runs 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import peers  # noqa: E402
from bench.int8_search import cpu_description  # noqa: E402
from demo.run_local import spark_env  # noqa: E402
from mxjob.executor.model_check import WARM_STEPS  # noqa: E402

#: The steps, in the order they usually end, with what ends each: the printout's rows.
STEPS = (
    ("python_driver", "spark-submit's JVM starts and launches the Python driver"),
    ("listing_began", "the driver's imports and its checks of the options, the output and the model's files"),
    ("listing_ended", "the listing"),
    ("executor_jvm", "the SparkContext, and the first executor's JVM starting"),
    ("python_worker", "that executor's start, to its first Python worker"),
    ("warm_up_began", "the warm-up's task reaching that worker (Spark's task, its function unpickled)"),
    ("mxnet_imported", "MXNet's import, on the executor"),
    ("model_read", "the model's load and check (its files read, every lane's copy bound)"),
    ("first_pass", "the first forward pass, which builds the kernels"),
    ("model_loaded", "the estimate's sample, timed (to the warm-up job's end: the executors loaded the model)"),
    ("first_batch", "the plan and the run's Spark job, to its first task"),
    ("first_durable", "the first batch: its images read, decoded, scored, its part written"),
)
#: The driver's log lines the steps are read from (``infer_main``'s format: ``%(asctime)s %(levelname)s ...``).
LISTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO mxjob\.s3\.parallel_list: listed .* in ([\d.]+)s ",
                    re.MULTILINE)
#: The warm-up's split in the driver's log (:func:`mxjob.run.warm_up.split_words`): each step's seconds, in order.
SPLIT = re.compile(r"as it warmed up \(" + ", ".join(re.escape(words) + r" ([\d.]+) s"
                                                     for words in WARM_STEPS.values()) + r"\)")
#: The mark where each of the warm-up's steps begins, in WARM_STEPS' order (the last step ends at ``model_loaded``).
BEGINS = dict(zip(WARM_STEPS, ("warm_up_began", "mxnet_imported", "model_read", "first_pass")))
LOADED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO mxjob\.run\.spark_start: the executors' Python "
                    r"workers loaded the model", re.MULTILINE)


def log_time(stamp: str) -> float:
    """A log line's local time (``2026-11-29 09:57:29,743``) as epoch seconds."""
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def first_started(seen: dict) -> dict[str, float]:
    """The earliest creation time of each process group in a :class:`bench.peers.TreeCpu`'s ``seen``."""
    out: dict[str, float] = {}
    for (_, created), (group, _) in seen.items():
        if group is not None:
            out[group] = min(out.get(group, created), created)
    return out


def marks(started: float, processes: dict[str, float], log: str, summary: dict) -> dict[str, float | None]:
    """Each step's end in seconds from ``started`` (spark-submit's start); ``None`` where the run did not show it."""
    listed, loaded = LISTED.search(log), LOADED.search(log)
    ends = [w["first_task"]["ended"] for w in summary.get("python_workers", {}).values()]
    at = {
        "python_driver": processes.get("Python driver"),
        "listing_began": log_time(listed.group(1)) - float(listed.group(2)) if listed else None,
        "listing_ended": log_time(listed.group(1)) if listed else None,
        "executor_jvm": processes.get("executor JVMs"),
        "python_worker": processes.get("Python workers"),
        **warm_up_marks(log_time(loaded.group(1)) if loaded else None, SPLIT.search(log)),
        "first_batch": (summary.get("tasks") or {}).get("first_start"),
        "first_durable": min(ends) if ends else None,
    }
    return {name: None if at.get(name) is None else at[name] - started for name, _ in STEPS}


def warm_up_marks(loaded: float | None, split: re.Match | None) -> dict[str, float | None]:
    """The warm-up's steps' ends: the job's end (``loaded``) and, going back from it by the checking task's split
    (its log line's seconds), when its sample, first pass, model load and MXNet import began."""
    out: dict[str, float | None] = {**dict.fromkeys(BEGINS.values()), "model_loaded": loaded}
    if loaded is None or split is None:
        return out
    at = loaded
    for step, seconds in reversed(list(zip(WARM_STEPS, map(float, split.groups())))):
        at -= seconds
        out[BEGINS[step]] = at
    return out


def run_once(setup: peers.Setup, n: int, tag: str) -> dict:
    """One whole job from a cold start: its steps' ends, its wall time and CPU by group."""
    system = peers.SYSTEMS["ours"]
    argv, out = peers.command(system, setup, n, tag, system.configs[0])
    log_path = setup.work / "logs" / f"{tag}.log"
    ran = peers.watched(argv, spark_env({"PYTHONPATH": str(ROOT)}), log_path, tag)
    summary = json.loads(setup.s3.get_object(Bucket=peers.BUCKET, Key=f"{out}.summary.json")["Body"].read())
    processes = {group: ran.wall_clock(created) for group, created in first_started(ran.seen).items()}
    return {"marks": marks(ran.started, processes, log_path.read_text(errors="replace"), summary),
            "wall": ran.wall, "cpu": peers.cpu_by_group(ran.seen, "spark-submit's scripts")}


def median_marks(runs: list[dict]) -> dict[str, float | None]:
    out = {}
    for name, _ in STEPS:
        known = [r["marks"][name] for r in runs if r["marks"].get(name) is not None]
        out[name] = statistics.median(known) if known else None
    return out


def report(results: dict) -> str:
    """The steps' medians in the order they ended, what each added after the one before it and its share of the
    time to the first durable batch (steps that did not show last); CPU by group."""
    runs = results["runs"]
    at = median_marks(runs)
    total = at["first_durable"]
    rows, before = [], 0.0
    # In the order they ended in these runs: steps overlap (Spark may start before the listing ends), and each
    # row's own time is what it added after the one before it.
    known = sorted((at[name], words) for name, words in STEPS if at[name] is not None)
    for end, words in known:
        own = end - before
        share = f"{100 * own / total:.0f}%" if total else "n/a"
        rows.append([words, f"{end:.2f} s", f"{own:.2f} s", share])
        before = end
    rows += [[words, "n/a", "n/a", "n/a"] for name, words in STEPS if at[name] is None]
    wall = statistics.median(r["wall"] for r in runs)
    groups = [g for g in peers.GROUPS if any(r["cpu"].get(g, 0.0) >= 0.05 for r in runs)]
    cpu = {g: statistics.median(r["cpu"].get(g, 0.0) for r in runs) for g in groups}
    out = [f"CPU: {results['cpu']}; {results['images']} JPEGs, {results['model']}, make run-local's master; "
           f"medians of {len(runs)} run(s), each from a cold start", "",
           *peers.markdown(["step (in the order they ended)", "ends at", "adds", "of the first durable batch"], rows),
           "", f"The whole job: {wall:.1f} s. CPU-seconds by process group over the whole run (medians): "
           + ", ".join(f"{g} {v:.1f}" for g, v in cpu.items()) + "."]
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=64, help="images in each run")
    parser.add_argument("--runs", type=int, default=3, help="runs, each from a cold start")
    parser.add_argument("--model", choices=sorted(peers.MODELS), default="resnet18")
    parser.add_argument("--work", type=Path, default=ROOT / "run" / "startup",
                        help="folder for the images, the model, the logs and results.json")
    args = parser.parse_args(argv)
    if args.images < 1 or args.runs < 1:
        parser.error("--images and --runs take 1 or more")
    args.work.mkdir(parents=True, exist_ok=True)
    model = peers.MODELS[args.model]
    paths = peers.jpegs(args.work / "images", args.images)
    prefix = peers.export_model(model, args.work / "models")
    results = {"cpu": cpu_description(), "images": args.images, "model": model.weights, "runs": []}
    with peers.stand_in(args.work, paths, [args.images], prefix, model) as setup:
        for run in range(1, args.runs + 1):
            peers.log(f"run {run} of {args.runs}: {args.images} images")
            results["runs"].append(run_once(setup, args.images, f"startup-{run}"))
            peers.log(f"  {results['runs'][-1]['wall']:.1f} s")
    print("\n" + report(results), flush=True)
    (args.work / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
