"""Multi-locks under faults (issue 22): 6 worker processes take 2-3 of 4 names at once, write each name's row
fenced by its own token in one transaction; holders frozen past their lease and killed, the coordinator
restarted, the client links blackholed and cut. The history is checked per name and per multi-lock
(tests/harness/multilock.py); a mutant that lets one name go early must fail the check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import multilock, workload
from tests.harness.history import Event
from tests.harness.nemesis import holders_and_links_nemesis
from tests.harness.proxy import Proxy

from .conftest import SOAK

MODULE = "tests.harness.multilock"


def test_multilock_every_name_held_once_and_fenced_under_faults(
    coordinator_process: Any, proxy_to: Callable[[str], Proxy], tmp_path: Path
) -> None:
    """No two holders of a name at once, per-name tokens strictly increasing, every grant all its names with one
    token, no holder working with part of its names, each stored write all of a grant's names or none and no
    stale one accepted, while holders are frozen past their lease and killed, the coordinator restarts and the
    client links are blackholed and cut; the nemesis must have hit holders and a stale write must have been
    refused (so that this test could fail)."""
    proxy = proxy_to(coordinator_process.start())

    def restart() -> None:
        coordinator_process.terminate()
        coordinator_process.start()

    nemesis = holders_and_links_nemesis(proxy, 2.0)
    result = workload.run(proxy.address, tmp_path / "multi", workers=6, records=4, seconds=120.0 if SOAK else 24.0,
                          ttl=2.0, think=0.3, tag="multi", nemesis=nemesis, restart_coordinator=restart,
                          module=MODULE)
    verdict = multilock.check(result.events, result.data, faults=result.faults)
    print(verdict.text())
    assert verdict.ok, verdict.text()
    faults = verdict.report.faults
    for kind in ("kill", "coordinator-restart"):
        assert faults.get(kind, 0) >= 1, verdict.text()
    assert faults.get("freeze", 0) >= 2, verdict.text()
    assert verdict.holder_hits >= 2, verdict.text()
    assert verdict.grants > 20 and verdict.names_granted > 2 * verdict.grants, verdict.text()
    refused = verdict.report.writes["stale"] + verdict.report.writes["claims_stale"]
    assert refused >= 1, verdict.text()
    assert verdict.report.writes["accepted"] > 40, verdict.text()


def test_multilock_checker_fails_a_mutant_that_lets_one_name_go_early(
    coordinator_process: Any, tmp_path: Path
) -> None:
    """Workers that take the names one after another with plain acquires and release the first before they
    write are caught: a holder working with part of its names, and a grant without one token."""
    address = coordinator_process.start()
    result = workload.run(address, tmp_path / "mutant", workers=3, records=4, seconds=4.0, ttl=2.0, think=0.02,
                          tag="mutant", module=MODULE, worker_args=["--mutant"])
    verdict = multilock.check(result.events, result.data, faults=result.faults)
    print(verdict.text())
    assert verdict.grants >= 3, verdict.text()
    assert {"missing-name", "grant-tokens"} <= verdict.kinds(), verdict.text()


# ---------------------------------------------------------------- the checker on written histories


def ev(t: float, proc: str, op: str, **fields: Any) -> Event:
    return {"t": t, "proc": proc, "op": op, **fields}


def hold(t: float, proc: str, tokens: dict[str, int], *, old: dict[str, int] | None = None,
         release: bool = True) -> list[Event]:
    """One multi-lock hold as the worker records it: grant, claims, reads (``old``, default 0), writes accepted,
    release."""
    old = old or {}
    out = [ev(t, proc, "acquire", result="invoke", names=list(tokens)),
           ev(t + 0.1, proc, "acquire", result="ok", names=list(tokens), tokens=tokens, lease=1, ttl=2.0)]
    for name, token in tokens.items():
        out.append(ev(t + 0.2, proc, "claim", result="accepted", name=name, record=name, token=token))
    for name, token in tokens.items():
        out.append(ev(t + 0.3, proc, "read", name=name, record=name, token=token, value=old.get(name, 0)))
    for name, token in tokens.items():
        out += [ev(t + 0.4, proc, "write", result="invoke", name=name, record=name, token=token, value=old.get(name, 0) + 1),
                ev(t + 0.5, proc, "write", result="accepted", name=name, record=name, token=token,
                   value=old.get(name, 0) + 1)]
    if release:
        out += [ev(t + 0.6, proc, "release", result="invoke", tokens=tokens, lease=1),
                ev(t + 0.7, proc, "release", result="ok", tokens=tokens, lease=1)]
    return out


def data(rows: list[tuple[str, int, str, int]]) -> dict[str, Any]:
    """The store's final data from audit rows (record, token, worker, new), in commit order."""
    audit = [{"seq": i + 1, "record": r, "token": tok, "worker": w, "old": new - 1, "new": new}
             for i, (r, tok, w, new) in enumerate(rows)]
    records = {r: {"value": max((a["new"] for a in audit if a["record"] == r), default=0), "token": None}
               for r in ("a", "b", "c")}
    return {"records": records, "audit": audit}


CLEAN = [*hold(0.0, "w0.1", {"a": 10, "b": 10}), *hold(1.0, "w1.1", {"b": 12, "c": 12}, old={"b": 1})]
CLEAN_DATA = data([("a", 10, "w0.1", 1), ("b", 10, "w0.1", 1), ("b", 12, "w1.1", 2), ("c", 12, "w1.1", 1)])


def test_multilock_checker_passes_a_clean_history_with_one_loss_notice_for_every_name() -> None:
    """Two holds sharing name b, and a third lost as a whole (one notice naming both its names): no violation
    (the lock checker keys a hold by process, name and token, so one notice for two names is not twice)."""
    lost = [ev(2.0, "w0.1", "acquire", result="invoke", names=["a", "c"]),
            ev(2.1, "w0.1", "acquire", result="ok", names=["a", "c"], tokens={"a": 14, "c": 14}, lease=2, ttl=2.0),
            ev(2.2, "w0.1", "lost", tokens={"a": 14, "c": 14}, lease=2, reason="LEASE_EXPIRED", expiry=2.3,
               keepalive=0.6),
            ev(2.3, "w0.1", "valid", tokens={"a": 14, "c": 14}, lease=2, value=False)]
    verdict = multilock.check(CLEAN + lost, CLEAN_DATA)
    assert verdict.ok, verdict.text()
    assert (verdict.grants, verdict.names_granted) == (3, 6)


def test_multilock_checker_finds_a_holder_missing_a_name() -> None:
    """A holder that released name a and then wrote a and b, whose rows were stored, is missing a name."""
    early = hold(0.0, "w0.1", {"a": 10, "b": 11}, release=False)
    early.insert(2, ev(0.15, "w0.1", "release", result="invoke", tokens={"a": 10}, lease=1))
    stored = data([("a", 10, "w0.1", 1), ("b", 11, "w0.1", 1)])
    assert multilock.check(early, stored).kinds() == {"missing-name", "grant-tokens"}


def test_multilock_checker_finds_two_holders_of_one_name_and_a_stale_token_accepted() -> None:
    """A grant of b (token 11) while w0.1 holds it (token 10, never released nor lost), and a stored write of b
    with token 10 committed after token 11's, are violations of the per-name lock checks."""
    events = [*hold(0.0, "w0.1", {"a": 10, "b": 10}, release=False), *hold(0.5, "w1.1", {"b": 11, "c": 11})]
    stored = data([("a", 10, "w0.1", 1), ("b", 11, "w1.1", 1), ("b", 10, "w0.1", 2), ("c", 11, "w1.1", 1)])
    kinds = multilock.check(events, stored).kinds()
    assert {"overlap", "token-order"} <= kinds, kinds


def test_multilock_checker_finds_a_grant_without_a_name_and_writes_without_their_grant() -> None:
    """A grant missing a name asked for, a stored write of a name with a token no grant gave, an accepted write
    without its row (while its grant's other row, same token and value, is there), and a grant whose stored
    writes are only part of its names are each reported."""
    short = [ev(0.0, "w0.1", "acquire", result="invoke", names=["a", "b"]),
             ev(0.1, "w0.1", "acquire", result="ok", names=["a", "b"], tokens={"a": 10}, lease=1, ttl=2.0)]
    assert multilock.check(short, None).kinds() == {"grant-names"}
    unheld = data([("a", 10, "w0.1", 1), ("b", 10, "w0.1", 1), ("b", 12, "w1.1", 2), ("c", 12, "w1.1", 1),
                   ("c", 13, "w2.1", 2)])
    assert "unheld-write" in multilock.check(CLEAN, unheld).kinds()
    lost_row = data([("b", 10, "w0.1", 1), ("b", 12, "w1.1", 2), ("c", 12, "w1.1", 1)])  # a's row (token 10) is not
    assert "unrecorded-write" in multilock.check(CLEAN, lost_row).kinds()  # there, b's of the same token and value is
    partial = [e for e in CLEAN if not (e["op"] == "write" and e["record"] == "c")]
    assert "partial-write" in multilock.check(partial, data(
        [("a", 10, "w0.1", 1), ("b", 10, "w0.1", 1), ("b", 12, "w1.1", 2)])).kinds()
