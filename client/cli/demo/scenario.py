"""The paused-holder scenario of ``fencepost demo``: the invoices table, the two workers, one run.

:func:`run_scenario` runs it once, unfenced or fenced: both workers (each
its own OS process, :mod:`fencepost.client.cli.demo.worker`) start and
connect; worker A takes the lock, reads invoice 42 and computes; the demo
freezes A with SIGSTOP until its lease expires and worker B has taken the
lock and written version 2; then A resumes and writes version 1. The
:class:`RunRecord` keeps every event of both workers and the final row.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

INVOICE_ID = 42
WAIT_SECONDS = 30.0
"""Upper bound on each step the demo waits for (a worker event, a process exit)."""
COMPUTE_SECONDS = 0.5
"""How long each worker "computes" between its read and its write."""
RESUME_AFTER_SECONDS = 0.3
"""How long after B's release the demo resumes A (keeps the two writes apart on the timeline)."""

BODIES = {
    "A": "total 100.00 EUR (A's computation, from version 0)",
    "B": "total 90.00 EUR (B's computation: 10% discount)",
}
VERSIONS = {"A": 1, "B": 2}


class DemoError(Exception):
    """The demo could not run (not the same as "the fenced run lost data").

    Attributes:
        exit_code: 1 when something failed at run time, 2 for bad input or a
            missing optional package.
    """

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Event:
    """One timeline entry: seconds since the run's start, who, what, and details."""

    t: float
    who: str
    event: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class RunRecord:
    """What one run of the scenario did and left behind."""

    fenced: bool
    lock: str
    ttl: float
    events: list[Event] = field(default_factory=list)
    final: tuple[int, str, str] | None = None  # (version, body, written_by)
    final_token: int | None = None

    @property
    def label(self) -> str:
        """``fenced`` or ``unfenced``."""
        return "fenced" if self.fenced else "unfenced"

    def token(self, who: str) -> int | None:
        """The token worker ``who`` was granted."""
        for e in self.events:
            if e.who == who and e.event == "acquired":
                return int(e.data["token"])
        return None

    @property
    def kept(self) -> bool:
        """Whether B's write survived."""
        return self.final is not None and self.final[0] == VERSIONS["B"] and self.final[2] == "B"

    @property
    def lost(self) -> bool:
        """Whether stale A's write replaced B's."""
        return self.final is not None and self.final[0] == VERSIONS["A"] and self.final[2] == "A"

    def verdict(self) -> str:
        """The one-line verdict of this run."""
        version = self.final[0] if self.final else None
        if self.kept:
            rejected = any(e.who == "A" and e.event == "rejected" for e in self.events)
            tail = "; A's stale write rejected" if rejected else ""
            return f"{self.label}: B's write KEPT (final version {version}){tail}"
        if self.lost:
            return f"{self.label}: B's write was LOST (final version {version}, written by stale A)"
        return f"{self.label}: unexpected final row {self.final!r}"


# ---------------------------------------------------------------------------
# Storage: SQLite file or PostgreSQL
# ---------------------------------------------------------------------------


class Store:
    """The invoices table the workers write to."""

    def __init__(self, dsn: str | None, workdir: Path) -> None:
        self.dsn = dsn
        if dsn is None:
            self.path = workdir / "invoices.db"
            self.db_arg = f"sqlite:{self.path}"
            self.table = "invoices"
            self.where = f"SQLite file {self.path}"
        else:
            try:
                import psycopg  # noqa: F401
            except ImportError:
                raise DemoError("--dsn needs psycopg 3: pip install 'psycopg[binary]'", 2) from None
            self.db_arg = dsn
            self.table = "fencepost_demo_invoices"
            self.where = f"PostgreSQL table {self.table}"

    def connect(self) -> Any:
        """A new DB-API connection."""
        from .worker import connect_db

        try:
            return connect_db(self.db_arg)
        except Exception as err:  # noqa: BLE001 - any driver's connection error
            raise DemoError(f"cannot open the database: {type(err).__name__}: {err}") from None

    def reset(self, fenced: bool) -> None:
        """(Re)create the table with invoice 42 at version 0; add the token column when fenced."""
        from fencepost.client.fencing import add_token_column

        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(f"DROP TABLE IF EXISTS {self.table}")
            cur.execute(f"CREATE TABLE {self.table} (id INTEGER PRIMARY KEY, version INTEGER NOT NULL, "
                        f"body TEXT NOT NULL, written_by TEXT NOT NULL)")
            p = "?" if self.dsn is None else "%s"
            cur.execute(f"INSERT INTO {self.table} (id, version, body, written_by) VALUES ({p}, {p}, {p}, {p})",
                        (INVOICE_ID, 0, "total 100.00 EUR (draft)", "setup"))
            cur.close()
            conn.commit()
            if fenced:
                add_token_column(conn, self.table, commit=True)
        finally:
            conn.close()

    def final(self, fenced: bool) -> tuple[tuple[int, str, str], int | None]:
        """The invoice row after a run, and its stored token (fenced runs)."""
        conn = self.connect()
        try:
            cur = conn.cursor()
            cols = "version, body, written_by" + (", fencing_token" if fenced else "")
            p = "?" if self.dsn is None else "%s"
            cur.execute(f"SELECT {cols} FROM {self.table} WHERE id = {p}", (INVOICE_ID,))
            row = cur.fetchall()[0]
            cur.close()
            conn.commit()
        finally:
            conn.close()
        return (int(row[0]), str(row[1]), str(row[2])), (int(row[3]) if fenced and row[3] is not None else None)

    def drop(self) -> None:
        """Drop the PostgreSQL table (the SQLite file goes with the temporary directory)."""
        if self.dsn is None:
            return
        with contextlib.suppress(Exception):
            conn = self.connect()
            cur = conn.cursor()
            cur.execute(f"DROP TABLE IF EXISTS {self.table}")
            cur.close()
            conn.commit()
            conn.close()


# ---------------------------------------------------------------------------
# Workers
# ---------------------------------------------------------------------------


class WorkerProcess:
    """One ``python -m fencepost.client.cli.demo.worker`` child and its events."""

    def __init__(self, role: str, proc: asyncio.subprocess.Process, log_path: Path, record: RunRecord) -> None:
        self.role = role
        self.proc = proc
        self.log_path = log_path
        self.record = record
        self.seen: asyncio.Queue[Event | None] = asyncio.Queue()
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, role: str, *, address: str, store: Store, record: RunRecord,
                    workdir: Path) -> WorkerProcess:
        """Start worker ``role`` for ``record``'s run."""
        argv = [
            sys.executable, "-m", "fencepost.client.cli.demo.worker",
            "--role", role, "--address", address, "--lock", record.lock, "--ttl", f"{record.ttl:g}",
            "--timeout", f"{WAIT_SECONDS:g}", "--db", store.db_arg, "--table", store.table,
            "--invoice", str(INVOICE_ID), "--version", str(VERSIONS[role]), "--body", BODIES[role],
            "--mode", record.label, "--compute", f"{COMPUTE_SECONDS:g}",
        ]
        log_path = workdir / f"worker-{record.label}-{role}.log"
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        with open(log_path, "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log, env=env)
        return cls(role, proc, log_path, record)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            event = Event(float(obj.pop("t")), str(obj.pop("who")), str(obj.pop("event")), obj)
            self.record.events.append(event)
            await self.seen.put(event)
        await self.seen.put(None)

    def log_tail(self) -> str:
        """The end of the worker's stderr."""
        try:
            text = self.log_path.read_text(errors="replace").strip()
        except OSError:
            return ""
        return text.splitlines()[-1] if text else ""

    async def wait_event(self, name: str) -> Event:
        """Wait for this worker's next ``name`` event.

        Raises:
            DemoError: the worker reported an error, exited, or took longer than WAIT_SECONDS.
        """
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            try:
                event = await asyncio.wait_for(self.seen.get(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                raise DemoError(f"worker {self.role} did not report {name!r} within {WAIT_SECONDS:g} s") from None
            if event is None:
                await self.proc.wait()
                raise DemoError(f"worker {self.role} exited ({self.proc.returncode}) before {name!r}: "
                                f"{self.log_tail()}")
            if event.event == "error":
                raise DemoError(f"worker {self.role} failed: {event.data.get('message')}")
            if event.event == name:
                return event

    def send(self, line: str) -> None:
        """Write one line to the worker's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the worker if it runs."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

    async def finish(self) -> None:
        """Wait for the worker to exit."""
        try:
            await asyncio.wait_for(self.proc.wait(), WAIT_SECONDS)
        except TimeoutError:
            raise DemoError(f"worker {self.role} did not exit within {WAIT_SECONDS:g} s") from None
        await self.reader

    async def kill(self) -> None:
        """SIGCONT + SIGKILL the worker and reap it; idempotent."""
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        with contextlib.suppress(Exception):
            await self.proc.wait()
        self.reader.cancel()
        with contextlib.suppress(BaseException):
            await self.reader


async def run_scenario(address: str, store: Store, *, fenced: bool, ttl: float, lock: str,
                       workdir: Path) -> RunRecord:
    """Run the paused-holder scenario once.

    Both workers start and connect first; time 0 is when A is told to go. B
    is told to go only once A is frozen, so B's acquire waits for A's lease
    to expire. A is resumed once B has written and released.

    Args:
        address: Coordinator address.
        store: The invoices table.
        fenced: Write through the SQL guard with the token (else a plain UPDATE).
        ttl: The workers' lease TTL in seconds.
        lock: The lock name.
        workdir: Where the workers' logs go.

    Returns:
        The run's events (sorted by time) and the final row.

    Raises:
        DemoError: a worker failed or a step took too long.
    """
    store.reset(fenced)
    record = RunRecord(fenced, lock, ttl)
    workers: list[WorkerProcess] = []
    try:
        for role in ("A", "B"):
            workers.append(await WorkerProcess.start(role, address=address, store=store, record=record,
                                                     workdir=workdir))
        a, b = workers
        await a.wait_event("ready")
        await b.wait_event("ready")
        record.events.clear()
        t0 = time.monotonic()

        def note(event: str, **data: Any) -> None:
            record.events.append(Event(round(time.monotonic() - t0, 4), "demo", event, data))

        a.send(f"go {t0!r}")
        await a.wait_event("computing")
        a.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        note("frozen")
        b.send(f"go {t0!r}")
        await b.wait_event("released")
        await asyncio.sleep(RESUME_AFTER_SECONDS)
        a.signal(signal.SIGCONT)
        note("resumed", frozen_seconds=round(time.monotonic() - frozen_at, 3))
        await a.finish()
        await b.finish()
    finally:
        for w in workers:
            await w.kill()
    record.events.sort(key=lambda e: e.t)
    record.final, record.final_token = store.final(fenced)
    return record
