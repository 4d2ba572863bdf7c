"""TLS for the client: the settings, and the channels they open.

:class:`TlsConfig` names the PEM files of a client's TLS: the CAs to trust,
the client certificate and its key, and the name to check in the
coordinator's certificate. :func:`security` reads and checks them when a
client is made, into a :class:`Security` that opens the channels of that
client, and again when they change on disk (:meth:`Security.reloaded`, see
:mod:`.renewal`: a renewed certificate is used at the next handshake) (``grpc.aio.secure_channel``, or ``insecure_channel`` without
TLS), with the options of :data:`fencepost.client._transport.wire.CHANNEL_OPTIONS`.
Why a handshake failed is read in :mod:`fencepost.client._transport.handshake`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import ssl

import grpc
import grpc.aio

from . import renewal, wire
from ..errors import InvalidArgument

__all__ = ["PLAINTEXT", "Security", "TlsConfig", "UNIX_SERVER_NAME", "security"]

#: The name checked in the coordinator's certificate over a unix socket when
#: ``server_name`` is not given (gRPC would check the socket path).
UNIX_SERVER_NAME = "localhost"

#: Where operating systems keep their CA bundle, tried after ``$SSL_CERT_FILE``
#: and Python's own default (the list Go's crypto/x509 uses on Linux and the BSDs).
SYSTEM_CA_FILES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL 6
    "/etc/ssl/ca-bundle.pem",  # openSUSE
    "/etc/pki/tls/cacert.pem",  # OpenELEC
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  # CentOS, RHEL 7
    "/etc/ssl/cert.pem",  # Alpine, macOS, FreeBSD
)

PathArg = str | os.PathLike[str]

_CERT_PEM = b"-----BEGIN CERTIFICATE-----"
_KEY_PEM = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    """The TLS settings of a client: PEM files, read when the client is made and again when they change.

    Pass it as ``tls=`` to :class:`~fencepost.client.AsyncLockClient` or
    :class:`~fencepost.client.LockClient`; every channel to a coordinator is
    then TLS. A ready ``grpc.ChannelCredentials`` (from
    ``grpc.ssl_channel_credentials``) may be passed instead, and is used as is.

    The files are read again when they change on disk (a new file renamed
    over the old one, a Kubernetes Secret volume's symlink swap) before the
    client's next connection to a coordinator: a renewed certificate is used
    at the next TLS handshake, and connections already made keep theirs.
    New files that cannot be used leave the ones read before in use, with a
    warning naming the file.

    Example::

        tls = TlsConfig(ca="/etc/fencepost/ca.pem", cert="/etc/fencepost/client.pem",
                        key="/etc/fencepost/client-key.pem")
        with LockClient("coord.example.com:7420", tls=tls) as client: ...

    Attributes:
        ca: PEM bundle of the CAs that may sign the coordinator's
            certificate. None trusts the system's roots: ``$SSL_CERT_FILE``,
            else the operating system's CA bundle (``/etc/ssl/certs/
            ca-certificates.crt``, ...), else gRPC's own; with
            ``$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` set, gRPC's choice (that file).
        cert: PEM file of the client certificate (its chain may follow), for
            a coordinator that requires one (mTLS); give ``key`` with it.
        key: PEM file of the client certificate's private key, unencrypted.
        server_name: The name to check in the coordinator's certificate
            instead of the address's host (gRPC's
            ``grpc.ssl_target_name_override``; also sent as SNI). Over a unix
            socket it defaults to ``"localhost"``.
    """

    ca: PathArg | None = None
    cert: PathArg | None = None
    key: PathArg | None = None
    server_name: str | None = None


@dataclasses.dataclass(frozen=True)
class Security:
    """How a client's channels are opened: plaintext, or TLS with checked credentials.

    Made by :func:`security`; not public.

    Attributes:
        credentials: The channel credentials; None for plaintext.
        server_name: The name to check instead of the address's host, if set.
        trusted: The CAs trusted, in words for error messages.
        cert: The client certificate's file, None without one.
        key: Its key's file.
        opaque: The credentials were given ready-made: their files are unknown.
        config: The TlsConfig read; None for plaintext or ready-made credentials (never read again).
        files: The files read, in the order CA, cert, key (None for one not given).
        stamps: What identified each of ``files`` just before it was read (:data:`~.renewal.Stamp`).
        validity: When the client certificate is valid; None without one, or unknown.
    """

    credentials: grpc.ChannelCredentials | None = None
    server_name: str | None = None
    trusted: str = ""
    cert: str | None = None
    key: str | None = None
    opaque: bool = False
    config: TlsConfig | None = None
    files: tuple[str | None, ...] = ()
    stamps: tuple[renewal.Stamp, ...] = ()
    validity: renewal.Validity | None = None

    def reloaded(self) -> Security:
        """This Security, or a new one read from its files when they changed on disk (see :mod:`.renewal`)."""
        return renewal.reload(self, security)

    @property
    def tls(self) -> bool:
        """Whether the channels are TLS."""
        return self.credentials is not None

    def name_checked(self, address: str) -> str:
        """The name the coordinator's certificate must carry when dialled at ``address``."""
        if self.server_name:
            return self.server_name
        hp = wire.host_port(address)
        return UNIX_SERVER_NAME if hp is None else hp[0]

    def options(self, address: str) -> tuple[tuple[str, int | str], ...]:
        """The channel options for ``address``: :data:`~fencepost.client._transport.wire.CHANNEL_OPTIONS` and the name to check."""
        options: tuple[tuple[str, int | str], ...] = wire.CHANNEL_OPTIONS
        if self.tls and (self.server_name or wire.unix_path(address) is not None):
            options += (("grpc.ssl_target_name_override", self.name_checked(address)),)
        return options

    def channel(self, address: str) -> grpc.aio.Channel:
        """Open a ``grpc.aio`` channel to ``address`` (no connection is made yet)."""
        if self.credentials is None:
            return grpc.aio.insecure_channel(address, options=self.options(address))
        return grpc.aio.secure_channel(address, self.credentials, options=self.options(address))

    def sync_channel(self, address: str) -> grpc.Channel:
        """Open a blocking ``grpc`` channel to ``address`` (``fencepost status``'s health probe)."""
        if self.credentials is None:
            return grpc.insecure_channel(address, options=self.options(address))
        return grpc.secure_channel(address, self.credentials, options=self.options(address))


#: Plaintext channels.
PLAINTEXT = Security()


def security(tls: TlsConfig | grpc.ChannelCredentials | None) -> Security:
    """Read and check a client's TLS settings, once, into the :class:`Security` of its channels.

    Args:
        tls: A :class:`TlsConfig`, ready ``grpc.ChannelCredentials`` (used as
            they are), or None for plaintext.

    Returns:
        The Security to open channels with.

    Raises:
        InvalidArgument: ``tls`` is of another type (field ``"tls"``); a file
            is missing, unreadable or holds no PEM certificate (or key); the
            key does not match the certificate or is encrypted; ``cert``
            comes without ``key`` or the other way round; ``server_name`` is
            empty or holds white space (field ``"tls.ca"``, ``"tls.cert"``,
            ``"tls.key"`` or ``"tls.server_name"``).
    """
    if tls is None:
        return PLAINTEXT
    if isinstance(tls, grpc.ChannelCredentials):
        return Security(credentials=tls, trusted="the CAs of the given credentials", opaque=True)
    if not isinstance(tls, TlsConfig):
        raise InvalidArgument(f"tls must be a TlsConfig, a grpc.ChannelCredentials or None, got {tls!r}", field="tls")
    server_name = _check_server_name(tls.server_name)
    if tls.cert is not None and tls.key is None:
        raise InvalidArgument("tls.key: tls.cert is given without its key", field="tls.key")
    if tls.key is not None and tls.cert is None:
        raise InvalidArgument("tls.cert: tls.key is given without its certificate", field="tls.cert")
    files = tuple(None if path is None else _path(path, field)
                  for path, field in ((tls.ca, "tls.ca"), (tls.cert, "tls.cert"), (tls.key, "tls.key")))
    stamps = renewal.stamps(files)  # before reading: a change made during the read is seen at the next look
    roots: bytes | None = None
    if tls.ca is not None:
        ca = _path(tls.ca, "tls.ca")
        roots = _read_pem(ca, "tls.ca", "certificate")
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=roots.decode("ascii", "replace"))
        except ssl.SSLError as err:
            raise InvalidArgument(f"tls.ca: {ca!r} holds no certificate that can be loaded ({err})",
                                  field="tls.ca") from None
        trusted = f"tls.ca ({ca})"
    else:
        roots, trusted = _system_roots()
    cert: str | None = None
    key: str | None = None
    cert_pem: bytes | None = None
    key_pem: bytes | None = None
    if tls.cert is not None and tls.key is not None:
        cert, key = _path(tls.cert, "tls.cert"), _path(tls.key, "tls.key")
        cert_pem = _read_pem(cert, "tls.cert", "certificate")
        key_pem = _read_pem(key, "tls.key", "private key")
        _check_pair(cert, key)
    credentials = grpc.ssl_channel_credentials(root_certificates=roots, private_key=key_pem,
                                               certificate_chain=cert_pem)
    return Security(credentials=credentials, server_name=server_name, trusted=trusted, cert=cert, key=key,
                    config=tls, files=files, stamps=stamps, validity=renewal.validity(cert_pem))


def _check_server_name(name: object) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name or any(ch.isspace() or ord(ch) < 0x20 for ch in name):
        raise InvalidArgument(f"tls.server_name: must be a non-empty name without white space, got {name!r}",
                              field="tls.server_name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: gRPC raised a bare UnicodeEncodeError at connect
        raise InvalidArgument(f"tls.server_name: must be valid UTF-8, got {name!r}",
                              field="tls.server_name") from None
    return name


def _path(value: object, field: str) -> str:
    """A path argument as a str, or InvalidArgument naming ``field``."""
    path = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise InvalidArgument(f"{field}: must be a path (str or os.PathLike[str]), got {value!r}", field=field)
    if not path:
        raise InvalidArgument(f"{field}: the path is empty", field=field)
    return path


def _read_pem(path: str, field: str, what: str) -> bytes:
    """The bytes of a PEM file holding a ``what`` ("certificate" or "private key"), or InvalidArgument."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise InvalidArgument(f"{field}: cannot read {path!r}: {err.strerror or err}", field=field) from None
    found = _CERT_PEM in data if what == "certificate" else _KEY_PEM.search(data) is not None
    if not found:
        raise InvalidArgument(f"{field}: {path!r} holds no PEM {what}", field=field)
    return data


def no_password() -> bytes:
    """The ``password`` of ``ssl.SSLContext.load_cert_chain``: an encrypted key is refused."""
    raise _Encrypted


class _Encrypted(Exception):
    """A key asked for a password."""


def _check_pair(cert: str, key: str) -> None:
    """Check with :mod:`ssl` that ``key`` is the unencrypted key of the certificate in ``cert``."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=no_password)
    except _Encrypted:
        raise InvalidArgument(f"tls.key: {key!r} is encrypted; gRPC needs an unencrypted key",
                              field="tls.key") from None
    except OSError as err:  # ssl.SSLError, or a file gone since it was read
        if getattr(err, "reason", None) == "KEY_VALUES_MISMATCH":
            raise InvalidArgument(f"tls.key: {key!r} is not the key of the certificate in tls.cert ({cert})",
                                  field="tls.key") from None
        raise InvalidArgument(f"tls.cert: {cert!r} and tls.key {key!r} cannot be loaded as a certificate "
                              f"and its key ({err})", field="tls.cert") from None


def _system_roots() -> tuple[bytes | None, str]:
    """The system's CA bundle and its description; (None, description) leaves the choice to gRPC."""
    grpc_file = os.environ.get("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH")
    if grpc_file:
        return None, f"$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH ({grpc_file})"
    candidates = [os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile, *SYSTEM_CA_FILES]
    for path in candidates:
        if not path:
            continue
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            continue
        if _CERT_PEM in data:
            return data, f"the system roots ({path})"
    return None, "gRPC's default roots"
