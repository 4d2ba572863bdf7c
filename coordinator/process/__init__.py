"""The coordinator as a process: ``fencepost serve`` (:mod:`.main`, its flags :mod:`.flags`), the
:class:`~.coordinator.Coordinator` (gRPC server, health, shutdown), workers, the embedded etcd, the
event loop, listeners, TLS, health, and ``fencepost admin``'s commands on etcd."""
