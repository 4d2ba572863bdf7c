"""The token record's first check is not fooled by the calls that run beside it (a flaky refusal seen in CI).

A coordinator's first call that needs a token checks the token record: it
reads the record's key, and, the record being absent, creates it with the
coordinator's high-water mark. Calls made meanwhile (a LeaseGrant, another
semaphore's key) raise that mark above the revision of the first read; the
check then compared the created record's ``high`` with the first read's
revision and concluded that etcd had gone back: every grant refused with
UNAVAILABLE/DATA_LOSS until an operator ran ``admin recover-tokens``. The
level to compare with is the create's own revision.
"""

from __future__ import annotations

from typing import Any

from etcd3aio import Etcd3Client  # type: ignore[import-untyped]

from fencepost.client.v1 import etcdops
from fencepost.client.v1.keys import Keys
from fencepost.coordinator.etcd import EtcdClient
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.tokens import TokenFloor, TokenRecord, record_key


class WriteAfterFirstRead:
    """The etcd layer, with another call's write landing (and its answer seen) right after the first Range."""

    def __init__(self, layer: EtcdClient, etcd_client: Etcd3Client, key: bytes) -> None:
        self.layer, self.etcd_client, self.key, self.reads = layer, etcd_client, key, 0

    async def range(self, request: Any, **kwargs: Any) -> Any:
        resp = await self.layer.range(request, **kwargs)
        self.reads += 1
        if self.reads == 1:
            await self.etcd_client.kv.put(self.key, b"x", timeout=5)  # the other call's write...
            await self.layer.read([etcdops.get(self.key)])  # ... answered through this coordinator: the mark rises
        return resp

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)


async def test_a_write_beside_the_first_check_is_not_a_rewind(etcd: EmbeddedEtcd, prefix: str,
                                                              etcd_client: Etcd3Client) -> None:
    """The record is created with a mark above the first read's revision: the floor serves (no refusal), tokens
    are revisions, and the record's ``high`` is at most the mark."""
    keys = Keys(prefix)
    layer = EtcdClient([etcd.endpoint])
    beside = (prefix + "beside").encode()
    try:
        etcd_layer = WriteAfterFirstRead(layer, etcd_client, beside)
        floor = TokenFloor(etcd_layer, keys)  # type: ignore[arg-type]
        layer.headers = floor
        await floor.ready()
        assert etcd_layer.reads == 1 and floor.refusing is None, floor.refusing
        stored = TokenRecord.decode((await etcd_client.kv.get(record_key(keys), timeout=5)).kvs[0].value)
        assert 0 < stored.high <= floor.high and stored.floor == 0
        assert floor.token(floor.high) == floor.high
    finally:
        await etcd_client.kv.delete(beside, timeout=5)
        await layer.close()
