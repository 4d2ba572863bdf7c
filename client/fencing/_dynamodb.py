"""DynamoDB guard: the token check as a ``ConditionExpression`` of the write itself.

The token is a number attribute of the item (``fencing_token``; absent = no
token yet), an ``N`` holding an integer >= 0. ``put_item`` and
``update_item`` carry a condition, which DynamoDB evaluates atomically with
the write. A condition cannot tell an integer from a fraction, so a write is
up to two kinds of round; the first passes on no token or exactly the
writer's (a holder's own writes, a new item)::

    ConditionExpression="attribute_not_exists(#ft) OR #ft = :ft"
    ExpressionAttributeNames={"#ft": "fencing_token"}
    ExpressionAttributeValues={":ft": {"N": str(token)}}
    ReturnValuesOnConditionCheckFailure="ALL_OLD"

A failed condition (``ConditionalCheckFailedException``) returns the stored
token: from the ``ALL_OLD`` item, or, on servers that do not return it
(dynalite), from a consistent read made after the refusal. Above the
writer's: :class:`~fencepost.client.StaleTokenError`. Not an ``N`` holding an
integer >= 0 (``{"S": "7"}``, ``{"N": "7.5"}``):
:class:`~fencepost.client.fencing.MalformedTokenError`, nothing written. An
integer s below the writer's: the next round writes over exactly that one
(``#ft = :seen AND #ft <= :ft``, ``:seen`` = s), again if another write came
in between, up to :data:`MAX_ATTEMPTS` rounds
(:class:`~fencepost.client.ResourceExhausted`). ``update_item`` on a missing item creates it (DynamoDB's own rule;
``attribute_not_exists`` holds). Existing items need no migration: an item
without the attribute takes any token. To guard your own calls use
:func:`condition_kwargs`.

The guard owns the token attribute and the key attributes: ``attributes``
(``put_item``) or ``values`` (``update_item``) naming either raise
:class:`~fencepost.client.InvalidArgument` before any call (a caller's
token would be overwritten or refused by DynamoDB, and a key attribute
cannot change: write the item under its new key instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ..errors import InvalidArgument, ResourceExhausted
from ._ahead import TokenHold
from ._guard import TOKEN_FIELD, FencingGuard, RejectHook, check_identifier, check_text, check_token, writer_token

#: The condition of :func:`condition_kwargs`: no token yet, or a number from 0 to the writer's token.
CONDITION = "attribute_not_exists(#ft) OR #ft BETWEEN :ft0 AND :ft"
#: The guard's first round: no token yet, or exactly the writer's token (its own earlier writes).
FIRST_ROUND = "attribute_not_exists(#ft) OR #ft = :ft"
#: The guard's next round: exactly the integer token the refusal returned, still <= the writer's.
NEXT_ROUND = "#ft = :seen AND #ft <= :ft"
#: Conditional write rounds before a contended write gives up.
MAX_ATTEMPTS = 16


def condition_kwargs(token: int, *, token_attribute: str = TOKEN_FIELD) -> dict[str, Any]:
    """The boto3 keyword arguments that fence a ``put_item``/``update_item``/``delete_item``.

    Args:
        token: The writer's fencing token.
        token_attribute: The number attribute that stores the token.

    Returns:
        ``ConditionExpression`` (:data:`CONDITION`), ``ExpressionAttributeNames``
        (``#ft``), ``ExpressionAttributeValues`` (``:ft``, ``:ft0``) and
        ``ReturnValuesOnConditionCheckFailure="ALL_OLD"``; merge your own
        names and values into the two dicts. The condition refuses a stored
        token that is not a number (``{"S": "7"}``) or is negative, but a
        condition cannot tell an integer from a fraction: a stored ``7.5``
        passes it for a token >= 8. The guard's own writes close that gap
        (see :class:`DynamoDBGuard`).

    Raises:
        InvalidArgument: a bad token or attribute name.
    """
    check_token(token)
    check_identifier(token_attribute, "token_attribute")
    return {
        "ConditionExpression": CONDITION,
        "ExpressionAttributeNames": {"#ft": token_attribute},
        "ExpressionAttributeValues": {":ft": {"N": str(token)}, ":ft0": {"N": "0"}},
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


class DynamoDBGuard(FencingGuard):
    """Fenced writes to the items of one DynamoDB table (boto3 low-level client).

    Args:
        client: ``boto3.client("dynamodb", ...)`` (thread-safe; shared by writers).
        table: The table name.
        token_attribute: The number attribute that stores the token.
        on_reject: Hook called with each StaleTokenError (see FencingGuard).
        metrics: A ``prometheus_client.CollectorRegistry`` to count writes in
            (see FencingGuard); ``storage`` is ``dynamodb``.

    Raises:
        InvalidArgument: ``client`` is not a DynamoDB client, ``table`` is not
            a non-empty str, or ``token_attribute`` is not an identifier.
    """

    storage = "dynamodb"

    def __init__(self, client: Any, table: str, *, token_attribute: str = TOKEN_FIELD,
                 on_reject: RejectHook | None = None,
                 metrics: Any = None) -> None:
        super().__init__(on_reject=on_reject, metrics=metrics)
        if not all(callable(getattr(client, m, None)) for m in ("put_item", "update_item", "get_item")):
            raise InvalidArgument(f"client must be a boto3 DynamoDB client, got {client!r}", field="client")
        if not isinstance(table, str) or not table.strip():
            raise InvalidArgument(f"table must be a non-empty table name, got {table!r}", field="table")
        self.client = client
        self.table = table
        self.token_attribute = check_identifier(token_attribute, "token_attribute")

    def put_item(self, key: Mapping[str, Any], token: int | TokenHold, attributes: Mapping[str, Any]) -> None:
        """Replace the whole item if ``token`` is not lower than its token.

        Args:
            key: The item's key in low-level form, e.g. ``{"id": {"S": "inv:42"}}``.
            token: The writer's fencing token, or its lock handle (then a
                refusal while the hold is live is a StoredTokenAheadError).
            attributes: The other attributes, low-level form (``{"status": {"S": "paid"}}``).

        Raises:
            StaleTokenError: the item holds a higher token; nothing was written
                (StoredTokenAheadError while the hold given as ``token`` is live).
            MalformedTokenError: the item's token attribute is not an ``N``
                holding an integer >= 0 (``{"S": "7"}``, ``{"N": "7.5"}``);
                nothing was written.
            ResourceExhausted: every round lost to another write; nothing was written.
            InvalidArgument: a bad key or token, or ``attributes`` is not a
                mapping or names the token attribute or a key attribute
                (field ``attributes``), or a str in the key or the attributes is not
                valid UTF-8; nothing was sent.
            botocore.exceptions.ClientError: any other failure.
        """
        token, hold = writer_token(token)
        kwargs = condition_kwargs(token, token_attribute=self.token_attribute)
        self._check(key, attributes, "attributes")
        item = {**attributes, **key, self.token_attribute: {"N": str(token)}}
        self._write(key, token, hold, self.client.put_item, TableName=self.table, Item=item, **kwargs)

    def update_item(self, key: Mapping[str, Any], token: int | TokenHold, values: Mapping[str, Any]) -> None:
        """Set some attributes (creating the item if needed) if ``token`` is not lower than its token.

        Args:
            key: The item's key in low-level form.
            token: The writer's fencing token, or its lock handle (then a
                refusal while the hold is live is a StoredTokenAheadError).
            values: Attribute name -> low-level value to SET (``{}`` writes
                the token alone).

        Raises:
            StaleTokenError: the item holds a higher token; nothing was written
                (StoredTokenAheadError while the hold given as ``token`` is live).
            MalformedTokenError: the item's token attribute is not an ``N``
                holding an integer >= 0 (``{"S": "7"}``, ``{"N": "7.5"}``);
                nothing was written.
            ResourceExhausted: every round lost to another write; nothing was written.
            InvalidArgument: a bad key or token, or ``values`` is not a
                mapping or names the token attribute or a key attribute
                (field ``values``), or a str in the key or the values is not
                valid UTF-8; nothing was sent.
            botocore.exceptions.ClientError: any other failure.
        """
        token, hold = writer_token(token)
        kwargs = condition_kwargs(token, token_attribute=self.token_attribute)
        self._check(key, values, "values")
        sets = ["#ft = :ft"]
        for i, (name, value) in enumerate(values.items()):
            kwargs["ExpressionAttributeNames"][f"#a{i}"] = name
            kwargs["ExpressionAttributeValues"][f":a{i}"] = value
            sets.append(f"#a{i} = :a{i}")
        self._write(key, token, hold, self.client.update_item, TableName=self.table, Key=dict(key),
                    UpdateExpression="SET " + ", ".join(sets), **kwargs)

    def get_item(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        """Read an item with a consistent read; None when there is none.

        Raises:
            InvalidArgument: ``key`` is not a non-empty mapping, or holds a
                str that is not valid UTF-8.
        """
        self._check_key(key)
        resp = self.client.get_item(TableName=self.table, Key=dict(key), ConsistentRead=True)
        item = resp.get("Item")
        return None if item is None else dict(item)

    def _check_key(self, key: Mapping[str, Any]) -> None:
        if not isinstance(key, Mapping) or not key:
            raise InvalidArgument(f"key must be the item's key attributes in low-level form, such as "
                                  f"{{'id': {{'S': 'inv:42'}}}}, got {key!r}", field="key")
        if self.token_attribute in key:
            raise InvalidArgument(f"key must not contain the token attribute {self.token_attribute!r}", field="key")
        check_text(key, "key")

    def _check(self, key: Mapping[str, Any], values: Mapping[str, Any], argument: str) -> None:
        """Check a write's key and attributes before any call (``argument`` names the attributes)."""
        self._check_key(key)
        if not isinstance(values, Mapping):
            raise InvalidArgument(f"{argument} must be a mapping of attribute name to low-level value, "
                                  f"got {type(values).__name__}", field=argument)
        for name in values:
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"{argument} must have non-empty str attribute names, got {name!r}",
                                      field=argument)
            if name == self.token_attribute:
                raise InvalidArgument(f"{argument} must not set the token attribute {name!r}: the guard writes "
                                      f"the fencing token itself", field=argument)
            if name in key:
                raise InvalidArgument(f"{argument} must not set the key attribute {name!r}: the key picks the "
                                      f"item; write the item under its new key instead", field=argument)
        check_text(values, argument)

    def _write(self, key: Mapping[str, Any], token: int, hold: TokenHold | None, call: Any, **kwargs: Any) -> None:
        """Write in conditional rounds: no token or this token; else exactly the integer token seen, if <= ``token``."""
        values = kwargs["ExpressionAttributeValues"]
        del values[":ft0"]
        kwargs["ConditionExpression"] = FIRST_ROUND
        for _ in range(MAX_ATTEMPTS):
            try:
                call(**kwargs)
            except self.client.exceptions.ConditionalCheckFailedException as exc:
                old = exc.response.get("Item")
                if old is None:  # server without ReturnValuesOnConditionCheckFailure
                    old = self.get_item(key)
                stored = None if old is None else old.get(self.token_attribute)
                if stored is None:  # the item or its token went away since: start over
                    kwargs["ConditionExpression"] = FIRST_ROUND
                    values.pop(":seen", None)
                    continue
                current = token_number(stored)
                if current is None:
                    raise self._malformed(dict(key), token, stored, what=f"{self.token_attribute} attribute") from exc
                if current > token:
                    raise self._reject(dict(key), token, current, hold=hold) from exc
                kwargs["ConditionExpression"] = NEXT_ROUND
                values[":seen"] = stored
            else:
                self._accepted()
                return
        raise ResourceExhausted(f"{self.table}: {MAX_ATTEMPTS} conditional writes with fencing token {token} to "
                                f"{dict(key)!r} each lost to another write; nothing written, retry later")


def token_number(stored: object) -> int | None:
    """A stored DynamoDB token (``{"N": "7"}``) as an int; None unless it is an ``N`` holding an integer >= 0."""
    if not isinstance(stored, Mapping) or list(stored) != ["N"] or not isinstance(stored["N"], str):
        return None
    try:
        number = Decimal(stored["N"])
    except ArithmeticError:
        return None
    if not number.is_finite() or number < 0 or number != number.to_integral_value():
        return None
    return int(number)
