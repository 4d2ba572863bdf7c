"""Leader election under faults (issue 13): 5 candidates, 2 observers, the leader SIGSTOPped or SIGKILLed.

Checked from the history (tests/harness/election.py): at most one valid leader at a time (the lock
checker's overlap rule, with its slack for frozen processes), leadership tokens strictly increasing, the
leaders' fenced writes in token order with no lost update, and every observer saw every leadership, in
order, once. The nemesis must have hit the process leading at that moment, or the run proves nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness import election

from .conftest import SOAK


def test_election_survives_a_frozen_or_killed_leader(coordinator_process: Any, tmp_path: Path) -> None:
    """With the leader frozen (0.5 T to 2 T) or killed again and again, the election's history is clean."""
    address = coordinator_process.start()
    result = election.run(address, tmp_path / "election", candidates=5, observers=2,
                          seconds=120.0 if SOAK else 13.0, ttl=2.0, leader_faults=4)
    verdict = election.check(result.events, result.data, faults=result.faults)
    print(verdict.text())
    print("election figures: " + json.dumps({"leaderships": verdict.leaderships, "leader hits": verdict.leader_hits,
                                              "faults": verdict.report.faults, "writes": verdict.report.writes,
                                              "observed": verdict.observed}))
    assert verdict.ok, verdict.text()
    assert verdict.leader_hits >= 3, verdict.text()  # the nemesis hit leaders: the run could have failed
    assert verdict.leaderships >= 10, verdict.text()
    assert verdict.report.writes["accepted"] >= 5, verdict.text()
    # An observer may see more: a leadership whose candidate was killed before it recorded its grant.
    assert all(n >= verdict.leaderships for n in verdict.observed.values()) and len(verdict.observed) == 2


def _ev(t: float, proc: str, op: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "proc": proc, "op": op, **fields}


def test_election_checker_finds_a_missed_a_repeated_and_a_reordered_leader() -> None:
    """The observers' check fails on a leadership an observer never saw, one it saw twice, and one out of order."""
    grants = [_ev(1.0, "w0.1", "acquire", result="invoke", name="leader"),
              _ev(1.1, "w0.1", "acquire", result="ok", name="leader", token=10, lease=1, ttl=2.0),
              _ev(1.5, "w0.1", "release", result="invoke", name="leader", token=10, lease=1),
              _ev(2.0, "w1.1", "acquire", result="invoke", name="leader"),
              _ev(2.1, "w1.1", "acquire", result="ok", name="leader", token=20, lease=2, ttl=2.0),
              _ev(2.5, "w1.1", "release", result="invoke", name="leader", token=20, lease=2)]
    good = [_ev(0.5, "o0", "observe", token=None), _ev(1.2, "o0", "observe", token=10, value="a"),
            _ev(1.3, "o0", "observe", token=10, value="a+"), _ev(2.2, "o0", "observe", token=20, value="b"),
            _ev(2.6, "o0", "observe", token=None)]
    assert election.check(grants + good, None).ok
    missed = [e for e in good if e.get("token") != 20]
    assert election.check(grants + missed, None).report.kinds() == {"observe-miss"}
    repeated = good[:3] + [_ev(1.35, "o0", "observe", token=10, value="a+")] + good[3:]
    assert "observe-repeat" in election.check(grants + repeated, None).report.kinds()
    back = good[:4] + [_ev(2.3, "o0", "observe", token=10, value="c")]
    assert "observe-order" in election.check(grants + back, None).report.kinds()
