"""One lock's holders and waiters, as ``fencepost status NAME`` shows them; a read hold shown as one.

A read-write lock (docs/rwlocks.md) held for reading has several holders:
the readers granted together. A Describe answer lists them in ``holders``
(``holder`` first), each marked ``read`` (``Holder.read``), and the
contenders from the first writer on as its waiters. A coordinator that
predates ``holders`` leaves it empty and lists the other readers among the
waiters: a reader is granted when no writer is before it in the queue, so
when the holder reads, the listed readers before the first writer hold too,
and :func:`split` makes them holders. A lock held by a writer (any plain
hold) has one holder, as before.

Text: ``NAME: held`` for a writer, ``NAME: held for reading by N readers``
and one line per reader (lease, fencing token) for readers; waiters are
marked ``read`` or ``write`` once the lock has a reader. JSON
(``--json``): ``mode`` (``read``, ``write``, null when not held), the
holder's ``mode``, ``readers`` (each granted reader, the holder first; ``[]``
for a writer) and each waiter's ``mode``; ``waiter_count`` counts the
contenders that do not hold (from either coordinator).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fencepost.client import TlsConfig
from fencepost.client.v1 import lock_pb2 as pb

from .common import EXIT_OK, CallFailed, call, call_error, lease_hex
from .printable import shown_name

__all__ = ["MODE_READ", "MODE_WRITE", "describe_json", "describe_lines", "mode", "show", "split"]

MODE_READ = "read"
"""A hold's mode, as the CLI prints it: a reader of a read-write lock."""
MODE_WRITE = "write"
"""A hold's mode, as the CLI prints it: a writer (any hold without ``read``: a plain lock's holder too)."""

#: Waiters listed in the text, at most.
SHOWN_WAITERS = 10


def mode(read: bool) -> str:
    """:data:`MODE_READ` or :data:`MODE_WRITE`."""
    return MODE_READ if read else MODE_WRITE


def split(resp: pb.DescribeResponse) -> tuple[list[pb.Holder], list[pb.Holder], int]:
    """The holders and the waiters of a Describe answer.

    Returns:
        ``(holders, waiters, waiter_count)``: no holder when the lock is not held; the holder alone when it
        writes; when it reads, every reader holding with it (``holders``; from an older coordinator, it and the
        listed readers before the first writer), in grant order. The waiters are the other listed contenders,
        in grant order, and ``waiter_count`` counts every contender that does not hold.
    """
    if not resp.held:
        return [], list(resp.waiters), resp.waiter_count
    if resp.holders:
        return list(resp.holders), list(resp.waiters), resp.waiter_count
    holders = [resp.holder]
    waiters = list(resp.waiters)
    if resp.holder.read:
        while waiters and waiters[0].read:
            holders.append(waiters.pop(0))
    return holders, waiters, resp.waiter_count - (len(holders) - 1)


def _entry(contender: pb.Holder, token: str) -> dict[str, Any]:
    return {"lease_id": contender.lease_id, "lease_id_hex": lease_hex(contender.lease_id), token: contender.token}


def describe_json(name: str, address: str, resp: pb.DescribeResponse) -> dict[str, Any]:
    """The JSON object of ``fencepost status NAME --json`` (see the module docstring)."""
    holders, waiters, waiter_count = split(resp)
    return {
        "name": name,
        "address": address,
        "held": resp.held,
        "mode": mode(resp.holder.read) if resp.held else None,
        "holder": {**_entry(resp.holder, "token"), "mode": mode(resp.holder.read)} if resp.held else None,
        "token": resp.holder.token if resp.held else None,
        "readers": [_entry(h, "token") for h in holders if h.read],
        "ttl_remaining_seconds": resp.ttl_remaining_seconds,
        "ttl_seconds": resp.ttl_seconds,
        "waiter_count": waiter_count,
        "waiters": [{**_entry(w, "revision"), "mode": mode(w.read)} for w in waiters],
        "revision": resp.revision,
        "lock_delay_seconds": resp.lock_delay_seconds,
        "lock_delay_remaining_ms": resp.lock_delay_remaining_ms,
    }


def describe_lines(name: str, resp: pb.DescribeResponse) -> list[str]:
    """The text of ``fencepost status NAME`` (see the module docstring)."""
    holders, waiters, waiter_count = split(resp)
    lines = []
    if resp.held:
        lease = resp.holder.lease_id
        readers = len(holders)
        lines += [f"{shown_name(name)}: held" + (f" for reading by {readers} reader{'s' if readers > 1 else ''}"
                                                 if resp.holder.read else ""),
                  f"  holder lease   {lease_hex(lease)} ({lease})",
                  f"  fencing token  {resp.holder.token}",
                  f"  TTL left       {resp.ttl_remaining_seconds} s of {resp.ttl_seconds} s"]
        if resp.holder.read:
            lines.append(f"  readers        {readers}")
            lines += [f"    {i}. lease {lease_hex(h.lease_id)} ({h.lease_id}), fencing token {h.token}"
                      for i, h in enumerate(holders, 1)]
    else:
        lines.append(f"{shown_name(name)}: not held")
    if resp.lock_delay_remaining_ms > 0:
        lines.append(f"  lock-delay     {resp.lock_delay_remaining_ms / 1000:g} s left of {resp.lock_delay_seconds} s "
                     f"(held back; `fencepost admin end-lock-delay {shown_name(name)}` ends it)")
    elif resp.lock_delay_remaining_ms < 0:
        lines.append(f"  lock-delay     {resp.lock_delay_seconds} s, starting at the next acquire (its holder was "
                     f"lost)")
    marked = any(c.read for c in [*holders, *waiters])  # a read-write lock: say each waiter's mode
    lines.append(f"  waiters        {waiter_count}")
    lines += [f"    {i}. lease {lease_hex(w.lease_id)} ({w.lease_id}){', ' + mode(w.read) if marked else ''}, "
              f"queued at revision {w.token}" for i, w in enumerate(waiters[:SHOWN_WAITERS], 1)]
    if waiter_count > SHOWN_WAITERS:
        lines.append(f"    ... and {waiter_count - SHOWN_WAITERS} more")
    lines.append(f"  revision       {resp.revision}")
    return lines


def show(addresses: list[str], name: str, as_json: bool, tls: TlsConfig | None) -> int:
    """Describe lock ``name`` (one Describe through the client's transport) and print it as text or JSON.

    Returns:
        0 (a free lock is described too).

    Raises:
        CliError: no coordinator answered, or it refused (exit 1), as :func:`.common.call_error` says.
    """
    try:
        address, resp = asyncio.run(call(addresses, "Describe", pb.DescribeRequest(name=name), idempotent=True,
                                         name=name, tls=tls))
    except CallFailed as failed:
        raise call_error(failed.error, addresses, failed.address, "Describe") from None
    print(json.dumps(describe_json(name, address, resp)) if as_json else "\n".join(describe_lines(name, resp)),
          flush=True)
    return EXIT_OK
