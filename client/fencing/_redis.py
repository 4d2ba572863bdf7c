"""Redis guard: one Lua script compares and sets the value and the token atomically.

A guarded record is a hash with two fields, ``value`` and ``fencing_token``
(the token as a decimal string; no field = no token yet). Redis runs a script
without interleaving any other command, so the compare and the set are one
step. The script (registered once with ``register_script``, run by EVALSHA)::

    local stored = redis.call('HGET', KEYS[1], 'fencing_token')
    local t = ARGV[1]
    if stored and not (stored == '0' or string.find(stored, '^[1-9][0-9]*$')) then
      return {2, stored}
    end
    if stored and (#stored > #t or (#stored == #t and stored > t)) then
      return {0, stored}
    end
    redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fencing_token', t)
    return {1, t}

Tokens are compared as decimal strings without leading zeros (longer is
larger, then byte order), so the comparison is exact for any 64-bit token.
A stored token that is not in that canonical form (``"1e3"``, ``"007"``,
``"7.0"``, ``"-5"``, ``""``, ``"abc"``: written by something else) cannot be
compared so: the script refuses the write ({2, stored}) and the guard raises
:class:`~fencepost.client.fencing.MalformedTokenError`, record unchanged.
Needs Redis 4.0 or later (HSET with several fields).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidArgument
from ._ahead import TokenHold
from ._guard import FencingGuard, MalformedTokenError, RejectHook, check_text, stored_token, writer_token

SCRIPT = """\
local stored = redis.call('HGET', KEYS[1], 'fencing_token')
local t = ARGV[1]
if stored and not (stored == '0' or string.find(stored, '^[1-9][0-9]*$')) then
  return {2, stored}
end
if stored and (#stored > #t or (#stored == #t and stored > t)) then
  return {0, stored}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fencing_token', t)
return {1, t}
"""


def _check_data(data: object, field: str) -> None:
    """What redis-py sends as a key or an argument: str, bytes, int or float (not None, not bool)."""
    if isinstance(data, bool) or not isinstance(data, (str, bytes, int, float)):
        raise InvalidArgument(f"{field} must be str, bytes, int or float, got {data!r}", field=field)
    check_text(data, field)


class RedisGuard(FencingGuard):
    """Fenced writes to Redis hashes (fields ``value`` and ``fencing_token``).

    Args:
        client: A ``redis.Redis`` client (thread-safe; shared by writers).
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
        metrics: A ``prometheus_client.CollectorRegistry`` to count writes in
            (see FencingGuard); ``storage`` is ``redis``.

    Raises:
        InvalidArgument: ``client`` is not a redis-py client.
    """

    storage = "redis"

    def __init__(self, client: Any, *, on_reject: RejectHook | None = None,
                 metrics: Any = None) -> None:
        super().__init__(on_reject=on_reject, metrics=metrics)
        if not all(callable(getattr(client, m, None)) for m in ("register_script", "hmget")):
            raise InvalidArgument(f"client must be a redis-py client (redis.Redis), got {client!r}", field="client")
        self.client = client
        self._script = client.register_script(SCRIPT)

    def put(self, key: str | bytes, token: int | TokenHold, value: str | bytes | int | float) -> None:
        """Set the record's value if ``token`` is not lower than its token.

        Args:
            key: The Redis key of the record (a hash).
            token: The writer's fencing token, or its lock handle (then a
                refusal while the hold is live is a StoredTokenAheadError).
            value: The new value (stored in the hash field ``value``).

        Raises:
            StaleTokenError: the record holds a higher token; nothing was written
                (StoredTokenAheadError while the hold given as ``token`` is live).
            MalformedTokenError: the record's ``fencing_token`` field is not a
                canonical non-negative integer; nothing was written.
            InvalidArgument: a bad token, or a key or value that is not
                str, bytes, int or float (None, say) or a str that is not
                valid UTF-8; nothing was sent.
            redis.exceptions.RedisError: the server failed (e.g. WRONGTYPE).
        """
        token, hold = writer_token(token)
        _check_data(key, "key")
        _check_data(value, "value")
        outcome, stored = self._script(keys=[key], args=[str(token), value])
        if int(outcome) == 1:
            self._accepted()
            return
        current = stored_token(stored, text=True)
        if int(outcome) == 2 or current is None:
            raise self._malformed(key, token, stored, what="fencing_token field")
        raise self._reject(key, token, current, hold=hold)

    def get(self, key: str | bytes) -> tuple[bytes | None, int | None]:
        """Read a record: (value, token), each None when absent (one HMGET).

        Raises:
            MalformedTokenError: the stored token is not a canonical
                non-negative integer (not counted: nothing was refused).
            InvalidArgument: ``key`` is not str, bytes, int or float, or
                is a str that is not valid UTF-8.
            redis.exceptions.RedisError: the server failed.
        """
        _check_data(key, "key")
        value, stored = self.client.hmget(key, ["value", "fencing_token"])
        token = None if stored is None else stored_token(stored, text=True)
        if stored is not None and token is None:
            raise MalformedTokenError(f"{key!r}: the stored fencing_token field is {stored!r}, not a fencing token",
                                      record=key, stored=stored)
        return value, token
