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
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

__all__ = ["EtcdAuth", "EtcdTls", "Members", "check_endpoints", "parse_endpoint"]

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
    """

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = field(default=None, repr=False)

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

        return cls(read(ca, "CA certificate"), read(cert, "client certificate"), read(key, "client key"))

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
        credentials = tls.credentials() if tls is not None else None
        self._channels = [
            grpc.aio.secure_channel(t, credentials, options=CHANNEL_OPTIONS) if credentials is not None
            else grpc.aio.insecure_channel(t, options=CHANNEL_OPTIONS)
            for t in self.targets
        ]
        self._current = 0

    def __len__(self) -> int:
        return len(self._channels)

    def channel(self, index: int) -> grpc.aio.Channel:
        """The channel to member ``index`` (0-based, in the order of the endpoints)."""
        return self._channels[index]

    def current(self) -> tuple[int, grpc.aio.Channel]:
        """The member calls go to now: (its index, its channel)."""
        return self._current, self._channels[self._current]

    def failed(self, index: int) -> None:
        """Move on from member ``index`` after a transport failure there (no-op if already moved)."""
        if index == self._current:
            self._current = (index + 1) % len(self._channels)

    async def close(self) -> None:
        """Close every channel (calls in flight fail with CANCELLED)."""
        for channel in self._channels:
            await channel.close()
