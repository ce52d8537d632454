"""An executor's YARN container: its memory limit from the Spark settings, the workers' peak beside it, and what
to change when YARN kills one for outgrowing it.

On YARN each executor runs in a container of ``spark.executor.memory`` (the
JVM's heap) + ``spark.executor.memoryOverhead`` (everything else: the JVM's own
memory and the Python workers, which hold the model and the decoded batches)
+ ``spark.executor.pyspark.memory``, and the NodeManager kills the container
when its processes' resident memory passes that sum: the most common EMR
PySpark failure. Spark's own message names the overhead setting but not by
how much to raise it, nor what the workers needed; this module's do.
"""

from __future__ import annotations

import dataclasses
import math
import re

from mxjob.model.worker import memory_bytes

MIB = 1 << 20

#: Spark's overhead when ``spark.executor.memoryOverhead`` is not set: this share of the heap, at least 384 MiB.
DEFAULT_OVERHEAD_FACTOR, MIN_OVERHEAD_MIB = 0.10, 384

#: The reason YARN gives (through Spark's ExecutorLostFailure) for a container it killed for its memory.
KILLED = re.compile(r"Container killed by YARN for exceeding (?:physical )?memory limits?\.\s*"
                    r"(?P<used>[\d.]+ [KMGT]?B) of (?P<limit>[\d.]+ [KMGT]?B) physical memory used")

_SIZE = re.compile(r"^\s*(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>[kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNIT_MIB = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 ** 2, "p": 1024 ** 3}


def size_mib(text: str) -> float:
    """A Spark memory setting (``"4g"``, ``"1536m"``, ``"512"``: MiB when no unit) or YARN's ``"1.0 GB"``, in MiB."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a memory size: {text!r}")
    return float(match["value"]) * _UNIT_MIB[(match["unit"] or "m").lower()]


@dataclasses.dataclass(frozen=True)
class ExecutorContainer:
    """What YARN gives each executor, in MiB: the JVM's heap, the overhead, PySpark's own share; their sum."""

    memory_mib: int
    overhead_mib: int
    pyspark_mib: int
    #: Whether ``spark.executor.memoryOverhead`` was set (else Spark's default, 10% of the heap, at least 384 MiB).
    overhead_set: bool

    @property
    def limit_mib(self) -> int:
        return self.memory_mib + self.overhead_mib + self.pyspark_mib

    @classmethod
    def from_conf(cls, conf: dict[str, str]) -> ExecutorContainer | None:
        """From the job's Spark settings; ``None`` off YARN, where no container limit applies."""
        if not str(conf.get("spark.master", "")).startswith("yarn"):
            return None
        memory = size_mib(conf.get("spark.executor.memory", "1g"))
        overhead_text = conf.get("spark.executor.memoryOverhead")
        if overhead_text:
            overhead = size_mib(overhead_text)
        else:
            factor = float(conf.get("spark.executor.memoryOverheadFactor", DEFAULT_OVERHEAD_FACTOR))
            overhead = max(factor * memory, MIN_OVERHEAD_MIB)
        pyspark = size_mib(conf["spark.executor.pyspark.memory"]) if conf.get("spark.executor.pyspark.memory") else 0
        return cls(int(memory), int(overhead), int(pyspark), bool(overhead_text))

    def describe(self) -> str:
        parts = [f"spark.executor.memory {self.memory_mib} MiB",
                 f"spark.executor.memoryOverhead {self.overhead_mib} MiB"
                 + ("" if self.overhead_set else " (Spark's default: 10% of the heap, at least 384 MiB)")]
        if self.pyspark_mib:
            parts.append(f"spark.executor.pyspark.memory {self.pyspark_mib} MiB")
        return f"{self.limit_mib} MiB ({' + '.join(parts)})"


def workers_peak_mib(workers: dict) -> float | None:
    """The highest peak RSS of the Python workers whose tasks finished (``StatsFold.workers``), in MiB."""
    peaks = [w["max_rss"] for w in workers.values() if w.get("max_rss")]
    return max(peaks) / MIB if peaks else None


def fit(container: ExecutorContainer, workers: dict) -> dict:
    """The summary's ``executor_container``: the limit, the workers' peak and its share of the limit."""
    peak = workers_peak_mib(workers)
    return {"limit_mib": container.limit_mib, "memory_mib": container.memory_mib,
            "memory_overhead_mib": container.overhead_mib, "pyspark_memory_mib": container.pyspark_mib,
            "python_worker_peak_rss_mib": round(peak, 1) if peak else None,
            "python_worker_peak_share_of_limit": round(peak / container.limit_mib, 3) if peak else None}


#: What the executor's JVM may hold beyond its heap (metaspace, threads, buffers), for the overhead suggested.
JVM_BEYOND_HEAP_MIB = 256


def suggested_overhead_mib(container: ExecutorContainer, used_mib: float, worker_peak_mib: float | None) -> int:
    """An overhead with a quarter of headroom, in whole 256 MiB: over what the killed container had reached,
    and over a worker's measured peak beside a full JVM (the kill cuts the container's growth short)."""
    needed = max(used_mib, (worker_peak_mib or 0) + container.memory_mib + JVM_BEYOND_HEAP_MIB) * 1.25
    needed -= container.memory_mib + container.pyspark_mib
    return max(container.overhead_mib * 2, int(math.ceil(needed / 256) * 256))


def driver_peak_mib() -> float | None:
    """The driver's peak resident memory so far in MiB (``None`` where not measured): the model it loaded for its
    check stands for a worker's when no task finished (:func:`killed_message`)."""
    peak = memory_bytes()["max_rss"]
    return peak / MIB if peak else None


def killed_message(reason: str, container: ExecutorContainer | None, workers: dict,
                   driver_peak_mib: float | None) -> str | None:
    """What to change when ``reason`` (the Spark job's failure) is YARN killing an executor for its memory; else None.

    Names the container's limit and what it is made of, the Python workers'
    measured peak (or, when no task finished, the driver's, which loaded the
    same model for its check), and the overhead to set.
    """
    match = KILLED.search(reason)
    if match is None:
        return None
    used = size_mib(match["used"])
    lines = [f"YARN killed an executor's container for exceeding its memory limit ({match['used']} used of "
             f"{match['limit']}), as often as Spark retried the batch."]
    if container is not None:
        lines.append(f"Each executor's container is {container.describe()}.")
    peak = measured = workers_peak_mib(workers)
    if peak is not None:
        lines.append(f"The Python workers' measured peak RSS was {peak:,.0f} MiB (in the tasks that finished); the "
                     "executor's JVM and the worker's daemon take their share of the same limit.")
    elif driver_peak_mib is not None:
        lines.append(f"No task finished to measure a worker; the driver, which loaded the same model for its check, "
                     f"peaked at {driver_peak_mib:,.0f} MiB.")
        measured = driver_peak_mib
    if container is not None:
        suggested = suggested_overhead_mib(container, used, measured)
        lines.append(f"Raise spark.executor.memoryOverhead to {suggested}m or more "
                     "(conf/emr.yaml's spark-defaults, or --conf on spark-submit), or lower --batch-size or "
                     "--forward-lanes (each lane holds a bound copy of the model).")
    else:
        lines.append("Raise spark.executor.memoryOverhead, or lower --batch-size or --forward-lanes.")
    return " ".join(lines)
