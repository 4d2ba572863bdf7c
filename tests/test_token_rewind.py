"""A coordinator with a data directory refuses to grant below the highest token it handed out (issue 25, item 7).

The input: etcd restored from a snapshot, with the same cluster token, while
every coordinator was stopped (a full-cluster restore). Nothing in etcd shows
it; a coordinator without a data directory then grants a token at or below
one it handed out before (the issue's "8 after 105"). One started with the
same ``data_dir`` reads its kept mark (``tokens.json``) and refuses with
UNAVAILABLE/DATA_LOSS, naming the file and ``recover-tokens``; after ``fencepost
admin recover-tokens --above N`` every grant is above N. Real etcd (the test's
own, restored with ``etcdutl``), real coordinators and clients; the unit tests
of :class:`~fencepost.coordinator.recipes.high_water.HighWaterFile` use real files.
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import fencepost.client as fc
from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.recipes.high_water import FILE_NAME, HighWaterFile

from .child_processes import LISTENING, ChildProcess, child_env
from .conftest import wait_for
from .etcd_restore import (NOT_SERVING, SERVING, assert_data_loss, cycles, health_is, own_etcd, recover_cli,
                           refused, restore, snapshot_save)

__all__ = ["own_etcd"]  # the fixture, from tests/etcd_restore.py


async def started(etcd: EmbeddedEtcd, prefix: str, data_dir: Path | None) -> Coordinator:
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, data_dir=data_dir)
    await asyncio.wait_for(coordinator.start(), 20)
    return coordinator


async def test_unattended_restore_when_the_coordinator_kept_its_mark_then_it_refuses_until_recovered(
        own_etcd: EmbeddedEtcd, prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The issue's input, end to end: restore (same cluster token) while every coordinator is stopped.

    A restart alone refuses nothing. After the restore a coordinator without a
    data directory grants a token at or below the highest handed out (what the
    issue saw); the one with its data directory refuses every grant
    (DATA_LOSS, health NOT_SERVING, the file named), publishes its mark so that
    the other one refuses too, and both grant above N after ``recover-tokens``;
    a restart after that serves at once.
    """
    caplog.set_level(logging.INFO, logger="fencepost.coordinator")
    data_dir = tmp_path / "coordinator"
    data_dir.mkdir()
    first = await started(own_etcd, prefix, data_dir)
    try:
        early = await cycles(first.address, "inv:1", 2)
        snapshot_save(own_etcd, tmp_path / "snap.db")  # the backup the operator restores later
        issued = early + await cycles(first.address, "inv:1", 50)
    finally:
        await asyncio.wait_for(first.stop(0), 20)
    top = max(issued)
    assert issued == sorted(set(issued)) and top > 100, issued
    kept = json.loads((data_dir / FILE_NAME).read_text())
    assert kept["format"] == 1 and kept["high"][prefix] >= top, kept

    again = await started(own_etcd, prefix, data_dir)  # a restart alone: no refusal, tokens go on rising
    try:
        assert again.high_water is not None and again.high_water.recorded >= top
        after_restart = await cycles(again.address, "inv:1", 2)
        assert min(after_restart) > top
        top = max(after_restart)
    finally:
        await asyncio.wait_for(again.stop(0), 20)

    await asyncio.to_thread(restore, own_etcd, tmp_path / "snap.db")  # same cluster token: same cluster id

    forgetful = await started(own_etcd, prefix, None)
    try:
        rewound = await cycles(forgetful.address, "inv:1", 1)
        assert rewound[0] <= top, (rewound, top)  # the issue: no coordinator can tell from etcd alone
        print(f"unattended restore: without a data directory token {rewound[0]} after {top} was handed out")

        keeper = await started(own_etcd, prefix, data_dir)
        try:
            err = await refused(keeper.address, "Acquire", lock_pb2.AcquireRequest(name="inv:1", lease_id=1))
            assert_data_loss(err)
            assert str(data_dir / FILE_NAME) in (err.details() or ""), err.details()
            assert_data_loss(await refused(keeper.address, "LeaseGrant", lock_pb2.LeaseGrantRequest(ttl_seconds=5)))
            await wait_for(lambda: health_is(keeper.address, NOT_SERVING), 10, 0.05, "health NOT_SERVING")
            errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
            assert any("tokens would go back" in e and str(data_dir / FILE_NAME) in e for e in errors), errors
            with pytest.raises(fc.DataLoss):
                await cycles(keeper.address, "inv:1", 1)
            # Its mark, published in the token record, stops the coordinator without a data directory too.
            await wait_for(lambda: forgetful.tokens is not None and forgetful.tokens.refusing is not None, 10, 0.05,
                           "the other coordinator to read the published mark")
            assert_data_loss(await refused(forgetful.address, "Acquire",
                                           lock_pb2.AcquireRequest(name="inv:1", lease_id=1)))

            out = recover_cli(own_etcd, prefix, top)
            assert out.startswith("tokens recovered at etcd revision"), out
            await wait_for(lambda: health_is(keeper.address, SERVING), 10, 0.05, "health SERVING after recovery")
            await wait_for(lambda: health_is(forgetful.address, SERVING), 10, 0.05, "the other one SERVING")
            granted = await cycles(keeper.address, "inv:1", 2) + await cycles(forgetful.address, "inv:1", 2)
            assert min(granted) > top and granted == sorted(set(granted)), (granted, top)
            print(f"with its data directory: refused until recover-tokens --above {top}, then tokens {granted}")
        finally:
            await asyncio.wait_for(keeper.stop(0), 20)
    finally:
        await asyncio.wait_for(forgetful.stop(0), 20)

    # Restarted after the recovery, with a mark that includes the new floor: it serves at once, and no answer
    # read before its first look at the token record (its floor still 0) is taken for a rewind.
    errors_before = sum(r.levelno == logging.ERROR for r in caplog.records)
    last = await started(own_etcd, prefix, data_dir)
    try:
        assert last.tokens is not None and last.tokens.floor == 0 and last.high_water is not None
        assert last.high_water.recorded > top  # its own grants after the recovery (the other one granted more)
        assert min(await cycles(last.address, "inv:1", 2)) > max(granted)
        assert last.tokens.refusing is None and last.tokens.floor > 0
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR][errors_before:]
        assert errors == [], errors
    finally:
        await asyncio.wait_for(last.stop(0), 20)


async def test_serve_when_workers_share_a_data_dir_then_the_mark_survives_a_kill(etcd: EmbeddedEtcd, prefix: str,
                                                                                  tmp_path: Path) -> None:
    """`fencepost serve --etcd-endpoints ... --data-dir D --workers 2`: the workers share D/tokens.json, which
    holds the granted tokens' mark before any shutdown (a SIGKILL loses nothing older than an interval); the
    serve started again after the kill serves at once, above it."""
    data_dir = tmp_path / "coordinator"
    argv = [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0", "--etcd-endpoints",
            etcd.endpoint, "--prefix", prefix, "--data-dir", str(data_dir), "--workers", "2", "--drain-seconds", "0"]
    first = ChildProcess(argv, log_path=tmp_path / "serve-1.log")
    second: ChildProcess | None = None
    try:
        match = await first.await_line(LISTENING, 60)
        assert any(f"highest token kept in {data_dir / FILE_NAME}" in line for line in first.output), first.output
        tokens = await cycles(f"127.0.0.1:{match.group(2)}", "kept", 6)

        def kept() -> int:
            try:
                return int(json.loads((data_dir / FILE_NAME).read_text())["high"].get(prefix, 0))
            except FileNotFoundError:
                return 0
        await wait_for(lambda: kept() >= max(tokens), 10, 0.05, "the workers' mark in tokens.json")
        first.kill()  # SIGKILL, no shutdown
        second = ChildProcess(argv, log_path=tmp_path / "serve-2.log")
        match = await second.await_line(LISTENING, 60)
        assert min(await cycles(f"127.0.0.1:{match.group(2)}", "kept", 2)) > max(tokens)
        assert second.terminate(30) == 0
        assert kept() > max(tokens)
    finally:
        first.kill()
        if second is not None:
            second.kill()


def test_serve_when_data_dir_with_etcd_endpoints_is_a_file(tmp_path: Path) -> None:
    """With --etcd-endpoints, a --data-dir that is a file exits 2 with one line naming it, before anything starts."""
    (tmp_path / "a-file").write_text("not a directory")
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                             "--etcd-endpoints", "127.0.0.1:1", "--data-dir", str(tmp_path / "a-file")],
                            capture_output=True, text=True, timeout=30, env=child_env())
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert f"--data-dir {tmp_path / 'a-file'} is not a directory" in result.stderr, result.stderr


# ---------------------------------------------------------------- unit: the file


async def test_high_water_when_marks_rise_then_written_coalesced_and_last_one_at_close(tmp_path: Path) -> None:
    """10,000 rises within one interval cost a few writes, not 10,000; close() writes the last one."""
    writes: list[int] = []

    class Counted(HighWaterFile):
        def _write(self, value: int) -> None:
            writes.append(value)
            super()._write(value)

    kept = Counted(tmp_path / FILE_NAME, "/p/", interval=0.5)
    assert kept.load() == 0
    kept.start()
    for level in range(1, 10_001):
        kept.advance(level)
    await wait_for(lambda: kept.written >= 1, 5, 0.01, "the first write")
    kept.advance(20_000)
    await kept.close()
    assert kept.written == 20_000 and len(writes) <= 3, writes
    assert json.loads((tmp_path / FILE_NAME).read_text()) == {"format": 1, "high": {"/p/": 20_000}}
    assert HighWaterFile(tmp_path / FILE_NAME, "/p/").load() == 20_000


async def test_high_water_when_two_share_the_file_then_each_prefix_keeps_its_highest(tmp_path: Path) -> None:
    """Two coordinators (workers, or other prefixes) in one directory merge their marks; no mark goes down."""
    path = tmp_path / FILE_NAME
    a, b, a_again = HighWaterFile(path, "/a/"), HighWaterFile(path, "/b/"), HighWaterFile(path, "/a/")
    for kept in (a, b, a_again):
        kept.load()
    a.advance(500)
    b.advance(70)
    a_again.advance(300)  # another worker of prefix /a/ that saw less
    for kept in (a, b, a_again):
        await kept.close()
    assert json.loads(path.read_text())["high"] == {"/a/": 500, "/b/": 70}
    assert HighWaterFile(path, "/a/").load() == 500


@pytest.mark.parametrize("text", ["", "{", "[]", '{"format": 2, "high": {}}', '{"format": 1, "high": {"/p/": -1}}',
                                  '{"format": 1, "high": {"/p/": "9"}}', '{"format": 1}'])
def test_high_water_when_the_file_is_not_a_mark_file_then_load_names_it(tmp_path: Path, text: str) -> None:
    """A file that is not a mark file is refused with its path and what to do, never read as 0."""
    (tmp_path / FILE_NAME).write_text(text)
    with pytest.raises(ValueError) as info:
        HighWaterFile(tmp_path / FILE_NAME, "/p/").load()
    assert str(tmp_path / FILE_NAME) in str(info.value) and "delete it" in str(info.value)


async def test_coordinator_start_when_its_mark_file_is_garbled_then_runtime_error(etcd: EmbeddedEtcd, prefix: str,
                                                                                   tmp_path: Path) -> None:
    """``fencepost serve`` exits 1 with the file named rather than serve without its mark."""
    (tmp_path / FILE_NAME).write_text("not json")
    coordinator = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, data_dir=tmp_path)
    with pytest.raises(RuntimeError) as info:
        await coordinator.start()
    await coordinator.stop(0)
    assert str(tmp_path / FILE_NAME) in str(info.value)


# ---------------------------------------------------------------- the documented procedure

#: The first etcd 3.5 release whose etcdutl restores with --bump-revision and --mark-compacted (etcd
#: CHANGELOG-3.5.md, v3.5.10: "Add optional --bump-revision and --mark-compacted flag to etcdutl snapshot
#: restore operation", etcd-io/etcd#16165); 3.6.0 has them from etcd-io/etcd#16029.
BUMP_REVISION_SINCE = (3, 5, 10)


def test_the_restore_procedure_bumps_revisions_where_the_etcd_release_has_it() -> None:
    """docs/deploy.md restores with etcd's own revision bump; every etcd the deployments allow has it, the
    bundled 3.5.1 has not (so the tests here restore without it and rely on the token floor)."""
    from .deploy_files import MIN_ETCD
    from .etcd_restore import BIN

    docs = (Path(__file__).resolve().parent.parent / "docs" / "deploy.md").read_text()
    section = docs[docs.index("## Restoring etcd from a snapshot"):docs.index("## Production checklist")]
    restore_command = section[section.index("etcdutl snapshot restore FILE"):]
    restore_command = restore_command[:restore_command.index("```")]
    assert "--bump-revision 1000000000 --mark-compacted" in restore_command, restore_command
    assert "fencepost admin recover-tokens" in section and "--data-dir" in section
    assert MIN_ETCD >= BUMP_REVISION_SINCE, MIN_ETCD
    bundled = subprocess.run([str(BIN / "etcdutl"), "snapshot", "restore", "--help"], capture_output=True, text=True,
                             timeout=30)
    assert "--initial-cluster-token" in bundled.stdout + bundled.stderr
    assert "--bump-revision" not in bundled.stdout + bundled.stderr
