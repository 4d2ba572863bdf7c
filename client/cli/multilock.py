"""Multi-locks on the command line: ``fencepost run`` and ``fencepost acquire`` given several NAMEs.

Several names are held all together or not at all
(:meth:`~fencepost.client.AsyncLockClient.acquire_all`, docs/multilocks.md):
one AcquireAll queues the caller in every lock at one etcd revision, so two
commands that share names never deadlock, whatever order each gives them
(Curator's ``InterProcessMultiLock`` takes them one after another instead).
Each name has its own fencing token. ``run`` hands them to its command as
``FENCEPOST_LOCK_<i>`` and ``FENCEPOST_TOKEN_<i>`` (``i`` from 0, in the
order the names were given) and ``FENCEPOST_LOCK_COUNT``; ``FENCEPOST_LOCK``
and ``FENCEPOST_TOKEN`` are left unset, since no one token stands for the
others. ``acquire`` prints the tokens on its first line, in the same order.

Several names take no ``--read`` (the clients' multi-locks have no read
mode), ``--permits`` or ``--lock-delay``: :func:`refuse_flags` exits 2
naming the flag.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Mapping, Sequence

from fencepost.client import AsyncLockClient, AsyncMultiLockHandle
from fencepost.client._recipes.multilock import check_names
from fencepost.client.errors import InvalidArgument

from . import progress
from .common import EXIT_USAGE, CliError, err_text
from .flags import lock_name
from .printable import shown_name

__all__ = ["ENV_LOCK_AT", "ENV_LOCK_COUNT", "ENV_TOKEN_AT", "acquiring", "hold_words", "lease_secret", "lock_names", "names_look",
           "refuse_flags", "shown_names", "tokens_env"]

ENV_LOCK_COUNT = "FENCEPOST_LOCK_COUNT"
"""The child's environment with several names: how many locks it holds (2 to 32)."""
ENV_LOCK_AT = "FENCEPOST_LOCK_{}"
"""The child's environment with several names: ``FENCEPOST_LOCK_0``, ``_1``, ...: each lock name, in the order given."""
ENV_TOKEN_AT = "FENCEPOST_TOKEN_{}"
"""The child's environment with several names: ``FENCEPOST_TOKEN_0``, ``_1``, ...: the fencing token of
``FENCEPOST_LOCK_<i>`` (decimal)."""


def lock_names(names: Sequence[str]) -> list[str]:
    """Check the NAME arguments of a command: each by :func:`~.flags.lock_name`, and several as a multi-lock's.

    Args:
        names: One name, or 2 to 32 distinct names.

    Returns:
        The names, in the order given.

    Raises:
        CliError: a bad name, a name given twice, more than 32 names (exit 2).
    """
    for name in names:
        lock_name(name)
    if len(names) == 1:
        return list(names)
    try:
        return check_names(names)
    except InvalidArgument as err:
        raise CliError(f"invalid names: {err_text(err)}", EXIT_USAGE) from None


def refuse_flags(args: argparse.Namespace, names: Sequence[str]) -> None:
    """Refuse the flags that several names do not take (exit 2), naming the flag.

    Args:
        args: The parsed command line (``read``, ``lock_delay``, and ``permits`` where the command has it).
        names: The NAME arguments.

    Raises:
        CliError: ``--read``, ``--lock-delay`` or ``--permits`` with several names (exit 2).
    """
    if len(names) < 2:
        return
    if args.read:
        raise CliError("--read takes one NAME: a multi-lock (several names) is held for writing only",
                       EXIT_USAGE)
    if args.lock_delay:
        raise CliError("--lock-delay takes one NAME: a multi-lock (several names) has no lock-delay", EXIT_USAGE)
    if getattr(args, "permits", None) is not None:
        raise CliError("--permits takes one NAME (a semaphore), not several", EXIT_USAGE)


def shown_names(names: Sequence[str]) -> str:
    """The names as messages show them: each escaped (:func:`.printable.shown_name`), comma-separated."""
    return ", ".join(shown_name(name) for name in names)


def hold_words(handle: AsyncMultiLockHandle) -> str:
    """A multi-lock as messages name it: ``a, b with tokens 17, 17`` (each name's token, in the order given)."""
    return f"{shown_names(handle.names)} with tokens {', '.join(str(handle.token_for(n)) for n in handle.names)}"


def lease_secret(handle: AsyncMultiLockHandle) -> str:
    """The secret of the lease that holds every name ("" when the coordinator gave none)."""
    return handle.lease_secret


def tokens_env(tokens: Mapping[str, int]) -> dict[str, str]:
    """The variables that hand a command the grant of each name (:data:`ENV_LOCK_COUNT`, :data:`ENV_LOCK_AT`,
    :data:`ENV_TOKEN_AT`).

    Args:
        tokens: name -> fencing token, in the order the names were given.

    Returns:
        ``FENCEPOST_LOCK_COUNT`` and, for each name i, ``FENCEPOST_LOCK_<i>`` and ``FENCEPOST_TOKEN_<i>``.
    """
    env = {ENV_LOCK_COUNT: str(len(tokens))}
    for i, (name, token) in enumerate(tokens.items()):
        env[ENV_LOCK_AT.format(i)] = name
        env[ENV_TOKEN_AT.format(i)] = str(token)
    return env


def names_look(client: AsyncLockClient, names: Sequence[str]) -> progress.Look:
    """A look at the locks of a waiting multi-lock: which of them are held, and by whom."""

    async def look() -> str:
        held = []
        for name in names:
            info = await client.describe(name)
            if info.held:
                held.append(f"{shown_name(name)} by lease 0x{info.holder_lease_id:x} (token {info.holder_token})")
        return f"held: {'; '.join(held)}" if held else "none held at the last look"

    return look


def acquiring(client: AsyncLockClient, names: Sequence[str], *, ttl: float, timeout: float | None,
              try_once: bool) -> tuple[Awaitable[AsyncMultiLockHandle], tuple[str, progress.Look]]:
    """The acquire of every lock of ``names`` (or none) and what its wait shows, for :func:`.acquire.acquire_unless`.

    Args:
        client: A connected client.
        names: 2 to 32 distinct lock names (checked).
        ttl: Lease TTL in seconds.
        timeout: Seconds to wait; None waits forever (ignored with ``try_once``).
        try_once: Take them only if every one is free now (``try_acquire_all``: LockHeld names the first held).

    Returns:
        The acquire (not started: a coroutine) and the progress line's ``(what, look)``.
    """
    call = (client.try_acquire_all(names, ttl=ttl) if try_once
            else client.acquire_all(names, ttl=ttl, timeout=timeout))
    return call, (f"locks {shown_names(names)} (all or none)", names_look(client, names))
