"""The read-write lock fault-run workload: readers sharing a name, writers holding it alone.

Counter rows ``counter-0`` .. ``counter-N-1`` (the :class:`~.workload.Store`
of the lock workload), one lock name each. Each worker
(``python -m tests.harness.rwlock worker ...``, started by
:func:`tests.harness.workload.run` with ``module="tests.harness.rwlock"``)
loops: pick a row, and a mode (``read`` with probability ``--reads``,
default 0.7, else ``write``), take the row's lock in that mode
(``LockClient.acquire(name, read=True)`` for a reader, docs/rwlocks.md), then

- a **writer** does what the lock workload's holder does: claim the row
  with its token, read it, write it + 1 fenced by the token with its audit
  row (one transaction);
- a **reader** claims the row with its token too (the storage keeps the
  highest token it saw: a reader's claim refuses the late write of a writer
  granted before it, and a later writer's token is above it), reads the row
  (value and stored token), waits up to ``--think`` seconds, reads it again;

and releases. The history records every grant with its ``mode``, token and
lease, every claim, read (with ``stored``, the row's token) and write, the
loss notices and the release; every event after a storage operation carries
``expiry``, the lowest time its lease can end (send time of the last
acknowledged keepalive + TTL: etcd counts from the keepalive's arrival).

**Hold intervals.** A hold's key certainly exists from the time its grant
returned until the earliest of its release call, its loss notice, and the
last ``expiry`` it recorded; after that its end is uncertain (its lease may
have expired unseen while the worker was frozen or dead). A hold lost for a
reason other than its lease (``NOT_HOLDER``: the key deleted) has no certain
interval. :func:`check` judges the history with the lock checker
(:func:`tests.harness.checker.check`, with ``exclusive=False``: no
``overlap``, readers share): grants of a name strictly increasing in token,
readers' included (``grant-order``: a writer's token is above every earlier
grant's), loss notices on time, and in the data no stale write accepted and
no accepted write lost (``token-order``, ``lost-update``, ``counter``,
``unrecorded-write``, ``phantom-write``). It adds the recipe's own invariant,
reported only when certain:

``writer-with-reader`` / ``writer-with-writer``
    The certain intervals of a writer's hold and of another hold of the same
    name overlap, one of them had a storage operation accepted (a claim or a
    write) and the other operated (claimed, read or wrote).
``read-under-writer``
    A reader, inside its certain interval, read the row (or had its claim
    refused) under a stored token of a *writer* larger than its own: a writer
    granted after the reader's key was made wrote while the reader held.
``read-changed``
    A reader that had claimed the row (its claim accepted or refused: either
    way the row's token was then at least its own) read two values inside its
    certain interval: a write with a token above its own landed while it held.

Figures: grants by mode, reads, the most readers certainly holding one name
together, overlaps of a writer with another hold that were possible (by the
workers' own view) but not certain, stale writer writes and claims, reader
claims refused under a writer's token, and the faults that hit a holder.

The mutant (``--mutant``) takes its write holds as a reader does
(``read=True``) while recording them as writes: readers are admitted while a
writer holds, and the checker must find it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import checker
from . import history as hist
from .workload import Store, worker_parser, worker_run

__all__ = ["READ", "WRITE", "Hold", "RwLockReport", "check", "holds", "worker_main"]

READ, WRITE = "read", "write"
#: Loss reasons that say the lease ended: the key went with it, no earlier than the lease's expiry.
LEASE_REASONS = frozenset({"DEADLINE", "LEASE_EXPIRED"})


def held_until(handle: Any) -> float:
    """The lowest monotonic time the handle's lease can end: the send time of its last acknowledged
    keepalive + TTL (the client's deadline + its margin)."""
    return float(handle.deadline + handle.margin)


# ---------------------------------------------------------------- worker process


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Run one worker until SIGTERM or ``--duration`` seconds (see the module docstring).

    Returns:
        The exit status (0).
    """
    from fencepost.client import FencepostError, LockTimeout

    parser = worker_parser("python -m tests.harness.rwlock worker")
    parser.add_argument("--reads", type=float, default=0.7, help="fraction of holds taken for reading")
    parser.add_argument("--mutant", action="store_true",
                        help="take write holds as a reader does, readers admitted beside them (the checker must fail)")
    args = parser.parse_args(argv)
    names = [f"counter-{i}" for i in range(args.records)]

    with worker_run(args) as w:
        h, store, client, rng = w.history, w.store, w.client, w.rng

        def on_lost(handle: Any) -> None:
            h.record("lost", name=handle.name, token=handle.token, lease=handle.lease_id, reason=handle.lost_reason,
                     expiry=held_until(handle), keepalive=handle.ttl / 3)

        while w.running():
            name = rng.choice(names)
            mode = READ if rng.random() < args.reads else WRITE
            h.record("acquire", result="invoke", name=name, mode=mode)
            try:
                handle = client.acquire(name, ttl=args.ttl, timeout=args.acquire_timeout,
                                        read=mode == READ or args.mutant)
            except LockTimeout:
                h.record("acquire", result="timeout", name=name, mode=mode)
                continue
            except FencepostError as err:
                h.record("acquire", result="error", name=name, mode=mode, error=type(err).__name__,
                         reason=err.reason)
                time.sleep(0.1)
                continue
            tok, lease = handle.token, handle.lease_id
            h.record("acquire", result="ok", name=name, mode=mode, token=tok, lease=lease, ttl=handle.ttl,
                     expiry=held_until(handle))
            handle.on_lost(on_lost)
            try:
                (_read if mode == READ else _write)(store, h, handle, rng.uniform(0, args.think))
            except Exception as err:  # noqa: BLE001 - a storage error is an outcome to record
                h.record("write" if mode == WRITE else "read", result="error", name=name, record=name, token=tok,
                         mode=mode, error=repr(err))
            h.record("valid", name=name, token=tok, lease=lease, value=handle.is_valid())
            h.record("release", result="invoke", name=name, token=tok, lease=lease)
            try:
                handle.release()
                h.record("release", result="ok", name=name, token=tok, lease=lease)
            except FencepostError as err:
                h.record("release", result="error", name=name, token=tok, lease=lease,
                         error=type(err).__name__, reason=err.reason)
    return 0


def _claim(store: Store, h: hist.History, handle: Any, mode: str) -> bool:
    """Claim the row with the hold's token; whether the storage accepted it."""
    from fencepost.client import StaleTokenError

    name, tok = handle.name, handle.token
    try:
        store.claim(name, tok)
    except StaleTokenError as err:
        h.record("claim", result="stale", name=name, record=name, token=tok, mode=mode, current=err.current_token,
                 expiry=held_until(handle))
        return False
    h.record("claim", result="accepted", name=name, record=name, token=tok, mode=mode, expiry=held_until(handle))
    return True


def _read(store: Store, h: hist.History, handle: Any, think: float) -> None:
    """A reader's hold: claim, read the row (value and stored token), wait ``think`` seconds, read it again."""
    name, tok = handle.name, handle.token
    _claim(store, h, handle, READ)
    for pause in (think, 0.0):
        value, stored = store.read_row(name)
        h.record("read", name=name, record=name, token=tok, mode=READ, value=value, stored=stored,
                 expiry=held_until(handle))
        time.sleep(pause)


def _write(store: Store, h: hist.History, handle: Any, think: float) -> None:
    """A writer's hold, as the lock workload's: claim, read, wait ``think`` seconds, fenced write of + 1."""
    from fencepost.client import StaleTokenError

    name, tok = handle.name, handle.token
    if not _claim(store, h, handle, WRITE):
        return
    value = store.read(name)
    h.record("read", name=name, record=name, token=tok, mode=WRITE, value=value, expiry=held_until(handle))
    h.record("valid", name=name, token=tok, lease=handle.lease_id, value=handle.is_valid())
    time.sleep(think)
    h.record("write", result="invoke", name=name, record=name, token=tok, value=value + 1)
    try:
        store.write(name, tok, value, value + 1, h.proc)
    except StaleTokenError as err:
        h.record("write", result="stale", name=name, record=name, token=tok, value=value + 1,
                 current=err.current_token, expiry=held_until(handle))
        return
    h.record("write", result="accepted", name=name, record=name, token=tok, value=value + 1,
             expiry=held_until(handle))


# ---------------------------------------------------------------- checker


@dataclasses.dataclass
class Hold:
    """One grant of a name in one mode, as the history shows it (times on the shared monotonic clock)."""

    proc: str
    name: str
    token: int
    mode: str
    start: float  #: the grant returned
    end: float = float("inf")  #: the release was called or the loss told (a killed worker's: never)
    lower: float = float("-inf")  #: the latest lowest end of its lease it recorded
    cut: bool = False  #: lost for a reason other than its lease: the key may have gone at any time
    accepted: bool = False  #: the storage accepted a claim or a write made under it
    operated: bool = False  #: it claimed, read or wrote
    killed: float = float("inf")  #: its worker was SIGKILLed then
    reads: list[hist.Event] = dataclasses.field(default_factory=list)  #: its reads and claims, in order

    @property
    def certain_end(self) -> float:
        """Until when its key certainly existed (-inf when never certainly after the grant returned)."""
        return float("-inf") if self.cut else min(self.end, self.lower)

    @property
    def seen_end(self) -> float:
        """Until when its worker believed it held (release call, loss notice, or its death)."""
        return min(self.end, self.killed)


def holds(events: list[hist.Event]) -> list[Hold]:
    """Every grant of the history as a :class:`Hold`, with what happened under it.

    Args:
        events: The merged history, in timestamp order.

    Returns:
        The holds in the order their grants returned.
    """
    out: list[Hold] = []
    by_key: dict[tuple[str, str, int], Hold] = {}
    for e in events:
        if e["op"] == "acquire" and e.get("result") == "ok":
            hold = Hold(e["proc"], e["name"], e["token"], e.get("mode", WRITE), e["t"])
            out.append(hold)
            by_key[(hold.proc, hold.name, hold.token)] = hold
        elif e["op"] == "nemesis" and e.get("kind") == "kill":
            for hold in out:
                if hold.proc == e.get("target"):
                    hold.killed = min(hold.killed, e["t"])
        if "token" not in e or "name" not in e:
            continue
        hold = by_key.get((e["proc"], e["name"], e["token"]))
        if hold is None:
            continue
        if e.get("expiry") is not None:
            hold.lower = max(hold.lower, float(e["expiry"]))
        if e["op"] == "lost":
            hold.end = min(hold.end, e["t"])
            hold.cut = hold.cut or e.get("reason") not in LEASE_REASONS
        elif e["op"] == "release" and e.get("result") == "invoke":
            hold.end = min(hold.end, e["t"])
        elif e["op"] in ("claim", "read", "write") and e.get("result") not in ("invoke", "error"):
            hold.operated = True
            hold.accepted = hold.accepted or e.get("result") == "accepted"
            if e["op"] != "write":
                hold.reads.append(e)
    return out


@dataclasses.dataclass
class RwLockReport:
    """The lock checker's report (without ``overlap``), plus the read-write lock's own checks and figures."""

    report: checker.Report
    violations: list[checker.Violation]
    figures: dict[str, int]

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return self.report.ok and not self.violations

    def kinds(self) -> set[str]:
        """The kinds of every violation found (the lock checker's and the read-write lock's)."""
        return self.report.kinds() | {v.kind for v in self.violations}

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for JSON): the lock checker's, with every violation and the figures."""
        return {**self.report.as_dict(),
                "violations": [dataclasses.asdict(v) for v in self.report.violations + self.violations],
                "rwlock": dict(self.figures)}

    def text(self) -> str:
        """A short human-readable summary."""
        f = self.figures
        lines = [self.report.text(),
                 f"rwlock: grants {f['read_grants']} read, {f['write_grants']} write; reads {f['reads']}; most "
                 f"readers holding one name together {f['most_readers']}; writer overlaps possible but not certain "
                 f"{f['uncertain_overlaps']}; stale writer writes {f['writer_writes_stale']}, claims "
                 f"{f['writer_claims_stale']}; reader claims refused under a writer's token "
                 f"{f['reader_claims_refused_by_writer']}; faults on holders {f['holder_hits']}; rwlock violations "
                 f"{len(self.violations)}"]
        lines += [f"  {v.kind}: {v.detail}" for v in self.violations[:50]]
        return "\n".join(lines)


def check(events: list[hist.Event], data: dict[str, Any] | None, *, faults: dict[str, int] | None = None,
          slack: float = checker.SLACK_SECONDS) -> RwLockReport:
    """Check a read-write lock run: the lock checker without ``overlap``, and who may hold together (see the
    module docstring).

    Args:
        events: The merged history.
        data: The final data (:meth:`~.workload.Store.snapshot`), or None to check the history alone.
        faults: Fault counts by kind (default: counted from the history).
        slack: e, in seconds.

    Returns:
        The report; ``.ok`` when nothing is violated.
    """
    events = sorted(events, key=lambda e: e["t"])
    report = checker.check(events, data, faults=faults, slack=slack, exclusive=False)
    every = holds(events)
    writers = {(h.name, h.token) for h in every if h.mode == WRITE}
    violations = _conflicts(every) + _reads(every, writers)
    uncertain = 0
    for a, b in _pairs(every, lambda h: h.seen_end):
        if (a.mode == WRITE or b.mode == WRITE) and a.operated and b.operated and not _overlap(a, b, certain=True):
            uncertain += 1
    readers = [h for h in every if h.mode == READ]
    figures = {
        "read_grants": len(readers),
        "write_grants": len(every) - len(readers),
        "reads": sum(1 for e in events if e["op"] == "read" and e.get("mode") == READ and "value" in e),
        "most_readers": _most_together(readers),
        "uncertain_overlaps": uncertain,
        "writer_writes_stale": report.writes["stale"],
        "writer_claims_stale": sum(1 for e in events if e["op"] == "claim" and e.get("mode") == WRITE
                                   and e.get("result") == "stale"),
        "reader_claims_refused_by_writer": sum(
            1 for h in readers for e in h.reads if e["op"] == "claim" and e.get("result") == "stale"
            and (h.name, e.get("current")) in writers),
        "holder_hits": sum(1 for e in events if e["op"] == "nemesis" and e.get("kind") in ("freeze", "kill")
                           and any(h.proc == e["target"] and h.start <= e["t"] < h.end and e["t"] <= h.killed
                                   for h in every)),
    }
    return RwLockReport(report, violations, figures)


def _overlap(a: Hold, b: Hold, *, certain: bool) -> bool:
    """Whether the holds' intervals (certain ones, or as their workers saw them) share an instant."""
    a_end, b_end = (a.certain_end, b.certain_end) if certain else (a.seen_end, b.seen_end)
    return max(a.start, b.start) <= min(a_end, b_end)


def _pairs(every: list[Hold], end: Any) -> list[tuple[Hold, Hold]]:
    """Pairs of holds of one name whose intervals ``[start, end(hold)]`` share an instant."""
    out: list[tuple[Hold, Hold]] = []
    by_name: dict[str, list[Hold]] = {}
    for hold in every:
        by_name.setdefault(hold.name, []).append(hold)
    for items in by_name.values():
        items.sort(key=lambda h: h.start)
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                if b.start > end(a):
                    break
                if b.start <= end(b):
                    out.append((a, b))
    return out


def _conflicts(every: list[Hold]) -> list[checker.Violation]:
    """A writer's hold certainly overlapping another hold of its name, one of them accepted by the storage and
    the other having operated."""
    out = []
    for a, b in _pairs(every, lambda h: h.certain_end):
        if WRITE not in (a.mode, b.mode) or not ((a.accepted and b.operated) or (b.accepted and a.operated)):
            continue
        kind = "writer-with-writer" if a.mode == b.mode else "writer-with-reader"
        out.append(checker.Violation(kind, (
            f"{a.name}: {a.proc} ({a.mode}, token {a.token}) held from {a.start:.3f} to at least "
            f"{a.certain_end:.3f} and {b.proc} ({b.mode}, token {b.token}) from {b.start:.3f} to at least "
            f"{b.certain_end:.3f}, both operated")))
    return out


def _reads(every: list[Hold], writers: set[tuple[str, int]]) -> list[checker.Violation]:
    """Readers that saw a later writer's token (``writers``: name, token), or the value change, while they
    certainly held."""
    out = []
    for hold in every:
        if hold.mode != READ:
            continue
        claimed, values = False, set()
        for e in hold.reads:
            if e["t"] > hold.certain_end:
                break
            seen = e.get("stored") if e["op"] == "read" else e.get("current")
            if seen is not None and seen > hold.token and (hold.name, seen) in writers:
                out.append(checker.Violation("read-under-writer", (
                    f"{hold.name}: {hold.proc} (reader, token {hold.token}, held from {hold.start:.3f} to at least "
                    f"{hold.certain_end:.3f}) saw writer token {seen} stored at {e['t']:.3f}")))
                break
            claimed = claimed or e["op"] == "claim"  # accepted or refused: the row's token >= its own from then
            if claimed and e["op"] == "read":
                values.add(e["value"])
        if len(values) > 1:
            out.append(checker.Violation("read-changed", (
                f"{hold.name}: {hold.proc} (reader, token {hold.token}) read {sorted(values)} while it held")))
    return out


def _most_together(readers: list[Hold]) -> int:
    """The most readers whose certain intervals share an instant, over every name."""
    best = 0
    by_name: dict[str, list[tuple[float, int]]] = {}
    for hold in readers:
        if hold.operated and hold.start <= hold.certain_end:
            by_name.setdefault(hold.name, []).extend([(hold.start, 1), (hold.certain_end, -1)])
    for edges in by_name.values():
        now = 0
        for _, delta in sorted(edges, key=lambda x: (x[0], -x[1])):  # a start before an end at the same time
            now += delta
            best = max(best, now)
    return best


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.harness.rwlock worker ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "worker":
        print("usage: python -m tests.harness.rwlock worker --address ... (see --help)", file=sys.stderr)
        return 2
    return worker_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
