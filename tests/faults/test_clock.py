"""F12 wall-clock jumps: stepping the wall clock neither loses nor extends a hold.

The real system clock is never touched (that needs root and would disturb
the machine). Instead the client and the coordinator run under a fake-time
shim (``fakeclock.py`` below): it wraps ``time.time``, ``time.time_ns``,
``time.clock_gettime(CLOCK_REALTIME)`` and ``datetime.datetime.now/utcnow/
today`` with an offset that SIGUSR1 moves by +1 h and SIGUSR2 by -1 h, and
leaves ``time.monotonic`` alone. Limits: it steps what Python code reads;
gRPC's C core and etcd read the real clocks (they are not ours to test).
The product itself reads no wall clock at all (checked below by grep).
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient

from ..conftest import LISTENING, REPO, ChildProcess, describe_waiters_is, wait_for
from ..owned_stub import OwnedStub

E = 0.5

FAKECLOCK = r'''
"""Run a module or script with a steppable wall clock (SIGUSR1: +1 h, SIGUSR2: -1 h)."""
import datetime as _dt
import os, runpy, signal, sys, time

_offset = [0.0]
_time, _time_ns = time.time, time.time_ns
_gettime, _gettime_ns = time.clock_gettime, time.clock_gettime_ns

def fake_time(): return _time() + _offset[0]
def fake_time_ns(): return _time_ns() + int(_offset[0] * 1e9)
def fake_gettime(clk): return _gettime(clk) + (_offset[0] if clk == time.CLOCK_REALTIME else 0.0)
def fake_gettime_ns(clk): return _gettime_ns(clk) + (int(_offset[0] * 1e9) if clk == time.CLOCK_REALTIME else 0)

class FakeDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None): return cls.fromtimestamp(fake_time(), tz)
    @classmethod
    def utcnow(cls): return cls.utcfromtimestamp(fake_time())
    @classmethod
    def today(cls): return cls.fromtimestamp(fake_time())

time.time, time.time_ns = fake_time, fake_time_ns
time.clock_gettime, time.clock_gettime_ns = fake_gettime, fake_gettime_ns
_dt.datetime = FakeDatetime

def step(sig, frame):
    _offset[0] += 3600.0 if sig == signal.SIGUSR1 else -3600.0
    os.write(1, f"CLOCK offset={_offset[0]:+.0f} wall={time.time():.0f}\n".encode())

signal.signal(signal.SIGUSR1, step)
signal.signal(signal.SIGUSR2, step)
sys.path.insert(0, os.getcwd())
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
'''

# Holder A: acquires, watches its handle (largest valid_for(), any loss), notices a
# freeze as a gap of more than 1 s in a 5 ms sleep loop, then reports.
HOLDER = r"""
import json, sys, threading, time
from fencepost.client import LockClient

address, ttl = sys.argv[1], float(sys.argv[2])
with LockClient(address) as client:
    h = client.acquire("clock", ttl=ttl, timeout=10.0)
    print(f"ACQUIRED token={h.token} lease={h.lease_id} wall={time.time():.0f}", flush=True)
    max_valid_for = 0.0
    lost_early = None
    while True:
        t0 = time.monotonic()
        time.sleep(0.005)
        t1 = time.monotonic()
        if t1 - t0 > 1.0:
            break
        v = h.valid_for()
        max_valid_for = max(max_valid_for, v)
        if lost_early is None and (h.lost.is_set() or v <= 0):
            lost_early = t1
            print(f"LOST-EARLY reason={h.lost_reason}", flush=True)
    out = {"resumed_at": t1, "frozen_at": t0, "expiry": h.deadline + h.margin,
           "valid_at_resume": h.is_valid(), "max_valid_for": max_valid_for, "lost_early": lost_early,
           "margin": h.margin}
    while h.is_valid() or not h.lost.is_set():
        time.sleep(0.002)
    out["lost_at"] = time.monotonic()
    out["reason"] = h.lost_reason
    print("RESULT " + json.dumps(out), flush=True)
    time.sleep(3600)
"""


#: The modules that compare a certificate's notBefore/notAfter with the wall clock (as OpenSSL does at a
#: handshake) to word an expiry in logs, errors and a metric; no timer, deadline or lease reads them.
CERTIFICATE_DATES = {"client/_transport/renewal.py", "coordinator/telemetry/certificates.py"}


def test_product_reads_no_wall_clock() -> None:
    """No timer of the client or the coordinator reads the wall clock (time.time, datetime, CLOCK_REALTIME)."""
    pattern = re.compile(r"\btime\.time(_ns)?\(|\bdatetime\b|CLOCK_REALTIME|\bfrom time import time\b")
    hits = []
    for path in [*(REPO / "client").rglob("*.py"), *(REPO / "coordinator").rglob("*.py")]:
        if "/v1/" in str(path) or path.relative_to(REPO).as_posix() in CERTIFICATE_DATES:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) and not line.lstrip().startswith("#"):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, "wall-clock reads in the product:\n" + "\n".join(hits)


async def test_f12_wall_clock_steps_cause_no_loss_and_no_extension(
    etcd: Any, prefix: str, etcd_client: Etcd3Client, tmp_path: Path
) -> None:
    """F12: +-1 h steps on the client then the coordinator: no loss, no extension; then a freeze hands over in bounds."""
    ttl = 5.0
    k = ttl / 3
    shim = tmp_path / "fakeclock.py"
    shim.write_text(FAKECLOCK)
    holder_script = tmp_path / "holder.py"
    holder_script.write_text(HOLDER)
    coord = ChildProcess(
        [sys.executable, str(shim), "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
         "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--grace-seconds", "1"],
        log_path=tmp_path / "coordinator.log")
    a: ChildProcess | None = None
    try:
        match = await coord.await_line(LISTENING, 30)
        address = f"127.0.0.1:{match.group(2)}"
        a = ChildProcess([sys.executable, str(shim), str(holder_script), address, str(ttl)],
                         log_path=tmp_path / "holder.log")
        got = await a.await_line(r"ACQUIRED token=(\d+) lease=(\d+)", 30)
        token_a, lease_a = int(got.group(1)), int(got.group(2))
        assert etcd_client.lease is not None
        async with AsyncLockClient(address) as b:
            waiter = asyncio.create_task(b.acquire("clock", ttl=ttl, timeout=60.0))
            try:
                await _wait_queued(address)
                remaining: list[int] = []
                for target in (a, coord):
                    for sig, offset in ((signal.SIGUSR1, "+3600"), (signal.SIGUSR2, "+0")):
                        target.signal(sig)
                        await target.await_line(rf"^CLOCK offset={re.escape(offset)}", 5)
                        for _ in range(5):  # about 1 s, more than half of K
                            live = await etcd_client.lease.time_to_live(lease_a, timeout=5)
                            remaining.append(int(live.TTL))
                            await asyncio.sleep(0.2)
                        assert not waiter.done(), "B was granted while A held: the step cost A its lease"
                # No loss: A is still the holder; no extension: etcd never showed more than T left.
                assert not any(line.startswith("LOST-EARLY") for line in a.output), a.output
                assert 0 < min(remaining) and max(remaining) <= ttl, remaining
                live = await etcd_client.lease.time_to_live(lease_a, timeout=5)
                assert live.grantedTTL == ttl

                a.signal(signal.SIGSTOP)
                frozen = time.monotonic()
                hb = await asyncio.wait_for(waiter, 3 * ttl)
                granted = time.monotonic()
                await asyncio.sleep(max(0.0, 1.5 * ttl - (granted - frozen)))
                a.signal(signal.SIGCONT)
                resumed = time.monotonic()
                res = json.loads((await a.await_line(r"^RESULT (.*)", 10)).group(1))
            finally:
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)
            assert hb.token > token_a
            # Hand-over within F02's bounds: not before A's lease could have expired
            # (its last acknowledged keepalive + T), not much after the freeze + T.
            assert granted >= res["expiry"], (granted, res["expiry"])
            assert granted - frozen <= ttl + 1.0 + E, granted - frozen
            # No extension on the client: valid_for() never exceeded T - margin.
            assert res["max_valid_for"] <= ttl - res["margin"] + 0.05, res
            assert res["lost_early"] is None
            assert res["valid_at_resume"] is False  # past its deadline: never presented as valid
            assert res["lost_at"] - resumed <= k + E, res
            await hb.release()
        print("\nF12 figures: " + json.dumps({
            "etcd TTL left range": [min(remaining), max(remaining)],
            "max valid_for s": round(res["max_valid_for"], 3),
            "grant after freeze s": round(granted - frozen, 3),
            "grant after A's expiry estimate s": round(granted - res["expiry"], 3),
            "loss reported after resume s": round(res["lost_at"] - resumed, 3), "reason": res["reason"]}))
    finally:
        if a is not None:
            a.kill()
        coord.kill()


async def _wait_queued(address: str) -> None:
    import grpc

    async with grpc.aio.insecure_channel(address) as chan:
        stub = OwnedStub(chan)
        await wait_for(lambda: describe_waiters_is(stub, "clock", 1), 10, what="B queued")
