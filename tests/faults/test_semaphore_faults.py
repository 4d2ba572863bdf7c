"""Semaphore under faults (issue 13): N = 3 permits, 10 contending worker processes, permit holders frozen past
their lease and killed; the history is checked per slot (tests/harness/semaphore.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.harness import semaphore

from .conftest import SOAK


def test_semaphore_at_most_n_holders_and_per_slot_fencing_under_holder_faults(
    coordinator_process: Any, tmp_path: Path
) -> None:
    """At most 3 valid holders at a time, per-slot tokens strictly increasing, no stale write accepted, while a
    nemesis SIGSTOPs permit holders past their lease and SIGKILLs them; the nemesis must have hit holders and a
    stale write must have been refused (so that this test could fail)."""
    address = coordinator_process.start()
    result = semaphore.run(address, tmp_path / "sem", workers=10, permits=3, seconds=120.0 if SOAK else 20.0,
                           ttl=2.0, think=0.1, nemesis=semaphore.holder_nemesis())
    verdict = semaphore.check(result.events, result.data, name="sem", permits=3, faults=result.faults)
    print(verdict.text())
    assert verdict.ok, verdict.text()
    assert verdict.max_holders == 3, verdict.text()  # the permits were all in use at some point
    assert verdict.samples > 20, verdict.text()
    assert verdict.holder_hits >= 2, verdict.text()
    assert verdict.report.faults.get("freeze", 0) >= 1 and verdict.report.faults.get("kill", 0) >= 1, verdict.text()
    refused = verdict.report.writes["stale"] + verdict.report.writes["claims_stale"]
    assert refused >= 1, verdict.text()
    assert verdict.report.writes["accepted"] > 20, verdict.text()


def _grant(t: float, proc: str, slot: int, token: int) -> list[dict[str, Any]]:
    return [{"t": t, "proc": proc, "op": "acquire", "result": "invoke", "name": "s"},
            {"t": t + 0.01, "proc": proc, "op": "acquire", "result": "ok", "name": "s", "slot": slot, "token": token,
             "lease": 1, "ttl": 2}]


def _release(t: float, proc: str, slot: int, token: int) -> list[dict[str, Any]]:
    return [{"t": t, "proc": proc, "op": "release", "result": "invoke", "name": f"s#{slot}", "token": token}]


def test_semaphore_checker_finds_too_many_holders_and_slot_tokens_going_back() -> None:
    """The semaphore checks fail on a history with 3 holds of 2 permits, a slot out of range, a slot whose token
    went back, and a describe sample with a slot twice; a clean history passes."""
    clean = [*_grant(0.0, "a", 0, 10), *_grant(0.1, "b", 1, 11), *_release(0.5, "a", 0, 10),
             *_grant(0.6, "c", 0, 12), *_release(0.7, "b", 1, 11), *_release(0.8, "c", 0, 12)]
    assert semaphore.check(clean, None, name="s", permits=2).ok
    bad = [*_grant(0.0, "a", 0, 10), *_grant(0.1, "b", 1, 11), *_grant(0.2, "c", 2, 12),
           *_release(0.5, "a", 0, 10), *_grant(0.6, "d", 0, 9),
           {"t": 0.7, "proc": "driver", "op": "describe", "result": "ok", "holders": [[1, 2, 11], [1, 3, 11]]}]
    verdict = semaphore.check(bad, None, name="s", permits=2)
    kinds = {v.kind for v in verdict.violations} | verdict.report.kinds()
    assert {"holders", "slot-range", "describe", "grant-order"} <= kinds, verdict.text()
