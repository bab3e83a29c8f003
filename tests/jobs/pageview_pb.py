"""Protobuf messages for the registry serde tests, built from their descriptors (no protoc on
these machines): ``message PageView { string user = 1; string page = 2; int64 ts = 3; }`` in
package ``sparkpoint.tests``, and ``message UserCount { int64 count = 1; }`` in package
``sparkpoint.other`` (another file)."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

FIELD = descriptor_pb2.FieldDescriptorProto


def _message_class(package: str, name: str, fields: list[tuple[str, int]]) -> Any:
    pool = descriptor_pool.Default()
    try:
        descriptor = pool.FindMessageTypeByName(f"{package}.{name}")
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(
            name=f"{package.replace('.', '_')}/{name.lower()}.proto",
            package=package,
            syntax="proto3",
        )
        message = proto.message_type.add(name=name)
        for number, (field, kind) in enumerate(fields, start=1):
            message.field.add(name=field, number=number, type=kind, label=FIELD.LABEL_OPTIONAL)
        pool.Add(proto)
        descriptor = pool.FindMessageTypeByName(f"{package}.{name}")
    return message_factory.GetMessageClass(descriptor)


PageView = _message_class(
    "sparkpoint.tests",
    "PageView",
    [("user", FIELD.TYPE_STRING), ("page", FIELD.TYPE_STRING), ("ts", FIELD.TYPE_INT64)],
)
UserCount = _message_class("sparkpoint.other", "UserCount", [("count", FIELD.TYPE_INT64)])
