"""Device choice: ``cpu``, ``gpu`` or ``gpu:N``, one grammar for the CLI, the UDF and each task."""

from __future__ import annotations

from collections.abc import Mapping

from mxjob.core import state


def parse_context(name: str) -> tuple[str, int | None]:
    """``"cpu"`` -> ``("cpu", None)``, ``"gpu"`` -> ``("gpu", None)``, ``"gpu:3"`` -> ``("gpu", 3)``.

    The one grammar of a device name: the command line, the UDF, each task
    and :func:`mx_context` all read it through here. Anything else raises
    ``ValueError``.
    """
    kind, colon, index = str(name).partition(":")
    if kind in ("cpu", "gpu") and not colon:
        return kind, None
    if kind == "gpu" and index.isdigit():
        return "gpu", int(index)
    raise ValueError(f"context must be cpu, gpu or gpu:N, got {name!r}")


def mx_context(name: str):
    """``cpu``, ``gpu`` or ``gpu:N`` to an MXNet context (plain ``gpu`` is GPU 0)."""
    import mxnet as mx

    kind, index = parse_context(name)
    return mx.cpu() if kind == "cpu" else mx.gpu(index or 0)


def choose_context(requested: str, resources: Mapping | None, partition_index: int, num_gpus: int) -> str:
    """The device one Spark task should run the model on, as ``"cpu"`` or ``"gpu:N"``.

    Pure: the caller passes what Spark and MXNet report (see :func:`task_context`).

    Parameters
    ----------
    requested : str
        ``"cpu"``; ``"gpu:N"`` pins GPU N; ``"gpu"`` picks one for this task.
    resources : mapping or None
        The task's Spark resources, ``TaskContext.get().resources()``: a name
        to an object with ``addresses``. With GPU scheduling on
        (``spark.task.resource.gpu.amount``) Spark names this task's GPU there.
    partition_index : int
        Spreads partitions over the visible GPUs when Spark assigned none.
    num_gpus : int
        GPUs this process sees (``mx.context.num_gpus()``).

    Returns
    -------
    str
        ``"cpu"`` or ``"gpu:N"``: the GPU Spark assigned, else
        ``partition_index % num_gpus``.

    Raises
    ------
    ValueError
        A malformed ``requested``, or ``"gpu"`` with no GPU assigned or visible.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> choose_context("gpu", {"gpu": SimpleNamespace(addresses=["3"])}, 0, 4)
    'gpu:3'
    >>> choose_context("gpu", {}, 6, 4)
    'gpu:2'
    """
    kind, index = parse_context(requested)
    if kind == "cpu":
        return "cpu"
    if index is not None:
        return f"gpu:{index}"
    gpu = (resources or {}).get("gpu")
    addresses = list(getattr(gpu, "addresses", None) or [])
    if addresses:
        if not str(addresses[0]).isdigit():
            raise ValueError(f"Spark assigned GPU address {addresses[0]!r}; expected a device number")
        return f"gpu:{int(addresses[0])}"
    if num_gpus > 0:
        return f"gpu:{partition_index % num_gpus}"
    raise ValueError("context gpu: Spark assigned this task no GPU and this process sees none; set "
                     "spark.executor.resource.gpu.amount and spark.task.resource.gpu.amount, or use context cpu")


def task_context(requested: str, partition_index: int | None = None) -> str:
    """:func:`choose_context` for the running task: its Spark resources and the visible GPUs.

    ``partition_index`` defaults to the task's partition (0 outside Spark).
    Asks MXNet for the GPU count only when ``requested`` is plain ``"gpu"``.
    """
    if str(requested) != "gpu":
        return choose_context(requested, None, 0, 0)
    import mxnet as mx

    task = state.spark_task()
    resources = task.resources() if task is not None else {}
    if partition_index is None:
        partition_index = task.partitionId() if task is not None else 0
    return choose_context(requested, resources, partition_index, mx.context.num_gpus())
