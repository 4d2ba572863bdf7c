"""The timeline of one run of ``fencepost demo``, as printed lines (the plot draws the same events)."""

from __future__ import annotations

from .scenario import INVOICE_ID, Event, RunRecord

__all__ = ["RELEASE_WORDS", "describe", "release_note", "timeline"]


def describe(event: Event, record: RunRecord) -> str:
    """One timeline line's text (without the time and the actor)."""
    d = event.data
    who = event.who
    if who == "demo":
        if event.event == "frozen":
            return "SIGSTOP A: frozen mid-computation (as by a long GC pause); its keepalives stop"
        if event.event == "resumed":
            return (f"SIGCONT A after {d['frozen_seconds']:.2f} s frozen (TTL {record.ttl:g} s); "
                    f"A still thinks it holds {record.lock}")
    if event.event == "acquired":
        text = f"acquired {d['name']} with token {d['token']} (TTL {d['ttl']} s)"
        if who == "B" and any(e.who == "demo" and e.event == "frozen" for e in record.events):
            text += ": A's lease expired while A was frozen"
        return text
    if event.event == "read":
        return f"read invoice {INVOICE_ID}: version {d['version']}"
    if event.event == "computing":
        return f"computing for {d['seconds']:g} s"
    if event.event == "wrote":
        how = "guarded UPDATE" if record.fenced else "plain UPDATE"
        text = f"writes version {d['version']} with token {d['token']} ({how}) -> accepted"
        if who == "A":
            text = (f"writes version {d['version']} with token {d['token']} ({how}) -> ACCEPTED "
                    f"(nothing checks the token): B's version 2 is overwritten")
        return text
    if event.event == "rejected":
        return (f"writes version {d['version']} with token {d['token']} (guarded UPDATE) -> REJECTED: "
                f"StaleTokenError, stored token {d['stored_token']}")
    if event.event == "released":
        return f"released {record.lock}"
    if event.event == "release_failed":
        return f"release fails ({d['reason']}): {RELEASE_WORDS.get(d['reason'], 'its lease had expired')}"
    return f"{event.event} {d}" if d else event.event


#: Why stale A's release fails, by its reason: which one a run shows is a race after SIGCONT.
RELEASE_WORDS = {
    "DEADLINE": "A's client saw first that its lease's deadline had passed, and answered without the coordinator",
    "NOT_HOLDER": "the call reached the coordinator first, and A's expired lease holds nothing there",
    "LEASE_EXPIRED": "the call reached the coordinator first, and A's lease had expired",
}


def release_note(records: list[RunRecord]) -> str | None:
    """One line on why stale A's release failed as it did in ``records`` (None when it did not fail)."""
    reasons = sorted({str(e.data["reason"]) for r in records for e in r.events if e.event == "release_failed"})
    if not reasons:
        return None
    return (f"A's release failed ({' and '.join(reasons)}): DEADLINE when A's client sees its lease's deadline "
            f"passed first, NOT_HOLDER when the coordinator answers first, a race after SIGCONT; either way A had "
            f"lost the lock")


def timeline(record: RunRecord) -> list[str]:
    """The run's timeline as printable lines, ending with the final row (the verdict is printed at the end)."""
    lines = []
    for e in record.events:
        if e.event == "ready":
            continue
        lines.append(f"  {e.t:6.2f}s  {e.who:<4} {describe(e, record)}")
    if record.final is not None:
        version, body, by = record.final
        token = f", fencing_token {record.final_token}" if record.fenced else ""
        lines.append(f"  final row: version {version}, written by {by}{token}: {body}")
    return lines
