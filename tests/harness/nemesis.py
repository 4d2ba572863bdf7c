"""Nemeses of the fault runs: what a run may do to its workers and coordinator, and when.

:func:`tests.harness.workload.run` calls a nemesis between pauses with a
:class:`Control`, which records every fault in the driver's history. The
etcd nemeses (member kill, pause, compaction, coordinator-etcd cut) are in
``tests/harness/__main__.py``; they and the proxy nemeses
(:func:`client_nemeses`) use :meth:`Control.record`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..child_processes import freeze
from . import history as hist

__all__ = ["Control", "Nemesis", "Worker", "client_nemeses", "freeze_holder_nemesis", "freeze_nemesis",
           "holders_and_links_nemesis", "in_turn", "kill_holder_nemesis", "kill_nemesis", "long_freeze_holder_nemesis", "mixed_nemesis", "restart_nemesis"]


@dataclasses.dataclass
class Worker:
    """One worker slot: its current process and incarnation."""

    index: int
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    history: Path | None = None

    @property
    def proc_id(self) -> str:
        """The id its current incarnation records (``w<index>.<incarnation>``)."""
        return f"w{self.index}.{self.incarnation}"



class Control:
    """What a nemesis may do during :func:`run`; every fault is recorded in the driver's history.

    Args:
        workers: The worker slots.
        spawn: Starts (or restarts) a worker slot.
        history: The driver's history.
        restart_coordinator: Restarts the coordinator, or None when the run has none to restart.
        ttl: The workers' TTL in seconds (nemeses size their faults by it).
        end: Monotonic time at which the run ends.
        extra: More faults by name (e.g. etcd member kill from tests/harness/cluster.py).
    """

    def __init__(self, workers: list[Worker], spawn: Callable[[Worker], None], history: hist.History,
                 restart_coordinator: Callable[[], None] | None, ttl: float, end: float,
                 extra: dict[str, Callable[[Control, random.Random], None]] | None = None) -> None:
        self.workers = workers
        self._spawn = spawn
        self.history = history
        self._restart = restart_coordinator
        self.ttl = ttl
        self.end = end
        self.extra = dict(extra or {})
        self.faults: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1

    def sleep(self, seconds: float) -> None:
        """Sleep, but not past the end of the run."""
        time.sleep(max(0.0, min(seconds, self.end - time.monotonic())))

    def freeze(self, worker: Worker, seconds: float) -> None:
        """SIGSTOP ``worker`` for ``seconds`` (even past the end of the run), then SIGCONT."""
        assert worker.proc is not None
        self.history.record("nemesis", kind="freeze", target=worker.proc_id, seconds=seconds)
        if worker.proc.poll() is None:
            freeze(worker.proc.pid)
        self._count("freeze")
        try:
            time.sleep(seconds)
        finally:
            worker.proc.send_signal(signal.SIGCONT)
            self.history.record("nemesis", kind="thaw", target=worker.proc_id)

    def kill(self, worker: Worker) -> None:
        """SIGKILL ``worker`` and start a new incarnation in its slot."""
        assert worker.proc is not None
        self.history.record("nemesis", kind="kill", target=worker.proc_id)
        worker.proc.kill()
        worker.proc.wait()
        self._count("kill")
        self._spawn(worker)
        self.history.record("nemesis", kind="respawn", target=worker.proc_id)

    def restart_coordinator(self) -> None:
        """SIGTERM and restart the coordinator (no-op when the run has none to restart)."""
        if self._restart is None:
            return
        self.history.record("nemesis", kind="coordinator-restart", target="coordinator")
        self._restart()
        self._count("coordinator-restart")
        self.history.record("nemesis", kind="coordinator-up", target="coordinator")

    def record(self, kind: str, **fields: Any) -> None:
        """Record and count a fault done by an external nemesis (proxy, etcd member...)."""
        self.history.record("nemesis", kind=kind, **fields)
        self._count(kind)


Nemesis = Callable[[Control, random.Random], None]


def freeze_nemesis(ctl: Control, rng: random.Random) -> None:
    """Freeze a random worker for 0.5 T to 2 T, then rest 0.5 T."""
    ctl.freeze(rng.choice(ctl.workers), rng.uniform(0.5 * ctl.ttl, 2.0 * ctl.ttl))
    ctl.sleep(0.5 * ctl.ttl)


def _holding(worker: Worker) -> bool:
    """Whether the worker's last recorded event is inside a hold, before its write."""
    if worker.history is None or not worker.history.exists():
        return False
    with open(worker.history, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 400))
        lines = f.read().decode(errors="replace").splitlines()
    last = lines[-1] if lines else ""
    return any(f'"op":"{op}"' in last for op in ("claim", "read", "valid")) and '"value":false' not in last


def freeze_holder_nemesis(ctl: Control, rng: random.Random) -> None:
    """Freeze, for 0.5 T to 2 T, a worker caught inside its hold (else a random one), then rest 0.5 T.

    A holder frozen between its read and its write wakes up after its lease
    expired and someone else wrote: its write must be rejected as stale.
    """
    deadline = time.monotonic() + ctl.ttl
    target = None
    while target is None and time.monotonic() < deadline:
        holders = [w for w in ctl.workers if _holding(w)]
        target = rng.choice(holders) if holders else None
        if target is None:
            time.sleep(0.005)
    ctl.freeze(target or rng.choice(ctl.workers), rng.uniform(0.5 * ctl.ttl, 2.0 * ctl.ttl))
    ctl.sleep(0.5 * ctl.ttl)


def kill_nemesis(ctl: Control, rng: random.Random) -> None:
    """SIGKILL a random worker and respawn it, then rest T."""
    ctl.kill(rng.choice(ctl.workers))
    ctl.sleep(ctl.ttl)


def restart_nemesis(ctl: Control, rng: random.Random) -> None:
    """Restart the coordinator, then rest 2 T."""
    ctl.restart_coordinator()
    ctl.sleep(2 * ctl.ttl)


def mixed_nemesis(kinds: dict[str, Nemesis] | None = None) -> Nemesis:
    """A nemesis that picks one of ``kinds`` at random each time (default: freeze, kill, restart)."""
    table = kinds or {"freeze": freeze_nemesis, "freeze-holder": freeze_holder_nemesis, "kill": kill_nemesis,
                      "restart": restart_nemesis}

    def nemesis(ctl: Control, rng: random.Random) -> None:
        choices = dict(table)
        choices.update(ctl.extra)
        name = rng.choice(sorted(choices))
        choices[name](ctl, rng)

    return nemesis


def _caught_holding(ctl: Control, rng: random.Random) -> Worker:
    """A worker caught inside its hold (waiting up to T for one), else a random one."""
    deadline = time.monotonic() + ctl.ttl
    while time.monotonic() < deadline:
        holders = [w for w in ctl.workers if _holding(w)]
        if holders:
            return rng.choice(holders)
        time.sleep(0.005)
    return rng.choice(ctl.workers)


def long_freeze_holder_nemesis(ctl: Control, rng: random.Random) -> None:
    """Freeze a worker caught inside its hold for 1.5 T to 2.5 T (always past its lease), then rest 0.5 T.

    Its lease expires while it is frozen, so its hold passes on; when it wakes,
    its write must be refused as stale once the next holder has written.
    """
    ctl.freeze(_caught_holding(ctl, rng), rng.uniform(1.5 * ctl.ttl, 2.5 * ctl.ttl))
    ctl.sleep(0.5 * ctl.ttl)


def kill_holder_nemesis(ctl: Control, rng: random.Random) -> None:
    """SIGKILL a worker caught inside its hold (else a random one) and respawn it, then rest T."""
    ctl.kill(_caught_holding(ctl, rng))
    ctl.sleep(ctl.ttl)


def client_nemeses(proxy: Any, ttl: float) -> dict[str, Nemesis]:
    """Nemeses between the workers and the coordinator, through ``proxy`` (a :class:`.proxy.Proxy` they dial):
    ``client-blackhole`` (0.5 T to 3 T) and ``client-cut`` (every connection reset)."""

    def blackhole(ctl: Control, rng: random.Random) -> None:
        seconds = rng.uniform(0.5, 3.0) * ttl
        ctl.record("client-blackhole", target="client-links", seconds=seconds)
        proxy.blackhole()
        time.sleep(seconds)
        proxy.forward()
        ctl.history.record("nemesis", kind="client-healed", target="client-links")
        ctl.sleep(ttl)

    def cut(ctl: Control, rng: random.Random) -> None:
        ctl.record("client-cut", target="client-links")
        proxy.cut()
        ctl.sleep(ttl)

    return {"client-blackhole": blackhole, "client-cut": cut}


def in_turn(*kinds: Nemesis) -> Nemesis:
    """A nemesis that calls each of ``kinds`` in turn (so that a short run has every one)."""
    turn = itertools.cycle(kinds)

    def nemesis(ctl: Control, rng: random.Random) -> None:
        next(turn)(ctl, rng)

    return nemesis


def holders_and_links_nemesis(proxy: Any, ttl: float) -> Nemesis:
    """The short fault runs' nemesis (multi-locks, read-write locks): in turn freeze a holder past its lease,
    kill one, restart the coordinator, freeze a holder again, cut and blackhole the client links (``proxy``,
    as :func:`client_nemeses`)."""
    links = client_nemeses(proxy, ttl)
    return in_turn(long_freeze_holder_nemesis, kill_holder_nemesis, restart_nemesis, long_freeze_holder_nemesis,
                   links["client-cut"], links["client-blackhole"])
