"""A TCP proxy on loopback that a test controls: forward, blackhole or cut.

The proxy listens on ``127.0.0.1:PORT`` and opens one upstream connection per
accepted client connection. It runs its own asyncio event loop in a daemon
thread, so that it keeps working while the test's loop (or the test's
thread) is busy, and so that one proxy can be driven from sync and async
tests alike. Every control call returns once the new mode is in effect.

Modes, per direction (``UP`` = client to server, ``DOWN`` = server to client):

- **forward**: bytes are copied as they arrive.
- **blackhole**: bytes stop flowing but both TCP connections stay open: no
  FIN, no RST, the peers see silence (a partition, a half-open connection).
  ``drop=False`` (default) leaves the bytes unread, so that after healing
  they arrive in order as TCP would deliver them after a partition;
  ``drop=True`` reads and discards them (a stream that lost data: after
  healing the peers typically see a protocol error).
- **cut** (:meth:`Proxy.cut`): every open connection is closed with RST
  (``SO_LINGER`` 0) on both sides. New connections are accepted afterwards
  (and blackholed if a direction is blackholed), unless ``refuse=True``,
  which resets every new connection at once until :meth:`Proxy.forward`.

Example::

    with Proxy("127.0.0.1:7420") as proxy:       # proxy.address -> 127.0.0.1:PORT
        client = AsyncLockClient(proxy.address)
        ...
        proxy.blackhole()                          # both ways, sockets stay open
        proxy.blackhole(Direction.DOWN)            # only server -> client
        proxy.forward()                            # heal
        proxy.cut()                                # RST every connection

Non-guarantees: bytes already in kernel buffers when a blackhole starts may
still be delivered; the proxy does not model latency or reordering.
"""

from __future__ import annotations

import asyncio
import enum
import socket
import struct
import threading
import time
from concurrent.futures import Future
from types import TracebackType
from typing import Any, Callable, Coroutine, TypeVar

__all__ = ["Direction", "Proxy"]

T = TypeVar("T")
_CHUNK = 65536


class Direction(enum.Flag):
    """Which way bytes flow: ``UP`` client to server, ``DOWN`` server to client."""

    UP = enum.auto()
    DOWN = enum.auto()
    BOTH = UP | DOWN


class _Gate:
    """The mode of one direction, shared by every connection of the proxy."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.drop = False

    def set(self, *, forward: bool, drop: bool = False) -> None:
        self.drop = drop
        if forward:
            self.open.set()
        else:
            self.open.clear()


def _rst(writer: asyncio.StreamWriter) -> None:
    """Close a connection with RST (SO_LINGER 0) instead of FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Connection:
    """One proxied connection: two pumps, one per direction."""

    def __init__(self, proxy: Proxy, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.client_r, self.client_w = client_r, client_w
        self.server_w: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []

    async def run(self) -> None:
        host, port = self.proxy.target
        try:
            server_r, server_w = await asyncio.open_connection(host, port)
        except OSError:
            _rst(self.client_w)
            return
        self.server_w = server_w
        self.tasks = [
            asyncio.create_task(self._pump(self.client_r, server_w, self.proxy._gates[Direction.UP], Direction.UP)),
            asyncio.create_task(self._pump(server_r, self.client_w, self.proxy._gates[Direction.DOWN], Direction.DOWN)),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: _Gate,
                    direction: Direction) -> None:
        try:
            while True:
                if not gate.open.is_set() and not gate.drop:
                    await gate.open.wait()  # leave the bytes unread
                data = await reader.read(_CHUNK)
                if not gate.open.is_set():
                    if gate.drop:
                        self.proxy._count(self.proxy.dropped, direction, len(data))
                        if data:
                            continue
                    await gate.open.wait()  # hold what was read (or the EOF) until healed
                if not data:
                    break
                # Count before writing: whoever sees the bytes arrive must
                # also see them counted (a test reads the counter right after).
                self.proxy._count(self.proxy.forwarded, direction, len(data))
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            # One side ended: end both (the other pump sees the close).
            self.close(rst=False)

    def close(self, *, rst: bool) -> None:
        for w in (self.client_w, self.server_w):
            if w is None:
                continue
            if rst:
                _rst(w)
            elif not w.is_closing():
                w.close()
        self.proxy._conns.discard(self)


class Proxy:
    """A controllable TCP proxy from ``127.0.0.1:port`` to ``target``.

    Args:
        target: ``host:port`` to forward to.
        port: the local port; 0 picks a free one (kept across stop/start).

    Attributes:
        accepted: how many client connections were accepted (reconnects count).
        accepted_at: the monotonic time of each accepted connection.
        forwarded: bytes copied, by Direction.UP / Direction.DOWN.
        dropped: bytes read and discarded by a ``drop=True`` blackhole.
        events: ``(monotonic time, what)`` of every mode change and cut.
    """

    def __init__(self, target: str, *, port: int = 0) -> None:
        host, _, tport = target.rpartition(":")
        self.target = (host or "127.0.0.1", int(tport))
        self.port = port
        self.accepted = 0
        self.accepted_at: list[float] = []
        self.forwarded = {Direction.UP: 0, Direction.DOWN: 0}
        self.dropped = {Direction.UP: 0, Direction.DOWN: 0}
        self.events: list[tuple[float, str]] = []
        self._refuse = False
        self._changed = threading.Condition()  # notified whenever a counter changes
        self._conns: set[_Connection] = set()
        self._gates: dict[Direction, _Gate] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.AbstractServer | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` for the clients to connect to (after :meth:`start`)."""
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """How many proxied connections are open now."""
        return len(self._conns)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Proxy:
        """Start the proxy's thread and listen; returns self."""
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name=f"proxy-{self.target[1]}", daemon=True)
        self._thread.start()
        self._run(self._listen())
        return self

    async def _listen(self) -> None:
        self._gates = {Direction.UP: _Gate(), Direction.DOWN: _Gate()}
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._changed:
            self.accepted_at.append(time.monotonic())
            self.accepted += 1
            self._changed.notify_all()
        if self._refuse:
            _rst(writer)
            return
        conn = _Connection(self, reader, writer)
        self._conns.add(conn)
        await conn.run()

    def stop(self) -> None:
        """Close every connection (RST) and the listener, end the thread; idempotent."""
        if self._loop is None or self._thread is None:
            return
        try:
            self._run(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()
            self._loop = None
            self._thread = None

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        conns = list(self._conns)
        tasks = [t for c in conns for t in c.tasks]
        for conn in conns:
            conn.close(rst=True)
        await asyncio.gather(*tasks, return_exceptions=True)
        # Let aborted transports finish their callbacks.
        await asyncio.sleep(0)

    def __enter__(self) -> Proxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None, "proxy not started"
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout=10)

    def _call(self, fn: Callable[[], None]) -> None:
        async def run() -> None:
            fn()

        self._run(run())

    # ------------------------------------------------------------ control

    def forward(self, direction: Direction = Direction.BOTH) -> float:
        """Forward bytes again in ``direction`` (heal); stop refusing new connections.

        Returns:
            The monotonic time at which the mode took effect.
        """
        def apply() -> None:
            self._refuse = False
            for d in (Direction.UP, Direction.DOWN):
                if d in direction:
                    self._gates[d].set(forward=True)

        self._call(apply)
        return self._mark(f"forward {direction.name}")

    def blackhole(self, direction: Direction = Direction.BOTH, *, drop: bool = False) -> float:
        """Stop forwarding in ``direction`` without closing anything.

        Args:
            direction: which way(s) to silence.
            drop: read and discard the bytes instead of leaving them unread.

        Returns:
            The monotonic time at which the blackhole took effect.
        """
        def apply() -> None:
            for d in (Direction.UP, Direction.DOWN):
                if d in direction:
                    self._gates[d].set(forward=False, drop=drop)

        self._call(apply)
        return self._mark(f"blackhole {direction.name}{' drop' if drop else ''}")

    def cut(self, *, refuse: bool = False) -> float:
        """Close every open connection with RST on both sides.

        Args:
            refuse: also reset every new connection until :meth:`forward`
                (the target is unreachable); otherwise new connections are
                accepted at once.

        Returns:
            The monotonic time of the cut.
        """
        def apply() -> None:
            self._refuse = refuse
            for conn in list(self._conns):
                conn.close(rst=True)

        self._call(apply)
        return self._mark(f"cut{' refuse' if refuse else ''}")

    # ------------------------------------------------------------ counters

    def _count(self, counter: dict[Direction, int], direction: Direction, n: int) -> None:
        """Add ``n`` to ``counter[direction]`` (called in the proxy thread) and wake waiters."""
        with self._changed:
            counter[direction] += n
            self._changed.notify_all()

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Block until ``predicate()`` (which reads the counters) is true, or ``timeout`` seconds pass.

        Re-checks the predicate each time a counter changes, so that a test
        synchronises on the proxy's own progress instead of sleeping.

        Returns:
            Whether the predicate became true in time.
        """
        with self._changed:
            return self._changed.wait_for(predicate, timeout)

    def _mark(self, what: str) -> float:
        now = time.monotonic()
        self.events.append((now, what))
        return now
