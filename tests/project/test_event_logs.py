"""tests/support/event_logs.py reads Spark 3.5's plain event logs and Spark 4's rolled, zstd-compressed ones alike."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from tests.support import event_logs

START = {"Event": "SparkListenerApplicationStart", "App ID": "local-1795900000000"}
ENVIRONMENT = {"Event": "SparkListenerEnvironmentUpdate", "Spark Properties": {"spark.master": "local"}}

pytestmark = pytest.mark.stacks


def lines(*records: dict) -> bytes:
    return "".join(json.dumps(record) + "\n" for record in records).encode()


def test_a_plain_log_and_a_rolled_zstd_one_read_the_same(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "local-1795900000000").write_bytes(lines(START, ENVIRONMENT))
    rolled = tmp_path / "rolled" / "eventlog_v2_local-1795900000000"
    rolled.mkdir(parents=True)
    (rolled / "appstatus_local-1795900000000").write_bytes(b"")
    for index, record in enumerate((START, ENVIRONMENT), 1):  # two rolled files, each a zstd stream
        with pa.output_stream(str(rolled / f"events_{index}_local-1795900000000.zstd"), compression="zstd") as out:
            out.write(lines(record))
    assert event_logs.events(plain) == event_logs.events(tmp_path / "rolled") == [START, ENVIRONMENT]
    assert event_logs.application_ids(tmp_path / "rolled") == ["local-1795900000000"]
    assert all(p.read_bytes().startswith(b"\x28\xb5\x2f\xfd") for p in rolled.glob("events_*"))  # zstd frames


def test_no_log_at_all_fails_rather_than_passing_a_search_over_nothing(tmp_path):
    with pytest.raises(AssertionError, match="no Spark event log under"):
        event_logs.events(tmp_path)


def test_a_codec_it_cannot_read_is_named(tmp_path):
    (tmp_path / "events_1_app.lz4").write_bytes(b"\x00")
    with pytest.raises(AssertionError, match="a codec these tests cannot read"):
        event_logs.event_logs(tmp_path)
