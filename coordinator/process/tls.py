"""TLS on the coordinator's own port: its certificate, client certificates (mTLS), reload without a restart.

:class:`ServerTls` names the PEM files; :class:`ServerCertificates` loads
them and gives the gRPC server credentials. Those are gRPC's dynamic SSL
credentials (``grpc.dynamic_ssl_server_credentials``): before each TLS
handshake gRPC asks for the certificate to use, and :class:`ServerCertificates`
answers with the files' current contents when they changed on disk (by
inode, size, modification or change time; a Kubernetes secret volume's
symlink swap counts), or after :meth:`ServerCertificates.reload` (SIGHUP).
Established connections, and the KeepAlive streams on them, keep the
certificate they were made with; only new handshakes use the new one.

The HTTP/JSON API's port (``--http-listen``) serves the same files through
:meth:`ServerCertificates.ssl_context`: Python's ``ssl``, whose handshake
hook (``sni_callback``, which OpenSSL calls at every ClientHello, with or
without SNI) checks the files the same way and hands the handshake the
context of their current contents. With a client CA the client must present
a certificate that chains to it (``CERT_REQUIRED``); ``--client-auth
optional`` asks for none there either.

A reload that fails (a half-written file, a key that is not the
certificate's, an unreadable file) keeps the certificate in use and logs a
warning naming the file, once per change of the files; it never stops the
server.

:func:`check_pem_files` is the one check of PEM files, for these files and
for the coordinator's etcd TLS files: it loads them with Python's ``ssl``
(OpenSSL), which fails where gRPC would only fail at a handshake.
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["ServerCertificates", "ServerTls", "TlsFileError", "check_pem_files"]

_log = logging.getLogger("fencepost.coordinator")


class TlsFileError(ValueError):
    """A TLS file that cannot be used.

    Attributes:
        role: which file: ``"cert"``, ``"key"`` or ``"ca"``.
        path: the file.
        problem: what is wrong, worded to follow the file's name.
    """

    #: How each role is named in messages.
    NAMES = {"cert": "certificate file", "key": "key file", "ca": "CA file"}

    def __init__(self, role: str, path: str | Path, problem: str) -> None:
        self.role = role
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.NAMES[role]} {self.path} {problem}")


class _Encrypted(Exception):
    """The private key asks for a passphrase (gRPC takes unencrypted keys only)."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def _ssl_why(exc: ssl.SSLError) -> str:
    """OpenSSL's reason, when it says more than "no certificate" (not its bare "PEM lib")."""
    return f" ({exc.reason})" if exc.reason and exc.reason != "NO_CERTIFICATE_OR_CRL_FOUND" else ""


def _read(role: str, path: str | Path) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise TlsFileError(role, path, f"cannot be read: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise TlsFileError(role, path, "is not a PEM file")
    return data


def check_pem_files(cert: str | Path | None = None, key: str | Path | None = None,
                    ca: str | Path | None = None) -> dict[str, bytes]:
    """Read PEM files and load them as OpenSSL will in gRPC.

    Args:
        cert: a certificate chain (the first certificate is the holder's), with ``key``.
        key: the certificate's private key, unencrypted.
        ca: a bundle of CA certificates.

    Returns:
        The contents read, by role (``"cert"``, ``"key"``, ``"ca"``), of the files given.

    Raises:
        TlsFileError: naming the file: it cannot be read, is not PEM, holds no
            certificate (a CA or certificate file) or no private key (a key
            file), the key is encrypted or is not the certificate's key.
    """
    data: dict[str, bytes] = {}
    for role, path in (("ca", ca), ("cert", cert), ("key", key)):
        if path is not None:
            data[role] = _read(role, path)
    if ca is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data["ca"].decode("latin-1"))
        except ssl.SSLError as exc:
            raise TlsFileError("ca", ca, f"holds no certificate that OpenSSL can read{_ssl_why(exc)}") from None
    if cert is None or key is None:
        return data
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=data["cert"].decode("latin-1"))
    except ssl.SSLError as exc:
        raise TlsFileError("cert", cert, f"holds no certificate that OpenSSL can read{_ssl_why(exc)}; "
                                         f"are the certificate and the key swapped?") from None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=_no_passphrase)
    except _Encrypted:
        raise TlsFileError("key", key, "is encrypted; give the key without a passphrase") from None
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsFileError("key", key, f"is not the private key of the certificate in {cert}") from None
        raise TlsFileError("key", key, f"holds no private key that OpenSSL can read{_ssl_why(exc)}") from None
    except OSError as exc:  # removed between the read above and this one
        raise TlsFileError("key", key, f"cannot be read: {exc.strerror or exc}") from None
    # OpenSSL read the paths again: make sure it saw what we read (not a file being replaced).
    for role, path in (("cert", cert), ("key", key)):
        if _read(role, path) != data[role]:
            raise TlsFileError(role, path, "changed while it was being read")
    return data


@dataclass(frozen=True)
class ServerTls:
    """The PEM files of TLS on the coordinator's port (``--tls-cert``, ``--tls-key``, ``--client-ca``).

    Args:
        cert: the server's certificate chain, its own certificate first.
        key: the certificate's private key, unencrypted.
        client_ca: CA certificates that clients' certificates must chain to
            (mTLS); None: clients are not asked for a certificate.
        require_client_cert: with ``client_ca``: True refuses, at the
            handshake, a client without a valid certificate; False lets any
            client connect. gRPC Python cannot ask for a certificate without
            requiring it, so with False clients are not asked for one at all
            and ``client_ca`` is not checked. Ignored without ``client_ca``.

    Raises:
        TypeError: a path is not a ``str`` or ``os.PathLike``.
    """

    cert: Path
    key: Path
    client_ca: Path | None = None
    require_client_cert: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "cert", Path(self.cert))
        object.__setattr__(self, "key", Path(self.key))
        if self.client_ca is not None:
            object.__setattr__(self, "client_ca", Path(self.client_ca))

    @property
    def client_auth(self) -> str:
        """``"require"`` (mTLS), ``"optional"`` (``client_ca`` given, not required) or ``"none"``."""
        if self.client_ca is None:
            return "none"
        return "require" if self.require_client_cert else "optional"

    def describe(self) -> str:
        """``TLS``, or ``mTLS (client certificates required)`` / ``(... optional)``, for the start-up line."""
        if self.client_ca is None:
            return "TLS"
        return f"mTLS (client certificates {'required' if self.require_client_cert else 'optional'})"

    def files(self) -> list[Path]:
        """The files, in the order cert, key, client CA."""
        return [self.cert, self.key] + ([self.client_ca] if self.client_ca is not None else [])

    def check(self) -> dict[str, bytes]:
        """Read and check the files (see :func:`check_pem_files`); returns their contents by role.

        Raises:
            TlsFileError: naming the file that cannot be used.
        """
        return check_pem_files(self.cert, self.key, self.client_ca)


#: What identifies a version of a file on disk: (device, inode, size, mtime ns, ctime ns), or None if missing.
_Stamp = tuple[int, int, int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class ServerCertificates:
    """The loaded server certificate, key and client CA, reloaded when the files change.

    Args:
        tls: the files.

    Raises:
        TlsFileError: a file cannot be used (see :func:`check_pem_files`).

    Thread safety: gRPC calls the fetcher from its own threads, before each
    handshake; :meth:`reload` may run at the same time in the event loop.
    """

    def __init__(self, tls: ServerTls) -> None:
        self.tls = tls
        self._lock = threading.Lock()
        stamps = self._stamps()
        self._initial = self._configuration(tls.check())
        self._seen = stamps
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._ssl: ssl.SSLContext | None = None  # the HTTP port's current context, once it is asked for

    def _stamps(self) -> list[_Stamp]:
        return [_stamp(path) for path in self.tls.files()]

    def _configuration(self, data: dict[str, bytes]) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration([(data["key"], data["cert"])],
                                                         root_certificates=data.get("ca"))

    def credentials(self) -> grpc.ServerCredentials:
        """gRPC server credentials that take the current files at each new handshake."""
        return grpc.dynamic_ssl_server_credentials(
            self._initial, self._fetch,
            require_client_authentication=self.tls.client_auth == "require")

    def ssl_context(self) -> ssl.SSLContext:
        """A server ``ssl.SSLContext`` of the same files (the HTTP port), taking up changed files at each handshake.

        Raises:
            TlsFileError: a file cannot be used now.
        """
        with self._lock:
            base = self._ssl = self._ssl_of(self.tls.check())

        def hello(connection: ssl.SSLObject, _server_name: str | None, context: ssl.SSLContext) -> None:
            try:
                with self._lock:
                    stamps = self._stamps()
                    if stamps != self._seen:
                        self._pending = self._load(stamps) or self._pending  # gRPC's next handshake takes it too
                    current = self._ssl
            except Exception:  # never fail a handshake here: keep the certificate in use
                _log.exception("TLS files not reloaded, the certificate in use stays")
                return
            if current is not None and current is not context:
                connection.context = current

        base.sni_callback = hello
        return base

    def _ssl_of(self, data: dict[str, bytes]) -> ssl.SSLContext:
        """A server context of the files just checked (``data``: their contents by role)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.tls.cert, self.tls.key)
        if self.tls.client_auth == "require":
            context.load_verify_locations(cadata=data["ca"].decode("latin-1"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def reload(self) -> bool:
        """Re-read the files now (SIGHUP), whether or not they look changed.

        Returns:
            True when they were good: new handshakes use them. False when one
            cannot be used: the certificate in use stays, a warning names the file.
        """
        with self._lock:
            config = self._load(self._stamps())
            if config is None:
                return False
            self._pending = config
            return True

    def _load(self, stamps: list[_Stamp]) -> grpc.ServerCertificateConfiguration | None:
        """Load the files whose stamps are ``stamps``; None (and a warning) if they cannot be used."""
        self._seen = stamps  # a bad version is reported once; the next change is tried again
        try:
            data = self.tls.check()
            config = self._configuration(data)
            if self._ssl is not None:
                self._ssl = self._ssl_of(data)
        except (TlsFileError, ssl.SSLError, OSError) as exc:
            _log.warning("TLS files not reloaded, the certificate in use stays: %s", exc)
            return None
        _log.info("TLS files reloaded: certificate %s, key %s%s", self.tls.cert, self.tls.key,
                  f", client CA {self.tls.client_ca}" if self.tls.client_ca is not None else "")
        return config

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's fetcher: a new configuration for the coming handshake, or None to keep the current one."""
        try:
            with self._lock:
                if self._pending is not None:
                    config, self._pending = self._pending, None
                    return config
                stamps = self._stamps()
                if stamps == self._seen:
                    return None
                return self._load(stamps)
        except Exception:  # never let a surprise fail the handshake: keep the certificate in use
            _log.exception("TLS files not reloaded, the certificate in use stays")
            return None
