"""``make bench BENCH_ARGS='--tasks embed,detect'``: the three tasks beside each other, same images, same backbone.

Rows, each the job through spark-submit on the bench's images (as E):

- ``classify``, JSON Lines (the bench's own E row) and Parquet;
- ``embed``: the default output layer (ResNet-18's ``flatten``, 512 values)
  as float32 and float16 Parquet, and float32 JSON Lines;
- ``detect``: ResNet-18's features with an SSD-style head
  (:func:`bench.models.export_detector`), Parquet; its own L too, since its
  forward pass is ResNet-18's plus the head.

Each row prints E, E against classify's E in the same format (embed must not
be slower than classify by more than :data:`EMBED_SLOWER_AT_MOST`), and the
output's bytes per image.
"""

from __future__ import annotations

import os

from bench import models as bench_models

#: ``embed``'s E may be at most this much below ``classify``'s (same model, images and format).
EMBED_SLOWER_AT_MOST = 0.05

#: ``(row, task arguments, output suffix, the classify row it is compared with)``.
ROWS = (
    ("classify parquet", ["--task", "classify"], ".parquet", None),
    ("embed float32 parquet", ["--task", "embed"], ".parquet", "classify parquet"),
    ("embed float16 parquet", ["--task", "embed", "--embedding-dtype", "float16"], ".parquet", "classify parquet"),
    ("embed float32 jsonl", ["--task", "embed"], ".jsonl", "classify jsonl"),
    ("detect parquet", ["--task", "detect"], ".parquet", "classify parquet"),
)


def row_figures(e: dict, images: int) -> dict:
    """What a row prints from its E run: images/s, output bytes per image, the vector length."""
    model = e["summary"].get("model") or {}
    outputs = list((model.get("outputs") or {}).values())
    length = 1
    for axis in outputs[0] if outputs else ():
        length *= axis
    embed = e["summary"].get("options", {}).get("task") == "embed"
    return {"E": e["E"], "E_steady": e["E_steady"], "bytes_per_image": e["output_bytes"] / images,
            "values": length if outputs and embed else None}


def verdict(name: str, e: float, against: float | None) -> str:
    """``E / E_classify`` and, for embed, PASS or FAIL against :data:`EMBED_SLOWER_AT_MOST`."""
    if against is None or not against:
        return "-"
    ratio = e / against
    if not name.startswith("embed"):
        return f"{ratio:.2f}"
    return f"{ratio:.2f} ({'PASS' if ratio >= 1 - EMBED_SLOWER_AT_MOST else 'FAIL'}: at least " \
           f"{1 - EMBED_SLOWER_AT_MOST:.2f})"


def run(args, s3, proxy, moto, submit, probe, model_rows: dict, paths: list, work) -> dict:
    """The task rows on ResNet-18, beside its classify E (JSON Lines) from ``model_rows`` (the bench's rows)."""
    from bench.run_bench import BUCKET, log

    model = bench_models.RESNET18
    if model.name not in model_rows:
        raise SystemExit("--tasks compares the tasks on ResNet-18: give --models resnet18")
    images = len(paths)
    rows = {"classify jsonl": row_figures(model_rows[model.name]["E"], images)}
    detector = bench_models.export_detector(work / "models")
    for suffix in ("-symbol.json", "-0000.params"):
        path = detector.with_name(detector.name + suffix)
        s3.put_object(Bucket=BUCKET, Key=f"models/detector/{path.name}", Body=path.read_bytes())
    s3.put_object(Bucket=BUCKET, Key="models/detector/synset.txt",
                  Body=detector.with_name("synset.txt").read_bytes())
    for name, task_args, suffix, _ in ROWS:
        detect = name.startswith("detect")
        tag = "T-" + name.replace(" ", "-")
        log(f"tasks: {name} (E, spark-submit, {args.master})")
        e = submit(s3, proxy.endpoint, model, tag, args.batch, work, args.master, [*args.job_args, *task_args],
                   moto, args.spark_conf, suffix=suffix,
                   model_key=f"models/detector/{bench_models.DETECTOR.name}" if detect else None)
        rows[name] = row_figures(e, images)
        log(f"tasks:   {rows[name]['E']:.1f} images/s, {rows[name]['bytes_per_image']:.0f} bytes per image")
    log("tasks: the detector's L (forward only)")
    rows["detect parquet"]["L"] = probe(["limit", "--model", str(detector), "--shape", model.shape_arg,
                                         "--batch", str(args.batch), "--seconds", str(args.limit_seconds),
                                         *map(str, paths[: 2 * args.batch])], os.cpu_count() or 1)["images_per_second"]
    return rows


def report(rows: dict, classify_l: float | None) -> list[str]:
    """The task rows as a table, each against its classify row."""
    out = ["", "Tasks, ResNet-18 backbone, same images (E through spark-submit; bytes: the output object / images):",
           "| task and output | E img/s | E steady | E / classify's E (same format) | L img/s | vector length "
           "| output bytes per image |", "|---|---:|---:|---:|---:|---:|---:|"]
    compared = {name: against for name, _, _, against in ROWS}
    for name, row in rows.items():
        against = rows.get(compared.get(name) or "", {}).get("E")
        lim = row.get("L", classify_l if name.startswith(("classify", "embed")) else None)
        out.append(f"| {name} | {row['E']:.1f} | {(row['E_steady'] or 0):.1f} | {verdict(name, row['E'], against)} "
                   f"| {'' if lim is None else f'{lim:.1f}'} | {row['values'] or ''} "
                   f"| {row['bytes_per_image']:,.0f} |")
    out.append("(embed and classify share ResNet-18's forward pass up to its last layer, so their L is the same; "
               "detect's L is its own)")
    return out
