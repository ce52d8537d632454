"""``make bench``: how fast the job runs on this machine, against the model's own limit and the original.

Not a test: it prints measurements. In one run it

1. makes a realistic image set (``demo/photos.py``: distinct ~500x375 photos,
   JPEG quality 90 with a tenth PNG, from the real photos scikit-learn ships)
   and the two checkpoints (``bench/models.py``: ResNet-18 at 3x224x224 and a
   ResNet-20 at 3x32x32, random weights);
2. serves them from a moto S3 server behind ``demo/s3proxy.py``, which adds a
   per-request latency (20 ms by default, about S3's first-byte latency) and
   answers the images' GETs from its memory with moto's own answers, captured
   once after the upload (``--moto-gets`` sends them to moto instead, which
   spends about 5 ms of the same cores on each: S3 spends none of the node's);
3. measures, per model, with the same checkpoint and batch size:

   - **L**, the model's limit: forward passes on pre-decoded arrays in one
     process with every core (``bench/probes.py limit``);
   - **S**, the original's square wave: download the batch one object after
     the other, then decode it, then run the model, in one process with every
     core (``bench/probes.py square``);
   - **E**, the job itself through ``spark-submit`` on ``local-cluster`` with
     ``conf/spark-local.conf``: images/s from the first task's start to the
     last task's end, the same after each worker's first task (model load and
     warm-up: "steady"), and the wall time including Spark's start-up; each
     Python worker's peak RSS (from its tasks' stats), the driver's peak RSS
     (its Python process and its JVM, polled with psutil), and the CPU the S3
     stand-in (moto and the proxy) took from the same two cores;

4. int8 (``--no-int8`` skips it), per model: the checkpoint quantized as the
   job's driver does (``probes.py quantize``), its L, and E with
   ``--precision int8`` (``--min-agreement 0``: the weights are random, so the
   agreement is printed, not required), with E_int8/E_fp32 and the per-process
   CPU breakdown;
5. large photos (``--large-images``, 0 skips): 8-12 MP JPEGs made from the
   real photos (``demo/photos.py``): decode CPU per image with and without
   DCT scaling (``probes.py decode``), S and E with the first model;
6. the option rows (``bench/option_gains.py``; ``--option-rounds 0`` skips
   them): on each model, the job at its defaults beside one tuning option or
   fast path changed, and what the default gains in E and CPU per image;
7. the MXNet threads each Python worker ran with, and the summary's warning if
   threads x executors do not fill a host's cores;
8. memory: one Python worker's RSS after its 10th and 200th task of a long
   run (the small model, batch 16, one executor), and the driver's peak RSS
   for 10,000 and 100,000 results from a fake fast model (``probes driver``).

Usage::

    python -m bench.run_bench            # everything (about 25 minutes here)
    python -m bench.run_bench --quick    # a smoke run: small model, few images (about a minute)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import int8_search, option_gains, task_cost, worker_steps  # noqa: E402
from bench import models as bench_models  # noqa: E402
from bench import tasks as bench_tasks  # noqa: E402
from demo import photos as bench_images  # noqa: E402
from demo.run_local import spark_env, spark_submit_command  # noqa: E402
from demo.s3local import FAKE_AWS_ENV, moto_server  # noqa: E402
from demo.s3proxy import S3Proxy  # noqa: E402
from mxjob.executor.stats import StatsFold  # noqa: E402
from mxjob.model import worker  # noqa: E402

BUCKET = "bench"
MIB = 1024 * 1024


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------
# Processes and their memory


class ProcessWatch:
    """Poll a process tree (and some fixed processes): each process's peak RSS and CPU over time, by role."""

    KNOWN = ("driver python", "driver JVM", "executor JVM", "python worker")

    def __init__(self, root_pid: int, fixed: dict[str, psutil.Process] | None = None, every: float = 0.2):
        self.root = psutil.Process(root_pid)
        self.fixed = fixed or {}
        self.every = every
        self.roles: dict[int, str] = {}
        self.peaks: dict[int, int] = {}
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self.machine: list[tuple[float, float]] = []  # (time, busy CPU seconds of the whole machine)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def role(process: psutil.Process) -> str:
        name, cmdline = process.name(), " ".join(process.cmdline())
        if name.startswith("java"):
            if "CoarseGrainedExecutorBackend" in cmdline:
                return "executor JVM"
            return "driver JVM" if "SparkSubmit" in cmdline else name
        if name.startswith("python"):
            if "infer_main.py" in cmdline:
                return "driver python"
            if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
                return "python worker"
        return name  # bash (spark-submit's scripts, until they exec the JVM), setsid, ...

    def _poll(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            tree = []
        now = time.time()
        machine = psutil.cpu_times()
        self.machine.append((now, sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)))
        for process in [*tree, *self.fixed.values()]:
            try:
                rss, cpu = process.memory_info().rss, cpu_seconds(process)
                # Until a process shows a known role, look again: spark-submit's shell script
                # execs the JVM under its own pid. Once known it sticks (a dying worker has no cmdline).
                if self.roles.get(process.pid) not in self.KNOWN:
                    fixed = [name for name, p in self.fixed.items() if p.pid == process.pid]
                    self.roles[process.pid] = fixed[0] if fixed else self.role(process)
            except psutil.Error:
                continue
            self.peaks[process.pid] = max(rss, self.peaks.get(process.pid, 0))
            self.samples.setdefault(process.pid, []).append((now, cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._poll()

    def __enter__(self) -> ProcessWatch:
        self._poll()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each role used from ``start`` to ``end`` (to the 0.2 s polling's precision)."""
        def at(samples, t):
            before = [cpu for when, cpu in samples if when <= t]
            return before[-1] if before else 0.0

        out: dict[str, float] = {}
        for pid, samples in self.samples.items():
            role = self.roles[pid]
            out[role] = out.get(role, 0.0) + at(samples, end) - at(samples, start)
        # Whatever else ran on the machine meanwhile (another job, tests, the OS) took this much.
        out["other processes"] = max(0.0, at(self.machine, end) - at(self.machine, start) - sum(out.values()))
        return out

    def peak(self, role: str) -> int | None:
        values = [rss for pid, rss in self.peaks.items() if self.roles.get(pid) == role]
        return max(values) if values else None


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def probe(args: list[str], threads: int) -> dict:
    """Run ``bench.probes`` in a fresh process whose MXNet uses ``threads`` cores; its JSON result."""
    env = {**os.environ, **FAKE_AWS_ENV, **worker.thread_env(threads)}
    result = subprocess.run([sys.executable, "-m", "bench.probes", *args], cwd=str(ROOT), env=env,
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"probe {args[0]} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------
# The job through spark-submit


@dataclass(frozen=True)
class StandIn:
    """The S3 stand-in the benchmark runs on: a client on moto, the proxy the job reads through, moto's process."""

    s3: Any
    proxy: S3Proxy
    moto: psutil.Process | None


@dataclass(frozen=True)
class BenchJob:
    """One spark-submit of the job: the model, its batch size and arguments (``extra``), Spark's master and
    settings (``spark_conf``, over conf/spark-local.conf).

    The input is ``prefix`` in the bench's bucket; the output is ``out/TAG`` +
    ``suffix``; the model is ``models/NAME`` unless ``model_key`` says otherwise.
    """

    tag: str
    model: bench_models.BenchModel
    batch: int
    extra: Sequence[str]
    master: str
    spark_conf: Sequence[str] = ()
    prefix: str = "photos/"
    suffix: str = ".jsonl"
    model_key: str | None = None


def submit(stand_in: StandIn, job: BenchJob, work: Path) -> dict:
    """Run ``job`` once on ``local-cluster``, its log in ``work``; its summary plus what was measured around it.

    The output's size is ``output_bytes``.
    """
    s3, proxy_endpoint, moto, model, tag = stand_in.s3, stand_in.proxy.endpoint, stand_in.moto, job.model, job.tag
    prefix, suffix, model_key = job.prefix, job.suffix, job.model_key
    key = f"out/{tag}{suffix}"
    job_args = ["--input", f"s3://{BUCKET}/{prefix}", "--model", f"s3://{BUCKET}/{model_key or 'models/' + model.name}",
                "--output", f"s3://{BUCKET}/{key}", "--endpoint-url", proxy_endpoint,
                "--input-shape", model.shape_arg, "--mean", bench_models.MEAN, "--std", bench_models.STD,
                "--batch-size", str(job.batch), "--progress-seconds", "30", *job.extra]
    command = spark_submit_command(job_args, job.master)
    for setting in job.spark_conf:  # after "spark-submit --master M": overrides conf/spark-local.conf
        command[3:3] = ["--conf", setting]
    log_path = work / f"{tag}.log"
    # The proxy runs in this process, which also polls: that costs little next to the proxy.
    fixed = {"S3 stand-in: moto": moto, "S3 stand-in: proxy": psutil.Process()}
    started = time.time()
    with open(log_path, "w") as out:
        process = subprocess.Popen(command, env=spark_env(), cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT)
        with ProcessWatch(process.pid, fixed) as watch:
            code = process.wait()
    wall = time.time() - started
    if code != 0:
        raise RuntimeError(f"the {tag} job exited {code}; see {log_path}")
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=f"{key}.summary.json")["Body"].read())
    tasks = summary["tasks"]
    workers = summary["python_workers"].values()
    # Steady state: leave out each worker's first task (model load, first-pass kernel set-up).
    firsts = [w["first_task"] for w in workers]
    steady_images = summary["keys_listed"] - sum(f["images"] for f in firsts)
    steady_window = tasks["last_end"] - min(f["ended"] for f in firsts)
    images = summary["keys_listed"]
    # CPU while tasks ran, per image: what the cores were spent on.
    cpu = watch.cpu_between(tasks["first_start"], tasks["last_end"])
    return {
        "tag": tag, "wall_seconds": wall, "summary": summary,
        "output_bytes": s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"],
        "E": tasks["images_per_second"],
        "E_steady": steady_images / steady_window if steady_window > 0 and steady_images > 0 else None,
        "worker_peak_rss": [w.get("max_rss_bytes") for w in workers],
        "driver_python_peak_rss": watch.peak("driver python"),
        "driver_jvm_peak_rss": watch.peak("driver JVM"),
        "stand_in_cpu_share": (sum(v for k, v in cpu.items() if k.startswith("S3 stand-in"))
                               / (tasks["seconds"] * (os.cpu_count() or 1))),
        "cpu_ms_per_image": {role: round(1000 * seconds / images, 2) for role, seconds in sorted(cpu.items())},
    }


# ----------------------------------------------------------------------------
# The whole benchmark


#: The header's words for who answered the images' GETs (results.json files from before it was recorded: moto).
IMAGE_GETS = {"moto": ", image GETs answered by moto", "memory": ", image GETs answered from the proxy's memory"}


def keep_in_memory(args, proxy, s3, keys: list[str]) -> None:
    """Have the proxy answer ``keys``' GETs from its memory, unless ``--moto-gets``."""
    if not args.moto_gets:
        held = proxy.keep_in_memory(s3, BUCKET, keys)
        log(f"  the proxy answers their {len(keys)} GETs from its memory ({held / 2**20:.0f} MiB, moto's answers; "
            "--moto-gets sends them to moto)")


def upload(s3, paths: list[Path], prefixes: dict) -> None:
    s3.create_bucket(Bucket=BUCKET)
    for prefix in prefixes.values():
        for suffix in ("-symbol.json", "-0000.params"):
            path = prefix.with_name(prefix.name + suffix)
            # One PUT, not upload_file's multipart: moto answers a multipart object's GET with
            # a whole-object checksum that botocore then finds wrong.
            s3.put_object(Bucket=BUCKET, Key=f"models/{path.name}", Body=path.read_bytes())
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: s3.put_object(Bucket=BUCKET, Key=f"photos/{p.name}", Body=p.read_bytes()), paths))


#: A process that keeps a share of one core busy in bursts, as the S3 stand-in does (moto spends about 5 ms
#: of CPU on each GET): ``python -c BURNER BURST_SECONDS DUTY``.
BURNER = """
import sys, time
burst, duty = float(sys.argv[1]), float(sys.argv[2])
rest = burst * (1 - duty) / duty
while True:
    started = time.perf_counter()
    while time.perf_counter() - started < burst:
        pass
    time.sleep(rest)
"""


def load_plan(share: float, cores: int) -> tuple[int, float]:
    """Processes and each one's duty cycle that keep ``share`` of ``cores`` busy: ``(n, duty)``, ``n * duty``
    core-equivalents, no process above one core."""
    wanted = max(0.0, share) * cores
    n = max(1, math.ceil(wanted))
    return n, min(1.0, wanted / n)


@contextlib.contextmanager
def cpu_load(share: float, cores: int, burst: float = 0.005):
    """Keep ``share`` of the cores busy in ``burst``-second bursts while the block runs (:data:`BURNER`)."""
    n, duty = load_plan(share, cores)
    burners = [subprocess.Popen([sys.executable, "-c", BURNER, str(burst), str(duty)]) for _ in range(n)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def limit_probe(args, prefix: str, shape_arg: str, paths: list[Path]) -> dict:
    """L of the checkpoint at ``prefix``: ``bench.probes limit`` at the bench's batch on its first two batches'
    images, with every core."""
    return probe(["limit", "--model", prefix, "--shape", shape_arg, "--batch", str(args.batch),
                  "--seconds", str(args.limit_seconds), *map(str, paths[: 2 * args.batch])], os.cpu_count() or 1)


def loaded_limit(args, prefix: str, shape_arg: str, paths: list[Path], e: dict) -> dict | None:
    """L beside a load of the S3 stand-in's share of the cores in ``e``, when ``e``'s workers ran each forward pass
    on more than one thread (else ``None``).

    A forward pass on several OpenMP threads waits at each barrier for a
    thread that another process preempted, so the stand-in costs such a
    worker more than its share of the cores: ``E / (1 - share)`` hands back
    too little. This L, run beside a load of that share in 5 ms bursts (about
    what moto spends on a GET), is the limit such an E is held to with the
    stand-in where it is. A worker on one thread has no barrier to wait at.
    """
    threads = max(((w.get("threads") or 1) // (w.get("lanes") or 1) for w in e["summary"]["python_workers"].values()),
                  default=1)
    share = e.get("stand_in_cpu_share") or 0.0
    if threads <= 1 or share <= 0:
        return None
    cores = os.cpu_count() or 1
    log(f"  L beside a load of the stand-in's {100 * share:.0f}% of the cores (the workers ran {threads} threads)")
    with cpu_load(share, cores):
        out = limit_probe(args, prefix, shape_arg, paths)
    return {**out, "share": share, "threads": threads}


def recipe_floor(model: bench_models.BenchModel, paths: list[Path]) -> dict:
    """:func:`bench.worker_steps.recipe_floor` of ``paths`` for ``model``'s input, in this process, logged."""
    log(f"{model.name}: the recipe's own CPU per image (decode_image on {len(paths)} of the images)")
    return worker_steps.recipe_floor([p.read_bytes() for p in paths], worker_steps.bench_preprocess(model.input_shape))


def run_model(args, stand_in: StandIn, model: bench_models.BenchModel, prefix: str, paths: list[Path]) -> dict:
    """One model's row: the recipe's floor, L, S, E (and L beside the stand-in's load when E's workers ran
    several threads)."""
    cores = os.cpu_count() or 1
    keys = [f"photos/{p.name}" for p in paths]
    row: dict = {"description": model.description, "input_shape": model.input_shape,
                 "floor": recipe_floor(model, paths[:200])}
    log(f"{model.name}: L (forward only, {cores} threads, batch {args.batch})")
    row["L"] = limit_probe(args, prefix, model.shape_arg, paths)
    log(f"{model.name}:   {row['L']['images_per_second']:.1f} images/s; "
        f"S (square wave, {args.square_batches} batches)")
    row["S"] = probe(["square", "--model", prefix, "--shape", model.shape_arg, "--batch", str(args.batch),
                      "--endpoint", stand_in.proxy.endpoint, "--bucket", BUCKET, "--batches", str(args.square_batches),
                      *keys[: args.square_batches * args.batch]], cores)
    log(f"{model.name}:   {row['S']['images_per_second']:.1f} images/s; E (spark-submit, {args.master})")
    row["E"] = submit(stand_in, BenchJob(f"E-{model.name}", model, args.batch, args.job_args, args.master,
                                         args.spark_conf), args.work)
    log(f"{model.name}:   {row['E']['E']:.1f} images/s, steady {row['E']['E_steady'] or 0:.1f}, "
        f"wall {row['E']['wall_seconds']:.1f}s")
    row["L_loaded"] = loaded_limit(args, prefix, model.shape_arg, paths, row["E"])
    return row


def run(args) -> dict:
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    started = time.time()
    log(f"making {args.images} images (cached in {work / f'images-{args.images}'})")
    paths = bench_images.make_images(work / f"images-{args.images}", args.images)
    chosen = [bench_models.MODELS[name] for name in args.models]
    # The memory run uses ResNet-20 whichever models --models names: it goes up too.
    extra = [bench_models.RESNET20] if args.memory_tasks > 0 and bench_models.RESNET20 not in chosen else []
    needed = [*chosen, *extra]
    prefixes = {m.name: bench_models.export(m, work / "models") for m in needed}
    results: dict = {"machine": {"cores": cores, "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                                 "cpu": int8_search.cpu_description()},
                     "images": len(paths), "image_bytes": sum(p.stat().st_size for p in paths),
                     "latency_ms": args.latency * 1000, "image_gets": "moto" if args.moto_gets else "memory",
                     "batch": args.batch, "models": {}}
    with moto_server(work / "moto.log") as upstream, S3Proxy(upstream, latency=args.latency) as proxy:
        moto = next(p for p in psutil.Process().children() if "moto" in " ".join(p.cmdline()))
        s3 = boto3.client("s3", endpoint_url=upstream, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        log(f"uploading {len(paths)} images and {len(prefixes)} models to moto at {upstream}; "
            f"the job reads through the proxy at {proxy.endpoint} (+{args.latency * 1000:.0f} ms per request)")
        upload(s3, paths, prefixes)
        keep_in_memory(args, proxy, s3, [f"photos/{p.name}" for p in paths])
        stand_in = StandIn(s3, proxy, moto)
        for model in chosen:
            results["models"][model.name] = run_model(args, stand_in, model, str(prefixes[model.name]), paths)
        for model in chosen if args.option_rounds > 0 else []:
            count = min(len(paths), args.option_images)
            log(f"options: each tuning option and fast path against the defaults, {model.name}, {count} images, "
                f"{args.option_rounds} round(s) of {len(args.option_rows) + 1} runs, after one uncounted")
            results.setdefault("options", {})[model.name] = option_gains.run(args, stand_in, submit, BenchJob, model,
                                                                             count)
        if args.tasks:
            results["tasks"] = bench_tasks.run(args, stand_in, submit, probe, results["models"], paths, work)
        if args.int8:
            results["int8"] = {}
            for model in chosen:
                results["int8"][model.name] = run_int8(args, stand_in, model, prefixes[model.name], paths)
        if args.large_images > 0:
            results["large"] = run_large(args, stand_in, chosen[0], prefixes[chosen[0].name])
        if args.memory_tasks > 0:
            small = bench_models.RESNET20
            count = min(len(paths), 16 * args.memory_tasks)
            log(f"memory: one worker, {count} images in batches of 16 ({small.name}, master local-cluster[1,1,1024])")
            long_run = submit(stand_in, BenchJob("memory-worker", small, 16, ["--limit", str(count)],
                                                 "local-cluster[1,1,1024]"), work)
            [worker] = long_run["summary"]["python_workers"].values()
            results["worker_rss"] = {"tasks": worker["batches"], "after": worker.get("rss_bytes_after_task", {})}
        results["driver_rss"] = {}
        for count in args.driver_results:
            log(f"memory: driver for {count:,} results (fake fast model, no Spark)")
            model_args = ["--model", str(prefixes[chosen[0].name]), "--shape", chosen[0].shape_arg,
                          "--results", str(count), "--endpoint", upstream, "--bucket", BUCKET]
            probe(["results", *model_args], cores)
            results["driver_rss"][count] = probe(["driver", *model_args], cores)
    if args.task_cost_tasks > 0:
        log(f"Spark's per-task cost: {args.task_cost_tasks} trivial tasks and as many of ours (fake scorer)")
        results["task_cost"] = task_cost.run(args.task_cost_tasks, work, args.master)
    results["bench_seconds"] = time.time() - started
    return results


def run_int8(args, stand_in: StandIn, model: bench_models.BenchModel, prefix: Path, paths: list[Path]) -> dict:
    """L and E of ``model`` quantized to int8 (calibrated on the bench images, as the job's driver does)."""
    cores = os.cpu_count() or 1
    log(f"{model.name} int8: quantize on {args.calibration_images} images, then L")
    quantized = probe(["quantize", "--model", str(prefix), "--shape", model.shape_arg,
                       *map(str, paths[: args.calibration_images])], cores)
    lim = limit_probe(args, quantized["prefix"], model.shape_arg, paths)
    log(f"{model.name} int8:   {lim['images_per_second']:.1f} images/s; E (spark-submit, {args.master})")
    # Random weights: agreement is reported, not required (--min-agreement 0).
    e = submit(stand_in, BenchJob(f"E-{model.name}-int8", model, args.batch,
                                  [*args.job_args, "--precision", "int8", "--min-agreement", "0",
                                   "--calibration-images", str(args.calibration_images)],
                                  args.master, args.spark_conf), args.work)
    log(f"{model.name} int8:   {e['E']:.1f} images/s, agreement {e['summary']['precision']['top1_agreement']}")
    return {"quantize": quantized, "L": lim, "E": e,
            "L_loaded": loaded_limit(args, quantized["prefix"], model.shape_arg, paths, e)}


def run_large(args, stand_in: StandIn, model: bench_models.BenchModel, prefix: Path) -> dict:
    """The job on 8-12 MP JPEGs: decode cost both ways, S and E."""
    s3, proxy = stand_in.s3, stand_in.proxy
    cores = os.cpu_count() or 1
    log(f"making {args.large_images} photos of 8-12 MP (cached in {args.work / f'large-{args.large_images}'})")
    large = bench_images.make_large_images(args.work / f"large-{args.large_images}", args.large_images)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda p: s3.put_object(Bucket=BUCKET, Key=f"large/{p.name}", Body=p.read_bytes()), large))
    keep_in_memory(args, proxy, s3, [f"large/{p.name}" for p in large])
    decode = probe(["decode", "--model", str(prefix), "--shape", model.shape_arg, *map(str, large[:8])], cores)
    log(f"large photos: decode {decode['draft_cpu_ms_per_image']:.1f} ms (draft), "
        f"{decode['exact_cpu_ms_per_image']:.1f} ms (exact); S and E with {model.name}")
    # Smaller batches than the small photos': a few hundred images must still make
    # enough tasks for each worker to reach its steady state after its first.
    batch = args.large_batch
    batches = max(1, min(args.square_batches, len(large) // batch))
    square = probe(["square", "--model", str(prefix), "--shape", model.shape_arg, "--batch", str(batch),
                    "--endpoint", proxy.endpoint, "--bucket", BUCKET, "--batches", str(batches),
                    *[f"large/{p.name}" for p in large[: batches * batch]]], cores)
    e = submit(stand_in, BenchJob(f"E-{model.name}-large", model, batch, args.job_args, args.master,
                                  args.spark_conf, prefix="large/"), args.work)
    log(f"large photos:   S {square['images_per_second']:.1f}, E {e['E']:.1f} images/s")
    return {"model": model.name, "images": len(large), "bytes": sum(p.stat().st_size for p in large),
            "batch": batch, "decode": decode, "S": square, "E": e}


# ----------------------------------------------------------------------------
# The report


def _mib(value) -> str:
    return f"{value / MIB:.0f}" if value else "-"


def report(results: dict) -> str:
    out = []
    machine = results["machine"]
    # cpu_description() names the cores too; results.json files from before it was recorded do not.
    out.append(f"{machine.get('cpu') or str(machine['cores']) + ' cores'}, {machine['memory_gib']} GiB; "
               f"{results['images']} images "
               f"({results['image_bytes'] / results['images'] / 1000:.0f} kB average), "
               f"S3 latency {results['latency_ms']:.0f} ms per request{IMAGE_GETS[results.get('image_gets', 'moto')]}; "
               f"batch {results['batch']}")
    out.append("")
    header = ("| model | L img/s | S img/s | E img/s | E steady | E/L | E/L steady | E/L, stand-in's CPU back "
              "| E/S | E/S steady | E wall s | worker peak RSS MiB | driver peak RSS MiB (python + JVM) "
              "| S3 stand-in CPU |")
    out.append(header)
    out.append("|" + "---|" * (header.count("|") - 1))
    for name, row in results["models"].items():
        e = row["E"]
        lim, sq = row["L"]["images_per_second"], row["S"]["images_per_second"]
        steady = e["E_steady"] or 0.0
        out.append(
            f"| {name} {'x'.join(map(str, row['input_shape']))} | {lim:.1f} | {sq:.1f} | {e['E']:.1f} | {steady:.1f} "
            f"| {e['E'] / lim:.2f} | {steady / lim:.2f} "
            f"| {stand_in_back(e) / lim:.2f} ({stand_in_back(e, steady) / lim:.2f} steady) "
            f"| {e['E'] / sq:.2f} | {steady / sq:.2f} "
            f"| {e['wall_seconds']:.1f} "
            f"| {' / '.join(_mib(v) for v in e['worker_peak_rss'])} "
            f"| {_mib(e['driver_python_peak_rss'])} + {_mib(e['driver_jvm_peak_rss'])} "
            f"| {100 * (e['stand_in_cpu_share'] or 0):.0f}% |")
    out.extend(["", "Where the executors' time went in E (seconds summed over tasks; wait = model idle for input):"])
    for name, row in results["models"].items():
        sec = row["E"]["summary"]["seconds"]
        sq = row["S"]["phases"]
        out.append(f"  {name}: E download {sec['download']:.1f}, decode {sec['decode']:.1f}, forward "
                   f"{sec['forward']:.1f}, wait {sec['wait']:.1f}, task {sec['task']:.1f}, write {sec['write']:.1f}, "
                   f"assembly {sec['assembly']:.1f}"
                   f" | S download {sq['download']:.1f}, decode {sq['decode']:.1f}, forward {sq['forward']:.1f}")
    out.append("")
    out.extend(["The output's lease in E (one run at a time: its take, renewals, checks before durable writes):",
                *(f"  {name}: {lease_line(row['E'])}" for name, row in results["models"].items()), ""])
    out.append("CPU per image in E, by process (ms; the bound is what the cores allow at that cost):")
    cores = results["machine"]["cores"]
    for name, row in results["models"].items():
        cpu = row["E"]["cpu_ms_per_image"]
        total = sum(cpu.values())
        parts = ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items() if ms >= 0.05)
        l_cost = row["L"]["cpu_ms_per_image"]
        out.append(f"  {name}: {parts}; total {total:.1f} -> at most {1000 * cores / total:.0f} images/s "
                   f"on {cores} cores; L costs {l_cost:.1f}")
        # The ceiling on E/L if the worker did nothing but the forward pass: what
        # the other processes (the S3 stand-in, the JVMs) leave of the cores.
        worker = cpu.get("python worker", 0.0)
        others = total - worker
        out.append(f"    the worker's own work beyond L's forward pass: {worker - l_cost:.1f} ms;"
                   f" were it free, the other processes' {others:.1f} ms would still cap E/L at "
                   f"{1000 * cores / (l_cost + others) / row['L']['images_per_second']:.2f}")
        lines = (beyond_forward(row["E"], l_cost), cpu_split(row["E"]["summary"], l_cost),
                 floor_line(row.get("floor"), row["E"], row["L"], cores),
                 loaded_line(row.get("L_loaded"), row["E"], row["L"]))
        out.extend(f"      {line}" for line in lines if line)
    if "tasks" in results:
        tasks = results["tasks"]
        out.extend(bench_tasks.report(tasks, results["models"][tasks["model"]]["L"]["images_per_second"],
                                      machine.get("cpu", "an unnamed CPU")))
    out.extend([*(line for result in results.get("options", {}).values() for line in option_gains.report(result)),
                *report_int8(results), *report_large(results)])
    out.append("MXNet threads per Python worker (the job's default; --threads and OMP_NUM_THREADS unset):")
    runs = [(f"E-{n}", r["E"]) for n, r in results["models"].items()]
    runs += [(f"E-{n}-int8", r["E"]) for n, r in results.get("int8", {}).items()]
    runs += [("E-large", results["large"]["E"])] if "large" in results else []
    for tag, e in runs:
        threads = results_threads(e["summary"])
        out.append(f"  {tag}: {threads}")
    out.append("")
    if "worker_rss" in results:
        after = results["worker_rss"]["after"]
        a10, a200 = after.get("10"), after.get("200")
        growth = f"{100 * (a200 - a10) / a10:+.1f}%" if a10 and a200 else "n/a"
        out.append(f"Python worker RSS (long run: resnet20, batch 16, one executor, "
                   f"{results['worker_rss']['tasks']} tasks): after task 10 "
                   f"{_mib(a10)} MiB, after task 200 {_mib(a200)} MiB ({growth})")
    for count, d in results.get("driver_rss", {}).items():
        out.append(f"Driver for {int(count):,} results (fake fast model, driver process only): peak RSS "
                   f"{_mib(d['max_rss'])} MiB ({_mib(d['max_rss_model_loaded'])} MiB before any result: imports, "
                   f"S3 client, the model check; {_mib(d['max_rss_planned'])} after the resume plan); assembly of "
                   f"{d['parts_read']:,} parts ({d['part_bytes'] / MIB:.1f} MiB of parts) into "
                   f"{d['bytes_written'] / MIB:.1f} MiB: {d['assembly_seconds']:.1f} s "
                   f"(resume plan {d['resume_plan_seconds']:.1f} s)")
    if "task_cost" in results:
        out.append(task_cost.report(results["task_cost"]))
    out.append(f"bench wall time: {results['bench_seconds']:.0f} s")
    return "\n".join(out)


def lease_line(e: dict) -> str:
    """What the lease cost a run: its requests and their seconds, against the run's wall time."""
    lease = e["summary"].get("lease")
    if not lease:
        return "no lease in this summary (made before the job took one)"
    return (f"{lease['requests']} requests ({lease['renewals']} renewals), {lease['seconds']:.3f} s on the driver: "
            f"{100 * lease['seconds'] / e['wall_seconds']:.2f}% of the run's {e['wall_seconds']:.1f} s (target: "
            f"at most 1%)")


def results_threads(summary: dict) -> str:
    """Each worker's threads (and forward lanes), and the summary's warning if threads x executors miss the cores."""
    threads = ", ".join(str(w.get("threads")) + (f" in {w['lanes']} lanes" if (w.get("lanes") or 1) > 1 else "")
                        for w in summary["python_workers"].values())
    hosts = summary.get("threads", {}).get("hosts", {})
    fit = "; ".join(f"{h['executors']} executor(s) x threads = {h['threads']} on {h['cores']} cores"
                    for h in hosts.values())
    warnings = summary.get("threads", {}).get("warnings", [])
    return f"{threads} ({fit})" + (f"; WARNING {warnings[0]}" if warnings else "")


def report_int8(results: dict) -> list[str]:
    if not results.get("int8"):
        return []
    out = ["| model int8 | L img/s | E img/s | E steady | E/L | E/L steady | E/L, stand-in's CPU back "
           "| E_int8/E_fp32 | L_int8/L_fp32 | top-1 agreement (random weights) | max prob diff "
           "| quantize s (driver) |", "|" + "---|" * 12]
    cores = results["machine"]["cores"]
    cpu_lines = []
    for name, row in results["int8"].items():
        fp32 = results["models"][name]
        lim, e = row["L"]["images_per_second"], row["E"]["E"]
        precision = row["E"]["summary"]["precision"]
        steady = row["E"].get("E_steady") or 0.0
        out.append(f"| {name} int8 | {lim:.1f} | {e:.1f} | {steady:.1f} | {e / lim:.2f} | {steady / lim:.2f} "
                   f"| {stand_in_back(row['E']) / lim:.2f} ({stand_in_back(row['E'], steady) / lim:.2f} steady) "
                   f"| {e / fp32['E']['E']:.2f} "
                   f"| {lim / fp32['L']['images_per_second']:.2f} | {precision['top1_agreement']:.3f} "
                   f"| {precision['max_probability_difference']:.3f} | {precision['quantize_seconds']:.1f} |")
        cpu = row["E"]["cpu_ms_per_image"]
        total = sum(cpu.values())
        parts = ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items() if ms >= 0.05)
        cpu_lines.append(f"  {name} int8: {parts}; total {total:.1f} -> at most {1000 * cores / total:.0f} "
                         f"images/s on {cores} cores; L_int8 costs {row['L']['cpu_ms_per_image']:.1f}")
        # Both runs are CPU-bound: the ratios can be no better than these, whatever the worker does.
        others = sum(ms for role, ms in cpu.items() if role != "python worker")
        fp32_total = sum(fp32["E"]["cpu_ms_per_image"].values())
        l_int8 = row["L"]["cpu_ms_per_image"]
        cpu_lines.append(f"    ceilings from these costs: E_int8/E_fp32 <= fp32's {fp32_total:.1f} / int8's "
                         f"{total:.1f} ms = {fp32_total / total:.2f}; were the worker's own work free, the other "
                         f"processes' {others:.1f} ms would still cap E_int8/L_int8 at "
                         f"{l_int8 / (l_int8 + others):.2f}")
        cpu_lines.append(f"    the worker's own work beyond L_int8's forward pass: "
                         f"{cpu.get('python worker', 0.0) - l_int8:.1f} ms: {beyond_forward(row['E'], l_int8)}")
        for line in (cpu_split(row["E"]["summary"], l_int8), floor_line(fp32.get("floor"), row["E"], row["L"], cores),
                     loaded_line(row.get("L_loaded"), row["E"], row["L"])):
            if line:
                cpu_lines.append(f"      {line}")
    return [*out, "", "CPU per image in E with int8, by process (ms):", *cpu_lines, ""]


def stand_in_back(e: dict, rate: float | None = None) -> float:
    """E (or ``rate``, e.g. E steady) with the S3 stand-in's CPU handed back: ``E / (1 - share)``.

    ``share`` is the stand-in's part of the cores while the tasks ran. moto
    and the latency proxy run on the same cores as the job here; on EMR S3 is
    not on the node. The job is CPU-bound on these cores, so the cores' time
    the stand-in took would have scored images at the job's own rate.
    """
    share = e.get("stand_in_cpu_share") or 0.0
    return (e["E"] if rate is None else rate) / (1.0 - min(share, 0.99))


def beyond_forward(e: dict, l_cost: float) -> str:
    """The worker's CPU per image beyond L's forward pass (``l_cost`` ms), split at its tasks' edges.

    In its tasks: the CPU ``score_partition`` measures (``seconds.cpu`` of the
    summary: every thread, the first tasks' MXNet import and model load
    included) less the forward pass. Outside them: the rest of the worker's
    CPU, Spark's hand-over of each task (about 60 ms a task; a batch of 64
    divides it by 64 only) and the worker's own start. ``python -m
    bench.worker_steps`` breaks the in-task part down step by step.
    """
    summary = e["summary"]
    images, tasks = summary["keys_listed"], summary.get("batches") or 0
    worker = e["cpu_ms_per_image"].get("python worker", 0.0)
    in_tasks = 1000 * (summary["seconds"].get("cpu") or 0.0) / images
    outside = worker - in_tasks
    per_task = f", {outside * images / tasks:.0f} ms each" if tasks else ""
    return (f"in its tasks {in_tasks - l_cost:.1f} ms (downloads, decoding, results, parts; the first tasks' "
            f"MXNet import and model load{steady_in_tasks(summary, l_cost)}), outside them {outside:.1f} ms "
            f"(Spark's hand-over of {tasks} tasks{per_task}; the workers' start)")


def after_first_tasks(summary: dict, keys: tuple[str, ...]) -> dict[str, float] | None:
    """CPU ms per image of each of the summary's ``seconds[key]`` over the tasks after each worker's first.

    Each worker's first task pays its MXNet import and model load once,
    which a run of millions of images never notices; the tasks after it are
    what each further image costs. ``None`` when a first task lacks one of
    ``keys`` (older summaries) or no images come after the first tasks.
    """
    firsts = [w["first_task"] for w in summary.get("python_workers", {}).values()]
    if not firsts or any(summary["seconds"].get(key) is None or f.get(key) is None for f in firsts for key in keys):
        return None
    images = summary["keys_listed"] - sum(f["images"] for f in firsts)
    if images <= 0:
        return None
    return {key: 1000 * (summary["seconds"][key] - sum(f[key] for f in firsts)) / images for key in keys}


def steady_in_tasks(summary: dict, l_cost: float) -> str:
    """``"; after each worker's first task X ms"``: the in-task CPU per image beyond ``l_cost`` once warm."""
    warm = after_first_tasks(summary, ("cpu",))
    if warm is None:
        return ""
    first_cpu = ", ".join(f"{w['first_task']['cpu']:.1f}" for w in summary["python_workers"].values())
    return f"; after each worker's first task ({first_cpu} s of CPU) {warm['cpu'] - l_cost:.1f} ms"


def cpu_split(summary: dict, l_cost: float) -> str:
    """The in-task CPU per image by thread, after each worker's first task: where "beyond the forward pass" goes.

    The summary's ``seconds`` split the workers' in-task CPU (``cpu``) into
    :data:`mxjob.executor.stats.StatsFold.CPU_PARTS`: their download threads' GETs
    (``download_cpu``) and decoding (``decode_cpu``), the task's own thread
    (``task_thread_cpu``: the model's Python side, results, the part) and the
    rest, MXNet's threads: the forward pass as the job runs it, against L's
    ``l_cost`` ms (with forward lanes, the lanes' threads and the model's
    Python side with them). Empty for summaries without the split.
    """
    warm = after_first_tasks(summary, ("cpu", *StatsFold.CPU_PARTS))
    if warm is None:
        return ""
    get, decode, thread = (warm[key] for key in StatsFold.CPU_PARTS)
    mxnet = warm["cpu"] - get - decode - thread
    # With forward lanes the model's Python side runs on the lanes' threads: it counts with MXNet's.
    lanes = max((w.get("lanes") or 1 for w in summary["python_workers"].values()), default=1)
    own, forward = (("results, parts", f"MXNet's and the {lanes} lanes' threads") if lanes > 1
                    else ("the model's Python side, results, parts", "MXNet's threads"))
    return (f"in its tasks by thread (after each worker's first task), per image: GETs {get:.1f} ms, decoding "
            f"{decode:.1f}, the task's own thread {thread:.1f} ({own}), {forward} "
            f"{mxnet:.1f} (the forward pass in the job; L's costs {l_cost:.1f}, {mxnet - l_cost:+.1f})")


#: The worker's own CPU per 500x375 JPEG beyond the forward pass that #22 asks for, in ms.
TARGET_BEYOND_FORWARD_MS = 3.0


def floor_line(floor: dict | None, e: dict, lim: dict, cores: int) -> str:
    """The recipe's and the GETs' CPU per image on this CPU (the floor), against the target and as a ceiling on E/L.

    ``floor`` is :func:`bench.worker_steps.recipe_floor` on the bench's
    images; the GETs are the job's own (``download_cpu`` after each worker's
    first task). Per JPEG (the target's unit), the floor is held against
    :data:`TARGET_BEYOND_FORWARD_MS`. The ceiling is E/L with the stand-in's
    CPU handed back were the worker's own work only the floor of this set's
    images: the cores divided by L's forward pass, that floor and the other
    processes but the stand-in (the JVMs, the driver), against L's rate. Empty without a
    floor (results from before it).
    """
    if not floor:
        return ""
    warm = after_first_tasks(e["summary"], ("download_cpu",))
    get = warm["download_cpu"] if warm else 0.0
    jpeg = floor.get("jpeg") or floor
    per_jpeg = jpeg["recipe_ms"] + get
    others = sum(ms for role, ms in e["cpu_ms_per_image"].items()
                 if role != "python worker" and not role.startswith("S3 stand-in"))
    ceiling = 1000 * cores / (lim["cpu_ms_per_image"] + floor["recipe_ms"] + get + others) / lim["images_per_second"]
    verdict = "over" if per_jpeg > TARGET_BEYOND_FORWARD_MS else "within"
    return (f"the floor on this CPU: a JPEG of this set costs the recipe alone {jpeg['recipe_ms']:.1f} ms (of which "
            f"the decoder and the resize, fixed by the recipe, {jpeg['decoder_and_resize_ms']:.1f}; make bench-worker "
            f"times each step) and the job's GET {get:.1f}: {per_jpeg:.1f} ms, {verdict} the "
            f"{TARGET_BEYOND_FORWARD_MS:g} ms the worker may spend beyond the forward pass; a worker at the floor of "
            f"this set's images ({floor['recipe_ms']:.1f} + {get:.1f} ms), beside the Spark processes' "
            f"{others:.1f} ms (JVMs, the driver), would cap E/L with the stand-in's CPU back at {ceiling:.2f}")


def loaded_line(loaded: dict | None, e: dict, lim: dict) -> str:
    """L beside the stand-in's load against L, and E against it (:func:`loaded_limit`); empty without one."""
    if not loaded:
        return ""
    rate, quiet = loaded["images_per_second"], lim["images_per_second"]
    return (f"beside a load of the stand-in's {100 * loaded['share']:.0f}% of the cores (5 ms bursts), L on "
            f"{loaded['threads']} threads as E's workers ran: {rate:.1f} images/s, {100 * (1 - rate / quiet):.0f}% "
            f"below L's {quiet:.1f} where the share alone would take {100 * loaded['share']:.0f}%; E/L beside the "
            f"same load {e['E'] / rate:.2f} ({(e.get('E_steady') or 0.0) / rate:.2f} steady)")


def cpu_line(cores: int, spark_seconds: float) -> str:
    """The large photos' CPU line when the watch saw no CPU in the tasks' window.

    Warm executors (the model loaded by the warm-up before the run's job)
    score eight photos in well under a second: the window can fall between
    two of :class:`ProcessWatch`'s 0.2 s samples.
    """
    return (f"  CPU per image in E, by process: not measured (the tasks' window fell between two of the watch's "
            f"0.2 s samples; the Spark job took {spark_seconds:.1f} s on {cores} cores)")


def report_large(results: dict) -> list[str]:
    if "large" not in results:
        return []
    large = results["large"]
    d, e, sq = large["decode"], large["E"], large["S"]
    lim = results["models"][large["model"]]["L"]
    sec = e["summary"]["seconds"]
    cores = results["machine"]["cores"]
    steady = e["E_steady"] or 0.0
    cpu = e["cpu_ms_per_image"]
    total = sum(cpu.values())
    others = sum(ms for role, ms in cpu.items() if role != "python worker")
    return [
        f"Large photos: {large['images']} JPEGs of 8-12 MP ({large['bytes'] / large['images'] / 1e6:.1f} MB "
        f"average), {large['model']}, batch {large.get('batch', '?')}:",
        "| decode ms/image (draft) | decode ms/image (exact) | decode / L's forward CPU | input diff mean / max "
        "| S img/s | E img/s | E steady | E/L | E/L steady | E/S |",
        "|" + "---|" * 10,
        f"| {d['draft_cpu_ms_per_image']:.1f} | {d['exact_cpu_ms_per_image']:.1f} "
        f"| {d['draft_cpu_ms_per_image'] / lim['cpu_ms_per_image']:.2f} "
        f"| {d['mean_abs_difference']:.4f} / {d['max_abs_difference']:.3f} | {sq['images_per_second']:.1f} "
        f"| {e['E']:.1f} | {steady:.1f} | {e['E'] / lim['images_per_second']:.2f} "
        f"| {steady / lim['images_per_second']:.2f} | {e['E'] / sq['images_per_second']:.2f} |",
        f"  E seconds: download {sec['download']:.1f}, decode {sec['decode']:.1f}, forward {sec['forward']:.1f}, "
        f"wait {sec['wait']:.1f}, task {sec['task']:.1f}",
        cpu_line(cores, sec["spark"]) if total <= 0 else
        "  CPU per image in E, by process (ms): "
        + ", ".join(f"{role} {ms:.1f}" for role, ms in cpu.items() if ms >= 0.05)
        + f"; total {total:.1f} -> at most {1000 * cores / total:.1f} images/s on {cores} cores; L costs "
        f"{lim['cpu_ms_per_image']:.1f}, draft decoding {d['draft_cpu_ms_per_image']:.1f}: the worker alone "
        f"caps E/L at {lim['cpu_ms_per_image'] / (lim['cpu_ms_per_image'] + d['draft_cpu_ms_per_image']):.2f}, "
        f"the other processes' {others:.1f} ms at "
        f"{lim['cpu_ms_per_image'] / (lim['cpu_ms_per_image'] + others):.2f}, both together at "
        f"{lim['cpu_ms_per_image'] / (lim['cpu_ms_per_image'] + d['draft_cpu_ms_per_image'] + others):.2f} "
        f"(the workers' first tasks, importing MXNet and loading the model, weigh on a set this small)",
        "",
    ]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Throughput and memory of the job on this machine.")
    parser.add_argument("--quick", action="store_true", help="smoke run: small model, few images, no long run")
    parser.add_argument("--images", type=int, default=3600, help="images in the set")
    parser.add_argument("--batch", type=int, default=64, help="batch size (partition) of L, S and E")
    parser.add_argument("--latency", type=float, default=0.02, help="seconds added to each S3 request")
    parser.add_argument("--moto-gets", action="store_true",
                        help="send the images' GETs to moto (about 5 ms of CPU each on the same cores) instead of "
                             "answering them from the proxy's memory")
    parser.add_argument("--models", default="resnet18,resnet20", help="comma-separated: resnet18, resnet20")
    parser.add_argument("--master", default="local-cluster[2,1,1024]")
    parser.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark setting for E, over conf/spark-local.conf (repeatable)")
    parser.add_argument("--job-args", default="", help="extra job options for E, e.g. '--micro-batch-size 64'")
    parser.add_argument("--limit-seconds", type=float, default=15.0, help="seconds of forward passes for L")
    parser.add_argument("--square-batches", type=int, default=6, help="batches for S")
    parser.add_argument("--memory-tasks", type=int, default=210, help="tasks of the long run (batch 16)")
    parser.add_argument("--driver-results", default="10000,100000", help="result counts for the driver's RSS")
    parser.add_argument("--no-int8", dest="int8", action="store_false", help="skip the int8 rows")
    parser.add_argument("--calibration-images", type=int, default=256, help="int8 calibration images")
    parser.add_argument("--large-images", type=int, default=192, help="8-12 MP JPEGs in the large-photo set (0: skip)")
    parser.add_argument("--large-batch", type=int, default=16, help="batch size (partition) of S and E on them")
    parser.add_argument("--work", type=Path, default=ROOT / "run" / "bench",
                        help="folder for the images, models, logs and results.json")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument("--tasks", default="", metavar="embed,detect",
                        help="also run --task embed (float32, float16; Parquet and JSON Lines) and/or detect (an "
                             "SSD head on the same backbone) beside classify, on the first of --models "
                             "(bench/tasks.py)")
    parser.add_argument("--option-rounds", type=int, default=2,
                        help="interleaved rounds of the option rows, on each of --models (bench/option_gains.py; "
                             "0: skip)")
    parser.add_argument("--option-rows", default=",".join(row for row, _, _ in option_gains.VARIANTS),
                        help="which option rows to run, comma-separated (all by default)")
    parser.add_argument("--option-images", type=int, default=640, help="images of each option row's run")
    parser.add_argument("--task-cost-tasks", type=int, default=200,
                        help="tasks of each kind for Spark's per-task cost, trivial and ours (0: skip)")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.models, args.limit_seconds, args.square_batches = 128, "resnet20", 1.0, 1
        args.driver_results, args.memory_tasks = "1000", 0
        args.calibration_images, args.large_images, args.task_cost_tasks = 24, 8, 20  # 20 held out: int8's floor
        args.option_rounds = 0
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        args.tasks = bench_tasks.parse_tasks(args.tasks)
    except ValueError as exc:
        parser.error(str(exc))
    args.job_args = args.job_args.split()
    args.option_rows = [row.strip() for row in args.option_rows.split(",") if row.strip()]
    unknown = set(args.option_rows) - {row for row, _, _ in option_gains.VARIANTS}
    if unknown:
        parser.error(f"--option-rows takes {', '.join(row for row, _, _ in option_gains.VARIANTS)}, not "
                     f"{', '.join(sorted(unknown))}")
    args.driver_results = [int(x) for x in str(args.driver_results).split(",") if x]
    results = run(args)
    text = report(results)
    print("\n" + text, flush=True)
    out = args.json or args.work / "results.json"
    out.write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
