"""The suite's results as markdown tables and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _num(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, (int, float)):
        return f"{value:,.{digits}f}"
    return str(value)


def _table(head: list[str], rows: list[list[str]], align: str) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return out + [""]


def _err(entry: dict[str, Any]) -> str | None:
    return f"failed: {entry['error']}" if "error" in entry else None


def render(results: dict[str, Any], images: list[Path]) -> str:
    """The markdown of one run: its command, commit and machine, then one table per figure."""
    meta = results["meta"]
    lines = [f"Command: `{meta['command']}` (commit {meta['commit']}, {meta['date']}, {meta['seconds']} s)  ",
             f"Machine: {meta['nproc']} cores, {meta['cpu']}, Python {meta['python']}; etcd: {meta['etcd']}; "
             f"coordinator loop: {meta['loop']}; extra serve flags: {' '.join(meta['coordinator_args']) or 'none'}",
             ""]
    if meta["skipped"]:
        lines += [f"Skipped: {', '.join(f'{k} ({v})' for k, v in meta['skipped'].items())}", ""]
    names = {p.name for p in images}
    if "P1" in results:
        lines += ["#### P1: acquire + release cycles per second (ratio to etcd-direct)", ""]
        for variant, title in (("distinct", "distinct names"), ("contended", "contended, 8 users per name")):
            table = results["P1"][variant]
            if not table:
                continue
            peers = list(next(iter(table.values())))
            rows = [[k] + [_err(table[n][k]) or f"{_num(table[n][k]['cycles_per_s'], 0)} ({_num(table[n][k]['ratio'], 2)})"
                           for n in table] for k in peers]
            lines += [f"{title.capitalize()}:", ""] + _table(["peer", *(f"{n} user{'s' if n != '1' else ''}" for n in table)], rows,
                                                             "l" + "r" * len(table))
        if "p1-cycles.png" in names:
            lines += ["![P1](p1-cycles.png)", ""]
    lines += _floor_lines(results)
    if "P2" in results:
        lines += ["#### P2: latency of an uncontended acquire and release, ms (p50 ratio to etcd-direct)", ""]
        for n, table in results["P2"].items():
            rows = []
            for k, e in table.items():
                if _err(e):
                    rows.append([k, _err(e) or ""] + [""] * 8)
                    continue
                a, r = e["acquire"], e["release"]
                rows.append([k, _num(a["p50"], 2), _num(a["p99"], 2), _num(a["p99.9"], 2), _num(a["ratio_p50"], 2),
                             _num(r["p50"], 2), _num(r["p99"], 2), _num(r["p99.9"], 2), _num(r["ratio_p50"], 2),
                             _num(e["samples"], 0)])
            lines += [f"{n} user{'s' if n != '1' else ''}:", ""] + _table(
                ["peer", "acquire p50", "p99", "p99.9", "p50 ratio", "release p50", "p99", "p99.9", "p50 ratio",
                 "cycles"], rows, "lrrrrrrrrr")
        if "p2-latency.png" in names:
            lines += ["![P2](p2-latency.png)", ""]
    if "P3" in results:
        lines += ["#### P3: hand-off, from the holder's release call to the waiter's grant, ms", ""]
        rows = [[k, _err(e) or _num(e["p50_ms"], 2), _num(e.get("p99_ms"), 2), _num(e.get("max_ms"), 2),
                 _num(e.get("ratio_p50"), 2), _num(e.get("samples"), 0)] for k, e in results["P3"].items()]
        lines += _table(["peer", "p50", "p99", "max", "p50 ratio to etcd-direct", "hand-offs"], rows, "lrrrrr")
        if "p3-handoff.png" in names:
            lines += ["![P3](p3-handoff.png)", ""]
    if "P4" in results:
        lines += ["#### P4: leases kept alive (TTL 10 s, each renewed every TTL/3, generator in another process)",
                  ""]
        rows = []
        for n, row in results["P4"].items():
            for mode, e in row.items():
                if _err(e):
                    rows.append([n, mode, _err(e) or ""] + [""] * 9)
                    continue
                c = e["cores"]
                kept = e.get("leases", int(n))
                leases = _num(int(n), 0) if kept == int(n) else f"{_num(kept, 0)} of {_num(int(n), 0)} asked"
                grant = _num(e["grant_seconds"], 1)
                if e.get("grant_refusals"):
                    grant += f" ({_num(e['grant_refusals'], 0)} refused: overloaded)"
                rows.append([leases, mode, _num(e["renewals_per_second"], 0), _num(c.get("coordinator"), 3),
                             _num(c.get("etcd"), 3), _num(c.get("generator"), 3),
                             _num(e.get("coordinator_rss_kib_per_1000_leases"), 0),
                             f"{_num(e['rtt_ms']['p50'], 1)} / {_num(e['rtt_ms']['p99'], 1)}",
                             _num(e.get("ratio_rtt_p99"), 2), _num(e.get("ratio_server_cores"), 2),
                             str(e["spurious_expiries"]), grant])
        lines += _table(["leases", "kept by", "renewals/s", "coordinator cores", "etcd cores", "generator cores",
                         "coordinator RSS KiB / 1,000 leases", "keepalive RTT p50 / p99 ms", "RTT p99 ratio",
                         "server cores ratio", "spurious expiries", "grant s"], rows, "llrrrrrrrrrr")
        lines += ["(server cores ratio: coordinator + etcd cores, over etcd's cores when the generator "
                  "renews directly on etcd.)", ""]
        above = [(n, e) for n, row in results["P4"].items() for mode, e in row.items()
                 if mode == "fencepost" and not _err(e) and (e.get("grant_refusals") or e.get("leases", 0) < int(n))]
        if above:
            lines += ["Offered load above capacity: the leases the coordinator admitted (the others refused with "
                      "OVERLOADED, asked again every 1 s until the generator's --grant-seconds), and the keepalive "
                      "round trips of the admitted ones (goal: p99 <= 100 ms, no spurious expiry):", ""]
            lines += _table(["offered", "admitted", "grants refused", "admitted RTT p50 / p99 ms",
                             "spurious expiries", "goal met"],
                            [[_num(int(n), 0), _num(e["leases"], 0), _num(e["grant_refusals"], 0),
                              f"{_num(e['rtt_ms']['p50'], 1)} / {_num(e['rtt_ms']['p99'], 1)}",
                              str(e["spurious_expiries"]),
                              _num((e["rtt_ms"]["p99"] or math.inf) <= 100 and not e["spurious_expiries"])]
                             for n, e in above], "rrrrrl")
        lines += _renewal_floor_lines(results["P4"])
        if "p4-leases.png" in names:
            lines += ["![P4](p4-leases.png)", ""]
    if "P5" in results:
        lines += ["#### P5: take-over after SIGKILL of the holder process, seconds (bound: TTL + 0.5 s)", ""]
        rows = []
        for ttl, row in results["P5"].items():
            for k, e in row.items():
                if _err(e):
                    rows.append([ttl, k, _err(e) or ""] + [""] * 7)
                    continue
                rows.append([ttl, k, _num(e["p50_s"], 3), _num(e["max_s"], 3), _num(e["min_s"], 3),
                             _num(e["bound_s"], 1), _num(e["within_bound"]), _num(e["ratio_p50"], 2),
                             str(e["kills"]), ", ".join(e["holder_ttl_s"])])
        lines += _table(["TTL s", "peer", "p50", "max", "min", "bound", "max within bound", "p50 ratio",
                         "kills", "holder's granted TTL / session timeout"], rows, "rlrrrrrrrl")
        if "p5-takeover.png" in names:
            lines += ["![P5](p5-takeover.png)", ""]
    return "\n".join(lines)


def _floor_lines(results: dict[str, Any]) -> list[str]:
    """The coordinator's CPU per acquire + release of each P1 row against the echo floor (bench/_floor.py)."""
    rows = []
    for key, entry in results.get("floor", {}).items():
        if _err(entry) or not entry:
            rows.append([key, _err(entry) or "no Fencepost peer"] + [""] * 5)
            continue
        stream, unary = entry["echo"]["stream"], entry["echo"]["unary"]
        echo = (f"stream {_num(stream['server_us'], 0)} / unary {_num(unary['server_us'], 0)} server, "
                f"{_num(unary['client_us'], 0)} client")
        for kind, e in entry.items():
            if kind != "echo":
                rows.append([key, kind, _num(e["coordinator_us_per_cycle"], 0), _num(e["floor_us_per_cycle"], 0),
                             _num(e["ratio_to_floor"], 2), echo])
    if not rows:
        return []
    return ["Coordinator CPU per acquire + release against the floor of its messages (a bare grpc.aio echo at "
            "the same load: 2 calls answered, 2 Txns sent to etcd):", ""] + _table(
        ["P1 row", "peer", "coordinator us / cycle", "floor us / cycle", "ratio to floor",
         "echo us per round trip"], rows, "llrrrl")


def _renewal_floor_lines(table: dict[str, Any]) -> list[str]:
    """The coordinator's CPU per renewal of each P4 run through it against the echo floor (bench/_floor.py)."""
    rows = [[_num(int(n), 0), mode, _num(e.get("batch", 1), 0), _num(e["coordinator_us_per_renewal"], 0),
             _num(e["floor_us_per_renewal"], 0), _num(e["ratio_to_floor"], 2), _num(e.get("ratio_to_single"), 2),
             f"{_num(e['echo']['clients']['server_us'], 0)} server, {_num(e['echo']['etcd']['client_us'], 0)} client"]
            for n, row in table.items() for mode, e in row.items() if "coordinator_us_per_renewal" in e]
    if not rows:
        return []
    return ["Coordinator CPU per renewal against the floor of its messages (a bare grpc.aio stream echo at the "
            "run's load: a client message answered, shared by a batch, and a keepalive to etcd):", ""] + _table(
        ["leases", "kept by", "batch", "coordinator us / renewal", "floor us / renewal", "ratio to floor",
         "ratio to batch 1", "echo us per round trip"], rows, "llrrrrrl")


def plot(results: dict[str, Any], out: Path) -> list[Path]:
    """One PNG per figure run into ``out``; returns their paths (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    made: list[Path] = []
    meta = results["meta"]
    note = f"commit {meta['commit']}, {meta['nproc']} cores"

    def save(fig: Any, name: str) -> None:
        for ax in fig.axes:  # a log axis with nothing positive on it (every peer failed) cannot be drawn
            if ax.get_yscale() == "log" and not any(
                    v > 0 for line in ax.lines + [p for c in ax.containers for p in c]
                    for v in (line.get_ydata() if hasattr(line, "get_ydata") else [line.get_height()])
                    if v == v):
                ax.set_yscale("linear")
        fig.text(0.99, 0.01, note, ha="right", va="bottom", fontsize=7, color="grey")
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(out / name)

    if "P1" in results and results["P1"]["distinct"]:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, variant in zip(axes, ("distinct", "contended"), strict=True):
            table = results["P1"][variant]
            if not table:
                ax.set_visible(False)
                continue
            xs = [int(n) for n in table]
            for kind in next(iter(table.values())):
                ys = [table[n].get(kind, {}).get("cycles_per_s", float("nan")) for n in table]
                ax.plot(xs, ys, marker="o", label=kind, linestyle="--" if kind == "etcd-direct" else "-")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(xs, [str(x) for x in xs])
            ax.set_xlabel("concurrent users")
            ax.set_ylabel("cycles/s")
            ax.set_title(f"P1 cycles/s, {'distinct names' if variant == 'distinct' else '8 users per name'}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0].legend(fontsize=8)
        save(fig, "p1-cycles.png")
    if "P2" in results and results["P2"]:
        tables = results["P2"]
        fig, axes = plt.subplots(1, len(tables), figsize=(5.5 * len(tables), 4.2), squeeze=False)
        for ax, (n, table) in zip(axes[0], tables.items(), strict=True):
            kinds = [k for k, e in table.items() if "acquire" in e]
            for j, (op, q, color) in enumerate((("acquire", "p50", "C0"), ("acquire", "p99", "C9"),
                                                ("release", "p50", "C1"), ("release", "p99", "C3"))):
                ax.bar([i + (j - 1.5) * 0.2 for i in range(len(kinds))], [table[k][op][q] for k in kinds], 0.2,
                       label=f"{op} {q}", color=color)
            ax.set_xticks(range(len(kinds)), kinds, rotation=30, ha="right", fontsize=8)
            ax.set_yscale("log")
            ax.set_ylabel("ms")
            ax.set_title(f"P2 latency, {n} users")
            ax.grid(True, axis="y", alpha=0.3)
        axes[0][0].legend(fontsize=8)
        save(fig, "p2-latency.png")
    if "P3" in results and results["P3"]:
        table = {k: e for k, e in results["P3"].items() if "p50_ms" in e}
        fig, ax = plt.subplots(figsize=(7, 4))
        kinds = list(table)
        ax.bar([i - 0.2 for i in range(len(kinds))], [table[k]["p50_ms"] for k in kinds], 0.4, label="p50")
        ax.bar([i + 0.2 for i in range(len(kinds))], [table[k]["p99_ms"] for k in kinds], 0.4, label="p99")
        ax.axhline(5, color="grey", linestyle=":", label="target p99 5 ms")
        ax.set_xticks(range(len(kinds)), kinds, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title("P3 hand-off: release call to the next waiter's grant")
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
        save(fig, "p3-handoff.png")
    if "P4" in results and results["P4"]:
        table = results["P4"]
        ns = [int(n) for n in table]
        fig, axes = plt.subplots(1, 3, figsize=(13, 4))
        for mode, style in (("fencepost", "-"), ("etcd-direct", "--")):
            def get(n: str, *path: str, mode: str = mode) -> float:
                e: Any = table[n].get(mode, {})
                for p in path:
                    e = e.get(p, {}) if isinstance(e, dict) else {}
                return e if isinstance(e, (int, float)) else float("nan")
            if mode == "fencepost":
                axes[0].plot(ns, [get(n, "cores", "coordinator") for n in table], "o-", label="coordinator")
                axes[1].plot(ns, [get(n, "coordinator_rss_kib_per_1000_leases") for n in table], "o-",
                             label="coordinator")
            axes[0].plot(ns, [get(n, "cores", "etcd") for n in table], "s" + style, label=f"etcd ({mode})")
            axes[2].plot(ns, [get(n, "rtt_ms", "p99") for n in table], "o" + style, label=f"{mode} p99")
        axes[0].axhline(0.25, color="grey", linestyle=":", label="target 0.25 core at 10,000")
        for ax, title, unit in zip(axes, ("CPU", "coordinator RSS per 1,000 leases", "keepalive round trip p99"),
                                   ("cores", "KiB", "ms"), strict=True):
            ax.set_xscale("log")
            if unit == "ms":
                ax.set_yscale("log")
            ax.set_xlabel("leases")
            ax.set_ylabel(unit)
            ax.set_title(f"P4 {title}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
        save(fig, "p4-leases.png")
    if "P5" in results and results["P5"]:
        table = results["P5"]
        fig, axes = plt.subplots(1, len(table), figsize=(5.5 * len(table), 4), squeeze=False)
        for ax, (ttl, row) in zip(axes[0], table.items(), strict=True):
            kinds = [k for k, e in row.items() if "p50_s" in e]
            ax.bar([i - 0.2 for i in range(len(kinds))], [row[k]["p50_s"] for k in kinds], 0.4, label="p50")
            ax.bar([i + 0.2 for i in range(len(kinds))], [row[k]["max_s"] for k in kinds], 0.4, label="max")
            ax.axhline(float(ttl) + 0.5, color="red", linestyle=":", label="bound TTL + 0.5 s")
            ax.set_xticks(range(len(kinds)), kinds, rotation=20, ha="right", fontsize=8)
            ax.set_ylabel("seconds from SIGKILL to the next grant")
            ax.set_title(f"P5 take-over, TTL {ttl} s")
            ax.legend(fontsize=8)
            ax.grid(True, axis="y", alpha=0.3)
        save(fig, "p5-takeover.png")
    return made
