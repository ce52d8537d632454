"""The Athena table over the Parquet output: the ``CREATE EXTERNAL TABLE`` statement for its schema.

:func:`athena_ddl` gives each column its Athena (Hive DDL) type
(:func:`athena_type`) and quotes the names Athena would not take bare
(:func:`athena_name`); ``docs/output.md``'s tables are made with it
(:mod:`mxjob.reporting.output_docs`).
"""

from __future__ import annotations

import pyarrow as pa

#: Athena's DDL keywords (its "reserved keywords to escape in DDL statements"): a name among them needs backticks.
ATHENA_RESERVED = frozenset("""
    all alter and array as authorization between bigint binary boolean both by case cashe cast char column conf
    constraint commit create cross cube current current_date current_timestamp cursor database date dayofweek
    decimal delete describe distinct div double drop else end exchange exists extended external extract false fetch
    float floor following for foreign from full function grant group grouping having if import in inner insert int
    integer intersect interval into is join lateral left less like local macro map more none not null numeric of on
    only or order out outer over partialscan partition percent preceding precision preserve primary procedure range
    reads reduce regexp references revoke right rlike rollback rollup row rows select set smallint start table
    tablesample then time timestamp to transform trigger true truncate unbounded union uniquejoin update user using
    utc_timestamp values varchar views when where window with
""".split())
#: Arrow's scalar types as Athena's (Hive DDL) column types.
_ATHENA_SCALARS = {pa.string(): "string", pa.large_string(): "string", pa.int8(): "tinyint", pa.int16(): "smallint",
                   pa.int32(): "int", pa.int64(): "bigint", pa.float32(): "float", pa.float64(): "double",
                   pa.bool_(): "boolean", pa.binary(): "binary", pa.large_binary(): "binary"}
#: Why a half-float column gets no table: pyarrow writes it as Parquet's FLOAT16 logical type
#: (2-byte FIXED_LEN_BYTE_ARRAY), which Athena's Trino engine refuses and Spark 3.5's Parquet reader cannot open.
_FLOAT16_REFUSAL = ("float16 is written as Parquet's FLOAT16 logical type, which Athena (and Spark 3.5) cannot "
                    "read: leave --embedding-dtype at float32 for a table")


def athena_type(type_: pa.DataType, column: str) -> str:
    """The Athena (Hive DDL) type of an Arrow type as the job writes it to Parquet.

    Lists of any kind (``list``, ``large_list``, ``fixed_size_list``) are
    ``array<...>``; structs ``struct<name:type,...>``. A type Athena cannot
    read, or that has no mapping here, raises ``ValueError`` naming ``column``.
    """
    if type_ in _ATHENA_SCALARS:
        return _ATHENA_SCALARS[type_]
    if pa.types.is_float16(type_):
        raise ValueError(f"column {column}: {_FLOAT16_REFUSAL}")
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return f"array<{athena_type(type_.value_type, column)}>"
    if pa.types.is_struct(type_):
        members = [f"{athena_name(field.name)}:{athena_type(field.type, f'{column}.{field.name}')}"
                   for field in type_]
        return f"struct<{','.join(members)}>"
    raise ValueError(f"column {column}: Arrow type {type_} has no Athena type here")


def athena_name(name: str) -> str:
    """``name`` as an Athena DDL identifier: in backticks when it is a DDL keyword or not letters, digits and ``_``."""
    if "`" in name or not name:
        raise ValueError(f"{name!r} cannot be an Athena name (empty, or holds a backtick)")
    plain = name.isascii() and name[0].isalpha() and all(c.isalnum() or c == "_" for c in name)
    return name if plain and name.lower() not in ATHENA_RESERVED else f"`{name}`"


def athena_ddl(schema_: pa.Schema, table: str, location: str) -> str:
    """The ``CREATE EXTERNAL TABLE`` statement that lets Athena read Parquet files of ``schema_``.

    Parameters
    ----------
    schema_ : pyarrow.Schema
        The Parquet output's schema: :func:`parquet_view.parquet_schema`, or ``pq.read_schema`` of an output file.
    table : str
        The table, ``name`` or ``database.name``.
    location : str
        The S3 folder that holds the Parquet files and nothing else Athena would read:
        ``s3://bucket/prefix/``, with its trailing slash.

    Returns
    -------
    str
        One statement: every column in the schema's order, each with its Athena type,
        ``STORED AS PARQUET`` and ``LOCATION``. No compression property: it is for
        writing, and each Parquet column chunk names its own codec.

    Raises
    ------
    ValueError
        A column of a type Athena cannot read (``float16``) or that has no mapping,
        two names Athena would take as one (it lower-cases them), or a location
        that is not an S3 folder.

    Examples
    --------
    >>> print(athena_ddl(pa.schema([("key", pa.string())]), "photos", "s3://b/p/"))
    CREATE EXTERNAL TABLE photos (
      key string
    )
    STORED AS PARQUET
    LOCATION 's3://b/p/';
    """
    if not (location.startswith("s3://") and location.endswith("/") and len(location) > len("s3://") + 1) \
            or "'" in location:
        raise ValueError(f"LOCATION must be an S3 folder, s3://bucket/prefix/ with a trailing slash: {location!r}")
    seen: dict[str, str] = {}
    for name in schema_.names:
        if name.lower() in seen:
            raise ValueError(f"columns {seen[name.lower()]} and {name}: Athena lower-cases names, so they clash")
        seen[name.lower()] = name
    columns = [f"  {athena_name(field.name)} {athena_type(field.type, field.name)}" for field in schema_]
    name = ".".join(athena_name(part) for part in table.split("."))
    return (f"CREATE EXTERNAL TABLE {name} (\n" + ",\n".join(columns) + "\n)\nSTORED AS PARQUET\n"
            f"LOCATION '{location}';")
