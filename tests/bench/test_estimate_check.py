"""make bench-estimate's pure part: a sample's cost projected onto the EMR layout, with and without moto's CPU."""

from __future__ import annotations

from bench.estimate_check import backfill, job_args

MODELLED = {"sample_images": 32, "cpu_seconds_per_image": 0.04, "s3_server_cpu_seconds_per_image": 0.004,
            "model_load_seconds": 1.0, "start_seconds": 9.0}


def test_the_backfill_is_projected_with_and_without_the_stand_ins_cpu():
    (label_with, with_moto, batch_with), (label_without, without, batch_without) = backfill(
        MODELLED, 10_000_000, "10x16", 0.96)
    assert "with the stand-in" in label_with and "as on EMR" in label_without
    # 160 vCPUs at 40 ms (36 ms without the stand-in) an image, less Spark's per-task cost: close to 4,000 / 4,444.
    assert 3_700 < with_moto.images_per_second < 4_000 < without.images_per_second < 4_444
    assert without.wall_seconds < with_moto.wall_seconds and without.cost.total_usd < with_moto.cost.total_usd
    assert batch_with >= 1 and batch_without >= batch_with


def test_the_runs_read_the_same_model_and_recipe_as_the_dry_run():
    dry = job_args("http://127.0.0.1:1", 128, "--dry-run")
    run = job_args("http://127.0.0.1:1", 128)
    assert dry[:-1] == run and "--model" in run and "short-side-crop" in run
