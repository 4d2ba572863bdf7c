"""The suite's figures against the echo floor (issue 23): coordinator CPU per operation over what grpc.aio costs.

For each P1 row (cycle loops of N users) and each P4 run through the
coordinator, the bare echo of :mod:`echo` is measured at the same load right
after (same message rate, same number of streams or callers), and the
coordinator's CPU per operation is set against the floor of its messages:

- a renewal (P4): one client message read and answered (shared by the
  leases of a batched message; its size is the batch's, 10 leases when
  batched) and one keepalive sent to etcd and answered
  (:func:`echo.renewal_floor`);
- an acquire + release (P1, P2): two calls read and answered (messages on
  the KeepAlive stream for the clients, unary calls for the stub) and two
  Txns sent to etcd and answered (:func:`echo.cycle_floor`).

A ratio of 1.0 is a coordinator that does nothing but pass its messages.
"""

from __future__ import annotations

from typing import Any

from _measure import Loops
from echo import SIZES, cycle_floor, echo_floor, renewal_floor

#: The Fencepost peers of P1 and whether their calls go on the KeepAlive stream (else unary calls).
ON_STREAM = {"fencepost-async": True, "fencepost-sync": True, "fencepost-stub": False}
#: Seconds each echo is measured (after its 1 s warm-up), at most.
ECHO_SECONDS = 3.0


async def cycles_against_floor(loops: dict[str, Loops], n: int, seconds: float) -> dict[str, Any]:
    """The coordinator's CPU per acquire + release of each Fencepost peer of one P1 row, and its floor.

    Args:
        loops: peer kind -> its cycle loops (with the coordinator's CPU seconds, ``Loops.cpu_seconds``).
        n: the users of the row: the echo has as many streams and callers.
        seconds: the loops' seconds (the echo runs as long, at most :data:`ECHO_SECONDS`).

    Returns:
        ``echo`` (the stream and unary echoes, at twice the cycle rate of
        fencepost-async, else of the first Fencepost peer) and, per peer,
        ``coordinator_us_per_cycle``, ``floor_us_per_cycle`` and ``ratio_to_floor``;
        empty when no Fencepost peer ran.
    """
    ran = {kind: loop for kind, loop in loops.items() if kind in ON_STREAM and loop.cycles and loop.cpu_seconds}
    if not ran:
        return {}
    lead = ran.get("fencepost-async") or next(iter(ran.values()))
    rate, secs = 2 * lead.rate, min(seconds, ECHO_SECONDS)
    stream = await echo_floor("stream", n, rate, secs, SIZES["stream_call"])
    unary = await echo_floor("unary", n, rate, secs, SIZES["txn"])
    out: dict[str, Any] = {"echo": {"stream": stream, "unary": unary}}
    for kind, loop in ran.items():
        used = loop.cpu_seconds / loop.cycles * 1e6
        floor = cycle_floor(stream, unary, ON_STREAM[kind])
        out[kind] = {"coordinator_us_per_cycle": round(used, 1), "floor_us_per_cycle": round(floor, 1),
                     "ratio_to_floor": round(used / floor, 3)}
    return out


async def renewals_against_floor(out: dict[str, Any], batch: int, streams: int = 4) -> dict[str, Any]:
    """The coordinator's CPU per renewal of one P4 run through it, and its floor.

    Two stream echoes at the run's load: the clients' leg (``streams``
    streams, the run's keepalive messages a second, of its message size) and
    etcd's leg (one stream: the coordinator forwards to etcd on a few shared
    streams, one message per renewal, written ``batch`` at a time as the
    coordinator forwards a batch).

    Args:
        out: the run's figures (``cores``, ``renewals_per_second``) from ``_leases.leases_kept``.
        batch: renewals per keepalive message in that run.
        streams: the generator's keepalive streams (its default: 4).

    Returns:
        ``coordinator_us_per_renewal``, ``floor_us_per_renewal``,
        ``ratio_to_floor``, ``ratio_to_server_floor`` (both legs counted at
        the echo server's cost per round trip, as issue 23 first estimated the floor) and ``echo`` (``clients`` and ``etcd``: the two
        echoes); empty when the run renewed nothing.
    """
    rate = out.get("renewals_per_second") or 0
    cores = out.get("cores", {}).get("coordinator")
    if not rate or cores is None:
        return {}
    sizes = SIZES["keepalive"] if batch == 1 else SIZES["keepalives10"]
    clients = await echo_floor("stream", streams, rate / batch, ECHO_SECONDS, sizes)
    etcd = await echo_floor("stream", 1, rate, ECHO_SECONDS, SIZES["etcd_keepalive"], burst=batch)
    used, floor = cores / rate * 1e6, renewal_floor(clients, etcd, batch)
    # The first estimate counted both legs at the echo server's cost: kept for comparison.
    servers = clients["server_us"] / batch + etcd["server_us"]
    return {"coordinator_us_per_renewal": round(used, 1), "floor_us_per_renewal": round(floor, 1),
            "ratio_to_floor": round(used / floor, 3), "ratio_to_server_floor": round(used / servers, 3),
            "echo": {"clients": clients, "etcd": etcd}}


async def renewal_against_floor(out: dict[str, Any], batch: int, row: dict[str, Any]) -> str:
    """Add to a P4 run through the coordinator (``out``) its CPU per renewal against the echo floor, and against
    the one-lease cost of the same row (``row``: the runs of that lease count); the line to print."""
    try:
        out.update(await renewals_against_floor(out, batch))
    except Exception as exc:  # noqa: BLE001 - the run's own figures stand without it
        out["floor_error"] = f"{type(exc).__name__}: {exc}"[:300]
        return f"[P4] echo floor FAILED: {out['floor_error']}"
    if "coordinator_us_per_renewal" not in out:
        return "[P4] echo floor: the run renewed nothing"
    single = next((e.get("coordinator_us_per_renewal") for e in row.values() if e.get("batch") == 1
                   and e.get("mode") == "fencepost" and e is not out), None)
    if batch > 1 and single:
        out["ratio_to_single"] = round(out["coordinator_us_per_renewal"] / single, 3)
    return (f"[P4] batch {batch}: coordinator CPU {out['coordinator_us_per_renewal']:.0f} us per renewal, floor "
            f"{out['floor_us_per_renewal']:.0f} us (echo: server {out['echo']['clients']['server_us']:.0f} us per "
            f"client message, client {out['echo']['etcd']['client_us']:.0f} us per etcd keepalive): "
            f"{out['ratio_to_floor']:.2f}x the echo floor ({out['ratio_to_server_floor']:.2f}x counting both legs at "
            f"the echo server's cost)"
            + (f"; {out['ratio_to_single']:.2f}x the one-lease cost" if "ratio_to_single" in out else ""))
