"""Names that cannot pass for others (issue 26, item 4).

Every character of the Unicode categories Cc, Cf, Zl and Zp is refused in a
name: by the coordinator (INVALID_ARGUMENT naming the field, nothing
written), and by the Python client before any call (InvalidArgument). The
``fencepost`` commands print every name with its non-printable characters
escaped, including names made before the coordinator refused them (a key
put into etcd by hand here, as an older coordinator would have).
"""

from __future__ import annotations

import sys
import unicodedata

import grpc
import pytest
from etcd3aio import Etcd3Client

from fencepost.client import AsyncLockClient, InvalidArgument, LockClient
from fencepost.client.cli.printable import shown_name
from fencepost.client.v1 import lock_pb2
from fencepost.client.v1.keys import Keys
from fencepost.client.v1.names import FORBIDDEN_CATEGORIES, forbidden_character

from .cli_helpers import run_cli
from .conftest import assert_invalid_field, count_keys
from .owned_stub import OwnedStub

#: One character of each kind the issue names, inside a name: C1 control, zero width space, bidi override,
#: line and paragraph separators, byte order mark, soft hyphen, a tag character (outside the BMP), a C0.
BAD = {
    "U+0085 NEL (Cc, C1)": "a\x85b",
    "U+0009 TAB (Cc, C0)": "a\tb",
    "U+200B ZWSP (Cf)": "a\u200bb",
    "U+202E RLO (Cf)": "invoice\u202egpj.exe",
    "U+2066 LRI (Cf)": "a\u2066b",
    "U+FEFF BOM (Cf)": "\ufeffab",
    "U+00AD soft hyphen (Cf)": "a\xadb",
    "U+E0001 language tag (Cf)": "a\U000e0001b",
    "U+2028 (Zl)": "a\u2028b",
    "U+2029 (Zp)": "a\u2029b",
}
#: Names with characters outside those categories: accepted.
GOOD = ["caf\xe9", "e\u0301", "\u65e5\u672c/\u30ed\u30c3\u30af", "a\xa0b", "\U0001f600", "a b"]


def _code(name: str) -> str:
    index = forbidden_character(name)
    assert index is not None
    return f"U+{ord(name[index]):04X}"


def test_forbidden_character_is_exactly_the_four_categories() -> None:
    """Every code point of the Unicode database is refused iff its category is Cc, Cf, Zl or Zp."""
    refused = [cp for cp in range(sys.maxunicode + 1) if cp < 0xD800 or cp > 0xDFFF
               if forbidden_character("x" + chr(cp)) is not None]
    expected = [cp for cp in range(sys.maxunicode + 1) if cp < 0xD800 or cp > 0xDFFF
                if unicodedata.category(chr(cp)) in FORBIDDEN_CATEGORIES]
    assert refused == expected
    assert {0x85, 0x200B, 0x202E, 0x2028, 0x2029, 0xFEFF, 0x7F, 0x00} <= set(refused)
    assert forbidden_character("a" * 200 + "\u200b") == 200


@pytest.mark.parametrize("name", list(BAD.values()), ids=list(BAD))
async def test_coordinator_refuses_the_name(stub: OwnedStub, prefix: str, etcd_client: Etcd3Client,
                                            name: str) -> None:
    """Acquire, Describe, AcquirePermit, Campaign and ListLocks (prefix): INVALID_ARGUMENT naming the field
    and the character, nothing written."""
    lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
    try:
        calls = [
            ("name", stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease), timeout=5)),
            ("name", stub.Acquire(lock_pb2.AcquireRequest(name=name, lease_id=lease, wait_ms=1000), timeout=5)),
            ("name", stub.Describe(lock_pb2.DescribeRequest(name=name), timeout=5)),
            ("name", stub.AcquirePermit(lock_pb2.AcquirePermitRequest(name=name, lease_id=lease, permits=2),
                                        timeout=5)),
            ("election", stub.Campaign(lock_pb2.CampaignRequest(election=name, lease_id=lease, value=b"v"),
                                       timeout=5)),
            ("prefix", stub.ListLocks(lock_pb2.ListLocksRequest(prefix=name), timeout=5)),
        ]
        for field, call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert_invalid_field(info.value, field)
            assert _code(name) in info.value.details(), info.value.details()
        assert await count_keys(etcd_client, prefix) == 0
    finally:
        await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)


async def test_coordinator_and_client_accept_other_characters(address: str) -> None:
    """Accents, combining marks, CJK, a no-break space, an emoji and a plain space are accepted."""
    async with AsyncLockClient(address) as client:
        for name in GOOD:
            handle = await client.try_acquire(name, ttl=5.0)
            assert (await client.describe(name)).holder_token == handle.token
            await handle.release()


@pytest.mark.parametrize("name", list(BAD.values()), ids=list(BAD))
async def test_python_clients_refuse_the_name_before_any_call(name: str) -> None:
    """Every call taking a name raises InvalidArgument naming the field, with no coordinator to send it to."""
    client = AsyncLockClient("127.0.0.1:1", connect_timeout=30)  # not connected: a call would connect first
    try:
        for call, field in [(lambda: client.acquire(name, timeout=1), "name"), (lambda: client.try_acquire(name), "name"),
                            (lambda: client.describe(name), "name"), (lambda: client.list_locks(name), "prefix"),
                            (lambda: client.campaign(name, "v"), "election"), (lambda: client.leader(name), "election"),
                            (lambda: client.semaphore(name, 2).acquire(timeout=1), "name")]:
            with pytest.raises(InvalidArgument) as info:
                await call()
            assert info.value.field == field, info.value
            assert _code(name) in str(info.value)
    finally:
        await client.close()
    sync = LockClient("127.0.0.1:1", connect_timeout=30)
    try:
        with pytest.raises(InvalidArgument):
            sync.acquire(name, timeout=1)
    finally:
        sync.close()


def test_shown_name_escapes_what_does_not_print() -> None:
    """Non-printable characters as in a Python literal, a backslash doubled, printable names unchanged."""
    assert shown_name("a\u200bb") == "a\\u200bb"
    assert shown_name("a\x85b") == "a\\x85b"
    assert shown_name("a\xa0b") == "a\\xa0b"
    assert shown_name("a\U000e0001") == "a\\U000e0001"
    assert shown_name("a\\u200bb") == "a\\\\u200bb"  # the eight-character name does not pass for the other
    assert shown_name("ab") == "ab" and shown_name("caf\xe9 \u65e5") == "caf\xe9 \u65e5"


async def test_cli_prints_names_escaped(address: str, prefix: str, stub: OwnedStub,
                                        etcd_client: Etcd3Client) -> None:
    """`fencepost locks` and `status` print a name with a no-break space, and one with U+200B made before the
    coordinator refused it (its key put into etcd directly), escaped: ab, a\\xa0b and a\\u200bb are told apart."""
    async with AsyncLockClient(address) as client:
        plain = await client.try_acquire("ab", ttl=30.0)
        spaced = await client.try_acquire("a\xa0b", ttl=30.0)
        lease = (await stub.LeaseGrant(lock_pb2.LeaseGrantRequest(ttl_seconds=30), timeout=5)).lease_id
        await etcd_client.kv.put(Keys(prefix).contender("a\u200bb", lease), b"", lease=lease, timeout=5)
        try:
            listed = await run_cli("locks", "--address", address)
            assert listed.rc == 0, listed.err
            names = [line.split()[0] for line in listed.out.splitlines()[1:4]]
            assert sorted(names) == sorted(["ab", "a\\xa0b", "a\\u200bb"]), listed.out
            assert "\u200b" not in listed.out and "\xa0" not in listed.out
            status = await run_cli("status", "a\xa0b", "--address", address)
            assert status.rc == 0 and status.out.startswith("a\\xa0b: held"), status
            refused = await run_cli("status", "a\u200bb", "--address", address)
            assert refused.rc == 2 and "U+200B" in refused.err, refused
        finally:
            await stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease), timeout=5)
            await plain.release()
            await spaced.release()
