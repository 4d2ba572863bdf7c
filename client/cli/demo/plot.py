"""``fencepost demo --plot FILE.png``: both runs' timelines side by side (matplotlib, Agg).

Lanes per run: worker A, worker B and the invoice row. A bar is a hold as the
worker sees it (A's turns red past the moment its lease was gone), the grey
hatched span is A frozen by SIGSTOP, and the markers on the invoice lane are
the writes: a circle for an accepted write, a cross for a rejected one, each
labelled with its version and token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .scenario import RunRecord

LANES = {"A": 2.0, "B": 1.0, "row": 0.0}
COLORS = {"A": "#1f77b4", "B": "#2ca02c", "stale": "#d62728", "frozen": "#999999"}


def _first(record: RunRecord, who: str, event: str) -> Any:
    for e in record.events:
        if e.who == who and e.event == event:
            return e
    return None


def _draw_run(ax: Any, record: RunRecord, end: float) -> None:
    a_acq = _first(record, "A", "acquired")
    b_acq = _first(record, "B", "acquired")
    frozen = _first(record, "demo", "frozen")
    resumed = _first(record, "demo", "resumed")
    a_end = next((e for e in reversed(record.events) if e.who == "A"), None)
    b_rel = _first(record, "B", "released")
    h = 0.5
    if a_acq is not None and b_acq is not None and a_end is not None:
        ax.broken_barh([(a_acq.t, b_acq.t - a_acq.t)], (LANES["A"] - h / 2, h), color=COLORS["A"], alpha=0.8)
        ax.broken_barh([(b_acq.t, a_end.t - b_acq.t)], (LANES["A"] - h / 2, h), color=COLORS["stale"], alpha=0.35)
        ax.text(a_acq.t, LANES["A"] + h / 2 + 0.05, f"A holds, token {a_acq.data['token']}", fontsize=8)
        ax.text(b_acq.t, LANES["A"] + h / 2 + 0.05, "lease gone; A does not know", fontsize=8,
                color=COLORS["stale"])
    if frozen is not None and resumed is not None:
        ax.broken_barh([(frozen.t, resumed.t - frozen.t)], (LANES["A"] - h / 2, h), facecolor="none",
                       edgecolor=COLORS["frozen"], hatch="///")
        ax.text((frozen.t + resumed.t) / 2, LANES["A"], "frozen (SIGSTOP)", fontsize=8, ha="center",
                va="center", color="black")
    if b_acq is not None and b_rel is not None:
        ax.broken_barh([(b_acq.t, b_rel.t - b_acq.t)], (LANES["B"] - h / 2, h), color=COLORS["B"], alpha=0.8)
        ax.text(b_acq.t, LANES["B"] + h / 2 + 0.05, f"B holds, token {b_acq.data['token']}", fontsize=8)
    ax.axhline(LANES["row"], color="#cccccc", linewidth=1, zorder=0)
    for e in record.events:
        if e.event not in ("wrote", "rejected"):
            continue
        color = COLORS["B"] if e.who == "B" else COLORS["stale"]
        marker = "o" if e.event == "wrote" else "X"
        ax.plot([e.t], [LANES["row"]], marker=marker, markersize=11, color=color)
        ax.plot([e.t, e.t], [LANES[e.who], LANES["row"]], linestyle=":", color=color)
        verb = "accepted" if e.event == "wrote" else "REJECTED"
        offset = 0.25 if e.who == "B" else -0.35
        ax.text(e.t, LANES["row"] + offset, f"{e.who}: v{e.data['version']} token {e.data['token']} {verb}",
                fontsize=8, ha="right" if e.who == "B" else "left", color=color)
    ax.set_yticks([LANES["A"], LANES["B"], LANES["row"]], ["worker A", "worker B", "invoice 42"])
    ax.set_ylim(-0.8, 2.8)
    ax.set_xlim(-0.1, end + 1.2)
    ax.set_xlabel("seconds since A was told to start")
    ax.set_title(record.verdict(), fontsize=9)


def draw(records: list[RunRecord], path: str) -> None:
    """Draw the unfenced and the fenced run side by side into a PNG.

    Args:
        records: The runs, unfenced first.
        path: The PNG file to write.

    Raises:
        ImportError: matplotlib is not installed.
        OSError: the file cannot be written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max((e.t for r in records for e in r.events), default=1.0)
    fig, axes = plt.subplots(1, len(records), figsize=(7 * len(records), 3.8), sharex=True)
    for ax, record in zip(list(axes), records, strict=True):
        _draw_run(ax, record, end)
    fig.suptitle(f"fencepost demo: worker A frozen past its TTL ({records[0].ttl:g} s) on lock {records[0].lock}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
