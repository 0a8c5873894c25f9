"""CDI specs for our resources: GPUs (and their time-slicing replicas), MIG devices, NICs.

One spec per resource (kind `topo-dp.<domain>/<name>`, see `spec.kind_for_resource`),
one CDI device per *physical* device behind the resource's IDs:

- GPUs: named by the resource's ID (UUID or index, per `--device-id-strategy`)
  and also by the other of the two, so `kind=GPU-…` and `kind=3` both work.
  Device edits: `/dev/nvidia<minor>`. Spec edits (any GPU of the spec):
  `/dev/nvidiactl`, and `nvidia-uvm`, `nvidia-uvm-tools`, `nvidia-modeset`
  where the host has them. No env by default (`CdiOptions.gpu_env`): what
  `NVIDIA_VISIBLE_DEVICES` says is decided per container by Allocate
  (`plugin.model.gpu_allocate`): the GPU IDs with the `envvar` strategy, so that
  NVIDIA's runtime hook, where it is what mounts the driver libraries, adds
  them for exactly these GPUs; `void` with CDI strategies alone, so that the
  hook adds nothing (not even the `all` CUDA images set). A spec-wide env
  would override the former, since CDI edits are applied after the
  container's own env. Replica IDs (`<GPU ID>::<r>`) map to their GPU: each
  GPU once.
- MIG devices (designed for the discovery that comes later): a MIG `Device`
  carries `minor` = its parent GPU's minor, `uuid`, and attributes `index`
  (`<gpu>:<mig>`, NVIDIA's index form), `caps` (comma-separated
  `/dev/nvidia-caps/nvidia-cap<N>` paths: GPU instance and compute
  instance access) and `caps_major` (from /proc/devices, for a node not
  visible here). Device edits: the parent's `/dev/nvidia<minor>` plus the
  caps nodes; spec edits as for GPUs.
- NICs: the RDMA char devices (`/dev/infiniband/uverbsN`, `umadN`, `issmN`,
  and `rdma_cm`) and, for vfio-pci functions, `/dev/vfio/vfio` and the
  IOMMU group node (host path `noiommu-<group>` where the kernel uses one),
  read from the attributes sysfs discovery records. A NIC with nothing to
  inject (a plain netdev VF) has no CDI device: its Allocate response
  carries it as before.

The wiring phase: `spec_for_resource(resource, options)` for every resource,
handed to `plugin.cdi_files.CdiSpecWriter.sync`, and `names_for(spec, ids)` in
Allocate for `cdi-cri`/`cdi-annotations`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from allocator.subdevices import physical_id
from allocator.topology import Device, DeviceKind

from .nodes import NodeResolver
from .spec import DEFAULT_SPEC_DIR, VENDOR_PREFIX, CdiDevice, CdiSpec, DeviceNode, Edits, Mount, device_name, \
    kind_for_resource, qualified_names


#: The NVIDIA control node every GPU container needs, and those it gets where the host has them.
GPU_CONTROL_NODE = "/dev/nvidiactl"
GPU_OPTIONAL_NODES = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


@dataclass(frozen=True)
class CdiOptions:
    """How our specs are written (the daemon's config fills this in the wiring phase)."""

    spec_dir: str = DEFAULT_SPEC_DIR
    vendor_prefix: str = VENDOR_PREFIX
    #: Where this process sees the host's /dev, and where the runtime finds it.
    dev_root: str = "/dev"
    host_dev_root: str = "/dev"
    #: Spec-wide env of GPU and MIG specs (`KEY=VALUE`); none by default (see the module docstring).
    gpu_env: tuple[str, ...] = ()

    @property
    def resolver(self) -> NodeResolver:
        return NodeResolver(self.dev_root, self.host_dev_root)


Member = tuple[str, Device]


def _names(primary: str, *others: str | None) -> list[str]:
    out: list[str] = []
    for n in (primary, *others):
        if n is not None and device_name(n) not in out:
            out.append(device_name(n))
    return out


def _physical(members: Sequence[Member]) -> list[Member]:
    """One (ID, device) per physical device, replica IDs mapped to their GPU's ID, in order."""
    seen: set[str] = set()
    out: list[Member] = []
    for i, d in members:
        if d.name not in seen:
            seen.add(d.name)
            out.append((physical_id(i), d))
    return out


def _devices(entries: Sequence[tuple[list[str], Edits]]) -> tuple[CdiDevice, ...]:
    """One CDI device per name; a name already taken by an earlier device is skipped (its first
    owner keeps it), so an index that equals another device's ID can never make the spec invalid."""
    taken: set[str] = set()
    out = []
    for names, edits in entries:
        for n in names:
            if n not in taken:
                taken.add(n)
                out.append(CdiDevice(n, edits))
    return tuple(out)


def _control_edits(resolver: NodeResolver, env: Sequence[str]) -> Edits:
    nodes = [resolver.node(GPU_CONTROL_NODE), *(resolver.node(p, host_only=True) for p in GPU_OPTIONAL_NODES)]
    return Edits(tuple(n for n in nodes if n is not None), tuple(env))


def gpu_spec(kind: str, members: Sequence[Member], options: CdiOptions) -> CdiSpec | None:
    """The spec of a GPU (or time-sliced GPU) resource; None when it has no device."""
    r = options.resolver
    entries = []
    for i, d in _physical(members):
        minor = d.minor if d.minor is not None else d.index
        node = r.node(f"/dev/nvidia{minor}")
        assert node is not None  # nvidia<N> has fixed numbers
        entries.append((_names(i, d.uuid, str(d.index)), Edits((node,))))
    if not entries:
        return None
    return CdiSpec(kind, _devices(entries), _control_edits(r, options.gpu_env))


def mig_nodes(d: Device, r: NodeResolver) -> list[DeviceNode]:
    """A MIG device's nodes: its GPU's `/dev/nvidia<minor>` and the GPU and compute instance capability nodes."""
    nodes: list[DeviceNode | None] = []
    if d.minor is not None:
        nodes.append(r.node(f"/dev/nvidia{d.minor}"))
    major = d.attributes.get("caps_major")
    for cap in (c for c in d.attributes.get("caps", "").split(",") if c):
        minor = cap.rsplit("nvidia-cap", 1)[-1]
        fallback = (int(major), int(minor)) if major and minor.isdigit() else None
        nodes.append(r.node(cap, fallback=fallback))
    return [n for n in nodes if n is not None]


def mig_spec(kind: str, members: Sequence[Member], options: CdiOptions) -> CdiSpec | None:
    """The spec of a MIG resource (see the module docstring for what a MIG `Device` carries)."""
    r = options.resolver
    entries = []
    for i, d in _physical(members):
        edits = Edits(tuple(mig_nodes(d, r)))
        if not edits.empty:
            entries.append((_names(i, d.uuid, d.attributes.get("index")), edits))
    if not entries:
        return None
    return CdiSpec(kind, _devices(entries), _control_edits(r, options.gpu_env))


def nic_nodes(d: Device, resolver: NodeResolver) -> list[DeviceNode]:
    """The device nodes a container needs for NIC `d` (RDMA, vfio, uio), those we can describe.

    A vfio function counts only with its IOMMU group node: `/dev/vfio/vfio` alone is useless.
    """
    a = d.attributes
    nodes: list[DeviceNode | None] = []
    if a.get("rdma") == "true":
        nodes += [resolver.node(c) for c in a.get("rdma_char_devices", "").split(",") if c]
        nodes.append(resolver.node("/dev/infiniband/rdma_cm"))
    if a.get("driver") == "vfio-pci" and a.get("vfio_device"):
        group = resolver.node(a["vfio_device"], a.get("vfio_host_device") or None)
        if group is not None:
            nodes += [resolver.node("/dev/vfio/vfio"), group]
    if a.get("uio_device"):
        nodes.append(resolver.node(a["uio_device"]))
    return [n for n in nodes if n is not None]


def nic_spec(kind: str, members: Sequence[Member], options: CdiOptions) -> CdiSpec | None:
    """The spec of a NIC pool: one device per NIC that has a node to inject; None if none has."""
    r = options.resolver
    entries = []
    for i, d in _physical(members):
        nodes = nic_nodes(d, r)
        if nodes:
            entries.append((_names(i), Edits(tuple(nodes))))
    if not entries:
        return None
    return CdiSpec(kind, _devices(entries))


def claim_spec(kind: str, devices: Sequence[Member], options: CdiOptions,
               env: Sequence[Sequence[str]] = (), claim_env: Sequence[str] = (),
               mounts: Sequence[Sequence[Mount]] = ()) -> CdiSpec:
    """The spec of one DRA claim: one CDI device per (slice device name, device), named as in the slice.

    Device edits are what the device-plugin side injects for the same device (a GPU's
    `/dev/nvidia<minor>`, a NIC's RDMA/vfio/uio nodes) plus `env[i]` of device i, so that a device
    with no node to inject (a plain netdev) still tells the container it is there; the spec-wide
    edits are the GPU control nodes when the claim has a GPU, and `claim_env` (what concerns the claim
    as a whole: the NCCL hint, `plugin.model.nccl_env`), given to every container that gets any of its devices.
    `mounts[i]` are device i's bind mounts (the MPS pipe directory of a GPU shared through MPS).
    """
    r = options.resolver
    out = []
    for i, (name, d) in enumerate(devices):
        nodes: list[DeviceNode | None]
        if d.kind is DeviceKind.GPU:
            nodes = [r.node(f"/dev/nvidia{d.minor if d.minor is not None else d.index}")]
        elif d.kind is DeviceKind.MIG:
            nodes = list(mig_nodes(d, r))
        else:
            nodes = list(nic_nodes(d, r))
        out.append(CdiDevice(device_name(name), Edits(tuple(n for n in nodes if n is not None),
                                                      tuple(env[i]) if i < len(env) else (),
                                                      tuple(mounts[i]) if i < len(mounts) else ())))
    gpus = any(d.kind in (DeviceKind.GPU, DeviceKind.MIG) for _, d in devices)
    shared = _control_edits(r, (*options.gpu_env, *claim_env)) if gpus else Edits((), tuple(claim_env))
    return CdiSpec(kind, tuple(out), shared)


def spec_for(resource_name: str, kind: DeviceKind, members: Sequence[Member], options: CdiOptions) -> CdiSpec | None:
    """The CDI spec of a resource's (ID, device) members, or None when it has nothing to inject."""
    cdi_kind = kind_for_resource(resource_name, options.vendor_prefix)
    if kind is DeviceKind.GPU:
        return gpu_spec(cdi_kind, members, options)
    if kind is DeviceKind.MIG:
        return mig_spec(cdi_kind, members, options)
    return nic_spec(cdi_kind, members, options)


class _Member(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def device(self) -> Device: ...


class ServedResource(Protocol):
    """What a spec needs of a served resource (`plugin.model.resource.Resource` is one). A protocol, not an
    import: the resource layer imports this package to attach specs, so this package never imports it."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> DeviceKind: ...

    @property
    def devices(self) -> Sequence[_Member]: ...


def spec_for_resource(resource: ServedResource, options: CdiOptions) -> CdiSpec | None:
    """The CDI spec of one served resource, or None when it has nothing a runtime could inject."""
    return spec_for(resource.name, resource.kind, [(d.id, d.device) for d in resource.devices], options)


def names_for(spec: CdiSpec | None, ids: Sequence[str]) -> list[str]:
    """The qualified CDI names for an Allocate of `ids` (replicas map to their GPU, each GPU once)."""
    if spec is None:
        return []
    return qualified_names(spec, (device_name(physical_id(i)) for i in ids))
