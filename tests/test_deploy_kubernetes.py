"""deploy/kubernetes: every manifest and rendered overlay validates strictly for each Kubernetes version from
1.29 on, and the overlays keep what they promise (native sidecars, probes on the health ports, non-root
containers, disruption budgets, etcd endpoints by name, pinned images)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .conftest import REPO
from .deploy_files import (
    BASES,
    COORDINATOR_PORT,
    HEALTH_PORT,
    HTTP_PORT,
    KUBE,
    MIN_ETCD,
    OVERLAYS,
    all_rendered,
    assert_tool_passes,
    compose_file,
    container_env,
    containers,
    images,
    is_fencepost,
    kubernetes_versions,
    pod_specs,
    render,
    tool_path,
    version_tuple,
)


@pytest.fixture(scope="module")
def rendered_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Every base and overlay rendered by kustomize, one file each, plus every plain manifest."""
    out = tmp_path_factory.mktemp("rendered")
    files = []
    for kind, names in (("base", BASES), ("overlays", OVERLAYS)):
        for name in names:
            path = out / f"{kind}-{name}.yaml"
            path.write_text(yaml.safe_dump_all(render(KUBE / kind / name)))
            files.append(str(path))
    # Every manifest: not the kustomizations, nor the policy file that a ConfigMap is generated from.
    files += [str(p) for p in sorted(KUBE.rglob("*.yaml")) if "apiVersion" in next(yaml.safe_load_all(p.read_text()))
              and p.name != "kustomization.yaml"]
    return files


@pytest.mark.parametrize("version", kubernetes_versions())
def test_kubernetes_manifests_validate(rendered_files: list[str], version: str) -> None:
    """Every manifest and rendered overlay validates strictly for this Kubernetes version. kubernetes-validate has
    no schema for the custom resources (cert-manager's Certificate and Issuer, the Prometheus Operator's
    PodMonitor): it warns and skips them; tests/test_deploy_security.py checks what they must say."""
    assert_tool_passes([tool_path("kubernetes-validate"), "--strict", "--quiet", "-k", version, *rendered_files])


def test_overlays_render_what_they_promise() -> None:
    """central: etcd and coordinators; sidecar: etcd and the app; worker-job: the Job; all namespaced."""
    kinds = {o: {(d["kind"], d["metadata"]["name"]) for d in render(KUBE / "overlays" / o)} for o in OVERLAYS}
    assert {("StatefulSet", "etcd"), ("Service", "etcd"), ("Service", "etcd-client"), ("PodDisruptionBudget", "etcd"),
            ("Deployment", "fencepost"), ("Service", "fencepost"), ("PodDisruptionBudget", "fencepost"),
            ("NetworkPolicy", "fencepost")} <= kinds["central"]
    assert {("StatefulSet", "etcd"), ("Deployment", "billing")} <= kinds["sidecar"]
    assert not any(k == "Deployment" and n == "fencepost" for k, n in kinds["sidecar"])
    assert kinds["worker-job"] == {("Job", "fencepost-example-worker"), ("Certificate", "example-worker-tls")}
    for overlay, doc in all_rendered():
        assert doc["metadata"].get("namespace"), f"{overlay}: {doc['kind']}/{doc['metadata']['name']} has no namespace"


def test_sidecar_is_a_native_sidecar_on_localhost() -> None:
    """The coordinator is an init container with restartPolicy Always, on 127.0.0.1 (gRPC and HTTP), with its own
    etcd user."""
    (spec,) = [s for where, s in pod_specs() if where == "sidecar/Deployment/billing"]
    (sidecar,) = [c for c in spec["initContainers"] if is_fencepost(c["image"])]
    assert sidecar.get("restartPolicy") == "Always"
    assert sidecar["args"] == ["serve"]
    env = container_env(sidecar)
    assert env["FENCEPOST_LISTEN"] == f"127.0.0.1:{COORDINATOR_PORT}"
    assert env["FENCEPOST_HEALTH_LISTEN"] == f"0.0.0.0:{HEALTH_PORT}"
    assert env["FENCEPOST_HTTP_LISTEN"] == f"127.0.0.1:{HTTP_PORT}"  # the HTTP/JSON API, inside the pod only
    assert env["FENCEPOST_ETCD_USER"] and env["FENCEPOST_PREFIX"] != "/fencepost/locks/"
    mounts = {m["mountPath"]: m["name"] for m in sidecar["volumeMounts"]}
    secret_dir = str(Path(env["FENCEPOST_ETCD_PASSWORD_FILE"]).parent)
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "secret" in volumes[mounts[secret_dir]]
    for app in spec["containers"]:
        assert container_env(app)["FENCEPOST_ADDRESS"] == env["FENCEPOST_LISTEN"]


def test_every_probe_targets_a_health_port() -> None:
    """Coordinator probes are gRPC on 7421; etcd probes hit its metrics listener (/livez, /readyz)."""
    probed = 0
    for where, spec in pod_specs():
        for c in containers(spec):
            probes = [c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe") if p in c]
            named = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
            if is_fencepost(c["image"]) and "serve" in c.get("args", []):
                assert len(probes) == 3, f"{where}/{c['name']}: startup, readiness and liveness probes"
                assert all(p["grpc"]["port"] == HEALTH_PORT for p in probes), where
                # Startup and liveness ask for the process's own health (an etcd outage must not
                # restart coordinators); readiness follows etcd.
                assert c["startupProbe"]["grpc"].get("service") == "liveness", where
                assert c["livenessProbe"]["grpc"].get("service") == "liveness", where
                assert c["readinessProbe"]["grpc"].get("service", "") in ("", "fencepost.v1.LockService"), where
                assert container_env(c)["FENCEPOST_HEALTH_LISTEN"].endswith(f":{HEALTH_PORT}")
            elif "etcd" in c["image"]:
                metrics = container_env(c)["ETCD_LISTEN_METRICS_URLS"]
                assert probes and all(p["httpGet"]["path"] in ("/livez", "/readyz") for p in probes)
                assert all(metrics.endswith(f":{named[p['httpGet']['port']]}") for p in probes), where
            else:
                assert not probes, f"{where}/{c['name']}: a probe on a container that serves nothing"
            probed += len(probes)
    assert probed >= 9


def test_no_container_runs_as_root() -> None:
    """Every container: runAsNonRoot, a non-zero user, no privilege escalation, read-only root, no capabilities."""
    for where, spec in pod_specs():
        pod = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, where
        for c in containers(spec):
            sc = {**pod, **c.get("securityContext", {})}
            assert sc.get("runAsNonRoot") is True, f"{where}/{c['name']}"
            assert isinstance(sc.get("runAsUser"), int) and sc["runAsUser"] != 0, f"{where}/{c['name']}"
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where}/{c['name']}"
            assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}/{c['name']}"
            assert c["resources"]["requests"] and c["resources"]["limits"], f"{where}/{c['name']}"


def test_coordinator_deployment_survives_disruption() -> None:
    """2 replicas, one at a time, spread over nodes; the PDB and NetworkPolicy select its pods."""
    docs = render(KUBE / "overlays" / "central")
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
        docs = render(KUBE / "overlays" / overlay)
        (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
        headless = sts["spec"]["serviceName"]
        (svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == headless]
        assert svc["spec"]["clusterIP"] == "None"
        names = [f"https://{sts['metadata']['name']}-{i}.{headless}:2379" for i in range(sts["spec"]["replicas"])]
        endpoints = [container_env(c)["FENCEPOST_ETCD_ENDPOINTS"] for _, spec in pod_specs() for c in containers(spec)
                     if "FENCEPOST_ETCD_ENDPOINTS" in container_env(c)]
        assert endpoints
        for value in endpoints:
            assert value.split(",") == names
    services = compose_file()["services"]
    for name, svc in services.items():
        value = svc.get("environment", {}).get("FENCEPOST_ETCD_ENDPOINTS")
        if value:
            assert all(e.removeprefix("https://").split(":")[0] in services for e in value.split(",")), (name, value)


def test_images_are_pinned_and_etcd_is_one_current_release() -> None:
    """Every image has an exact version tag; etcd is one release everywhere, at least 3.5.13."""
    etcd_images = set()
    for where, image in images():
        name, _, tag = image.rpartition(":")
        assert name and tag != "latest" and "/" not in tag, f"{where}: {image} has no pinned tag"
        version_tuple(tag)
        if name.endswith("/etcd"):
            etcd_images.add(image)
    assert len(etcd_images) == 1, f"compose and Kubernetes disagree on etcd: {etcd_images}"
    (etcd,) = etcd_images
    assert etcd.split(":")[0] in ("gcr.io/etcd-development/etcd", "quay.io/coreos/etcd")
    version = version_tuple(etcd.rpartition(":")[2])
    assert len(version) == 3 and version >= MIN_ETCD, etcd
    docs = (REPO / "docs" / "deploy.md").read_text()
    assert f"`{etcd}`" in docs and "3.5.13" in docs, "docs/deploy.md names another etcd release"
