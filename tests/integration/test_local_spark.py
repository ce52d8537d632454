"""What the local Spark (``conf/spark-local.conf``) leaves on this machine: ended runs' folders do not pile up."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pyspark
import pytest

from demo.run_local import ROOT, spark_env, spark_submit_command

#: Where local-cluster's worker keeps each run's folder (SPARK_HOME/work: pip's pyspark is SPARK_HOME).
WORK = Path(pyspark.__file__).parent / "work"


def local_conf() -> dict[str, str]:
    pairs = (line.split(None, 1) for line in (ROOT / "conf" / "spark-local.conf").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {name: value.strip() for name, value in pairs}


@pytest.mark.spark
def test_a_local_run_removes_ended_runs_folders_over_the_ttl_and_keeps_newer_ones(tmp_path):
    conf = local_conf()
    interval, ttl = int(conf["spark.worker.cleanup.interval"]), int(conf["spark.worker.cleanup.appDataTtl"])
    stamp = uuid.uuid4().hex[:8]
    old, recent = WORK / f"app-20000101000000-{stamp}", WORK / f"app-20000101000001-{stamp}"
    for folder in (old, recent):
        (folder / "0").mkdir(parents=True)
        (folder / "0" / "stderr").write_text("an executor's log\n")
    past = time.time() - ttl - 600
    for path in (old / "0" / "stderr", old / "0", old):
        os.utime(path, (past, past))
    # A job that outlives the worker's first cleanup, which comes one interval after it registered.
    script = tmp_path / "job.py"
    script.write_text("import time\nfrom pyspark import SparkContext\nsc = SparkContext()\n"
                      f"print('sum', sc.parallelize(range(4), 1).sum())\ntime.sleep({interval + 5})\nsc.stop()\n")
    command = spark_submit_command([], "local-cluster[1,1,1024]")
    command[-1] = str(script)
    try:
        done = subprocess.run(command, env=spark_env(), cwd=str(ROOT), capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        assert not old.exists(), "an ended run's folder over the TTL was left"
        assert (recent / "0" / "stderr").is_file()  # within the TTL: a run's logs stay to be read
    finally:
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(recent, ignore_errors=True)
