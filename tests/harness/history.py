"""Append-only histories of lock and storage operations (JSON lines).

Every process of a fault run (each worker, the driver with its nemeses)
appends events to its own file; :func:`merge` reads them back in timestamp
order. Timestamps are ``time.monotonic()`` readings: on one machine all
processes share CLOCK_MONOTONIC, so events of different processes compare.

An event is one JSON object with at least:

- ``t``: monotonic time in seconds (float) when the event was recorded;
- ``proc``: who recorded it (``"w3"`` for worker 3, ``"driver"``);
- ``op``: what happened, one of :data:`OPS`.

and, where they apply, ``name`` (lock name), ``token``, ``lease``,
``record`` (guarded row key), ``value``, ``result`` and ``error``. A
multi-lock's ``acquire``, ``release``, ``lost`` and ``valid`` events carry
``names`` (invoke) and ``tokens`` (name -> token) instead of ``name`` and
``token`` (tests/harness/multilock.py). The read-write lock workload's
events carry ``mode`` (``read`` or ``write``), its reads ``stored`` (the
row's token) and its operations ``expiry`` (the lowest time the lease can
end, tests/harness/rwlock.py).

Operations and their results:

=========  =================================================================
op         result / fields
=========  =================================================================
start      a worker process began (``pid``, ``incarnation``)
acquire    ``invoke`` (before the call) then ``ok`` (token, lease, ttl),
           ``timeout`` or ``error``
claim      fenced no-op write of the token before reading: ``accepted``,
           ``stale`` (rejected) or ``error``
read       the value read (``value``)
write      ``invoke`` (value, token) then ``accepted``, ``stale`` (rejected
           by the guard, with ``current``) or ``error``; an invoke without an
           outcome (the process died) is indeterminate
valid      ``is_valid()`` result (``value`` true/false) for a handle
release    ``invoke`` then ``ok`` or ``error`` (``error`` = exception class name)
lost       loss notice delivered to the holder (``reason``, ``expiry``:
           estimated server-side expiry = last acknowledged keepalive send
           time + TTL, ``keepalive``: the keepalive period K)
observe    an election's leader as an observer saw it (``token``, None for
           no leader; ``lease``, ``value``, ``revision``): tests/harness/election.py
nemesis    a fault: ``kind`` (freeze, thaw, kill, respawn, coordinator-restart,
           ...) and ``target``
describe   a sample of a semaphore's holders (``holders``: [slot, lease, token]
           triples; tests/harness/semaphore.py)
=========  =================================================================
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["OPS", "Event", "History", "by_proc", "merge", "read", "write"]

Event = dict[str, Any]

OPS = frozenset({"start", "acquire", "claim", "read", "write", "valid", "release", "lost", "nemesis", "describe",
                 "observe"})


class History:
    """An append-only JSON-lines history file, safe to use from several threads.

    Each event is written with one ``write`` call and flushed at once, so a
    process that is SIGKILLed loses at most the event it was writing (a torn
    last line is skipped by :func:`read`).

    Args:
        path: The file to append to (created if missing).
        proc: The recorder's id, stored in every event as ``proc``.
    """

    def __init__(self, path: str | os.PathLike[str], proc: str) -> None:
        self.path = Path(path)
        self.proc = proc
        self._lock = threading.Lock()
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - closed in close()

    def record(self, op: str, **fields: Any) -> Event:
        """Append one event stamped with ``time.monotonic()``.

        Args:
            op: One of :data:`OPS`.
            **fields: The event's other fields (JSON-serialisable).

        Returns:
            The event as written.

        Raises:
            ValueError: ``op`` is not a known operation.
        """
        if op not in OPS:
            raise ValueError(f"unknown op {op!r}")
        event: Event = {"t": time.monotonic(), "proc": self.proc, "op": op, **fields}
        line = json.dumps(event, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
        return event

    def close(self) -> None:
        """Close the file; idempotent."""
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(path: str | os.PathLike[str]) -> list[Event]:
    """Read one history file, skipping a torn last line.

    Args:
        path: A file written by :class:`History`.

    Returns:
        Its events in file order.
    """
    events: list[Event] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a process killed mid-write
    return events


def merge(paths: Iterable[str | os.PathLike[str]]) -> list[Event]:
    """Read several history files and merge them in timestamp order (stable).

    Args:
        paths: History files.

    Returns:
        All events sorted by ``t``.
    """
    events: list[Event] = []
    for path in paths:
        events.extend(read(path))
    events.sort(key=lambda e: e["t"])
    return events


def write(path: str | os.PathLike[str], events: Iterable[Event]) -> None:
    """Write events as one JSON-lines file (for merged histories and tests)."""
    with open(path, "w", encoding="utf-8") as f:
        for event in events:
            f.write(json.dumps(event, separators=(",", ":")) + "\n")


def by_proc(events: Iterable[Event]) -> Iterator[tuple[str, list[Event]]]:
    """Group events by ``proc``, each group in timestamp order."""
    groups: dict[str, list[Event]] = {}
    for event in events:
        groups.setdefault(event["proc"], []).append(event)
    for proc, group in groups.items():
        yield proc, sorted(group, key=lambda e: e["t"])
