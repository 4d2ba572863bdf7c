"""The HTTP/JSON API's paths: one table of every route, and how a request becomes the RPC's request message.

Each row of :data:`ROUTES` names an HTTP method, a path template and the
LockService RPC that answers it (docs/http.md prints this table). A
template's ``{field}`` is one path segment holding that request field,
percent-encoded (a lock name ``a/b`` is ``a%2Fb``); a last segment
``{field}:verb`` is a custom method in Google's API style (AIP-136). The
verb is what follows the last ``:`` of the raw segment when that is one of
the verbs of a row: ``/v1/locks/invoice:42:acquire`` acquires the lock
``invoice:42``, and ``/v1/locks/invoice:42`` describes it; a name that
itself ends in ``:acquire`` (or another verb) is written with ``%3A``.

The request message is the RPC's own request, built from protobuf's
canonical JSON (``google.protobuf.json_format``, field names in lowerCamelCase
or as in the proto, 64-bit integers as strings or numbers): the JSON body
of a POST, the query parameters of a GET or DELETE (``?prefix=a&pageSize=5``;
``true``/``false`` for booleans), then the path's fields and the row's
fixed ones. A field given twice with different values, a field the message
does not have, or a value that does not parse is INVALID_ARGUMENT /
INVALID_FIELD naming the field (:func:`request_of`).

``stream`` rows answer with Server-Sent Events (:mod:`.events`): ``WATCH``
is a hold's watch on a KeepAlive stream (its request is a ``WatchHold``),
``OBSERVE`` the Observe stream. ``withdraw`` names the call that removes what
a call left when its caller goes away before the answer (:mod:`.calls`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from fencepost.client.errors import InvalidArgument
from fencepost.client.v1 import lock_pb2

__all__ = ["OBSERVE", "ROUTES", "WATCH", "Match", "Route", "match", "request_of", "request_type"]

#: ``stream`` of a row answered as a hold's watch (KeepAlive ``watch``), of one answered as the Observe stream.
WATCH = "watch"
OBSERVE = "observe"

_SERVICE = lock_pb2.DESCRIPTOR.services_by_name["LockService"]
_LOCK, _ELECTION, _SEMAPHORE = lock_pb2.HOLD_KIND_LOCK, lock_pb2.HOLD_KIND_ELECTION, lock_pb2.HOLD_KIND_SEMAPHORE


@dataclass(frozen=True)
class Route:
    """One route: an HTTP method and a path template, answered by one RPC.

    Attributes:
        method: ``GET``, ``POST`` or ``DELETE``.
        path: the template, e.g. ``/v1/locks/{name}:acquire``.
        rpc: the LockService method (``KeepAlive`` for a hold's watch).
        fixed: request fields the route sets (an AdminRevoke's ``kind``).
        stream: None (a unary call answered with one JSON object), :data:`WATCH` or :data:`OBSERVE`.
        withdraw: the RPC that removes what the call left when its caller went away mid-call (Withdraw;
            ReleasePermit and Resign with token 0); None for none.
    """

    method: str
    path: str
    rpc: str
    fixed: Mapping[str, Any] = field(default_factory=dict)
    stream: str | None = None
    withdraw: str | None = None

    @property
    def verb(self) -> str | None:
        """The custom method of the last segment (``acquire``), or None."""
        last = self.path.rsplit("/", 1)[-1]
        return last.rsplit(":", 1)[1] if ":" in last else None


#: Every route of the API, in the order docs/http.md lists them.
ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/leases", "LeaseGrant"),
    Route("POST", "/v1/leases/{lease_id}:keepalive", "LeaseKeepAlive"),
    Route("DELETE", "/v1/leases/{lease_id}", "LeaseRevoke"),
    Route("GET", "/v1/leases", "ListSessions"),
    Route("POST", "/v1/locks/{name}:acquire", "Acquire", withdraw="Withdraw"),
    Route("POST", "/v1/locks/{name}:release", "Release"),
    Route("POST", "/v1/locks/{name}:withdraw", "Withdraw"),
    Route("GET", "/v1/locks/{name}:watch", "KeepAlive", {"kind": _LOCK}, stream=WATCH),
    Route("GET", "/v1/locks/{name}", "Describe"),
    Route("GET", "/v1/locks", "ListLocks"),
    Route("POST", "/v1/locks/{name}:revoke", "AdminRevoke", {"kind": _LOCK}),
    Route("POST", "/v1/locks/{name}:endLockDelay", "AdminEndLockDelay"),
    Route("POST", "/v1/locks:acquireAll", "AcquireAll", withdraw="ReleaseAll"),
    Route("POST", "/v1/locks:releaseAll", "ReleaseAll"),
    Route("POST", "/v1/elections/{election}:campaign", "Campaign", withdraw="Resign"),
    Route("POST", "/v1/elections/{election}:proclaim", "Proclaim"),
    Route("POST", "/v1/elections/{election}:resign", "Resign"),
    Route("GET", "/v1/elections/{name}:watch", "KeepAlive", {"kind": _ELECTION}, stream=WATCH),
    Route("GET", "/v1/elections/{election}:observe", "Observe", stream=OBSERVE),
    Route("GET", "/v1/elections/{election}", "Leader"),
    Route("POST", "/v1/elections/{name}:revoke", "AdminRevoke", {"kind": _ELECTION}),
    Route("POST", "/v1/semaphores/{name}:acquire", "AcquirePermit", withdraw="ReleasePermit"),
    Route("POST", "/v1/semaphores/{name}:release", "ReleasePermit"),
    Route("GET", "/v1/semaphores/{name}:watch", "KeepAlive", {"kind": _SEMAPHORE}, stream=WATCH),
    Route("GET", "/v1/semaphores/{name}", "DescribeSemaphore"),
    Route("POST", "/v1/semaphores/{name}:revoke", "AdminRevoke", {"kind": _SEMAPHORE}),
    Route("GET", "/v1/server", "ServerInfo"),
    Route("POST", "/v1/staleWrites", "ReportStaleWrite"),
)

_PARAM = re.compile(r"^\{([a-z_]+)\}$")


@dataclass(frozen=True)
class Match:
    """A request's route and the fields its path gave (percent-decoded)."""

    route: Route
    fields: dict[str, str]


def _segment(template: str, raw: str, verb: str | None, last: bool) -> tuple[bool, str | None, str | None]:
    """Whether raw path segment ``raw`` fits ``template``: (fits, field name or None, its raw value)."""
    if last and verb is not None:
        if not raw.endswith(":" + verb):
            return False, None, None
        template, raw = template[:-len(verb) - 1], raw[:-len(verb) - 1]
    param = _PARAM.match(template)
    if param is None:
        return template == raw, None, None
    return True, param.group(1), raw


def match(method: str, raw_path: str) -> tuple[Match | None, list[str]]:
    """The route of ``method`` on ``raw_path`` (the path as sent, still percent-encoded).

    The routes with a verb are tried first: when the path ends in one of
    their verbs it is that custom method, whatever the HTTP method (a GET on
    ``...:acquire`` is refused, not a Describe of a lock named ``x:acquire``).

    Returns:
        (the match or None, the methods of the routes whose path fits: for a 405's ``Allow``).

    Raises:
        InvalidArgument: a path field whose percent-encoding is not UTF-8 (field: its name).
    """
    raw = raw_path.split("/")
    for verbs in (True, False):
        allowed: list[str] = []
        for route in ROUTES:
            if (route.verb is not None) != verbs:
                continue
            found = _fits(route, raw)
            if found is None:
                continue
            if route.method != method:
                allowed.append(route.method)
                continue
            return Match(route, _decoded(found)), allowed
        if allowed:
            return None, allowed
    return None, []


def _fits(route: Route, raw: list[str]) -> dict[str, str] | None:
    """The raw fields of the path ``raw`` (split at ``/``) when it fits ``route``'s template, else None."""
    template = route.path.split("/")
    if len(template) != len(raw):
        return None
    found: dict[str, str] = {}
    for index, (part, given) in enumerate(zip(template, raw)):
        fits, name, value = _segment(part, given, route.verb, index == len(raw) - 1)
        if not fits:
            return None
        if name is not None and value is not None:
            found[name] = value
    return found


def _decoded(found: dict[str, str]) -> dict[str, str]:
    """The path's fields percent-decoded.

    Raises:
        InvalidArgument: a field whose percent-encoding is not UTF-8 (field: its name).
    """
    decoded = {}
    for name, value in found.items():
        try:
            decoded[name] = unquote(value, errors="strict")
        except UnicodeDecodeError:
            raise InvalidArgument(f"the path's {name} is not percent-encoded UTF-8", field=name) from None
    return decoded


def request_type(route: Route) -> type[Message]:
    """The request message class of ``route``: its RPC's input (``WatchHold`` for a watch)."""
    if route.stream == WATCH:
        return lock_pb2.WatchHold
    return getattr(lock_pb2, _SERVICE.methods_by_name[route.rpc].input_type.name)  # type: ignore[no-any-return]


def _field(message: Message, key: str) -> FieldDescriptor:
    """The field of ``message`` that ``key`` names (its proto name or its JSON name).

    Raises:
        InvalidArgument: no such field (field: ``key``).
    """
    descriptor = message.DESCRIPTOR
    found = descriptor.fields_by_name.get(key) or next(
        (f for f in descriptor.fields if f.json_name == key), None)
    if found is None:
        raise InvalidArgument(f"{descriptor.name} has no field {key!r}", field=key)
    return found


def request_of(route: Route, data: Mapping[str, Any], path: Mapping[str, str], *, query: bool) -> Message:
    """The request message of a call on ``route``.

    Args:
        route: the matched route.
        data: the JSON body's object (POST), or the query parameters (GET, DELETE).
        path: the fields the path gave.
        query: ``data`` are query parameters (strings: ``true``/``false`` for booleans).

    Raises:
        InvalidArgument: INVALID_FIELD naming the field: unknown, given twice with
            different values, or a value that does not parse as the field's type.
    """
    message = request_type(route)()
    given: dict[str, Any] = {}
    for key, value in data.items():
        found = _field(message, key)
        if query and found.type == FieldDescriptor.TYPE_BOOL and isinstance(value, str):
            if value not in ("true", "false"):
                raise InvalidArgument(f"{found.name} is {value!r}; must be true or false", field=found.name)
            value = value == "true"
        if found.enum_type is not None:
            _check_enum(found, value, query)
        if found.name in given and given[found.name] != value:
            raise InvalidArgument(f"{found.name} is given twice", field=found.name)
        given[found.name] = value
    for name, value in {**path, **route.fixed}.items():
        if name in given and str(given[name]) != str(value) and not _same_enum(message, name, given[name], value):
            raise InvalidArgument(f"{name} is {given[name]!r} in the request but {value!r} in the path", field=name)
        given[name] = value
    for name, value in given.items():
        try:
            json_format.ParseDict({name: value}, message, ignore_unknown_fields=False)
        except json_format.ParseError as exc:
            raise InvalidArgument(f"{name}: {exc}", field=name) from None
    return message


def _check_enum(found: FieldDescriptor, value: Any, query: bool) -> None:
    """An enum field is one of its names, or its number as a JSON integer (a query's as decimal digits):
    protobuf's parser would take ``true``, ``1.5`` or ``"1"`` too (proto3 JSON allows neither).

    Raises:
        InvalidArgument: INVALID_FIELD naming the field.
    """
    names = found.enum_type.values_by_name
    if isinstance(value, str) and (value in names or (query and value.isdigit())):
        return
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):  # null: the default (proto3 JSON)
        return
    raise InvalidArgument(f"{found.name} is {value!r}; must be one of {', '.join(names)} or its number",
                          field=found.name)


def _same_enum(message: Message, name: str, given: Any, value: Any) -> bool:
    """Whether ``given`` (an enum's JSON name or number) is the enum value ``value``."""
    found = message.DESCRIPTOR.fields_by_name[name]
    if found.enum_type is None:
        return False
    by_name = found.enum_type.values_by_name.get(str(given))
    return by_name is not None and by_name.number == value
