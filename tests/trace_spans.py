"""Reading OpenTelemetry spans in tests: :class:`Spans`, a tracer provider whose finished spans are kept in
memory, the ids of a span (:func:`span_id`, :func:`trace_id`, :func:`parent_of`), and a W3C ``traceparent``
from a caller outside (:data:`TRACEPARENT`: trace :data:`TRACE_ID`, parent span :data:`PARENT_ID`)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from .conftest import wait_for


LOCKS = "fencepost.v1.LockService"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class Spans:
    """A tracer provider whose finished spans are kept in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def finished(self) -> list[ReadableSpan]:
        """The spans ended so far, in the order they ended."""
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        """The ended spans called ``name``."""
        return [s for s in self.finished() if s.name == name]

    async def one(self, name: str, **attributes: Any) -> ReadableSpan:
        """The one span called ``name`` with ``attributes``, once it has ended (a server span ends after its
        call's answer is sent)."""
        def found() -> list[ReadableSpan]:
            return [s for s in self.named(name)
                    if all(s.attributes.get(k) == v for k, v in attributes.items())]  # type: ignore[union-attr]

        await wait_for(lambda: found(), 10, 0.01, f"a span {name} {attributes}")
        spans = found()
        assert len(spans) == 1, spans
        return spans[0]

    def under(self, ancestor: ReadableSpan) -> list[ReadableSpan]:
        """The ended spans of this provider that descend from ``ancestor`` (through spans of this provider)."""
        by_id = {s.context.span_id: s for s in self.finished()}  # type: ignore[union-attr]
        out = []
        for span in by_id.values():
            parent = span.parent
            while parent is not None:
                if parent.span_id == ancestor.context.span_id:  # type: ignore[union-attr]
                    out.append(span)
                    break
                up = by_id.get(parent.span_id)
                parent = up.parent if up is not None else None
        return out

    def shutdown(self) -> None:
        self.provider.shutdown()


def parent_of(span: ReadableSpan) -> int | None:
    """The span id of ``span``'s parent; None for a root span."""
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    """``span``'s own span id."""
    assert span.context is not None
    return span.context.span_id


def trace_id(span: ReadableSpan) -> int:
    """The id of ``span``'s trace."""
    assert span.context is not None
    return span.context.trace_id
