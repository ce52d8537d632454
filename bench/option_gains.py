"""``make bench``'s option rows: what each tuning option and fast path gains end to end.

Each row is the job through spark-submit (as E) with one option at another
setting, beside the job at its defaults, on the same images and model, in
the layout ``make run-local`` runs (one executor on every core: the layout
where forward lanes and the lean reader matter), rounds interleaved so that
a drift of the machine falls on both. A row prints:

- E at the defaults and with the option changed (the median over rounds);
- the default's gain in E over the changed setting (``E_default / E_other - 1``);
- the same for the job's CPU per image while tasks ran (the Python workers,
  the JVMs and the driver; the S3 stand-in left out: S3 spends none of a node's);
- the verdict against :data:`KEEP_AT`: an option or fast path is worth its
  code if its default gains at least that much, or if a user needs it for a
  reason this machine cannot show (:data:`NEEDED`, which says the reason).

The rows run on each model of ``--models``: a fast path's share of an
image's CPU depends on the model's (the lean GET saves about a millisecond
an image: a few percent of ResNet-18's CPU on 2 vCPUs, a quarter of a
ResNet-20's), so a path is kept if it pays on one of them.
"""

from __future__ import annotations

import statistics

from demo.run_local import MASTER

#: The least gain (in E or in CPU per image) that pays for an option's or fast path's code.
KEEP_AT = 0.02

#: ``(row, the other setting, what the default is)``: each against the job's defaults.
VARIANTS = (
    ("forward lanes", ["--forward-lanes", "1"], "the threads in lanes of one forward pass each"),
    ("micro-batches", ["--micro-batch-size", "{batch}"], "16 images per forward pass, the model starting early"),
    ("lean S3 reader", ["--s3-reader", "botocore"], "lean GETs (and listing parser: `make bench-listing`)"),
    ("io threads", ["--io-threads", "4"], "16 downloads at once"),
    ("images in flight", ["--max-in-flight", "32"], "128 images ahead of the model"),
)

#: Options a user needs whatever they gain here, and why.
NEEDED = {
    "io threads": "S3's latency differs by region and object size: a user raises it where 20 ms is not the latency",
    "images in flight": "bounds an executor's memory for large photos: a user lowers it on small nodes",
}


def cpu_ms_per_image(e: dict) -> float:
    """The job's own CPU per image while tasks ran: every role but the S3 stand-in's."""
    return sum(ms for role, ms in e["cpu_ms_per_image"].items() if not role.startswith("S3 stand-in"))


def run(args, stand_in, submit, job, model, images: int) -> dict:
    """Every variant and the defaults, ``args.option_rounds`` interleaved rounds on ``images`` images.

    ``submit(stand_in, job(tag, model, batch, extra, master), work)`` runs the job once (run_bench's).
    """
    limit = ["--limit", str(images)]
    rows = [variant for variant in VARIANTS if variant[0] in args.option_rows]
    runs: dict[str, list[dict]] = {"defaults": []}
    # A first run after the bench's others ran slower than every later one (a cold page cache, the JIT of the
    # JVMs' first classes): it warms the machine, uncounted.
    submit(stand_in, job("option-warm-up", model, args.batch, limit, MASTER), args.work)
    for round_ in range(args.option_rounds):
        for row, setting, _ in (("defaults", [], ""), *rows):
            extra = [part.format(batch=args.batch) for part in setting]
            tag = f"option-{row.replace(' ', '-')}-{round_}"
            e = submit(stand_in, job(tag, model, args.batch, [*limit, *extra], MASTER), args.work)
            runs.setdefault(row, []).append({"E": e["E"], "cpu_ms": cpu_ms_per_image(e), "wall": e["wall_seconds"]})
    return {"images": images, "master": MASTER, "rounds": args.option_rounds, "model": model.name,
            "batch": args.batch, "runs": runs}


def medians(samples: list[dict]) -> dict:
    return {key: statistics.median(s[key] for s in samples) for key in ("E", "cpu_ms", "wall")}


def report(result: dict) -> list[str]:
    """The option table: each variant's E and CPU beside the defaults', the gains and the verdict."""
    base = medians(result["runs"]["defaults"])
    lines = [f"What each tuning option and fast path gains ({result['model']}, {result['images']} images, "
             f"{result['master']}, median of {result['rounds']} interleaved round(s); keep at a gain of "
             f"{KEEP_AT:.0%} or more, or if a user needs it):",
             f"  defaults: E {base['E']:.1f} img/s, {base['cpu_ms']:.1f} ms of CPU per image, "
             f"wall {base['wall']:.1f} s",
             "  | option | default | other setting | E other | gain in E | CPU/image other | gain in CPU | verdict |",
             "  |---|---|---|---:|---:|---:|---:|---|"]
    for row, setting, default in VARIANTS:
        if row not in result["runs"]:
            continue
        other = medians(result["runs"][row])
        gain_e = base["E"] / other["E"] - 1
        gain_cpu = other["cpu_ms"] / base["cpu_ms"] - 1
        verdict = ("keep" if max(gain_e, gain_cpu) >= KEEP_AT
                   else f"keep: {NEEDED[row]}" if row in NEEDED else "remove")
        shown = " ".join(part.format(batch=result["batch"]) for part in setting)
        lines.append(f"  | {row} | {default} | `{shown}` | {other['E']:.1f} | {gain_e:+.1%} | "
                     f"{other['cpu_ms']:.1f} ms | {gain_cpu:+.1%} | {verdict} |")
    return [*lines, ""]
