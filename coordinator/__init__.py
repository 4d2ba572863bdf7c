"""Fencepost coordinator: the grpc.aio LockService on etcd."""
