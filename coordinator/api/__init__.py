"""The gRPC surface of LockService: the servicer, what each RPC needs before it runs, and the stream.

Nothing here decides a lock: each RPC checks its admission (:mod:`.rpcs`),
makes one call into :mod:`..recipes`, and answers; a failure leaves as its
gRPC status (:mod:`.status`).
"""
