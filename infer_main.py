"""Score every image under an S3 prefix with an MXNet model on Spark: top-k labels, vectors or boxes, to S3.

Build the ``--py-files`` zip once (``make package``: ``dist/mxinfer_job.zip``
holds ``mxinfer.py``, ``utils.py`` and the ``mxjob`` package), then run it on a
cluster (EMR/YARN) with::

    spark-submit --master yarn --deploy-mode cluster \\
        --conf spark.executor.cores=1 --conf spark.dynamicAllocation.enabled=false \\
        --py-files dist/mxinfer_job.zip infer_main.py \\
        --input s3://my-bucket/photos/ \\
        --model s3://my-bucket/models/resnet-18 \\
        --output s3://my-bucket/predictions/photos.jsonl

or with the original article's flags::

    spark-submit --py-files dist/mxinfer_job.zip infer_main.py \\
        --sym_url s3://B/resnet-18-symbol.json --param_url s3://B/resnet-18-0000.params \\
        --label_url s3://B/synset.txt --batch 64 --bucket B --prefix cifar10/test \\
        --output_s3_bucket B --output_s3_key predictions.jsonl

This file only wires: it reads the options and the YAML once into a
:class:`mxjob.options.config.JobConfig`, runs :func:`mxjob.run.driver.run_job`, and turns
what ends the run into an exit code and one line for the user. The run itself:
the driver lists the keys, writes the run's plan (whole batches, the last one
short) to the work prefix beside the output, and runs one Spark partition per
batch; executors (``spark.executor.cores=1``: MXNet uses the node's cores
itself) read their batch's keys from the plan, download, decode and score them
and write their lines to S3 (:func:`mxjob.executor.partition.score_partition`); the
driver then merges every line into the output in key order, each key once
(:func:`mxjob.outputs.merge.assemble`), and writes a summary next to it. Exit codes:
0 done, 1 failed, 2 usage error, 3 done but more failed images than
``--max-errors`` allows.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace

import click
from click.core import ParameterSource

from mxjob import tasks
from mxjob.core import secrets
from mxjob.core.errors import EXIT_FAILED, JobError
from mxjob.options import config
from mxjob.options.config import JobConfig, load_yaml, merge_settings, resolve
from mxjob.run import rerun, signals
from mxjob.run.cluster import satisfy_application_master
from mxjob.run.driver import run_job
from mxjob.run.scoring import durable_status
from mxjob.run.signals import Interrupted

log = logging.getLogger("infer_main")  # not __name__: spark-submit runs this file as __main__

#: How often the driver looks whether spark-submit's JVM, its parent, is still there (_Console.watch_parent).
PARENT_POLL_SECONDS = 0.5
#: How long the driver then leaves a Spark call to notice the JVM's end by itself before it stops the run.
PARENT_GRACE_SECONDS = 2.0


class _Console:
    """Where the last word of a run that did not finish goes, even if spark-submit's JVM is gone.

    In client mode spark-submit's JVM starts this driver and copies its output
    to the JVM's own. Ctrl-C or a SIGTERM to the process group reaches the
    JVM too, and it may exit before it copies the one line that says how to
    resume. So when the parent is a JVM, its stderr is opened at start
    (``/proc/PPID/fd/2``, append-only, so it outlives the JVM) and that line
    goes there once the JVM is gone or going.
    """

    def __init__(self):
        self.parent, self.fd = os.getppid(), None
        # Read now: once the JVM is gone, its command line (the resume command's spark options) is too.
        self.jvm_cmdline = rerun.parent_jvm_cmdline()
        try:
            with open(f"/proc/{self.parent}/cmdline", "rb") as handle:
                if b"java" in handle.read().split(b"\0", 1)[0]:
                    self.fd = os.open(f"/proc/{self.parent}/fd/2", os.O_WRONLY | os.O_APPEND)
        except OSError:  # not Linux, not a JVM parent, or its stderr cannot be opened: use ours
            self.fd = None

    def watch_parent(self) -> None:
        """Stop the run as interrupted once spark-submit's JVM is gone (a SIGTERM or Ctrl-C to it alone).

        Once Spark runs a job, the JVM's shutdown hook stops the SparkContext
        and the driver hears of it (:data:`mxjob.run.signals.JVM_SHUTDOWN`).
        While the driver lists or checks the model it makes no Spark call, and
        would go on to fail at its next one. A daemon thread polls the parent
        (there is no portable notice of a parent's death) and sends this
        process the SIGTERM the JVM's end amounts to.
        """
        if self.fd is None:
            return

        def watch():
            while os.getppid() == self.parent:
                time.sleep(PARENT_POLL_SECONDS)
            # A Spark call in flight fails at once and ends the run its own way, saying what is durable.
            time.sleep(PARENT_GRACE_SECONDS)
            if not (signals.received or signals.ending.is_set()):  # nothing else is ending the run
                signals.interrupt_self(signals.JVM_SHUTDOWN)

        threading.Thread(target=watch, name="watch-spark-submit-jvm", daemon=True).start()

    def say(self, line: str, parent_going: bool = False) -> None:
        """Print ``line`` once, credentials masked, where the user sees it: through the JVM while it lives, else
        straight."""
        line = secrets.redact(line)
        if self.fd is not None and (parent_going or os.getppid() != self.parent):
            try:
                os.write(self.fd, (line + "\n").encode("utf-8", "replace"))
                return
            except OSError:
                pass
        click.echo(line, err=True)


def resume_command(argv: Sequence[str], jvm_cmdline: Sequence[str] | None = None) -> str:
    """The command line that resumes this run: the same spark-submit options and arguments, ``--overwrite``
    dropped, ``--resume`` added (:func:`mxjob.run.rerun.resume_command`)."""
    return rerun.resume_command(argv, jvm_cmdline, os.getcwd())


#: ``--help``'s text above the options; ``{tasks}`` is one line per task (:func:`help_text`).
HELP = """Score every image under an S3 prefix (or in a manifest) with an MXNet model on Spark, into S3.

One result per image, errors included, sorted by key. The task (--task):

\b
{tasks}

The output (--output), with a summary beside it (KEY.summary.json, PREFIX/_summary.json):

\b
  s3://BUCKET/KEY.jsonl       JSON Lines, one line per image (KEY.jsonl.gz: gzipped)
  s3://BUCKET/KEY.parquet     one Parquet object (a key with no suffix: --output-format parquet)
  s3://BUCKET/PREFIX/         a Parquet dataset: part files that appear as the job runs

Credentials come from boto3's default chain (the instance role on EMR);
no option takes AWS keys.
"""


def help_text() -> str:
    """:data:`HELP` with each registered task (:mod:`mxjob.tasks`) on a line of its own, the default marked."""
    default = config.DEFAULTS["task"]
    return HELP.format(tasks="\n".join(f"  {t.name:<9} {t.summary}{'; the default' if t.name == default else ''}"
                                        for t in map(tasks.get, tasks.names())))


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100,
                                 "show_default": True}, params=config.OPTIONS, help=help_text())
def main(config_uri, **values):
    """The job's command line (:data:`HELP`): read the options and the YAML once, run the job, exit with its code."""
    cfg, settings = read_job(click.get_current_context(), config_uri, values)
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    secrets.guard_logging(logging.getLogger().level)
    for note in settings.notes:  # made before the log had its level
        log.info("%s", note)
    console = _Console()
    previous = {sig: signal.signal(sig, signals.raise_interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    console.watch_parent()
    try:
        code = run_job(cfg, resume_command=resume_command(sys.argv, console.jvm_cmdline))
    except Interrupted as exc:
        _exit_interrupted(exc, cfg, console)
    except JobError as exc:
        if signals.received:  # the JVM failed first, because it was signalled too
            interrupted = Interrupted(signals.received[0])
            interrupted.work = getattr(exc, "work", None)
            _exit_interrupted(interrupted, cfg, console)
        work = getattr(exc, "work", None)
        status = durable_status(work) if work is not None else ""
        hint = (f" ({status}; once the cause is fixed, resume with: {resume_command(sys.argv, console.jvm_cmdline)})"
                if status else "")
        log.debug("failed here", exc_info=True)
        # Once, as click prints a usage error: not also as an ERROR log line
        # (under spark-submit both land in the same stream).
        console.say(f"Error: {exc}{hint}")
        sys.exit(EXIT_FAILED)
    finally:
        for sig, handler in previous.items():  # main() may run inside a test or a notebook
            signal.signal(sig, handler)
    if code == 0:
        satisfy_application_master()  # in cluster mode, a run that needed no Spark job must still start Spark
    sys.exit(code)


def read_job(ctx: click.Context, config_uri: str | None, values: dict):
    """The options given (command line and environment) and the YAML, read once: the job's config and settings."""
    given = {k: v for k, v in values.items()
             if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    yaml_settings = (load_yaml(config_uri, given.get("endpoint_url"), given.get("region"), given.get("s3_max_attempts"))
                     if config_uri else {})
    # The plug-ins first: their tasks and outputs are what --task and --output are checked against.
    plugin_files = config.load_plugins(given, yaml_settings, config_uri or "--config")
    settings = merge_settings(given, yaml_settings, config_uri or "--config")
    return replace(resolve(settings), plugin_files=plugin_files), settings


def check(argv: Sequence[str]) -> None:
    """Read ``argv`` and its ``--config`` (from S3 too) as :func:`main` does, and stop: exit 2 with click's
    message on a usage error, else 0. ``make submit-yarn`` runs it before YARN starts anything, so that
    a missing config or a bad option is one line in seconds, not an application's two failed attempts."""
    try:
        with main.make_context("infer_main.py", list(argv)) as ctx:
            values = dict(ctx.params)
            read_job(ctx, values.pop("config_uri"), values)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


def _exit_interrupted(exc: Interrupted, cfg: JobConfig, console: _Console):
    """One line, not Py4J's and the JVM's stacks: what happened, what is kept, what to run; exit 128+N."""
    status = durable_status(getattr(exc, "work", None))
    console.say(f"Interrupted by {exc}: {status + '; ' if status else ''}nothing was written to "
                f"{cfg.output_uri}. Resume with: {resume_command(sys.argv, console.jvm_cmdline)}", parent_going=True)
    log.debug("interrupted here", exc_info=True)
    sys.exit(128 + exc.signum)


if __name__ == "__main__":
    main()
