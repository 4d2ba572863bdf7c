"""fork: clients and handles inherited by a forked child refuse every call at once.

gRPC's channels, its polling threads and the client's event loop thread do
not survive ``fork()``: in a child, an inherited client hung, crashed
(SIGSEGV), or, through the sockets it shares with its parent, broke the
parent's keepalive stream. So:

- every client and handle notes the fork generation it was made in;
  :func:`os.register_at_fork` bumps the generation in each child, and an
  object from an earlier generation raises :func:`inherited_error` from
  every method without touching gRPC, the loop or its locks (``is_valid()``
  is False, ``valid_for()`` 0). The parent's holds and leases stay the
  parent's: nothing in the child renews, releases or revokes them.
- a process forked from one that had opened a client (even a closed one)
  cannot make a new one: gRPC shares its internal state with the parent
  there, and a new channel in such a child was found to fail to connect, to
  hang, or to make the parent lose its hold, with or without
  ``GRPC_ENABLE_FORK_SUPPORT``. :func:`check_new_client` raises
  :func:`forked_child_error`. A process forked from one that never opened a
  client makes clients as usual.
- gRPC's own default (fork support on in grpcio 1.85) restarts its threads
  in the child, which sometimes kill it with SIGSEGV whatever the child
  does; ``GRPC_ENABLE_FORK_SUPPORT=0`` in the environment avoids it (see
  docs/python.md). Freeing the inherited objects in the child (with it) was
  harmless to both processes, so nothing keeps them alive.

The supported patterns: multiprocessing's ``spawn`` or ``forkserver``
start methods, or a client made after fork in a process that never had one.
"""

from __future__ import annotations

import os

from .errors import REASON_FORKED, FencepostError

__all__ = ["SUPPORTED", "check_new_client", "forked_child_error", "generation", "inherited_error", "opened_channel"]

#: The ways to use Fencepost with several processes, for error messages.
SUPPORTED = ("use multiprocessing's 'spawn' or 'forkserver' start method (multiprocessing.get_context('spawn')), "
             "or make the client after fork in a process that never had one")

# How many forks separate this process from the one that imported the module.
_generation = 0
# The pid of this process's ancestor that opened a client channel, if any.
_opened_in: int | None = None
# Whether this process was forked from one that had opened a client channel.
_forked_after_open = False


def generation() -> int:
    """The current fork generation: objects made under another one were inherited through fork."""
    return _generation


def opened_channel() -> None:
    """Note that a client opens a channel in this process (children forked later cannot make clients)."""
    global _opened_in
    if _opened_in is None:
        _opened_in = os.getpid()


def inherited_error(what: str, name: str | None = None, lease_id: int | None = None) -> FencepostError:
    """The error every method of a client or handle inherited through fork raises.

    Args:
        what: What was inherited ("LockClient", "lock handle").
        name: The lock name, for a handle.
        lease_id: The lease id, for a handle.
    """
    return FencepostError(
        f"this {what} was inherited through fork and cannot be used in the child process {os.getpid()}: "
        f"its gRPC channel and holds belong to the parent (which keeps them); {SUPPORTED}",
        name=name, lease_id=lease_id, reason=REASON_FORKED,
    )


def forked_child_error() -> FencepostError:
    """The error a new client raises in a child forked from a process that had opened a client."""
    return FencepostError(
        f"cannot make a Fencepost client in process {os.getpid()}: it was forked from process {_opened_in}, "
        f"which had opened a client, and gRPC cannot be used in such a child; {SUPPORTED}",
        reason=REASON_FORKED,
    )


def check_new_client() -> None:
    """Refuse a new client in a child forked from a process that had opened one.

    Raises:
        FencepostError: this process was forked after a client opened a
            channel in it or an ancestor (reason "FORKED").
    """
    if _forked_after_open:
        raise forked_child_error()


def _after_in_child() -> None:
    # Only module state: the child must not touch gRPC, the loop or any lock.
    global _generation, _forked_after_open
    _generation += 1
    if _opened_in is not None:
        _forked_after_open = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_in_child)
