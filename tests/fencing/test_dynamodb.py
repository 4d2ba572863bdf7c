"""DynamoDB guard specifics, on dynalite: the guard owns the token and key attributes; argument checks."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from fencepost.client import InvalidArgument, StaleTokenError
from fencepost.client.fencing import DynamoDBGuard

from .servers import DynaliteServer

KEY = {"id": {"S": "inv:42"}}


@pytest.fixture
def table(dynalite: DynaliteServer) -> Iterator[tuple[Any, str]]:
    """A fresh table keyed by ``id`` (a string), and the client that made it."""
    client = dynalite.client()
    name = f"owned-{uuid.uuid4().hex[:12]}"
    client.create_table(
        TableName=name, KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")
    client.get_waiter("table_exists").wait(TableName=name, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
    try:
        yield client, name
    finally:
        client.close()


class Recording:
    """Wraps a boto3 client and records the write calls that reach it."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.exceptions = client.exceptions
        self.calls: list[str] = []

    def put_item(self, **kwargs: Any) -> Any:
        self.calls.append("put_item")
        return self._client.put_item(**kwargs)

    def update_item(self, **kwargs: Any) -> Any:
        self.calls.append("update_item")
        return self._client.update_item(**kwargs)

    def get_item(self, **kwargs: Any) -> Any:
        return self._client.get_item(**kwargs)


@pytest.mark.parametrize("attribute", ["fencing_token", "id"])
def test_writes_when_attributes_name_the_token_or_a_key_attribute(table: tuple[Any, str], attribute: str) -> None:
    """put_item attributes / update_item values naming the token or a key attribute: InvalidArgument, no call.

    Before, put_item silently dropped them (the key and token won) and
    update_item sent a request that DynamoDB refused with a ClientError.
    """
    client, name = table
    recording = Recording(client)
    guard = DynamoDBGuard(recording, name)
    guard.put_item(KEY, 5, {"status": {"S": "draft"}})
    recording.calls.clear()
    value = {"N": "1"} if attribute == "fencing_token" else {"S": "inv:77"}
    with pytest.raises(InvalidArgument) as info:
        guard.put_item(KEY, 5, {"status": {"S": "x"}, attribute: value})
    assert info.value.field == "attributes"
    with pytest.raises(InvalidArgument) as info:
        guard.update_item(KEY, 5, {attribute: value})
    assert info.value.field == "values"
    assert recording.calls == []
    assert guard.get_item(KEY) == {"id": KEY["id"], "status": {"S": "draft"}, "fencing_token": {"N": "5"}}
    with pytest.raises(StaleTokenError):
        guard.update_item(KEY, 2, {"status": {"S": "stale"}})


def test_guard_when_token_attribute_is_renamed(table: tuple[Any, str]) -> None:
    """The owned attribute is the guard's token_attribute, whatever its name."""
    client, name = table
    guard = DynamoDBGuard(client, name, token_attribute="ft")
    with pytest.raises(InvalidArgument) as info:
        guard.update_item(KEY, 5, {"ft": {"N": "9"}})
    assert info.value.field == "values"
    guard.update_item(KEY, 5, {"fencing_token": {"N": "9"}})  # an ordinary attribute here
    assert guard.get_item(KEY) == {"id": KEY["id"], "fencing_token": {"N": "9"}, "ft": {"N": "5"}}


@pytest.mark.parametrize(
    ("call", "field"),
    [
        pytest.param(lambda g: g.put_item(KEY, 5, None), "attributes", id="put-attributes-None"),
        pytest.param(lambda g: g.update_item(KEY, 5, None), "values", id="update-values-None"),
        pytest.param(lambda g: g.update_item(KEY, 5, [("status", {"S": "x"})]), "values", id="update-values-list"),
        pytest.param(lambda g: g.put_item({}, 5, {}), "key", id="put-key-empty"),
        pytest.param(lambda g: g.put_item(None, 5, {}), "key", id="put-key-None"),
        pytest.param(lambda g: g.get_item(None), "key", id="get-key-None"),
        pytest.param(lambda g: g.put_item({"fencing_token": {"N": "1"}}, 5, {}), "key", id="put-key-is-token"),
        pytest.param(lambda g: g.put_item(KEY, 0, {}), "token", id="put-token-0"),
    ],
)
def test_writes_when_arguments_are_bad(table: tuple[Any, str], call: Any, field: str) -> None:
    """Bad keys, attributes and tokens raise InvalidArgument naming the argument; nothing is written."""
    client, name = table
    guard = DynamoDBGuard(client, name)
    with pytest.raises(InvalidArgument) as info:
        call(guard)
    assert info.value.field == field
    assert guard.get_item(KEY) is None


@pytest.mark.parametrize(("args", "field"), [((None, "t"), "client"), (("CLIENT", ""), "table"),
                                             (("CLIENT", None), "table")], ids=["client-None", "table-empty",
                                                                                 "table-None"])
def test_guard_when_client_or_table_is_bad(table: tuple[Any, str], args: tuple[Any, Any], field: str) -> None:
    """DynamoDBGuard(None, ...) and an empty table name raise InvalidArgument at construction."""
    client, _ = table
    args = tuple(client if a == "CLIENT" else a for a in args)
    with pytest.raises(InvalidArgument) as info:
        DynamoDBGuard(*args)
    assert info.value.field == field
