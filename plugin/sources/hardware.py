"""The real node: NVML GPUs + sysfs NICs in one topology, kept current by health and hot-plug.

Why one source for both: the allocator scores GPU<->NIC pairs (GPUDirect
RDMA wants the VF behind the GPU's own PCIe switch), so GPUs and NICs must
live in one `NodeTopology` with a link for every pair. GPU<->GPU links come
from NVML (`nvml_gpus.discover_gpus`); GPU<->NIC and NIC<->NIC links from
the sysfs PCIe tree (`pcie.pcie_level`), the same rule NVML uses for GPU
pairs. The NUMA nodes and their distances come from
`devices/system/node/node*/distance`.

GPU–NIC complexes (Grace, ConnectX-8 Data Direct, ConnectX-8 inline
switches) come from `complexes.classify_complexes` on the same sysfs tree and
land on `Device.complex`/`complex_kind`; what cannot be classified is warned
about once per device and pairs by PCIe path.

Grace NUMA: on Grace systems the GPUs' memory shows up as extra NUMA nodes
with no CPUs (`devices/system/node/node<N>/cpulist` empty). The kubelet's
Topology Manager aligns with CPU nodes, so a device's NUMA node is the one its
PCI function reports (`numa_node`, the CPU socket on Grace); should that ever
name a CPU-less node, the nearest node with CPUs (by `distance`) stands in
(`cpu_numa_map`), so a GPU-memory node never becomes a TopologyInfo.

With `fabric_labels_file` set, the GPUs' NVLink fabric clique is kept in a
Node Feature Discovery feature file (`plugin.sources.fabric_labels`): after every
discovery and rescan, and a GPU health change asks for a rescan so a fabric
that changed state is seen.

The fabric state is also re-read every `fabric_recheck_s` (`--fabric-recheck-s`,
60 s as GPU Feature Discovery): the fabric manager of an NVL72 tray often
registers its GPUs after the daemon has started, and no udev event, NVML event
(pynvml has no fabric event type) or health event says so. The check is cheap
(one `nvmlDeviceGetGpuFabricInfoV` per GPU); a GPU whose answer differs from
the topology served asks for a full rescan, which publishes the change through
the same path as a hot-plug (labels, resources, DRA slices).

`watch()` runs two things until cancelled and merges them:
- the GPU health monitor (`NvmlGpuSource.watch_health`): health changes are
  applied to the topology being served and published at once;
- the hot-plug watcher (`udev_hotplug.HotplugWatcher`): udev events (and NIC
  link changes when `nic_link_health` is on) trigger a debounced full
  rescan in a worker thread; a changed topology is published, with the GPU
  health overlay kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from allocator.topology import HEALTHY, Device, DeviceKind, Link, LinkLevel, NodeTopology

from .base import Publish
from .complexes import classify_complexes
from .errors import TopologyError
from .pcie import pci_path, pcie_level
from .sysfs_nics import NicInventory, discover_nics, link_states
from .udev_hotplug import SUBSYSTEMS, HotplugWatcher, MonitorFactory, UdevMonitor

if TYPE_CHECKING:
    from ..health.policy import GpuHealth
    from .fabric_labels import FabricLabelFile

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HardwareOptions:
    sysfs_root: str = "/sys"
    dev_root: str = "/dev"
    proc_root: str = "/proc"
    #: NVML failing at start stops the daemon (True, as NVIDIA's plugin) or serves zero GPUs (False).
    fail_on_init_error: bool = True
    #: A pynvml-like module (tests: `fake_nvml`); None imports `pynvml` when GPUs are discovered.
    nvml: Any = None
    gpus: bool = True
    nics: bool = True
    #: `NodeTopology.source`; default: the host name.
    node_name: str | None = None
    #: GPU health: `plugin.health.options.GpuHealthOptions`, or the config's `gpus.health` mapping; None: defaults.
    gpu_health: Any = None
    #: NICs on a down link (the PF's, for VFs) are Unhealthy, and link changes trigger a rescan.
    nic_link_health: bool = False
    link_poll_s: float = 2.0
    #: Watch udev for hot-plug; without it (or where udev is unavailable) rescan every `rescan_interval_s`.
    hotplug: bool = True
    debounce_s: float = 0.5
    max_debounce_s: float = 5.0
    rescan_interval_s: float = 30.0
    #: With udev working, also rescan this often (None: only on events).
    periodic_rescan_s: float | None = None
    monitor_factory: MonitorFactory = field(default=UdevMonitor, compare=False)
    #: Keep the GPUs' NVLink clique label in this NFD feature file (None: off).
    fabric_labels_file: str | None = None
    #: Re-read the GPUs' fabric state this often, in seconds; a change triggers a rescan (None: off).
    fabric_recheck_s: float | None = None


def read_numa(sysfs_root: str) -> tuple[list[int], dict[tuple[int, int], int]]:
    """NUMA nodes and distances from `devices/system/node/node<N>/distance` (empty when absent)."""
    base = os.path.join(sysfs_root, "devices", "system", "node")
    try:
        entries = os.listdir(base)
    except OSError:
        return [], {}
    nodes = sorted(int(e[4:]) for e in entries if e.startswith("node") and e[4:].isdigit())
    distances: dict[tuple[int, int], int] = {}
    for n in nodes:
        try:
            with open(os.path.join(base, f"node{n}", "distance"), encoding="ascii") as f:
                row = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
        if len(row) == len(nodes):
            for m, d in zip(nodes, row):
                distances[(n, m)] = d
    return nodes, distances


def _cpulist_empty(base: str, n: int) -> bool | None:
    try:
        with open(os.path.join(base, f"node{n}", "cpulist"), encoding="ascii") as f:
            return not f.read().strip()
    except OSError:
        return None


def cpu_numa_map(sysfs_root: str) -> dict[int, int | None]:
    """NUMA nodes without CPUs (Grace GPU memory) -> the nearest node with CPUs (None: none known).

    Only nodes whose `cpulist` exists and is empty are mapped; a tree without
    `cpulist` files maps nothing.
    """
    base = os.path.join(sysfs_root, "devices", "system", "node")
    nodes, distances = read_numa(sysfs_root)
    empty = {n for n in nodes if _cpulist_empty(base, n)}
    with_cpus = [n for n in nodes if n not in empty]
    out: dict[int, int | None] = {}
    for n in sorted(empty):
        near = sorted(with_cpus, key=lambda m: (distances.get((n, m), 1 << 30), m))
        out[n] = near[0] if near and (n, near[0]) in distances else None
    return out


def _cpu_numa(devices: Sequence[Device], mapping: Mapping[int, int | None]) -> tuple[list[Device], list[str]]:
    """Devices with a CPU node for a CPU-less one, and a line for each device so moved."""
    out, notes = [], []
    for d in devices:
        if d.numa is not None and d.numa in mapping:
            notes.append(f"{d.name} reports NUMA node {d.numa}, which has no CPUs; using the nearest CPU "
                         f"node, {mapping[d.numa]}")
            d = replace(d, numa=mapping[d.numa])
        out.append(d)
    return out, notes


def pcie_links(sysfs_root: str, gpus: Sequence[Device], nics: Sequence[Device]) -> dict[tuple[str, str], Link]:
    """GPU<->NIC and NIC<->NIC links from the sysfs PCIe tree.

    A node with hundreds of VFs has tens of thousands of NIC pairs, and each
    `pcie_level` call resolves two sysfs paths. But the level only depends on
    what each function hangs off (its chain of bridges) and its NUMA node, and
    all VFs of a PF share both; so functions are grouped by (parent chain,
    NUMA node) and `pcie_level` is asked once per pair of groups, with one
    member of each as its representative.
    """
    def key(d: Device) -> tuple:
        path = pci_path(sysfs_root, d.pci_bus_id) if d.pci_bus_id else None
        return (path[:-1] if path else ("unknown", d.name), d.numa)

    groups: dict[tuple, list[Device]] = {}
    nic_group: dict[str, tuple] = {}
    for n in nics:
        k = key(n)
        groups.setdefault(k, []).append(n)
        nic_group[n.name] = k
    rep = {k: members[0] for k, members in groups.items()}
    cache: dict[tuple, LinkLevel] = {}

    def level(a: Device, ka: tuple, b: Device, kb: tuple) -> LinkLevel:
        ck = (ka, kb) if a.kind == b.kind else (a.name, kb)
        if ck not in cache:
            ra = rep[ka] if a.kind == b.kind else a
            rb = rep[kb]
            if ra.name == rb.name:  # same group: ask about two of its members
                rb = groups[kb][1] if groups[kb][0].name == ra.name else groups[kb][0]
            cache[ck] = pcie_level(sysfs_root, ra.pci_bus_id or ra.name, rb.pci_bus_id or rb.name, ra.numa, rb.numa)
            if a.kind == b.kind:
                cache[(kb, ka)] = cache[ck]
        return cache[ck]

    links: dict[tuple[str, str], Link] = {}
    for g in gpus:
        if not g.pci_bus_id:
            continue
        for n in nics:
            links[(g.name, n.name)] = Link(level=level(g, (), n, nic_group[n.name]))
    for i, n in enumerate(nics):
        kn = nic_group[n.name]
        for m in nics[i + 1:]:
            links[(n.name, m.name)] = Link(level=level(n, kn, m, nic_group[m.name]))
    return links


class HardwareSource:
    """`TopologySource` for a real node (GPUs through NVML, NICs through sysfs)."""

    def __init__(self, options: HardwareOptions | None = None):
        self.options = options or HardwareOptions()
        o = self.options
        self.node_name = o.node_name or socket.gethostname()
        parts = [p for p, on in (("nvml", o.gpus), ("sysfs", o.nics)) if on]
        self.description = "+".join(parts or ["none"]) + (f" (sysfs {o.sysfs_root})" if o.sysfs_root != "/sys" else "")
        self._gpu_source: Any = None
        if o.gpus:
            from .nvml_gpus import NvmlGpuSource  # noqa: PLC0415 - keeps NIC-only use free of NVML/health

            kw: dict[str, Any] = {}
            if isinstance(o.gpu_health, Mapping):  # the config file's `gpus.health` section
                from ..health.options import GpuHealthOptions  # noqa: PLC0415 (as above)

                kw["health"] = GpuHealthOptions.from_config(o.gpu_health, proc_root=o.proc_root)
            elif o.gpu_health is not None:
                # The boot ID is read under the node's procfs, whoever built the options.
                kw["health"] = replace(o.gpu_health, proc_root=o.proc_root)
            self._gpu_source = NvmlGpuSource(o.nvml, o.sysfs_root, o.fail_on_init_error, proc_root=o.proc_root, **kw)
        #: The last NIC scan (offered NICs and why others were not offered), for `discover`.
        self.nic_inventory: NicInventory = NicInventory(devices=())
        self._base: NodeTopology | None = None
        self._gpu_health: dict[str, GpuHealth] = {}
        self.watcher: HotplugWatcher | None = None
        self._warned: set[str] = set()
        self.labels: FabricLabelFile | None = None
        if o.fabric_labels_file:
            from .fabric_labels import FabricLabelFile  # noqa: PLC0415 (only with a fabric labels file)

            self.labels = FabricLabelFile(o.fabric_labels_file)

    def xid_counts(self) -> dict[tuple[str, int, str], int]:
        """XID events per (GPU, XID, bucket) since the health monitor started (metrics read it at scrape time)."""
        return self._gpu_source.xid_counts() if self._gpu_source is not None else {}

    def gpu_evidence(self) -> list[tuple[str, str, Any]]:
        """(GPU, UUID, `plugin.health.policy.Evidence`) for each GPU, read now (`discover` prints them)."""
        return self._gpu_source.evidence(self._base.gpus if self._base is not None else ()) \
            if self._gpu_source is not None else []

    @property
    def gpu_init_error(self) -> Exception | None:
        """Why GPUs were not discovered (only with fail_on_init_error=False)."""
        return getattr(self._gpu_source, "init_error", None)

    # -- discovery -----------------------------------------------------------
    def discover(self) -> NodeTopology:
        """One full discovery (blocking): GPUs, NICs, every link, NUMA nodes."""
        o = self.options
        gpus: list[Device] = []
        links: dict[tuple[str, str], Link] = {}
        if self._gpu_source is not None:
            gpus, gpu_links = self._gpu_source.discover()
            links.update(gpu_links)
        nics: Sequence[Device] = ()
        if o.nics:
            previous = self._base.nics if self._base is not None else ()
            self.nic_inventory = discover_nics(o.sysfs_root, o.dev_root, o.proc_root,
                                               link_health=o.nic_link_health, previous=previous)
            nics = self.nic_inventory.devices
        numa_map = cpu_numa_map(o.sysfs_root)
        if numa_map:
            (gpus, on_gpus), (nics, on_nics) = _cpu_numa(gpus, numa_map), _cpu_numa(nics, numa_map)
            for note in on_gpus + on_nics:
                self._warn_once("device NUMA node", note)
        whole = [g for g in gpus if g.kind is DeviceKind.GPU]
        links.update(pcie_links(o.sysfs_root, whole, nics))
        gpus, nics = self._with_complexes(gpus, nics)
        nodes, distances = read_numa(o.sysfs_root)
        try:
            return NodeTopology.build([*gpus, *nics], links, source=self.node_name,
                                      numa_nodes=nodes, numa_distances=distances)
        except ValueError as e:
            raise TopologyError(self.description, f"discovered devices do not form a topology: {e}") from None

    def _warn_once(self, what: str, detail: str) -> None:
        """A hardware fact that stays wrong is said once, not at every rescan."""
        if detail not in self._warned:
            self._warned.add(detail)
            log.warning("%s: %s", what, detail)

    def _with_complexes(self, gpus: list[Device], nics: Sequence[Device]) -> tuple[list[Device], list[Device]]:
        """GPUs and NICs with their complex set; each new warning is logged once."""
        report = classify_complexes(self.options.sysfs_root, [g for g in gpus if g.kind is DeviceKind.GPU], nics)
        for w in report.warnings:
            self._warn_once("GPU-NIC complex not recognised", w)

        def put(d: Device) -> Device:
            if d.name in report.members:
                cid, kind = report.members[d.name]
                return replace(d, complex=cid, complex_kind=kind)
            return d

        return [put(g) for g in gpus], [put(n) for n in nics]

    def _update_labels(self, topology: NodeTopology) -> None:
        if self.labels is not None:
            self.labels.update(topology.gpus)

    def load(self) -> NodeTopology:
        topology = self.discover()
        self._update_labels(topology)
        self._base = topology
        # Faults a previous daemon saved in this boot are served from the first answer on.
        self._gpu_health = self._gpu_source.saved_faults(topology.gpus) if self._gpu_source is not None else {}
        log.info("discovered %d GPUs and %d NICs (%d network functions not offered)",
                 len(topology.gpus), len(topology.nics), len(self.nic_inventory.skipped))
        return self._with_health(topology)

    # -- watching ----------------------------------------------------------------
    def _with_health(self, base: NodeTopology) -> NodeTopology:
        names = {d.name for d in base.gpus}
        overlay = {k: v for k, v in self._gpu_health.items() if k in names}
        if not overlay:
            return base
        return base.with_health({k: v.health for k, v in overlay.items()}, {k: v.reason for k, v in overlay.items()})

    def _link_states(self) -> Mapping[str, str]:
        base = self._base
        return link_states(self.options.sysfs_root, base.nics) if base is not None else {}

    async def watch(self, current: NodeTopology, publish: Publish) -> None:
        o = self.options
        if self._base is None:
            self._base = current
        served = {"topology": current}

        def emit(topology: NodeTopology) -> None:
            if topology != served["topology"]:
                served["topology"] = topology
                publish(topology)

        def on_rescan(base: NodeTopology) -> None:
            old_gpus = self._base.gpus if self._base is not None else ()
            self._base = base
            self._update_labels(base)
            if [g.uuid for g in old_gpus] != [g.uuid for g in base.gpus]:
                self._restart_health()
            emit(self._with_health(base))

        def on_health(health: Mapping[str, GpuHealth]) -> None:
            # Healthy again means "no override": the rescan's own health stands.
            for name, h in health.items():
                if h.health == HEALTHY:
                    self._gpu_health.pop(name, None)
                else:
                    self._gpu_health[name] = h
            if self._base is not None:
                emit(self._with_health(self._base))
            if self.labels is not None and self.watcher is not None:
                self.watcher.kick("GPU health changed: re-read the NVLink fabric state")

        def on_links(gpu: str, why: str) -> None:
            # A dead NVLink (or one back): discovery counts only active links, so a rescan takes it out of
            # (or back into) the topology the allocator and the DRA slices use; GPU health is kept.
            if self.watcher is not None:
                self.watcher.kick(why)

        self._on_health = on_health
        self._on_links = on_links
        self.watcher = HotplugWatcher(
            self.discover, on_rescan,
            debounce_s=o.debounce_s, max_delay_s=o.max_debounce_s,
            fallback_interval_s=o.rescan_interval_s, periodic_s=o.periodic_rescan_s,
            link_poll_s=o.link_poll_s if (o.nic_link_health and o.nics) else None,
            link_states=self._link_states, use_udev=o.hotplug, monitor_factory=o.monitor_factory,
            subsystems=SUBSYSTEMS,
        )
        self._health_task: asyncio.Task | None = None
        self._restart_health()
        fabric: asyncio.Task | None = None
        if o.fabric_recheck_s and self._gpu_source is not None:
            fabric = asyncio.get_running_loop().create_task(self._recheck_fabric(o.fabric_recheck_s),
                                                            name="fabric-recheck")
        try:
            await self.watcher.run(self._base)
        finally:
            if fabric is not None:
                fabric.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await fabric
            await self._stop_health()

    async def _recheck_fabric(self, interval_s: float) -> None:
        """Every `interval_s`: read the GPUs' fabric state; a GPU that differs from the served one asks for a rescan."""
        while True:
            await asyncio.sleep(interval_s)
            base = self._base
            gpus = [g for g in base.gpus if g.kind is DeviceKind.GPU and g.health == HEALTHY] if base else []
            if not gpus or self.watcher is None:
                continue
            try:
                now = await asyncio.to_thread(self._gpu_source.read_fabrics, gpus)
            except Exception as e:  # noqa: BLE001 - a failing NVML must not stop the re-read; logged, retried
                log.warning("cannot re-read the NVLink fabric state; trying again in %.0f s", interval_s,
                            extra={"reason": str(e)})
                continue
            changed = sorted(g.name for g in gpus if g.name in now and now[g.name] != g.fabric)
            if changed and self._base is base:
                log.info("NVLink fabric state changed; rescanning", extra={"gpus": ",".join(changed)})
                self.watcher.kick(f"NVLink fabric state changed ({', '.join(changed)})")

    def _restart_health(self) -> None:
        """(Re)start the GPU health monitor for the current GPUs (after a GPU hot-plug too)."""
        if self._gpu_source is None or self._base is None:
            return
        old = getattr(self, "_health_task", None)
        if old is not None:
            old.cancel()
        self._gpu_health = {k: v for k, v in self._gpu_health.items() if k in {g.name for g in self._base.gpus}}
        self._health_task = asyncio.get_running_loop().create_task(
            self._gpu_source.watch_health(self._base.gpus, self._on_health, self._on_links), name="gpu-health")

    async def _stop_health(self) -> None:
        task = getattr(self, "_health_task", None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def hardware_source_from_options(
    *,
    sysfs_root: str = "/sys",
    dev_root: str = "/dev",
    proc_root: str = "/proc",
    fail_on_init_error: bool = True,
    nvml: Any = None,
    gpus: bool = True,
    nics: bool = True,
    node_name: str | None = None,
    gpu_health: Any = None,
    nic_link_health: bool = False,
    link_poll_s: float = 2.0,
    hotplug: bool = True,
    rescan_interval_s: float = 30.0,
    periodic_rescan_s: float | None = None,
    debounce_s: float = 0.5,
    monitor_factory: Callable[..., Any] | None = None,
    fabric_labels_file: str | None = None,
    fabric_recheck_s: float | None = None,
) -> HardwareSource:
    """The one call the daemon/CLI needs: a `HardwareSource` from `serve`/`discover` options."""
    kw: dict[str, Any] = {}
    if monitor_factory is not None:
        kw["monitor_factory"] = monitor_factory
    return HardwareSource(HardwareOptions(
        sysfs_root=sysfs_root, dev_root=dev_root, proc_root=proc_root, fail_on_init_error=fail_on_init_error,
        nvml=nvml, gpus=gpus, nics=nics, node_name=node_name, gpu_health=gpu_health,
        nic_link_health=nic_link_health, link_poll_s=link_poll_s, hotplug=hotplug,
        rescan_interval_s=rescan_interval_s, periodic_rescan_s=periodic_rescan_s, debounce_s=debounce_s,
        fabric_labels_file=fabric_labels_file, fabric_recheck_s=fabric_recheck_s, **kw,
    ))
