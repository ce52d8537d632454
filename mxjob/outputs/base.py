"""An output: where a run's rows go, as one object with one protocol, and the registry that resolves ``--output``.

Each kind of destination is an :class:`Output` in a module of its own
(:mod:`mxjob.outputs.jsonl`, ``parquet``, ``dataset``, ``iceberg``). The
command line's edge resolves ``--output`` once (:func:`resolve`): each
registered kind, newest first, is asked whether it :meth:`Output.claims` the
URI, and the first that does parses it and checks the options against it.
From then on the run asks the object: where its own files live (its *home*
and :meth:`Output.side_key`), what it refuses before any work
(:meth:`Output.check`), what it holds already (:meth:`Output.contents`,
:meth:`Output.existing`), what a resume keeps (:meth:`Output.files`), and the
sink the merge writes into (:meth:`Output.sink`). Nothing outside this
package asks which kind an output is. :func:`register` is how the built-ins
join, and how a ``--plugin`` file adds a kind of its own.

The files beside an output: beside one object ``out.jsonl`` they are
``out.jsonl.parts/`` (the work prefix), ``out.jsonl.summary.json``,
``out.jsonl.status.json`` and ``out.jsonl.report.html``; in a prefix
(``predictions/``: a dataset, or an Iceberg table's home) ``_parts/``,
``_summary.json``, ``_status.json``, ``_report.html`` and ``_SUCCESS``: names
that start with an underscore are hidden from the dataset's readers
(pyarrow.dataset's default ``ignore_prefixes``, Hadoop's and so Spark's
hidden-file filter, Athena's Hive and Iceberg readers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from mxjob.core.errors import JobError, first_line
from mxjob.s3 import access, clients, uris, writes

if TYPE_CHECKING:
    from mxjob.options.config import JobConfig

log = logging.getLogger(__name__)

#: What beside an output has a key of its own: the work prefix and the job's files.
NAMES = ("parts/", "summary.json", "status.json", "report.html", "lease.json", "SUCCESS")
#: Key endings that tell readers another format or compression than the job writes, and what they tell them: a
#: JSON Lines object (or Parquet) under such a name is what ``pandas.read_csv``, Spark or an unzip tool then trip on.
FOREIGN_SUFFIXES = {".csv": "CSV", ".tsv": "tab-separated values", ".avro": "Avro", ".orc": "ORC",
                    ".xlsx": "an Excel workbook", ".zip": "a zip archive", ".bz2": "bzip2-compressed data",
                    ".xz": "xz-compressed data", ".zst": "zstd-compressed data", ".lz4": "LZ4-compressed data",
                    ".snappy": "Snappy-compressed data", ".jpg": "a JPEG image", ".jpeg": "a JPEG image",
                    ".png": "a PNG image", ".gif": "a GIF image", ".bmp": "a BMP image", ".tif": "a TIFF image",
                    ".tiff": "a TIFF image", ".webp": "a WebP image"}


class OutputError(ValueError):
    """An ``--output`` (or an option with it) that cannot be: the command line's edge says it as a usage error."""


def is_prefix(key: str | None) -> bool:
    """Whether ``key`` names a prefix (it ends with ``/``) rather than one object."""
    return bool(key) and key.endswith("/")


def side_key(key: str, name: str) -> str:
    """The key of ``name`` (one of :data:`NAMES`) beside ``key``: ``KEY.name`` beside an object, ``PREFIX/_name``
    in a prefix."""
    if name not in NAMES:
        raise ValueError(f"{name!r} is not one of {', '.join(NAMES)}")
    if is_prefix(key):
        return f"{key}_{name}"
    if name == "SUCCESS":
        raise ValueError("a single output object has no _SUCCESS: the object itself appears only when whole")
    return f"{key}.{name}"


def output_of(key: str) -> str:
    """The key a status (or summary, report) key is beside: the inverse of :func:`side_key`."""
    for name in NAMES:
        for joined in ("_", "."):
            if key.endswith(joined + name) and (joined == "." or key[:-len(joined + name)].endswith("/")):
                return key[:-len(joined + name)]
    return key


@dataclass(frozen=True)
class LayoutInputs:
    """What an output's files are planned from (:meth:`Output.files`), in :func:`mxjob.outputs.claim.claim_workload`."""

    #: The output's work prefix (:class:`mxjob.outputs.work_prefix.WorkPrefix`).
    work: object
    #: The run's keys (a :class:`mxjob.inputs.listing.Listing`).
    images: object
    #: ``--rows-per-file auto``'s ``(rows, why)``, and a ``--skip-existing`` run's
    #: :class:`mxjob.outputs.existing.Existing`.
    auto_rows: tuple = (0, "")
    existing: object = None
    #: What :meth:`Output.contents` read.
    found: object = None
    #: The run resumes an earlier one's progress; it adds rows to the output (``--skip-existing``); a dry run.
    resumed: bool = False
    appending: bool = False
    dry: bool = False


class Output:
    """One output, as ``--output`` names it (:attr:`uri`), and its home: ``s3://bucket/key``, where the run keeps
    its status, summary, report and work prefix (the object's own key, a prefix, or an Iceberg table's home).

    A subclass sets the class attributes, :meth:`claims` and :meth:`sink`;
    every other method does what a kind with nothing special there wants.
    """

    #: What the summary and the dry run's plan call it.
    kind: ClassVar[str] = ""
    #: The rows' format: ``jsonl`` (the tasks render each row's JSON line into its part) or ``parquet``.
    format: ClassVar[str] = "parquet"
    #: ``--output``'s form, for messages.
    form: ClassVar[str] = ""
    #: Whether a run may add rows to what it holds (``--skip-existing``, ``--rescore-errors``).
    adds_rows: ClassVar[bool] = False
    #: Whether its rows go into files of ``--rows-per-file`` rows.
    cuts_files: ClassVar[bool] = False
    #: The summary's entry this output fills from its sink (``dataset``, ``table``), if any.
    summary_field: ClassVar[str | None] = None
    #: Options that apply to this kind only, refused with any other, and what this kind is called then.
    own_options: ClassVar[tuple] = ()
    called: ClassVar[str] = ""

    def __init__(self, uri: str, bucket: str | None, key: str | None):
        self.uri, self.bucket, self.key = uri, bucket, key

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and (other.uri, other.bucket, other.key) == (self.uri, self.bucket, self.key)

    def __hash__(self) -> int:
        return hash((type(self), self.uri, self.bucket, self.key))

    # --- resolved once, at the command line's edge

    @classmethod
    def claims(cls, uri: str, requested_format: str | None) -> bool:
        """Whether ``uri`` (with ``--output-format`` if given) names an output of this kind."""
        raise NotImplementedError

    @classmethod
    def parse(cls, uri: str, settings) -> Output:
        """The output ``uri`` names (``settings``: the run's, by name; ``settings.name(key)`` says how the user wrote
        one); what cannot be raises :class:`OutputError`."""
        bucket, key = s3_object(uri, settings)
        return cls(uri, bucket, key)

    @classmethod
    def check_options(cls, uri: str, settings) -> None:
        """Refuse the options that do not apply to this kind (:class:`OutputError`)."""
        for other in kinds():
            for key in other.own_options:
                if other is not cls and key not in cls.own_options and settings[key]:
                    raise OutputError(f"{settings.name(key)} applies to {other.called} only (--output {other.form}): "
                                      "leave it out")
        if settings["skip_existing"] and not cls.adds_rows:
            adders = " or ".join(f"{other.called} (--output {other.form})" for other in reversed(kinds())
                                 if other.adds_rows)
            raise OutputError(f"{settings.name('skip_existing')} adds rows to {adders}; {uri.split('/', 3)[-1]!r} is "
                              "one object, which every run writes whole, so a run cannot add rows to it. Write to a "
                              "dataset prefix or a table, or give the keys to score in an --input-manifest")

    # --- the files beside it

    def side_key(self, name: str) -> str:
        """The key of ``name`` (one of :data:`NAMES`) in the home's bucket."""
        return side_key(self.key, name)

    def locate(self, cfg: JobConfig) -> Output:
        """This output with its home known (an Iceberg table's is found through its catalog); most know it already."""
        return self

    @classmethod
    def status_location(cls, uri: str, endpoint_url: str | None, region: str | None) -> tuple[str, str]:
        """``(bucket, key)`` of the status file of the runs that write ``uri``, or of ``uri`` itself if it is a
        status file (``mxjob.reporting.watch``)."""
        bucket, key = uris.parse_s3_uri(uri)
        if not key.strip("/"):
            raise uris.S3UriError(f"{uri!r} names no output; expected s3://BUCKET/KEY or s3://BUCKET/PREFIX/")
        return bucket, side_key(output_of(key), "status.json")

    # --- before the listing: refusals that cost a request or two

    def check(self, cfg: JobConfig, client, yarn_retry: bool = False) -> None:
        """Writable, and not there unless ``--overwrite``, ``--resume``, ``--skip-existing`` or YARN's next attempt
        may take it; raises :class:`JobError` saying what to do."""
        try:
            access.check_writable(client, self.bucket, self.key)
        except access.OutputNotWritableError as exc:
            raise JobError(str(exc)) from exc
        found = self.contents(cfg, client)
        self.refuse_foreign(found)
        if cfg.overwrite or cfg.resume or cfg.skip_existing or yarn_retry:
            return
        try:
            exists = self.exists(cfg, client, found)
        except clients.S3_ERRORS as exc:
            raise JobError(f"cannot read {self.uri}: {first_line(exc)}; the job needs s3:GetObject and "
                           "s3:ListBucket on the output bucket") from exc
        if exists:
            self.refuse_existing(cfg)

    def refuse_foreign(self, found) -> None:
        """Refuse, whatever the flags, what the output holds that the job did not write (``found``:
        :meth:`contents`); nothing for most."""

    def contents(self, cfg: JobConfig, client):
        """What the output holds, read once for every look at it (a dataset's listing); ``None`` when nothing
        needs reading."""

    def exists(self, cfg: JobConfig, client, found) -> bool:
        """Whether the output is there (``found``: :meth:`contents`): the object, or its summary."""
        return any(access.object_exists(client, self.bucket, key) for key in (self.key, self.side_key("summary.json")))

    def refuse_existing(self, cfg: JobConfig):
        """Raise for an output that is there and that this run would replace: what to add, the usual intent
        first (``--skip-existing`` for an output that takes new rows)."""
        if self.adds_rows:
            raise JobError(f"{self.uri} (or its summary) already exists; add --skip-existing to score only the keys "
                           "it lacks, or --overwrite to replace it")
        raise JobError(f"{self.uri} (or its summary) already exists; add --overwrite to replace it")

    # --- after the listing

    def settle(self, cfg: JobConfig, client, images):
        """``(images, settled)``: what a resumed run left that the output itself must take first (an Iceberg
        table's whole files committed), and the listed keys left. Nothing for most."""
        return images, None

    def existing(self, cfg: JobConfig, client, images):
        """``--skip-existing``: what the output holds, read once, and the listed keys it lacks
        (:class:`mxjob.outputs.existing.Existing`)."""
        raise JobError(f"--skip-existing does not apply to {self.uri}")

    def open(self, cfg: JobConfig, schema, fingerprint: dict) -> None:
        """Before any Spark work: make or check what must exist with the run's columns (``schema``: the Parquet
        view of its rows and carried columns) and fingerprint (an Iceberg table). Nothing for most."""

    # --- the workload (mxjob.outputs.claim)

    def progress_advice(self, work) -> str:
        """What to do with an earlier run's progress (under ``work``) this run does not resume."""
        return "add --resume to finish it, or --overwrite to discard it and start again"

    def check_fingerprints(self, existing, fingerprint: dict) -> None:
        """``--skip-existing``: refuse to add rows made otherwise than the rows the output holds (``existing``)."""

    def clear(self, cfg: JobConfig, client, found) -> None:
        """``--overwrite``: remove what must go before any new file appears (a dataset's files); nothing for an
        object, which its upload replaces whole."""

    def files(self, cfg: JobConfig, client, planning: LayoutInputs):
        """The run's files (a :class:`mxjob.outputs.dataset.DatasetLayout`) for an output that cuts its rows into
        files; ``None`` for one object."""

    def left_upload(self, key: str) -> bool:
        """Whether an open upload under the output's key is one of this output's that a killed driver left."""
        return key == self.key

    def finish_nothing_new(self, cfg: JobConfig, client, work, found) -> None:
        """A ``--skip-existing`` run with nothing to score: remove what the run it resumes left (its files)."""

    # --- writing

    def sink(self, cfg: JobConfig, client, work, workload):
        """The sink the merge writes the rows into, in key order: ``write``, ``close``, ``abort``
        (:mod:`mxjob.outputs.merge`); ``workload`` is the run's (:class:`mxjob.outputs.work_prefix.Workload`)."""
        raise NotImplementedError

    def summary_entry(self, sink, workload) -> dict | None:
        """The summary's :attr:`summary_field` entry, from the sink once closed (``None`` for most)."""


def s3_object(uri: str, settings=None) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://`` output; a URI that is none, or names no object, raises :class:`OutputError`
    (naming the option as ``settings`` has it)."""
    flag = settings.name("output") if settings is not None else "--output"
    try:
        bucket, key = uris.parse_s3_uri(uri)
    except uris.S3UriError as exc:
        raise OutputError(f"{flag}: {exc}") from None
    if not key.strip("/"):
        raise OutputError(f"{flag}: {uri!r} names no object and no prefix; expected s3://BUCKET/KEY (one object) or "
                          "s3://BUCKET/PREFIX/ (a Parquet dataset)")
    return bucket, key


def refuse_gzipped_parquet(settings, key: str, fmt: str) -> None:
    """A Parquet output (an object, a dataset's prefix, or a ``.parquet.gz`` key) whose name ends in ``.gz``.

    Parquet compresses its own columns, and no Parquet reader opens a file
    inside gzip: the job writes no such file, and a ``.gz`` name over plain
    Parquet would mislead every reader that picks gzip by the suffix.
    """
    name = key.rstrip("/")
    if not name.lower().endswith(".gz") or not (fmt == "parquet" or name[:-len(".gz")].lower().endswith(".parquet")):
        return
    what = "the prefix of a Parquet dataset" if is_prefix(key) else "a Parquet output"
    drop = f" and drop {settings.name('output_format')}" if settings["output_format"] == "parquet" else ""
    raise OutputError(f"the output {key!r} ends in .gz but is {what}: Parquet compresses its own columns (zstd), and "
                      "pyarrow, Spark and Athena cannot read Parquet inside gzip. Drop the .gz to write Parquet, or "
                      f"for gzipped JSON Lines give an output key ending in .jsonl.gz{drop}")


def refuse_foreign_suffix(key: str, kind: type[ObjectOutput]) -> None:
    """A key whose suffix (before a ``.gz``) says another format or compression than ``kind`` writes.

    A key with none of the kinds' suffixes is JSON Lines (``s3://bucket/results``), but not one named ``.csv`` or
    ``.zst``: every reader going by the name would misread what the job wrote. A kind that claims the suffix itself
    (a ``--plugin``'s CSV output) is not refused.
    """
    name = key.lower()
    stem = name[:-len(".gz")] if name.endswith(".gz") else name
    suffix = next((x for x in FOREIGN_SUFFIXES if stem.endswith(x)), None)
    if suffix is None or name.endswith(kind.suffixes):
        return
    rows = "JSON Lines" if kind.format == "jsonl" else "Parquet"
    ending = suffix + name[len(stem):]
    raise OutputError(f"the output key {key!r} ends in {ending}, so readers would take it for "
                      f"{FOREIGN_SUFFIXES[suffix]}, but the job would write {rows} there: end the key in "
                      f"{kind.suffixes[0]}, or give another of the outputs the job writes: {forms()}")


class ObjectOutput(Output):
    """One object, written by one multipart upload completed only when whole: JSON Lines or Parquet."""

    #: The key's endings that name this kind (the first is the one to suggest).
    suffixes: ClassVar[tuple] = ()

    @classmethod
    def claims(cls, uri: str, requested_format: str | None) -> bool:
        if not uris.is_s3_uri(uri) or is_prefix(uri):
            return False
        return requested_format == cls.format if requested_format else uri.lower().endswith(cls.suffixes)

    @classmethod
    def parse(cls, uri: str, settings) -> Output:
        """One object; ``--output-format`` that the key's suffix contradicts is refused, as is Parquet under ``.gz``."""
        output = super().parse(uri, settings)
        requested, key = settings["output_format"], output.key.lower()
        for other in kinds():
            if requested and issubclass(other, ObjectOutput) and other.format != cls.format and key.endswith(
                    other.suffixes):
                suffix = next(x for x in other.suffixes if key.endswith(x))
                raise OutputError(f"{settings.name('output_format')} {requested} does not match the output key "
                                  f"{output.key!r}, whose {suffix} suffix says {other.format}: end the key in "
                                  f"{cls.suffixes[0]}, or drop --output-format (the key's suffix chooses), or give "
                                  f"--output-format {other.format}")
        refuse_gzipped_parquet(settings, output.key, cls.format)
        refuse_foreign_suffix(output.key, cls)
        return output

    @property
    def content_type(self) -> str:
        """The object's Content-Type."""
        return "application/octet-stream"

    def writer(self, client) -> writes.MultipartWriter:
        """The object's upload; parts of S3's smallest size, so the last one, after the last batch, is small."""
        try:
            return writes.MultipartWriter(client, self.bucket, self.key, part_bytes=writes.MIN_PART_BYTES,
                                          content_type=self.content_type)
        except Exception as exc:
            raise JobError(f"cannot write {self.uri}: {first_line(exc)}; the job needs s3:PutObject on the output "
                           "key") from exc


# ----------------------------------------------------------------------------
# The registry


_KINDS: list[type[Output]] = []


def register(kind: type[Output]) -> type[Output]:
    """Add an output kind; the latest registered is asked first (a ``--plugin``'s before the built-ins)."""
    unregister(kind)
    _KINDS.insert(0, kind)
    return kind


def unregister(kind: type[Output]) -> None:
    """Take ``kind`` out of the registry (a test's, once it is done with it)."""
    if kind in _KINDS:
        _KINDS.remove(kind)


def kinds() -> tuple[type[Output], ...]:
    """The registered kinds, in the order :func:`resolve` asks them."""
    return tuple(_KINDS)


def forms() -> str:
    """``--output``'s forms of the registered kinds, the built-ins first, for messages."""
    return ", ".join(kind.form for kind in reversed(_KINDS) if kind.form)


def kind_of(uri: str, requested_format: str | None = None) -> type[Output]:
    """The kind that claims ``uri``; none raises :class:`OutputError`."""
    for kind in _KINDS:
        if kind.claims(uri, requested_format):
            return kind
    raise OutputError(f"{uri!r} is not an output the job writes; expected one of {forms()}")


def resolve(uri: str, settings) -> Output:
    """The run's output ``uri``, parsed and checked with the options (``settings``) by the kind that claims it;
    raises :class:`OutputError`."""
    kind = kind_of(uri, settings["output_format"])
    kind.check_options(uri, settings)
    return kind.parse(uri, settings)
