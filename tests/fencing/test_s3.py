"""S3 guard specifics, on moto's S3 server: the 412 retry, its bound, owned metadata, argument checks."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fencepost.client import FencepostError, InvalidArgument, ResourceExhausted, StaleTokenError
from fencepost.client.fencing import S3Guard

from .servers import S3Server


@pytest.fixture
def bucket(s3_server: S3Server) -> Iterator[tuple[Any, str]]:
    """A fresh bucket, and the client that made it."""
    client = s3_server.client()
    name = f"guarded-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    try:
        yield client, name
    finally:
        client.close()


class Between:
    """Wraps a real boto3 S3 client: runs ``between()`` after each HEAD, and records the calls (a seam, not a mock)."""

    def __init__(self, client: Any, between: Callable[[int], None] | None = None) -> None:
        self._client = client
        self.exceptions = client.exceptions
        self.between = between
        self.calls: list[str] = []

    def head_object(self, **kwargs: Any) -> Any:
        self.calls.append("head_object")
        try:
            return self._client.head_object(**kwargs)
        finally:
            if self.between is not None:
                self.between(self.calls.count("head_object"))

    def put_object(self, **kwargs: Any) -> Any:
        self.calls.append("put_object")
        return self._client.put_object(**kwargs)

    def get_object(self, **kwargs: Any) -> Any:
        return self._client.get_object(**kwargs)


def test_put_when_another_write_lands_between_head_and_put(bucket: tuple[Any, str]) -> None:
    """A 412 makes the guard read again: it writes when the stored token is still <= its own."""
    client, name = bucket
    other = S3Guard(client, name)
    other.put("k", 3, b"first")

    def write_token_4(head: int) -> None:
        if head == 1:
            other.put("k", 4, b"second")

    guard = S3Guard(Between(client, write_token_4), name)
    guard.put("k", 5, b"mine")
    assert guard.client.calls == ["head_object", "put_object", "head_object", "put_object"]
    assert guard.get("k") == (b"mine", 5)


def test_put_when_a_higher_token_lands_between_head_and_put(bucket: tuple[Any, str]) -> None:
    """After a 412 the fresh read shows a higher token: StaleTokenError, and the newer object stays."""
    client, name = bucket
    other = S3Guard(client, name)
    seen: list[StaleTokenError] = []

    def write_token_9(head: int) -> None:
        if head == 1:
            other.put("k", 9, b"newer")

    guard = S3Guard(Between(client, write_token_9), name, on_reject=seen.append)
    with pytest.raises(StaleTokenError) as info:
        guard.put("k", 5, b"stale")  # no object at the first HEAD: IfNoneMatch="*" gets the 412
    assert (info.value.record, info.value.token, info.value.current_token) == ("k", 5, 9)
    assert seen == [info.value] and guard.rejected == 1
    assert guard.get("k") == (b"newer", 9)


def test_put_when_the_object_is_deleted_between_head_and_put(bucket: tuple[Any, str]) -> None:
    """An If-Match PUT on an object deleted since the HEAD (404) reads again and creates it with IfNoneMatch."""
    client, name = bucket
    S3Guard(client, name).put("k", 3, b"first")

    def delete(head: int) -> None:
        if head == 1:
            client.delete_object(Bucket=name, Key="k")

    guard = S3Guard(Between(client, delete), name)
    guard.put("k", 5, b"after the delete")
    assert guard.client.calls == ["head_object", "put_object", "head_object", "put_object"]
    assert guard.get("k") == (b"after the delete", 5)


def test_put_when_it_keeps_losing(bucket: tuple[Any, str]) -> None:
    """Every round loses to another write with a token <= its own: ResourceExhausted after max_attempts PUTs."""
    client, name = bucket
    other = S3Guard(client, name)
    other.put("k", 1, b"v0")

    def write_again(head: int) -> None:
        other.put("k", 2, f"other-{head}".encode())

    guard = S3Guard(Between(client, write_again), name, max_attempts=3)
    with pytest.raises(ResourceExhausted, match="3 conditional writes"):
        guard.put("k", 7, b"mine")
    assert guard.client.calls.count("put_object") == 3
    assert guard.rejected == 0
    assert guard.get("k") == (b"other-3", 2)


def test_put_when_body_returns_to_the_bytes_read(bucket: tuple[Any, str]) -> None:
    """The documented limit: ETags hash content, so A -> B -> A between HEAD and PUT lets a stale write land."""
    client, name = bucket
    other = S3Guard(client, name)
    other.put("k", 3, b"same")

    def aba(head: int) -> None:
        if head == 1:
            other.put("k", 8, b"different")
            other.put("k", 9, b"same")  # the ETag the stale writer read is back

    guard = S3Guard(Between(client, aba), name)
    guard.put("k", 5, b"stale")
    assert guard.get("k") == (b"stale", 5)  # not refused: make bodies unique when they can recur


def test_put_keeps_metadata_and_content_type(bucket: tuple[Any, str]) -> None:
    """User metadata and Content-Type go with the write; the token metadata is the guard's."""
    client, name = bucket
    guard = S3Guard(client, name)
    etag = guard.put("doc.json", 4, '{"a": 1}', metadata={"owner": "billing"}, content_type="application/json")
    head = client.head_object(Bucket=name, Key="doc.json")
    assert head["ETag"] == etag
    assert head["ContentType"] == "application/json"
    assert head["Metadata"] == {"owner": "billing", "fencing-token": "4"}


def test_put_when_object_was_written_outside_the_guard(bucket: tuple[Any, str]) -> None:
    """An object without the token metadata takes any token; one with a non-number there is an error."""
    client, name = bucket
    client.put_object(Bucket=name, Key="plain", Body=b"legacy")
    guard = S3Guard(client, name)
    assert guard.get("plain") == (b"legacy", None)
    guard.put("plain", 2, b"guarded")
    assert guard.get("plain") == (b"guarded", 2)
    client.put_object(Bucket=name, Key="odd", Body=b"x", Metadata={"fencing-token": "seven"})
    with pytest.raises(FencepostError, match="not a fencing token"):
        guard.put("odd", 2, b"y")


@pytest.mark.parametrize(
    ("call", "field"),
    [
        pytest.param(lambda g: g.put("k", 0, b"x"), "token", id="token-0"),
        pytest.param(lambda g: g.put("", 5, b"x"), "key", id="key-empty"),
        pytest.param(lambda g: g.put(None, 5, b"x"), "key", id="key-None"),
        pytest.param(lambda g: g.put("k", 5, None), "body", id="body-None"),
        pytest.param(lambda g: g.put("k", 5, b"x", metadata={"Fencing-Token": "9"}), "metadata", id="metadata-token"),
        pytest.param(lambda g: g.put("k", 5, b"x", metadata={"n": 1}), "metadata", id="metadata-not-str"),
        pytest.param(lambda g: g.get(None), "key", id="get-key-None"),
    ],
)
def test_put_when_arguments_are_bad(bucket: tuple[Any, str], call: Callable[[S3Guard], None], field: str) -> None:
    """Bad tokens, keys, bodies and metadata raise InvalidArgument naming the argument; nothing is sent."""
    client, name = bucket
    recording = Between(client)
    with pytest.raises(InvalidArgument) as info:
        call(S3Guard(recording, name))
    assert info.value.field == field
    assert recording.calls == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"client": None}, "client"), ({"bucket": ""}, "bucket"), ({"token_metadata": "Fencing Token"},
                                                               "token_metadata"),
     ({"max_attempts": 0}, "max_attempts")],
    ids=["client-None", "bucket-empty", "token-metadata-bad", "max-attempts-0"],
)
def test_guard_when_constructed_badly(bucket: tuple[Any, str], kwargs: dict[str, Any], field: str) -> None:
    """S3Guard checks its client, bucket, metadata name and attempts at construction."""
    client, name = bucket
    args = {"client": client, "bucket": name, **kwargs}
    with pytest.raises(InvalidArgument) as info:
        S3Guard(args.pop("client"), args.pop("bucket"), **args)
    assert info.value.field == field
