"""An Apache Iceberg table: ``--output iceberg://CATALOG/NAMESPACE.TABLE``, created when absent, its files committed
exactly once.

:class:`IcebergOutput` is what the run asks; what it does with pyiceberg is
in :mod:`mxjob.outputs.iceberg_run` (the run's side: the home beside the
table, resumes, the sink and its commits) and
:mod:`mxjob.outputs.iceberg_catalog` (the catalog and the table), imported
only for a table output: this module parses the URI at the command line's
edge without pyiceberg (about half a second of imports).
"""

from __future__ import annotations

import logging
from typing import ClassVar

from mxjob.core.constants import ICEBERG_SCHEME as SCHEME
from mxjob.outputs import dataset
from mxjob.outputs.base import LayoutInputs, Output, OutputError, side_key
from mxjob.s3 import uris

log = logging.getLogger(__name__)

#: What an output URI naming a table looks like, for messages.
URI_FORM = "iceberg://CATALOG/NAMESPACE.TABLE"


class TableUriError(ValueError):
    """An ``iceberg://`` URI that does not name a catalog, a namespace and a table."""


def parse_table_uri(uri: str) -> tuple[str, str, str]:
    """Split ``iceberg://CATALOG/NAMESPACE.TABLE`` into its catalog, namespace and table.

    Parameters
    ----------
    uri : str
        The output URI. The table's name is what follows the last dot, so a
        nested namespace is written ``iceberg://CATALOG/A.B.TABLE``.

    Returns
    -------
    tuple of str
        ``(catalog, namespace, table)``.

    Raises
    ------
    TableUriError
        A ``ValueError`` saying what is missing and what to write instead.

    Examples
    --------
    >>> parse_table_uri("iceberg://glue/analytics.predictions")
    ('glue', 'analytics', 'predictions')
    """
    if not uri.startswith(SCHEME):
        raise TableUriError(f"{uri!r} is not an Iceberg table URI; expected {URI_FORM}")
    rest = uri[len(SCHEME):]
    catalog, _, identifier = rest.partition("/")
    if not catalog:
        raise TableUriError(f"{uri!r} names no catalog; expected {URI_FORM}, CATALOG being the name of a "
                            "pyiceberg catalog (.pyiceberg.yaml, or PYICEBERG_CATALOG__<NAME>__URI)")
    if not identifier:
        raise TableUriError(f"{uri!r} names no table; expected {SCHEME}{catalog}/NAMESPACE.TABLE")
    if "/" in identifier:
        raise TableUriError(f"{uri!r}: write the namespace and the table with a dot, not a slash: "
                            f"{SCHEME}{catalog}/{identifier.replace('/', '.')}")
    bad = sorted({c for c in rest if c in "?#" or c.isspace()})
    if bad:
        raise TableUriError(f"{uri!r} holds {' '.join(repr(c) for c in bad)}; expected {URI_FORM}, "
                            "the names made of letters, digits, '_' and '-'")
    namespace, dot, table = identifier.rpartition(".")
    if not dot:
        raise TableUriError(f"{uri!r} names no namespace; write {SCHEME}{catalog}/NAMESPACE.{identifier}, "
                            f"e.g. {SCHEME}{catalog}/default.{identifier}")
    if not table or not all(namespace.split(".")):
        raise TableUriError(f"{uri!r} has an empty name between its dots; expected {URI_FORM}")
    return catalog, namespace, table


class IcebergOutput(Output):
    """An Iceberg table: the run's rows as Parquet files under the table's data path, committed at least every
    ``--commit-seconds``. The runs' own files (status, summary, report, work) live in its home, beside the table's
    location (:func:`mxjob.outputs.iceberg_run.home_of`)."""

    kind = "iceberg"
    format = "parquet"
    form = URI_FORM
    called = "an Iceberg table output"
    adds_rows = True
    cuts_files = True
    summary_field = "table"
    own_options: ClassVar[tuple] = ("accept_other_fingerprint",)

    @classmethod
    def claims(cls, uri: str, requested_format: str | None) -> bool:
        return uri.startswith(SCHEME)

    @classmethod
    def check_options(cls, uri: str, settings) -> None:
        super().check_options(uri, settings)
        if settings["output_format"] and settings["output_format"] != "parquet":
            raise OutputError(f"{settings.name('output_format')} {settings['output_format']}: an Iceberg table holds "
                              "Parquet files; drop --output-format, or write JSON Lines to s3://BUCKET/KEY.jsonl")
        if settings["overwrite"]:
            raise OutputError(
                f"{settings.name('overwrite')} does not apply to an Iceberg table: the job only adds to a table, and "
                "the table keeps every snapshot. To score every key again into a table of its own, write to a new "
                f"table (--output {uri.rsplit('.', 1)[0]}.NEW_TABLE), or drop this one first (pyiceberg's "
                "catalog.drop_table, or DROP TABLE in Spark or Athena); to add only the keys it lacks, use "
                "--skip-existing")

    def __init__(self, uri: str, bucket: str | None = None, key: str | None = None):
        super().__init__(uri, bucket, key)
        #: The catalog's name, the table's namespace and its name (:func:`parse_table_uri`).
        self.catalog_name, self.namespace, self.table_name = parse_table_uri(uri)

    @classmethod
    def parse(cls, uri: str, settings) -> IcebergOutput:
        """The table (its home is found through its catalog by the driver: :meth:`locate`)."""
        try:
            return cls(uri)
        except TableUriError as exc:
            raise OutputError(f"{settings.name('output')}: {exc}") from None

    def locate(self, cfg) -> IcebergOutput:
        return IcebergOutput(self.uri, *_iceberg_run().locate(cfg))

    @classmethod
    def status_location(cls, uri: str, endpoint_url: str | None, region: str | None) -> tuple[str, str]:
        """In the table's home, found through its catalog (pyiceberg: the job's own venv; .venv-ops has none)."""
        try:
            from mxjob.outputs import iceberg_run
        except ImportError as exc:
            raise uris.S3UriError(
                f"{uri}: finding an Iceberg table's status needs pyiceberg ({exc}); watch its home instead, the "
                "s3:// folder the job's log names (\"the runs' status, summary and work under s3://...\"): "
                "<warehouse>/NAMESPACE.db/_mxinfer/TABLE/") from None
        try:
            bucket, home = iceberg_run.home_of(iceberg_run.find(cls(uri), endpoint_url, region).location)
        except (iceberg_run.JobError, TableUriError) as exc:
            raise uris.S3UriError(str(exc)) from None
        return bucket, side_key(home, "status.json")

    def exists(self, cfg, client, found) -> bool:
        """A table's home holds only the job's own files; its rows are the table's."""
        return _iceberg_run().target(cfg).rows > 0

    def refuse_existing(self, cfg):
        _iceberg_run().refuse_rows(cfg)

    def progress_advice(self, work) -> str:
        return (f"add --resume to finish it (the rows it committed to the table stay either way), or delete "
                f"{work.uri} to start a new run")

    def settle(self, cfg, client, images):
        return _iceberg_run().settle(cfg, client, images)

    def existing(self, cfg, client, images):
        return _iceberg_run().find_existing(cfg, images)

    def open(self, cfg, schema, fingerprint: dict) -> None:
        """The table, created with the run's columns and fingerprint, or checked against them; a dry run creates
        nothing: it checks a table that exists, and says what a new one would hold."""
        iceberg_run = _iceberg_run()
        schema = iceberg_run.table_schema(schema)
        if cfg.dry_run and iceberg_run.target(cfg).table is None:
            log.info("--dry-run: the Iceberg table %s does not exist; a run would create it with the columns %s",
                     self.uri, ", ".join(schema.names))
            return
        iceberg_run.open_for_run(cfg, schema, fingerprint)

    def files(self, cfg, client, planning: LayoutInputs) -> dataset.DatasetLayout:
        """A table's run is a dataset run whose files are the table's, named by the run's id."""
        if planning.resumed:
            return dataset.table_resumed_layout((planning.work.read_job() or {}).get("dataset"), cfg.rows_per_file,
                                                planning.auto_rows, planning.existing, cfg.skip_existing,
                                                cfg.rescore_errors)
        run = _iceberg_run().new_run_id()
        return dataset.fresh_layout(cfg.rows_per_file, planning.auto_rows, planning.images, run, planning.existing,
                                    cfg.rescore_errors, skip_existing=cfg.skip_existing)

    def finish_nothing_new(self, cfg, client, work, found) -> None:
        """A resumed table run whose files hold every listed key: its rows are committed."""
        if work.exists():
            log.info("the run being resumed has every listed key in the table; removed its %d work objects",
                     work.remove())

    def sink(self, cfg, client, work, workload):
        from mxjob.outputs import iceberg_run
        from mxjob.outputs.parquet import provenance

        files, settled = workload.layout, workload.layout.settled
        run_files = iceberg_run.RunFiles(files.run, files.rows_per_file,
                                         settled.next_index if settled is not None else 0,
                                         getattr(files.existing, "rescore", None))
        return iceberg_run.TableSink(client, iceberg_run.target(cfg).table, run_files, cfg.commit_seconds,
                                     provenance(work.read_job()))

    def summary_entry(self, sink, workload) -> dict:
        return sink.summary_entry(self.uri, workload.layout.why, workload.layout.settled)


def _iceberg_run():
    """:mod:`mxjob.outputs.iceberg_run`, imported at its first use: only a table output pays for pyiceberg's imports."""
    from mxjob.outputs import iceberg_run

    return iceberg_run
