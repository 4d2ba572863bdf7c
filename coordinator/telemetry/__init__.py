"""What the coordinator tells operators: log events, the ``fencepost_*`` metrics, the gRPC server
metrics interceptor, the ``/metrics`` endpoint and traces."""
