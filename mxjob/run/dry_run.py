"""``--dry-run``: every check the real run makes before Spark, one image scored on the driver, the plan printed."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import click

from mxjob import tasks
from mxjob.executor.partition import score_partition
from mxjob.inputs import batch_list
from mxjob.model.predictor import Predictor
from mxjob.options.config import JobConfig
from mxjob.outputs import work_prefix
from mxjob.outputs.claim import NO_INPUTS, Completed, WorkloadInputs, claim_workload
from mxjob.planning.sizing import size_run
from mxjob.reporting.record_fields import ABSENT, to_json
from mxjob.reporting.records import Plan, PlanDataset, SummaryExisting
from mxjob.results import part_format


def dry_run(cfg: JobConfig, images: list, classifier: Predictor, client, fingerprint: dict,
            inputs: WorkloadInputs = NO_INPUTS) -> int:
    """Make every check the real run makes before Spark, score one image on the driver's CPU, print the plan.

    Starts no Spark job and leaves nothing behind. The checks: the output may
    be written, and :func:`claim_workload`'s (an existing output, an earlier
    run's progress, a resume with other settings). The plan is one JSON object
    on the last line of standard output: under spark-submit the driver's log
    and MXNet's own messages share that stream, so a script reads the last
    line only: :func:`record_fields.to_json` of a :class:`records.Plan`. ``inputs`` holds the driver check's
    ``--rows-per-file auto`` (a dataset output) and, for ``--skip-existing``, what the dataset holds
    already: ``images`` are then the keys it lacks, and the plan counts both.
    """
    to_score, dataset_plan, found = len(images), None, inputs.existing
    if cfg.output_key:  # preflight.check_before_listing proved the output writable already
        work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
        try:
            planned = claim_workload(cfg, client, work, images, fingerprint, dry=True, inputs=inputs)
            to_score, dataset_plan = len(planned.todo), planned.layout
        except Completed:
            to_score, dataset_plan = 0, None
    cfg, sizing = size_run(cfg, images, to_score)
    # With nothing new (--skip-existing), the sample is the first key listed, in the dataset already.
    first = images if len(images) or found is None else found.sample
    if sizing.first is not None:  # the sample starts at the listing's first key: already scored
        blob, stats = sizing.first
    else:
        job = cfg.job_spec()
        job = replace(job, model=replace(job.model, context="cpu"))
        [(_, _, blob, stats)] = score_partition(0, first[:1], job)
    # Plan every batch as the run would, without writing the plan anywhere: its size is what the run's
    # executors read (a ranged GET each), and planning is the driver's last step before Spark.
    spans = batch_list.write_batches(images, cfg.batch_size, lambda data: None)
    batches = len(spans)
    plan = Plan(
        input=cfg.input_uri, output=cfg.output_uri, output_format=cfg.output_format,
        output_writable=bool(cfg.output_key) or None,
        # keys an earlier run made durable (--resume) are not scored again
        images=len(images) + (found.skipped if found is not None else 0), to_score=to_score,
        batch_size=cfg.batch_size, batch_size_choice=sizing.choice, batches=batches, partitions=batches,
        plan_bytes=sum(spans[-1]) if spans else 0, first_key=first[0][0], last_key=first[-1][0],
        model=classifier.model_summary(), sample=sample_object(blob), sample_seconds=stats.seconds,
        estimate=sizing.estimate,
        dataset=ABSENT if dataset_plan is None else PlanDataset(
            rows_per_file=dataset_plan.rows_per_file, why=dataset_plan.why,
            files=-(-(len(images) - (found.rescored if found is not None else 0)) // dataset_plan.rows_per_file),
            files_kept=len(dataset_plan.keep)),
        existing=ABSENT if found is None else SummaryExisting(**found.entry()),
    )
    # Whatever was logged or printed before ends its line first, so the plan is a line of its own.
    sys.stderr.flush()
    click.echo(json.dumps(to_json(plan), ensure_ascii=False))
    sys.stdout.flush()
    return 0


def sample_object(blob: bytes) -> dict:
    """The scored image's row as its JSON line holds it (its task's view, :meth:`mxjob.tasks.Task.objects`)."""
    batch = part_format.read_part(blob)
    return tasks.of_schema(batch.schema).objects(batch)[0]
