"""The node topology model: devices, their NUMA nodes and the link between every pair.

Why one model: every discovery source (NVML, sysfs, a simulated node) produces a
`NodeTopology`, and everything downstream (servers, allocator, `discover`,
`explain`) reads only this. The model is plain, immutable data so it can be
shared between the asyncio loop and worker threads without locks, and replaced
wholesale when the hardware changes.

Link vocabulary and weights are those of `nvidia-smi topo -m` and of the
product spec (`shared/spec/allocation.md`).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


class DeviceKind(str, enum.Enum):
    """What a device is; decides which resource serves it."""

    GPU = "gpu"
    NIC = "nic"
    #: A MIG device: a partition of a GPU (its `Device.parent`), served as its own resource.
    MIG = "mig"


class LinkLevel(enum.IntEnum):
    """PCIe/interconnect levels, ordered from farthest to closest.

    The integer value is the pair weight of the spec; NVLink is handled
    separately in `Link` because its weight depends on the link count.
    """

    SYS = 10
    NODE = 20
    PHB = 30
    PXB = 40
    PIX = 50


_NV_RE = re.compile(r"^NV(\d+)$")
_LEVEL_ALIASES = {"SOC": LinkLevel.SYS}


@dataclass(frozen=True, order=True)
class Link:
    """How two devices are connected.

    `nvlinks > 0` means `NV<n>` (directly or through NVSwitch); otherwise
    `level` says which PCIe path joins them. A pair always has a PCIe level
    too (unknown -> SYS), kept for display; the weight of an NVLink pair is
    100 x n alone, as the spec says.
    """

    nvlinks: int = 0
    level: LinkLevel = LinkLevel.SYS

    @property
    def weight(self) -> int:
        return 100 * self.nvlinks if self.nvlinks > 0 else int(self.level)

    @property
    def label(self) -> str:
        """The `nvidia-smi topo -m` token for this link."""
        return f"NV{self.nvlinks}" if self.nvlinks > 0 else self.level.name

    @classmethod
    def parse(cls, token: str) -> Link:
        """Parse a topo-matrix token (`NV12`, `PIX`, `SOC`...). Raises ValueError on anything else."""
        tok = token.strip().upper()
        m = _NV_RE.match(tok)
        if m:
            n = int(m.group(1))
            if n <= 0:
                raise ValueError(f"link token {token!r}: NVLink count must be positive")
            return cls(nvlinks=n)
        if tok in _LEVEL_ALIASES:
            return cls(level=_LEVEL_ALIASES[tok])
        try:
            return cls(level=LinkLevel[tok])
        except KeyError:
            raise ValueError(
                f"unknown link token {token!r}: expected NV<n>, PIX, PXB, PHB, NODE, SYS or SOC"
            ) from None

    def __str__(self) -> str:
        return self.label


SYS_LINK = Link()


class ComplexKind(str, enum.Enum):
    """How a platform ties a GPU to its NIC when the PCIe path does not say (docs/platforms.md).

    `INLINE`: a ConnectX NIC function and a GPU below one ConnectX-integrated switch.
    `DATA_DIRECT`: a ConnectX-8 DMA function and a GPU below one ConnectX switch; the DMA
    function belongs to the NIC whose functions carry the same board serial (VPD).
    `CPU_ROOT`: GPU and NIC each below their own CPU root port, paired by physical order
    within a NUMA node.
    """

    INLINE = "inline"
    DATA_DIRECT = "data-direct"
    CPU_ROOT = "cpu-root"


@dataclass(frozen=True)
class FabricInfo:
    """A GPU's membership of a (possibly multi-node) NVLink fabric, as NVML reports it.

    Why on the model: schedulers place jobs inside one NVLink domain, so the clique is
    published as a node label and a DRA attribute. `state` is NVML's fabric state in words
    (`not-supported`, `not-started`, `in-progress`, `completed`).
    """

    cluster_uuid: str
    clique_id: int
    state: str = "completed"

    @property
    def clique(self) -> str:
        """`<cluster UUID>.<clique ID>`: one NVLink domain, unique across a cluster."""
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True)
class Device:
    """One physical (or simulated) device.

    `name` is unique within a node and stable (`GPU0`, `mlx5_0`, a PCI
    address); plugin IDs are derived from it by the resource layer. `numa`
    is the kernel NUMA node, or None when unknown (sysfs -1): such a device
    gets no TopologyInfo, as the kubelet expects.
    """

    name: str
    kind: DeviceKind
    index: int
    numa: int | None = None
    health: str = HEALTHY
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    minor: int | None = None
    memory_mib: int | None = None
    #: Physical function (port) a NIC belongs to; VFs of one PF share it. Used by NIC policies.
    port: str | None = None
    #: Source-specific facts kept for display and Allocate (netdev, driver, iommu group, ...).
    attributes: Mapping[str, str] = field(default_factory=dict)
    #: The `name` of the physical GPU a MIG device lives on (None for a whole device). The
    #: device inherits that GPU's NUMA node; its health follows the parent's.
    parent: str | None = None
    #: The GPU–NIC complex this GPU or NIC belongs to (an ID unique within the node), where
    #: the platform defines one; None elsewhere. A GPU and a NIC of one complex pair as `PIX`.
    complex: str | None = None
    complex_kind: ComplexKind | None = None
    #: NVLink fabric membership of a GPU (multi-node NVLink), None where NVML has none.
    fabric: FabricInfo | None = None
    #: Why the device is not Healthy (`xid-48: reset GPU (...)`); empty when Healthy or unknown.
    health_reason: str = ""

    @property
    def healthy(self) -> bool:
        return self.health == HEALTHY


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


@dataclass(frozen=True)
class NodeTopology:
    """All devices of a node and the link of every pair.

    `links` is keyed by the ordered pair of device names (see `_pair`); a
    missing pair means SYS. Build with `NodeTopology.build` so the keys are
    normalised and names are checked.
    """

    devices: tuple[Device, ...]
    links: Mapping[tuple[str, str], Link]
    source: str = "unknown"
    #: NUMA nodes of the machine (with no device too), for the Topology Manager model.
    numa_nodes: tuple[int, ...] = ()
    #: NUMA distance matrix {(a, b): d}, optional (for prefer-closest-numa-nodes).
    numa_distances: Mapping[tuple[int, int], int] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        devices: Iterable[Device],
        links: Mapping[tuple[str, str], Link] | Iterable[tuple[str, str, Link]],
        source: str = "unknown",
        numa_nodes: Iterable[int] | None = None,
        numa_distances: Mapping[tuple[int, int], int] | None = None,
    ) -> NodeTopology:
        devs = tuple(devices)
        names = [d.name for d in devs]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate device names: {', '.join(dup)}")
        known = set(names)
        items = links.items() if isinstance(links, Mapping) else (((a, b), link) for a, b, link in links)
        norm: dict[tuple[str, str], Link] = {}
        for (a, b), link in items:
            if a == b:
                continue
            for n in (a, b):
                if n not in known:
                    raise ValueError(f"link names unknown device {n!r}")
            key = _pair(a, b)
            old = norm.get(key)
            norm[key] = link if old is None or link.weight > old.weight else old
        nodes = set(numa_nodes or ())
        nodes.update(d.numa for d in devs if d.numa is not None)
        return cls(
            devices=devs,
            links=norm,
            source=source,
            numa_nodes=tuple(sorted(nodes)),
            numa_distances=dict(numa_distances or {}),
        )

    # -- lookups ---------------------------------------------------------
    def link(self, a: str, b: str) -> Link:
        if a == b:
            raise ValueError("a device has no link to itself")
        return self.links.get(_pair(a, b), SYS_LINK)

    def weight(self, a: str, b: str) -> int:
        return self.link(a, b).weight

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def of_kind(self, kind: DeviceKind) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.kind == kind)

    @property
    def gpus(self) -> tuple[Device, ...]:
        return self.of_kind(DeviceKind.GPU)

    @property
    def nics(self) -> tuple[Device, ...]:
        return self.of_kind(DeviceKind.NIC)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    # -- derived copies --------------------------------------------------
    def with_health(self, health: Mapping[str, str], reasons: Mapping[str, str] | None = None) -> NodeTopology:
        """A copy where the named devices have the given health (others unchanged), and the reason
        from `reasons` (none given: kept while still unhealthy, cleared when Healthy)."""
        def one(d: Device) -> Device:
            if d.name not in health:
                return d
            h = health[d.name]
            why = (reasons or {}).get(d.name, "" if h == HEALTHY else d.health_reason)
            return replace(d, health=h, health_reason=why if h != HEALTHY else "")

        return replace(self, devices=tuple(one(d) for d in self.devices))

    def without(self, names: Iterable[str]) -> NodeTopology:
        drop = set(names)
        devs = tuple(d for d in self.devices if d.name not in drop)
        links = {k: v for k, v in self.links.items() if k[0] not in drop and k[1] not in drop}
        return replace(self, devices=devs, links=links)

    def numa_distance(self, a: int, b: int) -> int:
        """Distance between NUMA nodes (10 on the diagonal, 20 elsewhere when unknown, as Linux does)."""
        if (a, b) in self.numa_distances:
            return self.numa_distances[(a, b)]
        if (b, a) in self.numa_distances:
            return self.numa_distances[(b, a)]
        return 10 if a == b else 20


@dataclass(frozen=True)
class DeviceGraph:
    """The allocator's view of one resource: candidate IDs, NUMA nodes, pair weights.

    Built once per topology (never inside an RPC) by the resource layer,
    which maps plugin IDs (UUIDs, indexes, PCI addresses) to devices. The
    allocator only ever sees this, so it knows nothing of gRPC or discovery.
    """

    ids: tuple[str, ...]
    numa: tuple[int | None, ...]
    #: weights[i][j] = w(ids[i], ids[j]); 0 on the diagonal. Symmetric. A tuple of rows, or for
    #: devices that inherit their parent's links (replicas) a view over the parents' table
    #: (`allocator.subdevices.InheritedWeights`) that reads the same and grows linearly.
    weights: Sequence[Sequence[int]]
    #: Physical port/function of each device (NICs); None for GPUs.
    ports: tuple[str | None, ...] = ()
    #: Devices that live on a physical GPU (time-slicing replicas, MIG devices):
    #: `parents[i]` is a position in `parent_ids`, the GPU device i belongs to.
    #: Empty for whole devices (each device is then its own parent). Built by
    #: `allocator.subdevices`; the replica and MIG policies read it.
    parents: tuple[int, ...] = ()
    parent_ids: tuple[str, ...] = ()

    @classmethod
    def from_topology(
        cls, topology: NodeTopology, devices: Iterable[Device], ids: Iterable[str] | None = None
    ) -> DeviceGraph:
        """Build the graph for `devices`, named by `ids` (default: device names)."""
        devs = list(devices)
        id_list = list(ids) if ids is not None else [d.name for d in devs]
        if len(id_list) != len(devs):
            raise ValueError("one ID per device is needed")
        n = len(devs)
        w = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                w[i][j] = w[j][i] = topology.weight(devs[i].name, devs[j].name)
        return cls(
            ids=tuple(id_list),
            numa=tuple(d.numa for d in devs),
            weights=tuple(tuple(r) for r in w),
            ports=tuple(d.port for d in devs),
        )

    def index_of(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.ids)}
