"""Scraping a coordinator's ``/metrics`` in tests: over HTTP with ``urllib``, parsed with
``prometheus_client.parser`` into a :class:`Scrape` (each sample by name and labels)."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

LOCKS = "fencepost.v1.LockService"
HEALTH = "grpc.health.v1.Health"


class Scrape:
    """One scrape of ``/metrics``: its families, and each sample by (name, labels)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {f.name: f for f in text_string_to_metric_families(text)}
        self.samples = {(s.name, frozenset(s.labels.items())): s.value
                        for f in self.families.values() for s in f.samples}

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the sample ``name`` with exactly ``labels``; None when there is none."""
        return self.samples.get((name, frozenset(labels.items())))

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """The non-zero samples ``name`` that have ``labels``, by the value of ``label``."""
        out = {}
        for (sample, sample_labels), value in self.samples.items():
            found = dict(sample_labels)
            if sample == name and value and all(found.get(k) == v for k, v in labels.items()):
                out[found[label]] = value
        return out

    def call(self, metric: str, method: str, kind: str = "unary", service: str = LOCKS) -> float | None:
        """A gRPC server counter of one method (started, msg_received, msg_sent, or the handling count)."""
        return self.value(metric, grpc_type=kind, grpc_service=service, grpc_method=method)

    def handled(self, method: str, kind: str = "unary", service: str = LOCKS) -> dict[str, float]:
        """The non-zero ``grpc_server_handled_total`` of one method, by ``grpc_code``."""
        return self.by("grpc_server_handled_total", "grpc_code", grpc_type=kind, grpc_service=service,
                       grpc_method=method)


def get_metrics_text(address: str, query: str = "") -> str:
    """The body of ``GET http://ADDRESS/metrics[QUERY]`` (blocking; fails unless 200 OK)."""
    with urllib.request.urlopen(f"http://{address}/metrics{query}", timeout=5) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


async def scrape(address: str | None, query: str = "") -> Scrape:
    """Scrape ``http://ADDRESS/metrics`` (off the event loop: the coordinator runs on it)."""
    assert address is not None
    return Scrape(await asyncio.to_thread(get_metrics_text, address, query))
