"""The daemon's Prometheus metrics.

Why: none of the NIC plugins and few GPU plugins export anything, so
operators cannot see registrations, kubelet restarts or allocation quality.
The HTTP endpoint that serves them (with `/healthz` and `/readyz`) is
plugin/observability/health_endpoint.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class Metrics:
    """All metrics of one daemon, in a registry of its own (tests run several daemons)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.devices = Gauge("topo_dp_devices", "Devices advertised, by resource and health",
                             ["resource", "health"], registry=r)
        self.registrations = Counter("topo_dp_registrations_total", "Successful Register calls to the kubelet",
                                     ["resource"], registry=r)
        self.registration_failures = Counter("topo_dp_registration_failures_total",
                                             "Failed Register calls to the kubelet", ["resource"], registry=r)
        self.kubelet_restarts = Counter("topo_dp_kubelet_restarts_total",
                                        "kubelet.sock re-creations seen (kubelet restarts)", registry=r)
        self.rpcs = Counter("topo_dp_rpcs_total", "RPCs received", ["method", "resource"], registry=r)
        self.rpc_errors = Counter("topo_dp_rpc_errors_total", "RPCs rejected", ["method", "resource", "code"],
                                  registry=r)
        self.preferred_seconds = Histogram(
            "topo_dp_preferred_allocation_seconds", "Time to compute a preferred allocation", ["resource"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5), registry=r)
        self.preferred_where = Counter(
            "topo_dp_preferred_allocation_searches_total", "Preferred-allocation searches by where they ran: "
            "loop (provably cheap, answered on the event loop) or pool (the search threads)",
            ["resource", "where"], registry=r)
        self.not_optimal = Counter("topo_dp_preferred_allocation_not_optimal_total",
                                   "Preferred allocations returned before optimality was proven", ["resource"],
                                   registry=r)
        self.allocated_devices = Counter("topo_dp_allocated_devices_total", "Devices handed out by Allocate",
                                         ["resource"], registry=r)
        self.topology_updates = Counter("topo_dp_topology_updates_total", "Topology changes applied", registry=r)
        self.pairs = Counter("topo_dp_pairs_total", "GPU-NIC pairs containers got, by the resource whose "
                             "Allocate completed them", ["resource"], registry=r)
        self.pair_links = Counter("topo_dp_pair_links_total", "Link type between each paired GPU and its NIC",
                                  ["link"], registry=r)
        self.http_connections_dropped = Counter(
            "topo_dp_http_connections_dropped_total",
            "HTTP endpoint connections cut: timeout (request or response too slow), evicted (the oldest "
            "idle one, to admit a new one at the cap), full (every connection busy), bad_request",
            ["reason"], registry=r)
        self.gpu_action = Gauge("topo_dp_gpu_required_action",
                                "1 for each GPU's current required action (none, reset GPU, restart node, "
                                "contact support); the reason is in the log and the DRA device status",
                                ["gpu", "action"], registry=r)
        #: Where the XID counts come from at scrape time ({(gpu, xid, bucket): count}); None: no GPU health.
        self.xid_source: Callable[[], Mapping[tuple[str, int, str], int]] | None = None
        r.register(_XidCollector(self))
        self._gpu_actions: dict[str, str] = {}
        self.heartbeat = time.monotonic()
        #: (metric, label values) -> child: `labels()` takes a lock and rebuilds the key on every call,
        #: a tenth of an empty RPC's server time; the per-request metrics look their child up here.
        self._children: dict[tuple, Any] = {}

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def rpc(self, method: str, resource: str) -> None:
        self._child(self.rpcs, method, resource).inc()

    def rpc_error(self, method: str, resource: str, code: str) -> None:
        self.rpc_errors.labels(method, resource, code).inc()

    def preferred(self, resource: str, seconds: float, optimal: bool, where: str = "pool") -> None:
        self._child(self.preferred_seconds, resource).observe(seconds)
        self._child(self.preferred_where, resource, where).inc()
        if not optimal:
            self.not_optimal.labels(resource).inc()

    def allocated(self, resource: str, n: int) -> None:
        self.allocated_devices.labels(resource).inc(n)

    def paired(self, resource: str, links: list[str]) -> None:
        """Pairs one `Allocate` completed, by their link types (PIX, PXB, PHB, NODE, SYS)."""
        if links:
            self.pairs.labels(resource).inc(len(links))
            for link in links:
                self.pair_links.labels(link).inc()

    def set_devices(self, resource: str, healthy: int, unhealthy: int) -> None:
        self.devices.labels(resource, "Healthy").set(healthy)
        self.devices.labels(resource, "Unhealthy").set(unhealthy)

    def set_gpu_actions(self, actions: Mapping[str, str]) -> None:
        """{gpu: required action}: one series per GPU at 1, the GPU's former action's series removed."""
        for gpu, old in list(self._gpu_actions.items()):
            if actions.get(gpu) != old:
                self.gpu_action.remove(gpu, old)
                del self._gpu_actions[gpu]
        for gpu, action in actions.items():
            if gpu not in self._gpu_actions:
                self.gpu_action.labels(gpu, action).set(1)
                self._gpu_actions[gpu] = action

    def http_dropped(self, reason: str) -> None:
        self.http_connections_dropped.labels(reason).inc()

    def beat(self) -> None:
        self.heartbeat = time.monotonic()


class _XidCollector(Collector):
    """`topo_dp_gpu_xids_total{gpu, xid, bucket}`, read from the GPU health monitor at scrape time.

    Why a collector: the counts live in the monitor thread (bounded: GPUs × XIDs); copying them
    into a Counter on every event of a storm would cost the monitor a lock per event."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily("topo_dp_gpu_xids", "XID events seen per GPU, with the catalog bucket "
                                     "that decided them", labels=["gpu", "xid", "bucket"])
        source = self.metrics.xid_source
        counts = source() if source is not None else {}
        for (gpu, xid, bucket), n in sorted(counts.items()):
            family.add_metric([gpu, str(xid), bucket], n)
        yield family
