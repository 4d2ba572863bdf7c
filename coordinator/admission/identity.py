"""Who is calling: the identity of a call's client certificate, or its connection.

With mutual TLS (``--client-ca``), a caller is named by its certificate,
in this order (the rule of SPIFFE-aware servers such as Envoy's and
Consul's, issue 9):

1. the SPIFFE ID: the certificate's first URI SAN that starts with ``spiffe://``;
2. else its first URI SAN;
3. else its first DNS SAN;
4. else its subject's common name.

:func:`caller_of` returns a :class:`Caller`: ``identity`` is that name, or
None when the call came without a verified client certificate (plaintext,
or TLS without mTLS); ``connection`` is always the gRPC peer
(``ipv4:127.0.0.1:50312``), which names one HTTP/2 connection, so it can
stand for the caller where there is no identity (limits "per connection").

The certificate is the one gRPC verified during the handshake (the
``x509_pem_cert`` of the call's auth context), parsed with
``cryptography``; the result is cached by the certificate's bytes, so a
call on a known connection costs one dict lookup.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

__all__ = ["Caller", "caller_of", "identity_of_pem"]


@dataclass(frozen=True, slots=True)
class Caller:
    """The client of one call.

    Attributes:
        identity: the client certificate's identity (see the module's rule), or
            None when the call has no verified client certificate.
        connection: the gRPC peer string of the call's connection (``context.peer()``).
    """

    identity: str | None
    connection: str

    @property
    def key(self) -> str:
        """The identity when there is one, else ``connection:<peer>``: what per-caller limits count by."""
        return self.identity if self.identity is not None else f"connection:{self.connection}"

    def __str__(self) -> str:
        return self.identity if self.identity is not None else f"(no certificate) {self.connection}"


def caller_of(context: Any) -> Caller:
    """The :class:`Caller` of a grpc.aio call.

    Args:
        context: the call's ``grpc.aio.ServicerContext``.

    Returns:
        Its caller; ``identity`` None without a verified client certificate, or
        when the certificate cannot be parsed (never an exception).
    """
    peer = context.peer() or ""
    auth = context.auth_context() or {}
    pem = auth.get("x509_pem_cert")
    if not pem:
        return Caller(None, peer)
    return Caller(identity_of_pem(bytes(pem[0])), peer)


@lru_cache(maxsize=1024)
def identity_of_pem(pem: bytes) -> str | None:
    """The identity of a PEM certificate by the module's rule; None if it names nothing or cannot be parsed.

    Args:
        pem: one PEM-encoded X.509 certificate.
    """
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        return None
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        san = None
    except ValueError:  # a malformed extension: fall back to the subject
        san = None
    if san is not None:
        uris = san.get_values_for_type(x509.UniformResourceIdentifier)
        for uri in uris:
            if uri.startswith("spiffe://"):
                return uri
        if uris:
            return uris[0]
        dns = san.get_values_for_type(x509.DNSName)
        if dns:
            return dns[0]
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if names:
        value = names[0].value
        return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None
