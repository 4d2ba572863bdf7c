"""Reaching a coordinator: addresses and argument checks, TLS, channels, and the call retry loop.

- :mod:`.wire`: argument checks and their conversion to the wire's units (names, TTLs, timeouts,
  addresses, request ids);
- :mod:`.tls`: TLS settings (:class:`~.tls.TlsConfig`) and how channels are opened;
- :mod:`.renewal`: the TLS files read again when they change on disk, the own certificate's validity;
- :mod:`.handshake`: why a TLS handshake failed, in words;
- :mod:`.connection`: the channel to one coordinator at a time, rotation, waiting for a connection;
- :mod:`.transport`: every unary call's retries, error mapping and span, over that connection.
"""
