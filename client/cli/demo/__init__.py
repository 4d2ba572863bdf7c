"""``fencepost demo``: the paused-holder failure, without and with fencing.

Real processes, a real lock service, a real database. Worker A takes the
lock ``inv:42`` (token tA, TTL 2 s), reads invoice 42 and starts computing;
the demo freezes it with SIGSTOP, as a long GC pause or a stuck disk would.
A's keepalives stop with it, its lease expires, and worker B (another
process) is granted the lock with token tB > tA and writes version 2. Then
the demo resumes A (SIGCONT), which still believes it holds the lock and
writes version 1.

The scenario runs twice on the same lock service:

1. **unfenced**, as people usually do it: a TTL lock and a plain
   ``UPDATE invoices SET version = ?, body = ?, written_by = ? WHERE id = ?``.
   A's late write lands and B's write is lost.
2. **fenced**: the table gets a ``fencing_token`` column
   (:func:`fencepost.client.fencing.add_token_column`) and every write goes
   through :class:`fencepost.client.fencing.SqlGuard` with the writer's
   token, one conditional UPDATE. A's write is rejected with
   StaleTokenError and B's version 2 stays.

By default the demo starts its own etcd (``EmbeddedEtcd``, in a temporary
directory) and an in-process coordinator on ``127.0.0.1:0``, imported lazily
from ``fencepost.coordinator``, and keeps the invoices in a temporary SQLite
file; ``target`` uses a running coordinator, ``dsn`` a PostgreSQL database
(table ``fencepost_demo_invoices``, created and dropped).

Modules: :mod:`.scenario` (the table, the workers, one run), :mod:`.worker`
(one worker process, reporting JSON lines), :mod:`.timeline` (the printed
timeline), :mod:`.plot` (``--plot``, with matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from ..common import EXIT_INTERRUPTED, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE, CliError, Formatter
from ..flags import parse_address, parse_ttl
from .scenario import INVOICE_ID, DemoError, RunRecord, Store, run_scenario
from .timeline import release_note, timeline

__all__ = ["DEMO_EXIT_CODES", "DemoError", "add_parser", "execute", "main", "run_demo"]

DEMO_EXIT_CODES: dict[int, str] = {
    EXIT_OK: "the fenced run kept B's write (the demo showed what it should)",
    EXIT_UNAVAILABLE: "the fenced run lost B's write, or the demo could not run "
                      "(etcd, coordinator, database or a worker failed)",
    EXIT_USAGE: "bad input, or a missing optional package (matplotlib for --plot, "
                "psycopg for --dsn)",
    EXIT_INTERRUPTED: "interrupted",
}
"""Exit codes of ``fencepost demo``."""


def add_parser(sub: Any) -> None:
    """Add the ``demo`` command to the ``fencepost`` subparsers ``sub``."""
    p = sub.add_parser(
        "demo", formatter_class=Formatter,
        epilog="\n".join(["exit codes:", *(f"  {code:<4} {text}" for code, text in DEMO_EXIT_CODES.items())]),
        help="replay the paused-holder failure, without and with fencing",
        description="Run the paused-holder scenario twice with real processes: worker A takes "
                    "a lock, is frozen (SIGSTOP) past its TTL, worker B takes the lock and "
                    "writes version 2, A wakes up and writes version 1. First with a plain "
                    "UPDATE (B's write is lost), then with the fencing token checked by the "
                    "SQL guard (A's write is rejected). Starts its own etcd and coordinator "
                    "unless --target is given; the invoices table is in a temporary SQLite "
                    "file unless --dsn is given.")
    p.add_argument("--target", metavar="HOST:PORT", type=parse_address,
                   help="use this running coordinator instead of an embedded etcd + coordinator")
    p.add_argument("--dsn", metavar="DSN",
                   help="PostgreSQL connection string (needs psycopg); the demo creates and "
                        "drops the table fencepost_demo_invoices there")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw both timelines side by side into FILE.png (needs matplotlib)")
    p.add_argument("--ttl", type=parse_ttl, default=2.0, metavar="S",
                   help="the workers' lease TTL in seconds (default 2)")


def execute(args: argparse.Namespace) -> int:
    """Run ``fencepost demo [--target HOST:PORT] [--dsn DSN] [--plot FILE.png] [--ttl S]``.

    Returns:
        0 when the fenced run kept B's write, 1 when it did not.

    Raises:
        CliError: the demo could not run (exit 1), or bad input or a missing package (exit 2).
    """
    try:
        return main(target=args.target, dsn=args.dsn, plot=args.plot, ttl=args.ttl)
    except DemoError as err:
        raise CliError(str(err), err.exit_code) from None


@contextlib.asynccontextmanager
async def lock_service(target: str | None, workdir: Path) -> Any:
    """Yield ``(address, description)`` of a coordinator to use."""
    if target is not None:
        yield target, f"coordinator at {target}"
        return
    try:
        from fencepost.coordinator.process.embedded import EmbeddedEtcd
        from fencepost.coordinator.process.coordinator import Coordinator
    except ImportError as err:
        raise DemoError(f"the embedded lock service needs the coordinator extra (missing {err.name}): "
                        f"pip install 'fencepost[coordinator]', or pass --target HOST:PORT", 2) from None
    etcd = EmbeddedEtcd(workdir / "etcd")
    try:
        await asyncio.to_thread(etcd.start)
    except (RuntimeError, OSError) as err:
        etcd.stop()
        raise DemoError(f"cannot start the embedded etcd: {str(err).splitlines()[0]}") from None
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", grace_seconds=0.0)
    try:
        try:
            await coord.start()
        except Exception as err:  # noqa: BLE001
            raise DemoError(f"cannot start the coordinator: {err}") from None
        yield coord.address, f"embedded etcd at {etcd.endpoint}, coordinator at {coord.address}"
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(coord.stop(grace=0), 10)
        await asyncio.to_thread(etcd.stop)


async def run_demo(*, target: str | None, dsn: str | None, ttl: float, workdir: Path) -> list[RunRecord]:
    """Run both scenarios and print their timelines as they finish.

    Returns:
        The unfenced and the fenced run, in that order.
    """
    store = Store(dsn, workdir)
    lock = "inv:42" if target is None else "fencepost-demo/inv:42"
    records = []
    async with lock_service(target, workdir) as (address, where):
        print(f"fencepost demo: {where}; invoices in {store.where}", flush=True)
        print(f"Worker A takes {lock} (TTL {ttl:g} s), reads invoice {INVOICE_ID} and computes; the demo "
              f"freezes it with SIGSTOP\nuntil its lease expires and worker B has taken the lock and written "
              f"version 2; then A resumes\nand writes version 1.", flush=True)
        try:
            for fenced in (False, True):
                title = ("Run 2, fenced: the write carries the token; SqlGuard's UPDATE ... WHERE "
                         "fencing_token <= token" if fenced else
                         "Run 1, unfenced: a TTL lock and a plain UPDATE, as people usually do it")
                print(f"\n{title}", flush=True)
                record = await run_scenario(address, store, fenced=fenced, ttl=ttl, lock=lock, workdir=workdir)
                errors = [e for e in record.events if e.event == "error"]
                if errors:
                    raise DemoError(f"worker {errors[0].who} failed: {errors[0].data.get('message')}")
                for line in timeline(record):
                    print(line, flush=True)
                records.append(record)
        finally:
            store.drop()
    return records


def check_plot_available() -> None:
    """Fail early when ``--plot`` cannot work.

    Raises:
        DemoError: matplotlib is not installed (exit 2).
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise DemoError("--plot needs matplotlib: pip install matplotlib", 2) from None


def main(*, target: str | None = None, dsn: str | None = None, plot: str | None = None,
         ttl: float = 2.0) -> int:
    """Run ``fencepost demo``: print both timelines and verdicts; optionally draw them.

    Args:
        target: ``HOST:PORT`` of a running coordinator; None starts an embedded etcd and coordinator.
        dsn: PostgreSQL connection string; None uses a temporary SQLite file.
        plot: Path of a PNG to draw both timelines into; None draws nothing.
        ttl: The workers' lease TTL in seconds.

    Returns:
        0 when the fenced run kept B's write, 1 otherwise.

    Raises:
        DemoError: the demo could not run.
    """
    if plot is not None:
        check_plot_available()
    workdir = Path(tempfile.mkdtemp(prefix="fencepost-demo-"))
    started = time.monotonic()
    try:
        records = asyncio.run(run_demo(target=target, dsn=dsn, ttl=ttl, workdir=workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    unfenced, fenced = records
    tokens = f"tokens: A {fenced.token('A')} < B {fenced.token('B')} in the fenced run"
    print(f"\n{unfenced.verdict()}\n{fenced.verdict()}", flush=True)
    note = release_note(records)
    if note is not None:
        print(note, flush=True)
    print(f"({tokens}; {time.monotonic() - started:.1f} s in all)", flush=True)
    if plot is not None:
        from .plot import draw

        draw(records, plot)
        print(f"timelines drawn in {plot}", flush=True)
    return EXIT_OK if fenced.kept else EXIT_UNAVAILABLE
