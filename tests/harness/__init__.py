"""Fault-injection harness: real processes on loopback, and ways to hurt them.

- :mod:`tests.harness.proxy`: :class:`~tests.harness.proxy.Proxy`, forward,
  blackhole or cut TCP connections on loopback, per direction.
- :mod:`tests.harness.cluster`: :class:`~tests.harness.cluster.EtcdCluster`, a
  1- or 3-member etcd cluster: kill -9, restart, SIGSTOP/SIGCONT, leader,
  compaction.
- the workload, history and checker modules (see their docstrings).

Coordinators and worker processes come from ``tests/conftest.py``
(``Coordinator`` in-process, ``CoordinatorProcess``, ``ChildProcess``).
"""
