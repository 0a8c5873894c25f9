"""ResourceSlices (resource.k8s.io/v1) for a node's devices, built from its topology.

Why a pure function: what the scheduler sees must follow from the topology
alone, so the same code answers `discover`-style questions offline, is checked
against the API server's own validation in a test, and is what the publisher
writes. The publisher adds nothing but object metadata it learns from the API
(resourceVersion).

Attributes (resource.k8s.io/v1, Kubernetes 1.37):

- standard (`resource.kubernetes.io/`, k8s.io/dynamic-resource-allocation
  deviceattribute): `pciBusID` (string, `dddd:bb:dd.f`, lower case),
  `pcieRoot` (string, `pci<domain>:<bus>`), `numaNode` (scalar int; left out
  when the kernel gives no NUMA node, as that package requires);
- ours, in the driver's domain (unqualified names belong to it): `type`
  (`gpu`/`nic`), `index`, `uuid`, `model`, `minor`, `pcieSwitch` (devices
  pairwise `PIX`), `nvlinkDomain` (NVLink connected component), `complex`
  (the GPU–NIC complex of a GPU or NIC on Grace/ConnectX-8 platforms: a GPU
  and a NIC with one value pair as `PIX` whatever their PCIe path); for NICs
  `netdev`, `rdma`, `pf` (the physical function/port it belongs to), `vf`,
  `vfIndex`, `linkType`, `driver`. GPU memory is the capacity `memory`; with
  `shared_gpus` a GPU also says `allowMultipleAllocations: true`, so claims
  can take shares of that memory (consumable capacity, KEP-5075, beta and on
  by default since 1.36; docs/dra.md "Sharing a GPU"). With `gpu_shares` N a
  shared GPU also has the capacity `shares` (N, 1 per claim by default, NVIDIA's
  `--consumable-shares <count>`), and `memory` then defaults to 0 per claim, so a
  claim takes 1 of N shares without naming memory.
  NICs also carry Multus's two attributes (multus-cni PR #1492, its draclient):
  `k8s.cni.cncf.io/resourceName` (the NIC's resource name in device-plugin
  mode, its pool's, which a NetworkAttachmentDefinition's
  `k8s.v1.cni.cncf.io/resourceName` annotation names) and
  `k8s.cni.cncf.io/deviceID` (its PCI address, what Multus hands the CNI
  plugin, e.g. host-device's `pciBusID`); Multus skips a device without both.
  GPUs whose NVML reports a module ID carry `gpuModuleID`, and those whose node
  states Fabric Manager partitions `partition1/2/4/8` (the ID of the partition
  of that size holding the GPU; NVIDIA's DRA driver's names and meaning).
  With `imex`, IMEX channels follow the GPUs and NICs as devices of their own
  (`imex-channel-<n>`: `type`, `id`, the node's `clique`; plugin/dra/slices/imex_channels.py).
  GPUs in a completed NVLink fabric (GB200/GB300 NVL72) also carry `clique`
  (string `<cluster UUID>.<clique ID>`, the value of GPU Feature Discovery's
  `nvidia.com/gpu.clique` label), so a claim can keep its GPUs in one domain.

Unhealthy devices: with `unhealthy="taint"` (default) they stay in the slice
with a `NoSchedule` taint `<driver>/unhealthy` (device taints are GA in 1.37),
so operators still see them and pods already using them keep running; with
`"remove"` they are left out (for API servers where the DRADeviceTaints gate
is off: such a server silently drops the taint, which would advertise a bad
device as good; the publisher notices that and switches to `"remove"`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from allocator.topology import Device, DeviceKind, LinkLevel, NodeTopology

from ...health.policy import taint_value
from ...model.identity import device_uuid
from .device_order import locality_order
from .imex_channels import ImexChannels, channel_devices
from ..mig.devices import MAX_COUNTER_SETS_PER_SLICE, DraMig, counter_sets, expand_gpu, table_entries
from .topology_groups import MAX_VALUE_LENGTH, membership, nvlink_domains, pcie_switch_groups, root_complex_groups

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
STANDARD_PREFIX = "resource.kubernetes.io/"
ATTR_PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"
ATTR_PCIE_ROOT = STANDARD_PREFIX + "pcieRoot"
ATTR_NUMA_NODE = STANDARD_PREFIX + "numaNode"
#: Multus's attributes on DRA devices it attaches networks to (multus-cni pkg/draclient).
MULTUS_PREFIX = "k8s.cni.cncf.io/"
ATTR_MULTUS_RESOURCE_NAME = MULTUS_PREFIX + "resourceName"
ATTR_MULTUS_DEVICE_ID = MULTUS_PREFIX + "deviceID"
UNHEALTHY_POLICIES = ("taint", "remove")
#: Devices per slice when any device may carry a taint (ResourceSliceMaxDevicesWithAdvancedFeatures).
MAX_DEVICES_PER_SLICE = 64
MANAGED_BY = "topo-device-plugin"
#: A bound on `gpu_shares` (as for time-slicing replicas: far more claims than one GPU can run).
MAX_GPU_SHARES = 1024

_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT_RE = re.compile(r"^pci[0-9a-f]{4,}:[0-9a-f]{2}$")
_DNS_LABEL_BAD = re.compile(r"[^a-z0-9-]+")
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _everything(_: Device) -> bool:
    return True


def _no_name(_: Device) -> str | None:
    return None


@dataclass(frozen=True)
class SliceOptions:
    """What to publish and under which names. Plain data: the config layer maps its keys onto it."""

    #: Node the slices describe (spec.nodeName); also the default pool name.
    node_name: str
    #: DRA driver name; also the domain of our attributes and of the unhealthy taint.
    driver_name: str = "topo.dev"
    #: Pool name; default: the node name (one pool per node, as node-local drivers do).
    pool_name: str | None = None
    #: Which devices are served through DRA (the others stay with the device-plugin side).
    include: Callable[[Device], bool] = field(default=_everything, compare=False)
    #: `taint` or `remove` (see the module docstring).
    unhealthy: str = "taint"
    max_devices_per_slice: int = MAX_DEVICES_PER_SLICE
    #: GPUs in MIG mode: served whole, as static MIG devices, or partitionable (plugin/dra/mig/devices.py).
    mig: DraMig = field(default_factory=DraMig)
    #: GPUs with a memory size allow multiple allocations (consumable capacity, KEP-5075): a claim may ask for
    #: a share of the `memory` capacity; one that asks for none takes all of it, i.e. the whole GPU.
    shared_gpus: bool = False
    #: Shares by count (0: off): each GPU also has the capacity `shares` of this many, 1 per claim by default,
    #: and allows multiple allocations (NVIDIA's `--consumable-shares <count>`).
    gpu_shares: int = 0
    #: The device-plugin resource name of a NIC (its pool's), published for Multus; None: not published.
    nic_resource_name: Callable[[Device], str | None] = field(default=_no_name, compare=False)
    #: Host-managed IMEX channels to publish (plugin/dra/slices/imex_channels.py); None: none.
    imex: ImexChannels | None = None

    def __post_init__(self) -> None:
        check_driver_name(self.driver_name)
        if not self.node_name or not _SUBDOMAIN_RE.match(self.node_name) or len(self.node_name) > 253:
            raise ValueError(f"node name {self.node_name!r} is not a DNS subdomain (the name of a Node object)")
        if self.pool_name is not None and not all(_SUBDOMAIN_RE.match(p) for p in self.pool_name.split("/")):
            raise ValueError(f"pool name {self.pool_name!r}: want DNS subdomains separated by '/'")
        if self.unhealthy not in UNHEALTHY_POLICIES:
            raise ValueError(f"unhealthy policy {self.unhealthy!r} is not one of {', '.join(UNHEALTHY_POLICIES)}")
        if not 1 <= self.max_devices_per_slice <= MAX_DEVICES_PER_SLICE:
            raise ValueError(f"max_devices_per_slice must be 1..{MAX_DEVICES_PER_SLICE}")
        if not 0 <= self.gpu_shares <= MAX_GPU_SHARES:
            raise ValueError(f"gpu_shares {self.gpu_shares} is not 0..{MAX_GPU_SHARES} (0: no share count)")

    @property
    def shares_gpus(self) -> bool:
        """GPUs say allowMultipleAllocations (memory shares, or shares by count)."""
        return self.shared_gpus or self.gpu_shares > 0

    @property
    def pool(self) -> str:
        return self.pool_name or self.node_name


def check_driver_name(name: str) -> None:
    """A DRA driver name is a lower-case DNS subdomain of at most 63 characters (DriverNameMaxLength)."""
    if not _SUBDOMAIN_RE.match(name) or len(name) > 63 or "." not in name:
        raise ValueError(f"DRA driver name {name!r}: want a lower-case DNS subdomain with a domain you own "
                         "(at most 63 characters), e.g. topo.dev")


def device_name(d: Device) -> str:
    """The device's name in the slice: a DNS label, stable for the device (`gpu-0`, `nic-mlx5-0`)."""
    if d.kind == DeviceKind.GPU:
        return f"gpu-{d.index}"
    base = _DNS_LABEL_BAD.sub("-", d.name.lower()).strip("-") or str(d.index)
    name = f"nic-{base}"
    return name if len(name) <= 63 else f"nic-{d.index}-{hashlib.sha256(d.name.encode()).hexdigest()[:12]}"


def _s(value: str) -> dict[str, str]:
    return {"string": value[:MAX_VALUE_LENGTH]}


def _standard_attributes(d: Device, pcie_root: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if d.pci_bus_id and _BDF_RE.match(d.pci_bus_id.lower()):
        attrs[ATTR_PCI_BUS_ID] = _s(d.pci_bus_id.lower())
    if pcie_root:
        attrs[ATTR_PCIE_ROOT] = _s(pcie_root)
    if d.numa is not None and d.numa >= 0:
        attrs[ATTR_NUMA_NODE] = {"int": d.numa}
    return attrs


def pcie_roots(topology: NodeTopology) -> dict[str, str]:
    """{device name: `pci<domain>:<bus>`} where it can be told.

    A root the source read from sysfs (`pcie_root` attribute) wins and is
    shared with the rest of the device's root-complex group. A group of
    devices with no PCI address at all (a simulated node) gets a made-up root
    consistent with its links; a real device whose root is unknown gets none.
    """
    out: dict[str, str] = {}
    synthetic: list[list[Device]] = []
    for group in sorted(root_complex_groups(topology), key=lambda g: min(x.name for x in g)):
        known = sorted({d.attributes.get("pcie_root", "") for d in group} - {""})
        known = [r for r in known if _ROOT_RE.match(r)]
        for d in group:
            own = d.attributes.get("pcie_root", "")
            if own and _ROOT_RE.match(own):
                out[d.name] = own
            elif known:
                out[d.name] = known[0]
        if not known and all(d.pci_bus_id is None for d in group):
            synthetic.append(group)
    used = set(out.values())
    bus = 0
    for group in synthetic:
        while f"pci0000:{bus:02x}" in used:
            bus += 1
        for d in group:
            out[d.name] = f"pci0000:{bus:02x}"
        used.add(f"pci0000:{bus:02x}")
        bus += 1
    return out


def _gpu_attributes(topology: NodeTopology, d: Device) -> tuple[dict[str, Any], dict[str, Any]]:
    attrs: dict[str, Any] = {
        "type": _s("gpu"),
        "index": {"int": d.index},
        "uuid": _s(device_uuid(topology.source, d)),
    }
    if d.model:
        attrs["model"] = _s(d.model)
    if d.minor is not None:
        attrs["minor"] = {"int": d.minor}
    if d.fabric is not None and d.fabric.state == "completed":
        # The NVLink domain (multi-node NVLink): a claim can ask for GPUs of one clique.
        attrs["clique"] = _s(d.fabric.clique)
    attrs.update(partition_attributes(d))
    capacity = {"memory": {"value": f"{d.memory_mib}Mi"}} if d.memory_mib else {}
    return attrs, capacity


def partition_attributes(d: Device) -> dict[str, Any]:
    """`gpuModuleID` and `partition<size>` from the GPU's attributes (`module_id`, `partition_<size>`).

    Why these names: NVIDIA's DRA driver publishes the same (cmd/gpu-kubelet-plugin/deviceinfo.go), so a
    claim written for it (`matchAttribute: gpu.nvidia.com/partition4` there, `topo.dev/partition4` here)
    keeps its meaning: all GPUs of the claim in one Fabric Manager partition of that size. Only what the
    source read is published; a GPU without a module ID or partitions has none of them.
    """
    a: Mapping[str, str] = d.attributes
    out: dict[str, Any] = {}
    if a.get("module_id", "").isdigit() and int(a["module_id"]) > 0:
        out["gpuModuleID"] = {"int": int(a["module_id"])}
    for size in PARTITION_SIZES:
        value = a.get(f"partition_{size}", "")
        if value.isdigit():
            out[f"partition{size}"] = {"int": int(value)}
    return out


#: The Fabric Manager partition sizes an 8-GPU NVSwitch board has (NVIDIA's attribute names).
PARTITION_SIZES = (1, 2, 4, 8)


def _multus_attributes(d: Device, resource_name: str | None) -> dict[str, Any]:
    """Multus's pair, only when both are known: its draclient skips a device that lacks either."""
    if not resource_name or not d.pci_bus_id or not _BDF_RE.match(d.pci_bus_id.lower()):
        return {}
    return {ATTR_MULTUS_RESOURCE_NAME: _s(resource_name), ATTR_MULTUS_DEVICE_ID: _s(d.pci_bus_id.lower())}


def _nic_attributes(d: Device) -> dict[str, Any]:
    a: Mapping[str, str] = d.attributes
    attrs: dict[str, Any] = {"type": _s("nic"), "index": {"int": d.index}}
    if d.model:
        attrs["model"] = _s(d.model)
    if a.get("netdev"):
        attrs["netdev"] = _s(a["netdev"])
    if "rdma" in a:
        attrs["rdma"] = {"bool": a["rdma"] == "true"}
    is_vf = bool(a.get("pf"))
    pf = a.get("pf") or d.port
    if pf:
        attrs["pf"] = _s(pf)
    if a or d.port:
        attrs["vf"] = {"bool": is_vf}
    if is_vf and a.get("vf_index", "").isdigit():
        attrs["vfIndex"] = {"int": int(a["vf_index"])}
    if a.get("link_type"):
        attrs["linkType"] = _s(a["link_type"])
    if a.get("driver"):
        attrs["driver"] = _s(a["driver"])
    return attrs


def complex_value(complex_id: str) -> str:
    """The `complex` attribute: the complex ID itself, or `complex-<hash>` when it is longer than a
    DRA string attribute may be (a GPU and a NIC of one complex get the same value either way)."""
    if len(complex_id) <= MAX_VALUE_LENGTH:
        return complex_id
    return "complex-" + hashlib.sha256(complex_id.encode()).hexdigest()[:16]


def pair_aligned_order(devices: list[Device], topology: NodeTopology) -> list[Device]:
    """GPUs by locality (`device_order.locality_order`), then NICs in the order of the first GPU each is close to.

    Why: a claim without constraints between its requests (the one kube-scheduler makes for a pod
    asking `nvidia.com/gpu: 2` and `topo.dev/nic: 2` through the extended-resource mapping) is
    filled first-fit in slice order, request by request. With the k-th NIC beside the k-th GPU,
    the first free GPUs and the first free NICs are pairs as long as pods take GPUs and NICs
    together (docs/dra.md, benchmarks/dra_extended_pairing_bench.py). Close: one GPU–NIC complex,
    or a PIX/PXB PCIe path. NICs close to no GPU go last; ties keep index order.
    """
    gpus = locality_order([d for d in devices if d.kind == DeviceKind.GPU], topology)
    others = sorted((d for d in devices if d.kind != DeviceKind.GPU), key=lambda d: (d.index, d.name))

    def close(gpu: Device, nic: Device) -> bool:
        if gpu.complex is not None and gpu.complex == nic.complex:
            return True
        return topology.link(gpu.name, nic.name).level >= LinkLevel.PXB

    def rank(d: Device) -> int:
        if d.kind == DeviceKind.NIC:
            return next((i for i, g in enumerate(gpus) if close(g, d)), len(gpus))
        return len(gpus)

    return gpus + [d for _, d in sorted(enumerate(others), key=lambda p: (rank(p[1]), p[0]))]


def build_devices(topology: NodeTopology, options: SliceOptions) -> list[dict[str, Any]]:
    """The `spec.devices` entries for every included device, in `pair_aligned_order`."""
    switches = membership(pcie_switch_groups(topology), "pix")
    nvlink = membership(nvlink_domains(topology), "nvlink")
    roots = pcie_roots(topology)
    # MIG devices are published through their GPU (mig_devices.expand_gpu), never on their own.
    chosen = pair_aligned_order([d for d in topology.devices if options.include(d) and d.kind != DeviceKind.MIG],
                                topology)
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for d in chosen:
        if not d.healthy and options.unhealthy == "remove":
            continue
        name = device_name(d)
        if name in names:
            raise ValueError(f"devices {names[name]!r} and {d.name!r} both map to the slice device name {name!r}")
        names[name] = d.name
        capacity: dict[str, Any] = {}
        if d.kind == DeviceKind.GPU:
            attrs, capacity = _gpu_attributes(topology, d)
        else:
            attrs = _nic_attributes(d)
            attrs.update(_multus_attributes(d, options.nic_resource_name(d)))
        if d.name in switches:
            attrs["pcieSwitch"] = _s(switches[d.name])
        if d.name in nvlink:
            attrs["nvlinkDomain"] = _s(nvlink[d.name])
        if d.complex is not None:
            attrs["complex"] = _s(complex_value(d.complex))
        attrs.update(_standard_attributes(d, roots.get(d.name)))
        entry: dict[str, Any] = {"name": name, "attributes": dict(sorted(attrs.items()))}
        if capacity:
            entry["capacity"] = capacity
            if options.shares_gpus and d.kind == DeviceKind.GPU:
                # No requestPolicy: a request without `capacity` consumes the whole memory, so claims that
                # know nothing of sharing still get a GPU of their own.
                entry["allowMultipleAllocations"] = True
                if options.gpu_shares:
                    entry["capacity"] = share_capacity(capacity, options.gpu_shares)
        if not d.healthy:
            # The value names the cause and the action (`xid-48.reset-gpu`): a taint value must be a label value.
            entry["taints"] = [{"key": f"{options.driver_name}/unhealthy",
                                "value": taint_value(d.health_reason) if d.health_reason else d.health,
                                "effect": "NoSchedule"}]
        out.extend(expand_gpu(topology, d, entry, options.mig, options.driver_name) if d.kind == DeviceKind.GPU
                   else [entry])
    if options.imex is not None:  # last: the GPUs' and NICs' slice order stays as it was
        out.extend(channel_devices(topology, options.imex.count))
    return out


def share_capacity(capacity: dict[str, Any], shares: int) -> dict[str, Any]:
    """Capacity for shares by count, as NVIDIA's `--consumable-shares <count>` publishes it.

    `shares`: N, each claim 1 unless it asks more (1..N, step 1). `memory`: each claim 0 unless it
    asks (0..all, step 1Mi), so a claim naming only a share count does not take the whole memory;
    one that names memory still gets (and is accounted) that much.
    """
    out = dict(capacity)
    if "memory" in out:
        total = out["memory"]["value"]
        out["memory"] = {"value": total, "requestPolicy": {
            "default": "0", "validRange": {"min": "0", "max": total, "step": "1Mi"}}}
    out["shares"] = {"value": str(shares), "requestPolicy": {
        "default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}}}
    return out


def slice_name(options: SliceOptions, index: int) -> str:
    return f"{options.node_name}-{options.driver_name}-{index}"


def build_resource_slices(
    topology: NodeTopology, options: SliceOptions, *, generation: int = 1, node_uid: str | None = None,
) -> list[dict[str, Any]]:
    """The node's ResourceSlice objects (JSON-shaped dicts) for one pool generation.

    At least one slice is returned even with no device: an empty pool tells
    the scheduler "this node has none", which is different from "not known".
    `node_uid` (when known) makes the Node the owner, so the slices go when
    the node object does.
    """
    if generation < 1:
        raise ValueError("pool generation starts at 1")
    devices = build_devices(topology, options)
    chunks: list[list[dict[str, Any]]] = [devices[i:i + options.max_devices_per_slice]
                                          for i in range(0, len(devices), options.max_devices_per_slice)] or [[]]
    # Counter sets of partitionable GPUs go in slices of their own (a slice has devices or counters).
    counters = counter_sets([d for d in topology.gpus if options.include(d)], options.mig)
    counter_chunks = [counters[i:i + MAX_COUNTER_SETS_PER_SLICE]
                      for i in range(0, len(counters), MAX_COUNTER_SETS_PER_SLICE)]
    out = []
    for i, chunk in enumerate(chunks + counter_chunks):
        meta: dict[str, Any] = {
            "name": slice_name(options, i),
            "labels": {"app.kubernetes.io/managed-by": MANAGED_BY},
        }
        if node_uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": options.node_name,
                                        "uid": node_uid, "controller": True}]
        spec: dict[str, Any] = {
            "driver": options.driver_name,
            "nodeName": options.node_name,
            "pool": {"name": options.pool, "generation": generation,
                     "resourceSliceCount": len(chunks) + len(counter_chunks)},
        }
        if i >= len(chunks):
            spec["sharedCounters"] = chunk
        elif chunk:
            spec["devices"] = chunk
        out.append({"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": spec})
    return out


def device_table(topology: NodeTopology, options: SliceOptions) -> dict[str, Device]:
    """{slice device name: Device} for the devices this driver serves (healthy or not).

    Every GPU carries the UUID its slice publishes (`plugin.model.identity`), also a simulated one that
    has none of its own: what prepare puts in the container must be what a claim selected on.
    """
    out: dict[str, Device] = {}
    for d in topology.devices:
        if not options.include(d) or d.kind == DeviceKind.MIG:
            continue
        mig = table_entries(topology, d, options.mig) if d.kind == DeviceKind.GPU else None
        if mig is not None:  # a GPU in MIG mode served as MIG devices (static or partitionable)
            out.update(mig)
        else:
            out[device_name(d)] = _with_uuid(topology, d)
    return out


def _with_uuid(topology: NodeTopology, d: Device) -> Device:
    if d.kind not in (DeviceKind.GPU, DeviceKind.MIG) or d.uuid:
        return d
    return replace(d, uuid=device_uuid(topology.source, d))
