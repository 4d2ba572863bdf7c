"""The checker: judges a fault run by its history and by the data it left.

What it checks (each failure is a :class:`Violation` of one ``kind``):

``token-order`` (data)
    The audit rows of one record, in commit order, carry tokens that never
    decrease: no accepted write carried a token lower than one accepted
    before it.
``lost-update`` / ``counter`` (data)
    Each audit row's ``old`` is the previous row's ``new`` (starting at 0),
    and each record's final value equals its number of audit rows: every
    accepted increment is there exactly once (nothing lost, nothing doubled).
``unrecorded-write`` / ``phantom-write`` (history vs data)
    Every write the history calls accepted has its audit row; every audit row
    matches a write the history accepted or left indeterminate (the worker
    died between invoke and outcome); no write recorded ``stale`` is in the
    audit.
``grant-order`` (history)
    Successive grants of a name have strictly increasing tokens: when grant
    G2 was invoked after grant G1 returned, ``token(G2) > token(G1)``, and
    no two grants share a token.
``late-notice`` (history)
    Every loss notice reached its holder no later than the lease's estimated
    server-side expiry plus ``slack`` (or ``slack`` after the acquire that
    returned the handle, when the lease was lost while that call ran). The expiry is estimated by the client's
    own record, the send time of the last acknowledged keepalive + TTL (a
    lower bound of etcd's expiry, which counts from the keepalive's arrival,
    so the check is strict). When the holder process was frozen (SIGSTOP) at
    that bound, the bound becomes its thaw time + K + slack (K = keepalive
    period): a frozen process cannot be told anything.
``overlap`` (history)
    When a grant of a name returns, the previous holder of that name has
    released it or been told of its loss, at the latest ``slack`` later (or
    K + slack after its thaw, if it was frozen then).
``double-notice`` (history)
    A handle's loss is notified once.
``valid-after-loss`` (history)
    After a loss notice, ``is_valid()`` never again returns True for that
    handle (same process, same token).

A hold is identified by (process, lock name, token) and a write by (process,
record, token, value): the names of one multi-lock share a token, each is a
hold of its own (tests/harness/multilock.py).

Figures reported: operations by kind, accepted/stale/indeterminate writes,
faults injected by kind, loss notices, violations (must be 0).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from .history import Event

__all__ = ["Violation", "Report", "check", "SLACK_SECONDS"]

#: e: the documented slack for notices and hand-overs, in seconds.
SLACK_SECONDS = 0.5
#: Nemesis events that end a fault rather than inject one (not counted as faults).
RECOVERIES = frozenset({"thaw", "respawn", "coordinator-up", "etcd-restarted", "etcd-resumed",
                        "coordinator-etcd-healed", "client-healed"})


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken invariant: its kind and a human-readable account."""

    kind: str
    detail: str


@dataclasses.dataclass
class Report:
    """The checker's verdict and figures."""

    operations: dict[str, int]
    writes: dict[str, int]
    faults: dict[str, int]
    notices: int
    grants: int
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return not self.violations

    def kinds(self) -> set[str]:
        """The kinds of the violations found."""
        return {v.kind for v in self.violations}

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for JSON)."""
        return {
            "operations": self.operations,
            "writes": self.writes,
            "faults": self.faults,
            "loss_notices": self.notices,
            "grants": self.grants,
            "violations": [dataclasses.asdict(v) for v in self.violations],
        }

    def text(self) -> str:
        """A short human-readable summary."""
        lines = [
            f"operations: {sum(self.operations.values())} "
            + json.dumps(dict(sorted(self.operations.items()))),
            f"writes: {json.dumps(self.writes)}",
            f"grants: {self.grants}, loss notices: {self.notices}",
            f"faults injected: {json.dumps(dict(sorted(self.faults.items())))}",
            f"violations: {len(self.violations)}",
        ]
        lines += [f"  {v.kind}: {v.detail}" for v in self.violations[:50]]
        return "\n".join(lines)


def _frozen_intervals(events: Iterable[Event]) -> dict[str, list[tuple[float, float]]]:
    """proc id -> [(freeze time, thaw time)] from the nemesis events (open-ended freezes last forever)."""
    out: dict[str, list[tuple[float, float]]] = {}
    open_at: dict[str, float] = {}
    for e in events:
        if e["op"] != "nemesis":
            continue
        target = e.get("target")
        if e.get("kind") == "freeze":
            open_at[target] = e["t"]
        elif e.get("kind") == "thaw" and target in open_at:
            out.setdefault(target, []).append((open_at.pop(target), e["t"]))
    for target, t in open_at.items():
        out.setdefault(target, []).append((t, float("inf")))
    return out


def _bound(t: float, proc: str, frozen: dict[str, list[tuple[float, float]]], keepalive: float,
           slack: float) -> float:
    """The latest time by which ``proc`` must have learnt of something due at ``t``.

    ``t + slack``, or, if ``proc`` was frozen at any time in [t - slack, t + slack],
    that freeze's thaw time + K + slack (repeated for back-to-back freezes).
    """
    bound = t + slack
    changed = True
    while changed:
        changed = False
        for start, end in frozen.get(proc, ()):
            if start <= bound and end >= t - slack and end + keepalive + slack > bound:
                bound = end + keepalive + slack
                changed = True
    return bound


def check(events: list[Event], data: dict[str, Any] | None, *, faults: dict[str, int] | None = None,
          slack: float = SLACK_SECONDS, exclusive: bool = True) -> Report:
    """Check a merged history and the final data.

    Args:
        events: The merged history, in timestamp order (see :mod:`.history`).
        data: ``{"records": {key: {"value", "token"}}, "audit": [{"seq", "record", "token",
            "worker", "old", "new"}]}`` as :meth:`Store.snapshot` returns, or None to check the
            history alone.
        faults: Fault counts by kind; default: counted from the history's nemesis events.
        slack: e, in seconds.
        exclusive: Whether the holds of one name exclude each other (``overlap``); False for read-write
            locks, whose readers share a name (tests/harness/rwlock.py checks who may hold together).

    Returns:
        The report; ``report.ok`` when nothing is violated.
    """
    events = sorted(events, key=lambda e: e["t"])
    violations: list[Violation] = []
    operations: dict[str, int] = {}
    fault_counts: dict[str, int] = {}
    for e in events:
        if e["op"] == "nemesis":
            if e.get("kind") not in RECOVERIES:
                fault_counts[e["kind"]] = fault_counts.get(e["kind"], 0) + 1
        elif e.get("result") != "invoke":
            operations[e["op"]] = operations.get(e["op"], 0) + 1
    frozen = _frozen_intervals(events)

    # ---- writes: history outcomes
    invoked: dict[tuple[str, str, int, int], Event] = {}  # (proc, record, token, value) -> invoke
    outcome: dict[tuple[str, str, int, int], str] = {}
    for e in events:
        if e["op"] != "write":
            continue
        key = (e["proc"], e.get("record", ""), e["token"], e.get("value", -1))
        if e["result"] == "invoke":
            invoked[key] = e
        else:
            outcome[key] = e["result"]
    writes = {"accepted": 0, "stale": 0, "error": 0, "indeterminate": 0}
    for key in invoked:
        writes[outcome.get(key, "indeterminate")] = writes.get(outcome.get(key, "indeterminate"), 0) + 1
    writes["claims_stale"] = sum(1 for e in events if e["op"] == "claim" and e.get("result") == "stale")

    # ---- data
    if data is not None:
        by_record: dict[str, list[dict[str, Any]]] = {}
        for row in sorted(data["audit"], key=lambda r: r["seq"]):
            by_record.setdefault(row["record"], []).append(row)
        for record, info in data["records"].items():
            rows = by_record.get(record, [])
            prev_token, prev_value = None, 0
            for row in rows:
                if prev_token is not None and row["token"] < prev_token:
                    violations.append(Violation("token-order", (
                        f"{record}: write with token {row['token']} (seq {row['seq']}, {row['worker']}) "
                        f"committed after token {prev_token}")))
                if row["old"] != prev_value or row["new"] != row["old"] + 1:
                    violations.append(Violation("lost-update", (
                        f"{record}: seq {row['seq']} ({row['worker']}, token {row['token']}) wrote "
                        f"{row['old']}->{row['new']} after the value was {prev_value}")))
                prev_token, prev_value = row["token"], row["new"]
            if info["value"] != len(rows):
                violations.append(Violation("counter", (
                    f"{record}: final value {info['value']} but {len(rows)} accepted increments")))
        audit_keys = {(row["worker"], row["record"], row["token"], row["new"]) for row in data["audit"]}
        for key, result in outcome.items():
            if result == "accepted" and key not in audit_keys:
                violations.append(Violation("unrecorded-write", f"accepted write {key} has no audit row"))
            if result == "stale" and key in audit_keys:
                violations.append(Violation("phantom-write", f"write {key} recorded stale is in the audit"))
        for key in audit_keys:
            if key not in invoked:
                violations.append(Violation("phantom-write", f"audit row {key} matches no write in the history"))
            elif outcome.get(key) not in (None, "accepted"):
                violations.append(Violation("phantom-write", f"audit row {key} but the write was {outcome[key]}"))

    # ---- grants of each name: strictly increasing tokens in real-time order
    grants: dict[str, list[tuple[float, float, int, str]]] = {}  # name -> (invoke t, ok t, token, proc)
    pending: dict[tuple[str, str], float] = {}
    for e in events:
        if e["op"] != "acquire":
            continue
        if e["result"] == "invoke":
            pending[(e["proc"], e["name"])] = e["t"]
        elif e["result"] == "ok":
            start = pending.pop((e["proc"], e["name"]), e["t"])
            grants.setdefault(e["name"], []).append((start, e["t"], e["token"], e["proc"]))
    total_grants = 0
    for name, items in grants.items():
        total_grants += len(items)
        seen: dict[int, str] = {}
        for _, _, token, proc in items:
            if token in seen:
                violations.append(Violation("grant-order", f"{name}: token {token} granted twice ({seen[token]}, {proc})"))
            seen[token] = proc
        by_ok = sorted(items, key=lambda g: g[1])
        ok_times = [g[1] for g in by_ok]
        prefix_max: list[tuple[int, str]] = []
        best = (-1, "")
        for g in by_ok:
            if g[2] > best[0]:
                best = (g[2], g[3])
            prefix_max.append(best)
        for invoke_t, _, token, proc in items:
            i = bisect.bisect_left(ok_times, invoke_t)
            if i > 0 and prefix_max[i - 1][0] >= token and prefix_max[i - 1][1] != "":
                earlier, who = prefix_max[i - 1]
                if earlier != token:
                    violations.append(Violation("grant-order", (
                        f"{name}: {proc} got token {token} in an acquire invoked after {who}'s grant of "
                        f"token {earlier} returned")))

    # ---- holds: release/loss times per (proc, name, token): the names of one multi-lock share a token
    ends: dict[tuple[str, str, int], float] = {}  # release invoked or loss notice
    notices: dict[tuple[str, str, int], Event] = {}
    born: dict[tuple[str, str, int], float] = {}  # when the holder got the handle (acquire returned)
    for e in events:
        if e["op"] == "acquire" and e["result"] == "ok":
            born[_hold(e)] = e["t"]
        elif e["op"] == "lost":
            key = _hold(e)
            if key in notices:
                violations.append(Violation("double-notice", f"second loss notice for {key}"))
                continue
            notices[key] = e
            ends.setdefault(key, e["t"])
            expiry = e.get("expiry")
            if expiry is not None:
                bound = _bound(expiry, e["proc"], frozen, e.get("keepalive", 0.0), slack)
                # An acquire that returns after its lease was lost hands back a handle lost from the
                # start: it cannot have been told before it existed.
                bound = max(bound, born.get(key, bound) + slack)
                if e["t"] > bound:
                    violations.append(Violation("late-notice", (
                        f"{e['proc']} told of the loss of {e['name']} token {e['token']} at {e['t']:.3f}, "
                        f"{e['t'] - expiry:.3f} s after its estimated expiry {expiry:.3f} (bound {bound:.3f})")))
        elif e["op"] == "release" and e["result"] == "invoke":
            ends.setdefault(_hold(e), e["t"])
        elif e["op"] == "valid" and e.get("value") is True:
            key = _hold(e)
            if key in notices and e["t"] > notices[key]["t"]:
                violations.append(Violation("valid-after-loss", (
                    f"{e['proc']} saw is_valid() True for token {e['token']} at {e['t']:.3f}, after the loss "
                    f"notice at {notices[key]['t']:.3f}")))
    ttl_of: dict[tuple[str, str, int], float] = {}
    for e in events:
        if e["op"] == "acquire" and e["result"] == "ok":
            ttl_of[_hold(e)] = float(e.get("ttl", 0))
    for name, items in grants.items() if exclusive else ():
        ordered = sorted(items, key=lambda g: g[2])
        for prev, nxt in zip(ordered, ordered[1:]):
            prev_key = (prev[3], name, prev[2])
            end = ends.get(prev_key)
            k = ttl_of.get(prev_key, 0.0) / 3
            bound = _bound(nxt[1], prev[3], frozen, k, slack)
            if end is None:
                if _dead_before(events, prev[3], nxt[1] + slack):
                    continue  # the holder process was killed: nobody to tell
                violations.append(Violation("overlap", (
                    f"{name}: {nxt[3]} granted token {nxt[2]} at {nxt[1]:.3f} while {prev[3]} (token {prev[2]}) "
                    f"never released nor was told of the loss")))
            elif end > bound:
                violations.append(Violation("overlap", (
                    f"{name}: {nxt[3]} granted token {nxt[2]} at {nxt[1]:.3f}; {prev[3]} (token {prev[2]}) "
                    f"learnt only at {end:.3f} (bound {bound:.3f})")))

    if faults is not None:
        for kind, n in faults.items():
            fault_counts[kind] = max(n, fault_counts.get(kind, 0))
    return Report(operations, writes, fault_counts, len(notices), total_grants, violations)


def _hold(e: Event) -> tuple[str, str, int]:
    """The hold an event is about: (proc, lock name, token)."""
    return (e["proc"], e["name"], e["token"])


def _dead_before(events: list[Event], proc: str, t: float) -> bool:
    """Whether ``proc`` was SIGKILLed before ``t`` (or its history simply ends: a killed process)."""
    for e in events:
        if e["op"] == "nemesis" and e.get("kind") == "kill" and e.get("target") == proc and e["t"] <= t:
            return True
    return False
