"""The semaphore fault-run workload: worker processes doing fenced read-modify-writes under permits.

A semaphore ``S`` of N permits guards N counter rows, one per permit slot:
``S#0`` .. ``S#N-1`` (storage partitioned by slot, each row fenced by its
slot's tokens, docs/recipes.md "Semaphores"). Each worker
(``python -m tests.harness.semaphore worker ...``) loops as the lock
workload's (:mod:`.workload`) does, with a permit instead of a lock:

1. acquire a permit of ``S`` (``LockClient.semaphore(S, permits=N).acquire``);
2. claim row ``S#<slot>`` with the permit's token, read it, write it + 1
   with the token and its audit row (one transaction), release.

The history records the acquire's outcome with its ``slot``; :func:`per_slot`
renames each grant (and its invoke) to the slot's name ``S#<slot>``, so that
every hold of one slot is a hold of one "lock" and the lock checker
(:func:`tests.harness.checker.check`) judges each slot: strictly increasing
tokens per slot (``grant-order``), a slot's previous holder gone or told
before the next grant (``overlap``), loss notices on time, and in the data
no write accepted with a token lower than its row's (``token-order``,
``lost-update``, ``counter``, ``phantom-write``). :func:`check` adds the
semaphore's own invariants:

``slot-range``
    Every granted slot is in 0..N-1.
``holders``
    At no time more than N holds (each ending at its release, loss notice, or
    the next grant of its slot, whichever is first: the checks above bound
    how late those may come).
``describe``
    In the driver's samples of DescribeSemaphore: at most N holders, each
    slot once, in range, and each slot's token never going back over time.

And its figures: ``holder_hits``, the faults (freeze, kill) that hit a worker
while it held a permit.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import checker
from . import history as hist
from .nemesis import Control, Nemesis, Worker, in_turn, kill_holder_nemesis, long_freeze_holder_nemesis
from .workload import REPO, open_store, worker_run

__all__ = ["SemaphoreReport", "check", "holder_nemesis", "per_slot", "run", "worker_main"]

def holder_nemesis() -> Nemesis:
    """The nemesis of the semaphore fault run: SIGSTOP a permit holder past its lease, then SIGKILL one, in turn
    (so that a short run has both)."""
    return in_turn(long_freeze_holder_nemesis, kill_holder_nemesis)


def slot_record(name: str, slot: int) -> str:
    """The row (and, in the checked history, the hold name) of permit slot ``slot`` of semaphore ``name``."""
    return f"{name}#{slot}"


# ---------------------------------------------------------------- worker process


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Run one worker until SIGTERM or ``--duration`` seconds (see the module docstring).

    Returns:
        The exit status (0).
    """
    from fencepost.client import FencepostError, LockTimeout, StaleTokenError

    parser = argparse.ArgumentParser(prog="python -m tests.harness.semaphore worker")
    parser.add_argument("--address", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--tag", default="sem")
    parser.add_argument("--history", required=True)
    parser.add_argument("--proc", required=True)
    parser.add_argument("--name", default="sem")
    parser.add_argument("--permits", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--acquire-timeout", type=float, default=10.0)
    parser.add_argument("--think", type=float, default=0.05)
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    fraction = 1 / 3
    with worker_run(args) as w:
        h, store, client, rng = w.history, w.store, w.client, w.rng
        sem = client.semaphore(args.name, permits=args.permits, ttl=args.ttl)
        while w.running():
            h.record("acquire", result="invoke", name=args.name)
            try:
                handle = sem.acquire(timeout=args.acquire_timeout)
            except LockTimeout:
                h.record("acquire", result="timeout", name=args.name)
                continue
            except FencepostError as err:
                h.record("acquire", result="error", name=args.name, error=type(err).__name__, reason=err.reason)
                time.sleep(0.1)
                continue
            tok, lease_id, slot = handle.token, handle.lease_id, handle.slot
            rec = slot_record(args.name, slot)
            h.record("acquire", result="ok", name=args.name, slot=slot, token=tok, lease=lease_id, ttl=handle.ttl)
            handle.on_lost(lambda lost, rec=rec: h.record(
                "lost", name=rec, token=lost.token, lease=lost.lease_id, reason=lost.lost_reason,
                expiry=lost.deadline + lost.margin, keepalive=lost.ttl * fraction))
            try:
                try:
                    store.claim(rec, tok)
                    h.record("claim", result="accepted", name=rec, record=rec, token=tok)
                    ok = True
                except StaleTokenError as err:
                    h.record("claim", result="stale", name=rec, record=rec, token=tok, current=err.current_token)
                    ok = False
                if ok:
                    value = store.read(rec)
                    h.record("read", name=rec, record=rec, token=tok, value=value)
                    h.record("valid", name=rec, token=tok, lease=lease_id, value=handle.is_valid())
                    time.sleep(rng.uniform(0, args.think))
                    h.record("write", result="invoke", name=rec, record=rec, token=tok, value=value + 1)
                    try:
                        store.write(rec, tok, value, value + 1, args.proc)
                        h.record("write", result="accepted", name=rec, record=rec, token=tok, value=value + 1)
                    except StaleTokenError as err:
                        h.record("write", result="stale", name=rec, record=rec, token=tok, value=value + 1,
                                 current=err.current_token)
            except Exception as err:  # noqa: BLE001 - a storage error is an outcome to record
                h.record("write", result="error", name=rec, record=rec, token=tok, error=repr(err))
            h.record("valid", name=rec, token=tok, lease=lease_id, value=handle.is_valid())
            h.record("release", result="invoke", name=rec, token=tok, lease=lease_id)
            try:
                handle.release()
                h.record("release", result="ok", name=rec, token=tok, lease=lease_id)
            except FencepostError as err:
                h.record("release", result="error", name=rec, token=tok, lease=lease_id,
                         error=type(err).__name__, reason=err.reason)
    return 0


# ---------------------------------------------------------------- driver


@dataclasses.dataclass
class RunResult:
    """What a semaphore run produced, for :func:`check`."""

    events: list[hist.Event]
    data: dict[str, Any]
    faults: dict[str, int]
    permits: int
    ttl: float
    seconds: float
    workdir: Path


def run(address: str | Sequence[str], workdir: Path, *, workers: int = 10, permits: int = 3,
        seconds: float = 20.0, ttl: float = 2.0, name: str = "sem", nemesis: Nemesis | None = None,
        think: float = 0.05, seed: int | None = None, sample_every: float = 0.1,
        restart_coordinator: Callable[[], None] | None = None, extra: dict[str, Nemesis] | None = None) -> RunResult:
    """Run K workers contending for ``permits`` permits for ``seconds`` with a nemesis; merge the histories.

    A sampler thread of the driver records DescribeSemaphore every ``sample_every`` seconds.

    Args:
        address: Coordinator address(es).
        workdir: Directory for histories, the SQLite file and worker logs.
        workers: K, the number of worker processes.
        permits: N, the semaphore's permits (and counter rows).
        seconds: How long the workers loop.
        ttl: The permits' lease TTL in seconds.
        name: The semaphore's name.
        nemesis: Called repeatedly until the end; None = no faults (the test passes :func:`holder_nemesis`).
        think: Max seconds a worker waits between its read and its write.
        seed: Seed of the nemesis and worker randomness.
        sample_every: Seconds between DescribeSemaphore samples.
        restart_coordinator: How to restart the coordinator, for the restart nemesis (None: no restarts).
        extra: More nemeses by name, offered to :func:`~.nemesis.mixed_nemesis` (the long profile's).

    Returns:
        The merged history, the final data and the fault counts.
    """
    from fencepost.client import FencepostError, LockClient

    workdir.mkdir(parents=True, exist_ok=True)
    target = str(workdir / "store.sqlite")
    setup = open_store(target, "sem")
    setup.create([slot_record(name, i) for i in range(permits)])
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
        argv = [sys.executable, "-m", "tests.harness.semaphore", "worker", "--address", addresses,
                "--store", target, "--tag", "sem", "--history", str(worker.history), "--proc", worker.proc_id,
                "--name", name, "--permits", str(permits), "--ttl", str(ttl), "--think", str(think),
                "--duration", str(max(1.0, end - time.monotonic())), "--acquire-timeout", str(max(2.0, 4 * ttl)),
                "--seed", str(rng.randrange(2**31))]
        with open(workdir / f"{worker.proc_id}.log", "ab") as log:
            worker.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=log, start_new_session=True)

    sampling = threading.Event()

    def sample() -> None:
        with LockClient(addresses.split(","), connect_timeout=30.0) as client:
            sem = client.semaphore(name, permits=permits, ttl=max(1.0, ttl))
            while not sampling.wait(sample_every):
                try:
                    info = sem.describe()
                except FencepostError as err:
                    driver.record("describe", result="error", name=name, error=type(err).__name__)
                    continue
                driver.record("describe", result="ok", name=name, permits=info.permits,
                              holders=[[h.slot, h.lease_id, h.token] for h in info.holders])

    sampler = threading.Thread(target=sample, name="semaphore-sampler", daemon=True)
    ctl = Control(slots, spawn, driver, restart_coordinator, ttl, end, extra)
    try:
        for slot in slots:
            spawn(slot)
        sampler.start()
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
        sampling.set()
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()
        sampler.join(timeout=30)
        driver.close()
    final = open_store(target, "sem")
    try:
        data = final.snapshot()
    finally:
        final.close()
    events = hist.merge(p for p in histories if p.exists())
    hist.write(workdir / "history.jsonl", events)
    return RunResult(events, data, dict(ctl.faults), permits, ttl, time.monotonic() - start, workdir)


# ---------------------------------------------------------------- checker


def per_slot(events: list[hist.Event], name: str) -> list[hist.Event]:
    """The history with each grant of semaphore ``name`` (and the invoke it answers) named after its slot.

    Args:
        events: The merged history.
        name: The semaphore's name.

    Returns:
        New events, in the same order: an acquire ``ok`` with ``slot`` i and the
        ``invoke`` before it in the same process are renamed ``name#i``.
    """
    out = [dict(e) for e in events]
    pending: dict[str, hist.Event] = {}
    for e in out:
        if e["op"] != "acquire" or e.get("name") != name:
            continue
        if e["result"] == "invoke":
            pending[e["proc"]] = e
            continue
        invoke = pending.pop(e["proc"], None)
        if e["result"] == "ok":
            e["name"] = slot_record(name, int(e["slot"]))
            if invoke is not None:
                invoke["name"] = e["name"]
    return out


@dataclasses.dataclass
class SemaphoreReport:
    """The lock checker's report on the per-slot history, plus the semaphore's own checks and figures."""

    report: checker.Report
    violations: list[checker.Violation]
    max_holders: int
    samples: int
    holder_hits: int

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return self.report.ok and not self.violations

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for JSON): the lock checker's, with every violation and the semaphore figures."""
        return {**self.report.as_dict(),
                "violations": [dataclasses.asdict(v) for v in self.report.violations + self.violations],
                "semaphore": {"max_holders": self.max_holders, "samples": self.samples,
                              "holder_hits": self.holder_hits}}

    def text(self) -> str:
        """A short human-readable summary."""
        lines = [self.report.text(),
                 f"semaphore: most holders at once {self.max_holders}, describe samples {self.samples}, "
                 f"faults on permit holders {self.holder_hits}, semaphore violations {len(self.violations)}"]
        lines += [f"  {v.kind}: {v.detail}" for v in self.violations[:50]]
        return "\n".join(lines)


def check(events: list[hist.Event], data: dict[str, Any] | None, *, name: str, permits: int,
          faults: dict[str, int] | None = None, slack: float = checker.SLACK_SECONDS) -> SemaphoreReport:
    """Check a semaphore run: each slot as a lock (:func:`checker.check`), and at most ``permits`` holders.

    Args:
        events: The merged history.
        data: The final data (:meth:`~.workload.Store.snapshot`), or None.
        name: The semaphore's name.
        permits: N.
        faults: Fault counts by kind (default: counted from the history).
        slack: e, in seconds.

    Returns:
        The report; ``.ok`` when nothing is violated.
    """
    events = sorted(events, key=lambda e: e["t"])
    slotted = per_slot(events, name)
    report = checker.check(slotted, data, faults=faults, slack=slack)
    violations: list[checker.Violation] = []

    # Holds: [grant, end], end = release invoke, loss notice or the next grant of its slot (the per-slot
    # checks bound how late the first two may be), whichever comes first; a killed holder's hold ends there.
    grants: dict[int, list[tuple[float, int, str]]] = {}  # slot -> (ok time, token, proc)
    ends: dict[tuple[str, int], float] = {}
    for e in slotted:
        if e["op"] == "acquire" and e["result"] == "ok":
            slot = int(e["slot"])
            if not 0 <= slot < permits:
                violations.append(checker.Violation("slot-range", f"{e['proc']} granted slot {slot} of {permits}"))
            grants.setdefault(slot, []).append((e["t"], int(e["token"]), e["proc"]))
        elif (e["op"] == "lost") or (e["op"] == "release" and e["result"] == "invoke"):
            ends.setdefault((e["proc"], int(e["token"])), e["t"])
    killed: dict[str, float] = {e["target"]: e["t"] for e in events
                                if e["op"] == "nemesis" and e.get("kind") == "kill"}
    edges: list[tuple[float, int]] = []
    for items in grants.values():
        items.sort(key=lambda g: g[1])
        for i, (t, token, proc) in enumerate(items):
            end = min(ends.get((proc, token), float("inf")), killed.get(proc, float("inf")),
                      items[i + 1][0] if i + 1 < len(items) else float("inf"))
            edges += [(t, +1), (max(t, end), -1)]  # a next grant before this one: grant-order says so
    held = max_holders = 0
    for _, delta in sorted(edges, key=lambda x: (x[0], x[1])):  # an end before a grant at the same time
        held += delta
        max_holders = max(max_holders, held)
    if max_holders > permits:
        violations.append(checker.Violation("holders", f"{max_holders} holds at once of {permits} permits"))

    # The coordinator's own view, sampled.
    samples = [e for e in events if e["op"] == "describe" and e.get("result") == "ok"]
    last_token: dict[int, int] = {}
    for s in samples:
        slots = [h[0] for h in s["holders"]]
        if len(slots) > permits or len(set(slots)) != len(slots) or any(not 0 <= x < permits for x in slots):
            violations.append(checker.Violation("describe", f"at {s['t']:.3f}: holders {s['holders']}"))
        for slot, _, token in s["holders"]:
            if token < last_token.get(slot, 0):
                violations.append(checker.Violation("describe", (
                    f"at {s['t']:.3f}: slot {slot} held under token {token} after {last_token[slot]}")))
            last_token[slot] = max(token, last_token.get(slot, 0))

    # Faults that hit a permit holder: the target held a permit (granted, not yet ended) at that moment.
    hits = 0
    for e in events:
        if e["op"] != "nemesis" or e.get("kind") not in ("freeze", "kill"):
            continue
        for items in grants.values():
            if any(proc == e["target"] and t <= e["t"] < ends.get((proc, token), float("inf"))
                   for t, token, proc in items):
                hits += 1
                break
    return SemaphoreReport(report, violations, max_holders, len(samples), hits)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.harness.semaphore worker ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "worker":
        print("usage: python -m tests.harness.semaphore worker --address ... (see --help)", file=sys.stderr)
        return 2
    return worker_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
