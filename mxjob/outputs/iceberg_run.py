"""An Iceberg table as a run's output, on the driver: where the run keeps its own files, and its commits.

``--output iceberg://CATALOG/NAMESPACE.TABLE`` (:mod:`mxjob.outputs.iceberg`). The
run is a dataset run whose files are the table's: the merge writes Parquet
files (:class:`TableSink`, cut at ``--rows-per-file`` and whenever
``--commit-seconds`` have passed) under the table's data path, and commits
them through :mod:`mxjob.outputs.iceberg_catalog`, which owns everything pyiceberg
does. What this module adds is the job's side of it:

- **The home** (:func:`locate`): the status, summary, report and work prefix
  of the runs that write the table live at ``<the table location's
  parent>/_mxinfer/<its last name>/``: beside the table's location, not under
  it, so that Iceberg's orphan-file removal (which deletes what the table's
  metadata does not name, under its location) never takes them, and the
  table's readers never see them.
- **Exactly once** (:class:`TableSink`, :func:`settle`): a run's files are
  ``mxinfer-<run id>-NNNNN.parquet`` (the run id is in the work prefix's
  ``job.json``), each commit's id is the run id and the indices of the files
  it adds, and the table's history is read before every commit. A driver that
  dies after a file's upload and before its commit leaves a whole file; the
  run's next attempt (``--resume``, or YARN's) commits every such file once
  (:func:`settle`) and leaves the keys already in the run's files out of what
  it scores, so no key is written twice and none is lost.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

from mxjob import tasks
from mxjob.core import state
from mxjob.core.errors import JobError, first_line, plural
from mxjob.inputs import listing
from mxjob.outputs import claim, existing, iceberg_catalog, work_prefix
from mxjob.outputs.parquet import PARQUET_TYPE, ParquetSink
from mxjob.s3 import parallel_list, uris, writes

log = logging.getLogger(__name__)

#: The folder beside a table's location that holds its runs' homes.
HOME_FOLDER = "_mxinfer"
#: A commit's id: the run's id and the first and last index of the files it adds.
COMMIT_ID = "{run}/{first:05d}-{last:05d}"
_COMMIT_ID = re.compile(r"(?P<run>.+)/(?P<first>\d+)-(?P<last>\d+)")


@dataclass
class Target:
    """The table a run writes to, as its catalog has it now (``table`` ``None``: not created yet)."""

    catalog: object
    identifier: str
    location: str
    table: object = None

    @property
    def rows(self) -> int:
        """The rows the table holds now (its current snapshot's ``total-records``)."""
        snapshot = self.table.current_snapshot() if self.table is not None else None
        summary = snapshot.summary if snapshot is not None else None
        return int(summary.get("total-records", 0)) if summary is not None else 0


def catalog_of(output, endpoint_url: str | None = None, region: str | None = None):
    """The pyiceberg catalog of the table ``output`` (an :class:`mxjob.outputs.iceberg.IcebergOutput`), loaded once
    per process (:data:`mxjob.core.state.catalogs`)."""
    uri, name = output.uri, output.catalog_name

    def load():
        try:
            return iceberg_catalog.load_catalog(name, endpoint_url=endpoint_url, region=region)
        except ValueError as exc:  # no such catalog configured: the message says how to configure one
            raise JobError(f"--output {uri}: {exc}") from None
        except Exception as exc:  # the catalog's database or service unreachable, bad properties
            raise JobError(f"--output {uri}: cannot load the pyiceberg catalog {name!r}: {first_line(exc)}") from exc

    return state.catalogs.get((name, endpoint_url, region), load)


def target(cfg) -> Target:
    """The run's table as the catalog has it now: loaded when it exists, else where it will be created."""
    return find(cfg.output, cfg.endpoint_url, cfg.region)


def find(output, endpoint_url: str | None = None, region: str | None = None) -> Target:
    """The table ``output`` (an :class:`mxjob.outputs.iceberg.IcebergOutput`) as its catalog has it now (:func:`target`,
    for any caller: ``mxjob.reporting.watch`` too)."""
    catalog = catalog_of(output, endpoint_url, region)
    uri, namespace, name = output.uri, output.namespace, output.table_name
    identifier = f"{namespace}.{name}"
    try:
        table = catalog.load_table(identifier)
    except NoSuchTableError:
        return Target(catalog, identifier, new_location(uri, catalog, namespace, name))
    except Exception as exc:
        raise JobError(f"cannot read the Iceberg table {uri}: {first_line(exc)}") from exc
    return Target(catalog, identifier, table.location(), table)


def new_location(uri: str, catalog, namespace: str, name: str) -> str:
    """Where the catalog puts a new table, as pyiceberg's own catalogs choose it: the namespace's ``location``
    property and the table's name, else the catalog's ``warehouse``, ``NAMESPACE.db`` and the name. The job
    creates the table there explicitly (:func:`open_for_run`), so the home found now is the table's."""
    try:
        properties = catalog.load_namespace_properties(namespace)
    except NoSuchNamespaceError:
        properties = {}
    if properties.get("location"):
        return f"{properties['location'].rstrip('/')}/{name}"
    warehouse = catalog.properties.get("warehouse")
    if warehouse:
        return f"{warehouse.rstrip('/')}/{namespace}.db/{name}"
    raise JobError(f"--output {uri}: the table does not exist, and the catalog has no 'warehouse' "
                   f"property nor its namespace {namespace!r} a 'location' to create it in; set the catalog's "
                   "warehouse (PYICEBERG_CATALOG__<NAME>__WAREHOUSE=s3://BUCKET/warehouse), or create the table first")


def home_of(location: str) -> tuple[str, str]:
    """``(bucket, prefix)`` of the runs' home for a table at ``location``: ``<parent>/_mxinfer/<name>/``."""
    if not uris.is_s3_uri(location):
        raise JobError(f"the table's location {location} is not on S3 (s3://BUCKET/...): the job writes its files "
                       "with S3 calls; create the table in an s3:// warehouse")
    bucket, path = uris.parse_s3_uri(location)
    parent, _, name = path.rstrip("/").rpartition("/")
    if not name:
        raise JobError(f"the table's location {location} is a whole bucket: give the table a folder of its own")
    return bucket, f"{parent + '/' if parent else ''}{HOME_FOLDER}/{name}/"


def locate(cfg) -> tuple[str, str]:
    """``(bucket, prefix)`` of the table's home (:func:`home_of`), logged with the table."""
    found = target(cfg)
    bucket, prefix = home_of(found.location)
    log.info("output: the Iceberg table %s at %s (%s); the runs' status, summary and work under s3://%s/%s",
             cfg.output_uri, found.location,
             f"{found.rows:,} rows" if found.table is not None else "created when the run has its schema",
             bucket, prefix)
    return bucket, prefix


def refuse_rows(cfg) -> None:
    """A run that would write every listed key is refused a table that holds rows: some would be there twice."""
    rows = target(cfg).rows
    if rows:
        raise JobError(f"the Iceberg table {cfg.output_uri} holds {plural(rows, 'row')} already, and this run would "
                       "add a row for every listed key, some a second time; add --skip-existing to score only the "
                       "listed keys it lacks, or write to another table")


def table_schema(result_schema: pa.Schema) -> pa.Schema:
    """The table's columns: the Parquet view of the run's results (its task's,
    :meth:`mxjob.tasks.Task.parquet_schema`), without the schema's metadata."""
    return pa.schema(list(tasks.of_schema(result_schema).parquet_schema(result_schema)))


def open_for_run(cfg, schema: pa.Schema, fingerprint: dict):
    """The table, created when absent (with ``schema`` and ``fingerprint``) or checked against both.

    A table the job cannot add files to the way it does (its data files
    hashed into folders: ``write.object-storage.enabled``) is refused too.
    """
    found = target(cfg)
    try:
        table = iceberg_catalog.open_table(found.catalog, found.identifier, schema, fingerprint,
                                         accept_other_fingerprint=cfg.accept_other_fingerprint,
                                         override_hint="--accept-other-fingerprint", location=found.location)
    except ValueError as exc:  # TableMismatchError: what differs and what to do; a type a table cannot hold
        raise JobError(f"--output {cfg.output_uri}: {exc}") from None
    probe = iceberg_catalog.data_file_path(table, "probe", 0)
    if probe.rsplit("/", 1)[0] != data_path(table):
        raise JobError(f"--output {cfg.output_uri}: the table hashes its data files into folders "
                       "(write.object-storage.enabled), and the job finds a run's files by their folder; write to a "
                       "table without it")
    return table


def data_path(table) -> str:
    """The folder of the table's data files (``<location>/data`` unless ``write.data.path`` says otherwise)."""
    return table.location_provider().data_path.rstrip("/")


def new_run_id() -> str:
    """A run's id: its UTC start and six random hex digits (two runs of one second differ)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(3)


def commit_id(run: str, first: int, last: int) -> str:
    """The id of the commit of the run's files ``first`` to ``last``: the same at every attempt of the run."""
    return COMMIT_ID.format(run=run, first=first, last=last)


def committed_indices(table, run: str) -> set[int]:
    """The indices of the run's files that the table's history has committed."""
    out: set[int] = set()
    for cid in iceberg_catalog.committed_ids(table, run):
        match = _COMMIT_ID.fullmatch(cid)
        if match and match.group("run") == run:
            out.update(range(int(match.group("first")), int(match.group("last")) + 1))
    return out


def run_files(client, table, run: str) -> dict[int, tuple[str, int]]:
    """The run's whole files under the table's data path: index to ``(URI, bytes)`` (one listing)."""
    root = data_path(table)
    bucket, folder = uris.parse_s3_uri(root + "/")
    scheme = root.split("://", 1)[0]
    name = re.compile(re.escape(f"mxinfer-{run}-") + r"(\d+)\.parquet")
    out = {}
    for key, size in parallel_list.list_objects(client, bucket, f"{folder}mxinfer-{run}-"):
        match = name.fullmatch(key[len(folder):])
        if match:
            out[int(match.group(1))] = (f"{scheme}://{bucket}/{key}", size)
    return out


@dataclass
class Settled:
    """What :func:`settle` found of the run being resumed: its id, files, and what it committed now."""

    run: str | None = None
    #: The run's files already in the table before this attempt, and those this attempt committed.
    files_before: int = 0
    committed_now: int = 0
    #: The snapshot of that commit, if any.
    snapshot_id: int | None = None
    #: Listed keys left out: the run's files hold their rows already.
    keys_written: int = 0
    #: The index of the run's next file.
    next_index: int = 0

    def nothing_left(self, images):
        """A ``--skip-existing`` run's :class:`mxjob.outputs.existing.Existing` for a resume whose files hold every
        listed key (``images`` is what is left: nothing), or ``None`` when they hold none."""
        if not self.keys_written:
            return None
        return existing.Existing(listed=self.keys_written, new=images, in_output=self.keys_written)

    def entry(self) -> dict:
        return {"run": self.run, "files_committed_before": self.files_before,
                "files_committed_on_resume": self.committed_now, "keys_in_its_files": self.keys_written}


def settle(cfg, client, images: listing.Listing) -> tuple[listing.Listing, Settled]:
    """Before a resumed table run plans: commit its whole files the table lacks, leave out the keys they hold.

    Nothing to do for a fresh run (no work prefix). For the run being
    resumed (its id in the work prefix's ``job.json``), every file of its
    under the table's data path is whole (each is one multipart upload);
    those that no commit of the table's history names (a driver killed
    between the upload and the commit) are committed now, once, under the
    id of their indices. Then the keys the run's files hold are left out of
    ``images`` (with ``--skip-existing`` the table's keys are all left out
    later, these among them), so that none is written twice.
    """
    work = work_prefix.WorkPrefix(client, cfg.output_bucket, cfg.output_key)
    if not work.exists():
        return images, Settled()
    if not (cfg.resume or claim.yarn_retry(work)):
        claim.refuse_progress(work, cfg.output)
    record = (work.read_job() or {}).get("dataset") or {}
    run = record.get("run")
    found = target(cfg)
    if run is None or found.table is None:  # the earlier attempt wrote no file (it never opened the table)
        return images, Settled(run=run)
    table = found.table
    bucket, folder = uris.parse_s3_uri(data_path(table) + "/")
    aborted = writes.abort_uploads(client, bucket, f"{folder}mxinfer-{run}-", lambda _key: True)
    if aborted:  # the file a killed driver was writing: never visible, but S3 bills its parts until aborted
        log.info("--resume: aborted %s the earlier attempt of run %s left open", plural(aborted, "upload"), run)
    files = run_files(client, table, run)
    done = committed_indices(table, run)
    left = sorted(set(files) - done)
    out = Settled(run=run, files_before=len(done & set(files)), next_index=max(files, default=-1) + 1)
    if left:
        # A --rescore-errors run's files replace the error rows of their keys: read which keys they hold.
        replacing = (_file_keys(cfg, table, [files[i] for i in left]) if record.get("rescore_errors") else [])
        commit = iceberg_catalog.commit_files(table, [files[i][0] for i in left], run,
                                              commit_id(run, left[0], left[-1]), replace_errors_of=replacing)
        out.committed_now = len(left)
        out.snapshot_id = commit.snapshot_id if commit is not None else None
        log.info("--resume: committed the %s the earlier attempt of run %s had written but not committed to %s "
                 "(snapshot %s)", plural(len(left), "whole file"), run, cfg.output_uri, out.snapshot_id)
    if files and not cfg.skip_existing:
        marks = existing.KeyFilter(images.keys)
        for keys in _file_key_arrays(cfg, table, list(files.values())):
            marks.add(keys)
        hit = marks.finish()
        out.keys_written = int(hit.sum())
        if out.keys_written:
            images = images.filter(pa.array(~hit))
            log.info("--resume: %s of the listed keys have their rows in run %s's files already; %s left",
                     f"{out.keys_written:,}", run, f"{len(images):,}")
    return images, out


def _file_key_arrays(cfg, table, files: list[tuple[str, int]]):
    """The key column of each of the run's files (``(URI, bytes)``), read as ``--skip-existing`` reads a dataset's."""
    written = [existing.EarlierFile(uris.parse_s3_uri(uri)[1], size) for uri, size in files]
    bucket = uris.parse_s3_uri(data_path(table) + "/")[0]
    for _, keys, _, _ in existing.read_keys(existing.output_filesystem(cfg), bucket, written, False):
        yield keys


def _file_keys(cfg, table, files: list[tuple[str, int]]) -> list[str]:
    return [key for keys in _file_key_arrays(cfg, table, files) for key in keys.to_pylist()]


@dataclass(frozen=True)
class RunFiles:
    """A run's files: its id, rows per file, the first new file's index (after an earlier attempt's), and the
    ``--rescore-errors`` flags (one per row the sink receives)."""

    run: str
    rows_per_file: int
    first_index: int = 0
    rescore: object = None


@dataclass
class Commits:
    """The commits a run made, for the summary."""

    snapshots: list = field(default_factory=list)
    files: int = 0
    rows: int = 0
    #: Error rows replaced by new rows (``--rescore-errors``).
    replaced: int = 0


class TableSink:
    """The assembly's rows as Parquet files under the table's data path, committed at least every
    ``commit_seconds`` and at the end.

    Same interface as :class:`mxjob.outputs.dataset_files.DatasetSink` (``write``, ``close``,
    ``abort``), and :meth:`due`, which the merge asks after each slice: when
    the commit is due, the merge hands over what it holds at once. A file
    ends at ``rows_per_file`` rows or when a commit is due; each is one
    multipart upload, whole when it appears. A commit adds every file ended
    since the last one, in one snapshot (:func:`iceberg_catalog.commit_files`).
    :meth:`abort` abandons only the file being written: files written and
    not yet committed are whole, and the run's next attempt commits them
    (:func:`settle`).
    """

    def __init__(self, client, table, files: RunFiles, commit_seconds: float, metadata: dict | None = None):
        self.client, self.table, self.run = client, table, files.run
        #: ``--rescore-errors``: one flag per row written, in order
        #: (:attr:`mxjob.outputs.existing.Existing.rescore`); the
        #: flagged keys' error rows in the table are replaced by their new rows in the commit that adds them.
        rescore = files.rescore
        self._rescore = rescore if rescore is not None and rescore.any() else None
        self._position = 0
        self._replacing: list[str] = []
        self.rows_per_file, self.commit_seconds, self.metadata = files.rows_per_file, commit_seconds, metadata
        self._index, self._rows = files.first_index, 0
        self._file: ParquetSink | None = None
        #: Files ended and not yet committed: ``(index, URI, rows, bytes)``.
        self._pending: list[tuple[int, str, int, int]] = []
        self.commits = Commits()
        self.bytes = 0
        self._last_commit = time.monotonic()

    def due(self) -> bool:
        """Whether the rows written since the last commit should be committed now."""
        return time.monotonic() - self._last_commit >= self.commit_seconds

    def write(self, batches: list[pa.RecordBatch]) -> None:
        """Rows of the result model, in key order, continuing the previous call's."""
        for batch in batches:
            if self._rescore is not None:
                flags = self._rescore[self._position:self._position + batch.num_rows]
                self._position += batch.num_rows
                if flags.any():
                    self._replacing.extend(batch.column("key").filter(pa.array(flags)).to_pylist())
            while batch.num_rows:
                room = self.rows_per_file - self._rows
                piece, batch = batch.slice(0, room), batch.slice(room)
                self._open_file().write([piece])
                self._rows += piece.num_rows
                if self._rows == self.rows_per_file:
                    self._end_file()
        if self.due() and (self._rows or self._pending):
            if self._rows:
                self._end_file()
            self._commit()

    def _open_file(self) -> ParquetSink:
        if self._file is None:
            uri = iceberg_catalog.data_file_path(self.table, self.run, self._index)
            bucket, key = uris.parse_s3_uri(uri)
            writer = writes.MultipartWriter(self.client, bucket, key, content_type=PARQUET_TYPE)
            self._file = ParquetSink(writer, self.metadata)
            self._uri = uri
        return self._file

    def _end_file(self) -> None:
        self._file.close()  # the file appears now, whole
        size = self._file.writer.bytes_written
        self._pending.append((self._index, self._uri, self._rows, size))
        self.bytes += size
        self._file, self._index, self._rows = None, self._index + 1, 0

    def _commit(self) -> None:
        pending, self._pending = self._pending, []
        replacing, self._replacing = self._replacing, []
        cid = commit_id(self.run, pending[0][0], pending[-1][0])
        try:
            made = iceberg_catalog.commit_files(self.table, [uri for _, uri, _, _ in pending], self.run, cid,
                                              replace_errors_of=replacing)
        except Exception:
            # Not committed: the run's next attempt (settle) commits the files, and replaces what they replace.
            self._pending, self._replacing = pending + self._pending, replacing + self._replacing
            raise
        if made is not None:
            self.commits.snapshots.append(made.snapshot_id)
        self.commits.replaced += len(replacing)
        self.commits.files += len(pending)
        self.commits.rows += sum(rows for _, _, rows, _ in pending)
        self._last_commit = time.monotonic()

    def close(self) -> None:
        """End the last file and commit every file not yet committed."""
        if self._rows:
            self._end_file()
        if self._pending:
            self._commit()

    def abort(self) -> None:
        """Abandon the file being written (its upload is aborted); files already whole stay for the next attempt."""
        if self._file is not None:
            self._file.abort()
            self._file = None

    def summary_entry(self, table_uri: str, why: str, settled: Settled | None) -> dict:
        """The summary's ``table`` entry."""
        out = {"table": table_uri, "location": self.table.location(), "run": self.run,
               "files": self.commits.files, "rows": self.commits.rows, "bytes": self.bytes,
               "commits": len(self.commits.snapshots), "snapshot_ids": list(self.commits.snapshots),
               "commit_seconds": self.commit_seconds, "rows_per_file": self.rows_per_file,
               "rows_per_file_why": why, "error_rows_replaced": self.commits.replaced}
        if settled is not None and settled.run is not None:
            out["resumed"] = settled.entry()
        return out


def find_existing(cfg, images: listing.Listing) -> existing.Existing:
    """``--skip-existing`` against the table: the listed keys without a row in it (its ``key`` column, read once
    through pyiceberg's scan a batch at a time, looked up as it comes: :class:`mxjob.outputs.existing.KeyFilter`)."""
    started = time.time()
    images, sample = existing.in_memory(images)
    found = target(cfg)
    if found.table is None or not found.rows:
        log.info("--skip-existing: the Iceberg table %s holds no row yet; every listed key is new", cfg.output_uri)
        return existing.Existing(listed=len(images), new=images, sample=sample, seconds=time.time() - started)
    marks, rows, errors = existing.KeyFilter(images.keys), 0, []
    try:
        for keys, failed in iceberg_catalog.key_batches(found.table, with_failed=True):
            rows += len(keys)
            marks.add(keys)
            if cfg.rescore_errors and failed.true_count:
                errors.append(keys.filter(failed))
    except (OSError, pa.ArrowException) as exc:
        raise JobError(f"--skip-existing: cannot read the keys of the Iceberg table {cfg.output_uri}: "
                       f"{first_line(exc)}; the job needs s3:GetObject on its files") from exc
    hit = marks.finish()
    error_keys = pa.concat_arrays(errors) if errors else None
    owners = np.zeros(len(error_keys), dtype=np.int64) if error_keys is not None else None  # found at commit
    new, rescore, _ = existing.select(images, hit, error_keys, owners)
    summary = found.table.current_snapshot().summary
    out = existing.Existing(listed=len(images), new=new, in_output=int(hit.sum()), rescore=rescore, sample=sample,
                            seconds=time.time() - started, table_rows=rows,
                            table_files=int(summary.get("total-data-files", 0)) if summary is not None else 0)
    log.info("--skip-existing: %s of %s listed keys have a row in the Iceberg table %s (%s rows read in %.1f s); "
             "%s to score", f"{out.in_output:,}", f"{out.listed:,}", cfg.output_uri, f"{rows:,}", out.seconds,
             plural(len(new), "new key"))
    return out
