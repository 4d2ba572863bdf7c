"""The test proxy itself, and F10: transport keepalive settings on both hops."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fencepost.client import AsyncLockClient
from fencepost.client._transport import wire as _wire
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from tests.harness.proxy import Direction, Proxy

from .conftest import SOAK, SOAK_MINUTES, log_figure

# ---------------------------------------------------------------- the proxy itself


@pytest.fixture
def echo_server() -> Iterator[str]:
    """A plain-socket echo server on loopback; yields its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    stop = threading.Event()
    conns: list[socket.socket] = []

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    def echo(conn: socket.socket) -> None:
        try:
            while data := conn.recv(65536):
                conn.sendall(data)
        except OSError:
            pass
        finally:
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        listener.close()
        for conn in conns:
            conn.close()


def _connect(proxy: Proxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
    sock.settimeout(0.5)
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_proxy_forwards_both_ways(echo_server: str, proxy_to: Callable[[str], Proxy]) -> None:
    """In forward mode, bytes reach the server and the answer comes back."""
    proxy = proxy_to(echo_server)
    with _connect(proxy) as sock:
        sock.sendall(b"hello")
        assert _recv_exact(sock, 5) == b"hello"
    assert proxy.accepted == 1
    assert proxy.forwarded[Direction.UP] == 5 and proxy.forwarded[Direction.DOWN] >= 5


def test_proxy_blackhole_keeps_the_connection_open_and_silent(
    echo_server: str, proxy_to: Callable[[str], Proxy]
) -> None:
    """A blackhole delivers nothing and closes nothing; after healing the held bytes arrive in order."""
    proxy = proxy_to(echo_server)
    with _connect(proxy) as sock:
        proxy.blackhole()
        sock.sendall(b"one")
        with pytest.raises(TimeoutError):  # no data, and no FIN (recv would return b"") nor RST
            sock.recv(10)
        proxy.forward()
        assert _recv_exact(sock, 3) == b"one"
        # Only the server -> client direction silenced: the request goes through, the answer is held.
        proxy.blackhole(Direction.DOWN)
        sock.sendall(b"two")
        assert proxy.wait_until(lambda: proxy.forwarded[Direction.UP] == 6), proxy.forwarded
        with pytest.raises(TimeoutError):  # the echo reached the proxy but is held there
            sock.recv(10)
        proxy.forward()
        assert _recv_exact(sock, 3) == b"two"


def test_proxy_blackhole_drop_discards_bytes(echo_server: str, proxy_to: Callable[[str], Proxy]) -> None:
    """With drop=True the silenced bytes are read and thrown away, never delivered."""
    proxy = proxy_to(echo_server)
    with _connect(proxy) as sock:
        proxy.blackhole(Direction.UP, drop=True)
        sock.sendall(b"lost")
        assert proxy.wait_until(lambda: proxy.dropped[Direction.UP] == 4), proxy.dropped
        proxy.forward()
        sock.sendall(b"kept")
        assert _recv_exact(sock, 4) == b"kept"


def test_proxy_cut_resets_connections_and_accepts_new_ones(
    echo_server: str, proxy_to: Callable[[str], Proxy]
) -> None:
    """A cut resets open connections; new ones work again, unless the cut refuses them."""
    proxy = proxy_to(echo_server)
    sock = _connect(proxy)
    sock.sendall(b"x")
    assert _recv_exact(sock, 1) == b"x"
    proxy.cut()
    with pytest.raises(ConnectionResetError):
        sock.recv(10)
        sock.sendall(b"y")
        sock.recv(10)
    sock.close()
    with _connect(proxy) as again:
        again.sendall(b"z")
        assert _recv_exact(again, 1) == b"z"
    proxy.cut(refuse=True)
    # The reset may come as soon as the connect (the proxy accepts, then resets) or at the first read.
    with pytest.raises(ConnectionResetError):
        with _connect(proxy) as refused:
            refused.sendall(b"w")
            refused.recv(10)
    proxy.forward()
    with _connect(proxy) as healed:
        healed.sendall(b"v")
        assert _recv_exact(healed, 1) == b"v"
    assert proxy.accepted == 4


# ---------------------------------------------------------------- F10

#: F10's hold: 21 s in CI (one HTTP/2 ping of the client, every 20 s, gets through), 10 minutes in soak.
F10_HOLD = SOAK_MINUTES * 60 if SOAK else 21.0


async def _hold_through(proxy: Proxy, seconds: float, ttl: float = 5.0) -> dict[str, float]:
    """Hold one lock through ``proxy`` for ``seconds``; assert it is never lost nor changed."""
    async with AsyncLockClient(proxy.address) as client:
        h = await client.acquire("f10", ttl=ttl, timeout=5)
        lease_id, token = h.lease_id, h.token
        start = time.monotonic()
        min_left = float(h.ttl)
        while time.monotonic() - start < seconds:
            await asyncio.sleep(0.1)
            assert not h.lost.is_set(), f"lost after {time.monotonic() - start:.1f} s: {h.lost_reason}"
            min_left = min(min_left, h.valid_for())
        assert (h.lease_id, h.token) == (lease_id, token)
        await h.release()
    return {"min_valid_for": min_left}


async def test_f10_default_transport_options_hold_without_goaway(
    etcd: EmbeddedEtcd, coordinator: Any, proxy_to: Callable[[str], Proxy], prefix: str,
    request: pytest.FixtureRequest,
) -> None:
    """F10: with the shipped channel and server options a held lock sees no GOAWAY, no reconnect, no loss; an idle coordinator's etcd connection survives too."""
    from fencepost.coordinator.process.coordinator import Coordinator

    client_proxy = proxy_to(f"127.0.0.1:{coordinator.port}")
    etcd_proxy = proxy_to(etcd.endpoint)
    idle = Coordinator([etcd_proxy.address], listen="127.0.0.1:0", prefix=prefix)
    await idle.start()
    try:
        await asyncio.sleep(0.5)
        etcd_conns = etcd_proxy.accepted
        figures = await _hold_through(client_proxy, F10_HOLD)
        assert client_proxy.accepted == 1, f"the client reconnected {client_proxy.accepted - 1} times"
        assert etcd_proxy.accepted == etcd_conns, "the idle coordinator's etcd connection was replaced"
        # The idle coordinator still serves at once.
        async with AsyncLockClient(f"127.0.0.1:{idle.port}") as client:
            h = await client.acquire("f10-idle", ttl=5, timeout=5)
            await h.release()
        log_figure(request, hold_seconds=F10_HOLD, client_connections=client_proxy.accepted,
                   idle_etcd_connections=etcd_proxy.accepted, **figures)
    finally:
        await idle.stop(grace=0)


async def test_f10_stricter_server_ping_policy_reconnects_with_backoff(
    etcd: EmbeddedEtcd, prefix: str, proxy_to: Callable[[str], Proxy], monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """F10 variant: a coordinator stricter on pings than the client gets GOAWAY; the client resumes the same lease and token before its deadline, with backoff."""
    from fencepost.coordinator.process.coordinator import Coordinator

    # The mismatch, scaled down for CI: the client pings every 0.2 s, the server wants 10 s
    # between pings and sends GOAWAY "too_many_pings" at the third strike. (With the shipped
    # figures, 20 s and 5 s, there is no mismatch; the soak profile uses client 20 s / server 60 s.)
    client_ping_ms, server_min_ms, hold = (20_000, 60_000, SOAK_MINUTES * 60) if SOAK else (200, 10_000, 10.0)
    options = tuple((k, client_ping_ms if k == "grpc.keepalive_time_ms" else v) for k, v in _wire.CHANNEL_OPTIONS)
    monkeypatch.setattr(_wire, "CHANNEL_OPTIONS", options)
    coord = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix, server_options=[
        ("grpc.http2.min_recv_ping_interval_without_data_ms", server_min_ms),
        ("grpc.http2.max_ping_strikes", 2),
    ])
    await coord.start()
    proxy = proxy_to(f"127.0.0.1:{coord.port}")
    try:
        # T = 30 s: keepalives (stream data) every 10 s. With T = 5 s the acks every 1.7 s reset the
        # server's ping strikes and no GOAWAY ever comes: the mismatch only bites quiet streams.
        ttl = 300.0 if SOAK else 30.0
        figures = await _hold_through(proxy, hold, ttl=ttl)
        reconnects = proxy.accepted - 1
        gaps = [b - a for a, b in zip(proxy.accepted_at, proxy.accepted_at[1:])]
        assert reconnects >= 1, "the server never sent GOAWAY: the mismatch was not exercised"
        # Not a tight loop: reconnects stay seconds apart (hundreds would be a loop).
        assert min(gaps) >= 1.0, f"reconnects {gaps} s apart"
        assert reconnects <= hold / 2, f"{reconnects} reconnects in {hold:.0f} s"
        # Each reconnect resumed the same lease and token (checked by _hold_through) long before
        # the deadline: the least time left on the local deadline at any moment of the hold.
        assert figures["min_valid_for"] > ttl / 2
        log_figure(request, hold_seconds=hold, ttl=ttl, reconnects=reconnects,
                   min_gap=min(gaps), **figures)
    finally:
        await coord.stop(grace=0)
