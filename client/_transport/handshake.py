"""Why a TLS handshake with a coordinator failed, from gRPC's words or from a handshake of our own.

gRPC tells the handshake error only in the details of the UNAVAILABLE
status of a call made while the channel is in TRANSIENT_FAILURE
(``channel_ready()`` says nothing). :func:`cause` reads those details.
What gRPC 1.85.3 writes after ``failed to connect to all addresses; last
error:``, seen against real grpc.aio servers with trustme certificates:

=========================================  ===============================================================
case                                       gRPC's last error
=========================================  ===============================================================
coordinator certificate from another CA    ``UNKNOWN: ipv4:127.0.0.1:P: Tls handshake failed
                                           (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:1000007d:SSL
                                           routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: unable to
                                           get local issuer certificate: OK``
its certificate expired                    ``... CERTIFICATE_VERIFY_FAILED: certificate has expired: OK``
its certificate without the name checked   ``UNKNOWN: ipv4:...: Custom verification check failed with
                                           error: UNAUTHENTICATED: Hostname Verification Check failed.``
TLS client, plaintext coordinator          ``... Tls handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL:
                                           ...:WRONG_VERSION_NUMBER: Invalid certificate verification
                                           context: OK``
client certificate required, none given    ``UNAVAILABLE: ipv4:...: Socket closed``
client certificate from another CA         ``UNAVAILABLE: ipv4:...: Socket closed``
plaintext client, TLS coordinator          ``UNAVAILABLE: ipv4:...: Socket closed``
=========================================  ===============================================================

The first four are certain from the text. In the last three the gRPC
server closes the connection without a TLS alert, and "Socket closed" alone
could be anything; :func:`diagnose` then makes one handshake of its
own with Python's :mod:`ssl` (ALPN ``h2``, the client's certificate; the
coordinator's is not checked again: gRPC accepted it, or would have said
so) and concludes only from what it sees: a TLS handshake that completes means the
coordinator speaks TLS (a plaintext client cannot talk to it); a connection
closed right after a completed TLS 1.3 handshake, before the server's first
HTTP/2 frame, means the coordinator refused the client's certificate (or
its lack of one). Anything else is left to the caller's retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl

from . import renewal, wire
from .tls import Security, no_password
from ..errors import TlsError

__all__ = ["cause", "diagnose", "failure"]

_OPENSSL = re.compile(r"OPENSSL_internal:(?P<code>[A-Z0-9_]+)(?::\s*(?P<text>[^:]*))?")
_HANDSHAKE = re.compile(r"(?:tls|ssl) handshake failed", re.IGNORECASE)
_CLOSED = re.compile(r"socket closed|connection reset", re.IGNORECASE)
_CLOSE_SECONDS = 0.5  # the longest wait for a probe's connection to close
_UNTRUSTED = ("unable to get local issuer certificate", "unable to get issuer certificate",
              "self signed certificate", "self-signed certificate", "unable to verify the first certificate")


def cause(security: Security, details: str, address: str) -> str | None:
    """Why a connection failed, when gRPC's status details say it was TLS; None otherwise.

    Args:
        security: How the client's channels are made.
        details: The details of an UNAVAILABLE status of a call that did not
            reach a server (see the table in this module's docstring).
        address: The coordinator address dialled.

    Returns:
        The cause in words (``"the coordinator's certificate has expired
        (CERTIFICATE_VERIFY_FAILED: certificate has expired)"``), or None
        when the text does not show a TLS failure.
    """
    if not security.tls:
        return None
    if "hostname verification check failed" in details.lower():
        name = security.name_checked(address)
        fix = "tls.server_name" if security.server_name else "set tls.server_name to a name it carries"
        return f"the coordinator's certificate does not name {name!r} ({fix})"
    match = _OPENSSL.search(details)
    if match is None or not _HANDSHAKE.search(details):
        return None
    code, text = match["code"], (match["text"] or "").strip()
    said = f"{code}: {text}" if text else code
    if code == "CERTIFICATE_VERIFY_FAILED":
        if "expired" in text:
            return f"the coordinator's certificate has expired ({said})"
        if "not yet valid" in text:
            return f"the coordinator's certificate is not valid yet; check the clocks ({said})"
        if any(phrase in text for phrase in _UNTRUSTED):
            return f"the coordinator's certificate is not signed by a CA in {security.trusted} ({said})"
        return f"the coordinator's certificate failed verification ({said})"
    if code == "WRONG_VERSION_NUMBER":
        return f"the coordinator does not speak TLS ({code}): connect without tls, or serve TLS there"
    if "ALERT" in code:
        return _refused(security, code)
    return f"the TLS handshake failed ({said})"


def _refused(security: Security, why: str) -> str:
    """The cause when the coordinator refused this client's certificate, or its lack of one."""
    if security.opaque:
        return (f"the coordinator refused this client ({why}): it requires a client certificate, "
                f"or does not trust the one in the given credentials")
    if security.cert is None:
        return f"the coordinator requires a client certificate, and none was given: set tls.cert and tls.key ({why})"
    problem = renewal.validity_problem(security)
    if problem is not None:
        return f"the coordinator refused the client certificate: {problem} ({why})"
    return (f"the coordinator refused the client certificate in tls.cert ({security.cert}): it is not signed "
            f"by a CA the coordinator trusts, or has expired ({why})")


async def diagnose(security: Security, details: str, address: str, timeout: float) -> str | None:
    """Find out, with one TLS handshake of its own, why gRPC saw the connection closed.

    Only when ``details`` says the peer closed the connection ("Socket
    closed", "Connection reset"); see the module docstring.

    Args:
        security: How the client's channels are made.
        details: gRPC's status details of the failed connection.
        address: The coordinator address.
        timeout: Seconds the probe may take.

    Returns:
        The cause in words, or None when the probe does not show a TLS failure.
    """
    if not _CLOSED.search(details):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False  # gRPC checked the coordinator already: a failure would have said so
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if security.tls and security.cert is not None and security.key is not None:
        try:
            context.load_cert_chain(security.cert, security.key, password=no_password)
        except (OSError, ValueError, ssl.SSLError):
            return None  # the files changed since the client was made
    name = security.name_checked(address)
    try:
        async with asyncio.timeout(timeout):
            return await _probe(security, context, address, name)
    except (TimeoutError, OSError, ssl.SSLError):
        return None


async def _probe(security: Security, context: ssl.SSLContext, address: str, name: str) -> str | None:
    """One TLS handshake with ``address``, then the first byte: what they show (see :func:`diagnose`)."""
    path = wire.unix_path(address)
    try:
        if path is not None:
            reader, writer = await asyncio.open_unix_connection(path, ssl=context, server_hostname=name)
        else:
            host, port = wire.host_port(address) or ("", 0)
            reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=name)
    except ssl.SSLError as err:
        reason = err.reason or ""
        return _refused(security, reason) if security.tls and "ALERT" in reason else None
    try:
        if not security.tls:
            return "the coordinator speaks TLS, and this client connects without it"
        try:
            first = await reader.read(1)
        except (ConnectionError, ssl.SSLEOFError):  # closed, with or without a TCP reset or TLS close_notify
            first = b""
        except ssl.SSLError as err:
            reason = err.reason or ""
            return _refused(security, reason) if "ALERT" in reason else None
        ssl_object = writer.get_extra_info("ssl_object")
        version = ssl_object.version() if ssl_object is not None else None
        if first or version != "TLSv1.3":
            return None  # the coordinator answered: something else closed gRPC's connection
        return _refused(security, "it closed the connection after the TLS handshake")
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), _CLOSE_SECONDS)


async def failure(security: Security, details: str, address: str, timeout: float) -> TlsError | None:
    """The TlsError for a connection that failed with ``details``, or None when TLS is not why.

    Reads the details (:func:`cause`), and when they only say the
    connection was closed, probes the coordinator (:func:`diagnose`).

    Args:
        security: How the client's channels are made.
        details: gRPC's status details of the failed connection.
        address: The coordinator address.
        timeout: Seconds a probe may take.
    """
    why = cause(security, details, address)
    if why is None:
        why = await diagnose(security, details, address, timeout)
        if why is None:
            return None
    if security.tls:
        message = f"TLS handshake with {address} failed: {why}"
    else:
        message = f"plaintext connection to {address} failed: {why} (give tls)"
    return TlsError(message, address=address, cause=why)
