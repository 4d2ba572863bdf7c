"""OpenTelemetry traces exported by ``fencepost serve`` over OTLP: the environment that turns the export on,
the flags and the missing extra that stop it, and the spans an OTLP receiver gets."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.process import main as serve
from fencepost.coordinator.process.embedded import EmbeddedEtcd
from fencepost.coordinator.telemetry.tracing import DEFAULT_SERVICE_NAME, TracingUnavailable, export_from_environment

from .conftest import LISTENING, ChildProcess, child_env
from .owned_stub import OwnedStub
from .trace_spans import LOCKS, PARENT_ID, TRACE_ID, TRACEPARENT


def test_export_from_environment_when_off_or_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """No endpoint variable, or OTEL_SDK_DISABLED=true: no provider. An endpoint: an SDK provider named
    fencepost-coordinator unless OTEL_SERVICE_NAME names the service."""
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert export_from_environment({}) is None
    assert export_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}) is None
    assert export_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                                    "OTEL_SDK_DISABLED": "true"}) is None
    export = export_from_environment({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1"})
    assert export is not None and export.protocol == "grpc" and export.endpoint == "http://127.0.0.1:1"
    try:
        assert export.provider.resource.attributes["service.name"] == DEFAULT_SERVICE_NAME  # type: ignore[attr-defined]
    finally:
        export.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "locks-eu")
    export = export_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})
    assert export is not None
    try:
        assert export.provider.resource.attributes["service.name"] == "locks-eu"  # type: ignore[attr-defined]
    finally:
        export.shutdown()
    with pytest.raises(TracingUnavailable, match="protocol 'http/json'"):
        export_from_environment({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1",
                                 "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


@pytest.mark.parametrize("missing", ["opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"])
def test_serve_when_the_tracing_extra_is_missing(missing: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """OTEL_EXPORTER_OTLP_ENDPOINT set without the SDK or the exporter: exit 2 with one line saying what to
    install, before anything starts."""
    monkeypatch.setitem(sys.modules, missing, None)  # import fails as if not installed
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    assert serve.main(["--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fencepost serve: error: OTEL_EXPORTER_OTLP_ENDPOINT is set but ")
    assert "fencepost[tracing]" in err[0]
    assert not (tmp_path / "data").exists()


def test_serve_when_trace_lock_names_variable_is_bad(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """FENCEPOST_TRACE_LOCK_NAMES must be true or false: exit 2 naming it."""
    monkeypatch.setenv("FENCEPOST_TRACE_LOCK_NAMES", "maybe")
    assert serve.main(["--listen", "127.0.0.1:0"]) == 2
    assert "FENCEPOST_TRACE_LOCK_NAMES is 'maybe'" in capsys.readouterr().err


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver keeping what it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    async def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,  # noqa: N802 - the RPC's name
                     context: grpc.aio.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[tuple[str, Any]]:
        """(service.name, span) of every span received."""
        out = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                out.extend((service, span) for scope in resource_spans.scope_spans for span in scope.spans)
        return out


async def test_serve_exports_spans_over_otlp(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> None:
    """`fencepost serve` with OTEL_EXPORTER_OTLP_ENDPOINT sends its spans to that OTLP receiver (sent at the
    latest at shutdown), as service fencepost-coordinator, in the caller's trace, without lock names when
    --no-trace-lock-names."""
    collector = _Collector()
    receiver = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, receiver)
    port = receiver.add_insecure_port("127.0.0.1:0")
    await receiver.start()
    env = child_env()
    for name in [n for n in env if n.startswith("OTEL_")]:
        del env[name]
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}", "OTEL_EXPORTER_OTLP_INSECURE": "true"})
    argv = [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0", "--etcd-endpoints",
            etcd.endpoint, "--prefix", prefix, "--no-trace-lock-names"]
    child = ChildProcess(argv, log_path=tmp_path / "serve.log", env=env)
    try:
        serving_port = (await child.await_line(LISTENING, 30)).group(2)
        await child.await_line(re.escape(f"traces to http://127.0.0.1:{port} (OTLP grpc), without lock names"), 10)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{serving_port}") as channel:
            stub = OwnedStub(channel)
            grant = await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=5),
                                          metadata=(("traceparent", TRACEPARENT),))
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=grant.lease_id))
        child.signal(signal.SIGTERM)
        assert await asyncio.to_thread(child.proc.wait, 30) == 0
    finally:
        child.kill()
        await receiver.stop(0)
    spans = collector.spans()
    granted = [span for service, span in spans
               if service == DEFAULT_SERVICE_NAME and span.name == f"{LOCKS}/LeaseGrant"]
    assert len(granted) == 1, [(service, span.name) for service, span in spans]
    assert granted[0].trace_id.hex() == TRACE_ID and granted[0].parent_span_id.hex() == PARENT_ID
    etcd_grant = [span for _, span in spans if span.name == "etcdserverpb.Lease/LeaseGrant"]
    assert len(etcd_grant) == 1 and etcd_grant[0].parent_span_id == granted[0].span_id
    assert not [span for _, span in spans if any(a.key == "fencepost.lock.name" for a in span.attributes)]
