"""What the LockService servicer reads of a call's ``grpc.aio.ServicerContext``, taken from an HTTP request.

The servicer methods answer HTTP requests as they answer gRPC calls (and
calls sent on a KeepAlive stream, :mod:`..api.stream_calls`): they read the
caller's address and certificate, the call's metadata and its deadline, and
end a refused call with ``abort_with_status``. :func:`context_of` makes an
:class:`HttpCallContext` from a request:

- ``peer()``: ``ipv4:ADDRESS`` or ``ipv6:[ADDRESS]`` of the client, without
  its port (``unix:`` for a Unix socket): an HTTP client opens a connection
  per request or few, so a caller without a certificate is counted by its
  address (the limits per caller), not by its connection as on gRPC;
- ``auth_context()``: with TLS, the client certificate the handshake
  verified, as gRPC gives it (``x509_pem_cert``), so that the caller's
  identity (:func:`~..admission.identity.caller_of`), the access policy and
  the ownership of leases are the gRPC port's;
- ``invocation_metadata()``: the lease secret (header :data:`SECRET_HEADER`)
  and the W3C ``traceparent`` header, as the gRPC metadata entries;
- ``time_remaining()``: from the header :data:`TIMEOUT_HEADER`
  (milliseconds, as ``KeepAliveRequest.timeout_ms``); none without it.

``abort_with_status`` raises :class:`~..api.stream_calls.CallAborted`
carrying the status, which the HTTP layer answers (:mod:`.status`).
``send_initial_metadata`` (a stream accepted: KeepAlive, Observe) sets
:attr:`HttpCallContext.accepted`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from typing import Any

from aiohttp import web

from fencepost.client.errors import InvalidArgument

from ..admission.ownership import SECRET_METADATA
from ..api.stream_calls import StreamCallContext

__all__ = ["SECRET_HEADER", "TIMEOUT_HEADER", "TRACEPARENT_HEADER", "HttpCallContext", "context_of", "peer_of"]

#: The request header that carries the lease secret (the gRPC metadata entry ``fencepost-lease-secret``).
SECRET_HEADER = "Fencepost-Lease-Secret"
#: The request header that bounds a call, in milliseconds (0 or absent: no bound), as a gRPC deadline does.
TIMEOUT_HEADER = "Fencepost-Timeout-Ms"
#: The W3C trace context header (https://www.w3.org/TR/trace-context/).
TRACEPARENT_HEADER = "traceparent"
#: Longest ``Fencepost-Timeout-Ms`` taken: a day, as ``wait_ms``.
MAX_TIMEOUT_MS = 86_400_000


class HttpCallContext(StreamCallContext):
    """The servicer's view of one HTTP request (see the module docstring).

    Attributes:
        accepted: set when the call's stream is accepted (its ``send_initial_metadata``).
        initial_metadata: the pairs it sent then.
    """

    __slots__ = ("accepted", "initial_metadata")

    def __init__(self, peer: str, auth: Any, metadata: tuple[tuple[str, str], ...], deadline: float | None) -> None:
        super().__init__(peer, auth, metadata, deadline)
        self.accepted = asyncio.Event()
        self.initial_metadata: tuple[tuple[str, str], ...] = ()

    async def send_initial_metadata(self, metadata: Any) -> None:
        """A stream call says it is accepted (with its initial metadata)."""
        self.initial_metadata = tuple(metadata)
        self.accepted.set()

    def set_code(self, code: Any) -> None:
        """Ignored: the HTTP answer comes from ``abort_with_status`` or the returned message."""

    def set_details(self, details: str) -> None:
        """Ignored, as :meth:`set_code`."""


def peer_of(request: web.BaseRequest) -> str:
    """The client's address as the servicer sees it: ``ipv4:1.2.3.4``, ``ipv6:[::1]`` or ``unix:`` (no port)."""
    transport = request.transport
    name = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(name, tuple) and name:
        host = str(name[0])
        return f"ipv6:[{host}]" if ":" in host else f"ipv4:{host}"
    return "unix:"


def _auth(request: web.BaseRequest) -> dict[str, list[bytes]]:
    """The TLS facts of the request's connection as gRPC's ``auth_context()`` gives them ({} in plaintext)."""
    transport = request.transport
    tls = transport.get_extra_info("ssl_object") if transport is not None else None
    if tls is None:
        return {}
    auth = {"transport_security_type": [b"ssl"]}
    der = tls.getpeercert(binary_form=True)
    if der:  # verified: the context asks for a certificate only with a client CA, and then verifies it
        auth["x509_pem_cert"] = [ssl.DER_cert_to_PEM_cert(der).encode()]
    return auth


def context_of(request: web.BaseRequest) -> HttpCallContext:
    """The context of the call an HTTP request makes.

    Raises:
        InvalidArgument: the :data:`TIMEOUT_HEADER` is not a whole number of milliseconds,
            0 to :data:`MAX_TIMEOUT_MS` (field ``Fencepost-Timeout-Ms``).
    """
    metadata = []
    secret = request.headers.get(SECRET_HEADER)
    if secret:
        metadata.append((SECRET_METADATA, secret))
    traceparent = request.headers.get(TRACEPARENT_HEADER)
    if traceparent:
        metadata.append(("traceparent", traceparent))
    deadline = None
    timeout = request.headers.get(TIMEOUT_HEADER)
    if timeout is not None:
        text = timeout.strip()
        if not (text.isascii() and text.isdigit()) or int(text) > MAX_TIMEOUT_MS:
            raise InvalidArgument(f"{TIMEOUT_HEADER} is {timeout!r}; must be 0 to {MAX_TIMEOUT_MS} milliseconds",
                                  field=TIMEOUT_HEADER)
        if int(text):
            deadline = time.monotonic() + int(text) / 1000
    return HttpCallContext(peer_of(request), _auth(request), tuple(metadata), deadline)
