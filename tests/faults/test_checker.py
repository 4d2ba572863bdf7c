"""The checker on hand-made histories: each kind of violation is detected, a clean run passes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.checker import check
from tests.harness.history import Event, History, merge, read


def ev(t: float, proc: str, op: str, **fields: Any) -> Event:
    return {"t": t, "proc": proc, "op": op, **fields}


def hold(t: float, proc: str, token: int, value: int, *, name: str = "counter-0", write: str = "accepted",
         lease: int = 1, ttl: int = 3) -> list[Event]:
    """One full worker iteration starting at ``t`` (acquire .. release), 0.1 s per step."""
    out = [
        ev(t, proc, "acquire", result="invoke", name=name),
        ev(t + 0.1, proc, "acquire", result="ok", name=name, token=token, lease=lease, ttl=ttl),
        ev(t + 0.2, proc, "claim", result="accepted", name=name, record=name, token=token),
        ev(t + 0.3, proc, "read", name=name, record=name, token=token, value=value - 1),
        ev(t + 0.4, proc, "valid", name=name, token=token, lease=lease, value=True),
        ev(t + 0.5, proc, "write", result="invoke", name=name, record=name, token=token, value=value),
    ]
    if write:
        out.append(ev(t + 0.6, proc, "write", result=write, name=name, record=name, token=token, value=value))
    out += [
        ev(t + 0.7, proc, "release", result="invoke", name=name, token=token, lease=lease),
        ev(t + 0.8, proc, "release", result="ok", name=name, token=token, lease=lease),
    ]
    return out


def audit(*rows: tuple[str, int, int, int]) -> list[dict[str, Any]]:
    return [{"seq": i + 1, "record": "counter-0", "worker": w, "token": tok, "old": old, "new": new}
            for i, (w, tok, old, new) in enumerate(rows)]


def clean() -> tuple[list[Event], dict[str, Any]]:
    events = hold(0.0, "w0.1", 10, 1) + hold(1.0, "w1.1", 12, 2)
    data = {"records": {"counter-0": {"value": 2, "token": 12}},
            "audit": audit(("w0.1", 10, 0, 1), ("w1.1", 12, 1, 2))}
    return events, data


def test_check_when_the_run_is_clean() -> None:
    """A history of two orderly holds and matching data has no violation, and its figures add up."""
    events, data = clean()
    report = check(events, data)
    assert report.ok, report.text()
    assert report.writes["accepted"] == 2 and report.grants == 2
    assert report.operations["acquire"] == 2


def test_check_when_an_accepted_write_carries_a_lower_token() -> None:
    """A commit with a token lower than the previous commit's is a token-order violation."""
    events = hold(0.0, "w0.1", 12, 1) + hold(1.0, "w1.1", 10, 2)
    data = {"records": {"counter-0": {"value": 2, "token": 12}},
            "audit": audit(("w0.1", 12, 0, 1), ("w1.1", 10, 1, 2))}
    assert "token-order" in check(events, data).kinds()


def test_check_when_an_increment_is_lost() -> None:
    """Two accepted writes of the same new value: a lost update, and the counter is short."""
    events = hold(0.0, "w0.1", 10, 1) + hold(1.0, "w1.1", 12, 1)
    data = {"records": {"counter-0": {"value": 1, "token": 12}},
            "audit": audit(("w0.1", 10, 0, 1), ("w1.1", 12, 0, 1))}
    kinds = check(events, data).kinds()
    assert {"lost-update", "counter"} <= kinds


def test_check_when_an_increment_is_doubled() -> None:
    """A final value above the number of accepted increments is a counter violation."""
    events, data = clean()
    data["records"]["counter-0"]["value"] = 3
    assert "counter" in check(events, data).kinds()


def test_check_when_an_accepted_write_is_missing_from_the_data() -> None:
    """A write the history calls accepted but the audit lacks is reported."""
    events, data = clean()
    data["audit"] = data["audit"][:1]
    data["records"]["counter-0"]["value"] = 1
    assert "unrecorded-write" in check(events, data).kinds()


def test_check_when_a_stale_write_reached_the_data() -> None:
    """A write recorded as rejected (stale) that is in the audit is a phantom write."""
    events = hold(0.0, "w0.1", 10, 1) + hold(1.0, "w1.1", 12, 2, write="stale")
    data = {"records": {"counter-0": {"value": 2, "token": 12}},
            "audit": audit(("w0.1", 10, 0, 1), ("w1.1", 12, 1, 2))}
    assert "phantom-write" in check(events, data).kinds()


def test_check_when_an_indeterminate_write_committed() -> None:
    """A write whose worker died before recording the outcome may be in the audit: no violation."""
    events = hold(0.0, "w0.1", 10, 1) + hold(1.0, "w1.1", 12, 2, write="")
    events.append(ev(1.65, "driver", "nemesis", kind="kill", target="w1.1"))
    data = {"records": {"counter-0": {"value": 2, "token": 12}},
            "audit": audit(("w0.1", 10, 0, 1), ("w1.1", 12, 1, 2))}
    report = check(events, data)
    assert report.ok, report.text()
    assert report.writes["indeterminate"] == 1


def test_check_when_a_later_grant_has_a_lower_token() -> None:
    """An acquire invoked after another grant returned must get a larger token."""
    events = hold(0.0, "w0.1", 12, 1) + hold(1.0, "w1.1", 10, 2)
    assert "grant-order" in check(events, None).kinds()


def test_check_when_a_token_is_granted_twice() -> None:
    """Two grants of one name with the same token are a grant-order violation."""
    events = hold(0.0, "w0.1", 10, 1) + hold(1.0, "w1.1", 10, 2)
    assert "grant-order" in check(events, None).kinds()


def test_check_when_the_loss_notice_is_late() -> None:
    """A loss notice more than e after the estimated expiry (process not frozen) is late."""
    events, data = clean()
    events.append(ev(0.75, "w0.1", "lost", name="counter-0", token=10, lease=1, reason="DEADLINE",
                     expiry=0.1, keepalive=1.0))
    assert "late-notice" in check(events, data).kinds()


def test_check_when_the_loss_notice_comes_right_after_a_freeze() -> None:
    """A notice delivered within K + e of the thaw of a holder frozen past its expiry is in time."""
    events, data = clean()
    events += [
        ev(0.25, "driver", "nemesis", kind="freeze", target="w0.1", seconds=0.3),
        ev(0.55, "driver", "nemesis", kind="thaw", target="w0.1"),
        ev(0.7, "w0.1", "lost", name="counter-0", token=10, lease=1, reason="DEADLINE", expiry=0.1,
           keepalive=1.0),
    ]
    report = check(events, data)
    assert report.ok, report.text()
    assert report.faults == {"freeze": 1}


def test_check_when_a_loss_is_notified_twice() -> None:
    """Two loss notices for one handle are reported."""
    events, data = clean()
    for t in (0.65, 0.66):
        events.append(ev(t, "w0.1", "lost", name="counter-0", token=10, lease=1, reason="DEADLINE",
                         expiry=0.6, keepalive=1.0))
    assert "double-notice" in check(events, data).kinds()


def test_check_when_a_handle_is_valid_after_its_loss_notice() -> None:
    """is_valid() True after the handle's loss notice is reported."""
    events, data = clean()
    events += [
        ev(0.35, "w0.1", "lost", name="counter-0", token=10, lease=1, reason="LEASE_EXPIRED", expiry=0.4,
           keepalive=1.0),
        ev(0.45, "w0.1", "valid", name="counter-0", token=10, lease=1, value=True),
    ]
    assert "valid-after-loss" in check(events, data).kinds()


def test_check_when_the_next_grant_comes_before_the_holder_knows() -> None:
    """A grant returning while the previous holder neither released nor learnt of its loss is an overlap."""
    events = hold(0.0, "w0.1", 10, 1)
    events = [e for e in events if e["op"] != "release"]  # w0 keeps believing it holds
    events += hold(0.5, "w1.1", 12, 2)
    data = {"records": {"counter-0": {"value": 2, "token": 12}},
            "audit": audit(("w0.1", 10, 0, 1), ("w1.1", 12, 1, 2))}
    assert "overlap" in check(events, data).kinds()


def test_history_round_trip_skips_a_torn_line(tmp_path: Any) -> None:
    """Histories are JSON lines in timestamp order; a torn last line (a killed writer) is skipped."""
    with History(tmp_path / "a.jsonl", "w0.1") as a, History(tmp_path / "b.jsonl", "w1.1") as b:
        a.record("start", pid=1)
        b.record("start", pid=2)
        a.record("acquire", result="invoke", name="x")
        with pytest.raises(ValueError):
            a.record("bogus")
    with open(tmp_path / "b.jsonl", "a") as f:
        f.write('{"t": 1.0, "proc"')
    assert len(read(tmp_path / "b.jsonl")) == 1
    merged = merge([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert [e["proc"] for e in merged] == ["w0.1", "w1.1", "w0.1"]
    assert [e["t"] for e in merged] == sorted(e["t"] for e in merged)


def test_check_when_the_handle_was_lost_before_its_acquire_returned() -> None:
    """A handle born lost (its lease expired while the acquire ran) is notified in time at its birth."""
    events, data = clean()
    events.append(ev(0.45, "w0.1", "lost", name="counter-0", token=10, lease=1, reason="DEADLINE", expiry=-2.0,
                     keepalive=1.0))
    report = check(events, data)
    assert report.ok, report.text()
