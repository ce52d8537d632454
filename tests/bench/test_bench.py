"""``make bench`` still runs: its quickest mode, end to end (images, moto + latency proxy, L, S, E, driver memory).

The benchmark measures; this only proves the measuring works, so it checks
that every number is there and sane, not how large it is. ``make bench-scale``'s
arithmetic (extrapolation, per-task overhead) is checked on a hand-made
summary, without Spark.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from mxjob.outputs import dataset, parquet
from mxjob.tasks import classify
from tests.support.helpers import ROOT, parquet_of


@pytest.mark.spark
def test_bench_quick_prints_the_table_and_results(tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.run_bench", "--quick", "--work", str(tmp_path)],
                            cwd=str(ROOT), capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "| resnet20 3x32x32 |" in result.stdout
    assert "Driver for 1,000 results" in result.stdout and "assembly of 16 parts" in result.stdout
    assert "were it free, the other processes'" in result.stdout  # the E/L ceiling line
    assert "| resnet20 int8 |" in result.stdout and "Large photos: 8 JPEGs of 8-12 MP" in result.stdout
    assert "MXNet threads per Python worker" in result.stdout
    lease = re.search(r"  resnet20: (\d+) requests \((\d+) renewals\), ([\d.]+) s on the driver: ([\d.]+)% of the run",
                      result.stdout)
    assert lease, result.stdout  # the lease's cost: a take, checks before durable writes, renewals per minute
    assert int(lease.group(1)) >= 5 and float(lease.group(3)) > 0
    assert "ours / trivial:" in result.stdout and "auto's batch" in result.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    int8 = results["int8"]["resnet20"]
    assert int8["L"]["images_per_second"] > 0 and int8["E"]["summary"]["precision"]["precision"] == "int8"
    assert int8["E"]["summary"]["predicted"] == 128
    large = results["large"]
    assert large["E"]["summary"]["predicted"] == 8 and large["decode"]["draft_cpu_ms_per_image"] > 0
    row = results["models"]["resnet20"]
    assert row["L"]["images_per_second"] > 0 and row["S"]["images_per_second"] > 0
    summary = row["E"]["summary"]
    assert summary["keys_listed"] == summary["predicted"] == results["images"] == 128
    assert row["E"]["E"] == summary["tasks"]["images_per_second"] > 0
    assert all(w["max_rss_bytes"] > 0 and w["first_task"]["images"] > 0
               for w in summary["python_workers"].values())
    assert row["E"]["driver_python_peak_rss"] > 0 and row["E"]["driver_jvm_peak_rss"] > 0


def test_bench_scale_extrapolation_and_task_overhead():
    from bench import scale
    from bench.listing import layout_keys

    # The straight line through (100k, 10) and (1M, 28): slope 2e-5 a key, 208 at 10M.
    assert scale.extrapolate([(100_000, 10.0), (1_000_000, 28.0)], 10_000_000) == pytest.approx(208.0)
    assert scale.extrapolate([(100_000, None), (1_000_000, 28.0)], 10_000_000) is None
    rows = [{"keys": 1_000_000, "spark_s": 280.0, "plan_s": None},
            {"keys": 100_000, "spark_s": 40.0, "plan_s": 1.0},
            {"keys": 20_000_000, "spark_s": 1.0}]  # above the target: not used
    row = scale.extrapolated_row(rows, 10_000_000, 64)
    assert row["from"] == [100_000, 1_000_000] and row["batches"] == 156_250
    assert row["spark_s"] == pytest.approx(2680.0) and row["plan_s"] is None
    assert scale.extrapolated_row(rows[:1], 10_000_000, 64) is None
    # A per-batch average is extrapolated as its total: 1 s fixed plus 100 ms a batch stays 100 ms a batch.
    rows = [{"keys": keys, "batches": keys // 64, "in_task_ms": 1000 / (keys // 64) + 100}
            for keys in (64_000, 640_000)]
    assert scale.extrapolated_row(rows, 10_000_000, 64)["in_task_ms"] == pytest.approx(1000 / 156_250 + 100)

    # 2 executors, tasks from t=0 to t=10 s: 20 executor-seconds for 100 batches, 15 of them in tasks.
    summary = {"batches": 100, "tasks": {"seconds": 10.0},
               "python_workers": {"a": {"task_seconds": 8.0, "idle_between_tasks_seconds": 1.5},
                                  "b": {"task_seconds": 7.0, "idle_between_tasks_seconds": 2.5}}}
    overhead = scale.task_overhead(summary, executors=2)
    assert overhead["overhead_window_ms"] == pytest.approx(50.0)  # (10 x 2 - 15) / 100
    assert overhead["overhead_idle_ms"] == pytest.approx(40.0)  # (1.5 + 2.5) / 100
    assert overhead["in_task_ms"] == pytest.approx(150.0)  # 15 / 100
    assert scale.task_overhead({"batches": 0}, 2)["overhead_window_ms"] is None

    assert list(scale.manifest_keys(2500)) == layout_keys("nested", 2500)
    assert scale.mebibytes("2g") == 2048 and scale.mebibytes("512m") == 512


def test_bench_scale_existing_keys_layout_spreads_one_new_key_per_hundred():
    from bench import existing_keys

    total, positions = existing_keys.layout(100_000)
    assert total == 101_000 and len(positions) == 1_000
    assert positions[-1] == total - 1 and set(np.diff(positions).tolist()) == {101}  # evenly spread
    total, positions = existing_keys.layout(150)  # 1.5 new keys round up to 2
    assert total == 152 and positions.tolist() == [75, 151]
    with pytest.raises(ValueError, match="at least 1"):
        existing_keys.layout(0)


def test_bench_scale_existing_dataset_is_the_jobs_and_skip_existing_finds_every_key(s3, moto_endpoint):
    from bench import existing_keys, scale
    from mxjob.inputs import listing
    from mxjob.options import config

    bucket, prefix = "bench-existing", "prior/"
    s3.create_bucket(Bucket=bucket)
    total, positions = existing_keys.layout(1_000)
    new = frozenset(positions.tolist())
    every = list(scale.manifest_keys(total))  # in the manifest's order, which is not the keys' order
    assert list(scale.sorted_manifest_keys(total, new)) == sorted(set(every) - {every[i] for i in new})
    metadata = parquet.provenance({"fingerprint": {"task": "classify", "top_k": 1}})
    files = existing_keys.write_dataset(s3, bucket, prefix, scale.sorted_manifest_keys(total, new), 300, metadata)
    assert [(f["key"], f["rows"]) for f in files] == [(f"{prefix}part-0000{i}.parquet", rows)
                                                      for i, rows in enumerate((300, 300, 300, 100))]
    body = s3.get_object(Bucket=bucket, Key=files[0]["key"])["Body"].read()
    written = pq.ParquetFile(io.BytesIO(body))
    assert written.schema_arrow.names == parquet_of(classify.TASK.schema()).names
    assert existing_keys.provenance(body) == metadata
    assert written.read().slice(0, 1).column("predictions").to_pylist()[0][0]["probability"] == 1.0  # the fake's
    assert json.loads(s3.get_object(Bucket=bucket, Key=f"{prefix}_SUCCESS")["Body"].read())["rows"] == 1_000

    cfg = config.resolve(config.merge_settings(
        {"input": f"s3://{bucket}/imgs/", "model": f"s3://{bucket}/model/m", "output": f"s3://{bucket}/{prefix}",
         "endpoint_url": moto_endpoint, "skip_existing": True}, {}))
    found = dataset.find(cfg, s3, listing.Listing.build(bucket, sorted(every), [1] * total))
    assert found.in_output == 1_000 and len(found.files) == 4 and sum(f.rows for f in found.files) == 1_000
    assert found.new.keys.to_pylist() == sorted(every[i] for i in new)
    assert list(found.fingerprints) == [metadata["mxinfer.fingerprint"]]


def test_task_cost_report_compares_ours_with_trivial_and_shows_autos_share():
    from bench import task_cost

    results = {"master": "local-cluster[2,1,1024]", "executors": 2,
               "trivial": {"tasks": 10, "executor_ms_per_task": 200.0, "cpu_ms_per_task": {"python worker": 100.0}},
               "ours": {"tasks": 10, "executor_ms_per_task": 240.0, "cpu_ms_per_task": {"python worker": 110.0},
                        "in_task_ms_per_task": 30.0, "in_task_cpu_ms_per_task": 6.0}}
    text = task_cost.report(results)
    assert "| trivial | 200.0 | 100.0 |" in text and "| ours | 240.0 | 110.0 |" in text
    assert "ours / trivial: 1.20x executor time, 1.10x Python worker CPU" in text
    [slow] = [row for row in task_cost.auto_shares(0.24, 2) if row["ms_per_image"] == 47.0]
    # The measured 240 ms against a batch of 47 ms images: its share is what the line prints.
    assert slow["share"] == pytest.approx(0.24 / (slow["batch"] * 0.047 + 0.24))
    assert f"auto's batch {slow['batch']}, where the measured per-task cost is {slow['share']:.1%}" in text


def test_int8_search_report_names_the_cpu_the_layers_kept_the_agreement_and_the_speedup():
    from bench import int8_search

    trial = {"excluded_layers": 2, "granularity": "tensor-wise", "images": 200, "top1_agreement": 0.955,
             "kl_divergence": 0.0138, "speedup": 1.57}
    out = {"cpu": "AMD EPYC, 2 cores, VNNI: avx512_vnni", "threads": "2", "calibration_images": 200, "held_out": 200,
           "layers": 50, "budget_seconds": 120.0, "min_agreement": 0.99, "passed": False,
           "seconds_with_calibration": 226.2, "configurations_tried": 60, "seconds": 112.7,
           "stopped": "time budget spent", "most_sensitive": [{"layer": "_blocks_0__depthwise_conv",
                                                                "kl_divergence": 0.0111}],
           "trials": [trial], "timing": {"fp32_ms_per_image": 18.88, "int8_ms_per_image": 14.45, "speedup": 1.31},
           "best": {**trial, "excluded_layers": ["_blocks_0__depthwise_conv", "_blocks_1__depthwise_conv"]}}
    lines = int8_search.report(out)
    assert lines[0] == "CPU: AMD EPYC, 2 cores, VNNI: avx512_vnni; MXNet threads 2"
    assert "60 configurations tried in 112.7 s" in lines[2] and "| 2 | tensor-wise | 0.955 | 0.01380 | 1.57 |" in lines
    assert lines[-1] == ("REFUSED: 2 layers kept in fp32 (_blocks_0__depthwise_conv, _blocks_1__depthwise_conv), "
                         "tensor-wise, top-1 agreement 0.955; final timing fp32 18.88 ms/image, int8 14.45 ms/image: "
                         "speed-up 1.31x")
    assert "VNNI: " in int8_search.cpu_description()


def test_beyond_forward_splits_the_workers_cpu_at_its_tasks_edges():
    from bench import run_bench

    e = {"cpu_ms_per_image": {"python worker": 22.0, "executor JVM": 0.3},
         "summary": {"keys_listed": 640, "batches": 10, "seconds": {"cpu": 640 * 0.0195}}}
    line = run_bench.beyond_forward(e, 17.0)
    assert line.startswith("in its tasks 2.5 ms") and "outside them 2.5 ms" in line
    assert "hand-over of 10 tasks, 160 ms each" in line
    assert "after each worker's first task" not in line  # no first tasks' CPU in this summary


def test_beyond_forward_gives_the_in_task_cost_after_each_workers_first_task():
    from bench import run_bench

    # Two workers whose first tasks (64 images each) took 3.0 and 2.5 s of CPU: MXNet's import, the model's load.
    # The other 512 images took 640 * 0.0195 - 5.5 = 6.98 s: 13.63 ms each, 13.63 - 12.0 = 1.6 beyond the forward.
    workers = {"a": {"first_task": {"images": 64, "cpu": 3.0}}, "b": {"first_task": {"images": 64, "cpu": 2.5}}}
    e = {"cpu_ms_per_image": {"python worker": 22.0},
         "summary": {"keys_listed": 640, "batches": 10, "seconds": {"cpu": 640 * 0.0195}, "python_workers": workers}}
    line = run_bench.beyond_forward(e, 12.0)
    assert line.startswith("in its tasks 7.5 ms")
    assert "after each worker's first task (3.0, 2.5 s of CPU) 1.6 ms" in line


def test_cpu_split_gives_each_threads_cpu_per_image_after_the_first_tasks_and_the_forward_against_l():
    from bench import run_bench

    # 640 images; the two first tasks (64 images each) are left out: 512 images after them.
    first = {"images": 64, "cpu": 3.0, "download_cpu": 0.1, "decode_cpu": 0.2, "task_thread_cpu": 2.0}
    workers = {"a": {"first_task": first}, "b": {"first_task": dict(first, cpu=2.5)}}
    seconds = {"cpu": 5.5 + 512 * 0.020, "download_cpu": 0.2 + 512 * 0.001, "decode_cpu": 0.4 + 512 * 0.002,
               "task_thread_cpu": 4.0 + 512 * 0.0005}
    line = run_bench.cpu_split({"keys_listed": 640, "seconds": seconds, "python_workers": workers}, 15.0)
    assert "(after each worker's first task)" in line
    assert "GETs 1.0 ms, decoding 2.0, the task's own thread 0.5" in line
    assert "MXNet's threads 16.5 (the forward pass in the job; L's costs 15.0, +1.5)" in line
    # Workers with two forward lanes ran the model's Python side on the lanes' threads.
    laned = {name: dict(w, lanes=2) for name, w in workers.items()}
    line = run_bench.cpu_split({"keys_listed": 640, "seconds": seconds, "python_workers": laned}, 15.0)
    assert "the task's own thread 0.5 (results, parts), MXNet's and the 2 lanes' threads 16.5" in line
    # A summary from before the split: nothing to say.
    assert run_bench.cpu_split({"keys_listed": 640, "seconds": {"cpu": 12.0}}, 15.0) == ""


def test_e_with_the_stand_ins_cpu_handed_back_scales_by_the_share_it_took():
    from bench import run_bench

    assert run_bench.stand_in_back({"E": 36.0, "stand_in_cpu_share": 0.1}) == pytest.approx(40.0)
    assert run_bench.stand_in_back({"E": 36.0, "stand_in_cpu_share": None}) == 36.0
    assert run_bench.stand_in_back({"E": 36.0, "stand_in_cpu_share": 0.25}, 39.0) == pytest.approx(52.0)


def e_run(rate: float, size: int, task: str, outputs: dict, steady: float | None = None) -> dict:
    """What ``run_bench.submit`` returns, as much of it as the task rows read."""
    return {"E": rate, "E_steady": steady, "output_bytes": size,
            "summary": {"options": {"task": task}, "model": {"outputs": outputs}}}


def test_task_rows_give_bytes_per_image_and_hold_embed_to_classify():
    from bench import tasks as bench_tasks

    images = 400
    rows = {"classify jsonl": bench_tasks.row_figures(e_run(50.0, 120_000, "classify", {"fc": [1000]}, 75.0), images),
            "classify parquet": bench_tasks.row_figures(e_run(52.0, 40_000, "classify", {"fc": [1000]}, 78.0), images),
            "embed float32 parquet": bench_tasks.row_figures(e_run(49.6, 900_000, "embed", {"flatten": [512]}, 74.4),
                                                             images),
            "embed float16 parquet": bench_tasks.row_figures(e_run(49.0, 500_000, "embed", {"flatten": [512]}),
                                                             images),
            "detect parquet": {**bench_tasks.row_figures(e_run(26.0, 147_200, "detect", {"det": [196, 6]}), images),
                               "L": 80.0}}
    assert rows["embed float32 parquet"]["bytes_per_image"] == 2250.0
    assert rows["embed float32 parquet"]["values"] == 512 and rows["classify parquet"]["values"] is None
    assert rows["detect parquet"]["values"] is None  # 196 x 6 is no vector
    assert bench_tasks.verdict("embed float32 parquet", 49.6, 52.0).endswith("(PASS: at least 0.95)")  # 0.954
    assert "FAIL" in bench_tasks.verdict("embed float16 parquet", 49.0, 52.0)  # 0.942
    assert bench_tasks.verdict("detect parquet", 26.0, 52.0) == "0.50"
    tasks = {"model": "resnet18", "description": "ResNet-18", "images": images, "rows": rows}
    table = "\n".join(bench_tasks.report(tasks, 100.0, "Some CPU @ 2.0GHz"))
    assert "Tasks on ResNet-18, the same 400 images, on Some CPU @ 2.0GHz" in table
    assert "| classify jsonl | 50.0 | 75.0 | - | 100.0 |  | 300 |" in table  # 120,000 bytes / 400 images
    assert "| embed float32 parquet | 49.6 | 74.4 | 0.95 (PASS: at least 0.95) | 100.0 | 512 | 2,250 |" in table
    assert "| embed float16 parquet | 49.0 | - | 0.94 (FAIL: at least 0.95) | 100.0 | 512 | 1,250 |" in table
    assert "| detect parquet | 26.0 | - | 0.50 | 80.0 |  | 368 |" in table
    # 1000/80 - 1000/100 = 2.5 ms more per image than the classifier's forward pass.
    assert "runs at 0.80x classify's L (100.0): the SSD head and MultiBoxDetection cost +2.50 ms per image" in table


def test_tasks_names_are_checked_and_choose_their_rows():
    from bench import tasks as bench_tasks

    assert bench_tasks.parse_tasks(" detect, embed,detect ") == ("detect", "embed")
    assert bench_tasks.parse_tasks("") == ()
    with pytest.raises(ValueError, match=r"--tasks takes embed, detect \(comma-separated\), not classify, emb$"):
        bench_tasks.parse_tasks("embed,classify,emb")
    names = [row[0] for row in bench_tasks.rows_for(("embed",))]
    assert names == ["classify parquet", "embed float32 parquet", "embed float16 parquet", "embed float32 jsonl"]
    assert [row[0] for row in bench_tasks.rows_for(("detect",))] == ["classify parquet", "detect parquet"]
    assert bench_tasks.rows_for(()) == []
    with pytest.raises(SystemExit):  # argparse's error, before any image is made
        from bench import run_bench

        run_bench.main(["--tasks", "segment", "--work", "/nonexistent"])


class FakeS3:
    def __init__(self):
        self.objects = {}

    def put_object(self, Bucket, Key, Body):  # boto3's argument names
        self.objects[Key] = Body


def test_task_rows_run_each_task_on_the_first_model_without_spark(tmp_path):
    """``bench.tasks.run`` with stand-ins for spark-submit and the L probe: which jobs, which model, which figures."""
    from argparse import Namespace

    from bench import tasks as bench_tasks
    from bench.run_bench import StandIn

    submitted, probed = [], []

    def submit(stand_in, job, work):
        submitted.append((job.tag, job.model.name, job.extra, job.suffix, job.model_key))
        task = job.extra[job.extra.index("--task") + 1]
        outputs = {"embed": {"flatten": [64]}, "detect": {"det": [256, 6]}}.get(task, {"fc": [10]})
        size = 1000 * len(submitted)  # each object's size differs: a row reading another's size shows
        return e_run(100.0 + len(submitted), size, task, outputs, 120.0)

    def probe(args, threads):
        probed.append(args)
        return {"images_per_second": 90.0}

    args = Namespace(models=["resnet20", "resnet18"], tasks=("embed", "detect"), batch=4, master="M",
                     job_args=["--x"], spark_conf=[], limit_seconds=1.0)
    paths = [tmp_path / f"img{i}.jpg" for i in range(10)]
    s3 = FakeS3()
    classify = {"resnet20": {"E": e_run(100.0, 500, "classify", {"fc": [10]}, 120.0)}}
    result = bench_tasks.run(args, StandIn(s3, Namespace(endpoint="http://proxy"), None), submit, probe, classify,
                             paths, tmp_path)
    assert {model for _, model, _, _, _ in submitted} == {"resnet20"}
    assert [(tag, suffix) for tag, _, _, suffix, _ in submitted] == [
        ("T-classify-parquet", ".parquet"), ("T-embed-float32-parquet", ".parquet"),
        ("T-embed-float16-parquet", ".parquet"), ("T-embed-float32-jsonl", ".jsonl"), ("T-detect-parquet", ".parquet")]
    assert submitted[2][2] == ["--x", "--task", "embed", "--embedding-dtype", "float16"]
    assert submitted[4][4] == "models/detector/resnet20-ssd" and submitted[0][4] is None
    assert sorted(s3.objects) == ["models/detector/resnet20-ssd-0000.params",
                                  "models/detector/resnet20-ssd-symbol.json", "models/detector/synset.txt"]
    assert probed[0][:3] == ["limit", "--model", str(tmp_path / "models" / "detector" / "resnet20-ssd")]
    rows = result["rows"]
    assert result["model"] == "resnet20" and result["images"] == 10
    assert rows["classify jsonl"]["bytes_per_image"] == 50.0  # 500 bytes / 10 images
    assert [rows[name]["bytes_per_image"] for name in list(rows)[1:]] == [100.0, 200.0, 300.0, 400.0, 500.0]
    assert rows["embed float16 parquet"]["values"] == 64 and rows["detect parquet"]["L"] == 90.0

    args.tasks = ("embed",)
    submitted.clear()
    rows = bench_tasks.run(args, StandIn(FakeS3(), Namespace(endpoint="e"), None), submit, probe, classify, paths,
                           tmp_path)["rows"]
    assert "detect parquet" not in rows and len(submitted) == 4 and len(probed) == 1


def test_the_models_limit_takes_its_cpu_cost_from_the_window_its_rate_comes_from(tmp_path, monkeypatch):
    import numpy as np
    from PIL import Image

    from bench import probes

    # A fake clock: 2 passes of 8 images a second, first 6 s with a load beside them (0.5 s a pass, 0.9 s
    # of CPU: 112.5 ms an image), then 4 s quiet (0.25 s a pass, 0.45 s of CPU: 56.25 ms an image).
    clock = {"wall": 0.0, "cpu": 0.0, "passes": 0}

    class Predictor:
        def __init__(self, *args):
            pass

        def predict(self, batch):
            clock["passes"] += 1
            busy = clock["passes"] <= 2 + 12  # the two warm-up passes, then 12 loaded ones
            clock["wall"] += 0.5 if busy else 0.25
            clock["cpu"] += 0.9 if busy else 0.45
            return [np.zeros((len(batch), 10), np.float32)]

    monkeypatch.setattr(probes.mxinfer, "Predictor", Predictor)
    monkeypatch.setattr(probes.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(probes.time, "process_time", lambda: clock["cpu"])
    paths = []
    for i in range(8):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (8, 8), (i, i, i)).save(paths[-1])
    out = probes.limit("model", (3, 8, 8), 8, [str(p) for p in paths], seconds=10.0)
    assert out["images_per_second"] == pytest.approx(32.0)  # a quiet window: 4 passes of 8 in a second
    assert out["cpu_ms_per_image"] == pytest.approx(56.25)  # that window's CPU, not the run's mean
    assert out["mean_cpu_ms_per_image"] > 80.0


def test_the_floor_line_holds_the_recipe_and_the_get_per_jpeg_against_3_ms_and_caps_e_over_l():
    from bench import run_bench

    # 640 images, two first tasks of 64 left out: the GETs cost 0.8 ms an image after them.
    first = {"images": 64, "cpu": 3.0, "download_cpu": 0.1}
    summary = {"keys_listed": 640, "seconds": {"cpu": 20.0, "download_cpu": 0.2 + 512 * 0.0008},
               "python_workers": {"a": {"first_task": first}, "b": {"first_task": first}}}
    e = {"summary": summary, "cpu_ms_per_image": {"python worker": 50.0, "S3 stand-in: moto": 4.0,
                                                  "S3 stand-in: proxy": 1.5, "driver JVM": 0.3, "executor JVM": 0.2}}
    floor = {"images": 200, "recipe_ms": 2.7, "decoder_and_resize_ms": 2.5,
             "jpeg": {"images": 180, "recipe_ms": 2.4, "decoder_and_resize_ms": 2.2}}
    # L: 40 ms of CPU an image at 50 images/s on 2 cores; at the floor 40 + 2.7 + 0.8 + 0.5 = 44 ms -> 45.45/s.
    line = run_bench.floor_line(floor, e, {"cpu_ms_per_image": 40.0, "images_per_second": 50.0}, 2)
    assert "a JPEG of this set costs the recipe alone 2.4 ms (of which the decoder and the resize" in line
    assert "the job's GET 0.8: 3.2 ms, over the 3 ms" in line
    assert ("(2.7 + 0.8 ms), beside the Spark processes' 0.5 ms (JVMs, the driver), would cap E/L with the "
            "stand-in's CPU back at 0.91") in line
    cheap = dict(floor, jpeg=dict(floor["jpeg"], recipe_ms=1.5))
    assert "2.3 ms, within the 3 ms" in run_bench.floor_line(cheap, e, {"cpu_ms_per_image": 40.0,
                                                                          "images_per_second": 50.0}, 2)
    assert run_bench.floor_line(None, e, {"cpu_ms_per_image": 40.0, "images_per_second": 50.0}, 2) == ""


def test_the_recipes_floor_is_measured_on_every_image_and_on_the_jpegs_alone():
    import io

    from PIL import Image

    from bench import worker_steps

    datas = []
    for i, fmt in enumerate(("JPEG", "JPEG", "PNG")):
        buffer = io.BytesIO()
        Image.new("RGB", (120, 90), (40 * i, 80, 120)).save(buffer, format=fmt)
        datas.append(buffer.getvalue())
    floor = worker_steps.recipe_floor(datas, worker_steps.bench_preprocess((3, 32, 32)), repeats=1)
    assert floor["images"] == 3 and floor["jpeg"]["images"] == 2
    for costs in (floor, floor["jpeg"]):
        assert 0 < costs["decoder_and_resize_ms"] and 0 < costs["recipe_ms"]
    assert worker_steps.recipe_floor(datas[2:], worker_steps.bench_preprocess((3, 32, 32)), repeats=1)["jpeg"] is None


def test_the_stand_ins_load_is_spread_over_processes_of_at_most_one_core_each():
    from bench import run_bench

    assert run_bench.load_plan(0.1, 2) == (1, pytest.approx(0.2))
    assert run_bench.load_plan(0.75, 2) == (2, pytest.approx(0.75))
    assert run_bench.load_plan(0.0, 2) == (1, 0.0)


def test_l_beside_the_stand_ins_load_is_measured_only_for_forward_passes_on_several_threads(monkeypatch):
    import argparse

    from bench import run_bench

    probes = []
    monkeypatch.setattr(run_bench, "probe", lambda args, cores: probes.append(args) or {"images_per_second": 80.0})
    monkeypatch.setattr(run_bench, "cpu_load", lambda share, cores: __import__("contextlib").nullcontext())
    args = argparse.Namespace(batch=64, limit_seconds=15.0)

    def e(threads, share=0.12, lanes=1):
        return {"E": 50.0, "E_steady": 52.0, "stand_in_cpu_share": share,
                "summary": {"python_workers": {w: {"threads": threads, "lanes": lanes} for w in "ab"}}}

    assert run_bench.loaded_limit(args, "m", "3,224,224", [], e(1)) is None
    assert run_bench.loaded_limit(args, "m", "3,224,224", [], e(2, lanes=2)) is None  # two passes of one thread
    assert run_bench.loaded_limit(args, "m", "3,224,224", [], e(2, share=None)) is None
    assert probes == []
    loaded = run_bench.loaded_limit(args, "m", "3,224,224", [], e(2))
    assert probes[0][:3] == ["limit", "--model", "m"] and loaded == {"images_per_second": 80.0, "share": 0.12,
                                                                      "threads": 2}
    line = run_bench.loaded_line(loaded, e(2), {"images_per_second": 100.0})
    assert "stand-in's 12% of the cores" in line
    assert "L on 2 threads as E's workers ran: 80.0 images/s, 20% below" in line
    assert "E/L beside the same load 0.62 (0.65 steady)" in line
    assert run_bench.loaded_line(None, e(2), {"images_per_second": 100.0}) == ""


def test_simplejpeg_at_full_scale_then_the_recipes_resize_is_the_recipe_bit_for_bit():
    """The claim make bench-recipes rests on: the same decoder, not a different one, is what the recipe pays for."""
    import numpy as np

    from bench import decode_alternatives
    from demo import photos as images
    from demo import pretrained
    from mxjob.model.preprocess import decode_image

    prep = pretrained.preprocess()
    full = decode_alternatives.simplejpeg_decoder(prep, scaled=False)
    scaled = decode_alternatives.simplejpeg_decoder(prep, scaled=True)
    datas = images.photo_views(6, seed=5)
    assert all(np.array_equal(full(data), decode_image(data, prep)) for data in datas)
    # DCT scaling to 5/8 (313x235 for 500x375) does move the input: what the bench weighs.
    assert max(float(np.abs(scaled(data) - decode_image(data, prep)).max()) for data in datas) > 0.01


def test_decode_alternatives_agreement_and_the_gate_verdict():
    import numpy as np

    from bench import decode_alternatives

    reference = np.array([[9.0, 1, 2, 3, 4, 5, 0], [0, 9, 1, 2, 3, 4, 5], [5, 4, 3, 2, 1, 0, 9],
                          [1, 2, 9, 3, 4, 5, 0]])
    other = reference.copy()
    other[0, 1] = 10.0  # a new top-1, and class 1 enters the top five
    other[3, 6] = 8.0   # the same top-1, but class 6 enters the top five
    got = decode_alternatives.agreement(reference, other)
    assert got == {"top1_agreement": 0.75, "top5_set_agreement": 0.5}
    out = {"cpu": "a CPU", "images": 4, "repeats": 1, "gate": 0.99, "rows": [
        {"alternative": "recipe", "cpu_ms_per_jpeg": 2.5, "mean_abs_difference": 0.0, "max_abs_difference": 0.0,
         "top1_agreement": 1.0, "top5_set_agreement": 1.0},
        {"alternative": "simplejpeg, scaled", "cpu_ms_per_jpeg": 1.75, "mean_abs_difference": 0.05,
         "max_abs_difference": 1.9, **got}]}
    lines = decode_alternatives.report(out)
    assert lines[0] == "CPU: a CPU"
    assert "| simplejpeg, scaled | 1.75 | +0.75 | 0.0500 / 1.900 | 0.750 (below the 0.99 gate) | 0.500 |" in lines
    assert "| recipe | 2.50 | +0.00 | 0.0000 / 0.000 | 1.000 | 1.000 |" in lines


def test_bench_scales_fake_daemon_leaves_the_model_check_to_the_driver(monkeypatch, caplog):
    """Its executors hold a stand-in, not the model: their warm-up reports no check; the driver checks the real one."""
    import logging
    import os
    from dataclasses import replace
    from types import SimpleNamespace

    from bench import fake_daemon
    from mxjob.core import state
    from mxjob.executor import model_check, partition
    from mxjob.options import config
    from mxjob.run import warm_up

    monkeypatch.setattr(state, "counters", state.Counters())
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the threads' variables a first load sets, put back
    tasks, checks = SimpleNamespace(), SimpleNamespace()
    fake_daemon.patch(tasks, checks)  # what the daemon patches, here on stand-ins of the two modules
    monkeypatch.setattr(partition, "get_model", tasks.get_model)
    cfg = config.resolve(config.merge_settings({"input": "s3://in/", "model": "s3://m/r18", "output": "s3://o/p.jsonl",
                                                "batch_size": 8}, {}))
    report = checks.warm_and_check(0, 2, replace(cfg, batch_size=8).job_spec(), sample=[("k", 1)], check=True)
    assert report == model_check.WarmReport(0, 1)
    started = SimpleNamespace(wait_reports=lambda: [report])
    with caplog.at_level(logging.INFO, logger=warm_up.__name__):
        assert warm_up.executors_report(started) is None
    assert "the executors did not check the model; the driver checks it" in caplog.text


def test_the_large_photos_report_says_when_the_watch_saw_no_cpu_in_the_tasks_window():
    # Warm executors score the eight photos between two of the watch's 0.2 s samples: all roles read 0 CPU.
    from bench import run_bench

    results = {
        "machine": {"cores": 2},
        "models": {"resnet20": {"L": {"images_per_second": 2700.0, "cpu_ms_per_image": 0.7}}},
        "large": {"images": 8, "bytes": 40e6, "model": "resnet20", "batch": 4,
                  "decode": {"draft_cpu_ms_per_image": 9.3, "exact_cpu_ms_per_image": 57.4,
                             "mean_abs_difference": 0.01, "max_abs_difference": 0.2},
                  "S": {"images_per_second": 28.5},
                  "E": {"E": 52.2, "E_steady": None, "cpu_ms_per_image": {"python worker": 0.0, "driver JVM": 0.0},
                        "summary": {"seconds": {"download": 0.1, "decode": 0.1, "forward": 0.0, "wait": 0.0,
                                                "task": 0.2, "spark": 0.4}}}},
    }
    lines = run_bench.report_large(results)
    assert any("CPU per image in E, by process: not measured" in line and "0.4 s on 2 cores" in line for line in lines)


def test_the_option_rows_keep_what_gains_two_percent_or_a_user_needs_and_remove_the_rest():
    from bench import option_gains

    def runs(e, cpu_ms):
        return [{"E": e, "cpu_ms": cpu_ms, "wall": 10.0}]

    result = {"images": 640, "master": "local-cluster[1,1,2048]", "rounds": 1, "model": "resnet18", "batch": 64,
              "runs": {"defaults": runs(20.0, 80.0),
                       "forward lanes": runs(19.0, 80.0),      # the default gains 5.3% in E: kept
                       "micro-batches": runs(20.0, 84.0),      # 5% in CPU per image: kept
                       "lean S3 reader": runs(19.9, 80.5),     # 0.5% and 0.6%: removed
                       "io threads": runs(20.0, 80.0),         # nothing, but a user needs it
                       "images in flight": runs(20.4, 79.0)}}  # worse, but a user needs it
    rows = {line.split("|")[1].strip(): line for line in option_gains.report(result) if line.startswith("  | ")}
    assert rows["forward lanes"].endswith("| +5.3% | 80.0 ms | +0.0% | keep |")
    assert rows["micro-batches"].endswith("| +0.0% | 84.0 ms | +5.0% | keep |")
    assert "`--micro-batch-size 64`" in rows["micro-batches"]
    assert rows["lean S3 reader"].endswith("| remove |")
    assert rows["io threads"].endswith(f"| keep: {option_gains.NEEDED['io threads']} |")
    assert "| keep: " in rows["images in flight"]
