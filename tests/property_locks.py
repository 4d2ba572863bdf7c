"""The property test's lock rules (tests/test_property.py): Acquire (blocking or not, names valid or not, in
UTF-8 or not), Release, Withdraw, Describe, ListLocks, ServerInfo, bytes that are no protobuf and requests sent
to the wrong method, each answer checked against the model (tests/property_model.py)."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from fencepost.client.v1 import lock_pb2
from fencepost.coordinator.api.decode import bytes_twin

from .property_calls import DEADLINE, LOCKS, WAIT_DEADLINE, C, Caller, Outcome, checked_call, lease_metadata
from .property_model import INT64, POOL_NAMES, LockModel, any_names, binary_names, valid_name, waits


class LockRules(LockModel):
    """The lock rules, on the model's callers and leases."""


    # ------------------------------------------------------------ locks

    @rule(data=st.data(), name=any_names, wait=waits)
    def acquire(self, data: st.DataObject, name: str, wait: tuple[int, bool]) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        lease_id = self._lease_for(caller, data)
        wait_ms, forever = wait
        blocking = wait_ms != 0 or forever
        request = lock_pb2.AcquireRequest(name=name, lease_id=lease_id, wait_ms=wait_ms, wait_forever=forever)
        out = checked_call("Acquire", caller.stub.Acquire, request, timeout=WAIT_DEADLINE if blocking else DEADLINE,
                           metadata=lease_metadata(caller, lease_id),
                           allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED,
                                    C.DEADLINE_EXCEEDED})
        self._acquired(caller, name, lease_id, wait, out)

    @rule(data=st.data(), name=st.sampled_from(POOL_NAMES[:4]),
          wait=st.sampled_from([(0, False)] * 6 + [(50, False), (300, False), (0, True)]))
    def acquire_pool(self, data: st.DataObject, name: str, wait: tuple[int, bool]) -> None:
        """Acquire one of a few names with a live lease (most often its own): where holders meet."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        live = [lid for lid, lease in self.leases.items() if lease.alive]
        own = [lid for lid in live if self.leases[lid].owner == caller.index]
        if not live:
            return
        lease_id = data.draw(st.sampled_from(own * 3 + live if own else live), label="lease_id")
        wait_ms, forever = wait
        blocking = wait_ms != 0 or forever
        request = lock_pb2.AcquireRequest(name=name, lease_id=lease_id, wait_ms=wait_ms, wait_forever=forever)
        out = checked_call("Acquire", caller.stub.Acquire, request, timeout=WAIT_DEADLINE if blocking else DEADLINE,
                           metadata=lease_metadata(caller, lease_id),
                           allowed={C.FAILED_PRECONDITION, C.PERMISSION_DENIED, C.DEADLINE_EXCEEDED})
        self._acquired(caller, name, lease_id, wait, out)

    def _acquired(self, caller: Caller, name: str, lease_id: int, wait: tuple[int, bool], out: Outcome) -> None:
        wait_ms, forever = wait
        valid_wait = 0 <= wait_ms <= 86_400_000 and not (forever and wait_ms)
        if valid_name(name):
            self.dirty.add(name)
        if out.code == C.INVALID_ARGUMENT:
            assert out.field in ("name", "lease_id", "wait_ms"), out
            assert {"name": not valid_name(name), "lease_id": lease_id <= 0, "wait_ms": not valid_wait}[out.field], out
            return
        if out.code == C.RESOURCE_EXHAUSTED:
            return  # a limit of the coordinator's, or gRPC's own on the message size
        assert valid_name(name) and lease_id > 0 and valid_wait, (name[:40], lease_id, wait, out)
        if out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id) and out.reason in ("NOT_LEASE_OWNER", "ACCESS_DENIED"), out
        elif out.code == C.FAILED_PRECONDITION:
            assert out.reason == "LEASE_EXPIRED", out
            self._may_have_expired(lease_id, out, "Acquire")
        elif out.code == C.DEADLINE_EXCEEDED:
            assert wait != (0, False), f"a try-once Acquire timed out: {out}"
            if out.reason is None:
                # The caller's own deadline: the outcome is unknown; the lease's owner gives up with Withdraw.
                owner = self.callers[self._owner(lease_id) or 0]
                w = checked_call("Withdraw", owner.stub.Withdraw,
                                 lock_pb2.WithdrawRequest(name=name, lease_id=lease_id),
                                 metadata=lease_metadata(owner, lease_id), allowed=set())
                current = self.holders.get(name)
                if w.response.held:
                    assert current is None or current[0] == lease_id or self._alive(current[0]) is None, (
                        f"{name!r}: Withdraw of a timed-out Acquire found lease {lease_id:#x} holding, "
                        f"the model has {current}")
                    if current is not None:
                        self._hold_ended(name)  # ours (granted just before the deadline) or expired
                elif current is not None and current[0] == lease_id:
                    assert self._alive(lease_id) is None, (name, lease_id, w.response)
                    self._lease_gone(lease_id)
            else:
                assert out.reason == "ACQUIRE_TIMEOUT", out
                current = self.holders.get(name)
                assert current is not None and current[0] != lease_id, (
                    f"{name!r}: ACQUIRE_TIMEOUT, but the model's holder is {current}")
        elif out.ok:
            r = out.response
            if r.acquired:
                assert self._alive(lease_id) is not False, f"Acquire granted on dead lease {lease_id:#x}: {r}"
                assert r.token > 0, r
                self._granted(name, lease_id, r.token)
            else:
                assert wait == (0, False), f"a blocking Acquire answered acquired=false: {r}"
                current = self.holders.get(name)
                assert current is not None, f"{name!r}: acquired=false, yet nobody holds it in the model: {r}"
                assert (r.holder.lease_id, r.holder.token) == current, (current, r)
                assert current[0] != lease_id, f"{name!r}: refused to its own holder: {r}"

    @rule(data=st.data(), name=any_names)
    def acquire_binary_name(self, data: st.DataObject, name: str) -> None:
        """A name that is not UTF-8 (sent with the request's bytes twin): INVALID_ARGUMENT "name"."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        raw = data.draw(binary_names, label="raw_name")
        lease_id = self._lease_for(caller, data)
        try:
            raw.decode()
            return  # valid UTF-8 after all: covered by acquire
        except UnicodeDecodeError:
            pass
        method = data.draw(st.sampled_from(["Acquire", "Describe", "Release", "Withdraw"]), label="method")
        twin = bytes_twin(getattr(lock_pb2, f"{method}Request").DESCRIPTOR)(name=raw)
        if method != "Describe":
            twin.lease_id = lease_id
        call = caller.channel.unary_unary(f"{LOCKS}/{method}")
        out = checked_call(method, call, twin.SerializeToString(), metadata=lease_metadata(caller, lease_id),
                           allowed={C.INVALID_ARGUMENT})
        assert out.code == C.INVALID_ARGUMENT and out.field == "name", out

    @rule(data=st.data(), name=any_names)
    def release(self, data: st.DataObject, name: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        current = self.holders.get(name)
        choices = [st.sampled_from([0, -1, -(2**63), 2**63 - 1]), INT64]
        if self.tokens_seen:
            choices.append(st.sampled_from(self.tokens_seen))
        if current is not None:
            choices += [st.just(current[1])] * 3 + [st.sampled_from([current[1] - 1, current[1] + 1])]
        token = data.draw(st.one_of(choices), label="token")
        if current is not None and data.draw(st.booleans(), label="holder's lease"):
            lease_id = current[0]
        else:
            lease_id = self._lease_for(caller, data)
        out = checked_call("Release", caller.stub.Release,
                           lock_pb2.ReleaseRequest(name=name, lease_id=lease_id, token=token),
                           metadata=lease_metadata(caller, lease_id),
                           allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        if valid_name(name):
            self.dirty.add(name)
        if out.code == C.INVALID_ARGUMENT:
            assert out.field in ("name", "lease_id", "token"), out
            assert {"name": not valid_name(name), "lease_id": lease_id <= 0, "token": token <= 0}[out.field], out
            return
        if out.code == C.RESOURCE_EXHAUSTED:
            return
        assert valid_name(name) and lease_id > 0 and token > 0, (name[:40], lease_id, token, out)
        mine = current is not None and current == (lease_id, token)
        if out.ok:
            assert mine, f"Release of {name!r} by ({lease_id:#x}, {token}) succeeded; the model's holder is {current}"
            self._hold_ended(name)
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        else:
            assert out.reason in ("NOT_HOLDER", "STALE_TOKEN", "LEASE_EXPIRED"), out
            if out.reason == "LEASE_EXPIRED":
                self._may_have_expired(lease_id, out, "Release")
            elif current is not None and current[0] == lease_id:
                # The model has this lease holding: an older token is stale, a newer one was never granted,
                # and only an expiry (of a volatile lease) explains the refusal of the right one.
                if token < current[1]:
                    assert out.reason == "STALE_TOKEN", (current, token, out)
                elif token > current[1]:
                    assert out.reason == "NOT_HOLDER", (current, token, out)
                else:
                    assert self._alive(lease_id) is None, (name, current, token, out)
                    self._lease_gone(lease_id)
            else:
                assert out.reason == "NOT_HOLDER", (current, lease_id, token, out)

    @precondition(lambda self: self.holders)
    @rule(data=st.data())
    def release_holder(self, data: st.DataObject) -> None:
        """Release a held lock: by its lease's owner or another caller, with its token or a neighbour of it."""
        name = data.draw(st.sampled_from(sorted(self.holders)), label="name")
        lease_id, token = self.holders[name]
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        offered = data.draw(st.sampled_from([token] * 4 + [token - 1, token + 1, 2**63 - 1]), label="token")
        out = checked_call("Release", caller.stub.Release,
                           lock_pb2.ReleaseRequest(name=name, lease_id=lease_id, token=offered),
                           metadata=lease_metadata(caller, lease_id),
                           allowed={C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        self.dirty.add(name)
        if out.ok:
            assert offered == token, f"Release of {name!r} with token {offered} succeeded; the holder has {token}"
            self._hold_ended(name)
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        elif out.code == C.FAILED_PRECONDITION:
            if out.reason == "LEASE_EXPIRED" or (offered == token and self._alive(lease_id) is None):
                self._may_have_expired(lease_id, out, "Release")
            elif offered < token:
                assert out.reason == "STALE_TOKEN", out
            else:
                assert out.reason == "NOT_HOLDER" and offered != token, out

    @rule(data=st.data(), name=any_names)
    def withdraw(self, data: st.DataObject, name: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        current = self.holders.get(name)
        if current is not None and data.draw(st.booleans(), label="holder's lease"):
            lease_id = current[0]
        else:
            lease_id = self._lease_for(caller, data)
        out = checked_call("Withdraw", caller.stub.Withdraw, lock_pb2.WithdrawRequest(name=name, lease_id=lease_id),
                           metadata=lease_metadata(caller, lease_id),
                           allowed={C.INVALID_ARGUMENT, C.PERMISSION_DENIED})
        if valid_name(name):
            self.dirty.add(name)
        if out.code == C.INVALID_ARGUMENT:
            assert out.field in ("name", "lease_id"), out
            assert {"name": not valid_name(name), "lease_id": lease_id <= 0}[out.field], out
        elif out.code == C.PERMISSION_DENIED:
            assert self._foreign(caller, lease_id), out
        elif out.ok:
            r = out.response
            held = current is not None and current[0] == lease_id
            assert r.found == r.held, f"Withdraw found a waiter of {name!r}: nobody should wait: {r}"
            if held and not r.held:
                assert self._alive(lease_id) is None, (name, current, r)
                self._lease_gone(lease_id)
            else:
                assert r.held == held, (name, lease_id, current, r)
                if held:
                    self._hold_ended(name)

    @rule(data=st.data(), name=any_names)
    def describe(self, data: st.DataObject, name: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        out = checked_call("Describe", caller.stub.Describe, lock_pb2.DescribeRequest(name=name),
                           allowed={C.INVALID_ARGUMENT})
        if out.code == C.INVALID_ARGUMENT:
            assert not valid_name(name) and out.field == "name", out
        elif out.ok:
            assert valid_name(name)
            self.dirty.add(name)

    @rule(data=st.data(),
          page_size=st.sampled_from([0, 1, 2, 3, 1000, -1, -(2**31), 2**31 - 1]),
          page_token=st.sampled_from(["", "", "", "", "garbage", "%%%", "AAAA", "\x00", "é"]) | st.text(max_size=30),
          list_prefix=st.sampled_from(["", "", "a", "jobs/", "ключ", "\x00", "x" * 300]))
    def list_locks(self, data: st.DataObject, page_size: int, page_token: str, list_prefix: str) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        request = lock_pb2.ListLocksRequest(prefix=list_prefix, page_size=page_size, page_token=page_token)
        pages = 0
        while True:
            out = checked_call("ListLocks", caller.stub.ListLocks, request, allowed={C.INVALID_ARGUMENT})
            if out.code == C.INVALID_ARGUMENT:
                assert out.field in ("prefix", "page_size", "page_token"), out
                assert pages == 0, f"a page token of the coordinator's own was refused: {out}"
                return
            if not out.ok:
                return
            for lock in out.response.locks:
                assert lock.name.startswith(list_prefix), (list_prefix, lock.name)
                current = self.holders.get(lock.name)
                if request.page_token == "" or pages > 0:
                    assert current == (lock.holder.lease_id, lock.holder.token) or (
                        current is not None and self._alive(current[0]) is None), (lock, current)
            pages += 1
            if not out.response.next_page_token or pages >= 5:
                return
            request = lock_pb2.ListLocksRequest(prefix=list_prefix, page_size=page_size,
                                                page_token=out.response.next_page_token)

    @rule(data=st.data())
    def server_info(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        out = checked_call("ServerInfo", caller.stub.ServerInfo, lock_pb2.ServerInfoRequest(), allowed=set())
        assert out.response.serving and out.response.etcd.available, out.response

    @rule(data=st.data(), payload=st.binary(max_size=64) | st.sampled_from([b"\xff\xff", b"\x0a", b"\x0a\xff",
                                                                          b"\x10" + b"\xff" * 11, b"\x08"]))
    def garbage_bytes(self, data: st.DataObject, payload: bytes) -> None:
        """Bytes that are (mostly) no protobuf, to Acquire: a typed refusal, never UNKNOWN."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        call = caller.channel.unary_unary(f"{LOCKS}/Acquire", response_deserializer=lock_pb2.AcquireResponse.FromString)
        out = checked_call("Acquire (garbage)", call, payload,
                           allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        assert not out.ok, f"Acquire of bytes {payload!r} succeeded: {out.response}"

    @rule(data=st.data())
    def wrong_message_type(self, data: st.DataObject) -> None:
        """One request type sent to another method: parsed as that method's request, refused or answered."""
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        request = data.draw(st.sampled_from([
            lock_pb2.LeaseGrantRequest(ttl_seconds=5), lock_pb2.ListLocksRequest(prefix="a", page_size=3),
            lock_pb2.KeepAliveRequest(keepalive=lock_pb2.LeaseKeepAlive(lease_id=7, request_id=1)),
            lock_pb2.WatchHold(name="a", lease_id=9, token=3)]), label="request")
        method = data.draw(st.sampled_from(["Acquire", "Release", "Describe", "Withdraw"]), label="method")
        response_type = getattr(lock_pb2, f"{method}Response")
        call = caller.channel.unary_unary(f"{LOCKS}/{method}", response_deserializer=response_type.FromString)
        out = checked_call(f"{method} ({type(request).__name__})", call, request.SerializeToString(),
                           allowed={C.INVALID_ARGUMENT, C.FAILED_PRECONDITION, C.PERMISSION_DENIED})
        # Nothing parsed here names a lease of the model (ids 3, 7, 9): no grant, no release, nothing withdrawn
        # (a try-once Acquire of a held lock answers acquired=false without looking at the lease).
        if out.ok:
            assert method in ("Describe", "Withdraw", "Acquire"), (method, request, out)
            assert not (out.response.found if method == "Withdraw" else method == "Acquire" and out.response.acquired), out
