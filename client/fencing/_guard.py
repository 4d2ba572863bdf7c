"""The base of every fencing guard: token checks, the rejection counter and hook, the metrics."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .._metrics import guard_metrics
from ..errors import InvalidArgument, StaleTokenError
from ..v1.details import ErrorReason, reason_name
from ..v1.keys import MAX_TOKEN

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
        InvalidArgument: the token is not an int (bool excluded) or is not
            1 to 2**63-1 (field ``token``).
    """
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(f"token must be an int fencing token, not {type(token).__name__}", field="token")
    if not 0 < token <= MAX_TOKEN:
        raise InvalidArgument(f"token is {token}; must be a fencing token of a grant (1 to 2**63-1)", field="token")
    return token


def _texts(value: Any) -> Iterator[str]:
    """Every str in ``value``: itself, or nested in mappings (keys and values), lists, tuples and sets."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _texts(key)
            yield from _texts(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _texts(item)


def check_text(value: Any, argument: str) -> None:
    """Refuse a str that cannot be sent as UTF-8 (a lone surrogate), alone or nested, before anything is sent.

    Args:
        value: A key, value or mapping of values as the caller passed it.
        argument: The argument that carried it, named in the error.

    Raises:
        InvalidArgument: a str in ``value`` holds a lone surrogate (as
            ``sys.argv`` and ``os.fsdecode`` hold a byte that is not UTF-8),
            which the database driver could not encode (field ``argument``).
    """
    for text in _texts(value):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise InvalidArgument(f"{argument} must be valid UTF-8: character {err.start} of {text!r} is "
                                  f"{text[err.start]!r}, a lone surrogate", field=argument) from None


def check_identifier(value: str, argument: str) -> str:
    """Check a table, column or attribute name before it is put in a statement.

    Args:
        value: The name.
        argument: The argument that carried it, named in the error.

    Returns:
        The name unchanged.

    Raises:
        InvalidArgument: ``value`` does not match ``^[A-Za-z_][A-Za-z0-9_]*$``
            (field ``argument``).
    """
    if not isinstance(value, str) or not IDENTIFIER.match(value):
        raise InvalidArgument(f"{argument} must match {IDENTIFIER.pattern}, got {value!r}", field=argument)
    return value


class FencingGuard:
    """Base class of the guards: counts rejections and calls the hook.

    Args:
        on_reject: Called with each :class:`StaleTokenError` the guard is about
            to raise, in the writer's thread (or task), after the refused write
            and before the raise. Meant for metrics and logs: an exception it
            raises is logged and does not change the outcome.
        metrics: A ``prometheus_client.CollectorRegistry`` to count the
            guard's writes in (``fencepost_guard_writes_total`` and
            ``fencepost_guard_stale_rejections_total``, labelled
            ``storage``; guards given the same registry share them); None
            (the default) records nothing and imports nothing.
        storage: The ``storage`` label; the class's :attr:`storage` by default.

    Attributes:
        rejected: How many writes this guard has refused (thread-safe count).
        storage: The kind of storage, the ``storage`` label of its metrics.

    Raises:
        InvalidArgument: ``metrics`` is not a ``CollectorRegistry`` (field ``metrics``).
    """

    storage = "unknown"

    def __init__(self, *, on_reject: RejectHook | None = None, metrics: Any = None, storage: str | None = None) -> None:
        self.on_reject = on_reject
        self._rejected = 0
        self._count_lock = threading.Lock()
        if storage is not None:
            self.storage = storage
        self._metrics = guard_metrics(metrics, self.storage)

    def _accepted(self) -> None:
        """Count a write the storage accepted."""
        self._metrics.accepted()

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
        reason: int = ErrorReason.STALE_TOKEN,
        name: str | None = None,
        lease_id: int | None = None,
    ) -> StaleTokenError:
        """Count a refused write, call the hook, and return the error to raise.

        Args:
            record: The record's key.
            token: The token the write carried.
            current_token: The record's (or lock's) newer token, when known.
            message: The error message; a default names both tokens.
            reason: An ErrorReason: STALE_TOKEN, or NOT_HOLDER (etcd guard).
            name: The lock name, when known.
            lease_id: The writer's lease id, when known.
        """
        if message is None:
            message = (f"write with fencing token {token} refused: the record has accepted "
                       f"fencing token {current_token}")
        err = StaleTokenError(message, record=record, token=token, current_token=current_token,
                              reason=reason_name(reason), name=name, lease_id=lease_id)
        with self._count_lock:
            self._rejected += 1
        self._metrics.rejected()
        if self.on_reject is not None:
            try:
                self.on_reject(err)
            except Exception:  # noqa: BLE001 - a metrics hook must not change the write's outcome
                _log.exception("fencing on_reject hook failed")
        return err
