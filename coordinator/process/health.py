"""The coordinator's health: ``grpc.health.v1`` answers that follow etcd and the token floor.

Three service names are answered. :data:`LIVENESS_SERVICE` is SERVING from
start to shutdown, whatever etcd does (Kubernetes' liveness probe asks for
it, so an etcd outage makes the coordinators not ready without restarting
them). ``""`` and :data:`SERVICE_NAME` (readiness) are SERVING while etcd
answers a linearizable read of the token record every
:data:`HEALTH_INTERVAL` seconds and fencing tokens are safe
(:meth:`~..recipes.tokens.TokenFloor.check`), NOT_SERVING otherwise: when
etcd's revisions went back (restored from an older snapshot) they stay
NOT_SERVING until an operator recovers the tokens. Each change of etcd's
reachability is logged once (``etcd_connected``, ``etcd_reconnected``,
``etcd_unreachable``, ``etcd_refused``).
"""

from __future__ import annotations

import asyncio
import logging
import time

from grpc_health.v1 import health, health_pb2

from fencepost.client.errors import FencepostError

from ..api.server_info import About
from ..etcd import EtcdClient
from ..recipes.tokens import TokenFloor
from ..telemetry.events import log_event

__all__ = ["HEALTH_INTERVAL", "LIVENESS_SERVICE", "SERVICE_NAME", "Health"]

_log = logging.getLogger("fencepost.coordinator")

SERVICE_NAME = "fencepost.v1.LockService"
#: The health service name of the process itself: SERVING from start to
#: shutdown, whatever etcd does. Kubernetes' liveness probe asks for this one
#: (``grpc: {port: 7421, service: liveness}``), so an etcd outage makes the
#: coordinators not ready (no new traffic) without restarting them; ""
#: and SERVICE_NAME follow etcd (readiness).
LIVENESS_SERVICE = "liveness"
#: How often the health monitor checks etcd, in seconds.
HEALTH_INTERVAL = 1.0


class Health:
    """The health service of one coordinator (on its port and its health port) and its etcd monitor.

    Args:
        about: the coordinator's facts; ``serving`` follows readiness.
    """

    def __init__(self, about: About) -> None:
        self._about = about
        self._draining = False
        #: The ``grpc.health.v1`` servicer, to add to the servers.
        self.servicer = health.aio.HealthServicer()

    async def start(self) -> None:
        """Answer NOT_SERVING for readiness (until etcd answers) and SERVING for liveness."""
        await self.set_serving(False)
        await self.servicer.set(LIVENESS_SERVICE, health_pb2.HealthCheckResponse.SERVING)

    async def set_serving(self, serving: bool) -> None:
        """Set readiness (``""`` and :data:`SERVICE_NAME`) and ``about.serving``; never SERVING once draining."""
        serving = serving and not self._draining
        self._about.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        await self.servicer.set("", status)
        await self.servicer.set(SERVICE_NAME, status)

    async def enter_drain(self) -> None:
        """Answer NOT_SERVING for readiness from now on (the coordinator drains before it stops); liveness stays
        SERVING until :meth:`enter_graceful_shutdown`."""
        self._draining = True
        await self.set_serving(False)

    async def enter_graceful_shutdown(self) -> None:
        """Answer NOT_SERVING to every service name from now on."""
        self._about.serving = False
        await self.servicer.enter_graceful_shutdown()

    async def monitor(self, etcd: EtcdClient, tokens: TokenFloor) -> None:
        """Keep readiness SERVING while etcd answers a linearizable read and tokens are safe, NOT_SERVING
        otherwise (runs until cancelled)."""
        serving: bool | None = None
        said: tuple[bool, str | None, str | None] | None = None
        ever_ok = False
        lost_at = 0.0  # when etcd stopped answering, after it had answered
        while True:
            # Two tries of 1 s (the HEALTH rule): the second goes to the next
            # member, so one frozen member of a healthy cluster is not an outage.
            ok = await _answers(tokens)
            if (ok and tokens.refusing is None) != serving:
                serving = ok and tokens.refusing is None
                await self.set_serving(serving)
            # Logged once per change, also when an unreachable etcd comes back
            # refusing the coordinator (health stays NOT_SERVING meanwhile).
            # An expired (or not yet valid) etcd client certificate in use is named, again when it changes.
            problem = None if ok or etcd.members.tls is None else etcd.members.tls.certificate_problem()
            state = (ok, None if ok else etcd.refusal, problem)
            if state != said:
                answered_before = said is not None and said[0]
                said = state
                if ok and not ever_ok:
                    ever_ok = True
                    log_event(_log, logging.INFO, "etcd_connected", f"etcd reachable: {_serving_word(tokens)}")
                elif ok:
                    log_event(_log, logging.INFO, "etcd_reconnected", f"etcd reachable: {_serving_word(tokens)}",
                              down_s=round(time.monotonic() - lost_at, 3))
                else:
                    if answered_before:
                        lost_at = time.monotonic()
                    if state[1] is not None:
                        who = f"user {etcd.user!r}" if etcd.user else "no --etcd-user"
                        log_event(_log, logging.WARNING, "etcd_refused", f"etcd refuses the coordinator ({state[1]}, "
                                  f"{who}): NOT_SERVING until it accepts it", reason=state[1], user=etcd.user)
                    else:
                        log_event(_log, logging.WARNING, "etcd_unreachable", "etcd unreachable: NOT_SERVING"
                                  + (f"; {problem}: renew it (the file is read again when it changes)"
                                     if problem else ""), certificate_problem=problem)
            await asyncio.sleep(HEALTH_INTERVAL)


async def _answers(tokens: TokenFloor) -> bool:
    """Whether etcd answers the token record's linearizable read (the floor is checked on the way)."""
    try:
        await tokens.check()
    except FencepostError as exc:
        logging.getLogger(__name__).debug("etcd health read failed: %s", exc)
        return False
    return True


def _serving_word(tokens: TokenFloor) -> str:
    if tokens.refusing is not None:
        return "NOT_SERVING (fencing tokens would go back: see the ERROR line)"
    return "SERVING"
