"""Credentials masked (mxjob/core/secrets.py): in any text, in JSON values, in every log record, in Spark's redaction
regex; and in the places the job writes them from: the options the summary and report show, the resume command, a
one-line error."""

from __future__ import annotations

import io
import logging
import re

import pytest

from mxjob.core import secrets
from mxjob.core.errors import error_object, first_line
from mxjob.options import config
from mxjob.run import rerun


@pytest.mark.parametrize(("text", "masked"), [
    ("http://user:s3cret@host:9000/b", "http://REDACTED@host:9000/b"),
    ("see https://token@proxy.example/x and s3://bucket/k@2x.png", "see https://REDACTED@proxy.example/x and "
                                                                   "s3://bucket/k@2x.png"),
    ("GET /b/k?X-Amz-Signature=abc123&X-Amz-Credential=AKIA%2F&x=1",
     "GET /b/k?X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&x=1"),
    ("headers={'X-Amz-Security-Token': b'FQoGZX', 'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIA/x, Sig=1'}",
     "headers={'X-Amz-Security-Token': b'REDACTED', 'Authorization': b'REDACTED'}"),
    ("aws_secret_access_key = wJalrXUtnFEMI", "aws_secret_access_key = REDACTED"),
    ("{'SessionToken': 'IQoJb3JpZ2lu', 'Expiration': 1}", "{'SessionToken': 'REDACTED', 'Expiration': 1}"),
    ("nothing secret in s3://b/photos/cat.jpg", "nothing secret in s3://b/photos/cat.jpg"),
])
def test_redact_masks_userinfo_signatures_tokens_and_keys_and_nothing_else(text, masked):
    assert secrets.redact(text) == masked


def test_a_json_value_is_masked_throughout():
    value = {"endpoint_url": "http://u:p@h", "list": ["x", "https://a:b@c/d"], "n": 3, "none": None}
    assert secrets.redact_values(value) == {"endpoint_url": "http://REDACTED@h", "list": ["x", "https://REDACTED@c/d"],
                                            "n": 3, "none": None}


def test_every_log_record_is_masked_and_botocore_stays_at_info_whatever_the_level(monkeypatch):
    root = logging.getLogger()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    monkeypatch.setattr(root, "handlers", [handler])
    monkeypatch.setattr(root, "level", logging.DEBUG)
    for name in secrets.CHATTY_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    secrets.guard_logging(logging.DEBUG)
    logging.getLogger("mxjob.test").info("endpoint %s", "http://user:pw123@h")
    logging.getLogger("botocore.endpoint").debug("Sending request with X-Amz-Security-Token=tok456")
    try:
        raise ValueError("cannot reach http://user:pw789@h")
    except ValueError:
        logging.getLogger("mxjob.test").exception("failed")
    text = stream.getvalue()
    assert "endpoint http://REDACTED@h" in text
    assert "pw123" not in text and "tok456" not in text and "pw789" not in text
    assert logging.getLogger("botocore").getEffectiveLevel() == logging.INFO


def test_sparks_redaction_regex_gains_userinfo_once():
    assert secrets.spark_redaction_regex(None) == f"{secrets.SPARK_DEFAULT_REDACTION}|{secrets.SPARK_USERINFO}"
    configured = "(?i)secret|credential"
    extended = secrets.spark_redaction_regex(configured)
    assert extended == f"{configured}|{secrets.SPARK_USERINFO}"
    assert secrets.spark_redaction_regex(extended) == extended
    # Java and Python agree on this much: the driver's command line, as Spark's environment lists it, matches.
    assert re.search(extended.replace("(?i)", ""), "infer_main.py --endpoint-url http://u:p@h:9000", re.I)


def test_the_options_the_summary_shows_and_the_resume_command_hold_no_password():
    cfg = config.resolve(config.merge_settings({"input": "s3://in/", "model": "s3://m/r", "output": "s3://o/p.jsonl",
                                                "endpoint_url": "http://user:pw@h:9000"}, {}))
    assert cfg.endpoint_url == "http://user:pw@h:9000"  # the job itself still uses it
    assert cfg.options()["endpoint_url"] == "http://REDACTED@h:9000"
    command = rerun.resume_command(["infer_main.py", "--endpoint-url", "http://user:pw@h:9000", "--input", "s3://i/"],
                                   conf={})
    assert "pw" not in command.replace("REDACTED", "") and "http://REDACTED@h:9000" in command


def test_an_error_line_and_a_one_line_error_hold_no_password():
    exc = ConnectionError("Could not connect to the endpoint URL: http://user:pw@h:9000/b/k")
    assert first_line(exc) == "Could not connect to the endpoint URL: http://REDACTED@h:9000/b/k"
    assert "pw" not in error_object("download", exc)["message"].replace("REDACTED", "")
