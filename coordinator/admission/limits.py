"""Limits against one bad or buggy client exhausting a coordinator.

Every limit is a ``fencepost serve`` flag (and its ``FENCEPOST_...``
variable) with the default of :class:`Limits`; 0 turns a limit off where
that makes sense. A call refused at a limit gets RESOURCE_EXHAUSTED /
LIMIT_EXCEEDED with ``limit`` (the flag's name without dashes) and
``value`` in its ErrorInfo, and, for a rate limit, a RetryInfo with the
time until the next call would be allowed. The call did nothing.

A **caller** is :attr:`.identity.Caller.key`: the client certificate's
identity with mTLS, else its connection (``connection:<peer>``). Without
mTLS a client that opens more connections gets more of every per-caller
limit; the coordinator-wide totals (``max-leases``, ``max-streams``,
``max-waiters``) still bound it.

The counting against these limits is :mod:`.limit_tracker`'s.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

from fencepost.client.v1.keys import MAX_LOCK_DELAY_SECONDS

__all__ = ["FLAGS", "MAX_MESSAGE_BYTES", "MIN_MESSAGE_BYTES", "MIN_PENDING_CALLS", "PENDING_SECONDS", "Limits",
           "add_limit_arguments", "limits_from_args"]

#: The fewest calls gRPC's core holds for the coordinator before its event loop takes them (see
#: :meth:`Limits.grpc_options`).
MIN_PENDING_CALLS = 20_000
#: How long, in seconds, gRPC's core holds such a call before it cancels it (gRPC's default: 30).
PENDING_SECONDS = 300

#: The range of ``--max-message-bytes`` (a smaller value would refuse legitimate requests; gRPC's own ceiling).
MIN_MESSAGE_BYTES = 1024
MAX_MESSAGE_BYTES = 2**31 - 1


@dataclass(frozen=True)
class Limits:
    """Every limit of one coordinator, each with its ``fencepost serve`` flag (``--`` + the field's flag name).

    0 turns a limit off (unlimited), except ``max_message_bytes`` and the
    bursts, which must be at least 1 (a burst is ignored when its rate is 0).

    Raises:
        ValueError: a value out of range; the message names its flag.

    Attributes:
        max_leases_per_caller: leases granted here to one caller and not yet
            ended (``--max-leases-per-caller``).
        max_leases: leases granted here and not yet ended, all callers
            together (``--max-leases``): the bound when callers are connections.
        max_holds_per_lease: holds granted here to one lease and not yet ended,
            plus its Acquire calls in progress here (``--max-holds-per-lease``).
        max_streams_per_caller: KeepAlive and Observe streams of one caller open here
            (``--max-streams-per-caller``).
        max_streams: KeepAlive and Observe streams open here, all callers
            (``--max-streams``; refused with TOO_MANY_STREAMS).
        max_waiters: Acquire calls with a wait in progress here, all callers
            (``--max-waiters``; refused with TOO_MANY_WAITERS).
        lease_grant_rate: LeaseGrant calls per second per caller, on average
            (``--max-lease-grant-rate``).
        lease_grant_burst: LeaseGrant calls one caller may make at once after a
            pause (``--max-lease-grant-burst``).
        acquire_rate: Acquire calls per second per caller, on average
            (``--max-acquire-rate``).
        acquire_burst: Acquire calls one caller may make at once after a pause
            (``--max-acquire-burst``).
        max_lag: past capacity while this coordinator is this far behind, in
            seconds (``--max-lag``; see :mod:`.overload`: its event loop runs
            late, or a keepalive waits that long for etcd).
        max_loop_busy: past capacity while its event loop thread stays this
            busy, in CPU seconds per wall second, 0 to 1 (``--max-loop-busy``).
        max_client_rtt: past capacity while its clients' keepalive round
            trips stay this long, in seconds (``--max-client-rtt``; the median
            of what they report).
        max_keepalive_wait: past capacity while keepalive messages wait this
            long before the coordinator reads them, in seconds
            (``--max-keepalive-wait``; the median, from their ``sent_ms``).
            Past capacity (:mod:`.capacity`), new leases, KeepAlive streams and
            waits are refused (RESOURCE_EXHAUSTED / OVERLOADED, RetryInfo 1 s):
            the keepalives of the live leases come first.
        max_process_busy: the lease ceiling is set (LeaseGrant refused at
            it, nothing else) while the whole process, gRPC's threads included,
            stays this busy, in CPU seconds per wall second
            (``--max-process-busy``; see :mod:`.capacity`).
        max_message_bytes: the largest request message the coordinator reads,
            in bytes, 1024 to 2**31 - 1 (``--max-message-bytes``); gRPC refuses a larger one with
            RESOURCE_EXHAUSTED before it reaches the service. The largest
            legitimate request is well under 1 KiB (a lock name is at most 256
            bytes); responses are not limited by it.
        max_lock_delay: the longest lock-delay an Acquire may ask for, in
            whole seconds, 0 to 3600 (``--max-lock-delay``; Chubby's bound and
            Consul's are one minute); a longer one is refused with
            INVALID_ARGUMENT naming ``lock_delay_seconds``. An access policy
            rule may lower it (:mod:`.lock_delay_limit`). 0: the protocol's 3600.
    """

    max_leases_per_caller: int = 1000
    max_leases: int = 100_000
    max_holds_per_lease: int = 1000
    max_streams_per_caller: int = 100
    max_streams: int = 10_000
    max_waiters: int = 10_000
    lease_grant_rate: float = 100.0
    lease_grant_burst: int = 200
    acquire_rate: float = 10000.0
    acquire_burst: int = 20000
    max_lag: float = 0.5
    max_loop_busy: float = 0.9
    max_client_rtt: float = 0.5
    max_keepalive_wait: float = 0.05
    max_process_busy: float = 0.9
    max_message_bytes: int = 64 * 1024
    max_lock_delay: int = 60

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value) or value < 0:
                raise ValueError(f"--{FLAGS[f.name]} is {value}; must be 0 or more")
        for name in ("lease_grant_burst", "acquire_burst"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{FLAGS[name]} is {getattr(self, name)}; must be 1 or more")
        if self.max_loop_busy > 1:
            raise ValueError(f"--{FLAGS['max_loop_busy']} is {self.max_loop_busy}; must be 0 to 1")
        if self.max_lock_delay > MAX_LOCK_DELAY_SECONDS:
            raise ValueError(f"--{FLAGS['max_lock_delay']} is {self.max_lock_delay}; must be 0 to "
                             f"{MAX_LOCK_DELAY_SECONDS}")
        if not MIN_MESSAGE_BYTES <= self.max_message_bytes <= MAX_MESSAGE_BYTES:
            raise ValueError(f"--{FLAGS['max_message_bytes']} is {self.max_message_bytes}; must be "
                             f"{MIN_MESSAGE_BYTES} to {MAX_MESSAGE_BYTES}")

    def grpc_options(self) -> dict[str, int]:
        """The gRPC server options these limits set: the message size, and the calls gRPC's core holds for the
        coordinator before its event loop takes them (``grpc.server.max_pending_requests``, soft and hard).

        gRPC's defaults shed such calls past 1,000 at random and every one past 3,000 (random early detection),
        and every one left untaken 30 s, by cancelling them with no status the client can read (CANCELLED, or
        INTERNAL on the client's first write): a flood of 10,000 streams from one process lost 57-62 % of them
        so while ``--max-streams`` was far off, and, with the backlog raised, still 2-47 % after 30 s on a
        loaded machine. Here the backlog may reach twice ``max_streams`` (at least :data:`MIN_PENDING_CALLS`),
        soft bound equal to the hard one, for :data:`PENDING_SECONDS`: the coordinator takes each call and
        refuses it past its own limits with a typed status (TOO_MANY_STREAMS, OVERLOADED, LIMIT_EXCEEDED). Past
        those bounds (a loop stalled for minutes) gRPC still cancels.
        """
        pending = max(MIN_PENDING_CALLS, 2 * self.max_streams)
        return {"grpc.max_receive_message_length": self.max_message_bytes,
                "grpc.server.max_pending_requests": pending, "grpc.server.max_pending_requests_hard_limit": pending,
                "grpc.server_max_unrequested_time_in_server": PENDING_SECONDS}

    @classmethod
    def unlimited(cls) -> Limits:
        """Every limit that can be off, off (the bench's comparison; not for production)."""
        return cls(**{name: 0 for name in FLAGS if name not in ("lease_grant_burst", "acquire_burst",
                                                                 "max_message_bytes")})


#: The ``fencepost serve`` flag (without ``--``) of each :class:`Limits` field: also the ``limit`` of its refusal.
FLAGS: dict[str, str] = {
    "max_leases_per_caller": "max-leases-per-caller",
    "max_leases": "max-leases",
    "max_holds_per_lease": "max-holds-per-lease",
    "max_streams_per_caller": "max-streams-per-caller",
    "max_streams": "max-streams",
    "max_waiters": "max-waiters",
    "lease_grant_rate": "max-lease-grant-rate",
    "lease_grant_burst": "max-lease-grant-burst",
    "acquire_rate": "max-acquire-rate",
    "acquire_burst": "max-acquire-burst",
    "max_lag": "max-lag",
    "max_loop_busy": "max-loop-busy",
    "max_client_rtt": "max-client-rtt",
    "max_keepalive_wait": "max-keepalive-wait",
    "max_process_busy": "max-process-busy",
    "max_message_bytes": "max-message-bytes",
    "max_lock_delay": "max-lock-delay",
}


#: What each flag limits, for its help text.
_HELP: dict[str, str] = {
    "max_leases_per_caller": "leases granted by this coordinator to one caller and not yet ended (revoked here, "
                             "found gone by a keepalive here, or past their TTL since their grant or last keepalive "
                             "here)",
    "max_leases": "leases granted by this coordinator and not yet ended, all callers together",
    "max_holds_per_lease": "holds granted by this coordinator to one lease and not yet ended, plus its Acquire calls "
                           "in progress here",
    "max_streams_per_caller": "KeepAlive and Observe streams of one caller open on this coordinator",
    "max_streams": "KeepAlive and Observe streams open on this coordinator (then TOO_MANY_STREAMS)",
    "max_waiters": "Acquire calls with a wait in progress on this coordinator (then TOO_MANY_WAITERS)",
    "lease_grant_rate": "LeaseGrant calls per second of one caller, on average (RetryInfo says when to retry)",
    "lease_grant_burst": "LeaseGrant calls one caller may make at once after a pause; 1 or more",
    "acquire_rate": "Acquire calls per second of one caller, on average (RetryInfo says when to retry)",
    "acquire_burst": "Acquire calls one caller may make at once after a pause; 1 or more",
    "max_lag": "seconds: past capacity while this coordinator stays this far behind (its event loop running "
               "late, or keepalives or answers queued that long); past capacity, new leases, KeepAlive streams "
               "and waits are refused (OVERLOADED, RetryInfo 1 s), so that the leases it keeps are renewed in time",
    "max_loop_busy": "ratio 0 to 1: past capacity while the event loop thread stays this busy (CPU seconds per "
                     "second, the smallest of the last 1.5 s)",
    "max_client_rtt": "seconds: past capacity while the median keepalive round trip its clients report stays "
                      "this long (the smallest of the last 1.5 s)",
    "max_keepalive_wait": "seconds: past capacity while keepalive messages wait this long before the coordinator "
                          "reads them (the median, from the send time clients put in them; the smallest of the last "
                          "1.5 s)",
    "max_process_busy": "CPU seconds per second: while the whole process stays this busy, a lease ceiling is set "
                        "at 0.9 of the leases it carries and LeaseGrant refused at it (OVERLOADED); streams and "
                        "waits are not refused for it",
    "max_message_bytes": "largest request message read, in bytes (gRPC refuses a larger one with "
                         "RESOURCE_EXHAUSTED); 1024 or more",
    "max_lock_delay": "seconds: the longest lock-delay an Acquire may ask for (longer: INVALID_ARGUMENT "
                      "lock_delay_seconds); a policy rule's max_lock_delay_seconds may lower it; at most 3600",
}


#: The metavar of the flags that are not counts.
_METAVARS = {"max_lock_delay": "S", "max_lag": "S", "max_client_rtt": "S", "max_keepalive_wait": "S",
             "max_loop_busy": "R", "max_process_busy": "R"}


def add_limit_arguments(parser: argparse.ArgumentParser, env: Callable[[str, str | None], str | None]) -> None:
    """Add one ``--<flag>`` per :class:`Limits` field (see :data:`FLAGS`) to ``fencepost serve``'s parser.

    Args:
        parser: the parser.
        env: (flag, default) -> the value of ``FENCEPOST_<FLAG>`` or the default.
    """
    group = parser.add_argument_group(
        "limits", "per coordinator replica; a caller is a client certificate's identity with mTLS, else a "
                  "connection; a call refused at a limit gets RESOURCE_EXHAUSTED/LIMIT_EXCEEDED naming it "
                  "(docs/operations.md, Limits). 0 turns a limit off where it says so")
    defaults = Limits()
    for f in fields(Limits):
        flag = FLAGS[f.name]
        default = getattr(defaults, f.name)
        off = "" if f.name in ("lease_grant_burst", "acquire_burst", "max_message_bytes") else "; 0: no limit"
        group.add_argument(f"--{flag}", dest=f.name, default=env(flag, None),
                           metavar=_METAVARS.get(f.name, "N"),
                           help=f"{_HELP[f.name]} (env FENCEPOST_{flag.upper().replace('-', '_')}; "
                                f"default {default:g}{off})")


def limits_from_args(args: argparse.Namespace) -> Limits:
    """The :class:`Limits` of the flags :func:`add_limit_arguments` added (unset ones keep their defaults).

    Raises:
        ValueError: a value that is not a number, or out of range; the message names the flag.
    """
    given: dict[str, float | int] = {}
    for f in fields(Limits):
        text = getattr(args, f.name, None)
        if text is None:
            continue
        flag = FLAGS[f.name]
        try:
            value: float | int = float(text) if f.type in ("float", float) else int(str(text).strip())
        except ValueError:
            kind = "a number" if f.type in ("float", float) else "a whole number"
            raise ValueError(f"--{flag} is {text!r}; must be {kind}") from None
        given[f.name] = value
    return Limits(**given)  # type: ignore[arg-type]


