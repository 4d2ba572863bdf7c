"""deploy/ is secure and observed by default: in every deployment file, TLS on every hop (certificates from
cert-manager in Kubernetes, from deploy/certs.py in compose), client certificates and a deny-by-default access
policy on every coordinator reachable from outside its pod, metrics on every coordinator with a scrape that the
NetworkPolicy admits and the alerts' job, and nothing listening in plaintext off loopback without a comment saying
so (tests/deploy_listeners.py reads the listeners)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .deploy_files import (
    COMPOSE,
    DEPLOY,
    KUBE,
    METRICS_PORT,
    compose_file,
    container_env,
    containers,
    is_fencepost,
    load_yaml,
    render,
)
from .deploy_listeners import deployment_files, file_listeners, is_loopback, listeners

OBSERVABILITY = DEPLOY / "observability"
#: Where each overlay's Issuers come from: worker-job runs in the central overlay's namespace.
ISSUERS_FROM = {"central": ["central"], "sidecar": ["sidecar"], "worker-job": ["worker-job", "central"]}
CERT_FILES = ("tls.crt", "tls.key", "ca.crt")


def _docs(overlay: str) -> list[dict[str, Any]]:
    return render(KUBE / "overlays" / overlay)


def _workloads(overlay: str) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod template, container) of every container of an overlay."""
    for doc in _docs(overlay):
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for c in containers(doc["spec"]["template"]["spec"]):
                yield doc["spec"]["template"], c


def _is_coordinator(c: dict[str, Any]) -> bool:
    return is_fencepost(c["image"]) and "serve" in c.get("args", [])


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items()


def _mounted(overlay: str, pod: dict[str, Any], c: dict[str, Any], path: str) -> dict[str, Any]:
    """The Certificate or ConfigMap whose file ``path`` is in container ``c``: mounted as a whole directory."""
    for mount in c.get("volumeMounts", []):
        if path.startswith(mount["mountPath"].rstrip("/") + "/"):
            assert "subPath" not in mount, f"{path}: a subPath mount is never updated in place"
            key = path[len(mount["mountPath"].rstrip("/")) + 1:]
            (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
            if "secret" in volume:
                assert key in CERT_FILES, path
                secret = volume["secret"]["secretName"]
                certs = [d for d in _docs(overlay) if d["kind"] == "Certificate" and d["spec"]["secretName"] == secret]
                assert len(certs) == 1, f"{len(certs)} Certificates make the Secret {secret}"
                cert = certs[0]
                issuers = {d["metadata"]["name"] for o in ISSUERS_FROM[overlay] for d in _docs(o)
                           if d["kind"] == "Issuer"}
                assert cert["spec"]["issuerRef"]["name"] in issuers, cert["metadata"]["name"]
                return cert
            (config,) = [d for d in _docs(overlay) if d["kind"] == "ConfigMap"
                         and d["metadata"]["name"] == volume["configMap"]["name"]]
            assert key in config["data"], path
            return config
    pytest.fail(f"{c['name']}: nothing is mounted at {path}")


def _coordinators() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    for overlay in ("central", "sidecar", "worker-job"):
        for pod, c in _workloads(overlay):
            if _is_coordinator(c):
                yield overlay, pod, c


def _policy(text: str) -> Any:
    from fencepost.coordinator.admission.access import Policy

    return Policy.from_text(text, "yaml")


def _alerts_job() -> str:
    """The one job the alert rules match on."""
    text = (OBSERVABILITY / "alerts.yaml").read_text()
    jobs = set(re.findall(r'job="([^"]+)"', text))
    assert len(jobs) == 1, f"the alerts match several jobs: {jobs}"
    return jobs.pop()


# ---------------------------------------------------------------------------
# Plaintext listeners
# ---------------------------------------------------------------------------


def test_nothing_listens_in_plaintext_off_loopback_without_a_comment() -> None:
    """Every listener of every deployment file that is plaintext and reachable from other hosts (0.0.0.0, ::, a pod
    IP, a name) has a comment at its setting saying "plaintext"."""
    found = listeners()
    assert {p.name for p in deployment_files()} >= {"Dockerfile", "compose.yaml", "deployment.yaml",
                                                   "statefulset.yaml", "billing.yaml"}
    assert len(found) >= 15 and any(x.plaintext and x.reachable for x in found)
    unsaid = [str(x) for x in found if x.plaintext and x.reachable and not x.said]
    assert not unsaid, "plaintext on a non-loopback address, with no comment saying so:\n" + "\n".join(unsaid)


@pytest.mark.parametrize("text, plaintext, said", [
    ("services:\n  a:\n    image: x:1\n    environment:\n      FENCEPOST_LISTEN: 0.0.0.0:7420\n", True, False),
    ("services:\n  a:\n    image: x:1\n    environment:\n      # plaintext: a test\n"
     "      FENCEPOST_LISTEN: 0.0.0.0:7420\n", True, True),
    ("services:\n  a:\n    image: x:1\n    environment:\n      FENCEPOST_LISTEN: 0.0.0.0:7420\n"
     "      FENCEPOST_TLS_CERT: /c.pem\n", False, False),
    ("spec:\n  containers:\n    - name: a\n      image: x:1\n      args: [serve, --metrics-listen, '[::]:9']\n",
     True, False),
    ("spec:\n  containers:\n    - name: a\n      image: x:1\n      env:\n        - name: ETCD_LISTEN_PEER_URLS\n"
     "          value: http://10.0.0.1:2380  # plaintext peers, for a test\n", True, True),
    ("services:\n  db:\n    image: postgres:18.6-bookworm\n", True, False),
])
def test_listener_scan_when_a_file_listens_in_plaintext(tmp_path: Path, text: str, plaintext: bool,
                                                        said: bool) -> None:
    """The scan finds a listener set by a variable, a flag or an image, tells TLS from plaintext, and sees the
    comment only where it is."""
    path = tmp_path / "deploy.yaml"
    path.write_text(text)
    (found,) = file_listeners(path)
    assert (found.plaintext, found.reachable, found.said) == (plaintext, True, said), found


def test_is_loopback() -> None:
    """Loopback addresses and Unix sockets are private to the host; any other address or name is not."""
    assert all(map(is_loopback, ["127.0.0.1:7420", "[::1]:7420", "localhost:1", "https://127.0.0.1:2379",
                                 "unix:/run/f.sock"]))
    assert not any(map(is_loopback, ["0.0.0.0:7420", "[::]:7420", "10.1.2.3:1", "etcd-0.etcd:2379",
                                     "http://0.0.0.0:2381", "$(POD_IP):7420"]))


# ---------------------------------------------------------------------------
# Kubernetes: TLS, policy, metrics
# ---------------------------------------------------------------------------


def test_kubernetes_coordinators_serve_mtls_under_a_policy_or_loopback_only() -> None:
    """A coordinator reachable from outside its pod serves TLS with client certificates required and a policy,
    from a mounted cert-manager Secret and ConfigMap; one on loopback only (the sidecar) says why in a comment."""
    kinds = set()
    for overlay, pod, c in _coordinators():
        env = container_env(c)
        if is_loopback(env["FENCEPOST_LISTEN"]) and is_loopback(env.get("FENCEPOST_HTTP_LISTEN", "127.0.0.1:0")):
            kinds.add("loopback")
            assert "FENCEPOST_TLS_CERT" not in env and "FENCEPOST_POLICY" not in env
            continue
        kinds.add("mtls")
        assert env["FENCEPOST_CLIENT_AUTH"] == "require", overlay
        cert = _mounted(overlay, pod, c, env["FENCEPOST_TLS_CERT"])
        assert _mounted(overlay, pod, c, env["FENCEPOST_TLS_KEY"]) is cert
        assert _mounted(overlay, pod, c, env["FENCEPOST_CLIENT_CA"]) is cert
        assert "server auth" in cert["spec"]["usages"]
        services = [d for d in _docs(overlay) if d["kind"] == "Service" and _selects(
            {"matchLabels": d["spec"]["selector"]}, pod["metadata"]["labels"])]
        assert services
        for svc in services:
            name, namespace = svc["metadata"]["name"], svc["metadata"]["namespace"]
            assert {name, f"{name}.{namespace}.svc"} <= set(cert["spec"]["dnsNames"]), cert["spec"]["dnsNames"]
        policy = _mounted(overlay, pod, c, env["FENCEPOST_POLICY"])
        assert _policy(policy["data"][Path(env["FENCEPOST_POLICY"]).name])
    assert kinds == {"loopback", "mtls"}
    sidecar = (KUBE / "overlays" / "sidecar" / "billing.yaml").read_text()
    assert "no --policy here" in sidecar and "Plaintext on loopback" in sidecar


def test_kubernetes_every_etcd_hop_is_tls_with_client_certificates() -> None:
    """etcd serves clients and peers over https with client certificates required; every coordinator dials https
    with a client certificate; the etcd certificate names every member address dialled."""
    for overlay in ("central", "sidecar"):
        etcd_cert, dialled = None, set()
        for pod, c in _workloads(overlay):
            env = container_env(c)
            if "etcd" in c["image"]:
                for name in ("ETCD_LISTEN_CLIENT_URLS", "ETCD_LISTEN_PEER_URLS", "ETCD_ADVERTISE_CLIENT_URLS",
                             "ETCD_INITIAL_ADVERTISE_PEER_URLS"):
                    assert env[name].startswith("https://"), (overlay, name)
                assert env["ETCD_CLIENT_CERT_AUTH"] == env["ETCD_PEER_CLIENT_CERT_AUTH"] == "true"
                etcd_cert = _mounted(overlay, pod, c, env["ETCD_CERT_FILE"])
                for name in ("ETCD_KEY_FILE", "ETCD_TRUSTED_CA_FILE", "ETCD_PEER_CERT_FILE", "ETCD_PEER_KEY_FILE",
                             "ETCD_PEER_TRUSTED_CA_FILE"):
                    assert _mounted(overlay, pod, c, env[name]) is etcd_cert, name
                assert {"server auth", "client auth"} <= set(etcd_cert["spec"]["usages"])
                peers = [u.split("=", 1)[1] for u in env["ETCD_INITIAL_CLUSTER"].split(",")]
                assert all(u.startswith("https://") for u in peers)
                dialled |= {re.sub(r"^https://|:\d+$", "", u) for u in peers}
            elif "FENCEPOST_ETCD_ENDPOINTS" in env:
                endpoints = env["FENCEPOST_ETCD_ENDPOINTS"].split(",")
                assert all(e.startswith("https://") for e in endpoints), (overlay, endpoints)
                dialled |= {re.sub(r"^https://|:\d+$", "", e) for e in endpoints}
                client = _mounted(overlay, pod, c, env["FENCEPOST_ETCD_CERT"])
                assert _mounted(overlay, pod, c, env["FENCEPOST_ETCD_KEY"]) is client
                assert "client auth" in client["spec"]["usages"]
                assert "ca.crt" in env["FENCEPOST_ETCD_CA"]
        assert etcd_cert and dialled and dialled <= set(etcd_cert["spec"]["dnsNames"]), (overlay, dialled)


def test_kubernetes_clients_use_client_certificates_the_policy_allows() -> None:
    """The worker Job dials the coordinators with its own client certificate, whose identity (its CN) the
    deny-by-default policy allows on its lock, and nobody else."""
    (config,) = [d for d in _docs("central") if d["kind"] == "ConfigMap"
                 and d["metadata"]["name"].startswith("fencepost-policy")]
    policy = _policy(config["data"]["policy.yaml"])
    checked = 0
    for pod, c in _workloads("worker-job"):
        env = container_env(c)
        assert not is_loopback(env["FENCEPOST_ADDRESS"])
        cert = _mounted("worker-job", pod, c, env["FENCEPOST_CERT"])
        assert _mounted("worker-job", pod, c, env["FENCEPOST_KEY"]) is cert
        assert _mounted("worker-job", pod, c, env["FENCEPOST_CA"]) is cert
        assert cert["spec"]["usages"][0] == "client auth" and "dnsNames" not in cert["spec"]
        identity, lock = cert["spec"]["commonName"], c["args"][1]
        assert policy.allows(identity, "acquire", lock) and policy.allows(identity, "release", lock)
        checked += 1
    assert checked == 1
    for action in ("acquire", "release", "describe", "admin"):
        assert not policy.allows("someone-else", action, "invoice-42"), action
        assert not policy.allows(None, action, "invoice-42"), action


def test_kubernetes_every_coordinator_is_scraped_as_the_alerts_job() -> None:
    """Each coordinator listens for metrics on its port "metrics"; a PodMonitor selects its pods on that port
    with the job the alerts match; the NetworkPolicy admits that port from the monitoring namespace only."""
    job = _alerts_job()
    scraped = 0
    for overlay, pod, c in _coordinators():
        env, labels = container_env(c), pod["metadata"]["labels"]
        assert env["FENCEPOST_METRICS_LISTEN"].endswith(f":{METRICS_PORT}"), overlay
        assert {"name": "metrics", "containerPort": METRICS_PORT} in c["ports"]
        (monitor,) = [d for d in _docs(overlay) if d["kind"] == "PodMonitor" and _selects(d["spec"]["selector"],
                                                                                            labels)]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
        relabelled = [r["replacement"] for r in endpoint.get("relabelings", []) if r.get("targetLabel") == "job"]
        by_label = labels.get(monitor["spec"].get("jobLabel", ""))
        assert (relabelled[-1] if relabelled else by_label) == job, overlay
        policies = [d for d in _docs(overlay) if d["kind"] == "NetworkPolicy"
                    and _selects(d["spec"]["podSelector"], labels)]
        admitting = [rule for p in policies for rule in p["spec"].get("ingress", [])
                     if any(port["port"] == METRICS_PORT for port in rule.get("ports", []))]
        assert admitting, f"{overlay}: no NetworkPolicy admits the scrape of {METRICS_PORT}"
        for rule in admitting:
            for peer in rule["from"]:
                assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"], peer
        scraped += 1
    assert scraped == 2


def test_dashboard_and_alerts_read_the_scraped_job() -> None:
    """The alerts match the job "fencepost"; the dashboard's job variable lists the jobs of fencepost metrics and
    every query of a coordinator metric is filtered by it (the guards' metrics come from the applications)."""
    assert _alerts_job() == "fencepost"
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "job"]
    assert re.fullmatch(r"label_values\(fencepost_\w+, job\)", variable["definition"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and all('job=~"$job"' in e for e in exprs if "fencepost_guard_" not in e)


# ---------------------------------------------------------------------------
# Compose: TLS, policy, metrics
# ---------------------------------------------------------------------------


def test_compose_coordinators_serve_mtls_under_the_policy_with_metrics(tmp_path: Path) -> None:
    """Both coordinators serve TLS with client certificates required, the shared deny-by-default policy file,
    etcd over https with a client certificate, and metrics on 7422; the worker's certs.py identity is allowed."""
    services = compose_file()["services"]
    coordinators = [n for n in services if n.startswith("coordinator-")]
    assert len(coordinators) == 2
    for name in coordinators:
        svc = services[name]
        env = svc["environment"]
        assert env["FENCEPOST_TLS_CERT"] == f"/certs/{name}.pem" and env["FENCEPOST_CLIENT_CA"] == "/certs/ca.pem"
        assert env["FENCEPOST_CLIENT_AUTH"] == "require"
        assert env["FENCEPOST_ETCD_CERT"] == f"/certs/{name}.pem"
        assert all(e.startswith("https://") for e in env["FENCEPOST_ETCD_ENDPOINTS"].split(","))
        assert env["FENCEPOST_METRICS_LISTEN"].endswith(f":{METRICS_PORT}")
        (source,) = [v.split(":")[0] for v in svc["volumes"] if v.split(":")[1] == env["FENCEPOST_POLICY"]]
        policy_file = (COMPOSE.parent / source).resolve()
    worker = services["example-worker"]["environment"]
    assert worker["FENCEPOST_CERT"] == "/certs/example-worker.pem" and worker["FENCEPOST_CA"] == "/certs/ca.pem"
    made = subprocess.run([sys.executable, str(DEPLOY / "certs.py"), str(tmp_path), "--client", "example-worker"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    from fencepost.coordinator.admission.identity import identity_of_pem

    identity = identity_of_pem((tmp_path / "example-worker.pem").read_bytes())
    policy = _policy(policy_file.read_text())
    lock = services["example-worker"]["command"][1]
    assert policy.allows(identity, "acquire", lock) and not policy.allows("someone-else", "acquire", lock)
    header = COMPOSE.read_text().split("\nname:")[0]
    assert "certs.py" in header and "--client example-worker" in header


def test_kubernetes_and_compose_share_one_policy_file() -> None:
    """compose mounts the Kubernetes base's policy.yaml: one deny-by-default example, not two."""
    assert load_yaml(KUBE / "base" / "coordinator" / "policy.yaml")["allow"]
    volumes = compose_file()["services"]["coordinator-1"]["volumes"]
    assert "../kubernetes/base/coordinator/policy.yaml:/etc/fencepost/policy.yaml:ro" in volumes
