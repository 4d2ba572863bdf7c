"""P4's load generator, run as its own process: hold N leases alive, each renewed every TTL/3.

    python bench/_leasegen.py --mode fencepost --address HOST:PORT --etcd HOST:PORT --leases 10000 --window 20

``--mode fencepost`` grants the leases with the coordinator's LeaseGrant
(raw stub, ``--grant-concurrency`` calls in flight over ``--channels``
connections) and renews them over ``--streams`` KeepAlive streams;
``--mode etcd-direct`` does the same directly on etcd (Lease.LeaseGrant and
LeaseKeepAlive streams): the baseline. Each lease is renewed every TTL/3
from a random point of its first period on (a timer heap per stream), so
the renewals are spread evenly and their rate is N * 3 / TTL per second.
``--batch B`` (``--mode fencepost``, B > 1) sends the renewals due in B per
message (``KeepAliveRequest.keepalives``): each stream then wakes every
:data:`BATCH_TICK` seconds and sends what fell due meanwhile (a renewal is
that much late at most), so that several are due at each wake. Each
keepalive message carries the round trip of the stream's last acknowledged
keepalive (``last_rtt_ms``) and its send time (``sent_ms``), as the client
library does: the coordinator's signs that it is past its capacity. A LeaseGrant refused as overloaded
(RESOURCE_EXHAUSTED) is asked again after the RetryInfo's 1 s, until
``--grant-seconds``; the leases granted by then are the ones measured.

It tells its parent how far it got, one line each on stdout:
``granted N SECONDS``, then ``steady`` (every lease granted and renewed at
least once: the measuring window starts), ``window-end`` after ``--window``
seconds rounded up to whole renewal periods, then ``result {JSON}``: the keepalive round trips in the window
(p50/p99/max, ms), the renewals sent, the largest lateness of a renewal
against its schedule (the generator's own lag), and the spurious expiries:
leases it kept alive whose keepalive answer said TTL <= 0, or that etcd's
LeaseLeases no longer lists at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import math
import random
import sys
import time
from typing import Any

import grpc
import grpc.aio

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.etcd import rpc_pb2, rpc_pb2_grpc


#: Seconds between a stream's wakes with ``--batch``: the renewals due meanwhile go together.
BATCH_TICK = 0.05


def say(line: str) -> None:
    """One progress line to the parent."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Generator:
    """The leases, their streams and what was measured."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.period = args.ttl / 3
        # A whole number of renewal periods, so that the window sees every lease renewed equally often.
        self.window = max(1, math.ceil(args.window / self.period - 0.01)) * self.period
        self.fencepost = args.mode == "fencepost"
        target = args.address if self.fencepost else f"dns:///{args.etcd}"
        opts = [("grpc.use_local_subchannel_pool", 1)]
        self.channels = [grpc.aio.insecure_channel(target, options=opts) for _ in range(args.channels)]
        self.leases: list[int] = []
        self.secrets: list[str] = []
        self.heaps: list[list[tuple[float, int]]] = [[] for _ in range(args.streams)]
        self.wake = [asyncio.Event() for _ in range(args.streams)]
        self.sent_at: list[dict[int, float]] = [{} for _ in range(args.streams)]
        self.last_rtt_ms = [0] * args.streams  # per stream: the round trip of its last acknowledged keepalive
        self.verified: set[int] = set()
        self.in_window = False
        self.rtts: list[float] = []
        self.sent = 0
        self.sent_in_window = 0
        self.lag = 0.0
        self.dead_acks: set[int] = set()
        self.stop = False
        self.refusals = 0  # LeaseGrant calls the coordinator refused (overloaded), each asked again after 1 s
        self.answer_messages = 0  # answer messages received in the window
        self.merged_messages = 0  # of which several acks together (LeaseKeepAliveAcks), in the window
        self.grant_until = math.inf

    async def grant_all(self) -> None:
        n, ttl = self.args.leases, self.args.ttl
        next_index = iter(range(n))

        async def worker(w: int) -> None:
            channel = self.channels[w % len(self.channels)]
            fp, etcd = lock_pb2_grpc.LockServiceStub(channel), rpc_pb2_grpc.LeaseStub(channel)
            for _ in next_index:
                if self.fencepost:
                    while True:
                        if time.monotonic() > self.grant_until:
                            return  # the coordinator kept refusing: measure the leases it granted
                        try:
                            r = await fp.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=ttl), timeout=60)
                            break
                        except grpc.aio.AioRpcError as err:
                            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                                raise
                            # Refused (OVERLOADED: past capacity): wait as its RetryInfo says (1 s) and ask again.
                            self.refusals += 1
                            await asyncio.sleep(1.0)
                    lease, secret = r.lease_id, r.lease_secret
                else:
                    lease, secret = (await etcd.LeaseGrant(rpc_pb2.LeaseGrantRequest(TTL=ttl), timeout=60)).ID, ""
                i = len(self.leases)
                self.leases.append(lease)
                self.secrets.append(secret)
                s = i % len(self.heaps)
                # The first renewal at a random point of the first period: renewals spread evenly over time
                # (clients start at different times), not in bursts of the size of a grant burst.
                heapq.heappush(self.heaps[s], (time.monotonic() + random.uniform(0.05, 1.0) * self.period, i))
                self.wake[s].set()

        await asyncio.gather(*(worker(w) for w in range(self.args.grant_concurrency)))

    async def stream(self, s: int) -> None:
        channel = self.channels[s % len(self.channels)]
        if self.fencepost:
            call: Any = lock_pb2_grpc.LockServiceStub(channel).KeepAlive()
        else:
            call = rpc_pb2_grpc.LeaseStub(channel).LeaseKeepAlive()
        reader = asyncio.create_task(self.read(s, call))
        heap, sent_at, wake = self.heaps[s], self.sent_at[s], self.wake[s]
        request_id = 0
        size = self.args.batch if self.fencepost else 1
        try:
            while not self.stop:
                now = time.monotonic()
                entries: list[lock_pb2.LeaseKeepAlive] = []
                while heap and heap[0][0] <= now:
                    due, i = heapq.heappop(heap)
                    self.lag = max(self.lag, now - due)
                    lease = self.leases[i]
                    if self.fencepost:
                        request_id += 1
                        secret = "" if lease in self.verified else self.secrets[i]
                        self.verified.add(lease)
                        sent_at[request_id] = time.perf_counter()
                        if size > 1:
                            entries.append(lock_pb2.LeaseKeepAlive(lease_id=lease, request_id=request_id,
                                                                   lease_secret=secret))
                            if len(entries) == size or not (heap and heap[0][0] <= now):
                                await call.write(lock_pb2.KeepAliveRequest(
                                    keepalives=lock_pb2.LeaseKeepAlives(keepalives=entries),
                                    last_rtt_ms=self.last_rtt_ms[s], sent_ms=int(time.monotonic() * 1000)))
                                entries = []
                        else:
                            await call.write(lock_pb2.KeepAliveRequest(
                                keepalive=lock_pb2.LeaseKeepAlive(lease_id=lease, request_id=request_id),
                                lease_secret=secret, last_rtt_ms=self.last_rtt_ms[s],
                                sent_ms=int(time.monotonic() * 1000)))
                    else:
                        sent_at[lease] = time.perf_counter()
                        await call.write(rpc_pb2.LeaseKeepAliveRequest(ID=lease))
                    self.sent += 1
                    self.sent_in_window += self.in_window
                    heapq.heappush(heap, (due + self.period, i))
                    if not entries:
                        now = time.monotonic()
                wake.clear()
                delay = min(heap[0][0] - time.monotonic(), 0.05) if heap else 0.05
                if size > 1:
                    delay = max(delay, BATCH_TICK)
                if delay > 0:
                    try:
                        await asyncio.wait_for(wake.wait(), delay)
                    except TimeoutError:
                        pass
        finally:
            call.cancel()
            reader.cancel()

    async def read(self, s: int, call: Any) -> None:
        sent_at = self.sent_at[s]
        async for resp in call:
            now = time.perf_counter()
            if self.fencepost:
                kind = resp.WhichOneof("response")
                if kind == "keepalive":
                    acks = [resp.keepalive]
                elif kind == "keepalives":
                    acks = list(resp.keepalives.acks)
                    self.merged_messages += self.in_window
                else:
                    continue
                answers = [(ack.lease_id, ack.ttl_seconds, sent_at.pop(ack.request_id, None)) for ack in acks]
            else:
                answers = [(resp.ID, resp.TTL, sent_at.pop(resp.ID, None))]
            self.answer_messages += self.in_window
            for lease, ttl, start in answers:
                if ttl <= 0:
                    self.dead_acks.add(lease)
                if start is not None:
                    self.last_rtt_ms[s] = max(1, round((now - start) * 1000))
                    if self.in_window:
                        self.rtts.append(now - start)

    async def run(self) -> dict[str, Any]:
        streams = [asyncio.create_task(self.stream(s)) for s in range(self.args.streams)]
        started = time.monotonic()
        self.grant_until = started + self.args.grant_seconds
        await self.grant_all()
        granted_in = time.monotonic() - started
        say(f"granted {len(self.leases)} {granted_in:.1f}")
        await asyncio.sleep(self.period + 0.5)  # the last lease granted has been renewed once
        self.in_window = True
        say("steady")
        await asyncio.sleep(self.window)
        self.in_window = False
        say("window-end")
        alive = await self.alive()
        self.stop = True
        for w in self.wake:
            w.set()
        await asyncio.gather(*streams, return_exceptions=True)
        for channel in self.channels:
            await channel.close()
        kept = set(self.leases)
        gone = kept - alive
        rtts = sorted(self.rtts)

        def pct(q: float) -> float | None:
            return round(rtts[min(len(rtts) - 1, int(q / 100 * len(rtts)))] * 1e3, 3) if rtts else None

        return {
            "mode": self.args.mode, "leases": len(kept), "asked": self.args.leases,
            "grant_refusals": self.refusals, "ttl_seconds": self.args.ttl,
            "streams": self.args.streams, "grant_seconds": round(granted_in, 1),
            "window_seconds": round(self.window, 2), "renewals_sent": self.sent,
            "renewals_per_second": round(self.sent_in_window / self.window, 1),
            "batch": self.args.batch if self.fencepost else 1,
            "answer_messages_per_second": round(self.answer_messages / self.window, 1),
            "merged_answer_messages": self.merged_messages,
            "rtt_ms": {"p50": pct(50), "p99": pct(99), "max": round(rtts[-1] * 1e3, 3) if rtts else None,
                       "samples": len(rtts)},
            "generator_max_lag_seconds": round(self.lag, 3),
            "spurious_expiries": len(gone | self.dead_acks),
            "answered_ttl_le_0": len(self.dead_acks), "missing_at_end": len(gone),
        }

    async def alive(self) -> set[int]:
        """The lease ids etcd has now (LeaseLeases: one call)."""
        channel = grpc.aio.insecure_channel(f"dns:///{self.args.etcd}")
        try:
            resp = await rpc_pb2_grpc.LeaseStub(channel).LeaseLeases(rpc_pb2.LeaseLeasesRequest(), timeout=60)
            return {int(s.ID) for s in resp.leases}
        finally:
            await channel.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["fencepost", "etcd-direct"], required=True)
    parser.add_argument("--address", help="the coordinator, HOST:PORT (--mode fencepost)")
    parser.add_argument("--etcd", required=True, help="etcd HOST:PORT (the end check; --mode etcd-direct)")
    parser.add_argument("--leases", type=int, required=True)
    parser.add_argument("--ttl", type=int, default=10, help="lease TTL, seconds (default 10)")
    parser.add_argument("--streams", type=int, default=4, help="keepalive streams (default 4)")
    parser.add_argument("--channels", type=int, default=8, help="connections (default 8)")
    parser.add_argument("--grant-concurrency", type=int, default=256, help="LeaseGrant calls in flight")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured once steady (default 20)")
    parser.add_argument("--batch", type=int, default=1,
                        help="renewals per keepalive message, at most 500 (--mode fencepost; default 1: one each)")
    parser.add_argument("--grant-seconds", type=float, default=120.0,
                        help="stop granting after this long (a coordinator refusing new leases while overloaded); "
                             "the leases granted by then are measured (default 120)")
    args = parser.parse_args()

    async def go() -> dict[str, Any]:
        return await Generator(args).run()

    say("result " + json.dumps(asyncio.run(go())))


if __name__ == "__main__":
    main()
