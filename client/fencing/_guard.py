"""The base of every fencing guard: token checks, the rejection counter and hook."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable

from ..errors import StaleTokenError

_log = logging.getLogger("fencepost.client.fencing")

#: What a table, column or attribute name must look like to be put in a statement.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Default name of the column / field / attribute that stores the token.
TOKEN_FIELD = "fencing_token"

RejectHook = Callable[[StaleTokenError], None]


def check_token(token: int) -> int:
    """Check a fencing token offered with a write.

    Args:
        token: The fencing token of the writer's grant (an etcd revision, > 0).

    Returns:
        The token unchanged.

    Raises:
        ValueError: the token is not an int (bool excluded) or is not > 0.
    """
    if isinstance(token, bool) or not isinstance(token, int):
        raise ValueError(f"token must be an int fencing token, not {type(token).__name__}")
    if token <= 0 or token > 2**63 - 1:
        raise ValueError(f"token is {token}; must be a fencing token of a grant (1 to 2**63-1)")
    return token


def check_identifier(value: str, argument: str) -> str:
    """Check a table, column or attribute name before it is put in a statement.

    Args:
        value: The name.
        argument: The argument that carried it, named in the error.

    Returns:
        The name unchanged.

    Raises:
        ValueError: ``value`` does not match ``^[A-Za-z_][A-Za-z0-9_]*$``.
    """
    if not isinstance(value, str) or not IDENTIFIER.match(value):
        raise ValueError(f"{argument} must match {IDENTIFIER.pattern}, got {value!r}")
    return value


class FencingGuard:
    """Base class of the guards: counts rejections and calls the hook.

    Args:
        on_reject: Called with each :class:`StaleTokenError` the guard is about
            to raise, in the writer's thread (or task), after the refused write
            and before the raise. Meant for metrics and logs: an exception it
            raises is logged and does not change the outcome.

    Attributes:
        rejected: How many writes this guard has refused (thread-safe count).
    """

    def __init__(self, *, on_reject: RejectHook | None = None) -> None:
        self.on_reject = on_reject
        self._rejected = 0
        self._count_lock = threading.Lock()

    @property
    def rejected(self) -> int:
        """How many writes this guard has refused since it was made."""
        return self._rejected

    def _reject(
        self,
        record: object,
        token: int,
        current_token: int | None,
        *,
        message: str | None = None,
        reason: str = "STALE_TOKEN",
        name: str | None = None,
        lease_id: int | None = None,
    ) -> StaleTokenError:
        """Count a refused write, call the hook, and return the error to raise."""
        if message is None:
            message = (f"write with fencing token {token} refused: the record has accepted "
                       f"fencing token {current_token}")
        err = StaleTokenError(message, record=record, token=token, current_token=current_token,
                              reason=reason, name=name, lease_id=lease_id)
        with self._count_lock:
            self._rejected += 1
        if self.on_reject is not None:
            try:
                self.on_reject(err)
            except Exception:  # noqa: BLE001 - a metrics hook must not change the write's outcome
                _log.exception("fencing on_reject hook failed")
        return err
