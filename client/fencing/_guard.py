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
from ._ahead import StoredTokenAheadError, TokenHold, ahead_message, is_live

_log = logging.getLogger("fencepost.client.fencing")

#: What a table, column or attribute name must look like to be put in a statement.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: Default name of the column / field / attribute that stores the token.
TOKEN_FIELD = "fencing_token"

RejectHook = Callable[[StaleTokenError], None]

#: A stored token's text form: decimal digits, no sign, no leading zero but in "0" itself.
CANONICAL_TOKEN = re.compile(r"^(0|[1-9][0-9]*)\Z")
#: The client-local reason of :class:`MalformedTokenError`.
REASON_MALFORMED_TOKEN = "MALFORMED_TOKEN"


class MalformedTokenError(StaleTokenError):
    """A guard refused a write because the record's stored token is not a fencing token.

    The record holds a token it did not get from a guard: not a canonical
    non-negative integer (decimal digits, no sign, no leading zeros but
    ``"0"``, no exponent, fraction or whitespace), or not of the store's
    integer type (a SQL integer column, a DynamoDB ``N`` holding an integer).
    The guard cannot order the write against it, so it refuses the write and
    leaves the record unchanged; the refusal is counted in ``rejected`` and
    passed to ``on_reject`` like a stale one. Fix the record (or delete its
    token) outside the guard. A subclass of :class:`StaleTokenError`, so that
    code that stops on a refused write stops on this one too.

    Attributes:
        stored: The stored token as the store returned it (``"1e3"``,
            ``b"007"``, ``Decimal("7.5")``, ``{"S": "7"}``).
        current_token: Always None: there is no token to compare.
        reason: ``"MALFORMED_TOKEN"`` (client-local).
    """

    def __init__(self, message: str = "", *, stored: object = None, **kwargs: Any) -> None:
        kwargs.setdefault("reason", REASON_MALFORMED_TOKEN)
        super().__init__(message, **kwargs)
        self.stored = stored


def stored_token(value: object, *, text: bool) -> int | None:
    """A stored token as an int, or None when it is malformed.

    Args:
        value: The stored token as the store returned it.
        text: Whether the store keeps the token as text (Redis, S3, etcd):
            then ``str``/``bytes`` in canonical form are tokens; else only an
            ``int`` (not bool) is (a SQL integer column, a DynamoDB ``N``
            parsed by the caller).

    Returns:
        The token (>= 0), or None when ``value`` is not a canonical
        non-negative integer of the store's type.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value if value >= 0 and not text else None
    if text and isinstance(value, (bytes, bytearray)):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    if text and isinstance(value, str) and CANONICAL_TOKEN.match(value):
        return int(value)
    return None


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


def writer_token(token: int | TokenHold) -> tuple[int, TokenHold | None]:
    """The token a write carries, and the hold it came with (see :mod:`._ahead`).

    Args:
        token: The writer's fencing token, or its lock handle (an object with
            ``.token`` and ``.is_valid()``, a :class:`TokenHold`).

    Returns:
        (the token, checked; the hold, or None for a bare token).

    Raises:
        InvalidArgument: neither a token nor a hold, or the token is not 1 to
            2**63-1 (field ``token``).
    """
    if isinstance(token, int):
        return check_token(token), None
    inner = getattr(token, "token", None)
    if inner is None or not callable(getattr(token, "is_valid", None)):
        raise InvalidArgument(f"token must be an int fencing token or a lock handle (.token and .is_valid()), "
                              f"not {type(token).__name__}", field="token")
    return check_token(inner), token


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
            to raise (its ``storage`` set to the guard's), in the writer's
            thread (or task), after the refused write and before the raise.
            Meant for metrics and logs: an exception it raises is logged and
            does not change the outcome. A client's ``stale_write_reporter()``
            reports each refusal to the coordinator (its metrics and lock board).
        metrics: A ``prometheus_client.CollectorRegistry`` to count the
            guard's writes in (``fencepost_guard_writes_total`` and
            ``fencepost_guard_stale_rejections_total`` and
            ``fencepost_guard_token_ahead_total``, labelled
            ``storage``; guards given the same registry share them); None
            (the default) records nothing and imports nothing.
        storage: The ``storage`` label; the class's :attr:`storage` by default.

    Attributes:
        rejected: How many writes this guard has refused (thread-safe count).
        ahead: How many of those refusals came with a live hold: the stored
            token was ahead of the lock service (:class:`StoredTokenAheadError`;
            also ``fencepost_guard_token_ahead_total``).
        storage: The kind of storage, the ``storage`` label of its metrics.

    Raises:
        InvalidArgument: ``metrics`` is not a ``CollectorRegistry`` (field ``metrics``).
    """

    storage = "unknown"

    def __init__(self, *, on_reject: RejectHook | None = None, metrics: Any = None, storage: str | None = None) -> None:
        self.on_reject = on_reject
        self._rejected = 0
        self._ahead = 0
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

    @property
    def ahead(self) -> int:
        """How many refused writes came with a live hold (:class:`StoredTokenAheadError`) since it was made."""
        return self._ahead

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
        hold: TokenHold | None = None,
        held: bool = False,
    ) -> StaleTokenError:
        """Count a refused write, call the hook, and return the error to raise.

        A refusal over a higher stored token whose writer still holds its lock
        (``held``, or ``hold.is_valid()`` asked now, after the refusal) is a
        :class:`StoredTokenAheadError`, counted in :attr:`ahead` too.

        Args:
            record: The record's key.
            token: The token the write carried.
            current_token: The record's (or lock's) newer token, when known.
            message: The error message; a default names both tokens.
            reason: An ErrorReason: STALE_TOKEN, or NOT_HOLDER (etcd guard).
            name: The lock name, when known.
            lease_id: The writer's lease id, when known.
            hold: The writer's hold, when it gave one in place of the token (its ``name``, if it has one,
                is the lock name when ``name`` is not given).
            held: The guard itself saw that the writer holds the lock (etcd).
        """
        if name is None and isinstance(getattr(hold, "name", None), str):
            name = hold.name  # type: ignore[union-attr]
        if (reason == ErrorReason.STALE_TOKEN and current_token is not None and current_token > token
                and (held or is_live(hold))):
            with self._count_lock:
                self._ahead += 1
            self._metrics.ahead()
            return self._count(StoredTokenAheadError(ahead_message(token, current_token), record=record, token=token,
                                                     current_token=current_token, name=name, lease_id=lease_id))
        if message is None:
            message = (f"write with fencing token {token} refused: the record has accepted "
                       f"fencing token {current_token}")
        err = StaleTokenError(message, record=record, token=token, current_token=current_token,
                              reason=reason_name(reason), name=name, lease_id=lease_id)
        return self._count(err)

    def _malformed(self, record: object, token: int, stored: object, *, what: str = "token",
                   name: str | None = None, lease_id: int | None = None) -> MalformedTokenError:
        """Count a write refused over a malformed stored token, call the hook, and return the error to raise.

        Args:
            record: The record's key.
            token: The token the write carried.
            stored: The stored token as the store returned it.
            what: Where the token is stored, for the message (a column, an attribute).
        """
        err = MalformedTokenError(
            f"write with fencing token {token} refused: the record's stored {what} is {stored!r}, not a fencing "
            f"token (a non-negative integer in canonical form); it was written outside the guard",
            record=record, token=token, stored=stored, name=name, lease_id=lease_id)
        return self._count(err)

    def _count(self, err: StaleTokenError) -> Any:
        """Count ``err`` as a refused write (its ``storage`` this guard's), call the hook; returns ``err``."""
        err.storage = self.storage
        with self._count_lock:
            self._rejected += 1
        self._metrics.rejected()
        if self.on_reject is not None:
            try:
                self.on_reject(err)
            except Exception:  # noqa: BLE001 - a metrics hook must not change the write's outcome
                _log.exception("fencing on_reject hook failed")
        return err
