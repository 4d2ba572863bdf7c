"""gRPC server reflection on the coordinator's port (issue 24): a reflection client lists LockService and reads
its methods and messages without the proto file, as grpcurl and grpcui do."""

from __future__ import annotations

import asyncio

import grpc
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from fencepost.client.v1 import lock_pb2


def _reflect(address: str) -> tuple[list[str], list[str], list[str]]:
    """(the services listed, LockService's methods, LeaseKeepAliveRequest's fields) read through reflection."""
    with grpc.insecure_channel(address) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        services = database.get_services()
        pool = DescriptorPool(database)
        service = pool.FindServiceByName("fencepost.v1.LockService")
        request = pool.FindMessageTypeByName("fencepost.v1.LeaseKeepAliveRequest")
        return list(services), [m.name for m in service.methods], [f.name for f in request.fields]


async def test_reflection_lists_the_lock_service_and_its_methods(address: str) -> None:
    """A reflection client sees LockService, the health service and every LockService method with its messages."""
    services, methods, fields = await asyncio.to_thread(_reflect, address)
    assert "fencepost.v1.LockService" in services
    assert "grpc.health.v1.Health" in services
    assert methods == [m.name for m in lock_pb2.DESCRIPTOR.services_by_name["LockService"].methods]
    assert "LeaseKeepAlive" in methods and "Acquire" in methods
    assert fields == ["lease_id"]
