"""A definite refusal ends an acquire at once, with no withdrawal and no warning (issue 26, item 3).

An acquire the access policy refuses (ACCESS_DENIED), or one naming a lease
that is not the caller's (NOT_LEASE_OWNER), was refused before the
coordinator did anything: there is nothing to withdraw, and a Withdraw would
be refused for the same reason. Before, the client sent one anyway and
logged "could not withdraw ... (what the acquire left ends with the
lease)" at WARNING, and ``fencepost acquire`` took about a second longer.
Against a real coordinator with mTLS and the access policy of test_admin.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from fencepost.client import AccessDenied, AsyncLockClient
from fencepost.coordinator.process.coordinator import Coordinator

from .cli_helpers import assert_one_line_error, run_cli
from .test_admin import Pki, pki, policed  # noqa: F401  (fixtures: a coordinator with mTLS and an access policy)


def _withdrawals(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What the client and the coordinator logged about a withdrawal (a client's warning, a Withdraw served)."""
    return [r.getMessage() for r in caplog.records
            if "withdraw" in r.getMessage().lower() or getattr(r, "event_fields", {}).get("call") == "Withdraw"]


@pytest.mark.parametrize("how", ["acquire", "try_acquire", "semaphore", "campaign"])
async def test_acquire_when_the_policy_refuses_it(policed: Coordinator, pki: Pki, caplog: pytest.LogCaptureFixture,
                                                  how: str) -> None:
    """AccessDenied, and neither a client warning nor a Withdraw (ReleasePermit, Resign) reaches the log."""
    caplog.set_level(logging.DEBUG)
    async with AsyncLockClient(policed.address, tls=pki.tls(pki.worker)) as client:
        calls: dict[str, Any] = {
            "acquire": lambda: client.acquire("billing/x", ttl=10.0, timeout=5.0),
            "try_acquire": lambda: client.try_acquire("billing/x", ttl=10.0),
            "semaphore": lambda: client.semaphore("billing/s", 2).acquire(timeout=5.0),
            "campaign": lambda: client.campaign("billing/e", "v", ttl=10.0, timeout=5.0),
        }
        with pytest.raises(AccessDenied) as info:
            await calls[how]()
        assert info.value.action == "acquire"
        handle = await client.try_acquire("jobs/after", ttl=10.0)  # the client works on
        await handle.release()
    assert not _withdrawals(caplog), _withdrawals(caplog)
    assert not [r for r in caplog.records if r.name.startswith("fencepost.client") and r.levelno >= logging.WARNING]


async def test_cli_acquire_when_the_policy_refuses_it(policed: Coordinator, pki: Pki) -> None:
    """`fencepost acquire` refused by the policy: exit 1 with one line naming ACCESS_DENIED, no warning."""
    result = await run_cli("acquire", "billing/x", "--timeout", "5", "--address", policed.address,
                           *pki.flags(pki.worker))
    assert result.rc == 1, result
    assert_one_line_error(result, "ACCESS_DENIED")
    assert "withdraw" not in result.err
