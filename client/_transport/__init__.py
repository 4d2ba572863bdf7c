"""Reaching a coordinator: addresses and argument checks, TLS, channels, and the call retry loop.

- :mod:`.wire`: argument checks and their conversion to the wire's units (names, TTLs, timeouts,
  addresses, request ids);
- :mod:`.tls`: TLS settings (:class:`~.tls.TlsConfig`) and how channels are opened;
- :mod:`.handshake`: why a TLS handshake failed, in words;
- :mod:`.transport`: the channel to one coordinator at a time, rotation, and every unary call's retries.
"""
