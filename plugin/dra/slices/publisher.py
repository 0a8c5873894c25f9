"""Keeps this node's ResourceSlices in the API server equal to what the topology says.

How the pool is kept consistent (resource.k8s.io/v1 ResourcePool):
- all slices of the node's pool carry the same `pool.generation` and
  `pool.resourceSliceCount`; when anything in the pool changes, every slice is
  rewritten with generation + 1 (one more than the highest generation found,
  so a restarted driver never goes backwards), extra slices are deleted;
- nothing is written when the published slices already say what we would say,
  so restarts and resyncs do not churn generations;
- updates are PUTs with the resourceVersion just read: a concurrent writer (the
  other instance during a rolling update) gets 409 Conflict and the next pass
  starts from a fresh list.

Why a periodic resync besides explicit triggers: the kubelet deletes all
ResourceSlices of its node when it starts, and those of a driver whose plugin
stayed unreachable for a while; a driver that only wrote on topology changes
would stay invisible until the next hot-plug. Every pass is cheap (one list).

Why passes are spaced (`min_interval_s`, 1 s): a GPU flapping healthy/unhealthy
every 100 ms, or a NIC hot-plug storm, would otherwise rewrite the pool (and
wake every scheduler watching slices) ten times a second per node. Changes
only mark the pool dirty; a pass starts no sooner than `min_interval_s` after
the previous one began and always builds from the latest topology, so a burst
costs about one write per second and its final state is published within
`min_interval_s` (plus one pass) of the last change: the trailing pass.

Device health: see plugin/dra/slices/build.py. If the API server drops the taints
we send (DRADeviceTaints off, e.g. Kubernetes 1.34), unhealthy devices would
look healthy; the publisher notices the dropped field in the server's answer,
logs it once and republishes with unhealthy devices removed instead.

A failed pass is retried after a jittered delay (plugin.backoff: ceilings 2, 4,
8 ... s up to `max_backoff_s`), so the nodes of a cluster whose API server
failed for all of them at once do not come back to it in step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import replace
from typing import Any

from allocator.topology import NodeTopology

from ...backoff import Backoff
from ...watch.event_wait import wait_event
from .build import SliceOptions, build_resource_slices

log = logging.getLogger(__name__)

#: The first failed pass's retry ceiling (it doubles with each failure in a row, up to `max_backoff_s`).
FIRST_RETRY_S = 2.0


def _normalized(obj: Any) -> Any:
    """Drop empty values and server-set taint times, so server answers compare with what we built."""
    if isinstance(obj, dict):
        out = {k: _normalized(v) for k, v in obj.items() if k != "timeAdded"}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(obj, list):
        return [_normalized(v) for v in obj]
    return obj


def _comparable(s: dict[str, Any]) -> Any:
    spec = dict(s.get("spec", {}))
    spec["pool"] = {k: v for k, v in spec.get("pool", {}).items() if k != "generation"}
    meta = s.get("metadata", {})
    return _normalized({"spec": spec, "ownerReferences": meta.get("ownerReferences"),
                        "labels": meta.get("labels")})


def _sent_taints(s: dict[str, Any]) -> int:
    return sum(len(d.get("taints") or ()) for d in s["spec"].get("devices", ()))


class SlicePublisher:
    def __init__(self, api: Any, options: SliceOptions, *, resync_s: float = 60.0, max_backoff_s: float = 60.0,
                 min_interval_s: float = 1.0):
        self.api = api
        self.options = options
        self.resync_s = resync_s
        self.max_backoff_s = max_backoff_s
        self._backoff = Backoff(FIRST_RETRY_S, max_backoff_s)
        #: Least time between the starts of two passes (see the module docstring: coalescing bursts).
        self.min_interval_s = min_interval_s
        self._topology: NodeTopology | None = None
        self._node_uid: str | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        #: False once the API server was seen dropping device taints.
        self.taints_supported = True
        #: Pool generation last written or found current; 0 before the first pass.
        self.generation = 0
        #: Completed passes (written or not): tests and readiness wait on this.
        self.passes = 0
        #: Passes that succeeded (the published pool matched the topology afterwards).
        self.successes = 0
        #: Failed passes in a row (0 after a success), the last one's error and the wait before the next try.
        self.failures = 0
        self.last_error: str | None = None
        self.retry_s = 0.0

    @property
    def effective_options(self) -> SliceOptions:
        if self.taints_supported or self.options.unhealthy == "remove":
            return self.options
        return replace(self.options, unhealthy="remove")

    # -- control -------------------------------------------------------------
    def start(self, topology: NodeTopology) -> None:
        self._topology = topology
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dra-slice-publisher")

    def update(self, topology: NodeTopology) -> None:
        """A new topology (hot-plug, health change): publish it soon."""
        self._topology = topology
        self._wake.set()

    def trigger(self) -> None:
        """Check the published slices now (e.g. the kubelet registered us again after a restart)."""
        self._wake.set()

    async def stop(self, delete: bool = False) -> None:
        """Stop publishing. `delete` removes the node's slices (driver uninstalled, not a restart)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if delete:
            for s in await self.api.list_slices(self.options.node_name, self.options.driver_name):
                await self.api.delete_slice(s["metadata"]["name"])

    def health(self) -> tuple[bool, str]:
        """Whether the node's devices are published now, and why not: the driver's readiness.

        Not before the first successful pass (the scheduler cannot allocate what is not published), and not
        while passes keep failing (the slices may be stale or gone, e.g. after the kubelet deleted them)."""
        if self.failures:
            return False, (f"publishing ResourceSlices failed {self.failures} time(s) in a row, retrying in "
                           f"{self.retry_s:g} s: {self.last_error}")
        if not self.successes:
            return False, "ResourceSlices not published yet"
        return True, f"ResourceSlices published (pool generation {self.generation})"

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            started = loop.time()
            try:
                await self.reconcile()
                self.failures, self.last_error = 0, None
                self._backoff.reset()
                self.successes += 1
                delay = self.resync_s
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 (API, network, auth: retry with backoff, never die)
                self.failures += 1
                delay = self._backoff.next()
                self.last_error, self.retry_s = f"{type(e).__name__}: {e}", round(delay, 2)
                log.warning("publishing ResourceSlices failed; retrying",
                            extra={"error": self.last_error, "retry_s": self.retry_s, "failures": self.failures})
            self.passes += 1
            if await wait_event(self._wake, delay):
                # Woken by a change: let the rest of a burst gather; the pass after the wait sees the latest.
                rest = started + self.min_interval_s - loop.time()
                if rest > 0:
                    await asyncio.sleep(rest)

    # -- one pass ------------------------------------------------------------
    async def reconcile(self) -> bool:
        """Make the published pool match the topology; True when something was written."""
        if self._topology is None:
            raise RuntimeError("no topology to publish yet")
        opts = self.options
        if self._node_uid is None:
            self._node_uid = await self.api.node_uid(opts.node_name)
        existing = {s["metadata"]["name"]: s for s in await self.api.list_slices(opts.node_name, opts.driver_name)}
        want = build_resource_slices(self._topology, self.effective_options, node_uid=self._node_uid)
        gens = {s["spec"]["pool"]["generation"] for s in existing.values()}
        if (set(existing) == {s["metadata"]["name"] for s in want} and len(gens) == 1
                and all(_comparable(existing[s["metadata"]["name"]]) == _comparable(s) for s in want)):
            self.generation = gens.pop()
            return False
        generation = max(gens, default=0) + 1
        want = build_resource_slices(self._topology, self.effective_options, generation=generation,
                                     node_uid=self._node_uid)
        dropped = False
        for s in want:
            name = s["metadata"]["name"]
            if name in existing:
                s["metadata"]["resourceVersion"] = existing[name]["metadata"]["resourceVersion"]
                answer = await self.api.replace_slice(s)
            else:
                answer = await self.api.create_slice(s)
            dropped |= _sent_taints(s) > _sent_taints(answer)
        for name in sorted(set(existing) - {s["metadata"]["name"] for s in want}):
            await self.api.delete_slice(name)
        self.generation = generation
        log.info("published ResourceSlices", extra={"node": opts.node_name, "driver": opts.driver_name,
                                                    "generation": generation, "slices": len(want)})
        if dropped and self.taints_supported:
            self.taints_supported = False
            log.warning("the API server dropped device taints (DRADeviceTaints off?); unhealthy devices are "
                        "now left out of the ResourceSlices instead", extra={"driver": opts.driver_name})
            await self.reconcile()
        return True
