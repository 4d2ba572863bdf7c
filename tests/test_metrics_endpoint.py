"""The coordinator's /metrics endpoint: its format, its port (taken, bad, closed at stop), and
``fencepost serve --metrics-listen``; a health Watch and the lock watch counted through an etcd outage."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process import main as serve
from fencepost.coordinator.process.coordinator import Coordinator
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.interceptor import GO_DEFAULT_BUCKETS

from .conftest import LISTENING, ChildProcess, child_env, wait_for
from .metrics_scrape import HEALTH, scrape
from .owned_stub import OwnedStub

METRICS_LINE = r"fencepost: metrics on http://(\S+)/metrics"


async def test_metrics_endpoint_format_and_stop(etcd: EmbeddedEtcd, prefix: str) -> None:
    """go-grpc-prometheus's help texts and buckets, the process and platform collectors, no ``_created``
    series; ``stop()`` closes the port."""
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    await coord.start()
    try:
        assert coord.metrics_address is not None
        port = int(coord.metrics_address.rsplit(":", 1)[1])
        s = await scrape(coord.metrics_address)
        helps = {name: s.families[name].documentation for name in (
            "grpc_server_started", "grpc_server_handled", "grpc_server_msg_received", "grpc_server_msg_sent",
            "grpc_server_handling_seconds")}
        assert helps == {
            "grpc_server_started": "Total number of RPCs started on the server.",
            "grpc_server_handled": "Total number of RPCs completed on the server, regardless of success or failure.",
            "grpc_server_msg_received": "Total number of RPC stream messages received on the server.",
            "grpc_server_msg_sent": "Total number of gRPC stream messages sent by the server.",
            "grpc_server_handling_seconds": "Histogram of response latency (seconds) of gRPC that had been "
                                            "application-level handled by the server.",
        }
        bounds = [le for (name, labels) in s.samples if name == "grpc_server_handling_seconds_bucket"
                  and ("grpc_method", "Acquire") in labels for k, le in labels if k == "le"]
        assert sorted(bounds, key=float) == [*(str(float(b)) for b in GO_DEFAULT_BUCKETS), "+Inf"]
        assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info"} <= set(s.families)
        assert not [name for name, _ in s.samples if name.endswith("_created")]
        assert "grpc_server_started_created" not in s.text
        # Prometheus's ?name[]= selection, of our metrics and of a standard collector's.
        some = await scrape(coord.metrics_address, "?name[]=fencepost_grants_total&name[]=process_cpu_seconds_total")
        assert {name for name, _ in some.samples} == {"fencepost_grants_total", "process_cpu_seconds_total"}
    finally:
        await coord.stop(grace=0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as again:  # what a new coordinator would do: bind and listen on that port
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


async def test_start_when_metrics_port_is_taken(etcd: EmbeddedEtcd, prefix: str) -> None:
    """A taken metrics port stops the start with a clear error before anything else is bound."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen=f"127.0.0.1:{port}")
        with pytest.raises(RuntimeError, match=f"cannot serve metrics on 127.0.0.1:{port}: Address already in use"):
            await coord.start()
        assert coord.port == 0  # the gRPC port was never bound
        await coord.stop(0)


def test_coordinator_refuses_a_bad_metrics_address(etcd: EmbeddedEtcd) -> None:
    """``metrics_listen`` must be HOST:PORT, checked when the Coordinator is made."""
    with pytest.raises(ValueError, match="not HOST:PORT"):
        Coordinator([etcd.endpoint], listen="127.0.0.1:0", metrics_listen="127.0.0.1")


@pytest.mark.parametrize("value", ["9464", "localhost", "127.0.0.1:99999", ""])
def test_serve_when_metrics_listen_is_bad(value: str, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad --metrics-listen, as a flag or as FENCEPOST_METRICS_LISTEN, exits 2 naming the flag."""
    monkeypatch.delenv("FENCEPOST_METRICS_LISTEN", raising=False)
    assert serve.main(["--etcd-endpoints", "127.0.0.1:2379", "--metrics-listen", value]) == 2
    assert f"--metrics-listen is {value!r}; must be HOST:PORT" in capsys.readouterr().err
    monkeypatch.setenv("FENCEPOST_METRICS_LISTEN", value)
    assert serve.main(["--etcd-endpoints", "127.0.0.1:2379"]) == 2
    assert f"--metrics-listen is {value!r}; must be HOST:PORT" in capsys.readouterr().err


def _etcds_on(data_dir: Path) -> list[int]:
    """The pids of live etcd processes whose data is in ``data_dir``."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and state != "Z" and Path(os.fsdecode(args[0])).name == "etcd" \
                and os.fsencode(data_dir / "data") in args:
            pids.append(int(entry.name))
    return pids


def test_serve_when_metrics_port_is_in_use(tmp_path: Path) -> None:
    """``fencepost serve`` whose metrics port is taken exits 1 with one clear line, its embedded etcd stopped."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
             "--data-dir", str(tmp_path), "--metrics-listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, env=child_env())
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"cannot listen on 127.0.0.1:{port} (--metrics-listen): address already in use" in done.stderr
    assert "listening on" not in done.stdout
    assert _etcds_on(tmp_path) == []


async def test_serve_with_metrics_listen(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """``fencepost serve --metrics-listen`` says where, serves /metrics, and exits 0 on SIGTERM."""
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                          "--etcd-endpoints", etcd.endpoint, "--prefix", prefix, "--metrics-listen", "127.0.0.1:0"],
                         log_path=tmp_path / "serve.log")
    try:
        await child.await_line(LISTENING, 30)
        address = (await child.await_line(METRICS_LINE, 10)).group(1)
        s = await scrape(address)
        assert s.call("grpc_server_started_total", "Acquire") == 0
        assert s.value("fencepost_grants_total", prefix="") == 0
        assert s.value("process_open_fds") is not None
        child.signal(signal.SIGTERM)
        assert await asyncio.to_thread(child.proc.wait, 30) == 0
    finally:
        child.kill()


async def test_health_watch_and_lock_watch_through_an_etcd_outage(tmp_path: Path, prefix: str,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """With the interceptor installed, a health Watch streams SERVING, then NOT_SERVING while etcd is down, then
    SERVING; each message counted as sent; the lock watch's restarts counted once per restart."""
    caplog.set_level(logging.DEBUG, logger="fencepost.coordinator")
    own_etcd = EmbeddedEtcd(tmp_path / "etcd")
    await asyncio.to_thread(own_etcd.start)
    coord = Coordinator([own_etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, metrics_listen="127.0.0.1:0")
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    try:
        await asyncio.wait_for(coord.start(), 20)
        async with grpc.aio.insecure_channel(coord.address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            seen = []

            async def next_status(want: int) -> None:
                while not seen or seen[-1] != want:
                    seen.append((await asyncio.wait_for(watch.read(), 30)).status)

            await next_status(serving)
            await asyncio.to_thread(own_etcd.stop)
            await next_status(not_serving)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await OwnedStub(channel).LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5),
                                                                        timeout=15)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            await asyncio.to_thread(own_etcd.start)
            await next_status(serving)
            await wait_for(lambda: any("lock watch running again" in r.getMessage() for r in caplog.records), 30,
                           0.05, "the lock watch to run again")

            async def sent_all() -> bool:
                s = await scrape(coord.metrics_address)
                return s.call("grpc_server_msg_sent_total", "Watch", "server_stream", HEALTH) == len(seen)

            await wait_for(sent_all, 10, 0.02, f"{len(seen)} Watch messages counted")
            s = await scrape(coord.metrics_address)
            assert s.call("grpc_server_started_total", "Watch", "server_stream", HEALTH) == 1
            assert s.handled("Watch", "server_stream", HEALTH) == {}  # still open
            restarts = [r for r in caplog.records if r.name == "fencepost.coordinator.recipes.watch"
                        and ("failed" in r.getMessage() or "failing" in r.getMessage())]
            assert restarts and s.value("fencepost_watch_restarts_total") == len(restarts)
            assert s.value("fencepost_etcd_errors_total", operation="health", code="Unavailable")
            assert s.handled("LeaseGrant") == {"Unavailable": 1}
            assert s.by("fencepost_refusals_total", "reason") == {"ETCD_UNAVAILABLE": 1}
            # A LeaseGrant is never re-sent: one etcd error.
            assert s.value("fencepost_etcd_errors_total", operation="lease_grant", code="Unavailable") == 1
            watch.cancel()

            async def cancelled() -> bool:
                s = await scrape(coord.metrics_address)
                return s.handled("Watch", "server_stream", HEALTH) == {"Canceled": 1}

            await wait_for(cancelled, 10, 0.02, "the Watch counted Canceled")
    finally:
        await asyncio.wait_for(coord.stop(grace=0), 20)
        await asyncio.to_thread(own_etcd.stop)
