"""What the READMEs tell a newcomer to run works as written (issue 26, item 5).

- Every ```python block of README.md runs, as a script in a fresh
  interpreter and an empty directory, against a real coordinator (the
  documented address 127.0.0.1:7420 replaced by the test coordinator's).
- deploy/local/README.md asks for no ``pip install`` of a package the
  ``coordinator`` extra already installs.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import sys
import tomllib
from pathlib import Path

from .child_processes import cli_env
from .conftest import REPO

#: The address the README's snippets connect to (``fencepost serve``'s default).
DOCUMENTED_ADDRESS = "127.0.0.1:7420"


def python_blocks(markdown: str) -> list[str]:
    """The ```python fenced blocks of ``markdown``, in order."""
    return re.findall(r"^```python\n(.*?)^```", markdown, re.M | re.S)


def test_python_blocks_finds_the_fenced_blocks() -> None:
    """Only ```python blocks, whole, in order."""
    text = "```sh\nx\n```\n```python\na = 1\nb = 2\n```\ntext\n```python\nc = 3\n```\n"
    assert python_blocks(text) == ["a = 1\nb = 2\n", "c = 3\n"]


async def test_readme_python_snippets_run_against_a_coordinator(address: str, tmp_path: Path) -> None:
    """Each snippet exits 0 with nothing on stderr; the fenced write's row holds its token."""
    blocks = python_blocks((REPO / "README.md").read_text())
    assert blocks, "README.md has no python block"
    for i, block in enumerate(blocks):
        assert DOCUMENTED_ADDRESS in block, block
        script = tmp_path / f"readme_{i}.py"
        script.write_text(block.replace(DOCUMENTED_ADDRESS, address))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), cwd=tmp_path, env=cli_env(), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0 and not err, (block, out.decode(), err.decode())
    with sqlite3.connect(tmp_path / "shop.db") as db:
        (total, token), = db.execute("SELECT total, fencing_token FROM invoices WHERE id = 42").fetchall()
    assert total == 1250 and token > 0


def test_deploy_local_readme_installs_nothing_the_coordinator_extra_has() -> None:
    """No `pip install NAME` in deploy/local/README.md names a package of the coordinator extra."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    coordinator = {re.split(r"[<>=!~\[ ;]", spec, maxsplit=1)[0].lower() for spec in extras["coordinator"]}
    assert "cryptography" in coordinator
    text = (REPO / "deploy" / "local" / "README.md").read_text()
    asked = {word.lower() for command in re.findall(r"pip install ([^`\n]*)", text) for word in command.split()
             if not word.startswith(("-", '"', "'", "."))}
    assert not asked & coordinator, asked & coordinator
