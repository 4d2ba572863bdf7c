"""Render the Grafana dashboard's panels from a real run, with matplotlib (Grafana cannot run here).

Starts an etcd (``fencepost.coordinator.process.embedded``) and a coordinator with
``metrics_listen``, runs a short workload of three phases (light, contended,
light) through ``AsyncLockClient`` and raw stubs, scrapes ``/metrics`` over
HTTP every ``--scrape`` seconds, and draws the panels of ``dashboard.json``
(same titles, same order) computed from the scraped samples the way their
PromQL does: ``rate`` is the increase over the last ``--window`` seconds,
``histogram_quantile`` interpolates within buckets as Prometheus does.

Usage (the ``test`` extra has matplotlib and the etcd binary)::

    python deploy/observability/render.py --out docs/img/dashboard.png

The workload: 2 workers on 4 locks for the first third, 8 workers on 2 locks
for the second, 2 again for the last; each holds for 20 to 200 ms and pauses
for 0 to 100 ms; every 2 s a try-acquire of a held lock (LOCK_HELD), a
release with a stale token (STALE_TOKEN), a release on a revoked lease
(LEASE_EXPIRED; the revoke ends a hold: revoked), a hold on a lease never kept
alive (it expires: expired), and two writes through a SQLite guard, the
second with the stale token (refused). The coordinator labels the name
prefixes ``jobs/`` and ``orders/``; the guard reports to a registry of its
own, scraped with the coordinator's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sqlite3
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fencepost.client import AsyncLockClient, LockHeld, StaleTokenError
from fencepost.client.fencing import SqlGuard
from fencepost.client.v1 import lock_pb2, lock_pb2_grpc
from fencepost.client.v1.keys import LEASE_SECRET_METADATA
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd

HERE = Path(__file__).resolve().parent
Labels = tuple[tuple[str, str], ...]
#: One scrape: its time (seconds since the start) and {(series name, labels): value}.
Scrape = tuple[float, dict[tuple[str, Labels], float]]


async def _worker(address: str, names: list[str], stop: asyncio.Event, seed: int) -> None:
    rng = random.Random(seed)
    async with AsyncLockClient(address) as client:
        while not stop.is_set():
            handle = await client.acquire(rng.choice(names), ttl=10.0, timeout=30.0)
            await asyncio.sleep(rng.uniform(0.02, 0.2))
            await handle.release()
            await asyncio.sleep(rng.uniform(0.0, 0.1))


async def _grant(stub: lock_pb2_grpc.LockServiceStub, ttl_seconds: int) -> tuple[int, tuple[tuple[str, str], ...]]:
    """A new lease: its id, and the metadata that presents its secret (the calls of its owner)."""
    granted = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=ttl_seconds))
    return granted.lease_id, ((LEASE_SECRET_METADATA, granted.lease_secret),)


async def _refusals(address: str, stop: asyncio.Event, guards: CollectorRegistry) -> None:
    """Every 2 s: LOCK_HELD (a try-acquire of a held lock), STALE_TOKEN and LEASE_EXPIRED (raw Release calls),
    a hold left to expire, and a stale write refused by a SQLite guard reporting to ``guards``."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE records (id TEXT PRIMARY KEY, v TEXT, fencing_token BIGINT)")
    guard = SqlGuard(db, "records", "id", metrics=guards)
    rounds = 0
    async with grpc.aio.insecure_channel(address) as channel, AsyncLockClient(address) as client:
        stub = lock_pb2_grpc.LockServiceStub(channel)
        while not stop.is_set():
            rounds += 1
            # The raw calls act as each lease's owner: they present the secret its LeaseGrant returned.
            short, short_owner = await _grant(stub, 1)
            await stub.Acquire(lock_pb2.AcquireRequest(name=f"expiring/{rounds}", lease_id=short),
                               metadata=short_owner)
            held = await client.acquire("refusals/held", ttl=10.0, timeout=5.0)
            async with AsyncLockClient(address) as other:
                with contextlib.suppress(LockHeld):
                    await other.try_acquire("refusals/held", ttl=10.0)
            await held.release()
            lease, owner = await _grant(stub, 10)
            old = (await stub.Acquire(lock_pb2.AcquireRequest(name="refusals/stale", lease_id=lease),
                                      metadata=owner)).token
            await stub.Release(lock_pb2.ReleaseRequest(name="refusals/stale", lease_id=lease, token=old),
                               metadata=owner)
            new = (await stub.Acquire(lock_pb2.AcquireRequest(name="refusals/stale", lease_id=lease),
                                      metadata=owner)).token
            for token in (old, new):  # the old token is STALE_TOKEN; then, after the revoke, LEASE_EXPIRED
                with contextlib.suppress(grpc.aio.AioRpcError):
                    await stub.Release(lock_pb2.ReleaseRequest(name="refusals/stale", lease_id=lease, token=token),
                                       metadata=owner)
                if token == old:
                    await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), metadata=owner)
            guard.upsert("record", new, {"v": "new"})
            with contextlib.suppress(StaleTokenError):
                guard.upsert("record", old, {"v": "old"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)


def _scrape(url: str, guards: CollectorRegistry) -> dict[tuple[str, Labels], float]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 (our own http://127.0.0.1 endpoint)
        text = resp.read().decode() + generate_latest(guards).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def run(seconds: float, scrape_every: float) -> list[Scrape]:
    """Run the workload for ``seconds`` and return the scrapes."""
    scrapes: list[Scrape] = []
    guards = CollectorRegistry()
    with tempfile.TemporaryDirectory() as data:
        etcd = EmbeddedEtcd(data)
        etcd.start()
        try:
            coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix="/render/",
                                metrics_listen="127.0.0.1:0", metrics_name_prefixes=["jobs/", "orders/"])
            await coord.start()
            address, url = f"127.0.0.1:{coord.port}", f"http://{coord.metrics_address}/metrics"
            started = time.monotonic()
            stops: list[asyncio.Event] = []
            tasks: list[asyncio.Task[None]] = []

            def start(count: int, names: list[str]) -> None:
                stop = asyncio.Event()
                stops.append(stop)
                tasks.extend(asyncio.create_task(_worker(address, names, stop, len(tasks) + i)) for i in range(count))

            refusal_stop = asyncio.Event()
            stops.append(refusal_stop)
            tasks.append(asyncio.create_task(_refusals(address, refusal_stop, guards)))
            try:
                start(2, [f"jobs/{i}" for i in range(4)])
                phase = 0
                while (now := time.monotonic() - started) < seconds:
                    if phase == 0 and now > seconds / 3:
                        start(6, ["orders/1", "orders/2"])
                        phase = 1
                    elif phase == 1 and now > 2 * seconds / 3:
                        stops[-1].set()
                        phase = 2
                    scrapes.append((now, await asyncio.to_thread(_scrape, url, guards)))
                    await asyncio.sleep(scrape_every)
                for stop in stops:
                    stop.set()
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await coord.stop(grace=0)
        finally:
            etcd.stop()
    return scrapes


# ---------------------------------------------------------------- the panels' queries


def _series(scrapes: list[Scrape], name: str, by: tuple[str, ...] = (), **match: str
            ) -> dict[tuple[str, ...], list[tuple[float, float]]]:
    """``sum by (by) (name{match})`` at each scrape."""
    out: dict[tuple[str, ...], dict[float, float]] = defaultdict(dict)
    for t, samples in scrapes:
        for (sample, labels), value in samples.items():
            d = dict(labels)
            if sample != name or any(d.get(k) != v for k, v in match.items()):
                continue
            key = tuple(d.get(k, "") for k in by)
            out[key][t] = out[key].get(t, 0.0) + value
    return {k: sorted(v.items()) for k, v in out.items()}


def _rate(points: list[tuple[float, float]], window: float) -> list[tuple[float, float]]:
    """Per-second increase over the last ``window`` seconds at each point."""
    rates = []
    for i, (t, v) in enumerate(points):
        j = next(k for k, (u, _) in enumerate(points) if u >= t - window)
        if j < i:
            rates.append((t, max(0.0, v - points[j][1]) / (t - points[j][0])))
    return rates


def _quantile(q: float, buckets: dict[float, float]) -> float:
    """Prometheus's histogram_quantile over cumulative bucket counts {upper bound: count}."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound in bounds:
        if buckets[bound] >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(buckets[bound] - below, 1e-12)
        lower, below = bound, buckets[bound]
    return lower


def _quantiles(scrapes: list[Scrape], name: str, q: float, window: float, by: str | None = None, **match: str
               ) -> dict[str, list[tuple[float, float]]]:
    """``histogram_quantile(q, sum by (le[, by]) (rate(name_bucket{match}[window])))``."""
    groups = ("le",) + ((by,) if by else ())
    rates = {key: _rate(points, window) for key, points in _series(scrapes, name + "_bucket", groups,
                                                                     **match).items()}
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    times = sorted({t for points in rates.values() for t, _ in points})
    for group in sorted({key[1:] for key in rates}):
        for t in times:
            buckets = {float(key[0]): dict(points).get(t, 0.0) for key, points in rates.items() if key[1:] == group}
            value = _quantile(q, buckets)
            if value == value:  # not NaN: no observation in the window
                out[group[0] if group else f"p{round(q * 100)}"].append((t, value))
    return out


def panels(scrapes: list[Scrape], window: float) -> list[tuple[str, str, dict[str, list[tuple[float, float]]]]]:
    """(title, unit, {legend: points}) of each panel of dashboard.json, in its order."""
    def rate(name: str, by: tuple[str, ...] = (), legend: str = "", **match: str) -> dict[str, list[Any]]:
        return {(legend or " ".join(k)): _rate(p, window) for k, p in _series(scrapes, name, by, **match).items()}

    def increase(name: str, by: tuple[str, ...]) -> dict[str, list[Any]]:
        return {" ".join(k): [(t, v * window) for t, v in _rate(p, window)] for k, p in _series(scrapes, name, by).items()}

    grants = rate("fencepost_grants_total", legend="grants")
    refusals = {k: v for k, v in rate("fencepost_refusals_total", ("reason",)).items() if any(y for _, y in v)}
    lost = {k: v for k, v in rate("fencepost_losses_total", ("reason",)).items() if k != "released"}
    times = {f"{what} p{round(q * 100)}": points
             for what, name, match in (("hold", "fencepost_hold_seconds", {}),
                                       ("hand-off to a waiter", "fencepost_handoff_seconds", {"queued": "true"}))
             for q in (0.5, 0.99) for points in _quantiles(scrapes, name, q, window, **match).values()}
    etcd_errors = {k: v for k, v in rate("fencepost_etcd_errors_total", ("operation", "code")).items()}
    lock_calls = {k: v for k, v in rate("grpc_server_handled_total", ("grpc_method", "grpc_code"),
                                        grpc_service="fencepost.v1.LockService").items() if any(y for _, y in v)}
    up = {"coordinators up": [(t, 1.0) for t, _ in scrapes]}
    return [
        ("Grants, releases and hand-offs", "per second", {
            **grants, **rate("fencepost_releases_total", legend="releases"),
            **rate("fencepost_handoff_seconds_count", legend="hand-offs", queued="true")}),
        ("Acquire wait percentiles", "seconds", {
            k: v for q in (0.5, 0.9, 0.99) for k, v in _quantiles(scrapes, "fencepost_acquire_wait_seconds", q,
                                                                  window).items()}),
        ("Holds, leases and waiters", "count", {
            "holds": _series(scrapes, "fencepost_holds")[()],
            "waiting acquires": _series(scrapes, "fencepost_waiting_acquires")[()],
            "leases kept alive": _series(scrapes, "fencepost_leases")[()],
            "holds watched by streams": _series(scrapes, "fencepost_watched_holds")[()]}),
        ("Refusals by reason", "per second", refusals),
        ("Lost holds by reason", "per second", lost),
        ("Stale writes refused by guards", "count", {
            **increase("fencepost_guard_stale_rejections_total", ("storage",)),
            **{f"{k} ahead": v for k, v in increase("fencepost_guard_token_ahead_total", ("storage",)).items()}}),
        ("Hold and hand-off times", "seconds", times),
        ("Grants by name prefix", "per second", {(k or '""'): v for k, v in rate("fencepost_grants_total",
                                                                                   ("prefix",)).items()}),
        ("etcd request latency p99", "seconds", _quantiles(scrapes, "fencepost_etcd_request_seconds", 0.99, window,
                                                           by="operation")),
        ("etcd errors", "per second", {**etcd_errors, **rate("fencepost_watch_restarts_total",
                                                             legend="watch restarts")}),
        ("gRPC calls by method and code", "per second", lock_calls),
        ("Coordinators up and keepalives", "count, per second", {
            **up, **rate("fencepost_keepalives_total", legend="keepalives/s")}),
    ]


def draw(scrapes: list[Scrape], window: float, out: Path) -> None:
    """Draw the panels on a 2-column grid like the dashboard's and save a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = [p["title"] for p in json.loads((HERE / "dashboard.json").read_text())["panels"]]
    drawn = panels(scrapes, window)
    assert [title for title, _, _ in drawn] == titles, "render.py's panels drifted from dashboard.json"
    fig, axes = plt.subplots(6, 2, figsize=(13, 16.8), sharex=True)
    for ax, (title, unit, lines) in zip(axes.flat, drawn, strict=True):
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel(unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        for legend, points in sorted(lines.items()):
            if points:
                ax.plot([t for t, _ in points], [v for _, v in points], label=legend, linewidth=1.2)
        if not any(lines.values()):
            ax.text(0.5, 0.5, "no data in this run",
                    ha="center", va="center", transform=ax.transAxes, fontsize=9, color="gray")
        else:
            ax.set_ylim(bottom=0)
            ax.legend(fontsize=7, loc="upper left", ncol=3)
    for ax in axes[-1]:
        ax.set_xlabel("seconds since the start of the run", fontsize=8)
    fig.suptitle(f"Fencepost dashboard panels from one run ({len(scrapes)} scrapes, rates over {window:g} s)",
                 fontsize=11)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=70)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the workload, scrape, draw; prints the PNG's path and size."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE.parent.parent / "docs" / "img" / "dashboard.png")
    parser.add_argument("--seconds", type=float, default=45.0, help="length of the workload (default 45)")
    parser.add_argument("--scrape", type=float, default=1.0, help="seconds between scrapes (default 1)")
    parser.add_argument("--window", type=float, default=5.0, help="rate window in seconds (default 5)")
    args = parser.parse_args(argv)
    scrapes = asyncio.run(run(args.seconds, args.scrape))
    draw(scrapes, args.window, args.out)
    print(f"{args.out}: {args.out.stat().st_size} bytes, {len(scrapes)} scrapes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
