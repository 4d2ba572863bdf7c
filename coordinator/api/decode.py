"""Request decoding: a string field that is not valid UTF-8 is an InvalidArgument naming the field.

protobuf refuses to parse a message whose ``string`` field holds bytes that
are not UTF-8 (``DecodeError``); grpc.aio then answered UNKNOWN ("Unexpected
DecodeError") and logged an ERROR traceback. :func:`add_lock_service`
registers the LockService servicer as the generated
``add_LockServiceServicer_to_server`` does, with each request deserializer
wrapped: on a DecodeError it re-parses the bytes with a "bytes twin" of the
request type (the same messages with every ``string`` field turned into
``bytes``, built once in a private ``DescriptorPool``) and, when a string
field holds invalid UTF-8, returns an :class:`Undecodable` in place of the
request. The servicer refuses it with INVALID_ARGUMENT (``ErrorInfo`` with
the field, as for every other bad field): unary calls in
:func:`.rpcs.served`, the KeepAlive stream in :class:`.stream.KeepAliveStream`.
Bytes that protobuf cannot parse at all (a corrupt wire format) are an
:class:`Undecodable` without a field: INVALID_ARGUMENT / INVALID_FIELD with
no ``field`` in the ErrorInfo (before, UNKNOWN and an ERROR traceback too;
found by tests/test_property.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message

from fencepost.client.errors import InvalidArgument
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

__all__ = ["Undecodable", "add_lock_service", "bytes_twin", "invalid_text_field"]

_SERVICE = lock_pb2.DESCRIPTOR.services_by_name["LockService"]


@dataclasses.dataclass(frozen=True)
class Undecodable:
    """A request protobuf cannot parse (handed to the servicer instead).

    Attributes:
        message: The request's message type (``"AcquireRequest"``).
        field: The string field whose bytes are not UTF-8; None when the
            bytes are no ``message`` at all (a corrupt wire format).
    """

    message: str
    field: str | None

    def error(self) -> InvalidArgument:
        """The refusal: InvalidArgument naming the field (no field for bytes that are no protobuf)."""
        if self.field is None:
            return InvalidArgument(f"the request is not a valid {self.message} (protobuf cannot parse it)")
        return InvalidArgument(f"{self.field} must be valid UTF-8 (a {self.message} whose {self.field} "
                               f"holds bytes that are not UTF-8)", field=self.field)


def _strings_to_bytes(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    for nested in message.nested_type:
        _strings_to_bytes(nested)


def _twin_pool(file: FileDescriptor) -> descriptor_pool.DescriptorPool:
    """A private pool holding ``file`` and its imports with every string field made bytes."""
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(fd: FileDescriptor) -> None:
        if fd.name in added:
            return
        for dependency in fd.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        for message in proto.message_type:
            _strings_to_bytes(message)
        pool.Add(proto)
        added.add(fd.name)

    add(file)
    return pool


_POOL = _twin_pool(lock_pb2.DESCRIPTOR)


def bytes_twin(descriptor: Descriptor) -> type[Message]:
    """The bytes twin of a message type of lock.proto: same fields, every ``string`` one ``bytes``."""
    return message_factory.GetMessageClass(_POOL.FindMessageTypeByName(descriptor.full_name))


def _first_invalid(twin: Message, original: Descriptor) -> str | None:
    for twin_field, value in twin.ListFields():
        field = original.fields_by_name[twin_field.name]
        values = value if field.is_repeated else [value]
        if field.type == FieldDescriptor.TYPE_STRING:
            for item in values:
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    return field.name
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            for item in values:
                found = _first_invalid(item, field.message_type)
                if found is not None:
                    return found
    return None


def invalid_text_field(descriptor: Descriptor, data: bytes) -> str | None:
    """The name of the first string field of a ``descriptor`` message in ``data`` that is not UTF-8.

    Returns:
        The field's name (``"name"``; for a nested message, the nested
        field's own name), or None when every string is valid UTF-8 or the
        bytes do not parse even as the bytes twin.
    """
    try:
        twin = bytes_twin(descriptor).FromString(data)
    except DecodeError:
        return None
    return _first_invalid(twin, descriptor)


def _deserializer(descriptor: Descriptor) -> Callable[[bytes], Any]:
    parse = message_factory.GetMessageClass(descriptor).FromString

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except DecodeError:
            return Undecodable(descriptor.name, invalid_text_field(descriptor, data))

    return deserialize


class _Capture:
    """Stands in for the server in the generated add_*_to_server: keeps the method handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        pass  # the same handlers also come through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.handlers.update(handlers)


def add_lock_service(servicer: lock_pb2_grpc.LockServiceServicer, server: grpc.aio.Server) -> None:
    """Register ``servicer`` on ``server`` as LockService, with the UTF-8-checking request deserializers."""
    capture = _Capture()
    lock_pb2_grpc.add_LockServiceServicer_to_server(servicer, capture)
    if set(capture.handlers) != set(_SERVICE.methods_by_name):
        raise RuntimeError(f"the generated LockService registration changed: {sorted(capture.handlers)}")
    handlers = {
        name: handler._replace(request_deserializer=_deserializer(_SERVICE.methods_by_name[name].input_type))
        for name, handler in capture.handlers.items()
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(_SERVICE.full_name, handlers)
