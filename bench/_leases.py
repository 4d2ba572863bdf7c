"""P4: how many leases one coordinator keeps alive, and at what cost.

For each N and each mode (``fencepost``: through a coordinator;
``etcd-direct``: the same keepalives straight to etcd, the baseline), a fresh
embedded etcd (unless ``--etcd-endpoints``) and, for ``fencepost``, a fresh
coordinator with the per-caller limits off (``--max-leases-per-caller 0
--max-leases 0 --max-lease-grant-rate 0``: the generator is one caller per
connection and grants 50,000 leases as fast as it can). The generator
(``bench/_leasegen.py``) runs in its own process; this side reads the CPU
seconds of the coordinator, etcd and the generator (``/proc/PID/stat``) at
its ``steady`` and ``window-end`` lines, and the coordinator's resident
memory before the leases and at the end.
"""

from __future__ import annotations

import asyncio
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _procs

from fencepost.coordinator.process.embedded import EmbeddedEtcd

GENERATOR = str(Path(__file__).with_name("_leasegen.py"))
#: The coordinator flags of this figure: no per-caller or total lease limit, no LeaseGrant rate limit.
LIMITS_OFF = ["--max-leases-per-caller", "0", "--max-leases", "0", "--max-lease-grant-rate", "0"]  # not --max-lag


async def leases_kept(mode: str, n: int, window: float, ttl: int, endpoint: str | None, coordinator_args: list[str],
                      loop: str, batch: int = 1) -> dict[str, Any]:
    """One run of the generator with ``n`` leases, ``batch`` renewals per message; the figures (see the module docstring)."""
    with tempfile.TemporaryDirectory() as tmp:
        if endpoint is None:
            with EmbeddedEtcd(Path(tmp)) as etcd:
                await asyncio.sleep(0.5)
                return await _run(mode, n, window, ttl, etcd.endpoint, etcd.pid, coordinator_args, loop, batch)
        return await _run(mode, n, window, ttl, endpoint, None, coordinator_args, loop, batch)


async def _run(mode: str, n: int, window: float, ttl: int, endpoint: str, etcd_pid: int | None,
               coordinator_args: list[str], loop: str, batch: int = 1) -> dict[str, Any]:
    coordinator, address = None, ""
    generator, log = None, None
    log_path = Path(tempfile.mkdtemp(prefix="fencepost-p4-")) / "coordinator.log"
    try:
        if mode == "fencepost":
            log = open(log_path, "w")  # noqa: SIM115 - closed in finally
            coordinator, address = _procs.start_coordinator(endpoint, f"/bench/{uuid.uuid4().hex}/", *LIMITS_OFF,
                                                            "--log-format", "json", *coordinator_args, loop=loop,
                                                            stderr=log.fileno())
            await asyncio.sleep(1.0)  # imports done, etcd connected: the resident memory before any lease
        rss_before = _procs.status_kib(coordinator.pid) if coordinator else None
        generator = subprocess.Popen(
            [sys.executable, GENERATOR, "--mode", mode, "--etcd", endpoint, "--leases", str(n), "--ttl", str(ttl),
             "--window", str(window), "--batch", str(batch), *(["--address", address] if address else [])],
            stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert generator.stdout is not None
        pids = {"coordinator": coordinator.pid if coordinator else None, "etcd": etcd_pid,
                "generator": generator.pid}
        marks: dict[str, tuple[float, dict[str, float]]] = {}
        out: dict[str, Any] = {}
        deadline = n / 200 + window + 180  # grants at 200/s at the very least
        while True:
            line = await asyncio.wait_for(asyncio.to_thread(generator.stdout.readline), deadline)
            if not line:
                raise RuntimeError(f"the lease generator ended early (exit {generator.wait()})")
            word = line.split()[0]
            if word in ("steady", "window-end"):
                marks[word] = (time.monotonic(), {k: _procs.cpu_seconds(p) for k, p in pids.items() if p})
                if word == "window-end" and coordinator:
                    out["coordinator_rss_kib"] = _procs.status_kib(coordinator.pid)
                    out["coordinator_hwm_kib"] = _procs.status_kib(coordinator.pid, "VmHWM")
                if word == "window-end" and etcd_pid:
                    out["etcd_rss_kib"] = _procs.status_kib(etcd_pid)
            elif word == "result":
                out.update(json.loads(line.split(" ", 1)[1]))
                break
        (t0, c0), (t1, c1) = marks["steady"], marks["window-end"]
        out["cores"] = {k: round((c1[k] - c0[k]) / (t1 - t0), 3) for k in c1}
        if rss_before is not None:
            out["coordinator_rss_before_kib"] = rss_before
            out["coordinator_rss_kib_per_1000_leases"] = round((out["coordinator_rss_kib"] - rss_before) / n * 1000, 1)
        out["coordinator_args"] = [*LIMITS_OFF, *coordinator_args] if coordinator else []
        if coordinator:
            _procs.stop(coordinator)
            out.update(_warnings(log_path))
        return out
    finally:
        _procs.stop(generator)
        _procs.stop(coordinator)
        if log is not None:
            log.close()
        shutil.rmtree(log_path.parent, ignore_errors=True)


def _warnings(log_path: Path) -> dict[str, Any]:
    """How many WARNING-or-worse lines the coordinator logged, and the most frequent messages (first line)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("WARNING", "ERROR", "CRITICAL"):
            counts[f"{record['level']}: {str(record.get('message', ''))[:120]}"] += 1
    return {"coordinator_warnings": sum(counts.values()), "coordinator_warning_lines": dict(counts.most_common(5))}
