"""When the coordinator's certificates expire: a metric, and a warning ahead of time.

:class:`CertificateExpiry` reads, every :data:`CHECK_INTERVAL` seconds, the
certificate files the coordinator uses (its serving certificate
``--tls-cert``, its etcd client certificate ``--etcd-cert``), as they are
on disk (both are read again when they change, so a renewed file counts
from the next check), and

- sets ``fencepost_certificate_expiry_timestamp_seconds{certificate, file}``
  to the first certificate's notAfter as a Unix timestamp
  (``certificate`` is ``serving`` or ``etcd_client``); the alert rule
  ``FencepostCertificateExpiresSoon`` in deploy/observability/alerts.yaml
  fires when it is less than 7 days ahead;
- logs a warning (event ``certificate_expiring``, or ``certificate_expired``)
  naming the file and its expiry once per certificate version when it is
  less than :data:`WARN_BEFORE_SECONDS` ahead, and once more (an error)
  when it is past.

:func:`validity` is the one reading of a certificate's dates (with
``cryptography``); :func:`expiry_problem` words an expired or not yet
valid certificate for the log lines of failed handshakes.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge

from .events import log_event

__all__ = ["CHECK_INTERVAL", "ROLES", "WARN_BEFORE_SECONDS", "CertificateExpiry", "expiry_gauge", "expiry_problem",
           "iso", "validity"]

_log = logging.getLogger("fencepost.coordinator")

#: Seconds between two readings of the certificate files.
CHECK_INTERVAL = 300.0
#: How long before its expiry a certificate is warned about, in seconds (7 days, as the alert rule).
WARN_BEFORE_SECONDS = 7 * 86400.0
#: The certificates watched, as the ``certificate`` label says them, and the flag of each.
ROLES = {"serving": "--tls-cert", "etcd_client": "--etcd-cert"}


def expiry_gauge(registry: CollectorRegistry) -> Gauge:
    """Register ``fencepost_certificate_expiry_timestamp_seconds{certificate, file}`` in ``registry``."""
    return Gauge("fencepost_certificate_expiry_timestamp_seconds",
                 "When each certificate file the coordinator uses expires (its notAfter), as a Unix timestamp; "
                 "certificate: serving (--tls-cert) or etcd_client (--etcd-cert).",
                 ["certificate", "file"], registry=registry)


def validity(pem: bytes) -> tuple[datetime.datetime, datetime.datetime] | None:
    """(notBefore, notAfter) of the first certificate in ``pem``, aware UTC; None if none can be read."""
    from cryptography import x509  # the coordinator extra's; imported when a certificate is read

    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    return cert.not_valid_before_utc, cert.not_valid_after_utc


def iso(moment: datetime.datetime) -> str:
    """``moment`` as ``2026-12-02T07:30:00Z``."""
    return moment.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expiry_problem(what: str, path: str | Path | None, pem: bytes | None,
                   now: datetime.datetime | None = None) -> str | None:
    """Why the certificate ``pem`` (read from ``path``) is not valid at ``now``, in words; None if it is.

    Args:
        what: How to name it (``"the etcd client certificate --etcd-cert"``).
        path: Its file, named in the words.
        pem: Its PEM; None: no certificate, no problem.
        now: The time to judge at; the current time by default.
    """
    dates = validity(pem) if pem else None
    if dates is None:
        return None
    now = now or datetime.datetime.now(datetime.timezone.utc)
    if now >= dates[1]:
        return f"{what} ({path}) expired at {iso(dates[1])}"
    if now < dates[0]:
        return f"{what} ({path}) is not valid until {iso(dates[0])} (check the clocks)"
    return None


class CertificateExpiry:
    """The expiry of the coordinator's certificate files: a gauge, and warnings ahead of it.

    Args:
        files: The file of each certificate watched, by role (a key of :data:`ROLES`).
        gauge: The :func:`expiry_gauge` to set; None without a metrics endpoint.
        warn_before: Seconds before its expiry from which a certificate is warned about.
    """

    def __init__(self, files: Mapping[str, Path | str], gauge: Gauge | None = None,
                 warn_before: float = WARN_BEFORE_SECONDS) -> None:
        self.files = {role: Path(path) for role, path in files.items()}
        self.warn_before = warn_before
        self._told: set[tuple[str, datetime.datetime, bool]] = set()  # (role, expiry, expired) warned about
        self._gauge = gauge

    def check(self, now: datetime.datetime | None = None) -> dict[str, datetime.datetime]:
        """Read each file now: set the gauge, warn (once per certificate version) when its expiry is near.

        Args:
            now: The time to judge at; the current time by default.

        Returns:
            The expiry (notAfter) of each certificate that could be read, by role. A file that cannot be
            read is skipped (the TLS reload logs its own warning).
        """
        now = now or datetime.datetime.now(datetime.timezone.utc)
        expiries: dict[str, datetime.datetime] = {}
        for role, path in self.files.items():
            try:
                dates = validity(path.read_bytes())
            except OSError:
                dates = None
            if dates is None:
                continue
            expiry = expiries[role] = dates[1]
            if self._gauge is not None:
                self._gauge.labels(role, str(path)).set(expiry.timestamp())
            left = (expiry - now).total_seconds()
            told = (role, expiry, left <= 0)
            if left > self.warn_before or told in self._told:
                continue
            self._told.add(told)
            what = f"the {role.replace('_', ' ')} certificate {ROLES.get(role, '')} ({path})"
            if left <= 0:
                log_event(_log, logging.ERROR, "certificate_expired", f"{what} expired at {iso(expiry)}: renew it "
                          f"(the file is read again when it changes)", certificate=role, file=str(path),
                          expires=iso(expiry))
            else:
                log_event(_log, logging.WARNING, "certificate_expiring", f"{what} expires at {iso(expiry)}, in "
                          f"{left / 86400:.1f} days: renew it (the file is read again when it changes)",
                          certificate=role, file=str(path), expires=iso(expiry))
        return expiries

    async def run(self, interval: float = CHECK_INTERVAL) -> None:
        """:meth:`check` now and every ``interval`` seconds, until cancelled."""
        while True:
            self.check()
            await asyncio.sleep(interval)
