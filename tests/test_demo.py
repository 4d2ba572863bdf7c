"""``fencepost demo``, run as a subprocess: the unfenced run loses B's write, the fenced run keeps it."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fencepost.client import cli
from fencepost.client.cli.demo.scenario import Event, RunRecord
from fencepost.client.cli.demo.timeline import RELEASE_WORDS, release_note, timeline
from fencepost.client.cli.common import ADDRESS_ENV

UNFENCED_LOST = "unfenced: B's write was LOST (final version 1, written by stale A)"
FENCED_KEPT = "fenced: B's write KEPT (final version 2); A's stale write rejected"
ACQUIRED = re.compile(r"^\s+\d+\.\d\ds\s+([AB])\s+acquired (\S+) with token (\d+)", re.M)

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(ADDRESS_ENV, None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "fencepost.client.cli", "demo", *args]


def check_output(rc: int, out: str, err: str, lock: str) -> None:
    """Exit 0, both verdicts, and in each run B's token above A's."""
    assert rc == 0, f"rc={rc}\n{out}\n{err}"
    assert "Traceback" not in err, err
    assert out.count(UNFENCED_LOST) == 1 and out.count(FENCED_KEPT) == 1, out  # the verdicts once, at the end
    assert out.index(UNFENCED_LOST) > out.index("final row: version 2"), out
    releases = re.findall(r"A\s+release fails \((\w+)\): (.+)$", out, re.M)
    assert len(releases) == 2 and all(why == RELEASE_WORDS[reason] for reason, why in releases), releases
    assert f"A's release failed ({' and '.join(sorted({r for r, _ in releases}))}): " in out, out
    unfenced, fenced = out.split("Run 2, fenced")
    for run in (unfenced, fenced):
        grants = {who: (name, int(token)) for who, name, token in ACQUIRED.findall(run)}
        assert set(grants) == {"A", "B"}, run
        assert grants["A"][0] == grants["B"][0] == lock
        assert grants["B"][1] > grants["A"][1], run
    assert re.search(r"A\s+writes version 1 with token \d+ \(plain UPDATE\) -> ACCEPTED", unfenced), unfenced
    assert re.search(r"A\s+writes version 1 with token \d+ \(guarded UPDATE\) -> REJECTED: StaleTokenError, "
                     r"stored token \d+", fenced), fenced
    assert "final row: version 1, written by A" in unfenced
    assert "final row: version 2, written by B" in fenced


def test_demo_on_embedded_etcd_loses_unfenced_and_keeps_fenced() -> None:
    """The README's main command: its own etcd and coordinator, SQLite; exits 0 well under a minute."""
    result = subprocess.run(_argv(), capture_output=True, text=True, env=_env(), timeout=60,
                            stdin=subprocess.DEVNULL)
    check_output(result.returncode, result.stdout, result.stderr, "inv:42")
    took = float(re.search(r"; (\d+\.\d) s in all\)", result.stdout).group(1))  # type: ignore[union-attr]
    assert took < 30, took


async def test_demo_with_target_uses_the_running_coordinator_and_plots_a_png(address: str, tmp_path: Path) -> None:
    """--target HOST:PORT runs both scenarios on an existing coordinator; --plot FILE.png draws both timelines
    into a PNG (matplotlib is in the test extra). One run for both, with the workers' shortest TTL (--ttl 1):
    each demo run takes about 8 s with the default 2 s."""
    png = tmp_path / "timeline.png"
    proc = await asyncio.create_subprocess_exec(
        *_argv("--target", address, "--plot", str(png), "--ttl", "1"), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env())
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode is not None
    text = out.decode()
    assert f"coordinator at {address}" in text
    check_output(proc.returncode, text, err.decode(), "fencepost-demo/inv:42")
    assert f"timelines drawn in {png}" in text
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_demo_plot_without_matplotlib_exits_2_before_running(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Without matplotlib, --plot fails at once with one line saying what to install."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["demo", "--plot", "x.png", "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install matplotlib" in err


def test_demo_with_dsn_without_psycopg_exits_2(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """--dsn without psycopg fails with one line saying what to install."""
    monkeypatch.setitem(sys.modules, "psycopg", None)
    assert cli.main(["demo", "--dsn", "postgresql://nowhere/x", "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "psycopg" in err


def test_demo_with_dsn_runs_on_postgresql_and_drops_its_table() -> None:
    """--dsn runs both scenarios on a real PostgreSQL (psycopg 3) and leaves no table behind (with the workers'
    shortest TTL, --ttl 1: the README's command, with the default, is the test above)."""
    import psycopg

    from tests.fencing.servers import PostgresServer

    pg = PostgresServer()
    pg.start()
    try:
        result = subprocess.run(_argv("--dsn", pg.dsn, "--ttl", "1"), capture_output=True, text=True, env=_env(),
                                timeout=90, stdin=subprocess.DEVNULL)
        check_output(result.returncode, result.stdout, result.stderr, "inv:42")
        assert "PostgreSQL table fencepost_demo_invoices" in result.stdout
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("SELECT to_regclass('fencepost_demo_invoices')").fetchone() == (None,)
    finally:
        pg.stop()


def test_demo_release_outcome_is_explained_in_one_line() -> None:
    """Stale A's release fails DEADLINE in one run and NOT_HOLDER in the other, by a race: each timeline line
    says which side answered, the one note after the verdicts says why either can happen; no verdict in the
    timelines."""
    runs = []
    for fenced, reason in ((False, "DEADLINE"), (True, "NOT_HOLDER")):
        record = RunRecord(fenced=fenced, lock="inv:42", ttl=2.0, final=(2, "b", "B"), final_token=5)
        record.events.append(Event(4.0, "A", "release_failed", {"reason": reason}))
        runs.append(record)
        lines = timeline(record)
        assert any(f"release fails ({reason}): {RELEASE_WORDS[reason]}" in line for line in lines), lines
        assert not any(record.verdict() in line for line in lines), lines
    note = release_note(runs)
    assert note is not None and "\n" not in note
    assert note.startswith("A's release failed (DEADLINE and NOT_HOLDER): ") and "a race after SIGCONT" in note
    assert release_note([RunRecord(fenced=True, lock="inv:42", ttl=2.0)]) is None
