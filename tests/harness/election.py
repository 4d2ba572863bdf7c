"""The election workload of the fault runs: candidates that lead in turn, observers, a leader nemesis.

Processes (each records its own history, see :mod:`.history`):

- **candidates** (``python -m tests.harness.election candidate ...``) loop:
  campaign in one election (``LockClient.campaign``; recorded as ``acquire``
  invoke / ok with the leadership's token, so that the lock checker's
  grant-order and overlap rules apply to leaderships unchanged), then, as
  leader, claim the store's row with the token and make a few fenced
  read-modify-writes of it (the :class:`~.workload.Store` of the lock
  workload, with its audit table), proclaim a new value once, and resign
  (``release``). A loss notice (``on_lost``) is recorded as ``lost`` with
  the lease's estimated expiry, as the lock workload does.
- **observers** (``python -m tests.harness.election observer ...``) record
  every leader they observe (``observe``: token, lease, value, revision;
  token None for "no leader") from ``AsyncLockClient.observe``.

The driver (:func:`run`) starts the observers, waits until each has seen the
election's first state, starts the candidates, calls the nemesis between
pauses (by default :func:`leader_nemesis`: SIGSTOP the current leader for
0.5 T to 2 T, or SIGKILL it and start a new incarnation), stops the
candidates, waits until every observer has seen the election without a
leader (everything settled), stops the observers and merges the histories.

:func:`check` judges it: the lock checker (:func:`.checker.check`) on the
candidates' events (at most one valid leader at a time, within the slack
the lock checker allows frozen processes; leadership tokens strictly
increasing; the store's writes in token order, no lost update), and for
each observer: the leaders it saw in strictly increasing (token, value)
order, never one twice, and every leadership granted in the run among them.
It also counts the faults that hit the process leading at that moment.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import checker
from . import history as hist
from .nemesis import Control, Nemesis, Worker
from .workload import REPO, open_store, worker_run

__all__ = ["ELECTION", "ElectionReport", "LeaderNemesis", "RECORD", "RunResult", "check", "leader_nemesis", "run"]

#: The election every candidate campaigns in.
ELECTION = "leader"
#: The store row the leaders write (one row: the leader's work).
RECORD = "leader"


# ---------------------------------------------------------------- candidate process


def candidate_main(argv: Sequence[str] | None = None) -> int:
    """Run one candidate until SIGTERM or ``--duration`` seconds (see the module docstring)."""
    from fencepost.client import FencepostError, LockTimeout, StaleTokenError

    parser = argparse.ArgumentParser(prog="python -m tests.harness.election candidate")
    parser.add_argument("--address", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--tag", default="election")
    parser.add_argument("--history", required=True)
    parser.add_argument("--proc", required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--campaign-timeout", type=float, default=10.0)
    parser.add_argument("--writes", type=int, default=4, help="most fenced writes per leadership")
    parser.add_argument("--think", type=float, default=0.1, help="max seconds between two writes")
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)

    with worker_run(args) as w:
        h, store, client, rng = w.history, w.store, w.client, w.rng

        def on_lost(handle: Any) -> None:
            h.record("lost", name=ELECTION, token=handle.token, lease=handle.lease_id, reason=handle.lost_reason,
                     expiry=handle.deadline + handle.margin, keepalive=handle.ttl / 3)

        turn = 0
        while w.running():
            turn += 1
            value = f"{args.proc}/{turn}"
            h.record("acquire", result="invoke", name=ELECTION, value=value)
            try:
                lead = client.campaign(ELECTION, value, ttl=args.ttl, timeout=args.campaign_timeout)
            except LockTimeout:
                h.record("acquire", result="timeout", name=ELECTION)
                continue
            except FencepostError as err:
                h.record("acquire", result="error", name=ELECTION, error=type(err).__name__, reason=err.reason)
                time.sleep(0.1)
                continue
            tok, lease_id = lead.token, lead.lease_id
            h.record("acquire", result="ok", name=ELECTION, token=tok, lease=lease_id, ttl=lead.ttl, value=value)
            lead.on_lost(on_lost)
            try:
                store.claim(RECORD, tok)
                h.record("claim", result="accepted", name=ELECTION, record=RECORD, token=tok)
                for i in range(rng.randint(1, args.writes)):
                    if w.stop.is_set():
                        break
                    if i == 1:  # once per leadership: a new value, same token
                        try:
                            lead.proclaim(value + "+")
                        except FencepostError as err:
                            h.record("valid", name=ELECTION, token=tok, lease=lease_id, value=False,
                                     error=type(err).__name__)
                    current = store.read(RECORD)
                    h.record("read", name=ELECTION, record=RECORD, token=tok, value=current)
                    h.record("valid", name=ELECTION, token=tok, lease=lease_id, value=lead.is_valid())
                    time.sleep(rng.uniform(0, args.think))
                    h.record("write", result="invoke", name=ELECTION, record=RECORD, token=tok, value=current + 1)
                    try:
                        store.write(RECORD, tok, current, current + 1, args.proc)
                        h.record("write", result="accepted", name=ELECTION, record=RECORD, token=tok,
                                 value=current + 1)
                    except StaleTokenError as err:
                        h.record("write", result="stale", name=ELECTION, record=RECORD, token=tok,
                                 value=current + 1, current=err.current_token)
                        break
            except StaleTokenError as err:
                h.record("claim", result="stale", name=ELECTION, record=RECORD, token=tok, current=err.current_token)
            except Exception as err:  # noqa: BLE001 - a storage error is an outcome to record
                h.record("write", result="error", name=ELECTION, record=RECORD, token=tok, error=repr(err))
            h.record("valid", name=ELECTION, token=tok, lease=lease_id, value=lead.is_valid())
            h.record("release", result="invoke", name=ELECTION, token=tok, lease=lease_id)
            try:
                lead.resign()
                h.record("release", result="ok", name=ELECTION, token=tok, lease=lease_id)
            except FencepostError as err:
                h.record("release", result="error", name=ELECTION, token=tok, lease=lease_id,
                         error=type(err).__name__, reason=err.reason)
            h.record("valid", name=ELECTION, token=tok, lease=lease_id, value=lead.is_valid())
    return 0


# ---------------------------------------------------------------- observer process


def observer_main(argv: Sequence[str] | None = None) -> int:
    """Record every leader observed until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m tests.harness.election observer")
    parser.add_argument("--address", required=True)
    parser.add_argument("--history", required=True)
    parser.add_argument("--proc", required=True)
    args = parser.parse_args(argv)
    return asyncio.run(_observe(args.address.split(","), args.history, args.proc))


async def _observe(addresses: list[str], path: str, proc: str) -> int:
    from fencepost.client import AsyncLockClient

    h = hist.History(path, proc)
    h.record("start", pid=os.getpid())
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        async with AsyncLockClient(addresses, connect_timeout=30.0) as client:
            async for info in client.observe(ELECTION):
                if info is None:
                    h.record("observe", name=ELECTION, token=None)
                else:
                    h.record("observe", name=ELECTION, token=info.token, lease=info.lease_id,
                             value=info.value.decode(), revision=info.revision)
    except asyncio.CancelledError:
        pass
    finally:
        h.close()
    return 0


# ---------------------------------------------------------------- nemesis


def _leading(worker: Worker) -> bool:
    """Whether the worker's last recorded event is inside a leadership (granted, not yet resigning)."""
    if worker.history is None or not worker.history.exists():
        return False
    with open(worker.history, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 400))
        lines = f.read().decode(errors="replace").splitlines()
    last = lines[-1] if lines else ""
    inside = ('"op":"acquire"' in last and '"result":"ok"' in last) or any(
        f'"op":"{op}"' in last for op in ("claim", "read", "write"))
    return inside and '"result":"stale"' not in last


def leader_nemesis(ctl: Control, rng: random.Random) -> bool:
    """Wait (up to T) for the candidate that leads, then SIGSTOP it for 0.5 T to 2 T or SIGKILL it; rest 0.5 T.

    Returns:
        Whether the fault hit a candidate leading at that moment (else one chosen at random: none led within T).
    """
    deadline = time.monotonic() + ctl.ttl
    target = None
    while target is None and time.monotonic() < deadline:
        leading = [w for w in ctl.workers if _leading(w)]
        target = leading[0] if leading else None
        if target is None:
            time.sleep(0.005)
    hit = target is not None
    target = target or rng.choice(ctl.workers)
    if rng.random() < 0.5:
        ctl.freeze(target, rng.uniform(0.5 * ctl.ttl, 2.0 * ctl.ttl))
    else:
        ctl.kill(target)
    ctl.sleep(0.5 * ctl.ttl)
    return hit


#: A nemesis of the election: one fault; True when it hit the leader (run() counts those), None when it cannot tell.
LeaderNemesis = Callable[[Control, random.Random], "bool | None"]


# ---------------------------------------------------------------- driver


@dataclasses.dataclass
class RunResult:
    """What an election run produced, for :func:`check`."""

    events: list[hist.Event]
    data: dict[str, Any]
    faults: dict[str, int]
    ttl: float
    seconds: float
    workdir: Path


def run(address: str | Sequence[str], workdir: Path, *, candidates: int = 5, observers: int = 2,
        seconds: float = 20.0, ttl: float = 2.0, nemesis: LeaderNemesis | Nemesis | None = leader_nemesis,
        restart_coordinator: Any = None, seed: int | None = None, settle_seconds: float = 30.0,
        leader_faults: int = 0) -> RunResult:
    """Run the candidates for ``seconds`` with a nemesis, the observers around them; merge the histories.

    Args:
        address: Coordinator address(es).
        workdir: Directory for histories, the SQLite store and logs.
        candidates: Candidate processes.
        observers: Observer processes.
        seconds: How long the candidates campaign (the nemesis stops then too).
        ttl: The candidates' lease TTL in seconds.
        nemesis: Called repeatedly until the end; None: no faults.
        restart_coordinator: How to restart the coordinator (for a nemesis that does), or None.
        seed: Seed of the nemesis and candidate randomness.
        settle_seconds: Longest wait, after the candidates stopped, for every observer to see no leader.
        leader_faults: Keep campaigning past ``seconds`` (up to three times as
            long) until the nemesis has hit a leader this many times: a short
            run on a loaded machine may otherwise end after a fault or two.

    Returns:
        The merged history, the store's final data and the fault counts.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    target = str(workdir / "store.sqlite")
    setup = open_store(target, "election")
    setup.create([RECORD])
    setup.close()
    addresses = address if isinstance(address, str) else ",".join(address)
    rng = random.Random(seed)
    driver = hist.History(workdir / "driver.jsonl", "driver")
    histories: list[Path] = [driver.path]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    watchers: list[tuple[subprocess.Popen[bytes], Path]] = []
    slots = [Worker(i) for i in range(candidates)]

    def start(argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        with open(workdir / log_name, "ab") as log:
            return subprocess.Popen([sys.executable, "-m", "tests.harness.election", *argv], cwd=REPO, env=env,
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)

    start_t = time.monotonic()
    end = last = start_t + seconds  # set again once the observers are up
    faults: dict[str, int] = {}

    def spawn(worker: Worker) -> None:
        worker.incarnation += 1
        worker.history = workdir / f"{worker.proc_id}.jsonl"
        histories.append(worker.history)
        worker.proc = start(["candidate", "--address", addresses, "--store", target, "--history",
                             str(worker.history), "--proc", worker.proc_id, "--ttl", str(ttl),
                             "--duration", str(max(1.0, last - time.monotonic())),
                             "--campaign-timeout", str(max(2.0, 4 * ttl)), "--seed", str(rng.randrange(2**31))],
                            f"{worker.proc_id}.log")

    try:
        for i in range(observers):
            path = workdir / f"o{i}.jsonl"
            histories.append(path)
            watchers.append((start(["observer", "--address", addresses, "--history", str(path), "--proc", f"o{i}"],
                                   f"o{i}.log"), path))
        for proc, path in watchers:  # each has read the election's first state before any candidate runs
            _wait_for_line(proc, path, '"op":"observe"', 30.0)
        start_t = time.monotonic()
        end = start_t + seconds
        last = start_t + (3 * seconds if leader_faults > 0 else seconds)  # the latest end leader_faults allows
        ctl = Control(slots, spawn, driver, restart_coordinator, ttl, last)
        faults = ctl.faults
        for slot in slots:
            spawn(slot)
        hits = 0
        while time.monotonic() < end or (hits < leader_faults and time.monotonic() < last):
            if nemesis is None:
                ctl.sleep(end - time.monotonic())
            else:
                try:
                    hits += 1 if nemesis(ctl, rng) else 0
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
        # Every candidate is gone (a killed one's lease expires within T): each observer must end on "no leader".
        for proc, path in watchers:
            _wait_for_last(proc, path, '"token":null', settle_seconds + ttl)
    finally:
        for slot in slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                slot.proc.wait()
        for proc, _ in watchers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in watchers:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        driver.close()
    final = open_store(target, "election")
    try:
        data = final.snapshot()
    finally:
        final.close()
    events = hist.merge(p for p in histories if p.exists())
    hist.write(workdir / "history.jsonl", events)
    return RunResult(events, data, dict(faults), ttl, time.monotonic() - start_t, workdir)


def _lines(path: Path) -> list[str]:
    if not path.exists():
        return []
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def _wait_for_line(proc: subprocess.Popen[bytes], path: Path, needle: str, timeout: float) -> None:
    """Wait until ``path`` has a line containing ``needle`` (a process's progress, read from its history)."""
    deadline = time.monotonic() + timeout
    while not any(needle in line for line in _lines(path)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{path.name}: no {needle} within {timeout} s (exit {proc.poll()})")
        time.sleep(0.02)


def _wait_for_last(proc: subprocess.Popen[bytes], path: Path, needle: str, timeout: float) -> None:
    """Wait until the last ``observe`` line of ``path`` contains ``needle``; give up quietly after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        seen = [line for line in _lines(path) if '"op":"observe"' in line]
        if seen and needle in seen[-1]:
            return
        time.sleep(0.02)


# ---------------------------------------------------------------- checker


@dataclasses.dataclass
class ElectionReport:
    """The lock checker's report on the candidates, the observers' violations, and what the nemesis hit.

    Attributes:
        report: The lock checker's report (its violations include the observers').
        leader_hits: Freezes and kills whose target led at that moment.
        observed: Per observer, the leaderships it saw (distinct tokens).
        leaderships: Leaderships granted in the run (acquire ok).
    """

    report: checker.Report
    leader_hits: int
    observed: dict[str, int]
    leaderships: int

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return self.report.ok

    def text(self) -> str:
        """A short human-readable summary."""
        return (f"{self.report.text()}\nleaderships: {self.leaderships}, faults that hit the leader: "
                f"{self.leader_hits}, leaderships seen per observer: {self.observed}")


def check(events: list[hist.Event], data: dict[str, Any] | None, *, faults: dict[str, int] | None = None,
          slack: float = checker.SLACK_SECONDS) -> ElectionReport:
    """Check an election run (see the module docstring).

    Args:
        events: The merged history.
        data: The store's final data (:meth:`~.workload.Store.snapshot`), or None.
        faults: Fault counts by kind; default: from the history.
        slack: e, in seconds.

    Returns:
        The :class:`ElectionReport`; ``ok`` when nothing is violated.
    """
    events = sorted(events, key=lambda e: e["t"])
    report = checker.check([e for e in events if e["op"] != "observe"], data, faults=faults, slack=slack)
    granted = sorted({e["token"] for e in events if e["op"] == "acquire" and e.get("result") == "ok"})
    # When each leadership began and ended in the candidate's own history (end: release invoked or loss notice).
    began: dict[tuple[str, int], float] = {}
    ended: dict[tuple[str, int], float] = {}
    for e in events:
        if e["op"] == "acquire" and e.get("result") == "ok":
            began[(e["proc"], e["token"])] = e["t"]
        elif e["op"] in ("lost", "release") and "token" in e:
            ended.setdefault((e["proc"], e["token"]), e["t"])
    hits = 0
    for e in events:
        if e["op"] == "nemesis" and e.get("kind") in ("freeze", "kill"):
            if any(proc == e.get("target") and t0 <= e["t"] and ended.get((proc, tok), float("inf")) >= e["t"]
                   for (proc, tok), t0 in began.items()):
                hits += 1
    observed: dict[str, int] = {}
    for proc, group in hist.by_proc(e for e in events if e["op"] == "observe"):
        seen = [(e["token"], e.get("value")) for e in group if e.get("token") is not None]
        for before, after in zip(seen, seen[1:]):
            if after == before:
                report.violations.append(checker.Violation("observe-repeat", f"{proc} saw {after} twice in a row"))
            elif after[0] < before[0]:
                report.violations.append(checker.Violation("observe-order", (
                    f"{proc} saw token {after[0]} after token {before[0]}")))
        tokens = {tok for tok, _ in seen}
        firsts = [tok for i, (tok, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != tok]
        if len(firsts) != len(set(firsts)):
            report.violations.append(checker.Violation("observe-repeat", f"{proc} saw a leadership come back"))
        missed = [tok for tok in granted if tok not in tokens]
        if missed:
            report.violations.append(checker.Violation("observe-miss", (
                f"{proc} never saw the leaderships with tokens {missed[:10]} (of {len(granted)})")))
        observed[proc] = len(tokens)
    return ElectionReport(report, hits, observed, len(granted))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.harness.election candidate|observer ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "candidate":
        return candidate_main(args[1:])
    if args and args[0] == "observer":
        return observer_main(args[1:])
    print("usage: python -m tests.harness.election candidate|observer --address ... (see --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
