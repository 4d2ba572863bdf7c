"""The cost of the gRPC metrics interceptor alone: a unary echo on a grpc.aio server, with and without it.

One process serves ``/bench.Echo/Echo`` (bytes in, the same bytes out) on
127.0.0.1 and calls it from ``--concurrency`` tasks, ``--calls`` calls per
round, for each server setup in turn: no interceptor, an interceptor that
only calls ``continuation`` (the cost of having one at all in grpc.aio), and
:class:`fencepost.coordinator.telemetry.interceptor.GrpcServerMetrics` without and with its
handling-time histogram. Printed: calls per second and the process's CPU
microseconds per call (client and server together, so the interceptor's share
is the difference between rows).

Usage:
    python bench/interceptor.py --calls 20000 --concurrency 64 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

import grpc
from prometheus_client import CollectorRegistry

from fencepost.coordinator.telemetry.interceptor import GrpcServerMetrics


class PassThrough(grpc.aio.ServerInterceptor):
    """An interceptor that does nothing: the fixed cost of an interceptor in grpc.aio."""

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[grpc.RpcMethodHandler]],
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return await continuation(handler_call_details)


async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


SETUPS: dict[str, Callable[[], list[grpc.aio.ServerInterceptor]]] = {
    "none": lambda: [],
    "pass-through": lambda: [PassThrough()],
    "metrics, no histogram": lambda: [GrpcServerMetrics(CollectorRegistry(), handling_time_histogram=False)],
    "metrics": lambda: [GrpcServerMetrics(CollectorRegistry())],
}


async def measure(interceptors: list[grpc.aio.ServerInterceptor], calls: int, concurrency: int
                  ) -> tuple[float, float]:
    """(calls per second, CPU microseconds per call) of ``calls`` echo calls from ``concurrency`` tasks."""
    server = grpc.aio.server(interceptors=interceptors or None)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Echo", {
        "Echo": grpc.unary_unary_rpc_method_handler(echo, lambda b: b, lambda b: b)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/bench.Echo/Echo")
    for _ in range(500):  # warm up the connection and the handler cache
        await call(b"x")

    async def worker(n: int) -> None:
        for _ in range(n):
            await call(b"x")

    per_task = calls // concurrency
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker(per_task) for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    await channel.close()
    await server.stop(0)
    done = per_task * concurrency
    return done / wall, cpu / done * 1e6


async def run(calls: int, concurrency: int, rounds: int) -> None:
    print(f"{'round':>5} {'server':<22} {'calls/s':>9} {'CPU us/call':>12}")
    for r in range(1, rounds + 1):
        for name, make in SETUPS.items():
            rate, cpu = await measure(make(), calls, concurrency)
            print(f"{r:>5} {name:<22} {rate:>9.0f} {cpu:>12.1f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per measurement (default 20000)")
    parser.add_argument("--concurrency", type=int, default=64, help="concurrent calling tasks (default 64)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all setups (default 3)")
    args = parser.parse_args()
    asyncio.run(run(args.calls, args.concurrency, args.rounds))


if __name__ == "__main__":
    main()
