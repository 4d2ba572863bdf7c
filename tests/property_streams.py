"""The property test's KeepAlive stream rules (tests/test_property.py): open streams (at most
``MAX_STREAMS_PER_CALLER`` per caller), keepalives and watches for own, foreign and unknown leases, unwatch,
half-close, cancel, and bytes that are no protobuf, each stream's end checked."""

from __future__ import annotations

import grpc
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from fencepost.client.v1 import lock_pb2

from .property_calls import ALWAYS, KNOWN_REASONS, NEVER, C, Stream, keepalive_request
from .property_locks import LockRules
from .property_model import INT64, MAX_STREAMS_PER_CALLER, any_names


class StreamRules(LockRules):
    """The KeepAlive stream rules, added to the lock rules."""


    # ------------------------------------------------------------ KeepAlive streams

    def _streams(self) -> list[Stream]:
        return [s for c in self.callers for s in c.streams if s.open]

    @rule(data=st.data())
    def stream_open(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(self.callers), label="caller")
        if sum(s.open for s in caller.streams) >= MAX_STREAMS_PER_CALLER:
            return
        caller.streams.append(Stream(caller))

    def _check_end(self, stream: Stream, allowed: set[grpc.StatusCode]) -> None:
        end = stream.end
        if end is None:
            return
        if stream.cancelled:
            assert end.code in (C.CANCELLED, C.OK), end
            return
        assert end.code not in NEVER, end
        assert end.code in allowed | ALWAYS | {C.OK}, end
        if end.code != C.OK:
            assert end.reason in KNOWN_REASONS, end

    @precondition(lambda self: self._streams())
    @rule(data=st.data())
    def stream_keepalive(self, data: st.DataObject) -> None:
        stream = data.draw(st.sampled_from(self._streams()), label="stream")
        lease_id = self._lease_for(stream.caller, data)
        self.request_id += 1
        rid = self.request_id
        stream.send(keepalive_request(stream.caller, lease_id, "keepalive", request_id=rid))
        stream.sent_foreign |= self._foreign(stream.caller, lease_id)
        if lease_id <= 0:
            return  # never forwarded to etcd: no answer (the client's deadline counts it as not acknowledged)
        acked = stream.wait(lambda r: r.WhichOneof("response") == "keepalive" and r.keepalive.request_id == rid)
        self._check_end(stream, {C.PERMISSION_DENIED})
        if not acked:  # a foreign lease's refusal (of this message, or of an earlier one) ended the stream
            assert self._foreign(stream.caller, lease_id) or (
                stream.sent_foreign and stream.end is not None and stream.end.code == C.PERMISSION_DENIED), stream.end
            return
        ack = [r.keepalive for r in stream.events if r.keepalive.request_id == rid][-1]
        assert ack.lease_id == lease_id, ack
        alive = self._alive(lease_id)
        if alive is True:
            assert ack.ttl_seconds > 0, (lease_id, ack)
        elif alive is False:
            assert ack.ttl_seconds <= 0, (lease_id, ack)
        elif ack.ttl_seconds <= 0:
            self._lease_gone(lease_id)

    @precondition(lambda self: self._streams())
    @rule(data=st.data(), name=any_names, token=st.sampled_from([0, -1, 2**63 - 1]) | INT64)
    def stream_watch(self, data: st.DataObject, name: str, token: int) -> None:
        """Watch (or unwatch) a hold: any triple is taken; one that ended through our calls is reported at once."""
        stream = data.draw(st.sampled_from(self._streams()), label="stream")
        kind = data.draw(st.sampled_from(["watch", "unwatch", "ended"]), label="kind")
        if kind == "ended" and self.ended:
            name, lease_id, token = data.draw(st.sampled_from(self.ended), label="ended hold")
        else:
            lease_id = self._lease_for(stream.caller, data)
        stream.send(keepalive_request(stream.caller, lease_id, "unwatch" if kind == "unwatch" else "watch",
                                      name=name, token=token))
        stream.sent_foreign |= self._foreign(stream.caller, lease_id)
        if kind == "ended" and (name, lease_id, token) in self.ended:
            def reported(r: lock_pb2.KeepAliveResponse) -> bool:
                e = r.hold_ended
                return r.WhichOneof("response") == "hold_ended" and (e.name, e.lease_id, e.token) == (
                    name, lease_id, token)
            if any(reported(r) for r in stream.events):
                return  # already reported on this stream (a watch of it before)
            got = stream.wait(reported)
            self._check_end(stream, {C.PERMISSION_DENIED})
            assert got or self._foreign(stream.caller, lease_id) or (
                stream.sent_foreign and stream.end is not None and stream.end.code == C.PERMISSION_DENIED), (
                f"no HoldEnded for ended hold {(name, lease_id, token)}: {stream.end}")
        else:
            # Nothing to wait for; a refusal of the stream (a bad name) comes as its end.
            self._check_end(stream, {C.INVALID_ARGUMENT, C.PERMISSION_DENIED})

    @precondition(lambda self: self._streams())
    @rule(data=st.data(), how=st.sampled_from(["half-close", "cancel", "garbage"]))
    def stream_end(self, data: st.DataObject, how: str) -> None:
        stream = data.draw(st.sampled_from(self._streams()), label="stream")
        if how == "half-close":
            stream.half_close()
            stream.wait(None)
            self._check_end(stream, {C.INVALID_ARGUMENT, C.PERMISSION_DENIED})
        elif how == "cancel":
            stream.cancel()
            stream.wait(None)
            self._check_end(stream, set())
        else:
            stream.send(data.draw(st.sampled_from([b"\xff\xff", b"\x0a\xff", b"\x12\x05\x0a\x03\xff\xfe\xfd"]),
                                  label="garbage"))
            stream.wait(None)
            assert stream.end is not None and stream.end.code == C.INVALID_ARGUMENT, stream.end
            self._check_end(stream, {C.INVALID_ARGUMENT})
