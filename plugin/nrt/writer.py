"""Keeps this node's NodeResourceTopology object equal to the wanted one, coalesced.

Why coalesced: a pod's admission calls `Allocate` once per resource and pods
come and go in bursts; a write per change would be many writes per second per
node, and on 1,000 nodes a load the API server notices. So writes are at
least `min_interval_s` (1 s) apart: a change that arrives within a second of
the last write waits for the rest of that second and is sent together with
every change that came meanwhile, so the last state lands within about
`min_interval_s` plus one round trip (the 2 s the issue asks for).

Ownership and coexistence (docs/scheduling.md): at start the writer reads the
object. None: it creates it, labelled `app.kubernetes.io/managed-by:
topo-device-plugin`, owned by the Node (garbage-collected with it). Ours (the
label): it takes it over (a restarted daemon). Anyone else's (NFD's
topology-updater, RTE, a person): it never writes it, says once at start who
manages it, and stays off until restarted; at stop it deletes only an object
it owns. Failures (unreachable server, refusals) are retried with the
project's jittered backoff; a 409 re-reads the object and writes again.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..backoff import Backoff
from .build import MANAGED_BY, MANAGED_BY_LABEL

if TYPE_CHECKING:  # the client (lightkube) is imported only by whoever connects
    from .api import NrtApi

log = logging.getLogger(__name__)

#: Annotation prefix and field managers that mean NFD's topology-updater (or RTE) writes the object.
NFD_ANNOTATION_PREFIX = "nfd.node.kubernetes.io/"
FOREIGN_MANAGERS = ("nfd-topology-updater", "topology-updater", "resource-topology-exporter")


def manager_of(obj: Mapping[str, Any]) -> str | None:
    """Who manages an existing object: None when we do, else a name for the log."""
    meta = obj.get("metadata") or {}
    if (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY:
        return None
    managers = [str(m.get("manager", "")) for m in meta.get("managedFields") or ()]
    if any(k.startswith(NFD_ANNOTATION_PREFIX) for k in meta.get("annotations") or {}) or \
            any(f in m for m in managers for f in FOREIGN_MANAGERS):
        return "NFD's topology-updater (" + (", ".join(sorted(set(managers))) or "its annotations") + ")"
    return "another writer (" + (", ".join(sorted(set(managers))) or "no managedFields") + ")"


class NrtWriter:
    """One node's object: `want()` records the latest state, `run()` writes it, `stop()` cleans up."""

    def __init__(self, node: str, connect: Callable[[], Awaitable[NrtApi]], min_interval_s: float = 1.0,
                 backoff: Backoff | None = None, clock: Callable[[], float] = time.monotonic):
        self.node = node
        self.connect = connect
        self.min_interval_s = min_interval_s
        self.backoff = backoff or Backoff(0.5, 30.0)
        self.clock = clock
        self.wanted: dict[str, Any] | None = None
        self.applied: dict[str, Any] | None = None
        #: The object as the server last returned it (its resourceVersion), None before the first write.
        self.current: dict[str, Any] | None = None
        #: Why we stay off (another manager), else None.
        self.off: str | None = None
        self.writes = 0
        self.owned = False
        self._api: NrtApi | None = None
        self._uid: str | None = None
        self._wake = asyncio.Event()
        self._last_write = float("-inf")

    def want(self, obj: dict[str, Any]) -> None:
        """The state to publish (no resourceVersion, no owner reference: the writer adds them). Never blocks."""
        self.wanted = obj
        self._wake.set()

    async def run(self) -> None:
        """Until cancelled: adopt or create the object, then write every change, at most one per interval."""
        await self._retrying(self._start)
        if self.off is not None:
            return
        while True:
            if self.wanted is None or self.wanted == self.applied:
                self._wake.clear()
                await self._wake.wait()
                continue
            pause = self._last_write + self.min_interval_s - self.clock()
            if pause > 0:  # the coalescing wait: changes arriving meanwhile go in the same write
                await asyncio.sleep(pause)
            await self._retrying(self._write)

    async def _retrying(self, step: Callable[[], Awaitable[None]]) -> None:
        while True:
            try:
                await step()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the API server's or the network's failure: retried
                delay = self.backoff.next()
                log.warning("cannot write the node's NodeResourceTopology; retrying",
                            extra={"node": self.node, "reason": f"{type(e).__name__}: {e}",
                                   "retry_s": round(delay, 2),
                                   "fix": "check that the API server is reachable, the CRD is installed and the "
                                          "service account may write noderesourcetopologies (chart: nrt.enabled)"})
                self.current = None  # re-read before the next write
                await asyncio.sleep(delay)
                continue
            self.backoff.reset()
            return

    async def _start(self) -> None:
        if self._api is None:
            self._api = await self.connect()
        if self._uid is None:
            self._uid = await self._api.node_uid(self.node)
        existing = await self._api.get(self.node)
        if existing is not None:
            who = manager_of(existing)
            if who is not None:
                self.off = who
                log.warning("this node's NodeResourceTopology is managed by someone else: not publishing it",
                            extra={"node": self.node, "manager": who,
                                   "fix": "run one publisher per node: turn off NFD's topology-updater on this "
                                          "node, or --nrt here (docs/scheduling.md, coexistence)"})
                return
            self.owned = True
        self.current = existing
        log.info("publishing the node's NodeResourceTopology", extra={"node": self.node,
                                                                      "adopted": existing is not None})

    async def _write(self) -> None:
        assert self._api is not None and self.wanted is not None
        wanted = self.wanted
        obj = copy.deepcopy(wanted)
        meta = obj.setdefault("metadata", {})
        meta["name"] = self.node
        if self._uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self._uid}]
        if self.current is None:
            self.current = await self._api.get(self.node)
            if self.current is not None and manager_of(self.current) is not None:
                raise RuntimeError(f"the object was taken over by {manager_of(self.current)}")
        self._last_write = self.clock()
        if self.current is None:
            self.current = await self._api.create(obj)
        else:
            meta["resourceVersion"] = (self.current.get("metadata") or {}).get("resourceVersion")
            try:
                self.current = await self._api.replace(obj)
            except Exception:
                self.current = None  # a 409 or a deleted object: read again before the next try
                raise
        self.owned = True
        self.writes += 1
        self.applied = wanted

    async def stop(self, delete: bool = True) -> None:
        """Delete the object when we own it (uninstall, shutdown), then close the client. Never raises."""
        api, self._api = self._api, None
        if api is None:
            return
        try:
            if delete and self.owned and self.off is None:
                await api.delete(self.node)
                log.info("NodeResourceTopology deleted", extra={"node": self.node})
        except Exception as e:  # noqa: BLE001 - shutdown goes on; the owner reference still collects it with the Node
            log.warning("cannot delete the node's NodeResourceTopology at shutdown",
                        extra={"node": self.node, "reason": f"{type(e).__name__}: {e}"})
        finally:
            await api.close()
