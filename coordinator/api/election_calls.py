"""The election RPCs: Campaign, Proclaim, Resign, Leader and the Observe stream.

Each unary call, once admitted (:mod:`.rpcs`), is one call into
:class:`~..recipes.election.Elections`, with the grant's and the release's
bookkeeping (:mod:`.grants`, :mod:`.releases`); errors name the election,
never its internal lock. A Resign with a token and a ``request_id`` writes a
request record (:mod:`..recipes.requests`); one without a token withdraws
the lease's candidacy whatever its token.

Observe is admitted as its row of :data:`.rpcs.RPCS` says, then counts as a
stream (:mod:`.slots`: it holds an etcd watch), then waits for the token
floor. It is *accepted* (initial metadata ``fencepost-observe-accepted``)
once the first etcd read of the election succeeded: the client learns the
stream is up even if nothing changes for a long time (a resumed Observe
sends nothing until the leader changes); an Observe refused at once (etcd
unreachable) is never accepted, so that a client does not retry it forever.
At shutdown the stream ends with UNAVAILABLE / SHUTTING_DOWN (the client
resumes on another replica) and the refusal is not logged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from fencepost.client.errors import FencepostError
from fencepost.client.v1 import kinds, lock_pb2
from fencepost.client.v1.keys import OBSERVE_ACCEPTED_METADATA, Hold

from ..admission.identity import caller_of
from ..recipes.election import Elections, Leader, public_errors
from ..recipes.requests import Call, RequestRecords
from ..recipes.validate import wait_seconds
from ..telemetry.events import caller, log_event
from .decode import Undecodable
from .grants import Grants
from .releases import Releases
from .rpcs import Admission
from .slots import StreamSlots
from .status import Refusals, shutting_down

__all__ = ["ElectionCalls", "leader_info"]

_log = logging.getLogger(__name__)


def leader_info(leader: Leader | None) -> lock_pb2.LeaderInfo | None:
    """The wire form of an election's leader; None when it has none."""
    return lock_pb2.LeaderInfo(lease_id=leader.lease_id, token=leader.token, value=leader.value) if leader else None


class ElectionCalls:
    """The bodies of the election RPCs.

    Args:
        elections: the election recipe.
        grants: the bookkeeping of a leadership won.
        releases: the bookkeeping of a resignation.
        records: the request records (a retried Resign).
        admission: applies Observe's row of the RPC table, and its token floor.
        refusals: ends a refused Observe with its status.
        slots: the streams served at once (an Observe is one).
        closing: set when the coordinator shuts down.
    """

    def __init__(self, elections: Elections, grants: Grants, releases: Releases, records: RequestRecords,
                 admission: Admission, refusals: Refusals, slots: StreamSlots, closing: asyncio.Event) -> None:
        self._elections = elections
        self._grants = grants
        self._releases = releases
        self._records = records
        self._admission = admission
        self._refusals = refusals
        self._slots = slots
        self._closing = closing

    async def campaign(self, request: lock_pb2.CampaignRequest, context: grpc.aio.ServicerContext
                       ) -> lock_pb2.CampaignResponse:
        """Campaign: elected with the leadership's token, or (trying once) the leader."""
        started, wait = time.perf_counter(), wait_seconds(request.wait_ms, request.wait_forever)
        internal = kinds.election_lock(request.election)
        with public_errors(request.election), self._grants.acquiring(context, internal, request.lease_id, wait):
            result = await self._elections.campaign(request.election, request.lease_id, request.value, wait)
        if result.elected:
            self._grants.granted(Hold(internal, request.lease_id, result.token), internal, None,
                                 time.perf_counter() - started, context, f"election {request.election!r}: lease "
                                 f"{request.lease_id:#x} leads, token {result.token}", event="elected",
                                 name=request.election)
        return lock_pb2.CampaignResponse(elected=result.elected, token=result.token, leader=leader_info(result.leader))

    async def proclaim(self, request: lock_pb2.ProclaimRequest) -> lock_pb2.ProclaimResponse:
        """Proclaim: the leader's new value."""
        revision = await self._elections.proclaim(request.election, request.lease_id, request.token, request.value)
        return lock_pb2.ProclaimResponse(revision=revision)

    async def resign(self, request: lock_pb2.ResignRequest, context: grpc.aio.ServicerContext
                     ) -> lock_pb2.ResignResponse:
        """Resign: end the leadership ``token`` (0: the lease's candidacy, whatever its token)."""
        hold = Hold(kinds.election_lock(request.election), request.lease_id, request.token)
        with self._releases.releasing(hold, by_token=bool(request.token), rpc="Resign") as ending:
            if request.token:  # a retry of a Resign that succeeded answers from its request record
                found = True
                revision = await self._records.run(
                    request.request_id, Call("Resign", request.election, request.lease_id, request.token),
                    lambda also: self._resigned(request, also))
            else:
                revision, found, ending.held = await self._elections.resign(request.election, request.lease_id, 0)
        log_event(_log, logging.DEBUG, "resign", f"election {request.election!r}: lease {request.lease_id:#x} "
                  f"resigned (token {request.token})", name=request.election, lease_id=request.lease_id,
                  token=request.token, found=found, revision=revision, **caller(context))
        return lock_pb2.ResignResponse(revision=revision, found=found)

    async def _resigned(self, request: lock_pb2.ResignRequest, also: Sequence[Any]) -> int:
        revision, _, _ = await self._elections.resign(request.election, request.lease_id, request.token, also=also)
        return revision

    async def leader(self, request: lock_pb2.LeaderRequest) -> lock_pb2.LeaderResponse:
        """Leader: the election's leader at one revision."""
        leader, revision = await self._elections.leader(request.election)
        return lock_pb2.LeaderResponse(leader=leader_info(leader), revision=revision)

    async def observe(self, request: lock_pb2.ObserveRequest, context: grpc.aio.ServicerContext
                      ) -> AsyncIterator[lock_pb2.ObserveResponse]:
        """Observe: the responses of one call (the servicer's Observe yields them; see the module docstring).

        Raises:
            grpc.aio.AbortError: the call is refused or fails (see :meth:`.status.Refusals.refuse`).
        """
        changes: AsyncIterator[Any] | None = None
        step: asyncio.Future[Any] | None = None
        counted, caller_key = False, ""
        try:
            if isinstance(request, Undecodable):
                raise request.error()
            await self._admission.admit("Observe", request, context)
            self._slots.open(caller_key := caller_of(context).key)
            counted = True
            await self._admission.tokens.ready()
            ready = asyncio.Event()
            changes = self._elections.observe(request.election, request.after_revision, ready=ready.set)
            closing = asyncio.ensure_future(self._closing.wait())
            try:
                accepted = False
                while True:
                    step = asyncio.ensure_future(anext(changes))
                    while not accepted:  # accepted once the first etcd read succeeded (see the module docstring)
                        readying = asyncio.ensure_future(ready.wait())
                        await asyncio.wait({step, closing, readying}, return_when=asyncio.FIRST_COMPLETED)
                        readying.cancel()
                        if ready.is_set():
                            await context.send_initial_metadata(((OBSERVE_ACCEPTED_METADATA, "1"),))
                            accepted = True
                        elif step.done() or closing.done():
                            break
                    if not step.done() and not closing.done():
                        await asyncio.wait({step, closing}, return_when=asyncio.FIRST_COMPLETED)
                    if not step.done():
                        step.cancel()
                        await asyncio.gather(step, return_exceptions=True)
                        raise shutting_down()  # the client resumes on another replica
                    seen = step.result()
                    yield lock_pb2.ObserveResponse(leader=leader_info(seen.leader), revision=seen.revision,
                                                   compacted=seen.compacted)
            finally:
                closing.cancel()
        except FencepostError as exc:
            await self._refusals.refuse(context, exc, "Observe", log=not self._closing.is_set())
        finally:
            if step is not None and not step.done():  # the caller went: stop the read in flight first
                step.cancel()
                await asyncio.gather(step, return_exceptions=True)
            if changes is not None:
                await changes.aclose()  # type: ignore[attr-defined]
            if counted:
                self._slots.close(caller_key)
