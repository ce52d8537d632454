"""The Iceberg table through pyiceberg 0.10: the catalog loaded, the table opened or created, files committed once.

Driver only. The catalog is a pyiceberg catalog, configured the way pyiceberg
users already do it (``.pyiceberg.yaml``, or ``PYICEBERG_CATALOG__<NAME>__...``
environment variables): a SQL catalog on SQLite here and in the tests, Glue
on EMR. The steps, in the order the job takes them:

1. :func:`mxjob.outputs.iceberg.parse_table_uri` splits the output URI; :func:`load_catalog` loads
   the catalog, pointing its S3 FileIO at the job's ``--endpoint-url``.
2. :func:`open_table`, before any Spark work: the table is created when
   absent, with the run's columns and fingerprint; an existing one with other
   columns or another fingerprint is refused. It reads the table's metadata
   only, so it costs a catalog call and one small S3 GET.
3. The job writes Parquet data files with its own writer
   (:class:`mxjob.outputs.parquet.ParquetSink`, no Iceberg field ids) under the table's
   data location, at :func:`data_file_path` (``<data path>/mxinfer-<run
   id>-<index>.parquet``; the data path is ``<table location>/data`` unless the
   table's ``write.data.path`` says otherwise). Files there are the table's:
   nothing that cleans the job's work prefix ever deletes them, and files a
   dead run left uncommitted are what Iceberg's orphan-file removal is for.
4. :func:`commit_files` appends uploaded files in one snapshot, at most once
   per commit id: the id is in the snapshot's summary, and the table's
   history is read before every attempt. A driver that died after its commit
   and runs again commits nothing; one that died between the upload and the
   commit commits the files when it calls again with the same id.
5. :func:`existing_keys` gives the keys already in the table (``--skip-existing``);
   :func:`snapshot_summaries` and :func:`committed_ids` read the commits back.

pyiceberg 0.10.0 reads a null ``list<struct>`` (an error row's
``predictions`` or ``detections``) back as an empty list
(apache/iceberg-python#3833); the files hold the null, and Spark, Athena and
pyarrow read it as written.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyiceberg import catalog as iceberg_catalog
from pyiceberg.exceptions import (
    CommitFailedException,
    CommitStateUnknownException,
    NoSuchTableError,
    TableAlreadyExistsError,
)
from pyiceberg.expressions import In
from pyiceberg.io import AWS_REGION, S3_ENDPOINT, S3_REGION
from pyiceberg.io.pyarrow import parquet_file_to_data_file, pyarrow_to_schema
from pyiceberg.table import Table
from pyiceberg.table.name_mapping import MappedField, NameMapping
from pyiceberg.table.snapshots import ancestors_of
from pyiceberg.types import IcebergType, ListType, MapType, NestedField, StructType
from pyiceberg.utils.config import Config

from mxjob.core.constants import ICEBERG_SCHEME as SCHEME
from mxjob.outputs.fingerprint import differences as fingerprint_differences

log = logging.getLogger(__name__)

#: The table property holding the fingerprint of the run that created the table, as canonical JSON.
FINGERPRINT = "mxinfer.fingerprint"
#: The snapshot summary's entries of a commit of this job: the run's id and the commit's.
RUN_ID = "mxinfer.run-id"
COMMIT_ID = "mxinfer.commit-id"
#: A data file's name under the table's data path: one run's files, numbered.
DATA_FILE_NAME = "mxinfer-{run_id}-{index:05d}.parquet"
#: The column that is null on a scored row, and the key's (:func:`mxjob.results.results.schema`).
ERROR_COLUMN, KEY_COLUMN = "error", "key"
#: Attempts at a commit that meets a concurrent one, and the first pause between two, doubling after each:
#: half a minute of pauses in all, for a table that other writers keep committing to.
COMMIT_ATTEMPTS = 8
COMMIT_RETRY_SECONDS = 0.25
#: Where pyarrow's S3 client signs when the job's endpoint is given with no region (moto and MinIO take any);
#: without one, pyiceberg would ask AWS's S3 for the bucket's region, which an S3-compatible server never is.
FALLBACK_REGION = "us-east-1"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class TableMismatchError(ValueError):
    """An existing table that this run may not write to; ``differences`` lists what differs, one phrase each."""

    def __init__(self, message: str, differences: list[str]):
        super().__init__(message)
        self.differences = differences


@dataclass(frozen=True)
class Commit:
    """One snapshot of the table's history, as its summary tells it.

    ``run_id`` and ``commit_id`` are ``None`` for a snapshot another writer made.
    """

    snapshot_id: int
    timestamp_ms: int
    operation: str
    run_id: str | None
    commit_id: str | None
    added_files: int
    added_records: int


def load_catalog(name: str, endpoint_url: str | None = None, region: str | None = None):
    """The pyiceberg catalog ``name``, as its user configured it, reaching the job's S3.

    The configuration is read at each call: ``.pyiceberg.yaml`` (in
    ``$PYICEBERG_HOME``, the home directory or the working directory) and
    ``PYICEBERG_CATALOG__<NAME>__<PROPERTY>`` environment variables, which
    pyiceberg itself reads once, when it is first imported. With
    ``endpoint_url`` (``--endpoint-url``: moto, MinIO) and no ``s3.endpoint``
    in the catalog's properties, the catalog's PyArrow FileIO is pointed at it,
    with ``region`` (else boto3's, else ``us-east-1``) unless the properties
    name a region: the table's files then live in the S3 the job reads and
    writes. Without ``endpoint_url`` the properties are pyiceberg's alone.

    Parameters
    ----------
    name : str
        The catalog's name (the ``CATALOG`` of :data:`mxjob.outputs.iceberg.URI_FORM`).
    endpoint_url : str, optional
        The job's S3 endpoint.
    region : str, optional
        The job's ``--region``.

    Returns
    -------
    pyiceberg.catalog.Catalog

    Raises
    ------
    ValueError
        No catalog of that name is configured; the message shows both ways.
    """
    properties = Config().get_catalog_config(name)
    if properties is None:
        env = f"PYICEBERG_CATALOG__{name.upper()}"
        raise ValueError(
            f"no pyiceberg catalog named {name!r} is configured; configure it as pyiceberg does, either in "
            f".pyiceberg.yaml ($PYICEBERG_HOME, the home directory or the working directory) under "
            f"'catalog: {name}: ...', or with environment variables such as {env}__URI=sqlite:///catalog.db and "
            f"{env}__WAREHOUSE=s3://BUCKET/warehouse (a cluster-mode driver gets them through "
            f"spark.yarn.appMasterEnv.{env}__URI=...)")
    properties = dict(properties)
    if endpoint_url and not properties.get(S3_ENDPOINT):
        properties[S3_ENDPOINT] = endpoint_url
        if not (properties.get(S3_REGION) or properties.get(AWS_REGION)):
            properties[S3_REGION] = region or _default_region()
    return iceberg_catalog.load_catalog(name, **properties)


def _default_region() -> str:
    """boto3's region (``AWS_DEFAULT_REGION``, the profile's), else :data:`FALLBACK_REGION`."""
    import boto3

    return boto3.session.Session().region_name or FALLBACK_REGION


def open_table(catalog, identifier: str, schema: pa.Schema, fingerprint: dict, *,
               accept_other_fingerprint: bool = False,
               override_hint: str = "accept_other_fingerprint=True", location: str | None = None) -> Table:
    """The table this run writes to: created when absent, refused when it holds other rows.

    A new table gets ``schema``'s columns (pyiceberg converts the Arrow types)
    and ``fingerprint`` as canonical JSON in its :data:`FINGERPRINT` property;
    its namespace is created too when absent. An existing table is checked
    against both, from its metadata alone (no data file is read).

    Parameters
    ----------
    catalog : pyiceberg.catalog.Catalog
        From :func:`load_catalog`.
    identifier : str
        ``NAMESPACE.TABLE``.
    schema : pyarrow.Schema
        The Parquet files' schema (:func:`mxjob.results.parquet_view.parquet_schema`,
        with any carried columns); its metadata is not part of the table.
    fingerprint : dict
        What every row depends on (model files' SHA-256, task, recipe, precision).
    accept_other_fingerprint : bool
        Write to a table whose fingerprint differs (or that has none). The
        table keeps the fingerprint it was created with.
    override_hint : str
        How the user says ``accept_other_fingerprint``, for the refusal's
        message (the job passes its flag).
    location : str, optional
        Where a new table goes (the catalog's default when not given); an
        existing table keeps its own.

    Returns
    -------
    pyiceberg.table.Table

    Raises
    ------
    TableMismatchError
        A ``ValueError``: the table's columns (names and types) differ from
        ``schema``'s, or its fingerprint from ``fingerprint`` (unless
        accepted). The message says what differs and how to proceed.
    ValueError
        ``schema`` has a type Iceberg cannot hold (float16).
    """
    namespace, _, name = identifier.rpartition(".")
    if not namespace or not name:
        raise ValueError(f"{identifier!r} is not NAMESPACE.TABLE")
    wanted = _columns(_iceberg_schema(schema))
    canonical = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        catalog.create_namespace_if_not_exists(namespace)
        try:
            # The columns alone: the schema's metadata (the files' provenance) is no part of the table.
            columns = pa.schema(list(schema))
            table = catalog.create_table(identifier, schema=columns, location=location,
                                         properties={FINGERPRINT: canonical})
            log.info("created the Iceberg table %s at %s", identifier, table.location())
            return table
        except TableAlreadyExistsError:  # another driver created it since: check it as any existing table
            table = catalog.load_table(identifier)
    where = f"the Iceberg table {catalog.name}/{identifier}"
    found = _columns(table.schema())
    differences = _column_differences(found, wanted)
    if differences:
        raise TableMismatchError(
            f"{where} has other columns than this run writes: {'; '.join(differences)}. An Iceberg table keeps "
            f"one schema: write to another table ({SCHEME}{catalog.name}/{namespace}.NEW_TABLE), or change this "
            "one's schema first (pyiceberg's Table.update_schema)", differences)
    recorded = table.properties.get(FINGERPRINT)
    if recorded is None:
        differences = [f"the table has no {FINGERPRINT} property: this job did not create it"]
    else:
        differences = fingerprint_differences(json.loads(recorded), json.loads(canonical))
    if differences and not accept_other_fingerprint:
        raise TableMismatchError(
            f"{where} holds rows of another model or settings: {'; '.join(differences)}. Write to another table "
            f"({SCHEME}{catalog.name}/{namespace}.NEW_TABLE), or add to this one anyway with {override_hint}",
            differences)
    if differences:
        log.warning("writing to %s although %s (%s)", where, "; ".join(differences), override_hint)
    return table


def _iceberg_schema(schema: pa.Schema):
    """``schema`` as pyiceberg converts it, its field ids numbered in order (they take no part in a comparison)."""
    ids = iter(range(1, 1_000_000))

    def mapped(name: str, type_: pa.DataType) -> MappedField:
        return MappedField(field_id=next(ids), names=[name], fields=children(type_))

    def children(type_: pa.DataType) -> list[MappedField]:
        if pa.types.is_struct(type_):
            return [mapped(f.name, f.type) for f in type_]
        if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
            return [mapped("element", type_.value_type)]
        if pa.types.is_map(type_):
            return [mapped("key", type_.key_type), mapped("value", type_.item_type)]
        return []

    mapping = NameMapping([mapped(f.name, f.type) for f in schema])
    try:
        return pyarrow_to_schema(schema, name_mapping=mapping)
    except Exception as exc:  # pyiceberg's UnsupportedPyArrowTypeException, TypeError: a column it cannot hold
        hint = "; for embeddings, leave --embedding-dtype at float32" if "halffloat" in str(exc) else ""
        raise ValueError(f"an Iceberg table cannot hold these columns: {exc}{hint}") from exc


def _columns(schema) -> dict[str, str]:
    """Each top-level column's name to its Iceberg type, without field ids (``list<struct<class_id: int, ...>>``)."""
    return {f.name: _field_text(f) for f in schema.fields}


def _field_text(field: NestedField) -> str:
    return _type_text(field.field_type) + (" not null" if field.required else "")


def _type_text(type_: IcebergType) -> str:
    if isinstance(type_, StructType):
        return "struct<" + ", ".join(f"{f.name}: {_field_text(f)}" for f in type_.fields) + ">"
    if isinstance(type_, ListType):
        return f"list<{_field_text(type_.element_field)}>"
    if isinstance(type_, MapType):
        return f"map<{_field_text(type_.key_field)}, {_field_text(type_.value_field)}>"
    return str(type_)


def _column_differences(found: dict[str, str], wanted: dict[str, str]) -> list[str]:
    """One phrase per column that differs between the table's (``found``) and this run's (``wanted``)."""
    out = []
    for name in list(found) + [n for n in wanted if n not in found]:
        if name not in wanted:
            out.append(f"{name} is in the table, not in this run's rows")
        elif name not in found:
            out.append(f"{name} ({wanted[name]}) is in this run's rows, not in the table")
        elif found[name] != wanted[name]:
            out.append(f"{name}: {found[name]} in the table, {wanted[name]} in this run's rows")
    return out


def data_file_path(table: Table, run_id: str, index: int) -> str:
    """Where this run's data file ``index`` goes: ``<data path>/mxinfer-<run_id>-<index>.parquet``.

    The same run and index always give the same path, so a resumed driver
    finds the files of its earlier attempt. The path comes from the table's
    location provider: ``<table location>/data`` unless the table's
    ``write.data.path`` says otherwise, hashed directories in between when
    its ``write.object-storage.enabled`` is true.

    Parameters
    ----------
    table : pyiceberg.table.Table
    run_id : str
        Letters, digits, ``.``, ``_`` and ``-``, starting with a letter or digit.
    index : int
        The file's number in the run, from 0.

    Returns
    -------
    str
        A full URI (``s3://BUCKET/...`` for a table on S3).
    """
    _check_name(run_id, "run id")
    if index < 0:
        raise ValueError(f"a data file's index is 0 or more, got {index}")
    return table.location_provider().new_data_location(DATA_FILE_NAME.format(run_id=run_id, index=index))


def _check_name(value: str, what: str) -> None:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be letters, digits, '.', '_' and '-', starting with a letter or digit")


def commit_files(table: Table, paths: list[str], run_id: str, commit_id: str,
                 replace_errors_of: Collection[str] = ()) -> Commit | None:
    """Append uploaded Parquet files to the table in one snapshot, unless ``commit_id`` is committed already.

    Before each attempt the table is refreshed and its current history (the
    main branch's snapshots, back to the first) is searched for
    ``commit_id``: when it is there, the files are the table's already (a
    driver that died after its commit and runs again, a twin driver that
    committed them) and nothing is committed. Otherwise pyiceberg's
    ``Table.add_files`` reads each file's footer for its statistics, checks
    that none is in the table yet, and appends them all in one snapshot whose
    summary holds :data:`RUN_ID` and :data:`COMMIT_ID` (the first commit also
    sets the table's name mapping, as the files carry no Iceberg field ids). A
    concurrent commit (``CommitFailedException``) is retried after a pause,
    :data:`COMMIT_ATTEMPTS` attempts in all, the history read again first.

    Parameters
    ----------
    table : pyiceberg.table.Table
        From :func:`open_table`.
    paths : list of str
        Full URIs of whole files in the table's schema under its data path
        (:func:`data_file_path`), each holding at least one row.
    run_id : str
        The run's id: what :func:`committed_ids` selects by.
    commit_id : str
        The same for the same files across retries and resumes (e.g. the
        run's id and the files' indices).
    replace_errors_of : collection of str
        Keys whose error rows in the table the files' rows replace
        (``--rescore-errors``): in the same snapshot, each data file holding
        such a row is replaced by a copy without it (:func:`_without_error_rows`),
        so a reader sees a key's error row or its new row, never both and
        never neither.

    Returns
    -------
    Commit or None
        The snapshot this call made; ``None`` when ``commit_id`` was in the
        table's history already and nothing was committed.

    Raises
    ------
    ValueError
        A path outside the table's data path; a file already in the table
        under another commit id, or of other columns (pyiceberg's messages).
    FileNotFoundError
        A file that was never uploaded.
    pyiceberg.exceptions.CommitFailedException
        Still conflicting after :data:`COMMIT_ATTEMPTS` attempts.
    """
    _check_name(run_id, "run id")
    if not commit_id:
        raise ValueError("a commit needs a commit id")
    paths = list(paths)
    if not paths:
        raise ValueError(f"commit {commit_id!r} names no data file")
    root = table.location_provider().data_path.rstrip("/") + "/"
    outside = [p for p in paths if not p.startswith(root)]
    if outside:
        raise ValueError(f"{outside[0]} is not under the table's data path {root}: write the data files where "
                         "data_file_path() says, so that they are the table's and nothing else deletes them")
    properties = {RUN_ID: run_id, COMMIT_ID: commit_id}
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table.refresh()
        found = _find(table, commit_id)
        if found is not None:
            log.info("commit %s is in %s already (snapshot %s): nothing to commit", commit_id, _name(table),
                     found.snapshot_id)
            return None
        try:
            if replace_errors_of:
                _add_replacing_errors(table, paths, properties, replace_errors_of, commit_id)
            else:
                table.add_files(paths, snapshot_properties=properties)
        except (CommitFailedException, CommitStateUnknownException) as exc:
            # Another writer committed since the refresh (or the catalog lost our answer): read the history
            # again, where this commit may now be, before trying again.
            if attempt == COMMIT_ATTEMPTS:
                raise
            pause = COMMIT_RETRY_SECONDS * 2 ** (attempt - 1)
            log.warning("commit %s to %s conflicted (%s); again in %.2f s", commit_id, _name(table), exc, pause)
            time.sleep(pause)
            continue
        commit = _find(table, commit_id)
        log.info("committed %s to %s: snapshot %s, %d files, %d rows", commit_id, _name(table), commit.snapshot_id,
                 commit.added_files, commit.added_records)
        return commit
    raise AssertionError("unreachable: the last attempt returns or raises")


def _add_replacing_errors(table: Table, paths: list[str], properties: dict, keys: Collection[str],
                          commit_id: str) -> None:
    """Add ``paths`` and replace every data file holding an error row of ``keys`` by a copy without it, in one
    overwrite snapshot (pyiceberg's public snapshot producer and ``parquet_file_to_data_file``, as ``add_files``
    uses them). The files are rewritten by this module, not by pyiceberg's ``delete``, which reads an error row's
    null list as an empty one (apache/iceberg-python#3833) and would write the other error rows back so."""
    replaced = _without_error_rows(table, keys, commit_id)
    with table.transaction() as transaction:
        with transaction.update_snapshot(snapshot_properties=properties).overwrite() as overwrite:
            for old, new in replaced:
                overwrite.delete_data_file(old)
                if new is not None:
                    overwrite.append_data_file(parquet_file_to_data_file(table.io, transaction.table_metadata, new))
            for path in paths:
                overwrite.append_data_file(parquet_file_to_data_file(table.io, transaction.table_metadata, path))


#: A data file rewritten without the error rows a commit replaces: the commit's id (its ``/`` a ``-``) and a number.
REWRITE_FILE_NAME = "mxinfer-{commit}-rewrite-{index:05d}.parquet"


def _without_error_rows(table: Table, keys: Collection[str], commit_id: str) -> list[tuple]:
    """``(data file, its copy's path or None)`` for each data file that holds an error row of ``keys``.

    The candidates are the files whose key bounds admit one of ``keys``
    (pyiceberg's scan planning); each is read whole with pyarrow, which keeps
    its nulls, and written back without those rows under
    :data:`REWRITE_FILE_NAME`, its schema and key-value metadata kept
    (``None``: no row left, the file is only removed). The same commit id
    gives the same names, so an attempt that failed leaves nothing behind
    once the next one succeeds.
    """
    wanted = pa.array(sorted(set(keys)), pa.string())
    out = []
    tasks = table.scan(row_filter=In(KEY_COLUMN, set(wanted.to_pylist()))).plan_files()
    for index, task in enumerate(tasks):
        with table.io.new_input(task.file.file_path).open() as handle:
            rows = pq.read_table(handle)
        drop = pc.and_(pc.is_in(rows[KEY_COLUMN], value_set=wanted), pc.is_valid(rows[ERROR_COLUMN]))
        if not pc.any(drop).as_py():
            continue
        kept = rows.filter(pc.invert(drop))
        if not kept.num_rows:
            out.append((task.file, None))
            continue
        name = REWRITE_FILE_NAME.format(commit=commit_id.replace("/", "-"), index=index)
        path = table.location_provider().new_data_location(name)
        with table.io.new_output(path).create(overwrite=True) as sink:
            pq.write_table(kept, sink, compression="zstd")
        out.append((task.file, path))
    return out


def _name(table: Table) -> str:
    """``NAMESPACE.TABLE``, for messages."""
    return ".".join(table.name())


def _find(table: Table, commit_id: str) -> Commit | None:
    """The commit of ``commit_id`` in the table's current history, else ``None``."""
    return next((c for c in snapshot_summaries(table) if c.commit_id == commit_id), None)


def snapshot_summaries(table: Table) -> list[Commit]:
    """The table's current history, oldest first: each snapshot's id, run id, commit id and what it added.

    The history is the main branch's: the current snapshot and its
    ancestors, as the table's loaded metadata has them (``table.refresh()``
    reads the catalog's latest). A snapshot rolled back out of it, or expired,
    is not there.

    Parameters
    ----------
    table : pyiceberg.table.Table

    Returns
    -------
    list of Commit
    """
    history = list(ancestors_of(table.current_snapshot(), table.metadata))
    return [_commit(snapshot) for snapshot in reversed(history)]


def _commit(snapshot) -> Commit:
    summary = snapshot.summary
    operation = getattr(summary.operation, "value", summary.operation) if summary is not None else None
    get = summary.get if summary is not None else (lambda _key, default=None: default)
    return Commit(snapshot_id=snapshot.snapshot_id, timestamp_ms=snapshot.timestamp_ms, operation=str(operation),
                  run_id=get(RUN_ID), commit_id=get(COMMIT_ID), added_files=int(get("added-data-files", 0)),
                  added_records=int(get("added-records", 0)))


def committed_ids(table: Table, run_id: str) -> list[str]:
    """The commit ids of run ``run_id`` in the table's current history, oldest first.

    Parameters
    ----------
    table : pyiceberg.table.Table
    run_id : str

    Returns
    -------
    list of str
    """
    return [c.commit_id for c in snapshot_summaries(table) if c.run_id == run_id and c.commit_id is not None]


def existing_keys(table: Table, key_column: str = "key", *, with_errors: bool = True) -> pa.ChunkedArray:
    """The keys that have a row in the table: those ``--skip-existing`` leaves out.

    pyiceberg's scan projects the key column alone (and :data:`ERROR_COLUMN`,
    null on a scored row, when ``with_errors`` is false), read batch by batch;
    the batches' key arrays are kept as they come, never copied into one. Ten
    million keys of 25 characters: 323 MiB of keys, at most 445 MiB of Arrow
    memory, read in about a second from local files.

    Parameters
    ----------
    table : pyiceberg.table.Table
    key_column : str
        The column holding the key.
    with_errors : bool
        Count a key whose row is an error as existing; false (``--rescore-errors``):
        only the keys scored without one.

    Returns
    -------
    pyarrow.ChunkedArray
        ``large_string``, in the table's file order; empty for a table with no
        rows. ``pyarrow.compute.is_in(keys, value_set=...)`` takes it as it is.
    """
    return pa.chunked_array(list(key_batches(table, key_column, with_errors=with_errors)), pa.large_string())


def key_batches(table: Table, key_column: str = "key", *, with_errors: bool = True,
                with_failed: bool = False) -> Iterator:
    """:func:`existing_keys` a batch at a time, each batch's keys one ``large_string`` array: for a caller that
    looks them up as they come and keeps none (``mxjob.outputs.existing.KeyFilter``). With ``with_failed``, each item is
    ``(keys, failed)``, ``failed`` a boolean array: the row is an error."""
    names = [f.name for f in table.schema().fields]
    needed = [key_column] if with_errors and not with_failed else [key_column, ERROR_COLUMN]
    missing = [name for name in needed if name not in names]
    if missing:
        raise ValueError(f"the Iceberg table {_name(table)} has no {' and no '.join(missing)} column "
                         f"(its columns: {', '.join(names)})")
    for batch in table.scan(selected_fields=tuple(needed)).to_arrow_batch_reader():
        keys = batch.column(key_column)
        if with_failed:
            yield keys.cast(pa.large_string()), pc.is_valid(batch.column(ERROR_COLUMN))
            continue
        if not with_errors:
            keys = keys.filter(pc.is_null(batch.column(ERROR_COLUMN)))
        yield keys.cast(pa.large_string())  # the reader's type already: no copy
