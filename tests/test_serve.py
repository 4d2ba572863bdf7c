"""What keeps two coordinators from stepping on each other: the port and the data directory."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from fencepost.coordinator.embedded import EmbeddedEtcd
from fencepost.coordinator.server import Coordinator

from .conftest import LISTENING, child_env


async def test_start_when_port_is_taken_by_another_coordinator(etcd: EmbeddedEtcd, prefix: str) -> None:
    """A second coordinator on a bound port fails to start (no SO_REUSEPORT sharing of the port)."""
    first = Coordinator([etcd.endpoint], listen="127.0.0.1:0", prefix=prefix)
    port = await first.start()
    try:
        second = Coordinator([etcd.endpoint], listen=f"127.0.0.1:{port}", prefix=prefix)
        with pytest.raises(RuntimeError, match="cannot listen"):
            await second.start()
        await second.stop(0)
    finally:
        await first.stop(0)


def test_serve_when_data_dir_is_in_use(tmp_path: Path) -> None:
    """A second `fencepost serve` on the same data directory exits 1 at once, naming the directory."""
    argv = [sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
            "--data-dir", str(tmp_path)]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    try:
        assert first.stdout is not None
        deadline = time.monotonic() + 30
        for line in first.stdout:
            if LISTENING.search(line) or time.monotonic() > deadline:
                break
        started = time.monotonic()
        second = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=child_env())
        assert second.returncode == 1
        assert "in use by another fencepost serve" in second.stderr
        assert str(tmp_path) in second.stderr
        assert time.monotonic() - started < 5
    finally:
        first.terminate()
        first.communicate(timeout=30)


@pytest.mark.parametrize("grace", ["-3", "nan", "4000"])
def test_serve_when_grace_seconds_is_out_of_range(grace: str) -> None:
    """`fencepost serve` refuses a negative, NaN or huge --grace-seconds with exit 2, before starting anything."""
    result = subprocess.run([sys.executable, "-m", "fencepost.client.cli", "serve", "--grace-seconds", grace],
                            capture_output=True, text=True, timeout=30, env=child_env())
    assert result.returncode == 2
    assert "--grace-seconds" in result.stderr
