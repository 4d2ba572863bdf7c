"""The highest fencing token a coordinator may have handed out, kept in its data directory across restarts.

etcd restored from an older snapshot while every coordinator was stopped, with
the same cluster token, keeps its cluster id: nothing in etcd shows the
restore, and a coordinator started afterwards would hand out tokens that were
handed out before (:mod:`.tokens`). A coordinator with a persistent data
directory (``fencepost serve --data-dir``) keeps its **high-water mark** there,
in the file ``tokens.json``: the highest revision + token floor it has seen in a
linearizable etcd answer, a bound on every token it granted. At its next start
the token floor (:class:`~.tokens.TokenFloor`) starts from that mark, so the
first check of the token record, made before the first grant, and any etcd
answer below the mark refuse (UNAVAILABLE/DATA_LOSS, health NOT_SERVING, the
mark published in the token record for the other replicas) until ``fencepost
admin recover-tokens`` raises the tokens above it.

Cost: nothing is written on the hot path. An answer that raises the mark only
notes the value (:meth:`HighWaterFile.advance`); a task writes it at most
every :data:`WRITE_INTERVAL_SECONDS` (a temporary file, fsync, rename, fsync of
the directory: the file holds the old mark or the new one, never a torn one),
and :meth:`HighWaterFile.close` writes the last one at shutdown. A crash
(SIGKILL, power loss) loses at most the rise of the last interval and one
write: a restore to a snapshot taken in that window before the crash goes
unseen. The marks only grow: a mark is a revision etcd reached, so without a
restore etcd is at or above it when the coordinator starts again.

Several coordinators may share one directory (``--workers`` processes, or
coordinators of other prefixes): each write happens under an exclusive
``flock`` of ``tokens.json.lock`` and merges with the file, keeping the larger
mark per prefix. The file: ``{"format": 1, "high": {"<prefix>": N, ...}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
from pathlib import Path

from ..telemetry.events import log_event

__all__ = ["FILE_NAME", "WRITE_INTERVAL_SECONDS", "HighWaterFile"]

_log = logging.getLogger("fencepost.coordinator")

#: The file in the data directory.
FILE_NAME = "tokens.json"
#: The shortest time between two writes of the file, in seconds.
WRITE_INTERVAL_SECONDS = 0.25
_FORMAT = 1


class HighWaterFile:
    """One prefix's high-water mark in a file (see the module's docstring).

    Args:
        path: The file (``<data dir>/tokens.json``); its directory must exist.
        prefix: The coordinators' key prefix (tokens are per prefix: revision + the prefix's floor).
        interval: The shortest time between two writes, in seconds.
    """

    def __init__(self, path: Path, prefix: str, *, interval: float = WRITE_INTERVAL_SECONDS) -> None:
        self.path = Path(path)
        self.prefix = prefix
        self._interval = interval
        #: The mark the file held for this prefix at :meth:`load` (0: none).
        self.recorded = 0
        #: The highest mark written (or read).
        self.written = 0
        self._wanted = 0
        self._wake: asyncio.Event | None = None
        self._closed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._failing: str | None = None

    def load(self) -> int:
        """Read this prefix's mark from the file (0 when there is no file or no entry).

        Returns:
            The recorded mark (also :attr:`recorded`).

        Raises:
            ValueError: the file cannot be read, or is not a token mark file;
                the message names it.
        """
        try:
            marks = self._read()
        except OSError as exc:
            raise ValueError(f"cannot read {self.path}: {exc.strerror}") from exc
        self.recorded = self.written = self._wanted = marks.get(self.prefix, 0)
        return self.recorded

    def advance(self, level: int) -> None:
        """Note that tokens up to ``level`` may have been handed out; written within an interval (cheap)."""
        if level > self._wanted:
            self._wanted = level
            if self._wake is not None:
                self._wake.set()

    def start(self) -> None:
        """Start the task that writes the mark as it rises (on the running loop)."""
        self._wake, self._closed = asyncio.Event(), asyncio.Event()
        if self._wanted > self.written:
            self._wake.set()
        self._task = asyncio.create_task(self._run(), name="fencepost-high-water")

    async def close(self) -> None:
        """Stop the task (a write in progress ends first) and write the last mark if it rose since."""
        if self._task is not None and self._wake is not None and self._closed is not None:
            self._closed.set()
            self._wake.set()
            await self._task
            self._task = None
        await self._flush()

    async def _run(self) -> None:
        assert self._wake is not None and self._closed is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closed.is_set():
                return
            await self._flush()
            with contextlib.suppress(TimeoutError):  # at most one write per interval; close() ends the wait
                await asyncio.wait_for(self._closed.wait(), self._interval)
                return

    async def _flush(self) -> None:
        value = self._wanted
        if value <= self.written:
            return
        try:
            await asyncio.to_thread(self._write, value)
        except (OSError, ValueError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
            if problem != self._failing:
                self._failing = problem
                log_event(_log, logging.WARNING, "high_water_unwritten",
                          f"cannot keep the highest token {value} in {self.path} ({problem}): after a restart "
                          f"this coordinator could not tell that etcd was restored from an older snapshot; "
                          f"retrying", path=str(self.path), high=value)
            return
        self._failing = None
        self.written = max(self.written, value)

    def _read(self) -> dict[str, int]:
        """The marks in the file, per prefix ({} when there is no file)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return {}
        try:
            data = json.loads(text)
            marks = data["high"]
            if data["format"] != _FORMAT or not isinstance(marks, dict) or not all(
                    type(v) is int and v >= 0 for v in marks.values()):
                raise ValueError("not format 1 with a whole number >= 0 per prefix")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{self.path} is not a token mark file ({exc}): fix or delete it (it keeps the "
                             f"highest fencing token this coordinator handed out; docs/deploy.md)") from exc
        return {str(k): int(v) for k, v in marks.items()}

    def _write(self, value: int) -> None:
        """Merge ``value`` into the file under its lock, atomically (temporary file, fsync, rename, fsync dir)."""
        folder = self.path.parent
        with open(folder / (self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            marks = self._read()
            marks[self.prefix] = max(marks.get(self.prefix, 0), value)
            temporary = folder / (self.path.name + ".tmp")
            with open(temporary, "w") as out:
                json.dump({"format": _FORMAT, "high": marks}, out, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, self.path)
            directory = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
