"""Bad input, systematically (issue 9, item 6): random sequences of valid and invalid RPCs against one coordinator.

A hypothesis ``RuleBasedStateMachine`` drives one real coordinator (in a
thread of its own, with its own event loop, on the session's real etcd)
through the raw sync stubs of three callers (one channel, so one connection,
each), every call with a deadline. Rules send LeaseGrant (TTL 0, negative,
huge), LeaseRevoke (own, another caller's, unknown, 0, negative, 2**63-1
lease ids), Acquire (ASCII, Unicode, empty, 300-byte and 60 KiB names, names
with "/", "%", NUL, bytes that are not UTF-8; wait_ms 0, small, negative,
huge, wait_forever; own, foreign and unknown leases), Release (right, wrong,
stale, huge, negative tokens), Withdraw, Describe, ListLocks (page sizes
negative and huge, bad page tokens), ServerInfo, KeepAlive streams (open,
keepalives and watches for own, foreign and unknown leases, unwatch,
half-close, cancel mid-stream, two streams per caller interleaved, bytes
that are no protobuf), raw bytes that are no protobuf to Acquire, and one
request type sent to another method.

After each step:

- the call returned or failed within its deadline plus :data:`SLACK_SECONDS`;
- a failure has a status code allowed for that rule (never UNKNOWN or
  INTERNAL), and a refusal by the coordinator carries one
  ``google.rpc.ErrorInfo`` of domain ``fencepost.dev`` with a known
  ErrorReason (only gRPC's own refusals, such as a message over the size
  limit, and the caller's own deadline come without);
- a success agrees with the model kept from earlier successes (a Release or
  Withdraw succeeds only for the holder; a grant only of a free lock, or
  again to its holder with the same token);
- the coordinator still serves, and for each lock name the step touched,
  Describe agrees with the model: at most one holder, the one the model
  has, no waiter left behind, and every new grant of a name has a token
  larger than every earlier token of that name (over all sequences);
- nothing was logged at ERROR and no record carries a traceback
  (grpc.aio's "Unexpected error", asyncio's "Exception in callback").

Leases granted with a TTL under :data:`VOLATILE_TTL` may expire during a
sequence: the model lets their holds vanish (and only theirs).

Settings: by default 50 sequences of up to 40 steps, derandomized with seed
:data:`DEFAULT_SEED` and no example database, so that a failure in CI is the
same failure on a laptop (30 to 45 s on 2 cores). A soak:
``FENCEPOST_PROPERTY_EXAMPLES=2000 python -m pytest -q tests/test_property.py``
(``FENCEPOST_PROPERTY_STEPS`` sets the steps per sequence,
``FENCEPOST_PROPERTY_SEED`` another seed, or ``random`` for a fresh one,
which is printed). The test prints how many sequences and steps it ran.

Lease ownership: every call made with a lease gets its metadata from
:func:`lease_metadata`; PERMISSION_DENIED is an allowed answer to a call on
another caller's lease, and so is a success (which the model records).

The parts: tests/property_calls.py (the coordinator in its thread, the
callers, checked calls, KeepAlive streams), tests/property_model.py (the
model, the strategies, the lease rules, the check after each step),
tests/property_locks.py (the lock rules), tests/property_streams.py (the
KeepAlive stream rules); :class:`FencepostMachine` is all of them.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis.stateful import run_state_machine_as_test

from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .property_calls import OUTCOMES, ThreadedCoordinator
from .property_model import Totals
from .property_streams import StreamRules

DEFAULT_SEED = 20_250_609
EXAMPLES = int(os.environ.get("FENCEPOST_PROPERTY_EXAMPLES", "50"))
STEPS = int(os.environ.get("FENCEPOST_PROPERTY_STEPS", "40"))
_SEED_ENV = os.environ.get("FENCEPOST_PROPERTY_SEED", "")
SHRINK = os.environ.get("FENCEPOST_PROPERTY_SHRINK", "") not in ("", "0")
SEED = random.randrange(2**32) if _SEED_ENV == "random" else int(_SEED_ENV or DEFAULT_SEED)


class FencepostMachine(StreamRules):
    """Random calls of three callers on one coordinator; the model is what successful calls said."""


class _Records(logging.Handler):
    """Keeps every record logged (by the coordinator, grpc, asyncio) while the test runs."""

    def __init__(self, into: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.into = into

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        self.into.append(record)


@pytest.fixture
def threaded_coordinator(etcd: EmbeddedEtcd, prefix: str) -> Iterator[str]:
    """A coordinator served by its own event loop thread; yields its address."""
    tc = ThreadedCoordinator(etcd.endpoint, prefix)
    try:
        yield tc.start()
    finally:
        tc.stop()


def test_random_call_sequences_keep_the_lock_invariants(threaded_coordinator: str) -> None:
    """Random sequences of valid and invalid calls: typed refusals in time, one holder per name, tokens rising."""
    records: list[logging.LogRecord] = []
    handler = _Records(records)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    FencepostMachine.address = threaded_coordinator
    FencepostMachine.max_token = {}
    FencepostMachine.totals = totals = Totals()
    FencepostMachine.log_records = records
    machine = seed(SEED)(FencepostMachine)
    started = time.monotonic()
    try:
        run_state_machine_as_test(machine, settings=settings(
            max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much], derandomize=False,
            print_blob=True, report_multiple_bugs=False,
            # Shrinking replays sequences against a live server, whose timing varies: slow, and may not replay.
            phases=list(Phase) if SHRINK else [p for p in Phase if p != Phase.shrink]))
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        print(f"\nproperty test: seed {SEED}, {totals.sequences} sequences, {totals.steps} steps, "
              f"{time.monotonic() - started:.1f} s")
        if os.environ.get("FENCEPOST_PROPERTY_VERBOSE"):
            for (what, code, reason), n in sorted(OUTCOMES.items(), key=str):
                print(f"  {what:24} {code:20} {reason or '':16} {n}")
    assert totals.sequences >= min(EXAMPLES, 10) and totals.steps > totals.sequences
