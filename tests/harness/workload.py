"""The fault-run workload: worker processes doing fenced read-modify-writes.

Each worker (``python -m tests.harness.workload worker ...``) loops:

1. acquire a lock named after one counter row (``LockClient.acquire``);
2. **claim** the row with the token (a fenced write of the token alone);
3. read the counter;
4. write counter + 1 with the token (a fenced UPDATE) and append
   ``(record, token, worker, old, new)`` to an audit table in the same
   transaction, so that the audit table's order is the commit order;
5. release.

Why the claim: a fenced *write* alone does not protect a read-modify-write.
If holder C (token 5) read the counter, froze, and lost its lease, and A
(token 7) then read the same value before C woke up and wrote, C's late
write is accepted (5 >= the stored token) and A's write too (7 >= 5): one
increment is lost. Claiming the row with token 7 before reading makes C's
write stale, and any write accepted after A's claim carries a token >= 7,
which makes A's own write stale instead. The checker finds the lost update
if a workload skips the claim (``--no-claim``).

Every step is recorded in the worker's history (see :mod:`.history`),
``is_valid()`` is recorded before and after each write, and a loss notice
(``on_lost`` callback) is recorded with the lease's estimated server-side
expiry (send time of the last acknowledged keepalive + TTL).

The driver (:func:`run`) starts K workers for N seconds against SQLite (a
file in WAL mode) or PostgreSQL (a DSN), calls a nemesis between pauses,
stops the workers, and returns the merged history and the final data.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from . import history as hist
from .nemesis import (
    Control,
    Nemesis,
    Worker,
    freeze_holder_nemesis,
    freeze_nemesis,
    kill_nemesis,
    mixed_nemesis,
    restart_nemesis,
)

REPO = Path(__file__).resolve().parents[2]

__all__ = ["Store", "open_store", "Control", "RunResult", "run", "freeze_nemesis", "kill_nemesis",
           "restart_nemesis", "mixed_nemesis", "freeze_holder_nemesis", "worker_main"]


# ---------------------------------------------------------------- storage


class Store:
    """Counter rows guarded by fencing tokens, plus the audit table (SQLite or PostgreSQL).

    Tables (``tag`` keeps runs apart in a shared PostgreSQL):
    ``fp_counter_<tag>(id TEXT PRIMARY KEY, value BIGINT, fencing_token BIGINT)`` and
    ``fp_audit_<tag>(seq, record, token, worker, old, new)``.

    Args:
        target: A SQLite file path, or a PostgreSQL DSN (``postgresql://...``).
        tag: Table name suffix (letters, digits, underscore).
    """

    def __init__(self, target: str, tag: str = "run") -> None:
        from fencepost.client.fencing import SqlGuard

        self.target = target
        self.postgres = target.startswith(("postgres://", "postgresql://", "host=", "dbname="))
        self.counter = f"fp_counter_{tag}"
        self.audit = f"fp_audit_{tag}"
        if self.postgres:
            import psycopg

            self.conn: Any = psycopg.connect(target, autocommit=True)
            self.p = "%s"
        else:
            self.conn = sqlite3.connect(target, timeout=60.0, isolation_level=None, check_same_thread=False)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA busy_timeout=60000")
            self.p = "?"
        self.guard = SqlGuard(self.conn, self.counter, "id", commit=False)

    # -- schema

    def create(self, records: Sequence[str]) -> None:
        """(Re)create both tables with every counter at 0 and no token."""
        audit_seq = "BIGSERIAL PRIMARY KEY" if self.postgres else "INTEGER PRIMARY KEY AUTOINCREMENT"
        for sql in (
            f"DROP TABLE IF EXISTS {self.counter}",
            f"DROP TABLE IF EXISTS {self.audit}",
            f"CREATE TABLE {self.counter} (id TEXT PRIMARY KEY, value BIGINT NOT NULL, fencing_token BIGINT)",
            f"CREATE TABLE {self.audit} (seq {audit_seq}, record TEXT NOT NULL, token BIGINT NOT NULL, "
            f"worker TEXT NOT NULL, old BIGINT NOT NULL, new BIGINT NOT NULL)",
        ):
            self.conn.execute(sql)
        for record in records:
            self.conn.execute(f"INSERT INTO {self.counter} (id, value) VALUES ({self.p}, 0)", (record,))

    # -- the workload's steps

    def claim(self, record: str, token: int) -> None:
        """Store ``token`` on the row if it is not lower than the row's (one statement).

        Raises:
            StaleTokenError: the row carries a higher token.
        """
        self.guard.update(record, token, {})

    def read(self, record: str) -> int:
        """The counter's current value."""
        row = self.conn.execute(f"SELECT value FROM {self.counter} WHERE id = {self.p}", (record,)).fetchone()
        return int(row[0])

    def read_row(self, record: str) -> tuple[int, int | None]:
        """The counter's current value and the fencing token stored on its row (None before any)."""
        row = self.conn.execute(f"SELECT value, fencing_token FROM {self.counter} WHERE id = {self.p}",
                                (record,)).fetchone()
        return int(row[0]), None if row[1] is None else int(row[1])

    def write(self, record: str, token: int, old: int, new: int, worker: str) -> None:
        """Fenced write of ``new`` and its audit row, in one transaction.

        Raises:
            StaleTokenError: the row carries a higher token; nothing was written.
        """
        self.write_all([(record, token, old, new)], worker)

    def write_all(self, writes: Sequence[tuple[str, int, int, int]], worker: str) -> None:
        """Fenced writes of several rows and their audit rows, in one transaction (all or none).

        Args:
            writes: ``(record, token, old, new)`` per row, each fenced by its own token.
            worker: The writer's id, stored in the audit rows.

        Raises:
            StaleTokenError: a row carries a higher token than its write's; nothing was written.
        """
        audit = (f"INSERT INTO {self.audit} (record, token, worker, old, new) "
                 f"VALUES ({self.p}, {self.p}, {self.p}, {self.p}, {self.p})")

        def apply() -> None:
            for record, token, old, new in writes:
                self.guard.update(record, token, {"value": new})
                self.conn.execute(audit, (record, token, worker, old, new))

        if self.postgres:
            with self.conn.transaction():
                apply()
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            apply()
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- final data

    def snapshot(self) -> dict[str, Any]:
        """The final data for the checker: counters, their tokens, the audit rows in commit order."""
        records = {
            str(r[0]): {"value": int(r[1]), "token": None if r[2] is None else int(r[2])}
            for r in self.conn.execute(f"SELECT id, value, fencing_token FROM {self.counter}").fetchall()
        }
        audit = [
            {"seq": int(r[0]), "record": str(r[1]), "token": int(r[2]), "worker": str(r[3]),
             "old": int(r[4]), "new": int(r[5])}
            for r in self.conn.execute(
                f"SELECT seq, record, token, worker, old, new FROM {self.audit} ORDER BY seq").fetchall()
        ]
        return {"records": records, "audit": audit}

    def close(self) -> None:
        """Close the connection."""
        self.conn.close()


def open_store(target: str, tag: str = "run") -> Store:
    """Open a :class:`Store` on a SQLite file or a PostgreSQL DSN."""
    return Store(target, tag)


# ---------------------------------------------------------------- worker process


def worker_parser(prog: str) -> argparse.ArgumentParser:
    """The options every worker of :func:`run` takes (a workload module's worker adds its own)."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--address", required=True, help="coordinator address(es), comma-separated")
    parser.add_argument("--store", required=True, help="SQLite file or PostgreSQL DSN")
    parser.add_argument("--tag", default="run")
    parser.add_argument("--history", required=True)
    parser.add_argument("--proc", required=True, help="worker id recorded in the history")
    parser.add_argument("--records", type=int, default=1, help="counter rows counter-0..N-1")
    parser.add_argument("--ttl", type=float, default=3.0)
    parser.add_argument("--acquire-timeout", type=float, default=10.0)
    parser.add_argument("--think", type=float, default=0.02, help="max seconds between read and write")
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=None)
    return parser


@dataclasses.dataclass
class WorkerRun:
    """What one worker process works with, made by :func:`worker_run`."""

    history: hist.History
    store: Store
    client: Any
    rng: random.Random
    stop: threading.Event
    end: float

    def running(self) -> bool:
        """Whether to go on: no SIGTERM yet and ``--duration`` not over."""
        return not self.stop.is_set() and time.monotonic() < self.end


@contextlib.contextmanager
def worker_run(args: argparse.Namespace) -> Iterator[WorkerRun]:
    """Open a worker's history (with its ``start`` event), store and connected client; close them after.

    Args:
        args: The worker's options ``--address``, ``--store``, ``--tag``, ``--history``, ``--proc``,
            ``--duration``, ``--seed`` (as :func:`worker_parser` makes them; every workload's worker has them).

    SIGTERM sets ``stop``. Raises what ``LockClient.connect`` raises.
    """
    from fencepost.client import LockClient

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    h = hist.History(args.history, args.proc)
    h.record("start", pid=os.getpid())
    store = open_store(args.store, args.tag)
    end = time.monotonic() + args.duration
    client = LockClient(args.address.split(","), connect_timeout=30.0)
    try:
        client.connect()
        yield WorkerRun(h, store, client, random.Random(args.seed), stop, end)
    finally:
        try:
            client.close()
        finally:
            store.close()
            h.close()


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Run one worker until SIGTERM or ``--duration`` seconds (see the module docstring).

    Returns:
        The exit status (0).
    """
    from fencepost.client import FencepostError, LockTimeout, StaleTokenError

    parser = worker_parser("python -m tests.harness.workload worker")
    parser.add_argument("--no-claim", action="store_true", help="skip the claim (to show the lost update)")
    args = parser.parse_args(argv)
    names = [f"counter-{i}" for i in range(args.records)]
    fraction = 1 / 3

    with worker_run(args) as w:
        h, store, client, rng = w.history, w.store, w.client, w.rng

        def on_lost(handle: Any) -> None:
            # The client's own deadline + margin: the server-side expiry it estimates.
            h.record("lost", name=handle.name, token=handle.token, lease=handle.lease_id,
                     reason=handle.lost_reason, expiry=handle.deadline + handle.margin,
                     keepalive=handle.ttl * fraction)

        while w.running():
            name = rng.choice(names)
            h.record("acquire", result="invoke", name=name)
            try:
                handle = client.acquire(name, ttl=args.ttl, timeout=args.acquire_timeout)
            except LockTimeout:
                h.record("acquire", result="timeout", name=name)
                continue
            except FencepostError as err:
                h.record("acquire", result="error", name=name, error=type(err).__name__, reason=err.reason)
                time.sleep(0.1)
                continue
            tok, lease_id = handle.token, handle.lease_id
            h.record("acquire", result="ok", name=name, token=tok, lease=lease_id, ttl=handle.ttl)
            handle.on_lost(on_lost)
            ok = True
            try:
                if not args.no_claim:
                    try:
                        store.claim(name, tok)
                        h.record("claim", result="accepted", name=name, record=name, token=tok)
                    except StaleTokenError as err:
                        h.record("claim", result="stale", name=name, record=name, token=tok,
                                 current=err.current_token)
                        ok = False
                if ok:
                    value = store.read(name)
                    h.record("read", name=name, record=name, token=tok, value=value)
                    h.record("valid", name=name, token=tok, lease=lease_id, value=handle.is_valid())
                    if args.think > 0:
                        time.sleep(rng.uniform(0, args.think))
                    h.record("write", result="invoke", name=name, record=name, token=tok, value=value + 1)
                    try:
                        store.write(name, tok, value, value + 1, args.proc)
                        h.record("write", result="accepted", name=name, record=name, token=tok, value=value + 1)
                    except StaleTokenError as err:
                        h.record("write", result="stale", name=name, record=name, token=tok, value=value + 1,
                                 current=err.current_token)
            except Exception as err:  # noqa: BLE001 - a storage error is an outcome to record
                h.record("write", result="error", name=name, record=name, token=tok, error=repr(err))
            h.record("valid", name=name, token=tok, lease=lease_id, value=handle.is_valid())
            h.record("release", result="invoke", name=name, token=tok, lease=lease_id)
            try:
                handle.release()
                h.record("release", result="ok", name=name, token=tok, lease=lease_id)
            except FencepostError as err:
                h.record("release", result="error", name=name, token=tok, lease=lease_id,
                         error=type(err).__name__, reason=err.reason)
            h.record("valid", name=name, token=tok, lease=lease_id, value=handle.is_valid())
    return 0


# ---------------------------------------------------------------- driver


@dataclasses.dataclass
class RunResult:
    """What a run produced, for :func:`tests.harness.checker.check`."""

    events: list[hist.Event]
    data: dict[str, Any]
    faults: dict[str, int]
    ttl: float
    seconds: float
    workdir: Path


def run(
    address: str | Sequence[str],
    workdir: Path,
    *,
    workers: int = 3,
    seconds: float = 15.0,
    ttl: float = 3.0,
    records: int = 1,
    store: str | None = None,
    tag: str = "run",
    nemesis: Nemesis | None = None,
    restart_coordinator: Callable[[], None] | None = None,
    extra: dict[str, Nemesis] | None = None,
    think: float = 0.02,
    seed: int | None = None,
    no_claim: bool = False,
    module: str = "tests.harness.workload",
    worker_args: Sequence[str] = (),
) -> RunResult:
    """Run K workers for ``seconds`` with a nemesis, stop them, merge the histories.

    Args:
        address: Coordinator address(es).
        workdir: Directory for histories, the SQLite file and worker logs.
        workers: K, the number of worker processes.
        seconds: How long the workers loop (the nemesis stops then too).
        ttl: The workers' lock TTL in seconds.
        records: Number of counter rows (one lock name each).
        store: PostgreSQL DSN, or None for a SQLite file in ``workdir``.
        tag: Table name suffix.
        nemesis: Called repeatedly (it sleeps itself) until the end; None = no faults.
        restart_coordinator: How to restart the coordinator, for the restart nemesis.
        extra: More nemeses by name, offered to :func:`mixed_nemesis`.
        think: Max seconds a worker waits between its read and its write.
        seed: Seed of the nemesis and worker randomness.
        no_claim: Workers skip the claim (shows the lost update; for checker tests).
        module: The workers' module (``python -m MODULE worker``, taking :func:`worker_parser`'s options),
            e.g. ``tests.harness.multilock``.
        worker_args: More options for every worker.

    Returns:
        The merged history, the final data and the fault counts.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    target = store or str(workdir / "store.sqlite")
    names = [f"counter-{i}" for i in range(records)]
    setup = open_store(target, tag)
    setup.create(names)
    setup.close()
    addresses = address if isinstance(address, str) else ",".join(address)
    rng = random.Random(seed)
    start = time.monotonic()
    end = start + seconds
    driver = hist.History(workdir / "driver.jsonl", "driver")
    slots = [Worker(i) for i in range(workers)]
    histories: list[Path] = [driver.path]
    env = dict(os.environ, PYTHONUNBUFFERED="1")

    def spawn(worker: Worker) -> None:
        worker.incarnation += 1
        worker.history = workdir / f"{worker.proc_id}.jsonl"
        histories.append(worker.history)
        argv = [sys.executable, "-m", module, "worker", "--address", addresses,
                "--store", target, "--tag", tag, "--history", str(worker.history), "--proc", worker.proc_id,
                "--records", str(records), "--ttl", str(ttl), "--think", str(think),
                "--duration", str(max(1.0, end - time.monotonic())),
                "--acquire-timeout", str(max(2.0, 4 * ttl)),
                "--seed", str(rng.randrange(2**31))]
        if no_claim:
            argv.append("--no-claim")
        argv += worker_args
        with open(workdir / f"{worker.proc_id}.log", "ab") as log:
            worker.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=log, start_new_session=True)

    ctl = Control(slots, spawn, driver, restart_coordinator, ttl, end, extra)
    try:
        for slot in slots:
            spawn(slot)
        while time.monotonic() < end:
            if nemesis is None:
                ctl.sleep(end - time.monotonic())
            else:
                try:
                    nemesis(ctl, rng)
                except Exception as exc:  # a nemesis that fails is recorded, not fatal to the run
                    ctl.history.record("nemesis", kind="nemesis-error", error=repr(exc))
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGCONT)
                slot.proc.send_signal(signal.SIGTERM)
        for slot in slots:
            if slot.proc is not None:
                try:
                    slot.proc.wait(timeout=4 * ttl + 15)
                except subprocess.TimeoutExpired:
                    driver.record("nemesis", kind="stuck-worker-killed", target=slot.proc_id)
                    slot.proc.kill()
                    slot.proc.wait()
    finally:
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()
        driver.close()
    final = open_store(target, tag)
    try:
        data = final.snapshot()
    finally:
        final.close()
    events = hist.merge(p for p in histories if p.exists())  # a worker killed while starting has none
    hist.write(workdir / "history.jsonl", events)
    return RunResult(events, data, dict(ctl.faults), ttl, time.monotonic() - start, workdir)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.harness.workload worker ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "worker":
        print("usage: python -m tests.harness.workload worker --address ... (see --help)", file=sys.stderr)
        return 2
    return worker_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
