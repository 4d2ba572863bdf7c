"""Fencepost coordinator: the grpc.aio LockService on etcd.

Its parts, by concern:

- :mod:`.api`: the gRPC surface (the servicer, each RPC's admission, the KeepAlive stream);
- :mod:`.http`: the HTTP/JSON API, the same servicer behind HTTP routes (``--http-listen``);
- :mod:`.recipes`: the algorithms on etcd (locks, semaphores, elections, leases, the token floor, ...);
- :mod:`.admission`: who may call and how much (identity, access policy, ownership, limits, overload);
- :mod:`.telemetry`: log events, metrics, the ``/metrics`` endpoint, traces;
- :mod:`.process`: the coordinator as a process (``fencepost serve``, the Coordinator, workers, ...);
- :mod:`.etcd`: the etcd layer, the only code that calls etcd.

Each folder imports only the ones below it: process > http > api > recipes > admission > etcd > telemetry
(``tests/test_boundaries.py`` checks it).
"""
