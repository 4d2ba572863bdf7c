"""The algorithms on etcd: locks, lock-delays, semaphores, elections, leases, the token floor (its
high-water mark kept in the data directory, the guard of the Txns that create keys), request records,
listings, the deletion watcher and the hold tracker.

Each module takes plain arguments (names, lease ids, tokens) and the etcd
layer (:mod:`..etcd`); none knows gRPC, callers' identities or the access
policy, so each can be tested without a server.
"""
