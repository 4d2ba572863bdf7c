"""Lifecycle log events: one log line per grant, release, loss, refusal, stream, etcd change and shutdown.

Every lifecycle event goes through :func:`log_event`, which records a stable
snake_case event name and its fields (fixed key names: ``name``,
``lease_id``, ``token``, ``reason``, ``peer``, ``trace_id``, ...) on the
log record. :func:`configure` installs one of two formatters on stderr:

- ``text``: the usual ``TIME LEVEL LOGGER: message`` line with the fields
  appended as ``key=value`` (values with spaces or quotes are JSON-quoted);
- ``json``: one JSON object per line (python-json-logger) with ``time``
  (RFC 3339, UTC), ``level``, ``logger``, ``message``, ``event`` and the
  event's fields. Log lines that are not events carry no ``event``.

``auto`` is text when the stream is a terminal, json otherwise. The list of
events, their fields and levels is in docs/operations.md ("Logs"). No event
carries a secret: fields are lock names, ids, tokens, reasons and peers.

The trace id of a call's events is that of its span when the coordinator
traces (:mod:`.tracing`): the caller's trace when it sent a W3C
``traceparent``, else the new trace the call began. Without tracing it is
the trace-id of the call's ``traceparent`` metadata, if any (see
:func:`trace_id_of`).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterable
from typing import IO, Any

import grpc
from opentelemetry import trace

__all__ = ["LOG_FORMATS", "TextFormatter", "caller", "configure", "json_formatter", "log_event", "trace_id_of"]

#: The values of ``fencepost serve --log-format``.
LOG_FORMATS = ("text", "json", "auto")
#: The log record attributes that carry an event's name and its fields.
EVENT_ATTR = "event"
FIELDS_ATTR = "event_fields"
#: Keys of every JSON line; no event field may take one of them.
_BASE_KEYS = frozenset({"time", "level", "logger", "message", "event"})

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")


def log_event(logger: logging.Logger, level: int, event: str, message: str, **fields: Any) -> None:
    """Log one lifecycle event.

    Args:
        logger: where to log.
        level: ``logging.DEBUG``, ``logging.INFO``, ...
        event: the event's stable snake_case name (``grant``, ``refusal``, ...).
        message: the human-readable line (no ``%`` formatting is applied).
        fields: the event's fields; None values are left out.

    Raises:
        ValueError: a field named like a key every line has (``time``, ``level``,
            ``logger``, ``message``, ``event``).
    """
    clash = _BASE_KEYS.intersection(fields)
    if clash:
        raise ValueError(f"event fields may not be named {sorted(clash)}")
    if not logger.isEnabledFor(level):
        return
    logger.log(level, "%s", message,
               extra={EVENT_ATTR: event, FIELDS_ATTR: {k: v for k, v in fields.items() if v is not None}})


def trace_id_of(metadata: Iterable[tuple[str, Any]] | None) -> str | None:
    """The trace-id field of a W3C ``traceparent`` header in ``metadata``, or None.

    A malformed header (wrong shape, upper-case hex, version ``ff``, an
    all-zero trace-id or parent-id, version 00 with extra fields) is ignored,
    as https://www.w3.org/TR/trace-context/ says.

    Args:
        metadata: a call's invocation metadata, (key, value) pairs; None for none.
    """
    for key, value in metadata or ():
        if key != "traceparent" or not isinstance(value, str):
            continue
        match = _TRACEPARENT.fullmatch(value)
        if match is None:
            return None
        version, trace_id, parent_id, _flags, rest = match.groups()
        if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(parent_id) == {"0"}:
            return None
        return trace_id
    return None


def caller(context: grpc.aio.ServicerContext) -> dict[str, str | None]:
    """The ``peer`` and ``trace_id`` fields of a call.

    ``trace_id`` is the current span's (32 hex digits) when the call is
    traced; else that of the call's ``traceparent``; None without either.
    """
    span_context = trace.get_current_span().get_span_context()
    if span_context.is_valid:
        return {"peer": context.peer(), "trace_id": format(span_context.trace_id, "032x")}
    return {"peer": context.peer(), "trace_id": trace_id_of(context.invocation_metadata())}


def _rfc3339(created: float) -> str:
    """``created`` (seconds since the epoch) as RFC 3339 in UTC with milliseconds: ``2025-01-31T12:00:00.123Z``."""
    # Formats the record's own timestamp (logging took it); reads no clock, so no timer can depend on it.
    seconds = int(created)
    millis = min(999, int((created - seconds) * 1000))
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: message`` with an event's fields appended as `` key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The line of ``record``, with its event fields (if any) appended."""
        line = super().format(record)
        fields: dict[str, Any] = getattr(record, FIELDS_ATTR, None) or {}
        if not fields:
            return line
        return line + "".join(f" {key}={_text_value(value)}" for key, value in fields.items())


def _text_value(value: Any) -> str:
    """``value`` for a ``key=value`` pair: as is, or JSON-quoted when empty or holding spaces, quotes or ``=``."""
    text = str(value)
    if not text or any(c in text for c in ' "=\\') or not text.isprintable():
        return json.dumps(text)
    return text


def json_formatter() -> logging.Formatter:
    """The JSON-lines formatter (python-json-logger's ``pythonjsonlogger.json.JsonFormatter``)."""
    from pythonjsonlogger.json import JsonFormatter

    class EventJsonFormatter(JsonFormatter):
        """One JSON object per record: time, level, logger, message, then event and fields."""

        def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord,
                       message_dict: dict[str, Any]) -> None:
            log_data["time"] = _rfc3339(record.created)
            log_data["level"] = record.levelname
            log_data["logger"] = record.name
            log_data["message"] = record.getMessage()
            event = getattr(record, EVENT_ATTR, None)
            if event is not None:
                log_data["event"] = event
                log_data.update(getattr(record, FIELDS_ATTR, None) or {})
            log_data.update(message_dict)  # exc_info, stack_info

    return EventJsonFormatter()


def configure(level: str, log_format: str, stream: IO[str]) -> str:
    """Send the root logger's records at ``level`` and above to ``stream`` in ``log_format``.

    Args:
        level: a logging level name (``INFO``).
        log_format: ``text``, ``json`` or ``auto`` (text when ``stream`` is a terminal, json otherwise).
        stream: where the lines go (stderr).

    Returns:
        The format used, ``text`` or ``json``.

    Raises:
        ValueError: ``log_format`` is not one of :data:`LOG_FORMATS`.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    if log_format == "auto":
        try:
            log_format = "text" if stream.isatty() else "json"
        except (AttributeError, ValueError):  # no fileno, or closed
            log_format = "json"
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter() if log_format == "text" else json_formatter())
    logging.basicConfig(level=level, handlers=[handler])
    return log_format
