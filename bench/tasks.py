"""``make bench BENCH_ARGS='--tasks embed,detect'``: the three tasks beside each other, same images, same backbone.

The backbone is the first model of ``--models`` (ResNet-18 by default;
``--models resnet20`` makes a quick smoke run). Rows, each the job through
spark-submit on the bench's images (as E):

- ``classify``, JSON Lines (the bench's own E row) and Parquet;
- ``embed`` (``--tasks embed``): the default output layer (ResNet-18's
  ``flatten``, 512 values) as float32 and float16 Parquet, and float32 JSON Lines;
- ``detect`` (``--tasks detect``): the backbone's features with an SSD-style
  head (:func:`bench.models.export_detector`), Parquet; its own L too, since
  its forward pass is the backbone's plus the head.

Each row prints E, E against classify's E in the same format (embed must not
be slower than classify by more than :data:`EMBED_SLOWER_AT_MOST`), L where
the forward pass is known, the vector length and the output's bytes per image
(the output object's size over the images).
"""

from __future__ import annotations

import math
import os

from bench import models as bench_models

#: ``embed``'s E may be at most this much below ``classify``'s (same model, images and format).
EMBED_SLOWER_AT_MOST = 0.05

#: The tasks ``--tasks`` may name; classify always runs (the others are compared with it).
TASKS = ("embed", "detect")

#: ``(row, task arguments, output suffix, the classify row it is compared with)``.
ROWS = (
    ("classify parquet", ["--task", "classify"], ".parquet", None),
    ("embed float32 parquet", ["--task", "embed"], ".parquet", "classify parquet"),
    ("embed float16 parquet", ["--task", "embed", "--embedding-dtype", "float16"], ".parquet", "classify parquet"),
    ("embed float32 jsonl", ["--task", "embed"], ".jsonl", "classify jsonl"),
    ("detect parquet", ["--task", "detect"], ".parquet", "classify parquet"),
)


def parse_tasks(text: str) -> tuple[str, ...]:
    """``"embed,detect"`` as ``("embed", "detect")``; ``""`` as ``()``.

    Raises
    ------
    ValueError
        For a name not in :data:`TASKS`, saying which are.
    """
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in TASKS]
    if unknown:
        raise ValueError(f"--tasks takes {', '.join(TASKS)} (comma-separated), not {', '.join(unknown)}")
    return names


def rows_for(tasks: tuple[str, ...]) -> list[tuple]:
    """The :data:`ROWS` that ``tasks`` ask for: classify's Parquet row (the one they compare with) and theirs."""
    return [row for row in ROWS if row[0].split()[0] in ("classify", *tasks)] if tasks else []


def row_figures(e: dict, images: int) -> dict:
    """What a row prints from its E run: images/s, output bytes per image, the vector length (embed only)."""
    model = e["summary"].get("model") or {}
    outputs = list((model.get("outputs") or {}).values())
    embed = e["summary"].get("options", {}).get("task") == "embed"
    return {"E": e["E"], "E_steady": e["E_steady"], "bytes_per_image": e["output_bytes"] / images,
            "values": math.prod(outputs[0]) if outputs and embed else None}


def verdict(name: str, e: float, against: float | None) -> str:
    """``E / E_classify`` and, for embed, PASS or FAIL against :data:`EMBED_SLOWER_AT_MOST`."""
    if against is None or not against:
        return "-"
    ratio = e / against
    if not name.startswith("embed"):
        return f"{ratio:.2f}"
    return f"{ratio:.2f} ({'PASS' if ratio >= 1 - EMBED_SLOWER_AT_MOST else 'FAIL'}: at least " \
           f"{1 - EMBED_SLOWER_AT_MOST:.2f})"


def run(args, stand_in, submit, probe, model_rows: dict, paths: list, work) -> dict:
    """The rows of ``args.tasks`` on the first of ``args.models``, beside its classify E (JSON Lines) in ``model_rows``.

    ``stand_in`` (a ``bench.run_bench.StandIn``), ``submit`` and ``probe`` are
    ``bench.run_bench``'s; the result is what :func:`report` prints:
    ``{"model", "description", "images", "rows"}``.
    """
    from bench.run_bench import BUCKET, BenchJob, log

    model = bench_models.MODELS[args.models[0]]
    images = len(paths)
    rows = {"classify jsonl": row_figures(model_rows[model.name]["E"], images)}
    chosen = rows_for(args.tasks)
    detector = None
    if "detect" in args.tasks:
        detector = bench_models.export_detector(work / "models", model)
        for path in sorted(detector.parent.iterdir()):  # NAME-symbol.json, NAME-0000.params, synset.txt
            stand_in.s3.put_object(Bucket=BUCKET, Key=f"models/detector/{path.name}", Body=path.read_bytes())
    for name, task_args, suffix, _ in chosen:
        tag = "T-" + name.replace(" ", "-")
        log(f"tasks: {name} on {model.name} (E, spark-submit, {args.master})")
        e = submit(stand_in, BenchJob(tag, model, args.batch, [*args.job_args, *task_args], args.master,
                                      args.spark_conf, suffix=suffix,
                                      model_key=f"models/detector/{detector.name}" if name.startswith("detect")
                                      else None), work)
        rows[name] = row_figures(e, images)
        log(f"tasks:   {rows[name]['E']:.1f} images/s, {rows[name]['bytes_per_image']:.0f} bytes per image")
    if detector is not None:
        log("tasks: the detector's L (forward only)")
        rows["detect parquet"]["L"] = probe(["limit", "--model", str(detector), "--shape", model.shape_arg,
                                             "--batch", str(args.batch), "--seconds", str(args.limit_seconds),
                                             *map(str, paths[: 2 * args.batch])],
                                            os.cpu_count() or 1)["images_per_second"]
    return {"model": model.name, "description": model.description, "images": images, "rows": rows}


def forward_cost(detect_l: float | None, classify_l: float | None) -> str:
    """How the detector's forward pass compares with the classifier's: L against L, and ms per image more."""
    if not detect_l or not classify_l:
        return "detect's L: not measured"
    more = 1000 / detect_l - 1000 / classify_l
    return (f"detect's forward pass (its own L, {detect_l:.1f} images/s) runs at {detect_l / classify_l:.2f}x "
            f"classify's L ({classify_l:.1f}): the SSD head and MultiBoxDetection cost {more:+.2f} ms per image "
            f"(forward passes on every core)")


def report(tasks: dict, classify_l: float | None, cpu: str) -> list[str]:
    """The task rows (:func:`run`'s result) as a table, each against its classify row, with the CPU they ran on."""
    rows = tasks["rows"]
    out = ["", f"Tasks on {tasks['description']}, the same {tasks['images']} images, on {cpu} "
           "(E through spark-submit; bytes: the output object / images):",
           "| task and output | E img/s | E steady | E / classify's E (same format) | L img/s | vector length D "
           "| output bytes per image |", "|---|---:|---:|---:|---:|---:|---:|"]
    compared = {name: against for name, _, _, against in ROWS}
    for name, row in rows.items():
        against = rows.get(compared.get(name) or "", {}).get("E")
        lim = row.get("L", classify_l if name.startswith(("classify", "embed")) else None)
        steady = "-" if row["E_steady"] is None else f"{row['E_steady']:.1f}"  # None: no task after the first
        out.append(f"| {name} | {row['E']:.1f} | {steady} | {verdict(name, row['E'], against)} "
                   f"| {'' if lim is None else f'{lim:.1f}'} | {row['values'] or ''} "
                   f"| {row['bytes_per_image']:,.0f} |")
    out.append("(embed and classify share the backbone's forward pass up to its last layer, so their L is the same; "
               "detect's L is its own)")
    if "detect parquet" in rows:
        out.append(forward_cost(rows["detect parquet"].get("L"), classify_l))
    return out
