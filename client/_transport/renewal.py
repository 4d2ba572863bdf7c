"""A client's TLS files read again when they change on disk, and its own certificate's validity in words.

cert-manager, the kubelet (a Secret volume's ``..data`` symlink swap) and
most renewal tools replace a certificate by swapping new files in (a rename
over the old file, or a symlink moved to a new directory). A
:class:`~.tls.Security` remembers what identified each of its files when it
read them (:data:`Stamp`: device, inode, size, modification and change
time, through symlinks); :func:`changed` says whether the files on disk are
another version, and :func:`reload` reads them again into a new
``Security``. The connection does so each time it opens a channel, and
before it waits for a channel that is not connected (see
:mod:`.connection`): a renewed certificate is used at the next handshake,
while established connections keep theirs (a handshake is made only once
per connection). gRPC Python has no client credentials that are asked for
at each handshake (the server side has ``dynamic_ssl_server_credentials``),
hence a new channel.

A version that cannot be used (a half-written file, a key that is not the
certificate's: a swap of two files seen between its two renames) keeps the
credentials in use, with one warning naming the file; the next change is
tried again.

:func:`validity_problem` says when the client's own certificate has
expired or is not valid yet (from ``cryptography`` when it is installed, as
it is with ``fencepost[coordinator]``; without it the dates are not known):
the connection logs it once when a coordinator refuses a handshake.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import InvalidArgument

if TYPE_CHECKING:
    from .tls import Security, TlsConfig

__all__ = ["Stamp", "Validity", "changed", "reload", "stamps", "validity", "validity_problem"]

log = logging.getLogger("fencepost.client")

#: What identifies one version of a file: (device, inode, size, mtime ns, ctime ns), or None when it is missing.
Stamp = tuple[int, int, int, int, int] | None


def stamps(paths: tuple[str | None, ...]) -> tuple[Stamp, ...]:
    """The :data:`Stamp` of each of ``paths`` (None for a path not given or missing), following symlinks."""
    out: list[Stamp] = []
    for path in paths:
        try:
            st = os.stat(path) if path else None
        except OSError:
            st = None
        out.append(None if st is None else (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(out)


def changed(security: Security) -> bool:
    """Whether the files ``security`` was read from are now another version (never for ready credentials)."""
    return security.config is not None and stamps(security.files) != security.stamps


def reload(security: Security, read: Callable[[TlsConfig], Security]) -> Security:
    """``security``, or a new one read from its files when they changed on disk.

    Args:
        security: The Security in use.
        read: Reads and checks a TlsConfig (:func:`~.tls.security`).

    Returns:
        A new Security from the new files; ``security`` itself when they did
        not change, or (with the new stamps, so that the next change is
        tried again) when the new version cannot be used: a warning names the
        file, and the credentials in use stay.
    """
    if security.config is None or not changed(security):
        return security
    now = stamps(security.files)
    try:
        fresh = read(security.config)
    except InvalidArgument as err:
        log.warning("fencepost: TLS files changed but cannot be used, the ones read before stay: %s", err.message)
        return dataclasses.replace(security, stamps=now)
    if fresh.cert is not None:
        until = f" (valid until {_iso(fresh.validity.not_after)})" if fresh.validity is not None else ""
        log.info("fencepost: TLS files read again: certificate %s%s, key %s", fresh.cert, until, fresh.key)
    else:
        log.info("fencepost: TLS files read again: CA %s", security.config.ca)
    return fresh


@dataclasses.dataclass(frozen=True)
class Validity:
    """When a certificate is valid: from ``not_before`` to ``not_after`` (aware UTC datetimes)."""

    not_before: datetime.datetime
    not_after: datetime.datetime


def validity(pem: bytes | None) -> Validity | None:
    """The validity of the first certificate in ``pem``; None without ``cryptography`` or a readable certificate."""
    if not pem:
        return None
    try:
        from cryptography import x509
    except ImportError:
        return None
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    return Validity(cert.not_valid_before_utc, cert.not_valid_after_utc)


def validity_problem(security: Security, now: datetime.datetime | None = None) -> str | None:
    """Why the client certificate in use is not valid at ``now`` (default: the current time), or None.

    Returns:
        ``"the client certificate in tls.cert (PATH) expired at 2026-12-02T07:30:00Z"``,
        ``"... is not valid until ..."``, or None (valid, no client
        certificate, or its dates unknown).
    """
    if security.cert is None or security.validity is None:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now > security.validity.not_after:
        return f"the client certificate in tls.cert ({security.cert}) expired at {_iso(security.validity.not_after)}"
    if now < security.validity.not_before:
        return (f"the client certificate in tls.cert ({security.cert}) is not valid until "
                f"{_iso(security.validity.not_before)}; check the clocks")
    return None


def _iso(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
