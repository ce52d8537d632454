"""``iceberg://CATALOG/NAMESPACE.TABLE``: an output URI naming an Apache Iceberg table, parsed.

Apart from :mod:`mxjob.outputs.iceberg_catalog` so that the command line checks the
URI without importing pyiceberg (about half a second).
"""

from __future__ import annotations

SCHEME = "iceberg://"
#: What an output URI naming a table looks like, for messages.
URI_FORM = "iceberg://CATALOG/NAMESPACE.TABLE"


class TableUriError(ValueError):
    """An ``iceberg://`` URI that does not name a catalog, a namespace and a table."""


def is_table_uri(uri: str) -> bool:
    """Whether ``uri`` names an Iceberg table (it starts with ``iceberg://``)."""
    return uri.startswith(SCHEME)


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
    if not is_table_uri(uri):
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
