"""deploy/examples/fenced_write.py, the compose file's example worker: its SQL is the SQL guard's statement, and
its command, run for real under ``fencepost run`` against PostgreSQL, writes fenced."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import REPO, cli_env
from .deploy_files import WORKER_SCRIPT, compose_file, worker_script_in_image


def _load_worker() -> Any:
    spec = importlib.util.spec_from_file_location("fenced_write", WORKER_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_example_worker_uses_the_guards_statement() -> None:
    """The worker's SQL is SqlGuard.upsert's statement: the write and the token check are one statement."""
    from fencepost.client.fencing import upsert_statement

    worker = _load_worker()
    assert worker.UPSERT == upsert_statement(worker.TABLE, "name", ["writer", "ran_at"], placeholder="%s",
                                             dialect="postgresql")
    assert '<= excluded."fencing_token"' in worker.UPSERT


@pytest.fixture(scope="module")
def postgres_dsn() -> Iterator[str]:
    from .fencing.servers import PostgresServer

    server = PostgresServer()
    try:
        server.start()
        yield server.dsn
    finally:
        server.stop()


async def _run(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=REPO, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _stored(dsn: str, name: str) -> int | None:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute('SELECT "fencing_token" FROM "fencepost_example_jobs" WHERE "name" = %s',
                           (name,)).fetchone()
    return None if row is None else int(row[0])


@pytest.mark.slow
async def test_compose_worker_command_writes_fenced(address: str, postgres_dsn: str) -> None:
    """The compose worker's command, run for real: each run writes with its grant's larger token, and the
    script refuses an older token afterwards (exit 1, the row unchanged)."""
    command = compose_file()["services"]["example-worker"]["command"]
    script = worker_script_in_image()
    argv = [str(Path(sys.executable).parent / "fencepost")] + [
        str(WORKER_SCRIPT) if a == script else sys.executable if a == "python" else a for a in command]
    env = {**cli_env(), "FENCEPOST_ADDRESS": address, "DATABASE_URL": postgres_dsn}
    name = command[1]
    tokens = []
    for _ in range(2):
        rc, out, err = await _run(argv, env)
        assert rc == 0, (out, err)
        match = re.search(rf"{name}: written by \S+ with token (\d+)", out)
        assert match, out
        tokens.append(int(match.group(1)))
        assert _stored(postgres_dsn, name) == tokens[-1]
    assert tokens[1] > tokens[0]
    stale = {**env, "FENCEPOST_LOCK": name, "FENCEPOST_TOKEN": str(tokens[0])}
    rc, out, err = await _run([sys.executable, str(WORKER_SCRIPT)], stale)
    assert rc == 1 and f"stored token {tokens[1]}" in err, (rc, out, err)
    assert _stored(postgres_dsn, name) == tokens[1]
