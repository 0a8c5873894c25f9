"""GPU–NIC pairing for the servers of one daemon: the partners of each request, the pairs each container got.

Why one object for every server: the spec's groups ("One container, several
resources: pairing GPUs with NICs", `shared/spec/allocation.md`) span
resources, and each resource has its own server, so the call-sequence tracker
(`plugin.allocation.pairing_groups`) and the cross-resource weights (`PairingIndex`) must
be shared by all of them. The daemon rebuilds the index with the resources on
every topology or config change (never inside an RPC) and sets the window
on a config reload.

The servers call, in arrival order and before any work goes to a thread:
- `partners(resource)` when a GetPreferredAllocation arrives: it records the
  call (a request for a resource already in the group ends the group) and
  returns the `Partners` every container request of that call is answered
  with. The kubelet sends one container request per call; a call with several
  gets the call's partners for each, since the spec defines partners per call.
- `on_allocate(resource, ids)` for each container request of an `Allocate`
  the server accepted. A rejected `Allocate` is not recorded: the kubelet
  fails the pod's admission on an `Allocate` error and gives those devices
  to no container, so they must not become anyone's partners (and its IDs
  may not even exist).

Pod-resources (optional): a request with partners reads `List` to check them
(`plugin.allocation.pod_resources`). At most one `List` per group state: every request
that arrives while the group is unchanged (no `Allocate` since) shares one
query, in flight or done, so a burst of paired requests costs the kubelet
one call (its pod-resources rate limit is 100/s, burst 10) and the daemon one
decode. A request cancelled by its deadline never cancels the shared query.

NCCL hints (`--nccl-env`, `nccl_env` true): `nccl_env_for(resource)`, called
right after `on_allocate` for the same container request, returns the
`NCCL_IB_HCA` / `NCCL_SOCKET_IFNAME` (`plugin.model.nccl_env`) of the
container's group once it holds GPUs and NICs, to be added to that
`Allocate`'s answer. The kubelet walks a container's resources in no fixed
order, so whichever of the GPU and NIC `Allocate`s comes second carries the
hint (it is the first call that knows both). Each variable is given once per
group: the kubelet merges a container's answers keeping the first value of a
variable set twice (devicemanager `deviceRunContainerOptions`, over a map, so
"first" is arbitrary) and logs a conflict, so a later `Allocate` of the same
group (a second NIC pool) never sets it again with another value. The hint
knows exactly what pairing knows: the call-sequence group, a guess that holds
in the kubelet's own sequence (`plugin.allocation.pairing_groups`).

Metrics (`topo_dp_pairs_total`, `topo_dp_pair_links_total`): every `Allocate`
that joins a group holding devices of the other kind completes pairs, the
best one-to-one GPU–NIC matching between its devices and the group's; each
pair is counted with its link type. This is what the kubelet really gave the
container, so an operator sees the benefit on a live node. The groups are
tracked for these metrics with pairing off too (window 0: grouped with the
default window, no partners given), so the share of PIX pairs with pairing
on and off can be compared.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from allocator.pairing import NO_PARTNERS, PairingIndex, Partners, pair_label
from allocator.topology import Device, DeviceKind, NodeTopology

from ..model.nccl_env import nccl_env

from .pairing_groups import DEFAULT_PAIRING_WINDOW_S, PairingGroups
from .pod_resources import Holdings, PodResourcesReader, drop_stale

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pair:
    """One device of an `Allocate` matched to a device the same container got before."""

    device: str
    #: `<resource>=<id>` of the other device.
    partner: str
    weight: int

    @property
    def link(self) -> str:
        return pair_label(self.weight)


class PairingService:
    def __init__(self, window_s: float = DEFAULT_PAIRING_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 pod_resources: PodResourcesReader | None = None, nccl_env: bool = False):
        self._window_s = 0.0
        self.groups = PairingGroups(DEFAULT_PAIRING_WINDOW_S, clock)
        self.index = PairingIndex({}, {})
        self.pod_resources = pod_resources
        #: Counts accepted `Allocate`s: an open group's devices change only with one, so it names the group state.
        self._allocates = 0
        #: The pod-resources query of one group state: (`_allocates` when it started, the query).
        self._query: tuple[int, asyncio.Task] | None = None
        #: Give containers NCCL hints (`--nccl-env`); set by the daemon with the resources.
        self.nccl_env = nccl_env
        #: resource -> {plugin ID: device}, for the hints (set with the index).
        self._devices: Mapping[str, Mapping[str, Device]] = {}
        #: The NCCL variables already given to the open group (each is given once per group).
        self._hinted: set[str] = set()
        self.set_window(window_s)

    @property
    def window_s(self) -> float:
        return self._window_s

    @property
    def enabled(self) -> bool:
        return self._window_s > 0

    def set_window(self, window_s: float) -> None:
        """The pairing window in seconds; 0 turns pairing off (groups are still tracked for the metrics)."""
        self.groups.set_window(window_s or DEFAULT_PAIRING_WINDOW_S)
        self._window_s = float(window_s)

    def rebuild(self, topology: NodeTopology, resources: Mapping[str, Iterable]) -> None:
        """New cross-resource weights for `resources` (name -> advertised devices), built here, not in an RPC."""
        listed = {name: list(members) for name, members in resources.items()}
        index = PairingIndex.build(topology, listed)
        devices = {name: {m.id: m.device for m in members} for name, members in listed.items()}
        self.index, self._devices = index, devices

    async def partners(self, resource: str) -> Partners:
        """A GetPreferredAllocation for `resource` arrived: record it and return its partners."""
        group = self.groups.on_get_preferred_allocation(resource)
        if not group or not self.enabled:
            return NO_PARTNERS
        index = self.index  # the one in force when the call arrived
        if self.pod_resources is not None:
            holdings = await asyncio.shield(self._holdings_query(self.pod_resources))
            if holdings is not None:
                group = drop_stale(resource, group, holdings)
        return index.partners(resource, group)

    def _holdings_query(self, reader: PodResourcesReader) -> asyncio.Task:
        """The one `List` of the current group state, started by its first request (module doc)."""
        if self._query is None or self._query[0] != self._allocates:
            self._query = (self._allocates, asyncio.get_running_loop().create_task(
                self._read_holdings(reader), name="pod-resources List"))
        return self._query[1]

    @staticmethod
    async def _read_holdings(reader: PodResourcesReader) -> Holdings | None:
        try:
            return await reader.holdings()
        except Exception:  # a bug in the optional check must never fail the kubelet's request
            log.exception("pod-resources check failed (a bug); partners left as they are")
            return None

    async def close(self) -> None:
        """Shutdown: end a query still in flight and close the pod-resources channel."""
        query, self._query = self._query, None
        if query is not None and not query[1].done():
            query[1].cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await query[1]
        if self.pod_resources is not None:
            await self.pod_resources.close()

    def on_allocate(self, resource: str, ids: Sequence[str]) -> tuple[Pair, ...]:
        """An accepted `Allocate` of `ids` for one container: join the group; return the pairs it completes."""
        before = self.groups.current()
        self.groups.on_allocate(resource, ids)
        self._allocates += 1
        if not before or resource in before:  # this Allocate starts a group (the next container's)
            self._hinted = set()
        if resource in before:
            return ()
        return tuple(Pair(d, p, w) for d, p, w in self.index.match(resource, list(ids), before))

    def nccl_env_for(self, resource: str) -> dict[str, str]:
        """The NCCL variables to add to the answer of the `Allocate` of `resource` just recorded by
        `on_allocate`: those of the group's GPUs and NICs not given to this group yet (module doc)."""
        if not self.nccl_env:
            return {}
        group = self.groups.current()
        if resource not in group:
            return {}
        index, devices = self.index, self._devices
        gpus: dict[str, tuple[str, str, Device]] = {}
        nics: dict[str, tuple[str, str, Device]] = {}
        for res, ids in group.items():
            table = devices.get(res, {})
            for i in ids:
                d = table.get(i)
                if d is not None and d.kind in (DeviceKind.GPU, DeviceKind.NIC):
                    (gpus if d.kind is DeviceKind.GPU else nics).setdefault(d.name, (res, i, d))
        if not gpus or not nics:
            return {}
        weights: dict[tuple[str, str], int] = {}
        for g_res, g_id, g in gpus.values():
            cross = index.cross.get((g_res, g_id), {})
            for n_res, n_id, n in nics.values():
                w = cross.get((n_res, n_id), 0)
                weights[(g.name, n.name)] = max(w, weights.get((g.name, n.name), 0))
        env = nccl_env([g for _, _, g in gpus.values()], [n for _, _, n in nics.values()],
                       lambda g, n: weights.get((g.name, n.name), 0))
        fresh = {k: v for k, v in env.items() if k not in self._hinted}
        self._hinted.update(fresh)
        return fresh
