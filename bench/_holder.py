"""P5's holder, run as its own process: take a lock, say ``ready``, keep it alive until killed.

    python bench/_holder.py fencepost HOST:PORT NAME TTL
    python bench/_holder.py etcd-direct ETCD_HOST:PORT LOCK_PREFIX TTL
    python bench/_holder.py kazoo ZK_HOST:PORT ZNODE_PATH TTL
    python bench/_holder.py redis PORT KEY TTL

- fencepost: ``LockClient.acquire(NAME, ttl=TTL)``; the client's keepalive
  stream renews the lease every TTL/3.
- etcd-direct: an etcd lease of TTL seconds, the contender key
  ``LOCK_PREFIX<lease hex>`` put on it (the holder is first: nobody waits
  yet), renewed every TTL/3 on a LeaseKeepAlive stream.
- kazoo: a KazooClient with session timeout TTL, ``Lock(ZNODE_PATH).acquire()``;
  the session is kept by kazoo's pings.
- redis: redis-py's ``Lock(KEY, timeout=TTL)``, extended back to TTL
  (``reacquire``) every TTL/3 by a thread: the keepalive a redis lock user
  writes himself.

Prints ``ready EXTRA`` (EXTRA: the granted TTL or the negotiated session
timeout, seconds) once it holds the lock, then sleeps until it is killed.
"""

from __future__ import annotations

import sys
import threading
import time


def main() -> None:
    mode, target, name, ttl_arg = sys.argv[1:5]
    ttl = float(ttl_arg)
    if mode == "fencepost":
        from fencepost.client import LockClient

        client = LockClient(target)
        handle = client.acquire(name, ttl=ttl)
        extra = str(handle.ttl)
    elif mode == "etcd-direct":
        extra = _etcd(target, name, int(ttl))
    elif mode == "kazoo":
        from kazoo.client import KazooClient

        zk = KazooClient(hosts=target, timeout=ttl)
        zk.start(30)
        zk.Lock(name).acquire()
        extra = str(zk._session_timeout / 1000)  # the timeout ZooKeeper negotiated
    elif mode == "redis":
        import redis

        lock = redis.Redis(host="127.0.0.1", port=int(target)).lock(name, timeout=ttl, thread_local=False)
        lock.acquire(blocking=True)

        def extend() -> None:
            while True:
                time.sleep(ttl / 3)
                lock.reacquire()

        threading.Thread(target=extend, daemon=True).start()
        extra = str(ttl)
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print(f"ready {extra}", flush=True)
    while True:
        time.sleep(3600)


def _etcd(endpoint: str, lock: str, ttl: int) -> str:
    import grpc

    from fencepost.client.v1 import etcdops
    from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc

    channel = grpc.insecure_channel(f"dns:///{endpoint}")
    leases, kv = rpc_pb2_grpc.LeaseStub(channel), rpc_pb2_grpc.KVStub(channel)
    granted = leases.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=ttl), timeout=10)
    key = lock.encode() + f"{granted.ID:016x}".encode()
    kv.Txn(etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, lease_id=granted.ID)]), timeout=10)

    def renewals():  # type: ignore[no-untyped-def]
        while True:
            yield rpc_pb2.LeaseKeepAliveRequest(ID=granted.ID)
            time.sleep(granted.TTL / 3)

    def keep() -> None:
        for _ in leases.LeaseKeepAlive(renewals()):
            pass

    threading.Thread(target=keep, daemon=True).start()
    return str(granted.TTL)


if __name__ == "__main__":
    main()
