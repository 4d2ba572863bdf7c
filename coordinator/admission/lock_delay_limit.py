"""The longest lock-delay a caller may ask for on a lock: ``serve --max-lock-delay``, lowered by the policy.

A lock-delay holds a free lock back from every other caller (:mod:`..recipes.lock_delay`),
so a caller that may acquire a name could otherwise make it unobtainable for an
hour (the protocol's bound, 3600 s) by letting a lease with a long delay die.
The coordinator's bound is ``--max-lock-delay`` (default 60 s: Chubby's
"currently one minute" and Consul's ``MaxLockDelay`` of 60 s); an access
policy rule that allows ``acquire`` may lower it for the callers and names it
covers with ``max_lock_delay_seconds``. When several rules allow the Acquire,
the largest of their bounds applies (rules add up, as their grants do); never
more than ``--max-lock-delay``.

A request above the bound is refused with INVALID_ARGUMENT naming
``lock_delay_seconds``, as Consul refuses a session's LockDelay above its
maximum (rather than clamping: a holder that asked for a longer delay relies
on it to let in-flight writes land, and a shorter one granted silently would
break that reliance unseen).
"""

from __future__ import annotations

from typing import Any

from fencepost.client.errors import InvalidArgument
from fencepost.client.v1.keys import MAX_LOCK_DELAY_SECONDS

from .access import ACQUIRE, ANY_IDENTITY, Access, Policy, Rule
from .identity import caller_of

__all__ = ["DEFAULT_MAX_LOCK_DELAY_SECONDS", "LockDelayLimit", "limit_of"]

#: ``--max-lock-delay``'s default, in seconds.
DEFAULT_MAX_LOCK_DELAY_SECONDS = 60


def limit_of(policy: Policy | None, identity: str | None, name: str, ceiling: int) -> int:
    """The longest lock-delay, in seconds, ``identity`` (None: no certificate) may ask for on lock ``name``.

    Args:
        policy: the policy in force (None: ``ceiling``).
        ceiling: the coordinator's ``--max-lock-delay`` (0: the protocol's 3600).
    """
    ceiling = ceiling or MAX_LOCK_DELAY_SECONDS
    if policy is None:
        return ceiling
    bounds = [ceiling if rule.max_lock_delay_seconds is None else rule.max_lock_delay_seconds
              for rule in policy.rules if _covers(rule, identity, name)]
    return min(ceiling, max(bounds, default=ceiling))


def _covers(rule: Rule, identity: str | None, name: str) -> bool:
    """Whether ``rule`` allows ``identity`` to acquire ``name``."""
    if ACQUIRE not in rule.actions:
        return False
    if identity is None:
        if not rule.anonymous:
            return False
    elif identity not in rule.identities and ANY_IDENTITY not in rule.identities:
        return False
    return any(p == "*" or p == name or (p.endswith("*") and name.startswith(p[:-1])) for p in rule.names)


class LockDelayLimit:
    """Checks an Acquire's ``lock_delay_seconds`` against its caller's bound (see the module docstring).

    Args:
        access: the access policy in force (read at each check: a reload applies at once).
        ceiling: ``--max-lock-delay`` in seconds (0: the protocol's 3600).
    """

    def __init__(self, access: Access, ceiling: int = DEFAULT_MAX_LOCK_DELAY_SECONDS) -> None:
        self._access = access
        self.ceiling = ceiling

    def check(self, context: Any, name: str, seconds: int) -> None:
        """Refuse a lock-delay above the caller's bound on ``name``.

        Raises:
            InvalidArgument: field ``lock_delay_seconds``, with the name and the bound in the message.
        """
        if not seconds:
            return
        bound = limit_of(self._access.policy, caller_of(context).identity, name, self.ceiling)
        if seconds > bound:
            raise InvalidArgument(f"lock_delay_seconds is {seconds}; this coordinator allows at most {bound} "
                                  f"seconds on {name!r} (serve --max-lock-delay, or the access policy)",
                                  name=name, field="lock_delay_seconds")
