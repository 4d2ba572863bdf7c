"""From a call's gRPC status to its HTTP answer: the status code, a ``google.rpc.Status`` JSON body, Retry-After.

A call over HTTP ends as the same call over gRPC would (the servicer's
``abort_with_status``, :mod:`..api.status`); this module turns that status
into the HTTP answer, as grpc-gateway and Google's HTTP APIs do:

- the HTTP status of the gRPC code (:data:`HTTP_STATUS`, the mapping of
  ``google/rpc/code.proto`` and grpc-gateway's ``HTTPStatusFromCode``);
- the body: the status as ``google.rpc.Status`` in protobuf's canonical JSON,
  ``{"code": 9, "message": "...", "details": [{"@type":
  "type.googleapis.com/google.rpc.ErrorInfo", "reason": "NOT_HOLDER",
  "domain": "fencepost.dev", "metadata": {...}}, ...]}``: the very details
  the gRPC call carries in its ``grpc-status-details-bin`` trailer;
- ``Retry-After`` (whole seconds, rounded up, RFC 9110 section 10.2.3) when
  the details hold a ``google.rpc.RetryInfo``.

Failures of the HTTP request itself (a body that is not JSON, an unknown
path) are answered the same way, with a status made here.
"""

from __future__ import annotations

import json
import math
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from fencepost.client.errors import FencepostError

from ..api.status import to_status

__all__ = ["HTTP_STATUS", "JSON", "Answer", "answer_of", "plain_status", "refusal", "response", "to_json"]

#: The media type of every body served (requests with a body must send it too).
JSON = "application/json"

#: The HTTP status of each gRPC status code (google/rpc/code.proto; grpc-gateway's HTTPStatusFromCode).
HTTP_STATUS: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


class Answer:
    """The HTTP form of a failed call.

    Attributes:
        status: the HTTP status code.
        body: the ``google.rpc.Status`` as a canonical-JSON object.
        headers: ``Retry-After`` when a RetryInfo applies; else none.
    """

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    def text(self) -> str:
        """The body as one line of JSON."""
        return json.dumps(self.body, separators=(",", ":"))


def _details(status: grpc.Status) -> status_pb2.Status:
    """The ``google.rpc.Status`` of ``status``: its details trailer, else its code and message alone."""
    for key, value in status.trailing_metadata or ():
        if key == rpc_status.GRPC_DETAILS_METADATA_KEY:
            return status_pb2.Status.FromString(bytes(value))
    return status_pb2.Status(code=status.code.value[0], message=status.details or "")


def answer_of(status: grpc.Status) -> Answer:
    """The HTTP answer of a call that ended with ``status`` (see the module docstring).

    Args:
        status: what the servicer aborted with (``abort_with_status``), never OK.
    """
    details = _details(status)
    headers = {}
    for detail in details.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            seconds = retry.retry_delay.seconds + retry.retry_delay.nanos / 1e9
            headers["Retry-After"] = str(max(1, math.ceil(seconds)))
    body = json_format.MessageToDict(details, always_print_fields_with_no_presence=True)
    return Answer(HTTP_STATUS.get(status.code, 500), body, headers)


def refusal(exc: FencepostError) -> Answer:
    """The HTTP answer of an error the HTTP layer found itself (a bad body or path), as the servicer would send it."""
    return answer_of(to_status(exc))


def plain_status(code: grpc.StatusCode, message: str) -> Answer:
    """An answer with ``code`` and ``message`` and no details (an unknown path, a method not served)."""
    return answer_of(rpc_status.to_status(status_pb2.Status(code=getattr(code_pb2, code.name), message=message)))


def to_json(message: Message) -> str:
    """``message`` in canonical JSON on one line, every field included (also those at their default)."""
    return json.dumps(json_format.MessageToDict(message, always_print_fields_with_no_presence=True),
                      separators=(",", ":"))


def response(result: Answer | Message, *, status: int | None = None, headers: dict[str, str] | None = None
             ) -> web.Response:
    """The HTTP response of a call's result: its response message (200), or a failure's :class:`Answer`.

    Args:
        result: what the call answered.
        status: the HTTP status instead of the answer's (415, 405).
        headers: more headers (``Allow``).
    """
    if isinstance(result, Answer):
        return web.Response(status=status or result.status, text=result.text(), content_type=JSON,
                            headers={**result.headers, **(headers or {})})
    return web.Response(text=to_json(result), content_type=JSON, headers=headers)
