"""PySpark's worker daemon with a fake, instant scorer: for ``make bench-scale`` only.

``bench/scale.py`` runs the real job with
``--conf spark.python.daemon.module=bench.fake_daemon`` and
``--conf spark.executorEnv.PYTHONPATH=<repo root>``. Each executor then starts
this module (``python -m bench.fake_daemon``) instead of ``pyspark.daemon``:
it imports ``mxjob.executor.partition``, patches it, and runs PySpark's own daemon
(:func:`pyspark.daemon.manager`). The daemon forks the Python workers, so
every worker finds the patched module already in ``sys.modules`` when it
unpickles ``mxjob.executor.partition.score_into``. Nothing in the job's code knows.

What is fake, so that a task costs only what Spark and the job's own code
around the model cost:

- ``partition._fetch_and_decode``: no S3 GET, no decoding; every key gets one
  constant zero array of the job's input shape, instantly;
- ``partition.get_model``: no MXNet; a stand-in that has only ``batch_size``;
- ``partition.score_inputs``: no forward pass; every key gets the row
  ``{"key": KEY, "predictions": [{"class_id": 0, "probability": 1.0}]}``
  (:data:`FAKE_PREDICTIONS`, which the bench looks for in the output to prove
  the fake ran);
- ``model_check.warm_and_check``: the warm-up "loads" the stand-in and
  reports no check, so the driver checks the small real model and measures
  the sample itself (``mxjob.run.warm_up.executors_report``), as it would
  without the executors' check.

Everything else is the job's: ``score_partition`` itself (how a task gets its
keys, its thread pool and prefetching, the S3 client), the per-batch gzip PUT
of the part under ``OUTPUT.parts/``, the task's stats, and the whole driver.
The patches replace module attributes that ``score_partition`` looks up when
it runs, and accept extra arguments, so they keep working when
``score_partition`` changes how a task reads its keys.
"""

from __future__ import annotations

import threading

import numpy as np

from mxjob.core import state
from mxjob.executor import model_check, partition

#: Every key's predictions under the fake scorer (a random-weight model never gives exactly 1.0).
FAKE_PREDICTIONS = [{"class_id": 0, "probability": 1.0}]

_arrays: dict[tuple, np.ndarray] = {}
_models: dict[int, FakeModel] = {}
_lock = threading.Lock()


class FakeModel:
    """What ``score_partition`` asks of its model besides ``score_inputs`` (patched): the bound batch size."""

    def __init__(self, batch_size: int):
        self.batch_size = int(batch_size)
        self.num_classes = 1
        self.labels = None


def _array(shape) -> np.ndarray:
    shape = tuple(int(n) for n in shape)
    array = _arrays.get(shape)
    if array is None:
        array = np.zeros(shape, np.float32)
        array.setflags(write=False)  # one shared array for every key
        _arrays[shape] = array
    return array


def fake_fetch_and_decode(reader, job, handlers, key, size, *args, **kwargs):
    """``(key, array, None, times)`` as the real one returns, without a GET."""
    return key, _array(job.preprocess.input_shape), None, partition.FetchTimes()


def fake_get_model(spec, input_shape, batch_size, *args, **kwargs) -> FakeModel:
    """One :class:`FakeModel` per batch size per worker, counted as a load like the real cache does."""
    with _lock:
        model = _models.get(int(batch_size))
        if model is None:
            model = _models[int(batch_size)] = FakeModel(batch_size)
            state.counters.model_loads += 1
        return model


def fake_score_inputs(model, keys, inputs, job, handlers, out) -> None:
    """Every key's row carries :data:`FAKE_PREDICTIONS` (``partition.score_inputs`` without a forward pass)."""
    entries = [{"label": None, **p} for p in FAKE_PREDICTIONS]
    for key in keys:
        out.add(key, entries)


def fake_warm_and_check(index, tasks, job, *args, **kwargs) -> model_check.WarmReport:
    """The warm-up's task with the stand-in model: loaded, but no check and no sample for the driver."""
    partition.warm_worker(index, job)
    return model_check.WarmReport(index, state.counters.model_loads)


def patch(module=partition, checks=model_check) -> None:
    module._fetch_and_decode = fake_fetch_and_decode
    module.get_model = fake_get_model
    module.score_inputs = fake_score_inputs
    checks.warm_and_check = fake_warm_and_check


if __name__ == "__main__":
    # Only as the daemon: importing this module (bench/scale.py reads FAKE_PREDICTIONS) patches nothing.
    patch()
    from pyspark.daemon import manager

    manager()
