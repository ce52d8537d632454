"""``python -m bench.worker_steps`` measures: every step is in its table, with sane figures.

A benchmark, not a test of speed: this checks that the probe runs and prints
each step, not how fast the steps are.
"""

from __future__ import annotations

import math

from bench import worker_steps


def test_the_probe_prints_every_step_and_the_large_photos(capsys):
    assert worker_steps.main(["--images", "4", "--large", "1", "--repeats", "1", "--no-s3"]) == 0
    out = capsys.readouterr().out
    for step in ("open (header)", "JPEG decode (load)", "EXIF transpose", "RGB conversion", "resize (BILINEAR)",
                 "bands + float32 + normalise into a batch row", "batch assembly (np.stack of 16)",
                 "decode_into a preallocated batch", "Python glue", "total: decode + preprocess",
                 "JPEG decoder at 1/8 (floor)"):
        assert step in out
    assert "AVX-512 VNNI: " in out


def test_the_figures_are_positive_cpu_milliseconds():
    result = worker_steps.measure(images=2, large=0, repeats=1, s3=False)
    figures = [*result["steps"].values(), *result["end_to_end"].values(), result["glue"]]
    assert all(math.isfinite(ms) and ms >= 0 for ms in figures)
    assert result["steps"]["JPEG decode (load)"] > 0 and result["steps"]["resize (BILINEAR)"] > 0


def test_the_get_is_measured_for_both_readers():
    result = worker_steps.get_ms(worker_steps.photos(2), repeats=1)
    assert set(result) == {"lean", "botocore"} and all(ms > 0 for ms in result.values())
