"""Credentials kept out of everything the job writes or logs: URIs' userinfo, signatures, tokens and keys redacted.

A user may put a password in ``--endpoint-url`` (``http://user:secret@host``)
or run with a session token in the environment; the summary, the status, the
report, the resume command, the error lines, the log and Spark's event log
must hold neither. :func:`redact` masks them in any text,
:func:`redact_values` in a JSON-like value, :class:`RedactingFilter` in every
log record a handler writes, and :func:`spark_redaction_regex` extends
Spark's own ``spark.redaction.regex`` so the UI and the event log mask a
property whose value holds a URI's userinfo (the driver's command line among
them). Hand-written because no library we ship covers these few patterns;
tests/unit/core/test_secrets.py checks each.
"""

from __future__ import annotations

import logging
import re
from typing import Any

#: What stands where a secret was.
MASK = "REDACTED"
#: ``scheme://user:password@host`` (or ``scheme://token@host``): the userinfo, up to its ``@``.
_USERINFO = re.compile(r"(?<=://)[^/\s@'\"<>]+@")
#: A presigned URL's or a signed request's secret parts, as query parameters or headers.
_SIGNED = re.compile(r"(?i)\b(x-amz-signature|x-amz-credential|x-amz-security-token|awsaccesskeyid|signature)"
                     r"(=|['\"]?\s*:\s*b?['\"]?)[^&\s'\",}]+")
#: An ``Authorization`` header's value (AWS4-HMAC-SHA256 Credential=..., Signature=...; Basic ...).
_AUTHORIZATION = re.compile(r"(?i)(['\"]?authorization['\"]?\s*[:=]\s*b?['\"]?)[^'\"\n}]+")
#: Keys, secrets and tokens by name, as botocore and the AWS CLI spell them in a dict, a config file or an env.
_NAMED = re.compile(r"(?i)(['\"]?(?:aws_)?(?:secret_access_key|secretaccesskey|session_token|sessiontoken|"
                    r"security_token|securitytoken)['\"]?\s*[:=]\s*['\"]?)[^'\"\s,}]+")
#: Spark's own default for ``spark.redaction.regex`` (when the configuration sets none).
SPARK_DEFAULT_REDACTION = "(?i)secret|password|token|access[.]?key"
#: A Spark property whose value holds a URI's userinfo (Java regex syntax).
SPARK_USERINFO = "://[^/@\\s]+@"


def redact(text: str) -> str:
    """``text`` with every URI's userinfo, signature, token, key and Authorization value replaced by :data:`MASK`."""
    if not text or not isinstance(text, str):
        return text
    text = _USERINFO.sub(MASK + "@", text)
    text = _SIGNED.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", text)
    text = _AUTHORIZATION.sub(lambda m: f"{m.group(1)}{MASK}", text)
    return _NAMED.sub(lambda m: f"{m.group(1)}{MASK}", text)


def redact_values(value: Any) -> Any:
    """A JSON-like value (dicts, lists, strings) with :func:`redact` applied to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_values(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact_values(item) for item in value)
    return value


class RedactingFilter(logging.Filter):
    """A handler's filter that writes every record redacted (its message formatted first, then masked)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a record whose arguments do not fit: logging reports that itself
            return True
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:  # a traceback's text is formatted from the exception: mask it
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


#: Loggers whose DEBUG lines carry request headers, signatures and tokens: they stay at INFO.
CHATTY_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def guard_logging(level: int) -> None:
    """Redact every record the root logger's handlers write, and keep AWS's wire-level loggers at INFO or above."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.INFO))


def spark_redaction_regex(configured: str | None) -> str:
    """Spark's ``spark.redaction.regex`` with :data:`SPARK_USERINFO` added (to the configured one, else Spark's
    default), so a property or environment variable whose value holds a URI's userinfo is masked too."""
    base = configured or SPARK_DEFAULT_REDACTION
    return base if SPARK_USERINFO in base else f"{base}|{SPARK_USERINFO}"
