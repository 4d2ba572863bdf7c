"""Read-write locks under faults (issue 22): 6 worker processes take one of 2 names for reading (70 %) or for
writing; writers write the name's row fenced by their token, readers claim it and read it twice; holders frozen
past their lease and killed, the coordinator restarted, the client links blackholed and cut. The history is
checked by tests/harness/rwlock.py; a mutant whose writers are admitted beside readers must fail the check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.harness import rwlock, workload
from tests.harness.history import Event
from tests.harness.nemesis import holders_and_links_nemesis
from tests.harness.proxy import Proxy

from .conftest import SOAK

MODULE = "tests.harness.rwlock"


def test_rwlock_no_writer_beside_another_holder_and_fenced_under_faults(
    coordinator_process: Any, proxy_to: Callable[[str], Proxy], tmp_path: Path
) -> None:
    """No writer certainly holding a name together with a reader or another writer, tokens of a name strictly
    increasing over every earlier grant (readers' included), no reader seeing a later writer's write while it
    held, no stale write accepted nor accepted write lost, while holders are frozen past their lease and killed,
    the coordinator restarts and the client links are blackholed and cut; readers must have held together, the
    nemesis must have hit holders and a holder must have believed it held past its lease while a conflicting
    hold operated (so that this test could fail)."""
    proxy = proxy_to(coordinator_process.start())

    def restart() -> None:
        coordinator_process.terminate()
        coordinator_process.start()

    nemesis = holders_and_links_nemesis(proxy, 2.0)
    result = workload.run(proxy.address, tmp_path / "rw", workers=6, records=2, seconds=120.0 if SOAK else 24.0,
                          ttl=2.0, think=0.3, tag="rw", nemesis=nemesis, restart_coordinator=restart, module=MODULE)
    verdict = rwlock.check(result.events, result.data, faults=result.faults)
    print(verdict.text())
    assert verdict.ok, verdict.text()
    faults, figures = verdict.report.faults, verdict.figures
    for kind in ("kill", "coordinator-restart"):
        assert faults.get(kind, 0) >= 1, verdict.text()
    assert faults.get("freeze", 0) >= 2, verdict.text()
    assert figures["holder_hits"] >= 1, verdict.text()
    assert figures["read_grants"] > 40 and figures["write_grants"] > 10, verdict.text()
    assert figures["most_readers"] >= 2, verdict.text()
    # A holder believed it held past its lease while a conflicting hold operated: the overlap the checker must
    # not report (not certain), and would report if it took the workers' view for the keys'.
    assert figures["uncertain_overlaps"] >= 1, verdict.text()
    assert verdict.report.writes["accepted"] > 10, verdict.text()


def test_rwlock_checker_fails_a_mutant_that_admits_readers_beside_a_writer(
    coordinator_process: Any, tmp_path: Path
) -> None:
    """Workers that take their write holds as readers do (readers admitted while a writer holds) are caught:
    a writer certainly holding together with a reader, or a reader seeing that writer's token while it held."""
    address = coordinator_process.start()
    result = workload.run(address, tmp_path / "mutant", workers=4, records=1, seconds=5.0, ttl=2.0, think=0.2,
                          tag="mutant", module=MODULE, worker_args=["--mutant", "--reads", "0.5"])
    verdict = rwlock.check(result.events, result.data, faults=result.faults)
    print(verdict.text())
    assert verdict.figures["write_grants"] >= 3, verdict.text()
    assert verdict.kinds() & {"writer-with-reader", "writer-with-writer", "read-under-writer"}, verdict.text()


# ---------------------------------------------------------------- the checker on written histories


def ev(t: float, proc: str, op: str, **fields: Any) -> Event:
    return {"t": t, "proc": proc, "op": op, **fields}


def grant(t: float, proc: str, mode: str, token: int, *, expiry: float | None = None, name: str = "a") -> list[Event]:
    """A grant returned at ``t + 0.1``, its lease certainly alive until ``expiry`` (default ``t + 1.5``)."""
    return [ev(t, proc, "acquire", result="invoke", name=name, mode=mode),
            ev(t + 0.1, proc, "acquire", result="ok", name=name, mode=mode, token=token, lease=1, ttl=2.0,
               expiry=t + 1.5 if expiry is None else expiry)]


def reader(t: float, proc: str, token: int, *, values: tuple[int, int] = (0, 0), stored: int | None = None,
           release: float | None = None, expiry: float | None = None) -> list[Event]:
    """A reader's hold: grant, claim accepted, two reads (at ``t + 0.3`` and ``t + 0.5``), release."""
    out = grant(t, proc, "read", token, expiry=expiry)
    out.append(ev(t + 0.2, proc, "claim", result="accepted", name="a", record="a", token=token, mode="read"))
    for dt, value in zip((0.3, 0.5), values):
        out.append(ev(t + dt, proc, "read", name="a", record="a", token=token, mode="read", value=value,
                      stored=token if stored is None else stored))
    out.append(ev(t + 0.6 if release is None else release, proc, "release", result="invoke", name="a", token=token,
                  lease=1))
    return out


def writer(t: float, proc: str, token: int, old: int, *, release: float | None = None,
           expiry: float | None = None) -> list[Event]:
    """A writer's hold: grant, claim, read ``old``, write ``old + 1`` accepted at ``t + 0.4``, release."""
    out = grant(t, proc, "write", token, expiry=expiry)
    out += [ev(t + 0.2, proc, "claim", result="accepted", name="a", record="a", token=token, mode="write"),
            ev(t + 0.25, proc, "read", name="a", record="a", token=token, mode="write", value=old),
            ev(t + 0.3, proc, "write", result="invoke", name="a", record="a", token=token, value=old + 1),
            ev(t + 0.4, proc, "write", result="accepted", name="a", record="a", token=token, value=old + 1),
            ev(t + 0.5 if release is None else release, proc, "release", result="invoke", name="a", token=token,
               lease=1)]
    return out


def data(rows: list[tuple[int, str]]) -> dict[str, Any]:
    """The store's final data of row ``a`` from its audit rows (token, worker), in commit order."""
    audit = [{"seq": i + 1, "record": "a", "token": tok, "worker": w, "old": i, "new": i + 1}
             for i, (tok, w) in enumerate(rows)]
    return {"records": {"a": {"value": len(rows), "token": rows[-1][0] if rows else None}}, "audit": audit}


# Two readers together (tokens 10, 11), then a writer (12), then a reader that sees its write (13).
CLEAN = [*reader(0.0, "r1", 10, release=0.9), *reader(0.2, "r2", 11), *writer(1.0, "w1", 12, 0),
         *reader(2.0, "r3", 13, values=(1, 1))]


def test_rwlock_checker_passes_readers_together_and_a_writer_alone() -> None:
    """Readers holding together, a writer after them and a reader after the writer: no violation, two readers
    at once."""
    verdict = rwlock.check(CLEAN, data([(12, "w1")]))
    assert verdict.ok, verdict.text()
    assert (verdict.figures["read_grants"], verdict.figures["write_grants"], verdict.figures["most_readers"]) == \
        (3, 1, 2)


def test_rwlock_checker_finds_a_writer_certainly_holding_beside_a_reader() -> None:
    """A writer granted and writing while a reader holds (reader released later, its lease certainly alive) is
    a violation; so is a second writer inside the first's hold."""
    events = [*reader(0.0, "r1", 10, release=1.5, expiry=2.0), *writer(0.5, "w1", 11, 0)]
    assert "writer-with-reader" in rwlock.check(events, data([(11, "w1")])).kinds()
    two = [*writer(0.0, "w1", 10, 0, release=1.0), *writer(0.3, "w2", 11, 1)]
    assert "writer-with-writer" in rwlock.check(two, data([(10, "w1"), (11, "w2")])).kinds()


def test_rwlock_checker_leaves_an_overlap_the_lease_may_have_ended_alone() -> None:
    """A reader that learnt of its loss late (frozen) overlaps a writer only in its own view: its lease's last
    known expiry is before the writer's grant, so the overlap is not certain and not reported; nor is one with
    a hold whose key was deleted (NOT_HOLDER) at an unknown time."""
    late = reader(0.0, "r1", 10, release=1.6, expiry=0.45)
    late.insert(-1, ev(1.55, "r1", "lost", name="a", token=10, lease=1, reason="LEASE_EXPIRED", expiry=0.45,
                       keepalive=0.6))
    events = [*late, *writer(0.5, "w1", 11, 0)]
    verdict = rwlock.check(events, data([(11, "w1")]))
    assert verdict.report.kinds() <= {"late-notice"} and not verdict.violations, verdict.text()
    assert verdict.figures["uncertain_overlaps"] == 1
    cut = reader(0.0, "r1", 10, release=1.6, expiry=2.0)
    cut.insert(-1, ev(1.55, "r1", "lost", name="a", token=10, lease=1, reason="NOT_HOLDER", expiry=2.0,
                      keepalive=0.6))
    assert not rwlock.check([*cut, *writer(0.5, "w1", 11, 0)], data([(11, "w1")])).violations


def test_rwlock_checker_finds_a_reader_seeing_a_later_writer_or_a_changed_value() -> None:
    """A reader whose read, while it certainly held, shows a later writer's token stored, or whose two reads
    after its claim differ, saw a write made while it held."""
    saw = [*writer(0.0, "w1", 12, 0, release=0.45), *reader(0.05, "r1", 10, stored=12)]
    assert "read-under-writer" in rwlock.check(saw, None).kinds()
    changed = [*reader(0.0, "r1", 10, values=(0, 1), stored=10)]
    assert rwlock.check(changed, None).kinds() == {"read-changed"}


def test_rwlock_checker_finds_a_writer_token_below_an_earlier_reader() -> None:
    """A writer invoked after a reader's grant returned, granted a lower token, breaks the token order."""
    events = [*reader(0.0, "r1", 12), *writer(1.0, "w1", 11, 0)]
    assert "grant-order" in rwlock.check(events, data([(11, "w1")])).kinds()
