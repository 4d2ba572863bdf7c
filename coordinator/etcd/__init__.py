"""The coordinator's etcd layer: the only code of the coordinator that talks to etcd.

- :mod:`.members`: endpoints (host names or addresses), TLS and mTLS,
  credentials, one channel per member with failover rotation.
- :mod:`.failures`: the failure table (gRPC code and etcd message -> Failure)
  and the retry table (per operation: attempts, re-send, read back); the
  coordinator's error for a failure (:func:`~.failures.etcd_unavailable`,
  :class:`~.failures.EtcdRefused`).
- :mod:`.calls`: how one call is sent (member, auth token, deadline and
  retry rule, read-back of an unknown outcome, its span), and
  :class:`~.calls.TxnPlan` (a Txn and its read-back).
- :mod:`.client`: :class:`EtcdClient`, every etcd call (Range, Txn with
  read-back resolution, leases, the deletion watch, auth).
- :mod:`.keepalive`: the shared multi-lease LeaseKeepAlive stream.
- :mod:`.batch`: concurrent lock Txns of different locks sent as one etcd
  Txn of nested Txns (``EtcdClient.lock_txn``).
- :mod:`.deadline`: the caller's deadline, carried to each etcd call.

The compares and ops of the lock algorithm are built by
:mod:`fencepost.client.v1.etcdops`, shared with the client's etcd fencing guard.
"""

from .calls import NOT_APPLIED, Stubs, TxnPlan
from .client import EtcdClient
from .deadline import bounded, unbounded
from .failures import (
    FAILURES,
    RULES,
    EtcdRefused,
    Failure,
    Op,
    Rule,
    classify,
    error_for,
    etcd_refused,
    etcd_unavailable,
)
from .members import EtcdAuth, EtcdTls, check_endpoints, parse_endpoint

__all__ = [
    "FAILURES",
    "NOT_APPLIED",
    "RULES",
    "EtcdAuth",
    "EtcdClient",
    "EtcdRefused",
    "EtcdTls",
    "Failure",
    "Op",
    "Rule",
    "Stubs",
    "TxnPlan",
    "bounded",
    "check_endpoints",
    "classify",
    "error_for",
    "etcd_refused",
    "etcd_unavailable",
    "parse_endpoint",
    "unbounded",
]
