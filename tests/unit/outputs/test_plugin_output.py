"""The plug-in output of ``tests/support/plugin_output.py`` (a CSV of top-1) in this process, without Spark.

Registered for a test (``registered``) and taken back after it: it claims its
URIs before the built-ins, and the command line resolves ``--output
s3://BUCKET/KEY.csv`` to it. ``tests/integration/test_plugin_output.py``
writes it end to end through spark-submit with ``--plugin``.
"""

from __future__ import annotations

import pytest

from mxjob import outputs
from tests.support.plugin_output import CsvOutput


@pytest.fixture
def registered():
    """The output registered for a test in this process, and taken back after it."""
    outputs.register(CsvOutput)
    yield CsvOutput
    outputs.unregister(CsvOutput)


def test_a_registered_output_claims_its_uris_first_and_leaves_the_rest_to_the_built_ins(registered):
    assert outputs.kinds()[0] is CsvOutput
    assert outputs.kind_of("s3://b/top.csv") is CsvOutput
    assert outputs.kind_of("s3://b/top.jsonl") is outputs.JsonLinesOutput
    assert outputs.kind_of("s3://b/p/") is outputs.DatasetOutput


def test_the_command_line_resolves_a_registered_outputs_uri_to_it(registered):
    from mxjob.options import config

    cfg = config.resolve(config.merge_settings({"input": "s3://b/i/", "model": "s3://b/m", "output": "s3://b/t.csv"},
                                               {}))
    assert isinstance(cfg.output, CsvOutput) and cfg.output_format == "parquet"
    assert cfg.summary_key == "t.csv.summary.json" and cfg.job_spec().json_lines is False
