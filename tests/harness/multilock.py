"""The multi-lock fault-run workload: worker processes doing fenced read-modify-writes of several rows at once.

Counter rows ``counter-0`` .. ``counter-N-1`` (the :class:`~.workload.Store`
of the lock workload), one lock name each. Each worker
(``python -m tests.harness.multilock worker ...``, started by
:func:`tests.harness.workload.run` with ``module="tests.harness.multilock"``)
loops:

1. pick 2 to ``--most-names`` rows, in a random order, and take all their
   locks at once (``LockClient.acquire_all``): one token per name;
2. claim every row with its own name's token, read every row;
3. write every row + 1, each fenced by its own name's token, with its audit
   row, all in one transaction (one stale row: nothing written);
4. release every name (one call).

The history records the multi-lock calls as one event each (``names`` on
the invoke, ``tokens`` (name -> token) on the grant, the release, the loss
notice and ``is_valid()``); the claims, reads and writes are per row.
:func:`per_name` splits every multi-lock event into one event per name, so
that each name's hold is a lock's hold of (process, name, token) and the
lock checker (:func:`tests.harness.checker.check`) judges every name: no two
holders at once (``overlap``), tokens strictly increasing across grants
(``grant-order``), loss notices on time, and in the data no stale write
accepted (``token-order``, ``lost-update``, ``counter``, ``phantom-write``).
:func:`check` adds the multi-lock's own invariants:

``grant-names``
    A grant gives every name invoked, and only those, each with one token.
``grant-tokens``
    The tokens of one grant are equal (docs/multilocks.md: one etcd Txn puts
    every key, so they share a create revision).
``missing-name``
    No claim, read or write under a multi-lock once one of its names has
    ended (released, or its loss told) while another has not: a holder never
    works with part of its names.
``unheld-write``
    Every stored (audit) row comes from a grant of its worker that gave that
    row's name with that token.
``partial-write``
    A grant's stored rows are all of its names or none (one transaction).

The mutant (``--mutant``) takes the names one after another with plain
acquires, in sorted order, and releases the first one before it claims the
rows: the checker must find it (``missing-name``, ``grant-tokens``).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

from . import checker
from . import history as hist
from .workload import worker_parser, worker_run

__all__ = ["MultiLockReport", "check", "per_name", "worker_main"]

#: The ops whose multi-lock events carry ``tokens`` (name -> token) and stand for one event per name.
PER_NAME_OPS = frozenset({"acquire", "release", "lost", "valid"})


# ---------------------------------------------------------------- worker process


def worker_main(argv: Sequence[str] | None = None) -> int:
    """Run one worker until SIGTERM or ``--duration`` seconds (see the module docstring).

    Returns:
        The exit status (0).
    """
    from fencepost.client import FencepostError, LockTimeout

    parser = worker_parser("python -m tests.harness.multilock worker")
    parser.add_argument("--most-names", type=int, default=3, help="most names per multi-lock")
    parser.add_argument("--mutant", action="store_true",
                        help="plain acquires one after another, the first released early (the checker must fail)")
    args = parser.parse_args(argv)
    records = [f"counter-{i}" for i in range(args.records)]

    with worker_run(args) as w:
        h, client, rng = w.history, w.client, w.rng

        def notice(tokens: dict[str, int], lost: Any) -> None:
            h.record("lost", tokens=tokens, lease=lost.lease_id, reason=lost.lost_reason,
                     expiry=lost.deadline + lost.margin, keepalive=lost.ttl / 3)

        def release(handles: Sequence[Any], tokens: dict[str, int], lease: int) -> None:
            h.record("release", result="invoke", tokens=tokens, lease=lease)
            try:
                for handle in handles:
                    handle.release()
                h.record("release", result="ok", tokens=tokens, lease=lease)
            except FencepostError as err:
                h.record("release", result="error", tokens=tokens, lease=lease, error=type(err).__name__,
                         reason=err.reason)

        while w.running():
            names = rng.sample(records, rng.randint(2, min(args.most_names, len(records))))
            h.record("acquire", result="invoke", names=names)
            try:
                if args.mutant:
                    names.sort()
                    handles = _one_by_one(client, names, args.ttl, args.acquire_timeout)
                    tokens = {name: handle.token for name, handle in zip(names, handles)}
                else:
                    handles = [client.acquire_all(names, ttl=args.ttl, timeout=args.acquire_timeout)]
                    tokens = handles[0].tokens
            except LockTimeout:
                h.record("acquire", result="timeout", names=names)
                continue
            except FencepostError as err:
                h.record("acquire", result="error", names=names, error=type(err).__name__, reason=err.reason)
                time.sleep(0.1)
                continue
            lease = handles[0].lease_id
            h.record("acquire", result="ok", names=names, tokens=tokens, lease=lease, ttl=handles[0].ttl)
            live, live_tokens = handles, dict(tokens)
            if args.mutant:
                for handle in handles:
                    handle.on_lost(lambda lost: notice({lost.name: lost.token}, lost))
                release(live[:1], {names[0]: tokens[names[0]]}, lease)  # the bug: one name let go early
                live, live_tokens = live[1:], {n: t for n, t in tokens.items() if n != names[0]}
            else:
                handles[0].on_lost(lambda lost: notice(lost.tokens, lost))

            def valid(live: Sequence[Any] = live) -> bool:
                return all(handle.is_valid() for handle in live)

            try:
                _work(w.store, h, rng.uniform(0, args.think), tokens, valid, live_tokens, lease)
            except Exception as err:  # noqa: BLE001 - a storage error is an outcome to record
                h.record("write", result="error", name=names[0], record=names[0], token=tokens[names[0]],
                         error=repr(err))
            h.record("valid", tokens=live_tokens, lease=lease, value=valid())
            release(live, live_tokens, lease)
    return 0


def _one_by_one(client: Any, names: Sequence[str], ttl: float, timeout: float) -> list[Any]:
    """The mutant's acquire: plain locks taken one after another (what ``acquire_all`` is not)."""
    from fencepost.client import FencepostError

    handles: list[Any] = []
    try:
        for name in names:
            handles.append(client.acquire(name, ttl=ttl, timeout=timeout))
    except BaseException:
        for handle in handles:
            try:
                handle.release()
            except FencepostError:
                pass
        raise
    return handles


def _work(store: Any, h: hist.History, think: float, tokens: dict[str, int], valid: Any,
          live_tokens: dict[str, int], lease: int) -> None:
    """Claim every row with its name's token, read every row, write every row + 1 in one transaction."""
    from fencepost.client import StaleTokenError

    for name, token in tokens.items():
        try:
            store.claim(name, token)
        except StaleTokenError as err:
            h.record("claim", result="stale", name=name, record=name, token=token, current=err.current_token)
            return
        h.record("claim", result="accepted", name=name, record=name, token=token)
    values = {}
    for name, token in tokens.items():
        values[name] = store.read(name)
        h.record("read", name=name, record=name, token=token, value=values[name])
    h.record("valid", tokens=live_tokens, lease=lease, value=valid())
    time.sleep(think)
    for name, token in tokens.items():
        h.record("write", result="invoke", name=name, record=name, token=token, value=values[name] + 1)
    try:
        store.write_all([(name, token, values[name], values[name] + 1) for name, token in tokens.items()], h.proc)
        result, extra = "accepted", {}
    except StaleTokenError as err:
        result, extra = "stale", {"current": err.current_token}
    for name, token in tokens.items():
        h.record("write", result=result, name=name, record=name, token=token, value=values[name] + 1, **extra)


# ---------------------------------------------------------------- checker


def per_name(events: list[hist.Event]) -> list[hist.Event]:
    """The history with each multi-lock event split into one event per name (the lock checker's holds).

    Args:
        events: The merged history.

    Returns:
        New events, in the same order: an ``acquire``, ``release``, ``lost`` or
        ``valid`` event with ``tokens`` becomes one event per name with its
        ``name`` and ``token``; an ``acquire`` with ``names`` only (invoke,
        timeout, error) one per name. Other events are copied.
    """
    out: list[hist.Event] = []
    for e in events:
        if e["op"] in PER_NAME_OPS and "tokens" in e:
            rest = {k: v for k, v in e.items() if k not in ("tokens", "names")}
            out += [{**rest, "name": name, "token": token} for name, token in e["tokens"].items()]
        elif e["op"] == "acquire" and "names" in e:
            rest = {k: v for k, v in e.items() if k != "names"}
            out += [{**rest, "name": name} for name in e["names"]]
        else:
            out.append(dict(e))
    return out


@dataclasses.dataclass
class MultiLockReport:
    """The lock checker's report on the per-name history, plus the multi-lock's own checks and figures."""

    report: checker.Report
    violations: list[checker.Violation]
    grants: int
    names_granted: int
    holder_hits: int

    @property
    def ok(self) -> bool:
        """True when no invariant was broken."""
        return self.report.ok and not self.violations

    def kinds(self) -> set[str]:
        """The kinds of every violation found (the lock checker's and the multi-lock's)."""
        return self.report.kinds() | {v.kind for v in self.violations}

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for JSON): the lock checker's, with every violation and the multi-lock figures."""
        return {**self.report.as_dict(),
                "violations": [dataclasses.asdict(v) for v in self.report.violations + self.violations],
                "multilock": {"grants": self.grants, "names_granted": self.names_granted,
                              "holder_hits": self.holder_hits}}

    def text(self) -> str:
        """A short human-readable summary."""
        lines = [self.report.text(),
                 f"multi-lock: grants {self.grants} ({self.names_granted} names), faults on holders "
                 f"{self.holder_hits}, multi-lock violations {len(self.violations)}"]
        lines += [f"  {v.kind}: {v.detail}" for v in self.violations[:50]]
        return "\n".join(lines)


def check(events: list[hist.Event], data: dict[str, Any] | None, *, faults: dict[str, int] | None = None,
          slack: float = checker.SLACK_SECONDS) -> MultiLockReport:
    """Check a multi-lock run: each name as a lock (:func:`checker.check` on :func:`per_name`), and the
    multi-lock's own invariants (see the module docstring).

    Args:
        events: The merged history.
        data: The final data (:meth:`~.workload.Store.snapshot`), or None to check the history alone.
        faults: Fault counts by kind (default: counted from the history).
        slack: e, in seconds.

    Returns:
        The report; ``.ok`` when nothing is violated.
    """
    events = sorted(events, key=lambda e: e["t"])
    split = per_name(events)
    report = checker.check(split, data, faults=faults, slack=slack)
    violations: list[checker.Violation] = []

    grants: list[tuple[str, float, dict[str, int]]] = []  # (proc, ok time, name -> token)
    asked: dict[str, list[str]] = {}
    for e in events:
        if e["op"] != "acquire":
            continue
        if e["result"] == "invoke":
            asked[e["proc"]] = list(e.get("names", ()))
            continue
        names = asked.pop(e["proc"], None)
        if e["result"] != "ok":
            continue
        tokens = dict(e.get("tokens", {}))
        grants.append((e["proc"], e["t"], tokens))
        if (names is not None and sorted(tokens) != sorted(names)) or not all(
                isinstance(t, int) and t > 0 for t in tokens.values()):
            violations.append(checker.Violation("grant-names", (
                f"{e['proc']} asked for {names} and was granted {tokens} at {e['t']:.3f}")))
        if len(set(tokens.values())) > 1:
            violations.append(checker.Violation("grant-tokens", (
                f"{e['proc']} granted {tokens} at {e['t']:.3f}: not one token")))
    by_hold = {(proc, name, token): i for i, (proc, _, tokens) in enumerate(grants) for name, token in tokens.items()}
    ends: dict[tuple[str, str, int], float] = {}  # (proc, name, token) -> release invoked or loss told
    for e in split:
        if e["op"] == "lost" or (e["op"] == "release" and e["result"] == "invoke"):
            ends.setdefault((e["proc"], e["name"], e["token"]), e["t"])

    # A holder never works with part of its names.
    reported: set[int] = set()
    for e in events:
        if not (e["op"] in ("claim", "read") or (e["op"] == "write" and e["result"] == "invoke")):
            continue
        i = by_hold.get((e["proc"], e.get("record"), e["token"]))
        if i is None or i in reported:
            continue
        proc, _, tokens = grants[i]
        gone = sorted(n for n, tok in tokens.items() if ends.get((proc, n, tok), float("inf")) <= e["t"])
        if gone and len(gone) < len(tokens):
            reported.add(i)
            violations.append(checker.Violation("missing-name", (
                f"{proc} {e['op']} {e['record']} with token {e['token']} at {e['t']:.3f} under {tokens}, "
                f"after {gone} had ended")))

    # Stored writes: each from a grant of its row's name with that token, all of a grant's names or none.
    if data is not None:
        written: dict[int, set[str]] = {}
        for row in data["audit"]:
            i = by_hold.get((row["worker"], row["record"], row["token"]))
            if i is None:
                violations.append(checker.Violation("unheld-write", (
                    f"audit row seq {row['seq']}: {row['worker']} wrote {row['record']} with token {row['token']}, "
                    f"which no grant of {row['worker']} gave for {row['record']}")))
            else:
                written.setdefault(i, set()).add(row["record"])
        for i, records in written.items():
            proc, t, tokens = grants[i]
            if records != set(tokens):
                violations.append(checker.Violation("partial-write", (
                    f"{proc}'s grant {tokens} at {t:.3f} stored {sorted(records)} only")))

    # Faults that hit a holder: the target held a multi-lock (granted, no name ended yet) at that moment.
    hits = 0
    for e in events:
        if e["op"] == "nemesis" and e.get("kind") in ("freeze", "kill") and any(
                proc == e["target"] and t <= e["t"] < min(ends.get((proc, n, tok), float("inf"))
                                                          for n, tok in tokens.items())
                for proc, t, tokens in grants):
            hits += 1
    return MultiLockReport(report, violations, len(grants), sum(len(g[2]) for g in grants), hits)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.harness.multilock worker ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] != "worker":
        print("usage: python -m tests.harness.multilock worker --address ... (see --help)", file=sys.stderr)
        return 2
    return worker_main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
