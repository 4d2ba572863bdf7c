"""Where etcd is and how to reach it: endpoints, TLS, credentials, one channel per member.

An endpoint is ``host:port`` (a host name, an IPv4 address or a bracketed
IPv6 address), optionally with a scheme: ``http://`` or ``https://`` (etcd's
own spelling), or ``dns:///`` (gRPC's). Each endpoint gets its own grpc.aio
channel with the target ``dns:///host:port``, so a host name is resolved by
gRPC's DNS resolver (and re-resolved when the member's address changes).

Calls go to one current member; a member whose call failed in transport
(unreachable, timed out, no leader) is left for the next one in the list
(failover rotation, as etcd's clientv3 balancer does when an endpoint turns
unhealthy). Several calls failing on the same member rotate once, not once
each.

TLS files (``--etcd-ca``, ``--etcd-cert``, ``--etcd-key``) are read again
when they change on disk (a new file renamed over the old one, a Secret
volume's symlink swap): gRPC Python's client credentials are fixed per
channel, so a member's channel that is not connected, when calls go to it,
is replaced by one with the new files, and the next handshake with etcd
uses the renewed certificate. Connected channels (and the streams on them)
keep theirs. New files that cannot be used keep the ones in use, with a
warning naming the file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from ..telemetry.certificates import expiry_problem, iso, validity

__all__ = ["EtcdAuth", "EtcdTls", "Members", "check_endpoints", "parse_endpoint"]

_log = logging.getLogger("fencepost.coordinator")

#: Seconds a replaced channel's calls get before it is closed.
_REPLACED_GRACE = 1.0

#: What identifies one version of a file: (device, inode, size, mtime ns, ctime ns), or None when missing.
_Stamp = tuple[int, int, int, int, int] | None

#: gRPC channel options of every etcd channel: HTTP/2 pings find a dead
#: member's connection within keepalive_time + keepalive_timeout (15 s) even
#: without calls in flight (the shared keepalive stream's own 0.5 s answer
#: timeout finds a silent member much sooner). A member back from a restart
#: is reconnected to within ETCD_BACKOFF's cap (2 s), not gRPC's default
#: backoff (1 s growing to 120 s), which would let the leases it serves die.
CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]

_HOST_PORT = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")


def parse_endpoint(endpoint: str) -> tuple[str, bool | None]:
    """Check one etcd endpoint and give its gRPC target.

    Args:
        endpoint: ``host:port``, ``http://host:port``, ``https://host:port``
            or ``dns:///host:port``; a trailing ``/`` is allowed.

    Returns:
        (``dns:///host:port``, whether the scheme asks for TLS: True for
        ``https``, False for ``http``, None when it says nothing).

    Raises:
        ValueError: not of that form, or the port is not 1 to 65535.
    """
    text = endpoint.strip().rstrip("/")
    tls: bool | None = None
    for scheme, wants in (("https://", True), ("http://", False), ("dns:///", None)):
        if text.startswith(scheme):
            text, tls = text[len(scheme):], wants
            break
    match = _HOST_PORT.match(text)
    if not match:
        raise ValueError(f"etcd endpoint {endpoint!r} is not host:port (e.g. etcd1:2379, 10.0.0.5:2379, "
                         f"https://etcd1:2379)")
    port = int(match.group("port"))
    if not 0 < port < 65536:
        raise ValueError(f"etcd endpoint {endpoint!r}: port {port} is not 1 to 65535")
    return f"dns:///{match.group('host')}:{port}", tls


def check_endpoints(endpoints: Sequence[str], tls: EtcdTls | None) -> tuple[list[str], EtcdTls | None]:
    """Check a list of endpoints against the TLS settings.

    Args:
        endpoints: etcd endpoints (see :func:`parse_endpoint`), at least one.
        tls: TLS settings, or None.

    Returns:
        (the gRPC targets, the TLS settings to use: ``EtcdTls()`` with the
        system's roots when the endpoints say ``https://`` and ``tls`` is None).

    Raises:
        ValueError: no endpoint, a malformed one, ``http://`` and ``https://``
            mixed, or ``http://`` with TLS settings.
    """
    if isinstance(endpoints, str) or not endpoints:
        raise ValueError("etcd endpoints must be a non-empty list of host:port")
    parsed = [parse_endpoint(e) for e in endpoints]
    asked = {wants for _, wants in parsed if wants is not None}
    if len(asked) > 1:
        raise ValueError("etcd endpoints mix http:// and https://")
    if tls is None and asked == {True}:
        tls = EtcdTls()
    if tls is not None and asked == {False}:
        raise ValueError("etcd endpoints say http:// but TLS settings were given")
    return [target for target, _ in parsed], tls


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd: the CA that signed etcd's certificate, and our own certificate for mTLS.

    Args:
        ca: PEM of the CA certificates that etcd's server certificate must
            chain to; None for the system's roots.
        cert: PEM of the coordinator's client certificate (mTLS, etcd's
            ``--client-cert-auth``), with ``key``; None for none.
        key: PEM of the client certificate's private key.
        files: The files ``ca``, ``cert`` and ``key`` were read from (None
            for one not given), when :meth:`from_files` read them: they are
            read again when they change. Empty: never read again.
    """

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)
    files: tuple[Path | None, ...] = ()

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("an etcd client certificate needs its key, and a key its certificate")

    @classmethod
    def from_files(cls, ca: str | Path | None = None, cert: str | Path | None = None,
                   key: str | Path | None = None) -> EtcdTls:
        """Read the PEM files (``--etcd-ca``, ``--etcd-cert``, ``--etcd-key``).

        Raises:
            ValueError: a file cannot be read, or a certificate comes without its key.
        """
        def read(path: str | Path | None, what: str) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read the etcd {what} {str(path)!r}: {exc.strerror}") from None

        files = tuple(None if path is None else Path(path) for path in (ca, cert, key))
        return cls(read(ca, "CA certificate"), read(cert, "client certificate"), read(key, "client key"), files)

    def stamps(self) -> tuple[_Stamp, ...]:
        """What identifies the current version of each of :attr:`files` on disk (through symlinks)."""
        out: list[_Stamp] = []
        for path in self.files:
            try:
                st = os.stat(path) if path is not None else None
            except OSError:
                st = None
            out.append(None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
        return tuple(out)

    def read_again(self) -> EtcdTls:
        """The same settings read again from :attr:`files`, the certificate checked against its key.

        Raises:
            ValueError: naming the file: it cannot be read, or the key is not the certificate's.
        """
        fresh = EtcdTls.from_files(*self.files)
        if fresh.cert is not None and fresh.key is not None:
            cert, key = self.files[1], self.files[2]
            try:
                ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=b"")  # type: ignore[arg-type]
            except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
                raise ValueError(f"the etcd client certificate {cert} and key {key} cannot be loaded "
                                 f"together: {exc}") from None
            if EtcdTls.from_files(*self.files) != fresh:
                raise ValueError(f"the etcd client certificate {cert} or key {key} changed while it was read")
        return fresh

    def certificate_problem(self) -> str | None:
        """Why the client certificate (``--etcd-cert``) is not valid now (expired, not yet valid), or None."""
        path = self.files[1] if len(self.files) > 1 else None
        return expiry_problem("the etcd client certificate --etcd-cert", path, self.cert)

    def credentials(self) -> grpc.ChannelCredentials:
        """The gRPC channel credentials (``grpc.ssl_channel_credentials``)."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


@dataclass(frozen=True)
class EtcdAuth:
    """etcd user/password authentication (etcd's ``Auth.Authenticate``); the password is never shown.

    Args:
        user: The etcd user name.
        password: Its password.
    """

    user: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.user:
            raise ValueError("the etcd user name must not be empty")


class Members:
    """One grpc.aio channel per etcd endpoint, and the current member that calls go to.

    Args:
        endpoints: etcd endpoints (see :func:`parse_endpoint`), at least one.
        tls: TLS settings; None for plaintext unless an endpoint says
            ``https://`` (then TLS with the system's roots).

    Raises:
        ValueError: no endpoint, a malformed one, or ``http://`` and
            ``https://`` mixed, or ``http://`` with TLS settings.
    """

    def __init__(self, endpoints: Sequence[str], *, tls: EtcdTls | None = None) -> None:
        self.targets, self.tls = check_endpoints(endpoints, tls)
        self.endpoints = list(endpoints)
        tls = self.tls
        self._credentials = tls.credentials() if tls is not None else None
        # The version of the TLS files last seen, and the one in use (they differ while new files are bad).
        self._seen = self._loaded = tls.stamps() if tls is not None and tls.files else ()
        self._channels = [self._open(t) for t in self.targets]
        self._made_with = [self._loaded] * len(self._channels)  # the files' version each channel has
        self._closing: set[asyncio.Task[None]] = set()
        self._current = 0

    def _open(self, target: str) -> grpc.aio.Channel:
        if self._credentials is None:
            return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        return grpc.aio.secure_channel(target, self._credentials, options=CHANNEL_OPTIONS)

    def __len__(self) -> int:
        return len(self._channels)

    def channel(self, index: int) -> grpc.aio.Channel:
        """The channel to member ``index`` (0-based, in the order of the endpoints)."""
        return self._channels[index]

    def current(self) -> tuple[int, grpc.aio.Channel]:
        """The member calls go to now: (its index, its channel).

        A channel that is not connected is first replaced when the TLS files
        changed since it was opened (see the module's docstring).
        """
        index = self._current
        if self._seen and self._channels[index].get_state() != grpc.ChannelConnectivity.READY:
            self._renew(index)
        return index, self._channels[index]

    def _renew(self, index: int) -> None:
        """Read the TLS files again if they changed; reopen member ``index``'s channel if it has older ones."""
        assert self.tls is not None
        now = self.tls.stamps()
        if now != self._seen:
            self._seen = now
            try:
                fresh = self.tls.read_again()
            except ValueError as exc:
                _log.warning("etcd TLS files not reloaded, the ones in use stay: %s", exc)
            else:
                self.tls, self._credentials, self._loaded = fresh, fresh.credentials(), now
                dates = validity(fresh.cert) if fresh.cert else None
                until = f" (valid until {iso(dates[1])})" if dates else ""
                _log.info("etcd TLS files reloaded: client certificate %s%s", self.tls.files[1], until)
        if self._made_with[index] != self._loaded:
            old = self._channels[index]
            self._channels[index] = self._open(self.targets[index])
            self._made_with[index] = self._loaded
            task = asyncio.ensure_future(old.close(grace=_REPLACED_GRACE))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    def failed(self, index: int) -> None:
        """Move on from member ``index`` after a transport failure there (no-op if already moved)."""
        if index == self._current:
            self._current = (index + 1) % len(self._channels)

    async def close(self) -> None:
        """Close every channel (calls in flight fail with CANCELLED)."""
        for channel in self._channels:
            await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
