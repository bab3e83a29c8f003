"""A Protobuf ``PageView`` message for the registry serde tests, built from its descriptor (no
protoc on these machines): ``message PageView { string user = 1; string page = 2;
int64 ts = 3; }`` in package ``sparkpoint.tests``."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def _message_class() -> Any:
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName("sparkpoint.tests.PageView")
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(
            name="sparkpoint_tests/pageview.proto", package="sparkpoint.tests", syntax="proto3"
        )
        message = proto.message_type.add(name="PageView")
        field = descriptor_pb2.FieldDescriptorProto
        for number, (name, kind) in enumerate(
            (("user", field.TYPE_STRING), ("page", field.TYPE_STRING), ("ts", field.TYPE_INT64)),
            start=1,
        ):
            message.field.add(name=name, number=number, type=kind, label=field.LABEL_OPTIONAL)
        pool.Add(proto)
        descriptor = pool.FindMessageTypeByName("sparkpoint.tests.PageView")
    return message_factory.GetMessageClass(descriptor)


PageView = _message_class()
