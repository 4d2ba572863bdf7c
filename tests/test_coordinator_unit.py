"""Unit tests of the coordinator's pure logic: names, keys, wait fields, error statuses.

The etcd layer, release classification and the deletion watcher have theirs
in test_etcd_layer.py (with a fake etcd).
"""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from fencepost.client.errors import InvalidArgument, NotHolder
from fencepost.client.v1.keys import Keys, prefix_end
from fencepost.coordinator.api.status import to_status
from fencepost.coordinator.etcd import etcd_unavailable
from fencepost.coordinator.recipes.validate import validate_name, validate_ttl, wait_seconds


def test_keys_when_one_name_is_a_prefix_of_another() -> None:
    """The key range of lock "a" contains no key of lock "a/b" or "a%2Fb"."""
    keys = Keys("/p/")
    lock_a = keys.lock_prefix("a")
    end_a = prefix_end(lock_a)
    for other in ("a/b", "a%2Fb", "ab", "a/"):
        key = keys.contender(other, 7)
        assert not (lock_a <= key < end_a), other


def test_parse_when_name_has_slashes_and_percent() -> None:
    """A contender key parses back to its exact name and lease id."""
    keys = Keys("/p")
    for name in ("a/b/c", "100%", "../x", "ünïcode", "a b"):
        assert keys.parse(keys.contender(name, 0xABC)) == (name, 0xABC)


@pytest.mark.parametrize("name", ["", "x" * 257, "a\x00b", "line\nbreak", "é" * 129])
def test_validate_name_when_invalid(name: str) -> None:
    """Empty, oversized (in UTF-8 bytes) or control-character names name the field."""
    with pytest.raises(InvalidArgument) as info:
        validate_name(name)
    assert info.value.field == "name"


@pytest.mark.parametrize("ttl", [0, -1, 86_401, 2**40])
def test_validate_ttl_when_out_of_range(ttl: int) -> None:
    """TTLs outside 1..86400 seconds are rejected naming ttl_seconds."""
    with pytest.raises(InvalidArgument) as info:
        validate_ttl(ttl)
    assert info.value.field == "ttl_seconds"


def test_wait_seconds_when_valid_and_invalid() -> None:
    """wait_ms maps to seconds, 0 to try once, wait_forever to None; negatives are rejected."""
    assert wait_seconds(0, False) == 0.0
    assert wait_seconds(1500, False) == 1.5
    assert wait_seconds(0, True) is None
    for bad in ((-1, False), (5, True), (86_400_001, False)):
        with pytest.raises(InvalidArgument):
            wait_seconds(*bad)


def test_to_status_when_error_has_name_and_lease() -> None:
    """A status carries one ErrorInfo with the reason, domain and metadata."""
    status = to_status(NotHolder("no", name="inv:42", lease_id=99))
    assert status.code == grpc.StatusCode.FAILED_PRECONDITION
    (key, blob), = status.trailing_metadata
    assert key == "grpc-status-details-bin"
    detail = status_pb2.Status.FromString(blob).details[0]
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info)
    assert (info.reason, info.domain) == ("NOT_HOLDER", "fencepost.dev")
    assert dict(info.metadata) == {"name": "inv:42", "lease_id": "99"}


def test_to_status_when_unavailable_carries_retry_info() -> None:
    """UNAVAILABLE statuses carry a RetryInfo besides the ErrorInfo."""
    status = to_status(etcd_unavailable("down"))
    details = status_pb2.Status.FromString(status.trailing_metadata[0][1]).details
    retry = error_details_pb2.RetryInfo()
    assert status.code == grpc.StatusCode.UNAVAILABLE
    assert any(d.Unpack(retry) for d in details)
    assert retry.retry_delay.seconds == 1

