"""The property test's model (tests/test_property.py): what successful calls said about leases and holders,
checked against each new answer and, after every step, against the coordinator's own Describe; the strategies
the rules draw from; and the lease rules. The lock rules are in tests/property_locks.py, the KeepAlive stream
rules in tests/property_streams.py."""

from __future__ import annotations

import logging
import unicodedata
from dataclasses import dataclass

import grpc
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fencepost.client.v1 import lock_pb2, lock_pb2_grpc

from .property_calls import (
    DEADLINE,
    VOLATILE_TTL,
    C,
    Caller,
    Lease,
    Outcome,
    checked_call,
    lease_metadata,
)

CALLERS = 3
MAX_STREAMS_PER_CALLER = 2


# ---------------------------------------------------------------- strategies

#: A few names that collide often (so that holders, waiters and tokens meet), some odd but valid.
POOL_NAMES = ["a", "jobs/1", "a/b", "%2F", "100%", "ключ", "名前", "emoji-\U0001f512", " spaced ", "..",
              "x" * 256]
BAD_NAMES = ["", "x" * 257, "n" * (60 * 1024), "a\x00b", "new\nline", "\x7f", "tab\t", "nel\x85", "zw\u200bsp",
             "rlo\u202e", "ls\u2028", "ps\u2029"]
valid_names = st.sampled_from(POOL_NAMES) | st.text(min_size=1, max_size=40).filter(
    lambda s: all(unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp") for ch in s) and len(s.encode()) <= 256)
any_names = st.one_of(st.sampled_from(POOL_NAMES), st.sampled_from(POOL_NAMES), valid_names,
                      st.sampled_from(BAD_NAMES), st.text(max_size=20))
#: Bytes that are not UTF-8, for a name sent with the request's bytes twin.
binary_names = st.sampled_from([b"\xff", b"inv:\xff", b"\xc3", b"a\xed\xa0\x80"]) | st.binary(min_size=1, max_size=20)
INT64 = st.integers(-(2**63), 2**63 - 1)
ttls = st.one_of(st.sampled_from([0, -1, -(2**63), 86_401, 2**63 - 1, 2**40]), st.sampled_from([1, 2, 5]),
                 st.sampled_from([300, 86_400]), st.integers(VOLATILE_TTL, 86_400), INT64)
ODD_LEASES = [0, -1, -(2**63), 2**63 - 1, 0x7EADBEEF12345]
#: (wait_ms, wait_forever); wait_ms from 0 (try once) to invalid values; most calls try once.
waits = st.one_of(
    st.just((0, False)), st.just((0, False)), st.just((0, False)),
    st.tuples(st.sampled_from([1, 50, 300, 5_000, 86_400_000]), st.just(False)),
    st.tuples(st.sampled_from([-1, -(2**63), 86_400_001, 2**63 - 1, 2**40]), st.booleans()),
    st.tuples(st.sampled_from([0, 1]), st.just(True)),
)


def valid_name(name: str) -> bool:
    """The wire contract (lock.proto, AcquireRequest.name): 1 to 256 bytes of UTF-8, no character of the
    Unicode categories Cc, Cf, Zl or Zp."""
    return 0 < len(name.encode("utf-8", "surrogatepass")) <= 256 and all(
        unicodedata.category(ch) not in ("Cc", "Cf", "Zl", "Zp") for ch in name)


# ---------------------------------------------------------------- the machine


@dataclass
class Totals:
    """Sequences and steps run, over all examples (reported at the end)."""

    sequences: int = 0
    steps: int = 0


class LockModel(RuleBasedStateMachine):
    """Three callers on one coordinator, the model of what successful calls said, and the lease rules."""

    address = ""
    #: Highest token ever granted per name, over all sequences (tokens only grow).
    max_token: dict[str, int] = {}
    totals = Totals()
    log_records: list[logging.LogRecord] = []

    def __init__(self) -> None:
        super().__init__()
        self.totals.sequences += 1
        options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per caller (the limits' "caller")
        self.callers = []
        for i in range(CALLERS):
            channel = grpc.insecure_channel(self.address, options=options)
            self.callers.append(Caller(i, channel, lock_pb2_grpc.LockServiceStub(channel)))
        self.leases: dict[int, Lease] = {}
        self.holders: dict[str, tuple[int, int]] = {}  # name -> (lease_id, token)
        self.ended: list[tuple[str, int, int]] = []  # holds that ended through a call of ours
        self.dirty: set[str] = set()
        self.tokens_seen: list[int] = []
        self.request_id = 0
        self.log_seen = len(self.log_records)

    # ------------------------------------------------------------ helpers

    def _lease_for(self, caller: Caller, data: st.DataObject) -> int:
        """A lease id for a call of ``caller``: its own, another caller's, a dead one, or an odd one."""
        own = [lid for lid, lease in self.leases.items() if lease.owner == caller.index]
        foreign = [lid for lid, lease in self.leases.items() if lease.owner != caller.index]
        choices = [st.sampled_from(ODD_LEASES)]
        if own:
            choices += [st.sampled_from(own)] * 4
        if foreign:
            choices.append(st.sampled_from(foreign))
        return data.draw(st.one_of(choices), label="lease_id")

    def _owner(self, lease_id: int) -> int | None:
        lease = self.leases.get(lease_id)
        return lease.owner if lease else None

    def _foreign(self, caller: Caller, lease_id: int) -> bool:
        """Not a lease of ``caller``'s own: another caller's, or one the model does not know (no owner)."""
        return self._owner(lease_id) != caller.index

    def _alive(self, lease_id: int) -> bool | None:
        """True alive, False gone, None: may have expired (volatile)."""
        lease = self.leases.get(lease_id)
        if lease is None or not lease.alive:
            return False
        return None if lease.volatile else True

    def _lease_gone(self, lease_id: int) -> None:
        lease = self.leases.get(lease_id)
        if lease is not None:
            lease.alive = False
        for name, (holder, token) in list(self.holders.items()):
            if holder == lease_id:
                self._hold_ended(name)

    def _hold_ended(self, name: str) -> None:
        holder, token = self.holders.pop(name)
        self.ended.append((name, holder, token))
        self.dirty.add(name)

    def _granted(self, name: str, lease_id: int, token: int) -> None:
        """A grant of ``name`` to ``lease_id`` with ``token``: check it against the model, then record it."""
        current = self.holders.get(name)
        if current is not None and current[0] == lease_id:
            assert token == current[1], f"{name!r}: the holder lease got a new token {token} (had {current[1]})"
            return
        if current is not None:
            assert self._alive(current[0]) is None, f"{name!r} granted to {lease_id:#x} while {current} holds it"
            self._lease_gone(current[0])  # it can only have expired
        assert token > self.max_token.get(name, 0), (
            f"{name!r}: token {token} not above the earlier {self.max_token.get(name)}")
        self.max_token[name] = token
        self.holders[name] = (lease_id, token)
        self.tokens_seen.append(token)
        self.dirty.add(name)

    def _may_have_expired(self, lease_id: int, out: Outcome, what: str) -> None:
        """A LEASE_EXPIRED answer: only for a lease that is gone, or volatile (which is then gone)."""
        alive = self._alive(lease_id)
        assert alive is not True, f"{what}: LEASE_EXPIRED for live lease {lease_id:#x}: {out}"
        self._lease_gone(lease_id)

    # ------------------------------------------------------------ leases

    @initialize()
    def one_lease_each(self) -> None:
        """Each caller starts with a lease (TTL 300 s), so that most sequences reach grants and releases."""
        for caller in self.callers:
            out = checked_call("LeaseGrant", caller.stub.LeaseGrant, lock_pb2.LeaseGrantRequest(ttl_seconds=300),
                               allowed=set())
            caller.granted[out.response.lease_id] = out.response
            self.leases[out.response.lease_id] = Lease(out.response.lease_id, caller.index, out.response.ttl_seconds)

    @rule(data=st.data(), ttl=ttls)
    def lease_grant(self, data: st.DataObject, ttl: int) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        out = checked_call("LeaseGrant", caller.stub.LeaseGrant, lock_pb2.LeaseGrantRequest(ttl_seconds=ttl),
                           allowed={C.INVALID_ARGUMENT})
        valid = 1 <= ttl <= 86_400
        if not out.ok:
            if out.code == C.INVALID_ARGUMENT:
                assert not valid and out.field == "ttl_seconds", out
            return
        assert valid, f"LeaseGrant granted TTL {ttl}"
        lease_id, granted = out.response.lease_id, out.response.ttl_seconds
        assert lease_id > 0 and granted >= ttl and lease_id not in self.leases, out.response
        caller.granted[lease_id] = out.response
        self.leases[lease_id] = Lease(lease_id, caller.index, granted)

    @rule(data=st.data())
    def lease_revoke(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        lease_id = self._lease_for(caller, data)
        out = checked_call("LeaseRevoke", caller.stub.LeaseRevoke, lock_pb2.LeaseRevokeRequest(lease_id=lease_id),
                           metadata=lease_metadata(caller, lease_id),
                           allowed={C.INVALID_ARGUMENT, C.PERMISSION_DENIED})
        if out.code == C.INVALID_ARGUMENT:
            assert lease_id <= 0 and out.field == "lease_id", out
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        elif out.ok:
            alive = self._alive(lease_id)
            assert lease_id > 0
            if alive is not None:
                assert out.response.found == alive, (lease_id, out.response)
            self._lease_gone(lease_id)

    # ------------------------------------------------------------ after each step

    @invariant()
    def coordinator_agrees(self) -> None:
        """The coordinator serves, agrees with the model on every name the step touched, and logged no error."""
        self.totals.steps += 1
        stub = self.callers[0].stub
        names = sorted(self.dirty) or ["a"]
        self.dirty.clear()
        for name in names:
            out = checked_call("Describe (check)", stub.Describe, lock_pb2.DescribeRequest(name=name), allowed=set())
            d = out.response
            current = self.holders.get(name)
            assert d.waiter_count == 0, f"{name!r}: waiters left behind: {d}"
            if current is not None and not d.held:
                assert self._alive(current[0]) is None, f"{name!r}: the model's holder {current} is gone: {d}"
                self._lease_gone(current[0])
                current = None
            if d.held:
                assert current == (d.holder.lease_id, d.holder.token), (
                    f"{name!r}: held by {d.holder.lease_id:#x}/{d.holder.token}; the model has {current}")
                assert d.holder.token <= self.max_token[name]
            else:
                assert current is None, (name, current, d)
        loud = [r for r in self.log_records[self.log_seen:] if r.levelno >= logging.ERROR or r.exc_info]
        self.log_seen = len(self.log_records)
        assert not loud, [(r.name, r.getMessage(), r.exc_text) for r in loud]

    def teardown(self) -> None:
        try:
            for caller in self.callers:
                for stream in caller.streams:
                    stream.close()
            for lease in self.leases.values():
                if lease.alive:
                    owner = self.callers[lease.owner]
                    owner.stub.LeaseRevoke(lock_pb2.LeaseRevokeRequest(lease_id=lease.lease_id), timeout=DEADLINE,
                                           metadata=lease_metadata(owner, lease.lease_id))
        finally:
            for caller in self.callers:
                caller.channel.close()
