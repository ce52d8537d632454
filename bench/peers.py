"""``make bench-peers``: this job beside Daft and Spark's helper on the same images, model, recipe and S3 stand-in.

Not a test: it prints measurements. It

1. makes ``N2`` distinct JPEGs of about 500x375 (``demo/photos.py``, its
   PNGs left out) and the checkpoint (``--model``: ``resnet18``, random
   weights from ``bench/models.py``, or ``efficientnet-lite0``, real ImageNet
   weights from ``demo/pretrained.py``), and uploads the first ``N1`` and
   all ``N2`` images under two prefixes of one moto bucket (``demo/s3local.py``),
   which every system reads and writes, no latency added;
2. runs, for each of ``--rounds`` interleaved rounds, each size and each
   system, the whole job from a cold start, writing each image's top 5
   classes as Parquet back to the bucket:

   - ``ours``: this job through ``spark-submit`` on ``make run-local``'s master
     (``demo.run_local.MASTER``: one executor for the host, as EMR runs one per
     node, its Python worker on both cores in two forward lanes), its defaults;
   - ``two-executors``: the same on ``local-cluster[2,1,2048]``, two one-core
     executors (a JVM and a Python worker each, one lane each);
   - ``original-shape``: the same on ``local-cluster[1,1,6144]``, the original
     mxnet-spark job's shape (one executor, MXNet on both cores);
   - ``daft``: ``bench/peer_daft.py`` in ``.venv-peers`` (Daft needs Python
     3.10+; ``bench/requirements-peers.txt``): ``from_glob_path``,
     ``.download()``, Daft's own ``decode_image`` and ``resize`` (or the job's
     recipe in a ``@daft.func``), a ``@daft.cls`` holding the MXNet module,
     ``write_parquet``;
   - ``ray``: ``bench/peer_ray.py`` in the same venv: Ray Data's
     ``read_binary_files``, decode tasks (or the actor decoding), a callable
     class holding the module on actors, ``write_parquet``;
   - ``spark-udf``: ``bench/peer_spark_udf.py``, Spark's own
     ``predict_batch_udf`` on ``local[2]`` with Spark's defaults but Arrow
     batches of 64 rows, a pandas UDF decoding with the same recipe (the
     driver lists and PUTs with boto3: Spark's S3A connector is not on this
     machine);

   each peer first in each configuration of its :data:`SYSTEMS` entry (its
   batch, its instances or actors, MXNet's threads: what its docs offer),
   once at ``N2`` images, and then in the fastest of them (``--no-sweep``:
   the first);

3. samples each run's process tree every 0.1 s with psutil and charges each
   process's CPU to its group (our Python workers, the Python driver, the
   driver's JVM (on ``local[2]`` the executor's too), the executors' JVMs,
   Daft's and Ray's processes; the moto server's CPU over the run; the rest of the
   machine's busy CPU beside them), reads
   every output back and compares each image's top-1 class with ours;
4. measures, in each round, Spark's own floor on each of our masters (an empty
   PySpark job through the job's spark-submit line: :data:`FLOOR_JOB`), and
   the model's own limit (``bench.probes limit``: forward passes on
   decoded arrays, every core, batch 16) and the CPU the Python driver's
   imports take in a fresh process (``infer_main``, ``pyspark.sql``, ``mxnet``);
5. prints one table: E = (N2 - N1) / (T_N2 - T_N1), images/s with the fixed
   start-up cancelled (median over rounds), E against ours, the whole job's
   wall time at both sizes, E against the model's limit L (so that a weak peer
   shows), top-1 agreement with ours; the sweep; then the CPU by process
   group at N2, the model's limit, the CPU's name, and each target of
   :data:`TARGETS` with whether it is met.

Usage::

    python -m bench.peers                                   # 128 and 1280 images, two rounds (about 20 minutes)
    python -m bench.peers --sizes 8,16 --rounds 1           # a smoke run
    python -m bench.peers --systems ours,daft --model efficientnet-lite0
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import boto3
import psutil
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import models as bench_models  # noqa: E402
from bench.int8_search import cpu_description  # noqa: E402
from bench.run_bench import cpu_seconds, probe  # noqa: E402
from demo import photos as bench_images  # noqa: E402
from demo import pretrained  # noqa: E402
from demo.run_local import MASTER, spark_env, spark_submit_command  # noqa: E402
from demo.s3local import moto_server  # noqa: E402

BUCKET = "bench"
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
#: Images per forward pass: the job's --micro-batch-size default, Daft's batch and the limit probe's.
FORWARD_BATCH = 16


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------
# The systems


@dataclass(frozen=True)
class Config:
    """One way to run a peer: its own options and environment (MXNet's threads), as its docs offer them."""

    name: str  # the printout's words
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


def threads(n: int) -> tuple[tuple[str, str], ...]:
    """MXNet's threads in each process that holds a module (OpenMP's, which MXNet 1.9 reads at its import)."""
    return (("OMP_NUM_THREADS", str(n)),)


@dataclass(frozen=True)
class System:
    name: str  # what --systems names, and the runs' output keys
    label: str  # the table's words
    kind: str  # "ours", "daft", "ray" or "spark-udf"
    master: str = ""
    #: The configurations the sweep tries (the first without a sweep); the fastest at N2 runs the rounds.
    configs: tuple[Config, ...] = (Config("its defaults"),)


SYSTEMS = {s.name: s for s in (
    System("ours", f"this job, make run-local's {MASTER}", "ours", MASTER),
    System("two-executors", "this job, two executors local-cluster[2,1,2048]", "ours", "local-cluster[2,1,2048]"),
    System("original-shape", "this job, the original's shape local-cluster[1,1,6144]", "ours",
           "local-cluster[1,1,6144]"),
    System("daft", "Daft {daft}", "daft", configs=(
        Config("Daft's decode_image and resize, one module on both cores, batch 16",
               ("--decode", "daft", "--instances", "1", "--batch", "16"), threads(2)),
        Config("Daft's decode_image and resize, one module on both cores, batch 64",
               ("--decode", "daft", "--instances", "1", "--batch", "64"), threads(2)),
        Config("Daft's decode_image and resize, two modules of one core, batch 16",
               ("--decode", "daft", "--instances", "2", "--batch", "16"), threads(1)),
        Config("the job's recipe in a @daft.func, one module on both cores, batch 16",
               ("--decode", "recipe", "--instances", "1", "--batch", "16"), threads(2)),
    )),
    System("ray", "Ray Data {ray}", "ray", configs=(
        # An actor reserves one CPU (or half): the read tasks need one left over.
        Config("decode tasks, one actor with MXNet on both cores, batch 16",
               ("--decode", "task", "--actors", "1", "--actor-cpus", "1", "--batch", "16"), threads(2)),
        Config("decode in the actor, one actor with MXNet on both cores, batch 16",
               ("--decode", "actor", "--actors", "1", "--actor-cpus", "1", "--batch", "16"), threads(2)),
        Config("decode in the actors, two actors of one thread (half a CPU reserved each), batch 16",
               ("--decode", "actor", "--actors", "2", "--actor-cpus", "0.5", "--batch", "16"), threads(1)),
    )),
    System("spark-udf", "Spark's predict_batch_udf, local[2]", "spark-udf", "local[2]", configs=(
        Config("two Python workers of one thread, batch 16", ("--batch", "16"), threads(1)),
        Config("two Python workers of one thread, batch 64", ("--batch", "64"), threads(1)),
        Config("two Python workers on both cores each (MXNet's default), batch 16", ("--batch", "16")),
    )),
)}
REFERENCE = "ours"
#: The process group a peer's processes without one of their own are charged to, by kind.
PEER_GROUP = {"daft": "Daft", "ray": "Ray"}


@dataclass(frozen=True)
class Model:
    name: str
    shape: str
    mean: str
    std: str
    weights: str  # the printout's words


MODELS = {
    "resnet18": Model("resnet18", bench_models.RESNET18.shape_arg, bench_models.MEAN, bench_models.STD,
                      "ResNet-18, random weights"),
    "efficientnet-lite0": Model("efficientnet_lite0", ",".join(map(str, pretrained.INPUT_SHAPE)), pretrained.MEAN,
                                pretrained.STD, "EfficientNet-Lite0, ImageNet weights"),
}


def export_model(model: Model, folder: Path) -> Path:
    """The checkpoint's local prefix (made once, reused)."""
    if model.name == "resnet18":
        return bench_models.export(bench_models.RESNET18, folder)
    return pretrained.export(folder, model.name)


# ----------------------------------------------------------------------------
# CPU by process group

#: The groups CPU is charged to, in the printout's order.
GROUPS = ("Python workers", "Python driver", "driver JVM", "executor JVMs", "spark-submit's scripts", "Daft", "Ray",
          "S3 stand-in (moto)", "rest of the machine")


def process_group(name: str, cmdline: str) -> str | None:
    """The group of a process of a run by its name and command line; ``None`` when it shows none (yet).

    spark-submit's shell script execs the driver's JVM under its own pid, so
    a pid can show no group first and one later (:func:`record` keeps it).
    """
    if name.startswith("java"):
        if "CoarseGrainedExecutorBackend" in cmdline:
            return "executor JVMs"
        return "driver JVM" if "SparkSubmit" in cmdline else None
    if not name.startswith("python"):  # spark-submit's bash scripts name infer_main.py too
        return None
    if "pyspark.daemon" in cmdline or "pyspark.worker" in cmdline:
        return "Python workers"
    if "infer_main.py" in cmdline or "peer_spark_udf.py" in cmdline or FLOOR_SCRIPT in cmdline:
        return "Python driver"
    # A peer's driver by its module (command's bench.peer_KIND); Ray's workers and daemons rename themselves, and
    # run_once charges them to PEER_GROUP's group by default.
    return next((group for kind, group in PEER_GROUP.items() if f"bench.peer_{kind}" in cmdline), None)


def record(seen: dict, key: tuple, group: str | None, cpu: float) -> None:
    """Fold one sample of one process into ``seen[key] = (group, cpu)``.

    The first group a process shows sticks (a dying Python worker has no
    command line), and its CPU only grows (a sample taken as it exits can
    read less).
    """
    old_group, old_cpu = seen.get(key, (None, 0.0))
    seen[key] = (old_group or group, max(old_cpu, cpu))


def cpu_by_group(seen: dict, default: str) -> dict[str, float]:
    """CPU seconds per group of the processes in ``seen`` (:func:`record`); those with none go to ``default``.

    Every process in a run's tree started with the run, so all its CPU is the run's.
    """
    out: dict[str, float] = {}
    for group, cpu in seen.values():
        out[group or default] = out.get(group or default, 0.0) + cpu
    return out


def busy_cpu() -> float:
    """The whole machine's busy CPU seconds so far."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


class TreeCpu:
    """Sample a process tree's CPU per process every ``every`` seconds while the block runs.

    A process that exits between two samples loses the CPU it used since
    the last one: at most ``every`` seconds of it per process.
    """

    def __init__(self, root_pid: int, every: float = 0.1):
        self.root = psutil.Process(root_pid)
        self.every = every
        self.seen: dict[tuple, tuple] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poll(self) -> None:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return
        for process in tree:
            try:
                with process.oneshot():
                    key = (process.pid, process.create_time())
                    group = process_group(process.name(), " ".join(process.cmdline()))
                    cpu = cpu_seconds(process)
            except psutil.Error:
                continue
            record(self.seen, key, group, cpu)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.poll()

    def __enter__(self) -> TreeCpu:
        self.poll()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# ----------------------------------------------------------------------------
# Outputs and agreement


def object_key(path: str) -> str:
    """``s3://bucket/a/b.jpg`` (Daft's paths) and ``a/b.jpg`` (the job's keys) both as ``a/b.jpg``."""
    return path[len("s3://"):].partition("/")[2] if path.startswith("s3://") else path


def top1(rows: Iterable[dict]) -> dict[str, int | None]:
    """Each row's key and its best class (``None`` for a row without predictions: an error)."""
    return {object_key(row["key"]): (row["predictions"][0]["class_id"] if row.get("predictions") else None)
            for row in rows}


def agreement(reference: dict, other: dict) -> tuple[int, int]:
    """``(images whose top-1 class is the same in both, images in the reference)``.

    A key missing from ``other``, or without a class in either, disagrees.
    """
    same = sum(1 for key, best in reference.items() if best is not None and other.get(key) == best)
    return same, len(reference)


def read_rows(s3, keys: list[str], bucket: str = BUCKET) -> list[dict]:
    """The ``key`` and ``predictions`` columns of the Parquet objects ``keys``, as rows."""
    import io

    rows: list[dict] = []
    for key in keys:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        rows.extend(pq.read_table(io.BytesIO(body), columns=["key", "predictions"]).to_pylist())
    return rows


def parquet_keys(s3, prefix: str, bucket: str = BUCKET) -> list[str]:
    """The ``.parquet`` objects under ``prefix``."""
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        keys += [o["Key"] for o in page.get("Contents", []) if o["Key"].endswith(".parquet")]
    return keys


# ----------------------------------------------------------------------------
# Running


@dataclass
class Setup:
    """What every run shares: the bench's S3 client and the endpoint, moto's process, the model, the work folder."""

    s3: object
    endpoint: str
    moto: psutil.Process
    model: Model
    work: Path


def command(system: System, setup: Setup, n: int, tag: str, config: Config) -> tuple[list[str], str]:
    """The command line of one run of ``system`` in ``config`` and the S3 key (or folder) of its output."""
    model = setup.model
    if system.kind == "ours":
        out = f"out/{tag}.parquet"
        job = ["--input", f"s3://{BUCKET}/peers/n{n}/", "--model", f"s3://{BUCKET}/models/{model.name}",
               "--output", f"s3://{BUCKET}/{out}", "--endpoint-url", setup.endpoint,
               "--input-shape", model.shape, "--mean", model.mean, "--std", model.std, "--top-k", "5"]
        return spark_submit_command(job, system.master), out
    # The peers' own options: the same checkpoint, recipe and forward batch.
    shared = ["--model", f"s3://{BUCKET}/models/{model.name}", "--endpoint-url", setup.endpoint,
              "--input-shape", model.shape, "--mean", model.mean, "--std", model.std,
              "--batch", str(FORWARD_BATCH), "--top-k", "5", *config.args]
    if system.kind == "spark-udf":
        out = f"out/{tag}.parquet"
        return [str(Path(sys.executable).with_name("spark-submit")), "--master", system.master,
                # Arrow batches of 64 images (38 MB of float input) rather than 10,000: Spark's 1 GiB heap holds them.
                "--conf", "spark.sql.execution.arrow.maxRecordsPerBatch=64", "--conf", "spark.ui.enabled=false",
                "--driver-java-options", f"-Dlog4j2.configurationFile=file:{ROOT / 'conf' / 'log4j2.properties'}",
                str(ROOT / "bench" / "peer_spark_udf.py"), "--input", f"s3://{BUCKET}/peers/n{n}/",
                "--output", f"s3://{BUCKET}/{out}", *shared], out
    out = f"out/{tag}/"
    glob = "*" if system.kind == "daft" else ""  # Daft lists a glob, Ray a folder
    return [str(PEERS_PYTHON), "-m", f"bench.peer_{system.kind}", "--input", f"s3://{BUCKET}/peers/n{n}/{glob}",
            "--output", f"s3://{BUCKET}/{out}", *shared], out


@dataclass(frozen=True)
class Watched:
    """A command that ran to its end under :class:`TreeCpu`: its start (epoch seconds), wall time and processes.

    ``created`` is the command's process's creation time as psutil gives it (``seen``'s keys hold the same
    for every process): Linux counts it from the boot time in whole seconds, so it stands up to a second off
    the wall clock (0.95 s early on one machine); :meth:`wall_clock` puts such a time on ``started``'s clock.
    """

    started: float
    wall: float
    seen: dict
    created: float

    def wall_clock(self, created: float) -> float:
        """A process creation time from ``seen`` as epoch seconds on the clock of ``started``."""
        return self.started + (created - self.created)


def watched(argv: list[str], env: dict, log_path: Path, what: str) -> Watched:
    """Run ``argv`` from the checkout with its output in ``log_path``, sampling its process tree; raise, naming
    ``what`` and the log, if it exits non-zero."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started, clock = time.time(), time.perf_counter()
    with open(log_path, "w") as log_file:
        process = subprocess.Popen(argv, env=env, cwd=str(ROOT), stdout=log_file, stderr=subprocess.STDOUT)
        with TreeCpu(process.pid) as tree:
            code = process.wait()
    wall = time.perf_counter() - clock
    if code != 0:
        raise RuntimeError(f"{what} exited {code}; see {log_path}")
    return Watched(started, wall, tree.seen, tree.root.create_time())


def run_once(system: System, setup: Setup, n: int, round_: int | str, config: Config) -> dict:
    """One whole job, from a cold start: its wall time, CPU by group and each image's top-1 class."""
    tag = f"{system.name}-{n}-r{round_}"
    argv, out = command(system, setup, n, tag, config)
    env = spark_env({"PYTHONPATH": str(ROOT), **dict(config.env)})
    moto_before, machine_before = cpu_seconds(setup.moto), busy_cpu()
    ran = watched(argv, env, setup.work / "logs" / f"{tag}.log", tag)
    wall = ran.wall
    cpu = cpu_by_group(ran.seen, PEER_GROUP.get(system.kind, "spark-submit's scripts"))
    cpu["S3 stand-in (moto)"] = cpu_seconds(setup.moto) - moto_before
    cpu["rest of the machine"] = max(0.0, busy_cpu() - machine_before - sum(cpu.values()))
    keys = parquet_keys(setup.s3, out) if out.endswith("/") else [out]
    best = top1(read_rows(setup.s3, keys))
    return {"system": system.name, "n": n, "round": round_, "wall": wall, "cpu": cpu, "top1": best}


#: Spark's own floor: an empty PySpark job (the SparkContext, one Python task per executor, the stop) through
#: the job's spark-submit line (conf/spark-local.conf, the JVMs' archives), on the job's master: what no change
#: to the job's own work can go under in that layout.
FLOOR_SCRIPT = "spark_floor.py"
FLOOR_JOB = """
from pyspark import SparkContext
sc = SparkContext()
tasks = sc.defaultParallelism  # local-cluster: its executors' cores, one task each
print("tasks", sc.parallelize(range(tasks), tasks).map(lambda x: x).count())
sc.stop()
"""


def spark_floor(master: str, work: Path) -> dict:
    """The wall time and CPU by group of :data:`FLOOR_JOB` on ``master``."""
    script = work / FLOOR_SCRIPT
    script.write_text(FLOOR_JOB)
    argv = spark_submit_command([], master)
    argv[-1] = str(script)  # in place of infer_main.py
    ran = watched(argv, spark_env(), work / "logs" / f"floor-{master}.log", f"the empty PySpark job on {master}")
    return {"wall": ran.wall, "cpu": cpu_by_group(ran.seen, "spark-submit's scripts")}


def driver_import_cpu() -> float:
    """CPU seconds of the Python driver's imports (``infer_main``, ``pyspark.sql``) in a fresh process.

    No MXNet: under spark-submit an executor's warm-up checks the model for
    the driver (``mxjob.executor.model_check``), so the bench's runs import none there.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = "import infer_main, pyspark.sql"
    subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=spark_env(), check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def jpegs(folder: Path, count: int) -> list[Path]:
    """``count`` distinct JPEGs of about 500x375: ``demo/photos.py``'s set without its PNGs (one in ten)."""
    made = bench_images.make_images(folder, math.ceil(count * 10 / 9) + 1)
    return [p for p in made if p.suffix == ".jpg"][:count]


def upload(s3, paths: list[Path], sizes: list[int], prefix: Path, model: Model) -> None:
    """The model under ``models/`` and the first ``n`` images under ``peers/nN/`` for each size."""
    s3.create_bucket(Bucket=BUCKET)
    for suffix in ("-symbol.json", "-0000.params"):
        # One PUT, not upload_file's multipart: moto answers a multipart object's GET with a checksum botocore rejects.
        s3.put_object(Bucket=BUCKET, Key=f"models/{model.name}{suffix}",
                      Body=Path(f"{prefix}{suffix}").read_bytes())
    jobs = [(n, p) for n in sizes for p in paths[:n]]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda job: s3.put_object(Bucket=BUCKET, Key=f"peers/n{job[0]}/{job[1].name}",
                                                Body=job[1].read_bytes()), jobs))


@contextlib.contextmanager
def stand_in(work: Path, paths: list[Path], sizes: list[int], prefix: Path, model: Model) -> Iterator[Setup]:
    """A moto server for the runs, with the model and the first ``n`` images of each size uploaded (:func:`upload`)."""
    with moto_server(work / "moto.log") as endpoint:
        moto = next(p for p in psutil.Process().children() if "moto" in " ".join(p.cmdline()))
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        upload(s3, paths, sizes, prefix, model)
        yield Setup(s3, endpoint, moto, model, work)


def peers_versions(systems: list[System]) -> dict[str, str]:
    """Daft's and Ray's versions in ``.venv-peers`` (which proves the venv works); empty when no system needs it."""
    if not any(s.kind in PEER_GROUP for s in systems):
        return {}
    if not PEERS_PYTHON.exists():
        raise SystemExit(f"{PEERS_PYTHON} is missing: `make bench-peers` makes it (bench/requirements-peers.txt)")
    code = "import daft, ray, mxnet; print(daft.__version__, ray.__version__)"
    result = subprocess.run([str(PEERS_PYTHON), "-c", code], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f".venv-peers cannot import daft, ray and mxnet:\n{result.stderr[-2000:]}")
    daft_version, ray_version = result.stdout.split()
    return {"daft": daft_version, "ray": ray_version}


def sweep(systems: list[System], setup: Setup, n: int, results: dict) -> dict[str, Config]:
    """Each peer's configurations run once at ``n`` images; the fastest whole job of each, by system name.

    A system with one configuration is not run here. Every run goes to
    ``results["sweep"]`` (the printout's sweep table), the chosen one marked ``best``.
    """
    best: dict[str, Config] = {}
    for system in systems:
        if len(system.configs) < 2:
            best[system.name] = system.configs[0]
            continue
        timed = []
        for config in system.configs:
            log(f"sweep, {n} images: {system.name}, {config.name}")
            done = run_once(system, setup, n, f"sweep{len(timed)}", config)
            total = sum(v for g, v in done["cpu"].items() if g not in ("rest of the machine", "S3 stand-in (moto)"))
            log(f"  {done['wall']:.1f} s, {total:.1f} CPU-s without the S3 stand-in")
            entry = {"system": system.name, "config": config.name, "wall": done["wall"], "cpu": total, "best": False}
            results["sweep"].append(entry)
            timed.append((done["wall"], config, entry))
        _, best[system.name], fastest = min(timed, key=lambda t: t[0])
        fastest["best"] = True
    return best


def run(args) -> dict:
    systems = [SYSTEMS[name] for name in args.systems]
    versions = peers_versions(systems)
    work = args.work
    model = MODELS[args.model]
    log(f"making {max(args.sizes)} JPEGs and the {model.weights} checkpoint under {work}")
    paths = jpegs(work / "images", max(args.sizes))
    prefix = export_model(model, work / "models")
    results: dict = {"cpu": cpu_description(), "sizes": args.sizes, "rounds": args.rounds,
                     "model": f"{model.weights}, {model.shape.replace(',', 'x')}",
                     "image_kb": sum(p.stat().st_size for p in paths) / len(paths) / 1000,
                     "labels": {s.name: s.label.format(**versions) for s in systems}, "runs": [], "sweep": []}
    log(f"the model's limit: forward passes only, batch {FORWARD_BATCH}, every core ({args.limit_seconds:g} s)")
    results["limit"] = probe(["limit", "--model", str(prefix), "--shape", model.shape, "--batch", str(FORWARD_BATCH),
                              "--seconds", str(args.limit_seconds), *map(str, paths[: 2 * FORWARD_BATCH])],
                             os.cpu_count() or 1)
    results["driver_import_cpu"] = driver_import_cpu()
    with stand_in(work, paths, args.sizes, prefix, model) as setup:
        masters = sorted({s.master for s in systems if s.kind == "ours"})
        results["floor"] = {master: [] for master in masters}
        (work / "logs").mkdir(parents=True, exist_ok=True)
        chosen = sweep(systems, setup, max(args.sizes), results) if args.sweep else {
            s.name: s.configs[0] for s in systems}
        for s in systems:
            if s.kind != "ours":
                results["labels"][s.name] += f" ({chosen[s.name].name})"
        for round_ in range(1, args.rounds + 1):
            for master in masters:
                log(f"round {round_}: Spark's floor on {master}, an empty PySpark job")
                results["floor"][master].append(spark_floor(master, work))
                log(f"  {results['floor'][master][-1]['wall']:.1f} s")
            for n in args.sizes:
                for system in systems:
                    log(f"round {round_}, {n} images: {results['labels'][system.name]}")
                    done = run_once(system, setup, n, round_, chosen[system.name])
                    rest = done["cpu"]["rest of the machine"]
                    log(f"  {done['wall']:.1f} s, {sum(done['cpu'].values()) - rest:.1f} CPU-s "
                        f"(the rest of the machine meanwhile: {rest:.1f})")
                    results["runs"].append(done)
    add_agreement(results["runs"])
    return results


def add_agreement(runs: list[dict]) -> None:
    """Each run's top-1 agreement with the reference system's run of the same size and round."""
    reference = {(r["n"], r["round"]): r["top1"] for r in runs if r["system"] == REFERENCE}
    for r in runs:
        ref = reference.get((r["n"], r["round"]))
        r["agreement"] = list(agreement(ref, r["top1"])) if ref is not None else None
        r["distinct_top1"] = len({c for c in r["top1"].values() if c is not None})


# ----------------------------------------------------------------------------
# The printout


def effective_rates(runs: list[dict], system: str, n1: int, n2: int) -> list[float | None]:
    """Per round, ``(n2 - n1) / (T_n2 - T_n1)`` of ``system``'s runs; ``None`` where T_n2 <= T_n1."""
    walls = {(r["n"], r["round"]): r["wall"] for r in runs if r["system"] == system}
    rounds = sorted({k[1] for k in walls})
    out: list[float | None] = []
    for round_ in rounds:
        t1, t2 = walls.get((n1, round_)), walls.get((n2, round_))
        out.append((n2 - n1) / (t2 - t1) if t1 is not None and t2 is not None and t2 > t1 else None)
    return out


def median(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def summarize(results: dict) -> dict[str, dict]:
    """Per system: E per round and its median, wall times per size, mean CPU by group at N2, agreement."""
    n1, n2 = results["sizes"]
    runs = results["runs"]
    out = {}
    for name in results["labels"]:
        mine = [r for r in runs if r["system"] == name]
        big = [r for r in mine if r["n"] == n2]
        cpu = {g: sum(r["cpu"].get(g, 0.0) for r in big) / len(big) for g in GROUPS} if big else {}
        agreed = [r["agreement"] for r in mine if r.get("agreement")]
        rates = effective_rates(runs, name, n1, n2)
        out[name] = {"E_rounds": rates, "E": median(rates), "cpu_n2": cpu,
                     "wall": {n: sorted(r["wall"] for r in mine if r["n"] == n) for n in (n1, n2)},
                     "agreement": (sum(a[0] for a in agreed), sum(a[1] for a in agreed)) if agreed else None,
                     "distinct_top1": max((r["distinct_top1"] for r in mine), default=0)}
    return out


def markdown(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table; columns after the first are right-aligned."""
    return ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1),
            *("| " + " | ".join(row) + " |" for row in rows)]


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def walls(values: list[float]) -> str:
    """``median s (min-max)``, or one value."""
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.1f} s"
    return f"{statistics.median(values):.1f} s ({values[0]:.1f}-{values[-1]:.1f})"


def speed_table(results: dict, summary: dict) -> list[str]:
    """E, E against ours and against the model's limit L (a weak peer shows), the whole job's times, agreement."""
    n1, n2 = results["sizes"]
    ours = (summary.get(REFERENCE) or {}).get("E")
    limit = results["limit"]["images_per_second"]
    rows = []
    for name, s in summary.items():
        ratio = s["E"] / ours if s["E"] is not None and ours else None
        of_limit = s["E"] / limit if s["E"] is not None and limit else None
        agreed = s["agreement"]
        agree = ("reference" if name == REFERENCE else f"{agreed[0]}/{agreed[1]}") if agreed else "n/a"
        rows.append([results["labels"][name], fmt(s["E"]), fmt(ratio, 2), fmt(of_limit, 2), walls(s["wall"][n2]),
                     walls(s["wall"][n1]), agree])
    return markdown(["system", "E img/s (median)", "E / ours", "E / L", f"whole job, {n2:,} images",
                     f"whole job, {n1:,} images", "top-1 same as ours"], rows)


def sweep_table(results: dict) -> list[str]:
    """What the sweep tried for each peer, and which configuration ran the rounds (the fastest whole job)."""
    runs = results.get("sweep") or []
    if not runs:
        return []
    n2 = results["sizes"][1]
    rows = [[r["system"], r["config"], f"{r['wall']:.1f} s", fmt(r["cpu"]),
             "best: runs the rounds" if r["best"] else ""] for r in runs]
    return ["", f"Each peer's configurations, one whole job of {n2:,} images each (CPU: the S3 stand-in and the rest "
            "of the machine left out):", *markdown(["peer", "configuration", "whole job", "CPU-s", ""], rows)]


def cpu_table(results: dict, summary: dict) -> list[str]:
    n2 = results["sizes"][1]
    used = [g for g in GROUPS if any(s["cpu_n2"].get(g, 0.0) >= 0.05 for s in summary.values())]
    rows = []
    for name, s in summary.items():
        cpu = s["cpu_n2"]
        total = sum(v for g, v in cpu.items() if g != "rest of the machine")
        rows.append([results["labels"][name], *(fmt(cpu.get(g, 0.0)) for g in used), fmt(total),
                     fmt(1000 * total / n2)])
    return markdown(["system", *used, "total (the rest of the machine left out)", "ms per image"], rows)


#: What E must be against Daft's (#47's target).
E_OVER_DAFT = 1.05
#: The targets the printout checks, each against Daft, in the words it prints them with (:func:`target_words`).
TARGETS = (
    "E >= 1.05 x Daft's E in the same round",
    "whole job at {n2:,} images <= Daft's, at {n1:,} <= 1.5 x Daft's",
    "the Python driver's CPU for {n2:,} images <= 5 s beyond its imports",
    "total CPU per image for {n2:,} images, start-up included, <= 1.1 x Daft's",
)


def target_words(n1: int, n2: int) -> list[str]:
    """:data:`TARGETS` for the two sizes."""
    return [t.format(n1=n1, n2=n2) for t in TARGETS]


def run_total(s: dict) -> float:
    return sum(v for g, v in s["cpu_n2"].items() if g != "rest of the machine")


def check_targets(results: dict, summary: dict) -> list[tuple[str, str, bool | None, str]]:
    """``(system, target, met, the measurement)`` for each of our systems against Daft; ``met`` ``None``: unknown."""
    daft = summary.get("daft")
    n1, n2 = results["sizes"]
    words = target_words(n1, n2)
    out = []
    for name, s in summary.items():
        if SYSTEMS[name].kind != "ours" or daft is None:
            continue
        pairs = [(a, b) for a, b in zip(s["E_rounds"], daft["E_rounds"]) if a is not None and b is not None]
        met = all(a >= E_OVER_DAFT * b for a, b in pairs) if pairs else None
        out.append((name, words[0], met, ", ".join(f"{a:.1f} vs {b:.1f}" for a, b in pairs) or "no E"))
        m1, m2 = median(s["wall"][n1]), median(s["wall"][n2])
        d1, d2 = median(daft["wall"][n1]), median(daft["wall"][n2])
        met = None if None in (m1, m2, d1, d2) else m2 <= d2 and m1 <= 1.5 * d1
        floor = floor_of(results, SYSTEMS[name].master)
        floor_words = f"; Spark's floor alone {floor['wall']:.1f} s" if floor else ""
        out.append((name, words[1], met, f"{fmt(m2)} vs {fmt(d2)} s; {fmt(m1)} vs 1.5 x {fmt(d1)} s{floor_words}"))
        driver, jvm = s["cpu_n2"].get("Python driver", 0.0), s["cpu_n2"].get("driver JVM", 0.0)
        beyond = driver - results["driver_import_cpu"]
        out.append((name, words[2], beyond <= 5.0,
                    f"{driver:.1f} s, its imports {results['driver_import_cpu']:.1f}: {beyond:.1f} beyond "
                    f"(the driver's JVM apart: {jvm:.1f} s)"))
        mine_ms, daft_ms = 1000 * run_total(s) / n2, 1000 * run_total(daft) / n2
        floor_words = (f"; Spark's floor alone {floor['cpu_total']:.1f} CPU-s, {1000 * floor['cpu_total'] / n2:.1f} ms "
                       f"an image" if floor else "")
        out.append((name, words[3], mine_ms <= 1.1 * daft_ms, f"{mine_ms:.1f} vs {daft_ms:.1f} ms{floor_words}"))
    return out


def floor_of(results: dict, master: str) -> dict | None:
    """The median wall time and mean CPU (by group, and in all) of the floor runs on ``master``; ``None``: none."""
    runs = results.get("floor", {}).get(master)
    if not runs:
        return None
    cpu = {g: sum(r["cpu"].get(g, 0.0) for r in runs) / len(runs) for g in GROUPS}
    return {"wall": statistics.median(r["wall"] for r in runs), "cpu": cpu, "cpu_total": sum(cpu.values())}


def floor_lines(results: dict) -> list[str]:
    out = []
    for master in results.get("floor", {}):
        floor = floor_of(results, master)
        parts = ", ".join(f"{g} {v:.1f}" for g, v in floor["cpu"].items() if v >= 0.05)
        out.append(f"Spark's own floor on {master}: an empty PySpark job (SparkContext, one Python task per "
                   f"executor, stop) through the job's spark-submit line takes {floor['wall']:.1f} s and "
                   f"{floor['cpu_total']:.1f} CPU-s ({parts}): no change to the job's own work goes under it.")
    return out


def report(results: dict) -> str:
    n1, n2 = results["sizes"]
    summary = summarize(results)
    lim = results["limit"]
    out = [f"CPU: {results['cpu']}; {results['model']}; {n1:,} and {n2:,} JPEGs of about 500x375 "
           f"({results['image_kb']:.0f} kB average) in one moto bucket on the same cores; "
           f"{results['rounds']} interleaved round(s), each run a whole job from a cold start", ""]
    out += speed_table(results, summary)
    out += ["", f"E = ({n2:,} - {n1:,}) / (T_{n2} - T_{n1}): images/s with the start-up cancelled. "
            f"L, the model's own limit on these cores: {lim['images_per_second']:.1f} img/s "
            f"(forward passes only, batch {FORWARD_BATCH}, {lim['cpu_ms_per_image']:.1f} ms of CPU an image)."]
    out += sweep_table(results)
    distinct = summary.get(REFERENCE, {}).get("distinct_top1")
    if distinct is not None:
        out.append(f"Ours gave {distinct} distinct top-1 classes over a run's images.")
    out += ["", f"CPU-seconds by process group, a {n2:,}-image job (mean of the rounds):", *cpu_table(results, summary),
            "(the rest of the machine: every other process's busy CPU meanwhile, this bench's sampling included; "
            "more than a few CPU-s means others shared the cores and the figures above mean little)"]
    out += ["", f"The Python driver's imports (infer_main, pyspark.sql; no MXNet) alone take "
            f"{results['driver_import_cpu']:.1f} CPU-s in a fresh process.", *floor_lines(results), "", "Targets:"]
    checks = check_targets(results, summary)
    words = {True: "met", False: "NOT met", None: "unknown"}
    out += [f"  {results['labels'][name]}: {target}: {words[met]} ({detail})" for name, target, met, detail in checks]
    if not checks:
        out.append("  (need Daft and one of our systems in --systems)")
    return "\n".join(out)


def parse_sizes(text: str) -> list[int]:
    """``"128,1280"`` as ``[128, 1280]``: two sizes, the first smaller."""
    sizes = [int(x) for x in text.split(",") if x.strip()]
    if len(sizes) != 2 or not 0 < sizes[0] < sizes[1]:
        raise ValueError(f"--sizes needs two image counts, the first smaller: got {text!r}")
    return sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="128,1280", help="N1,N2: the two image counts E is taken between")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of every size and system")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--limit-seconds", type=float, default=15.0, help="seconds of forward passes for the limit")
    parser.add_argument("--no-sweep", dest="sweep", action="store_false",
                        help="run each peer in its first configuration instead of the fastest of a sweep")
    parser.add_argument("--work", type=Path, default=ROOT / "run" / "peers",
                        help="folder for the images, the model, the logs and results.json")
    args = parser.parse_args(argv)
    try:
        args.sizes = parse_sizes(args.sizes)
    except ValueError as exc:
        parser.error(str(exc))
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or not args.systems:
        parser.error(f"--systems: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(SYSTEMS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    results = run(args)
    print("\n" + report(results), flush=True)
    kept = {**results, "runs": [{k: v for k, v in r.items() if k != "top1"} for r in results["runs"]]}
    (args.work / "results.json").write_text(json.dumps(kept, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
