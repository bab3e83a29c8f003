"""``collector.forward``: a message re-keyed as it arrived, its bytes as read when both
streams' message serdes are the same (a change to the decoded message is not sent); an envelope
other than the one being processed, or another serde, is encoded again. Timestamped when sent,
as ``send`` does."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sparkpoint import StreamTask, SystemStream
from sparkpoint.model import SystemStreamPartition
from sparkpoint.system.base import StreamSpec
from sparkpoint.system.registry import Systems
from sparkpoint.testing import JobTestDriver

CONFIG = {
    "job.name": "forwards",
    "systems.log.factory": "filelog",
    "task.inputs": "log.views, log.words",
    "streams.views.partitions": "1",
    "streams.words.partitions": "1",
    "streams.words.samza.msg.serde": "string",
    "streams.out.partitions": "1",
    "streams.text.partitions": "1",
    "streams.text.samza.msg.serde": "string",
}

#: as another writer may have encoded them: spaces, key order
VIEWS = [b'{"user":  "ann", "page": "/a"}', b'{ "page": "/b", "user": "bob" }']
WORDS = [b"hello  world"]


class Forwarder(StreamTask):
    def init(self, context: Any) -> None:
        self.earlier: Any = None

    def process(self, envelope: Any, collector: Any, coordinator: Any) -> None:
        message = envelope.message
        if envelope.ssp.stream == "words":  # string in: to json (encoded), to string (as read)
            collector.forward(envelope, SystemStream("log", "out"), "word")
            collector.forward(envelope, SystemStream("log", "text"), "word")
            return
        user = message["user"]
        message["seen"] = True  # changed after it was read: forward sends the bytes as read
        collector.forward(envelope, SystemStream("log", "out"), user)
        if self.earlier is not None:  # not the message being processed: encoded again
            collector.forward(self.earlier, SystemStream("log", "out"), "earlier")
        self.earlier = envelope


def _raw(config: Any, stream: str) -> list[tuple[bytes | None, bytes | None, int]]:
    systems = Systems(config)
    try:
        consumer = systems.consumer("log")
        ssp = SystemStreamPartition("log", stream, 0)
        consumer.register(ssp, "0")
        return [(r.key, r.value, r.timestamp) for r in consumer.read(ssp, "0", "100")]
    finally:
        systems.close()


def test_forward_re_keys_a_message_as_it_arrived(tmp_path: Path) -> None:
    with JobTestDriver(CONFIG, tmp_path, task=Forwarder) as job:
        systems = Systems(job.config)
        try:
            for stream in ("views", "words"):
                systems.admin("log").create_stream(StreamSpec(stream, 1))
            producer = systems.producer("log")
            for i, value in enumerate(VIEWS):
                producer.send_fields("views", 0, ("", b"page", value, 1_000 + i))
            producer.send_fields("words", 0, ("", None, WORDS[0], 5_000))
            producer.flush()
        finally:
            systems.close()
        started = time.time_ns() // 1_000_000
        job.run()
        out = _raw(job.config, "out")
        text = _raw(job.config, "text")
    assert all(ts >= started for _k, _v, ts in out + text)  # stamped when sent
    pairs = [(k, v) for k, v, _ts in out]
    assert [(k, v) for k, v in pairs if k in (b"ann", b"bob")] == [
        (b"ann", VIEWS[0]),
        (b"bob", VIEWS[1]),
    ]
    # the envelope kept from the first view, forwarded while the second was processed
    earlier = b'{"page":"/a","seen":true,"user":"ann"}'
    assert [(k, v) for k, v in pairs if k == b"earlier"] == [(b"earlier", earlier)]
    assert [(k, v) for k, v in pairs if k == b"word"] == [(b"word", b'"hello  world"')]
    assert [(k, v) for k, v, _ts in text] == [(b"word", WORDS[0])]
