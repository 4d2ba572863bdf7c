"""What the shipped deployment files listen on: every listening address that the Dockerfile, the compose files and
the Kubernetes manifests set, whether it is plaintext and off loopback, and whether a comment at the setting says
"plaintext" (tests/test_deploy_security.py).

A setting is a listener when it is one of :data:`FENCEPOST_LISTENERS` or :data:`ETCD_LISTENERS` (as a variable, or
as the matching ``fencepost serve`` flag in a container's args), or an image that listens by itself
(:data:`IMAGE_LISTENERS`). Plaintext: a coordinator's API ports without ``FENCEPOST_TLS_CERT``, its health and
metrics ports always, an etcd URL of scheme ``http``, an image listener without its TLS switch. Loopback:
``127.0.0.0/8``, ``::1``, ``localhost`` or a Unix socket; anything else (``0.0.0.0``, ``::``, a pod IP, a name) is
reachable from other hosts. The comment is the block of ``#`` lines right above the setting's first line, or one at
the end of one of its lines.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dockerfile
import yaml

from .deploy_files import DEPLOY, DOCKERFILE

__all__ = ["Listener", "deployment_files", "file_listeners", "is_loopback", "listeners"]

#: The coordinator's listening variables -> (its flag, whether its TLS follows --tls-cert; else always plaintext).
FENCEPOST_LISTENERS = {
    "FENCEPOST_LISTEN": ("--listen", True),
    "FENCEPOST_HTTP_LISTEN": ("--http-listen", True),
    "FENCEPOST_HEALTH_LISTEN": ("--health-listen", False),
    "FENCEPOST_METRICS_LISTEN": ("--metrics-listen", False),
}
#: etcd's listening variables (comma-separated URLs; https is TLS).
ETCD_LISTENERS = ("ETCD_LISTEN_CLIENT_URLS", "ETCD_LISTEN_PEER_URLS", "ETCD_LISTEN_METRICS_URLS",
                  "ETCD_LISTEN_CLIENT_HTTP_URLS")
#: Images that listen without being told -> (address, the argument that turns TLS on).
IMAGE_LISTENERS = {"postgres": ("0.0.0.0:5432", "ssl=on")}
PLAINTEXT_WORD = re.compile(r"\bplaintext\b", re.IGNORECASE)


@dataclass(frozen=True)
class Listener:
    """One listening address set in one file: ``setting`` (a variable, a flag, or ``image``) at 1-based ``line``."""

    path: Path
    line: int
    setting: str
    address: str
    plaintext: bool
    said: bool

    @property
    def reachable(self) -> bool:
        """Whether other hosts (or pods, or containers) can connect: not loopback, not a Unix socket."""
        return not is_loopback(self.address)

    def __str__(self) -> str:
        path = self.path.relative_to(DEPLOY.parent) if self.path.is_relative_to(DEPLOY.parent) else self.path
        return f"{path}:{self.line}: {self.setting}={self.address}"


def is_loopback(address: str) -> bool:
    """Whether ``HOST:PORT``, ``[HOST]:PORT``, a URL or ``unix:PATH`` is reachable from this host only."""
    if address.startswith("unix:"):
        return True
    host = urlsplit(address).hostname if "://" in address else address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def deployment_files() -> list[Path]:
    """Every shipped deployment file: the Dockerfile and each YAML file under deploy/."""
    return [DOCKERFILE, *sorted(DEPLOY.rglob("*.yaml"))]


def listeners() -> list[Listener]:
    """Every listener of every deployment file."""
    return [listener for path in deployment_files() for listener in file_listeners(path)]


def file_listeners(path: Path) -> list[Listener]:
    """The listeners of one deployment file: a Dockerfile (by its name) or a YAML file."""
    return _dockerfile_listeners(path) if path.name.startswith("Dockerfile") else _yaml_listeners(path)


def _said(lines: list[str], first: int, last: int) -> bool:
    """Whether the comment block right above 0-based line ``first``, or a comment ending a line of first..last,
    says plaintext."""
    comment = [line.partition("#")[2] for line in lines[first:last + 1] if " #" in line]
    at = first - 1
    while at >= 0 and lines[at].strip().startswith("#"):
        comment.append(lines[at])
        at -= 1
    return bool(PLAINTEXT_WORD.search(" ".join(comment)))


def _workload_listeners(env: dict[str, str], argv: list[str], image: str) -> Iterator[tuple[str, str, bool]]:
    """(setting, address, plaintext) of one container or compose service."""
    flags = dict(_flag_values(argv))
    tls = bool(env.get("FENCEPOST_TLS_CERT") or flags.get("--tls-cert"))
    for name, (flag, follows_tls) in FENCEPOST_LISTENERS.items():
        for setting, value in ((name, env.get(name)), (flag, flags.get(flag))):
            if value:
                yield setting, value, not (follows_tls and tls)
    for name in ETCD_LISTENERS:
        for url in filter(None, str(env.get(name, "")).split(",")):
            yield name, url, urlsplit(url).scheme not in ("https", "unixs")
    base = image.rpartition(":")[0].rsplit("/", 1)[-1] if ":" in image else image
    if base in IMAGE_LISTENERS:
        address, switch = IMAGE_LISTENERS[base]
        yield "image", image, not any(switch in a for a in argv)


def _flag_values(argv: list[str]) -> Iterator[tuple[str, str]]:
    for i, arg in enumerate(argv):
        if arg.startswith("--") and "=" in arg:
            yield tuple(arg.split("=", 1))  # type: ignore[misc]
        elif arg.startswith("--") and i + 1 < len(argv):
            yield arg, argv[i + 1]


def _workloads(doc: Any) -> Iterator[tuple[dict[str, str], list[str], str]]:
    """(env, argv, image) of each Kubernetes container and compose service in a loaded YAML document."""
    if isinstance(doc, dict) and isinstance(doc.get("services"), dict):
        for svc in doc["services"].values():
            env = svc.get("environment") or {}
            command = svc.get("command") or []
            yield {k: str(v) for k, v in env.items()}, [str(a) for a in command], str(svc.get("image", ""))
        return
    if isinstance(doc, dict):
        for key in ("containers", "initContainers"):
            for c in doc.get(key) or []:
                env = {e["name"]: str(e["value"]) for e in c.get("env", []) if "value" in e}
                yield env, [str(a) for a in c.get("command", []) + c.get("args", [])], str(c.get("image", ""))
        for value in doc.values():
            yield from _workloads(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _workloads(value)


def _definitions(node: yaml.Node) -> Iterator[tuple[str, str, int, int]]:
    """(setting, value, first line, last line), 0-based, of every setting in a composed YAML node tree: mapping
    pairs, Kubernetes env items (``name``/``value``) and flags in sequences of strings."""
    if isinstance(node, yaml.MappingNode):
        pairs = {k.value: v for k, v in node.value if isinstance(k, yaml.ScalarNode)}
        if isinstance(pairs.get("name"), yaml.ScalarNode) and isinstance(pairs.get("value"), yaml.ScalarNode):
            yield pairs["name"].value, pairs["value"].value, node.start_mark.line, pairs["value"].end_mark.line
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and isinstance(v, yaml.ScalarNode):
                yield k.value, v.value, k.start_mark.line, v.end_mark.line
            yield from _definitions(v)
    elif isinstance(node, yaml.SequenceNode):
        scalars = [n.value if isinstance(n, yaml.ScalarNode) else None for n in node.value]
        for i, n in enumerate(node.value):
            if isinstance(n, yaml.ScalarNode) and n.value.startswith("--") and "=" in n.value:
                flag, value = n.value.split("=", 1)
                yield flag, value, n.start_mark.line, n.end_mark.line
            elif isinstance(n, yaml.ScalarNode) and n.value.startswith("--") and i + 1 < len(scalars):
                yield n.value, str(scalars[i + 1]), n.start_mark.line, node.value[i + 1].end_mark.line
            yield from _definitions(n)


def _yaml_listeners(path: Path) -> list[Listener]:
    text = path.read_text()
    lines = text.splitlines()
    definitions: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for root in yaml.compose_all(text):
        for setting, value, first, last in _definitions(root) if root is not None else ():
            definitions.setdefault((setting, value), []).append((first, last))
    found = set()
    for doc in yaml.safe_load_all(text):
        for env, argv, image in _workloads(doc):
            for setting, address, plaintext in _workload_listeners(env, argv, image):
                value = image if setting == "image" else env.get(setting) or dict(_flag_values(argv))[setting]
                where = definitions.get((setting, value))
                assert where, f"{path}: {setting}={value} set but not found in the file's nodes"
                for first, last in where:
                    found.add(Listener(path, first + 1, setting, address, plaintext, _said(lines, first, last)))
    return sorted(found, key=lambda x: (x.line, x.address))


def _dockerfile_listeners(path: Path) -> list[Listener]:
    lines = path.read_text().splitlines()
    found = []
    env: dict[str, tuple[str, int, int]] = {}
    for command in dockerfile.parse_file(str(path)):
        if command.cmd == "FROM":
            env = {}
        if command.cmd == "ENV":
            for name, value in zip(command.value[::2], command.value[1::2]):
                env[name] = (value, command.start_line - 1, command.end_line - 1)
        if command.cmd == "ENTRYPOINT" and list(command.value) == ["fencepost"]:
            values = {name: value for name, (value, _, _) in env.items()}
            for setting, address, plaintext in _workload_listeners(values, [], ""):
                _, first, last = env[setting]
                found.append(Listener(path, first + 1, setting, address, plaintext, _said(lines, first, last)))
    return found
