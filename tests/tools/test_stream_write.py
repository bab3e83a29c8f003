"""``sparkpoint stream write`` that fails part-way (issue 72): with one partition damaged, a
write of 400 records by key wrote those of the other partitions, then said "Nothing was
written", so a retry wrote them twice. The error now says what was written, per partition,
and the offsets it gives are what a reader finds there."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sparkpoint.config import load_config
from sparkpoint.errors import CorruptRecordError
from sparkpoint.model import SystemStream, SystemStreamPartition
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.tools.streams import Message, send_messages, write_json_lines
from tests.conftest import pageviews_config

STREAM = SystemStream("filelog", "pageviews")


def _lines(n: int, start: int = 0) -> io.StringIO:
    rows = (json.dumps({"key": f"u{i}", "value": {"user": f"u{i}"}}) for i in range(start, n))
    return io.StringIO("".join(r + "\n" for r in rows))


def test_a_write_stopped_by_a_damaged_partition_says_what_it_wrote(tmp_path: Path) -> None:
    config = load_config(None, pageviews_config(tmp_path))
    systems = Systems(config)
    systems.admin("filelog").create_stream(StreamSpec("pageviews", 4))
    assert write_json_lines(config, systems, STREAM, _lines(40)) == 40
    log = tmp_path / "data" / "streams" / "filelog" / "pageviews" / "2" / "0.log"
    log.write_bytes(log.read_bytes()[:-3])  # partition 2's last record, damaged
    admin = systems.admin("filelog")
    ssps = [SystemStreamPartition("filelog", "pageviews", p) for p in range(4)]
    before = {s.partition: int(m.upcoming) for s, m in admin.get_metadata(ssps).items()}
    # partitions 0 and 1 first (flushed every 50), then partition 2, then 3
    order = [0] * 60 + [1] * 60 + [2] * 10 + [3] * 10
    messages = (Message({"n": i}, f"u{i}", p) for i, p in enumerate(order))
    with pytest.raises(CorruptRecordError) as failed:
        send_messages(config, Systems(config), STREAM, messages, batch=50)
    message = str(failed.value)
    assert "partition 2 at offset" in message and "stream repair" in message
    after = {s.partition: int(m.upcoming) for s, m in admin.get_metadata(ssps).items()}
    written = {p: after[p] - before[p] for p in range(4) if after[p] != before[p]}
    assert written == {0: 60, 1: 60}, (before, after)  # all but what partition 2 and 3 got
    total = sum(written.values())
    assert f"before it stopped, {total} records were written (" in message
    for p, n in written.items():
        assert f"partition {p}: {n} (offsets {before[p]}..{after[p] - 1})" in message
    assert "a retry of the same input writes those again" in message
