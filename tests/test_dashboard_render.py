"""deploy/observability/render.py, the documented way to redraw docs/img/dashboard.png, runs (issue 26, item 5).

It failed with PERMISSION_DENIED once leases belonged to their granter: its
raw Acquire presented no lease secret. Here its workload runs for a few
seconds on its own etcd and coordinator (matplotlib and the etcd binary are
in the test extra), every panel of dashboard.json is computed from the
scrapes, the ones the workload is there to fill have data, and the PNG is
drawn.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from .conftest import REPO

pytestmark = pytest.mark.slow


def _render() -> ModuleType:
    path = REPO / "deploy" / "observability" / "render.py"
    spec = importlib.util.spec_from_file_location("fencepost_render", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_render_runs_its_workload_and_draws_every_panel(tmp_path: Path) -> None:
    """A 9 s run scraped every 0.5 s: grants, the refusals the workload provokes (LOCK_HELD, STALE_TOKEN,
    LEASE_EXPIRED), expired and revoked holds and the guard's stale writes show; the PNG is drawn."""
    render = _render()
    scrapes = asyncio.run(render.run(9.0, 0.5))
    assert len(scrapes) >= 8
    panels = {title: lines for title, _, lines in render.panels(scrapes, 3.0)}

    def shown(title: str) -> set[str]:
        return {legend for legend, points in panels[title].items() if any(value > 0 for _, value in points)}

    assert {"grants", "releases"} <= shown("Grants, releases and hand-offs")
    assert {"LOCK_HELD", "STALE_TOKEN", "LEASE_EXPIRED"} <= shown("Refusals by reason"), panels["Refusals by reason"]
    assert {"expired", "revoked"} <= shown("Lost holds by reason")
    assert "sqlite" in shown("Stale writes refused by guards")
    assert "PermissionDenied" not in str(panels["gRPC calls by method and code"])
    png = tmp_path / "dashboard.png"
    render.draw(scrapes, 3.0, png)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 50_000
