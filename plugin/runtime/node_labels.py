"""The node's NVLink fabric clique as a label of its Node object, set through the API server.

Why a second way beside the Node Feature Discovery file (`plugin.sources.fabric_labels`):
a cluster without NFD still wants `nvidia.com/gpu.clique` for its node
selectors and affinities (the name and value GPU Feature Discovery uses, so
selectors written for GFD keep working). The daemon then patches its own Node
(named by NODE_NAME, from the downward API), which needs RBAC `get`/`patch` on
nodes: the chart grants it only when this way is chosen.

Only the label we own is ever written: a JSON merge patch naming that one key
(with `null` to remove it), so labels set by others are untouched and no
read-modify-write race with them exists. The wanted value follows every
topology the source publishes; a background task brings the Node in step and
retries with a doubling delay while the API server cannot be reached or
refuses, so a daemon started before the API server is reachable still labels
its node later. The label stays when the daemon stops: it describes the
hardware, not the daemon.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from allocator.topology import Device

from ..backoff import Backoff
from ..sources.fabric_labels import CLIQUE_LABEL, clique_of

log = logging.getLogger(__name__)

__all__ = ["NodeLabelApi", "NodeLabeller", "connect_node_api"]

#: Not yet known (nothing applied since start): the first wanted value is always sent, removal included.
_UNKNOWN = object()


class NodeLabelApi(Protocol):
    async def patch_node_labels(self, node: str, labels: dict[str, str | None]) -> None: ...
    async def close(self) -> None: ...


async def connect_node_api() -> NodeLabelApi:
    """The API server as `serve`'s DRA driver reaches it: the pod's service account, or KUBECONFIG outside a pod.

    `plugin.kube.client.KubeApi` is one; it raises `plugin.kube.errors.KubeConfigError` naming what is missing,
    and each patch fails with one of `plugin.kube.errors` (the code, reason and message go to the log).
    """
    from ..kube.client import in_cluster_api, kubeconfig_api  # noqa: PLC0415 (lightkube only with --fabric-labels-node)

    if os.environ.get("KUBERNETES_SERVICE_HOST") or not os.environ.get("KUBECONFIG"):
        api = await in_cluster_api()
    else:
        api = await kubeconfig_api(os.environ["KUBECONFIG"])
    return api


class NodeLabeller:
    """Keeps `nvidia.com/gpu.clique` on one Node in step with the GPUs' fabric clique."""

    def __init__(self, node: str, connect: Callable[[], Awaitable[NodeLabelApi]] = connect_node_api,
                 min_backoff_s: float = 0.5, max_backoff_s: float = 30.0):
        self.node = node
        self.connect = connect
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.wanted: str | None = None
        self.applied: object = _UNKNOWN
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def update(self, gpus: Iterable[Device]) -> None:
        """Record the clique these GPUs make (None: no label). Callable from any thread; never blocks."""
        self.wanted, _ = clique_of(gpus)
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def run(self) -> None:
        """Until cancelled: apply every change of the wanted label, retrying failures with backoff."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        api: NodeLabelApi | None = None
        backoff = Backoff(self.min_backoff_s, self.max_backoff_s)
        try:
            while True:
                wanted = self.wanted
                if wanted == self.applied:
                    self._wake.clear()
                    if self.wanted == self.applied:
                        await self._wake.wait()
                    continue
                try:
                    if api is None:
                        api = await self.connect()
                    await api.patch_node_labels(self.node, {CLIQUE_LABEL: wanted})
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - the API server's or the network's failure: retried
                    delay = backoff.next()
                    log.warning("cannot set the node's fabric clique label; retrying",
                                extra={"node": self.node, "reason": f"{type(e).__name__}: {e}", "retry_s": round(delay, 2),
                                       "fix": "check that the API server is reachable and the service account "
                                              "may get and patch nodes (chart: fabricLabels.node)"})
                    await asyncio.sleep(delay)
                    continue
                backoff.reset()
                self.applied = wanted
                if wanted is None:
                    log.info("node fabric clique label removed", extra={"node": self.node, "label": CLIQUE_LABEL})
                else:
                    log.info("node fabric clique label set",
                             extra={"node": self.node, "label": f"{CLIQUE_LABEL}={wanted}"})
        finally:
            if api is not None:
                await api.close()
