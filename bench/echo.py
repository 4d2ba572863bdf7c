"""The floor of grpc.aio on this machine: a bare echo server's CPU per round trip, measured beside the figures it bounds.

    python bench/echo.py --kind stream --clients 4 --rate 600 --seconds 5
    python bench/echo.py --kind unary --clients 64 --rate 800 --seconds 5

A grpc.aio server with no application code (``serve``: generic handlers,
bytes in and out, no protobuf) answers each message with a message of a set
size: a bidi stream (``/echo.Echo/Stream``, one answer per message, as a
KeepAlive stream answers a keepalive) and a unary call (``/echo.Echo/Unary``).
A load process (``load``) drives it with ``--clients`` streams or callers
sending ``--rate`` messages a second in all (each client paced at its share:
an open loop for streams, one call in flight per unary caller; ``--burst``
messages written back to back at each turn of a stream, as the coordinator
forwards the keepalives of a batch to etcd), the message
sizes being those of the real messages (:data:`SIZES`, from the generated
classes). Both run in child processes; the parent (:func:`echo_floor`) reads
their CPU seconds (user + system, ``/proc/PID/stat``) at the load's ``start``
and ``end`` lines and divides by the round trips answered meanwhile:

- ``server_us``: server CPU per round trip (one message read, one written),
  what the coordinator pays at least per message a client sends it;
- ``client_us``: client CPU per round trip (one written, one read), what
  the coordinator pays at least per message it sends etcd and reads back.

The floors of the suite's figures (:func:`renewal_floor`, :func:`cycle_floor`)
add these up for the messages each operation takes. Run at the load of the
figure (its message rate, its number of streams or callers), in the same run:
the machine is shared and noisy, so only ratios measured together compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

sys.path.insert(0, str(Path(__file__).parent))

import _procs  # noqa: E402

__all__ = ["SIZES", "cycle_floor", "echo_floor", "message_sizes", "renewal_floor"]

_STREAM = "/echo.Echo/Stream"
_UNARY = "/echo.Echo/Unary"


def message_sizes() -> dict[str, tuple[int, int]]:
    """Serialized sizes in bytes, (request, answer), of the messages a renewal and a lock cycle take.

    ``keepalive``: a one-lease KeepAliveRequest and its ack; ``keepalives10``:
    a batch of 10 and its acks; ``stream_call``: an acquire on the KeepAlive
    stream and its answer; ``etcd_keepalive``: etcd's LeaseKeepAlive request
    and response; ``txn``: the coordinator's acquire Txn on etcd and its answer.
    """
    from fencepost.client.v1 import etcdops, lock_pb2
    from fencepost.client.v1.etcd import kv_pb2, rpc_pb2

    lease, rid = 0x694D8B2A1C3E5F01, 123456
    one = lock_pb2.LeaseKeepAlive(lease_id=lease, request_id=rid)
    ack = lock_pb2.LeaseKeepAliveAck(lease_id=lease, request_id=rid, ttl_seconds=10)
    name = "fencepost-async/distinct64/63"
    lock, key = f"/bench/{'0' * 32}/locks/{name}/".encode(), b"/bench/" + b"0" * 32 + b"/locks/x/694d8b2a1c3e5f01"
    reads = [etcdops.get(key, keys_only=True), etcdops.holder_of(lock)]
    txn = etcdops.txn([etcdops.is_absent(key)], [etcdops.put(key, lease_id=lease), etcdops.holder_of(lock)], reads)
    header = rpc_pb2.ResponseHeader(cluster_id=2 ** 63 + 7, member_id=2 ** 63 + 11, revision=1_234_567, raft_term=5)
    kv = kv_pb2.KeyValue(key=key, create_revision=1_234_567, mod_revision=1_234_567, version=1, lease=lease)
    ranged = rpc_pb2.ResponseOp(response_range=rpc_pb2.RangeResponse(header=header, kvs=[kv], count=1))
    put = rpc_pb2.ResponseOp(response_put=rpc_pb2.PutResponse(header=header))
    answer = rpc_pb2.TxnResponse(header=header, succeeded=True, responses=[put, ranged])

    def size(message: Any) -> int:
        return len(message.SerializeToString())

    return {
        "keepalive": (size(lock_pb2.KeepAliveRequest(keepalive=one, last_rtt_ms=3)),
                      size(lock_pb2.KeepAliveResponse(keepalive=ack))),
        "keepalives10": (size(lock_pb2.KeepAliveRequest(keepalives=lock_pb2.LeaseKeepAlives(keepalives=[one] * 10),
                                                        last_rtt_ms=3)),
                         size(lock_pb2.KeepAliveResponse(keepalives=lock_pb2.LeaseKeepAliveAcks(acks=[ack] * 10)))),
        "stream_call": (size(lock_pb2.KeepAliveRequest(request_id=rid, acquire=lock_pb2.AcquireRequest(
                            name=name, lease_id=lease, wait_forever=True, request_id="0" * 32))),
                        size(lock_pb2.KeepAliveResponse(request_id=rid, acquired=lock_pb2.AcquireResponse(
                            acquired=True, token=1_234_567)))),
        "etcd_keepalive": (size(rpc_pb2.LeaseKeepAliveRequest(ID=lease)),
                           size(rpc_pb2.LeaseKeepAliveResponse(header=header, ID=lease, TTL=10))),
        "txn": (size(txn), size(answer)),
    }


#: The sizes of :func:`message_sizes`, computed once at import.
SIZES = message_sizes()


# --------------------------------------------------------------------------------------- the child processes


async def _serve(stream_reply: int, unary_reply: int) -> None:
    """The echo server on a free port of 127.0.0.1; prints ``listening PORT``, serves until killed."""
    stream_answer, unary_answer = b"x" * stream_reply, b"y" * unary_reply

    async def stream(requests: Any, _context: Any) -> Any:
        async for _ in requests:
            yield stream_answer

    async def unary(_request: bytes, _context: Any) -> bytes:
        return unary_answer

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("echo.Echo", {
        "Stream": grpc.stream_stream_rpc_method_handler(stream),
        "Unary": grpc.unary_unary_rpc_method_handler(unary)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"listening {port}", flush=True)
    await server.wait_for_termination()


async def _load(port: int, kind: str, clients: int, rate: float, seconds: float, request: int,
                burst: int = 1) -> dict[str, Any]:
    """Drive the echo server; print ``start`` and ``end`` around the measured ``seconds``; the round trips."""
    payload = b"r" * request
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await channel.channel_ready()
    answered = [0]
    measuring = [False]
    interval = clients * burst / rate if kind == "stream" else clients / rate  # each client's share of the rate
    stop = [False]

    async def paced(i: int, send: Any) -> None:
        due = time.monotonic() + interval * i / clients
        while not stop[0]:
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await send()
            due += interval

    async def streamer(i: int) -> None:
        call = channel.stream_stream(_STREAM)()

        async def read() -> None:
            async for _ in call:
                answered[0] += measuring[0]

        async def write() -> None:
            for _ in range(burst):
                await call.write(payload)

        reader = asyncio.create_task(read())
        try:
            await paced(i, write)
        finally:
            call.cancel()
            reader.cancel()

    unary = channel.unary_unary(_UNARY)

    async def caller(i: int) -> None:
        async def once() -> None:
            await unary(payload)
            answered[0] += measuring[0]

        await paced(i, once)

    tasks = [asyncio.create_task((streamer if kind == "stream" else caller)(i)) for i in range(clients)]
    await asyncio.sleep(1.0)  # warm: channels open, every client paced
    measuring[0] = True
    print("start", flush=True)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    measuring[0] = False
    elapsed = time.monotonic() - started
    print("end", flush=True)
    stop[0] = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await channel.close()
    return {"round_trips": answered[0], "seconds": round(elapsed, 3)}


# --------------------------------------------------------------------------------------- the parent side


async def echo_floor(kind: str, clients: int, rate: float, seconds: float, sizes: tuple[int, int],
                     burst: int = 1) -> dict[str, Any]:
    """Measure the echo: the server's and the load's CPU microseconds per round trip.

    Args:
        kind: ``stream`` (one bidi stream per client) or ``unary`` (one caller per client).
        clients: streams or callers.
        rate: round trips a second asked for, in all (at least 1).
        seconds: how long the measured part lasts (after a 1 s warm-up).
        sizes: (request bytes, answer bytes), e.g. ``SIZES["keepalive"]``.
        burst: (stream) messages written back to back at each turn.

    Returns:
        ``server_us`` and ``client_us`` per round trip, ``rate`` answered per
        second, and what was asked (``kind``, ``clients``, ``rate_asked``, ``sizes``).

    Raises:
        RuntimeError: a child process failed or ended early.
    """
    me = str(Path(__file__).resolve())
    server = subprocess.Popen([sys.executable, me, "serve", "--stream-reply", str(sizes[1]),
                               "--unary-reply", str(sizes[1])], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    load = None
    try:
        assert server.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(server.stdout.readline), 60)
        if not line.startswith("listening "):
            raise RuntimeError(f"the echo server did not start (exit {server.poll()})")
        load = subprocess.Popen([sys.executable, me, "load", "--port", line.split()[1], "--kind", kind,
                                 "--clients", str(clients), "--rate", str(max(1.0, rate)), "--seconds", str(seconds),
                                 "--request", str(sizes[0]), "--burst", str(burst)], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        assert load.stdout is not None
        marks: dict[str, tuple[float, float]] = {}
        while True:
            line = await asyncio.wait_for(asyncio.to_thread(load.stdout.readline), seconds + 60)
            if not line:
                raise RuntimeError(f"the echo load ended early (exit {load.wait()})")
            word = line.split()[0]
            if word in ("start", "end"):
                marks[word] = (_procs.cpu_seconds(server.pid), _procs.cpu_seconds(load.pid))
            elif word == "result":
                result = json.loads(line.split(" ", 1)[1])
                break
        (s0, c0), (s1, c1) = marks["start"], marks["end"]
        n = max(1, result["round_trips"])
        return {"kind": kind, "clients": clients, "rate_asked": round(rate, 1), "sizes": list(sizes), "burst": burst,
                "rate": round(result["round_trips"] / result["seconds"], 1),
                "server_us": round((s1 - s0) / n * 1e6, 1), "client_us": round((c1 - c0) / n * 1e6, 1)}
    finally:
        _procs.stop(load)
        _procs.stop(server)


def renewal_floor(clients: dict[str, Any], etcd: dict[str, Any], batch: int = 1) -> float:
    """The floor of one renewal at the coordinator, in CPU microseconds, from two stream echoes.

    A renewal is a client message read and answered (a server round trip of
    the ``clients`` echo, shared by the ``batch`` renewals of a batched
    message) and a keepalive sent to etcd and its answer read (a client round
    trip of the ``etcd`` echo, one per lease: etcd takes one lease per message).
    """
    return clients["server_us"] / batch + etcd["client_us"]


def cycle_floor(stream: dict[str, Any] | None, unary: dict[str, Any], on_stream: bool) -> float:
    """The floor of one acquire + release at the coordinator, in CPU microseconds.

    Two calls from the client (server round trips: messages on the KeepAlive
    stream when ``on_stream``, else unary calls) and two Txns on etcd (unary
    client round trips; the coordinator may batch Txns of several callers in
    one, so this is the floor of the unbatched path).
    """
    calls = stream["server_us"] if on_stream and stream is not None else unary["server_us"]
    return 2 * calls + 2 * unary["client_us"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=["serve", "load", "measure"], nargs="?", default="measure",
                        help="serve and load are the child processes; measure (default) runs both and prints")
    parser.add_argument("--kind", choices=["stream", "unary"], default="stream")
    parser.add_argument("--clients", type=int, default=4, help="streams or unary callers (default 4)")
    parser.add_argument("--rate", type=float, default=600.0, help="round trips a second in all (default 600)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds measured (default 5)")
    parser.add_argument("--burst", type=int, default=1, help="(stream) messages written back to back (default 1)")
    parser.add_argument("--sizes", choices=sorted(SIZES), default=None,
                        help="message sizes (default keepalive for stream, txn for unary)")
    parser.add_argument("--port", type=int, help="(load) the echo server's port")
    parser.add_argument("--request", type=int, default=32, help="(load) request bytes")
    parser.add_argument("--stream-reply", type=int, default=32, help="(serve) stream answer bytes")
    parser.add_argument("--unary-reply", type=int, default=32, help="(serve) unary answer bytes")
    args = parser.parse_args()
    if args.role == "serve":
        asyncio.run(_serve(args.stream_reply, args.unary_reply))
    elif args.role == "load":
        result = asyncio.run(_load(args.port, args.kind, args.clients, args.rate, args.seconds, args.request,
                                   args.burst))
        print("result " + json.dumps(result), flush=True)
    else:
        sizes = SIZES[args.sizes or ("keepalive" if args.kind == "stream" else "txn")]
        print(json.dumps(asyncio.run(echo_floor(args.kind, args.clients, args.rate, args.seconds, sizes, args.burst))))


if __name__ == "__main__":
    main()
