"""Where the coordinator listens: ``HOST:PORT`` or a Unix socket, and the claim on a socket path.

A Unix socket listener (``unix:///run/fencepost/fencepost.sock`` or
``unix:/run/fencepost/fencepost.sock``) is for the sidecar topology: the app
in the same pod reaches the coordinator through a shared volume, with no port
and no TLS needed.

gRPC itself unlinks whatever socket file is at the path when it binds, and
unlinks the path again when the server stops, even if another server has
bound it meanwhile. So before binding, :class:`UnixSocketClaim` takes an
exclusive lock on ``PATH.lock`` for as long as the coordinator serves, refuses
a path on which some process still accepts connections, and removes only a
stale socket file (one a dead coordinator left behind).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import os
import re
import socket
import stat
from pathlib import Path
from typing import IO

import grpc

__all__ = ["UnixSocketClaim", "bind", "bind_problem", "check_listen", "is_local", "same_address", "unix_socket_path"]

_log = logging.getLogger("fencepost.coordinator")

#: ``HOST:PORT``: a host name, an IPv4 address or a bracketed IPv6 address, and a port.
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
#: The longest socket path the kernel takes (``sun_path`` is 108 bytes with its terminating NUL).
MAX_SOCKET_PATH = 107
LISTEN_FORMS = ("HOST:PORT with a port 0 to 65535 (e.g. 127.0.0.1:7420, 0.0.0.0:7420, [::1]:7420; port 0 "
                "picks a free one), or unix:/ABSOLUTE/PATH (unix:///ABSOLUTE/PATH)")


def _unix_problem(path: str) -> str | None:
    if not path.startswith("/"):
        return "the socket path must be absolute"
    if any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path):
        return "the socket path contains white space or control characters"
    if path.endswith("/"):
        return "the socket path names a directory"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return f"the socket path is longer than {MAX_SOCKET_PATH} bytes"
    return None


def unix_socket_path(listen: str) -> Path | None:
    """The socket path of a ``unix:`` listen address, or None for ``HOST:PORT``.

    Args:
        listen: an address :func:`check_listen` accepts.

    Raises:
        ValueError: ``listen`` starts with ``unix:`` but is not one of the two
            forms (see :func:`check_listen`).
    """
    if not listen.startswith("unix:"):
        return None
    rest = listen[len("unix:"):]
    if rest.startswith("//"):
        if not rest.startswith("///"):
            raise ValueError(f"listen address {listen!r}: unix://HOST/... is not supported; give "
                             f"unix:/ABSOLUTE/PATH or unix:///ABSOLUTE/PATH")
        rest = rest[2:]
    problem = _unix_problem(rest)
    if problem is not None:
        raise ValueError(f"listen address {listen!r}: {problem} (unix:/ABSOLUTE/PATH or unix:///ABSOLUTE/PATH)")
    return Path(rest)


def check_listen(listen: str) -> str:
    """Check an address to serve on: ``HOST:PORT`` (port 0 picks a free one), or a Unix socket path.

    gRPC itself takes ``127.0.0.1`` as ``127.0.0.1:443``; this refuses it.

    Args:
        listen: e.g. ``127.0.0.1:7420``, ``0.0.0.0:7420``, ``localhost:7420``,
            ``[::1]:7420``, ``unix:/run/fencepost/fencepost.sock`` or
            ``unix:///run/fencepost/fencepost.sock``.

    Returns:
        ``listen`` unchanged.

    Raises:
        ValueError: not of that form: no port, a port that is not a number or
            above 65535, an IPv6 address without brackets; a relative socket
            path, ``unix://HOST/...``, a path ending in ``/``, with white space
            or control characters, or longer than 107 bytes.
    """
    if isinstance(listen, str) and listen.startswith("unix:"):
        unix_socket_path(listen)
        return listen
    match = _HOST_PORT.match(listen) if isinstance(listen, str) else None
    if match is None or int(match.group("port")) > 65535:
        raise ValueError(f"listen address {listen!r} is not {LISTEN_FORMS}")
    return listen


def is_local(listen: str) -> bool:
    """Whether a checked listen address is reachable from this host only: a Unix socket or a loopback address.

    ``localhost`` counts as loopback; any other host name, and the
    wildcard addresses (``0.0.0.0``, ``[::]``), do not (host names are not resolved).
    """
    if unix_socket_path(listen) is not None:
        return True
    host = listen.rsplit(":", 1)[0]
    if host.startswith("["):
        host = host[1:-1].split("%", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def same_address(a: str, b: str) -> bool:
    """Whether two checked listen addresses are certainly the same.

    True when they are equal (``HOST:PORT`` with a port other than 0) or
    name the same socket path; host names are not resolved.
    """
    path_a, path_b = unix_socket_path(a), unix_socket_path(b)
    if path_a is not None or path_b is not None:
        return path_a == path_b
    return a == b and not a.endswith(":0")


class UnixSocketClaim:
    """This coordinator's hold on a Unix socket path, from before the bind until after the server stops.

    Args:
        path: the absolute socket path.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self._lock: IO[str] | None = None

    def claim(self) -> None:
        """Lock ``PATH.lock`` and clear the path for gRPC's bind.

        A socket file on which nothing accepts connections (left by a
        coordinator that died) is removed and logged.

        Raises:
            RuntimeError: the directory is missing or not writable; another
                coordinator holds the lock; some process accepts connections on
                the socket; or the path is something other than a socket.
        """
        where = f"cannot listen on unix:{self.path}"
        try:
            handle = open(self.lock_path, "a+")  # noqa: SIM115 - held until release()
        except FileNotFoundError:
            raise RuntimeError(f"{where}: the directory {self.path.parent} does not exist") from None
        except OSError as exc:
            raise RuntimeError(f"{where}: cannot make {self.lock_path}: {exc.strerror}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise RuntimeError(f"{where}: another fencepost coordinator serves on it (it holds "
                               f"{self.lock_path})") from None
        self._lock = handle
        try:
            self._clear()
        except BaseException:
            self.release()
            raise

    def _clear(self) -> None:
        where = f"cannot listen on unix:{self.path}"
        try:
            mode = self.path.lstat().st_mode
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RuntimeError(f"{where}: {exc.strerror}") from None
        if not stat.S_ISSOCK(mode):
            raise RuntimeError(f"{where}: {self.path} exists and is not a socket; remove it or listen elsewhere")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(os.fspath(self.path))
        except ConnectionRefusedError:
            pass  # nobody accepts on it: stale
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # removed meanwhile: nothing to clear
                raise RuntimeError(f"{where}: cannot tell whether a process serves on it: {exc.strerror or exc}"
                                   ) from None
            return
        else:
            raise RuntimeError(f"{where}: another process accepts connections on it")
        finally:
            probe.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise RuntimeError(f"{where}: cannot remove the stale socket file: {exc.strerror}") from None
        _log.info("removed the stale socket file %s (nothing accepted connections on it)", self.path)

    def release(self) -> None:
        """Give up the lock (after the server stopped; gRPC removes the socket file itself). Idempotent."""
        if self._lock is not None:
            self._lock.close()
            self._lock = None


def bind_problem(listen: str) -> str | None:
    """Why ``listen`` cannot be bound right now, in words, or None when it looks free.

    A check before anything starts (``fencepost serve`` runs it before the
    embedded etcd), so that a busy port is one clear line, not gRPC's
    "Failed to bind" after etcd came up. gRPC's own bind stays the real one:
    the address can be taken between the two.

    TCP: a plain socket with ``SO_REUSEADDR`` (as gRPC sets it) is bound to
    every address the host resolves to, then closed; as for gRPC, one that
    binds is enough. Port 0 is always free.
    Unix socket: the claim of :class:`UnixSocketClaim` is taken and given
    back (a stale socket file is removed on the way).

    Args:
        listen: an address :func:`check_listen` accepted.

    Returns:
        e.g. ``"address already in use"``, ``"permission denied"``, or the
        Unix claim's reason; None when the bind should work (or the host does
        not resolve: gRPC's bind will say so).
    """
    path = unix_socket_path(listen)
    if path is not None:
        claim = UnixSocketClaim(path)
        try:
            claim.claim()
        except RuntimeError as exc:
            return str(exc).split(": ", 1)[-1]
        claim.release()
        return None
    host, _, port_text = listen.rpartition(":")
    port = int(port_text)
    if port == 0:
        return None
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return None
    problems = []
    for family, kind, proto, _name, address in infos:
        probe = socket.socket(family, kind, proto)
        try:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                problems.append("address already in use")
            elif exc.errno == errno.EACCES:
                problems.append("permission denied (ports below 1024 need privileges)")
            elif exc.errno == errno.EADDRNOTAVAIL:
                problems.append("the address is not one of this machine's")
            else:
                problems.append(exc.strerror or str(exc))
        finally:
            probe.close()
    # gRPC serves a host name on every address it resolves to that it can bind (localhost:
    # 127.0.0.1 and ::1, the latter absent in some containers): it fails only if none binds.
    return problems[0] if problems and len(problems) == len(infos) else None


def bind(server: grpc.aio.Server, listen: str, claims: list[UnixSocketClaim],
         credentials: grpc.ServerCredentials | None = None) -> int:
    """Add ``listen`` to ``server``, with TLS if ``credentials``: its TCP port, or 0 for a Unix socket.

    A Unix socket's path is claimed first (:class:`UnixSocketClaim`, appended to
    ``claims``: release them after the server stopped).

    Raises:
        RuntimeError: the address cannot be bound; the message says why (:func:`bind_problem`).
    """
    path = unix_socket_path(listen)
    if path is not None:
        claim = UnixSocketClaim(path)
        claim.claim()
        claims.append(claim)
    try:
        port = (server.add_secure_port(listen, credentials) if credentials is not None
                else server.add_insecure_port(listen))
    except RuntimeError as exc:
        why = bind_problem(listen) if path is None else None
        raise RuntimeError(f"cannot listen on {listen}: {why or exc}") from exc
    if port == 0:
        why = bind_problem(listen) if path is None else None
        raise RuntimeError(f"cannot listen on {listen}{': ' + why if why else ''}")
    return 0 if path is not None else port
