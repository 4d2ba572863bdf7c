"""Leases kept alive: the lease and its local deadline, the pool of leases by TTL, the KeepAlive stream.

- :mod:`.lease`: a lease's deadline rules, the pool of leases by TTL with their holds and local exclusion;
- :mod:`.stream`: the one KeepAlive stream of a client (keepalives, watches, HoldEnded, reconnects);
- :mod:`.deadlines`: leases lost at their local deadline, idle leases retired;
- :mod:`.calls`: Acquire, Release and Withdraw sent as messages on that stream.
"""
