"""The local deployment (deploy/local), run for real: 3 etcd members with TLS, 2 ``fencepost serve``.

The test drives the same code the user runs (``deploy/local/launch.py``,
loaded by path: ``deploy/`` is not part of the package) and, through
``run.py``, the script itself. No mocks: real etcd processes, real
coordinator processes, real clients, a real SQLite guard.

Failover, twice (the coordinator the clients' streams are on is SIGKILLed,
restarted, then the other one is): holders keep their locks and tokens, the
stream resumes on the other replica (the handle's ``deadline`` moves past
``kill time + TTL - margin``: a keepalive sent after the kill was
acknowledged), queued waiters keep their place and are granted in order with
strictly increasing tokens, no lock is held twice (the history checker of
tests/harness), and the guard refuses the older tokens.

Figures (printed as ``FIGURE`` lines, like tests/faults): seconds from the
SIGKILL to the resumed stream, p50 and max over both kills and every
stream that holds a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import re
import select
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from fencepost.client import AsyncLockClient, AsyncLockHandle, StaleTokenError, TlsConfig, TlsError
from fencepost.client.fencing import SqlGuard
from tests.conftest import REPO, ChildProcess, cli_env, wait_for
from tests.harness import checker

pytestmark = pytest.mark.slow


def _load_launch() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fencepost_deploy_local_launch", REPO / "deploy/local/launch.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


launch = _load_launch()

#: The holders' TTL: the client's reconnect ceiling is min(2 s, TTL / 6) = 1 s, with full jitter.
TTL = 6.0
HOLDERS = 4
WAITERS = 3

@pytest.fixture(scope="module", params=[False, True], ids=["etcd-tls", "etcd-tls+mtls"])
def deployment(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A started LocalDeployment (3 etcd members with TLS, 2 coordinators); every process ends after the module."""
    dep = launch.LocalDeployment(tmp_path_factory.mktemp("deploy-local"), etcd_tls=True,
                                 coordinator_tls=request.param, grace_seconds=1.0)
    try:
        dep.start()
        yield dep
    finally:
        dep.stop()
        dep.kill()


def figure(request: pytest.FixtureRequest, **figures: Any) -> None:
    """Record measured figures on the test's report and print them (as tests/faults do)."""
    for key, value in figures.items():
        text = f"{value:.3f}" if isinstance(value, float) else str(value)
        request.node.user_properties.append((key, text))
        print(f"FIGURE {request.node.name} {key}={text}")


class Run:
    """The test's history (tests/harness/history.py's event shape) and its guarded SQLite records."""

    def __init__(self, db_path: Path) -> None:
        self.events: list[dict[str, Any]] = []
        self.db = sqlite3.connect(db_path)
        self.db.execute("CREATE TABLE records (id TEXT PRIMARY KEY, writer TEXT, fencing_token BIGINT)")
        self.guard = SqlGuard(self.db, "records", "id", commit=True)

    def record(self, proc: str, op: str, **fields: Any) -> None:
        self.events.append({"t": time.monotonic(), "proc": proc, "op": op, **fields})

    async def acquire(self, proc: str, client: AsyncLockClient, name: str, timeout: float) -> AsyncLockHandle:
        self.record(proc, "acquire", result="invoke", name=name)
        h = await client.acquire(name, ttl=TTL, timeout=timeout)
        self.granted(proc, h)
        return h

    def granted(self, proc: str, h: AsyncLockHandle) -> None:
        self.record(proc, "acquire", result="ok", name=h.name, token=h.token, lease=h.lease_id, ttl=h.ttl)

    async def release(self, proc: str, h: AsyncLockHandle) -> None:
        self.record(proc, "release", result="invoke", name=h.name, token=h.token)
        await h.release()
        self.record(proc, "release", result="ok", name=h.name, token=h.token)

    def write(self, proc: str, h: AsyncLockHandle, token: int | None = None) -> None:
        """A guarded write of ``h``'s record with ``token`` (default: ``h.token``); raises StaleTokenError."""
        token = h.token if token is None else token
        self.record(proc, "write", result="invoke", record=h.name, token=token)
        try:
            self.guard.upsert(h.name, token, {"writer": proc})
        except StaleTokenError:
            self.record(proc, "write", result="stale", record=h.name, token=token)
            raise
        self.record(proc, "write", result="accepted", record=h.name, token=token)

    def stored(self, record: str) -> tuple[str, int]:
        row = self.db.execute("SELECT writer, fencing_token FROM records WHERE id = ?", (record,)).fetchone()
        return row[0], row[1]


async def resumed_after(h: AsyncLockHandle, killed_at: float) -> tuple[float, float]:
    """Wait until a keepalive of ``h``'s lease sent after ``killed_at`` was acknowledged.

    The handle's public ``deadline`` is ``send time of the last acknowledged
    keepalive + TTL - margin``: once it passes ``killed_at + TTL - margin``,
    a keepalive sent after the kill was acknowledged, by the other replica.

    Returns:
        (seconds from the kill to when that was seen, seconds from the kill
        to the acknowledged keepalive's send time).
    """
    threshold = killed_at + h.ttl - h.margin
    await wait_for(lambda: h.deadline > threshold or h.lost.is_set(), 10, interval=0.005,
                   what=f"a keepalive of {h.name} acknowledged after the kill")
    seen = time.monotonic() - killed_at
    assert not h.lost.is_set(), f"{h.name} lost across the failover: {h.lost_reason}"
    return seen, h.deadline - h.ttl + h.margin - killed_at


async def test_failover_keeps_holds_tokens_and_queue_order(deployment: Any, tmp_path: Path,
                                                           request: pytest.FixtureRequest) -> None:
    """SIGKILL of the coordinator the streams are on, twice: holds and tokens survive, the queue keeps its order."""
    dep = deployment
    run = Run(tmp_path / "records.db")
    resume_seen: list[float] = []
    resume_sent: list[float] = []
    async with contextlib.AsyncExitStack() as stack:

        async def client(addresses: list[str], into: contextlib.AsyncExitStack = stack) -> AsyncLockClient:
            return await into.enter_async_context(AsyncLockClient(addresses, **dep.client_kwargs()))

        holders: list[tuple[str, AsyncLockClient, AsyncLockHandle, int, int]] = []
        for i in range(HOLDERS):
            c = await client(dep.addresses)
            h = await run.acquire(f"h{i}", c, f"holder-{i}", timeout=10)
            run.write(f"h{i}", h)
            holders.append((f"h{i}", c, h, h.token, h.lease_id))

        for round_no in (1, 2):
            # The replica every holder's stream is on now (public: client.address); the round's
            # new clients list it first, so that their streams are on it too.
            victim_address = holders[0][1].address
            victim = dep.addresses.index(victim_address)
            survivor_address = dep.addresses[1 - victim]
            order = [victim_address, survivor_address]
            async with contextlib.AsyncExitStack() as round_stack:
                name = f"queue-{round_no}"
                first = await client(order, round_stack)
                first_h = await run.acquire(f"q{round_no}", first, name, timeout=10)
                run.write(f"q{round_no}", first_h)
                waiters: list[tuple[str, AsyncLockClient, asyncio.Task[AsyncLockHandle]]] = []
                round_stack.push_async_callback(_cancel_pending, waiters)  # on failure, before the clients close
                for k in range(WAITERS):
                    proc = f"w{round_no}.{k}"
                    wc = await client(order, round_stack)
                    run.record(proc, "acquire", result="invoke", name=name)
                    waiters.append((proc, wc, asyncio.create_task(wc.acquire(name, ttl=TTL, timeout=40))))
                    await wait_for(lambda: _waiters(first, name, k + 1), 10, what=f"{proc} queued")
                queue = (await first.describe(name)).waiters  # (lease id, queue revision), in grant order
                assert len(queue) == WAITERS
                everyone = [c for _, c, *_ in holders] + [first] + [wc for _, wc, _ in waiters]
                assert {c.address for c in everyone} == {victim_address}, "a stream is not on the victim"

                killed_at = dep.kill_coordinator(victim)
                assert dep.coordinator_pid(victim) is None
                streams = [h for _, _, h, *_ in holders] + [first_h]
                for seen, sent in await asyncio.gather(*(resumed_after(h, killed_at) for h in streams)):
                    resume_seen.append(seen)
                    resume_sent.append(sent)
                await wait_for(lambda: all(c.address == survivor_address for c in everyone), 10,
                               what="every client on the surviving replica")

                # Holders: same lease and token, still the holder in etcd, and their old token still writes.
                for proc, c, h, token, lease_id in holders:
                    assert (h.token, h.lease_id) == (token, lease_id) and h.is_valid() and not h.lost.is_set()
                    info = await c.describe(h.name)
                    assert info.held and (info.holder_token, info.holder_lease_id) == (token, lease_id), info
                    run.write(proc, h, token)
                    assert run.stored(h.name) == (proc, token)
                # The queue is the one from before the kill: same leases, same places.
                assert (await first.describe(name)).waiters == queue
                assert not any(task.done() for *_, task in waiters)

                # Hand-over down the queue: each waiter in its order, with the token of its place.
                prev_proc, prev_h = f"q{round_no}", first_h
                for k, (proc, wc, task) in enumerate(waiters):
                    await run.release(prev_proc, prev_h)
                    h = await asyncio.wait_for(task, 10)
                    run.granted(proc, h)
                    assert (h.lease_id, h.token) == queue[k], (proc, h, queue)
                    assert h.token > prev_h.token
                    assert not any(later.done() for *_, later in waiters[k + 1:]), "granted out of order"
                    assert (await wc.describe(name)).holder_token == h.token
                    run.write(proc, h)
                    with pytest.raises(StaleTokenError) as refused:
                        run.write(prev_proc, prev_h)  # the previous holder's late write
                    assert refused.value.current_token == h.token
                    assert run.stored(name) == (proc, h.token)
                    prev_proc, prev_h = proc, h
                await run.release(prev_proc, prev_h)

            restarted = await asyncio.to_thread(dep.restart_coordinator, victim)
            async with AsyncLockClient([restarted], **dep.client_kwargs()) as probe:
                # The restarted replica serves, and sees the same holder.
                assert (await probe.describe("holder-0")).holder_token == holders[0][3]

        for proc, c, h, token, _ in holders:
            assert h.token == token and h.is_valid()
            await run.release(proc, h)

    report = checker.check(run.events, None)
    assert report.ok, report.text()
    assert report.grants == HOLDERS + 2 * (1 + WAITERS)
    assert report.writes["stale"] == 2 * WAITERS
    assert run.guard.rejected == 2 * WAITERS
    figure(request, kills=2, streams_measured=len(resume_seen),
           resume_p50_s=statistics.median(resume_seen), resume_max_s=max(resume_seen),
           first_keepalive_after_kill_p50_s=statistics.median(resume_sent),
           first_keepalive_after_kill_max_s=max(resume_sent))
    # The client's reconnect ceiling is min(2 s, TTL / 6) = 1 s (full jitter); 1 s more for a loaded machine.
    assert max(resume_seen) < min(2.0, TTL / 6) + 1.0, f"a stream took {max(resume_seen):.2f} s to resume"


@pytest.mark.parametrize("deployment", [True], ids=["etcd-tls+mtls"], indirect=True)
async def test_mtls_refuses_clients_without_the_deployments_certificate(deployment: Any, tmp_path: Path) -> None:
    """With mTLS on, no certificate or one from another CA is refused at once with a TlsError naming the cause."""
    assert deployment.coordinator_tls
    files = deployment.client_tls
    other = tmp_path / "other-ca"
    subprocess.run([sys.executable, str(REPO / "deploy/certs.py"), str(other), "--client", "intruder"],
                   check=True, capture_output=True, timeout=60)
    cases = {
        "no certificate": TlsConfig(ca=files.ca),
        "another CA's certificate": TlsConfig(ca=files.ca, cert=other / "intruder.pem", key=other / "intruder.key"),
    }
    for case, tls in cases.items():
        started = time.monotonic()
        with pytest.raises(TlsError) as caught:  # at connect (or, if it got that far, at the acquire)
            async with AsyncLockClient(deployment.addresses, tls=tls, connect_timeout=30.0) as client:
                await client.acquire(f"mtls-{case}", ttl=TTL, timeout=5.0)
        took = time.monotonic() - started
        assert took < 10.0, (case, took)  # well before connect_timeout: a refused handshake is not retried
        message = str(caught.value)
        assert "client certificate" in message, (case, message)
        if case == "no certificate":
            assert "none was given" in message, message
        else:
            assert "intruder.pem" in message, message
    # ... and nothing was granted to them.
    async with AsyncLockClient(deployment.addresses, **deployment.client_kwargs()) as client:
        for case in cases:
            assert not (await client.describe(f"mtls-{case}")).held


async def _waiters(client: AsyncLockClient, name: str, n: int) -> bool:
    return (await client.describe(name)).waiter_count == n


async def _cancel_pending(waiters: list[tuple[str, AsyncLockClient, asyncio.Task[AsyncLockHandle]]]) -> None:
    tasks = [task for *_, task in waiters if not task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------- run.py, the script a user runs


def _start_script(base: Path, log: Path) -> tuple[ChildProcess, dict[str, str], list[int]]:
    """Start ``deploy/local/run.py --dir base``; returns it, the exported variables and the printed pids."""
    child = ChildProcess([sys.executable, str(REPO / "deploy/local/run.py"), "--dir", str(base)], log_path=log)
    child.wait_line(r"^running; Ctrl-C", 60)
    exported = dict(re.findall(r"^export (\w+)=(.*)$", "\n".join(child.output), re.M))
    pids = [int(p) for p in re.findall(r" pid (\d+)$", "\n".join(child.output), re.M)]
    assert len(pids) == 5, child.output
    return child, exported, pids


def _running(pids: list[int]) -> list[int]:
    """The processes of ``pids`` that still run (a zombie waiting for its reaper has ended)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def _wait_ended(pidfds: list[int], timeout: float) -> None:
    """Wait until every process of ``pidfds`` (``os.pidfd_open``) has ended, or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    waiting = list(pidfds)
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
        waiting = [fd for fd in waiting if fd not in ready]


def _kill_all(pids: list[int]) -> None:
    for pid in _running(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_run_script_serves_then_leaves_no_process_behind(tmp_path: Path) -> None:
    """run.py prints a working FENCEPOST_ADDRESS; Ctrl-C stops all 5 processes; SIGKILL of run.py takes them along."""
    base = tmp_path / "dep"
    child, exported, pids = _start_script(base, tmp_path / "run1.log")
    try:
        client_vars = ("FENCEPOST_ADDRESS", "FENCEPOST_CA", "FENCEPOST_CERT", "FENCEPOST_KEY")
        assert set(client_vars) <= set(exported), exported  # mTLS to the coordinators by default
        env = {**cli_env(), **{key: exported[key] for key in client_vars}}
        status = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "status"], env=env,
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0, status.stderr
        assert status.stdout.count(": SERVING") == 2, status.stdout
        assert exported["ETCDCTL_ENDPOINTS"].count("https://localhost:") == 3
        # A second run.py on the same directory is refused at once, and the first is untouched.
        second = subprocess.run([sys.executable, str(REPO / "deploy/local/run.py"), "--dir", str(base)],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode == 2, (second.stdout, second.stderr)
        assert "already running in" in second.stderr, second.stderr
        assert sorted(_running(pids)) == sorted(pids)
        child.signal(signal.SIGINT)
        assert child.proc.wait(timeout=30) == 0, child.log_tail()
        assert "stopped" in child.output, child.output
        assert not _running(pids), f"processes left after Ctrl-C: {_running(pids)}"
    finally:
        child.kill()
        _kill_all(pids)

    # The same directory again: the same ports; then SIGKILL of run.py itself.
    child, again, pids = _start_script(base, tmp_path / "run2.log")
    try:
        assert again["FENCEPOST_ADDRESS"] == exported["FENCEPOST_ADDRESS"]
        pidfds = [os.pidfd_open(pid) for pid in pids]
        try:
            child.proc.kill()
            child.proc.wait(timeout=10)
            _wait_ended(pidfds, 10)  # the kernel's parent-death SIGKILL (PR_SET_PDEATHSIG)
        finally:
            for fd in pidfds:
                os.close(fd)
        assert not _running(pids), f"processes left after SIGKILL of run.py: {_running(pids)}"
    finally:
        child.kill()
        _kill_all(pids)
