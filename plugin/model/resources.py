"""From a node topology to the extended resources the kubelet sees.

Why a layer of its own: the servers must know nothing of discovery or
scoring. A `Resource` carries everything one server needs: the plugin IDs
with health and NUMA, the allocator's `DeviceGraph` (built here, once per
topology, never inside an RPC), the policy name and the Allocate builder.

Order of the steps: GPU-family resources by MIG strategy
(`plugin.model.mig_strategy`: whole GPUs, MIG devices per profile), time-slicing
replicas of them (`plugin.model.time_slicing`), NIC pools; then, when Allocate
names devices through CDI specs we write, each resource's spec
(`plugin.model.cdi`), which the daemon writes and Allocate names from. The
resource itself (the data) is `plugin.model.resource`, re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from allocator.policies import SubsetTableCache, prepare_tables
from allocator.subdevices import child_graph
from allocator.topology import Device, DeviceGraph, DeviceKind, NodeTopology

from .cdi import CdiDevice, CdiOptions, Edits, spec_for
from .cdi_names import CdiNamingBuilder
from ..config.sharing import TimeSlicing
from ..errors import OptionError
from .gpu_allocate import GpuAllocateBuilder, GpuAllocateOptions
from .identity import device_uuid, simulated_uuid
from .imex import cdi_name as imex_cdi_name
from .mig_strategy import GpuGroup, group_gpus
from .nic_pools.pools import NicPool, default_pool
from .resource import AllocateBuilder, Resource, ResourceDevice
from .resource_names import check_resource_name
from ..sources.errors import TopologyError
from ..sources.pcie import normalize_bdf
from .time_slicing import apply_time_slicing

__all__ = [
    "AllocateBuilder", "NicPool", "Resource", "ResourceDevice", "ResourceOptions", "build_resources",
    "check_resource_name", "gpu_id", "nic_id", "simulated_uuid",
]

ID_STRATEGIES = ("uuid", "index")
NIC_ID_STRATEGIES = ("name", "pci")
MIG_STRATEGIES = ("none", "single", "mixed")


@dataclass(frozen=True)
class ResourceOptions:
    device_id_strategy: str = "uuid"
    gpu_resource_name: str = "nvidia.com/gpu"
    gpu_policy: str = "numa-first"
    gpu_policy_options: Mapping[str, object] = field(default_factory=dict)
    gpu_allocate: GpuAllocateOptions = field(default_factory=GpuAllocateOptions)
    #: NIC pools; when empty, every NIC goes to one pool named `nic_resource_name`.
    nic_pools: tuple[NicPool, ...] = ()
    nic_resource_name: str = "topo.dev/nic"
    #: NIC IDs: `name` (the device's name: its PCI address when discovered from sysfs) or `pci` (its PCI address).
    nic_id_strategy: str = "name"
    nic_policy: str = "spread"
    #: Where NIC Allocate responses find device nodes (vfio, /dev/infiniband...), for the default pool.
    dev_root: str = "/dev"
    #: The GPU–NIC pairing window in seconds (0: off). Not used to build resources: it travels with
    #: them because a config reload applies it live, as it applies them (`plugin.allocation.pairing_service`).
    pairing_window_s: float = 1.0
    #: Give containers NCCL_IB_HCA / NCCL_SOCKET_IFNAME for their GPUs' NICs (`plugin.model.nccl_env`); like the
    #: window, applied live with the resources, by the pairing service and the DRA driver.
    nccl_env: bool = False
    #: NVIDIA's MIG strategy (`plugin.model.mig_strategy`).
    mig_strategy: str = "none"
    #: NVIDIA's `sharing.timeSlicing` (None: nothing is shared).
    time_slicing: TimeSlicing | None = None
    #: Host directory of the MPS control daemons (`--mps-root`), named in the Allocate answers of `sharing.mps`.
    mps_root: str = "/run/nvidia/mps"
    #: Resources served through DRA instead of the device-plugin API (checked by `plugin.model.serving_modes`).
    dra_resources: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.device_id_strategy not in ID_STRATEGIES:
            raise OptionError(f"device ID strategy {self.device_id_strategy!r} is not one of uuid, index")
        if self.nic_id_strategy not in NIC_ID_STRATEGIES:
            raise OptionError(f"NIC ID strategy {self.nic_id_strategy!r} is not one of {', '.join(NIC_ID_STRATEGIES)}")
        if self.mig_strategy not in MIG_STRATEGIES:
            raise OptionError(f"MIG strategy {self.mig_strategy!r} is not one of {', '.join(MIG_STRATEGIES)}")
        check_resource_name(self.gpu_resource_name)
        check_resource_name(self.nic_resource_name)
        for p in self.nic_pools:
            check_resource_name(p.resource_name)


def gpu_id(topology: NodeTopology, device: Device, strategy: str) -> str:
    """The plugin ID of a GPU (UUID or NVML index) or MIG device (MIG UUID or NVIDIA's `<gpu>:<mig>` index)."""
    if device.kind is DeviceKind.MIG:
        if strategy == "index":
            return device.attributes.get("index") or f"{topology.device(device.parent or '').index}:{device.index}"
        return device_uuid(topology.source, device)
    if strategy == "index":
        return str(device.index)
    return device_uuid(topology.source, device)


def _resource(
    topology: NodeTopology, name: str, kind: DeviceKind, members: list[tuple[str, Device, int | None]],
    policy: str, builder: AllocateBuilder, policy_options: Mapping[str, object] | None = None,
) -> Resource:
    devs = tuple(ResourceDevice(i, d, numa) for i, d, numa in members)
    graph = DeviceGraph.from_topology(topology, [d for _, d, _ in members], [i for i, _, _ in members])
    # NUMA in the graph follows what is advertised (an excluded topology means no NUMA preference).
    graph = DeviceGraph(graph.ids, tuple(n for _, _, n in members), graph.weights, graph.ports)
    return Resource(name, kind, devs, policy, graph, builder, dict(policy_options or {}))


def _unique(topology: NodeTopology, ids: list[str], what: str,
            fix: str = "give every GPU its own uuid (or use --device-id-strategy index)") -> None:
    if len(set(ids)) != len(ids):
        raise TopologyError(topology.source, f"{what} IDs are not unique: {', '.join(ids)}", fix=fix)


def _mig_resource(topology: NodeTopology, group: GpuGroup, options: ResourceOptions) -> Resource:
    """MIG devices: each with its parent GPU's NUMA node; the graph knows their parents (the `mig` policy)."""
    strategy = options.device_id_strategy
    parents = [topology.device(p) for p in dict.fromkeys(d.parent or "" for d in group.devices)]
    parent_ids = [gpu_id(topology, p, strategy) for p in parents]
    parent_graph = DeviceGraph.from_topology(topology, parents, parent_ids)
    of_parent = dict(zip((p.name for p in parents), parent_ids))
    ids = [gpu_id(topology, d, strategy) for d in group.devices]
    _unique(topology, ids, "MIG device")
    numa = {p.name: p.numa for p in parents}
    devs = tuple(ResourceDevice(i, d, numa[d.parent or ""]) for i, d in zip(ids, group.devices))
    graph = child_graph(parent_graph, [(i, of_parent[d.parent or ""]) for i, d in zip(ids, group.devices)])
    builder = GpuAllocateBuilder(options.gpu_allocate, group.name, topology.source)
    return Resource(group.name, DeviceKind.MIG, devs, "mig", graph, builder, dict(options.gpu_policy_options))


def _gpu_resources(topology: NodeTopology, options: ResourceOptions) -> list[Resource]:
    out: list[Resource] = []
    for group in group_gpus(topology, options.mig_strategy, options.gpu_resource_name):
        check_resource_name(group.name)
        if group.kind is DeviceKind.MIG:
            out.append(_mig_resource(topology, group, options))
            continue
        members = [(gpu_id(topology, d, options.device_id_strategy), d, d.numa) for d in group.devices]
        _unique(topology, [m[0] for m in members], "GPU")
        out.append(_resource(topology, group.name, DeviceKind.GPU, members, options.gpu_policy,
                             GpuAllocateBuilder(options.gpu_allocate, group.name, topology.source),
                             options.gpu_policy_options))
    return apply_time_slicing(out, options.time_slicing, options.gpu_resource_name,
                              lambda name: GpuAllocateBuilder(options.gpu_allocate, name, topology.source),
                              options.mps_root)


def nic_id(topology: NodeTopology, device: Device, strategy: str) -> str:
    """The plugin ID of a NIC: its name, or (`pci`) its PCI address.

    Why `pci`: Multus writes the device-plugin ID it finds in the kubelet's pod-resources API
    into the delegate CNI's config (`pciBusID`, `deviceID`); host-device and sriov-cni look the
    function up as /sys/bus/pci/devices/<ID>, so only a PCI address lets them attach
    exactly the NIC Allocate named. Discovered NICs are named by their PCI address already; a
    simulated one needs `pciBusId` in the node file.
    """
    if strategy == "name":
        return device.name
    if not device.pci_bus_id:
        raise TopologyError(topology.source, f"NIC {device.name} has no PCI address, which --nic-id-strategy pci "
                                             "needs as its ID",
                            fix=f"give {device.name} a pciBusId (e.g. pciBusId: \"0000:3b:00.0\") or use "
                                "--nic-id-strategy name")
    try:
        return normalize_bdf(device.pci_bus_id)
    except ValueError as e:
        raise TopologyError(topology.source, f"NIC {device.name}: pciBusId {e}",
                            fix="write it as the kernel does in /sys/bus/pci/devices, e.g. 0000:3b:00.0") from None


def _nic_resources(topology: NodeTopology, options: ResourceOptions) -> list[Resource]:
    nics = topology.nics
    out: list[Resource] = []
    if not nics:
        return out
    _unique(topology, [nic_id(topology, d, options.nic_id_strategy) for d in nics], "NIC",
            fix="give every NIC its own pciBusId (or use --nic-id-strategy name)")
    pools = options.nic_pools or (default_pool(options.nic_resource_name, options.nic_policy, options.dev_root),)
    taken: set[str] = set()
    for pool in pools:
        members = []
        for d in nics:
            if d.name in taken or not pool.select(d):
                continue
            taken.add(d.name)
            members.append((nic_id(topology, d, options.nic_id_strategy), d,
                            None if pool.exclude_topology else d.numa))
        if members:
            out.append(
                _resource(topology, pool.resource_name, DeviceKind.NIC, members, pool.policy,
                          pool.builder or default_pool(pool.resource_name, pool.policy, options.dev_root).builder)
            )
    return out


def _with_cdi(resource: Resource, options: ResourceOptions) -> Resource:
    """The resource with the CDI spec we write for it, and Allocate naming its devices from it.

    A GPU-family spec also holds the IMEX channels of NVIDIA's `imex.channelIDs` (one CDI device each, as
    NVIDIA's own `imex-channel` spec has), named in every answer beside the GPUs'."""
    o = options.gpu_allocate
    spec = spec_for(resource.name, resource.kind, [(d.id, d.device) for d in resource.devices],
                    CdiOptions(dev_root=options.dev_root))
    if spec is None:
        return resource
    channels: list[str] = []
    if o.imex_channels and resource.kind in (DeviceKind.GPU, DeviceKind.MIG):
        extra = tuple(CdiDevice(imex_cdi_name(c.id), Edits((c.cdi_node(),))) for c in o.imex_channels)
        spec = replace(spec, devices=spec.devices + extra)
        channels = [spec.qualified(d.name) for d in extra]
    builder = CdiNamingBuilder(resource.builder, spec, o.device_list_strategy, o.cdi_annotation_prefix, resource.name,
                               o.pass_device_specs, also=channels)
    return replace(resource, builder=builder, cdi_spec=spec)


def build_resources(topology: NodeTopology, options: ResourceOptions,
                    tables: SubsetTableCache | None = None) -> list[Resource]:
    """The resources to serve for `topology`; resources with no device are left out.

    With `tables` (the cache the policies answering these resources look up), what each resource's
    policy looks up is built now, off the RPC path, not by the first request.

    Raises `InputError`s for what the options cannot serve on this node (a MIG
    layout that does not fit the strategy, a time-slicing entry).
    """
    out = _gpu_resources(topology, options) + _nic_resources(topology, options)
    names = [r.name for r in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise OptionError(f"{', '.join(dup)} would be served twice (a GPU or MIG resource, their time-slicing "
                          "replicas and NIC pools each need a name of their own) (fix: rename one: "
                          "--gpu-resource-name, --nic-resource-name, nics.resourceList[].resourceName or "
                          "sharing.timeSlicing.resources[].rename)")
    if options.gpu_allocate.writes_specs:
        out = [_with_cdi(r, options) for r in out]
    if tables is not None:
        for r in out:
            prepare_tables(r.policy, r.graph, tables)
    return out
