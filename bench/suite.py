"""Fencepost's benchmark suite (issue 11): P1 to P5 against the peers, every figure also a ratio to etcd-direct.

    python bench/suite.py                  # the whole suite (about 15 to 20 minutes on 2 cores)
    python bench/suite.py --quick          # every figure, short (a few minutes)
    python bench/suite.py --only P1,P3 --out /tmp/bench
    python bench/suite.py --coordinator-arg=--workers --coordinator-arg=2 --loop uvloop

Figures:
- P1 cycles/s: acquire + release, distinct names, and contended (8 users
  per name), at 1, 16, 64 and 256 users, every peer.
- P2 latency of an uncontended acquire and of a release, p50/p99/p99.9, at 1
  and 64 users (from P1's distinct-name loops when P1 runs).
- P3 hand-off: from the holder's release call to the queued waiter's grant, p50/p99.
- P4 leases kept alive by one coordinator: N leases renewed every TTL/3 (TTL
  10 s) by a generator in another process; coordinator CPU (cores), resident
  memory per 1,000 leases, keepalive round trip p99, spurious expiries.

P1, P2 and P4 also give the coordinator's CPU per acquire + release and per
renewal, and its ratio to the floor of the messages involved: a bare
grpc.aio echo (bench/echo.py) measured at the same load right after
(bench/_floor.py).
- P5 take-over: a holder process killed with SIGKILL; seconds to the waiter's
  grant, p50 and max, TTL 2 s and 10 s, against the bound TTL + 0.5 s.

Peers (bench/_peers.py): etcd-direct (the baseline), etcd3aio-lock,
redis-lock (redis-py on redis-server, no fencing, no fsync), kazoo-lock
(kazoo on ZooKeeper), fencepost-stub, fencepost-sync (LockClient, threads),
fencepost-async (AsyncLockClient). Sync peers run in threads of this process
and share its GIL. The coordinator is ``fencepost serve`` in a child process
on an embedded etcd (or ``--etcd-endpoints``). A peer whose server is
missing (no ZooKeeper: bench/install.sh) is skipped and said so.

Writes ``results.json``, ``results.md`` and ``p1-cycles.png`` ...
``p5-takeover.png`` into ``--out`` (default docs/bench/), prints one line
per measurement while it runs and the markdown at the end. Every child
process runs in its own process group and is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _procs  # noqa: E402
from _floor import cycles_against_floor, renewal_against_floor  # noqa: E402
from _leases import leases_kept  # noqa: E402
from _measure import cycle_loops, handoffs, percentile  # noqa: E402
from _peers import (  # noqa: E402
    EtcdDirect,
    Etcd3aioLock,
    FencepostAsync,
    FencepostStub,
    FencepostSync,
    KazooLock,
    RedisLock,
)
from _report import render, plot  # noqa: E402
from _shared_peer import FencepostAsyncShared  # noqa: E402
from _takeover import takeovers  # noqa: E402

from fencepost.coordinator.process.embedded import EmbeddedEtcd  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ["P1", "P2", "P3", "P4", "P5"]
PEERS = ["etcd-direct", "etcd3aio-lock", "redis-lock", "kazoo-lock", "fencepost-stub", "fencepost-sync",
         "fencepost-async", "fencepost-async-shared"]
#: Peers measured in P1 and P2 only (the shared client's users would hand a lock over inside the client in P3).
P1_ONLY = {"fencepost-async-shared"}
#: Users per lock name in P1's contended variant.
PER_NAME = 8


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """The run's sizes: the defaults, or --quick's, or what the flags say."""
    quick = args.quick
    s: dict[str, Any] = {
        "seconds": 1.0 if quick else 5.0,
        "clients": [1, 64] if quick else [1, 16, 64, 256],
        "contended_clients": [64] if quick else [16, 64, 256],
        "p2_clients": [1, 64],
        "handoffs": 20 if quick else 200,
        "p4_leases": [1000, 10000],
        "p4_batches": [1] if quick else [1, 10],
        "p4_over_capacity": not quick,
        "p4_window": 3.4 if quick else 20.0,
        "p4_ttl": 10,
        "p5_ttls": [2, 10],
        "p5_kills": 5 if quick else 20,
        "p5_peer_kills": 3 if quick else 10,
    }
    for key in ("seconds", "handoffs", "p5_kills"):
        if getattr(args, key, None) is not None:
            s[key] = getattr(args, key)
    if args.clients:
        s["clients"] = s["contended_clients"] = args.clients
    if args.p4_leases:
        s["p4_leases"], s["p4_over_capacity"] = args.p4_leases, False
    return s


def say(line: str) -> None:
    """One progress line."""
    print(line, flush=True)


class Suite:
    """One run: the servers, the peers and the results."""

    def __init__(self, args: argparse.Namespace, endpoint: str, etcd_pid: int | None, workdir: Path) -> None:
        self.args = args
        self.s = settings(args)
        self.endpoint, self.etcd_pid, self.workdir = endpoint, etcd_pid, workdir
        self.children = _procs.Children()
        self.prefix = f"/bench/{uuid.uuid4().hex}/"
        self.peers: dict[str, Any] = {}
        self.peer_kinds: list[str] = []
        self.skipped: dict[str, str] = {}
        self.results: dict[str, Any] = {"P1": {"distinct": {}, "contended": {}}, "P2": {}, "P3": {}, "P4": {},
                                        "P5": {}, "cpu": {}, "floor": {}}
        self._loops: dict[tuple[str, str, int], Any] = {}
        self.coordinator: subprocess.Popen[str] | None = None

    async def start(self, need_peers: bool) -> None:
        coordinator, address = _procs.start_coordinator(self.endpoint, self.prefix, *self.args.coordinator_arg,
                                                        loop=self.args.loop)
        self.coordinator = self.children.add(coordinator)
        say(f"coordinator at {address} (pid {coordinator.pid}), etcd at {self.endpoint}")
        if self.args.loop != "asyncio" and "--loop" not in _procs.serve_flags():
            say(f"note: {_procs.LOOP_ENV}={self.args.loop} is set for the coordinator, but this `fencepost serve` "
                "has no --loop flag: unless it reads the variable, it runs on asyncio's loop")
        elif self.args.loop == "asyncio":
            say("coordinator loop: asyncio (--loop uvloop for uvloop)")
        if not need_peers:
            self.peers = {"etcd-direct": EtcdDirect(self.endpoint, self.prefix),
                          "fencepost-async": FencepostAsync(address)}
            return
        wanted = self.args.peers or PEERS
        for kind in wanted:
            try:
                self.peers[kind] = await self._peer(kind, address)
            except Exception as exc:  # a missing server skips its peer, said in the results
                self.skipped[kind] = str(exc)
                say(f"skipped {kind}: {exc}")

    async def _peer(self, kind: str, address: str) -> Any:
        if kind == "etcd-direct":
            return EtcdDirect(self.endpoint, self.prefix)
        if kind == "etcd3aio-lock":
            peer = Etcd3aioLock(self.endpoint, self.prefix)
            await peer.start()
            return peer
        if kind == "redis-lock":
            proc, port = _procs.start_redis(self.workdir)
            self.children.add(proc)
            return RedisLock(port, self.prefix)
        if kind == "kazoo-lock":
            (self.workdir / "zk").mkdir(exist_ok=True)
            proc, port = await asyncio.to_thread(_procs.start_zookeeper, self.workdir / "zk")
            self.children.add(proc)
            return KazooLock(port, self.prefix)
        return {"fencepost-stub": FencepostStub, "fencepost-sync": FencepostSync, "fencepost-async": FencepostAsync,
                "fencepost-async-shared": FencepostAsyncShared}[kind](address)

    async def close(self) -> None:
        """Close the peers and stop every server this suite started (idempotent)."""
        for peer in self.peers.values():
            try:
                await peer.close()
            except Exception:
                pass
        self.peer_kinds = self.peer_kinds or list(self.peers)
        self.peers = {}
        self.children.stop_all()

    # ------------------------------------------------------------------------------------------ P1, P2

    async def loops(self, kind: str, variant: str, n: int) -> Any:
        """The cycle loops of ``kind`` with ``n`` users (cached: P2 reuses P1's)."""
        key = (kind, variant, n)
        if key not in self._loops:
            tag = f"{kind}/{variant}{n}"
            names = (lambda i: f"{tag}/{i}") if variant == "distinct" else (lambda i: f"{tag}/{i // PER_NAME}")
            cpu = self._cpu()
            coordinator = self.coordinator.pid if self.coordinator else None
            probe = (lambda: _procs.cpu_seconds(coordinator)) if coordinator and kind.startswith("fencepost") else None
            self._loops[key] = await asyncio.wait_for(
                cycle_loops(self.peers[kind], n, self.s["seconds"], names, probe), self.s["seconds"] + 300)
            self.results["cpu"].setdefault(f"{variant}/{n}", {})[kind] = self._cpu_since(cpu)
        return self._loops[key]

    def _cpu(self) -> tuple[float, dict[str, float]]:
        pids = {"coordinator": self.coordinator.pid if self.coordinator else None, "etcd": self.etcd_pid,
                "bench": os.getpid()}
        return time.monotonic(), {k: _procs.cpu_seconds(p) for k, p in pids.items() if p}

    def _cpu_since(self, mark: tuple[float, dict[str, float]]) -> dict[str, float]:
        t0, c0 = mark
        t1, c1 = self._cpu()
        return {k: round((c1[k] - c0[k]) / (t1 - t0), 2) for k in c0}

    async def p1(self) -> None:
        for variant, counts in (("distinct", self.s["clients"]), ("contended", self.s["contended_clients"])):
            for n in counts:
                row: dict[str, Any] = {}
                for kind in self.peers:
                    started = time.monotonic()
                    try:
                        rate = (await self.loops(kind, variant, n)).rate
                    except Exception as exc:
                        row[kind] = {"error": _error(exc)}
                        say(f"[P1] {kind:<16} {variant:<9} n={n:<3} FAILED: {_error(exc)}")
                        continue
                    base = rate if kind == "etcd-direct" else row.get("etcd-direct", {}).get("cycles_per_s")
                    row[kind] = {"cycles_per_s": round(rate, 1), "ratio": _ratio(rate, base)}
                    say(f"[P1] {kind:<16} {variant:<9} n={n:<3} {rate:9.1f} cycles/s  "
                        f"{_x(row[kind]['ratio'])} etcd-direct  ({time.monotonic() - started:.0f} s)")
                self.results["P1"][variant][str(n)] = row
                await self.floor(variant, n)

    async def floor(self, variant: str, n: int) -> dict[str, Any]:
        """The coordinator's CPU per acquire + release of the Fencepost peers of one P1 row, against the echo floor."""
        key = f"{variant}/{n}"
        if key not in self.results["floor"]:
            loops = {k[0]: loop for k, loop in self._loops.items() if k[1:] == (variant, n)}
            try:
                self.results["floor"][key] = out = await cycles_against_floor(loops, n, self.s["seconds"])
            except Exception as exc:
                self.results["floor"][key] = out = {"error": _error(exc)}
                say(f"[P1] echo floor {key} FAILED: {_error(exc)}")
            for kind, e in out.items():
                if kind not in ("echo", "error"):
                    say(f"[P1] {kind:<16} {variant:<9} n={n:<3} coordinator CPU {e['coordinator_us_per_cycle']:.0f} us "
                        f"per acquire + release, floor {e['floor_us_per_cycle']:.0f} us: "
                        f"{_x(e['ratio_to_floor'])} the echo floor")
        return self.results["floor"][key]  # type: ignore[no-any-return]

    async def p2(self) -> None:
        for n in self.s["p2_clients"]:
            row: dict[str, Any] = {}
            for kind in self.peers:
                try:
                    loops = await self.loops(kind, "distinct", n)
                except Exception as exc:
                    row[kind] = {"error": _error(exc)}
                    continue
                entry: dict[str, Any] = {"samples": len(loops.acquire)}
                for op in ("acquire", "release"):
                    values = getattr(loops, op)
                    entry[op] = {q: round(percentile(values, p) * 1e3, 3)
                                 for q, p in (("p50", 50), ("p99", 99), ("p99.9", 99.9))}
                floor = (await self.floor("distinct", n)).get(kind)
                if floor:
                    entry.update(floor)
                base = entry if kind == "etcd-direct" else row.get("etcd-direct")
                for op in ("acquire", "release"):
                    entry[op]["ratio_p50"] = _ratio(entry[op]["p50"], base[op]["p50"] if base else None)
                row[kind] = entry
                say(f"[P2] {kind:<16} n={n:<3} acquire p50/p99/p99.9 "
                    f"{entry['acquire']['p50']:.2f}/{entry['acquire']['p99']:.2f}/{entry['acquire']['p99.9']:.2f} ms, "
                    f"release {entry['release']['p50']:.2f}/{entry['release']['p99']:.2f}/"
                    f"{entry['release']['p99.9']:.2f} ms  ({entry['samples']} cycles)"
                    + (f"; coordinator {entry['coordinator_us_per_cycle']:.0f} us per cycle, "
                       f"{_x(entry['ratio_to_floor'])} the echo floor" if floor else ""))
            self.results["P2"][str(n)] = row

    # ------------------------------------------------------------------------------------------ P3

    async def p3(self) -> None:
        for kind, peer in self.peers.items():
            if kind in P1_ONLY:
                continue
            started = time.monotonic()
            try:
                samples = await asyncio.wait_for(handoffs(peer, self.s["handoffs"], f"{kind}/handoff"),
                                                 60 + self.s["handoffs"] * 2)
            except Exception as exc:
                self.results["P3"][kind] = {"error": _error(exc)}
                say(f"[P3] {kind:<16} FAILED: {_error(exc)}")
                continue
            entry = {"p50_ms": round(percentile(samples, 50) * 1e3, 3), "p99_ms": round(percentile(samples, 99) * 1e3, 3),
                     "max_ms": round(max(samples) * 1e3, 3), "samples": len(samples)}
            base = entry["p50_ms"] if kind == "etcd-direct" else self.results["P3"].get("etcd-direct", {}).get("p50_ms")
            entry["ratio_p50"] = _ratio(entry["p50_ms"], base)
            self.results["P3"][kind] = entry
            say(f"[P3] {kind:<16} hand-off p50 {entry['p50_ms']:.2f} ms, p99 {entry['p99_ms']:.2f} ms  "
                f"{_x(entry['ratio_p50'])} etcd-direct p50  ({len(samples)} hand-offs, "
                f"{time.monotonic() - started:.0f} s)")

    # ------------------------------------------------------------------------------------------ P4

    async def p4(self) -> None:
        """P4: each of ``p4_leases``, renewed directly on etcd, then through the coordinator with each of the
        ``--p4-batch`` sizes; then 2x the capacity measured (the most leases admitted by a run that refused
        grants, else 2x the largest run), one lease per message."""
        for n in self.s["p4_leases"]:
            await self._p4_row(n, self.args.p4_batch or self.s["p4_batches"])
        if self.s["p4_over_capacity"]:
            runs = [e for row in self.results["P4"].values() for mode, e in row.items()
                    if mode == "fencepost" and "leases" in e]
            refused = [e["leases"] for e in runs if e.get("grant_refusals")]
            capacity = max(refused) if refused else max(self.s["p4_leases"])
            await self._p4_row(2 * capacity, [1])

    async def _p4_row(self, n: int, batches: list[int]) -> None:
        endpoint = self.args.etcd_endpoints
        row: dict[str, Any] = {}
        # The first batch size is the "fencepost" row; others are rows of their own ("fencepost-batch10").
        modes = [("etcd-direct", 1), ("fencepost", batches[0]),
                 *((f"fencepost-batch{b}", b) for b in batches[1:])]
        for mode, batch in modes:
            started = time.monotonic()
            try:
                out = await leases_kept(mode.split("-batch")[0], n, self.s["p4_window"], self.s["p4_ttl"],
                                        endpoint, self.args.coordinator_arg, self.args.loop, batch)
            except Exception as exc:
                row[mode] = {"error": _error(exc)}
                say(f"[P4] {mode:<16} N={n:<6} FAILED: {_error(exc)}")
                continue
            row[mode] = out
            base = row.get("etcd-direct", {})
            if mode == "fencepost" and "rtt_ms" in base:
                out["ratio_rtt_p99"] = _ratio(out["rtt_ms"]["p99"], base["rtt_ms"]["p99"])
                if "etcd" in base.get("cores", {}) and "etcd" in out["cores"]:
                    servers = out["cores"]["coordinator"] + out["cores"]["etcd"]
                    out["ratio_server_cores"] = _ratio(servers, base["cores"]["etcd"])
            if mode != "etcd-direct":
                say(await renewal_against_floor(out, batch, row))
            cores = out["cores"]
            say(f"[P4] {mode:<16} N={n:<6} coordinator {cores.get('coordinator', float('nan')):.3f} cores, "
                f"etcd {cores.get('etcd', float('nan')):.3f}, generator {cores['generator']:.3f}; "
                f"RSS/1000 leases {out.get('coordinator_rss_kib_per_1000_leases', '-')} KiB; "
                f"keepalive RTT p99 {out['rtt_ms']['p99']} ms; spurious expiries {out['spurious_expiries']}; "
                f"{out['renewals_per_second']:.0f} renewals/s; grants took {out['grant_seconds']} s; "
                f"admitted {out.get('leases', n)} of {n}, {out.get('grant_refusals', 0)} grants refused, "
                f"RTT p50 {out['rtt_ms']['p50']} ms; "
                f"coordinator warnings {out.get('coordinator_warnings', '-')}  ({time.monotonic() - started:.0f} s)")
        self.results["P4"][str(n)] = row

    # ------------------------------------------------------------------------------------------ P5

    async def p5(self) -> None:
        order = ["etcd-direct", "fencepost-async", "kazoo-lock", "redis-lock"]
        for ttl in self.s["p5_ttls"]:
            row: dict[str, Any] = {}
            for kind in [k for k in order if k in self.peers]:
                kills = self.s["p5_kills"] if kind == "fencepost-async" else self.s["p5_peer_kills"]
                started = time.monotonic()
                try:
                    out = await takeovers(self.peers[kind], ttl, kills, f"{kind}/takeover{ttl}")
                except Exception as exc:
                    row[kind] = {"error": _error(exc)}
                    say(f"[P5] {kind:<16} T={ttl:<3} FAILED: {_error(exc)}")
                    continue
                samples = out["samples_s"]
                entry = {"p50_s": round(percentile(samples, 50), 3), "max_s": round(max(samples), 3),
                         "min_s": round(min(samples), 3), "kills": len(samples), "bound_s": ttl + 0.5,
                         "within_bound": max(samples) <= ttl + 0.5, "holder_ttl_s": out["holder_ttl_s"]}
                base = entry["p50_s"] if kind == "etcd-direct" else row.get("etcd-direct", {}).get("p50_s")
                entry["ratio_p50"] = _ratio(entry["p50_s"], base)
                row[kind] = entry
                say(f"[P5] {kind:<16} T={ttl:<3} take-over p50 {entry['p50_s']:.3f} s, max {entry['max_s']:.3f} s "
                    f"(bound {ttl + 0.5} s: {'met' if entry['within_bound'] else 'MISSED'})  "
                    f"({len(samples)} kills, {time.monotonic() - started:.0f} s)")
            self.results["P5"][str(ttl)] = row


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__


def _ratio(value: float | None, base: float | None) -> float | None:
    """``value / base``; None when either is missing (the baseline failed). The baseline's own row gets 1.0."""
    return round(value / base, 3) if value is not None and base else None


def _x(ratio: float | None) -> str:
    return f"{ratio:5.2f}x" if ratio is not None else "   - "


def machine() -> dict[str, Any]:
    """The machine and the commit: nproc, CPU model, Python, the git commit (dirty or not)."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "cpu": model, "python": platform.python_version(),
            "commit": commit + ("-dirty" if dirty else ""), "date": time.strftime("%Y-%m-%d %H:%M %Z")}


async def run(args: argparse.Namespace, endpoint: str, etcd_pid: int | None, workdir: Path) -> dict[str, Any]:
    """Run the chosen figures; return every result."""
    suite = Suite(args, endpoint, etcd_pid, workdir)
    only = args.only
    steps = {"P1": suite.p1, "P2": suite.p2, "P3": suite.p3, "P5": suite.p5, "P4": suite.p4}
    try:
        await suite.start(need_peers=bool({"P1", "P2", "P3", "P5"} & set(only)))
        for figure in ("P1", "P2", "P3", "P5", "P4"):  # P4 last: it starts its own etcds and coordinators
            if figure == "P4":
                await suite.close()  # the peers' servers and the coordinator stop: P4 measures its own
            if figure in only:
                say(f"--- {figure}")
                try:
                    await steps[figure]()
                except Exception:
                    say(f"[{figure}] FAILED:\n{traceback.format_exc()}")
    finally:
        await suite.close()
    return {"meta": {**machine(), "command": " ".join(["python", "bench/suite.py", *sys.argv[1:]]),
                     "settings": suite.s, "figures": only, "peers": suite.peer_kinds, "skipped": suite.skipped,
                     "loop": args.loop, "coordinator_args": args.coordinator_arg,
                     "etcd": args.etcd_endpoints or "embedded"},
            **{k: v for k, v in suite.results.items() if k in only or k in ("cpu", "floor")}}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="every figure, short (a few minutes)")
    p.add_argument("--only", default=",".join(FIGURES), help="figures to run, e.g. P1,P3 (default all)")
    p.add_argument("--out", default=str(ROOT / "docs" / "bench"), help="results directory (default docs/bench)")
    p.add_argument("--etcd-endpoints", help="use this etcd instead of embedded ones")
    p.add_argument("--coordinator-arg", action="append", default=[],
                   help="a flag for `fencepost serve` (repeatable: --coordinator-arg=--workers --coordinator-arg=2)")
    p.add_argument("--loop", choices=["asyncio", "uvloop", "auto"], default="asyncio",
                   help="the coordinators' event loop: serve --loop (and env "
                        f"{_procs.LOOP_ENV}); default asyncio, whatever serve's own default")
    p.add_argument("--peers", type=lambda s: s.split(","), help=f"peers to run (default all: {','.join(PEERS)})")
    p.add_argument("--seconds", type=float, help="seconds per P1 measurement (default 5; --quick 1)")
    p.add_argument("--clients", type=int, action="append", help="P1 user counts (repeatable)")
    p.add_argument("--handoffs", type=int, help="P3 hand-offs per peer (default 200; --quick 20)")
    p.add_argument("--p5-kills", type=int, help="P5 kills per TTL for Fencepost (default 20; --quick 5)")
    p.add_argument("--p4-leases", type=int, action="append", help="P4 lease counts (repeatable)")
    p.add_argument("--p4-batch", type=int, action="append",
                   help="P4 (fencepost): renewals per keepalive message (default 1; see bench/_leasegen.py --batch); "
                        "repeatable: each further size is a row of its own (fencepost-batch10), compared with batch 1")
    args = p.parse_args(argv)
    args.only = [f.strip().upper() for f in args.only.split(",") if f.strip()]
    if bad := [f for f in args.only if f not in FIGURES]:
        p.error(f"unknown figure(s) {bad}; choose from {FIGURES}")
    if args.peers and (bad := [k for k in args.peers if k not in PEERS]):
        p.error(f"unknown peer(s) {bad}; choose from {PEERS}")
    if args.peers and "etcd-direct" not in args.peers:
        args.peers.insert(0, "etcd-direct")  # the baseline of every ratio
    return args


def main() -> None:
    args = parse()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fencepost-bench-") as tmp:
        if args.etcd_endpoints:
            results = asyncio.run(run(args, args.etcd_endpoints, None, Path(tmp)))
        else:
            with EmbeddedEtcd(Path(tmp) / "etcd") as etcd:
                results = asyncio.run(run(args, etcd.endpoint, etcd.pid, Path(tmp)))
    results["meta"]["seconds"] = round(time.monotonic() - started)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    try:
        images = plot(results, out)
    except Exception:  # the numbers are written already; a plot that fails must not lose them
        say(f"plots FAILED:\n{traceback.format_exc()}")
        images = []
    markdown = render(results, images)
    (out / "results.md").write_text(markdown)
    print(markdown)
    say(f"written: {out / 'results.json'}, {out / 'results.md'}, {', '.join(str(i) for i in images)}")


if __name__ == "__main__":
    main()
