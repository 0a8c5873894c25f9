"""Groups of devices that share a piece of the machine, derived from the topology's links.

Why derived from links: every discovery source (NVML + sysfs, a simulated node,
an `nvidia-smi topo -m` matrix) ends in the same `NodeTopology`, which records
the link of every pair but not the PCIe tree itself. The groups a DRA claim
wants to match on follow from those links:

- **PCIe switch** (`PIX`): devices joined by at most one PCIe switch. `PIX` is
  not guaranteed transitive in measured data (a function one bridge deeper can
  be `PIX` to both sides of a switch that are `PXB` to each other), so groups
  are cliques: every two members of a group are `PIX`. A device with no `PIX`
  partner is in no group, so `matchAttribute` never pairs it.
- **PCIe root complex** (`PIX`, `PXB` or `PHB`): the connected components of
  "same host bridge". `NODE`/`SYS` pairs are on different root complexes.
- **NVLink domain**: the connected components of NVLink (direct or through
  NVSwitch). A domain says "reachable over NVLink", not "every pair direct"
  (DGX-1's hybrid cube mesh is one domain).

The PCIe level of an NVLink pair is used where the source recorded it; a
matrix hides it behind `NV<n>` (recorded as SYS). Two NVLink-connected GPUs
that are both `PIX` to the same third device (DGX-1: two GPUs and a NIC on
one PCIe switch) are under that switch too, since in a PCIe tree "both one
switch away from x" means "one switch away from each other"; they count as
`PIX` for grouping.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from allocator.topology import Device, DeviceKind, LinkLevel, NodeTopology

#: Longest value an attribute string may have (resource.k8s.io/v1 DeviceAttributeMaxValueLength).
MAX_VALUE_LENGTH = 64


def device_key(d: Device) -> str:
    """How a device is named inside group IDs: its PCI address when known, else its name."""
    return d.pci_bus_id or d.name


def group_id(prefix: str, members: Iterable[Device]) -> str:
    """A stable ID for a group: `<prefix>-<key of its first member>`, hashed when too long."""
    first = min(device_key(d) for d in members)
    value = f"{prefix}-{first}"
    if len(value) <= MAX_VALUE_LENGTH:
        return value
    return f"{prefix}-{hashlib.sha256(first.encode()).hexdigest()[:16]}"


def _components(devices: Sequence[Device], joined: Callable[[Device, Device], bool]) -> list[list[Device]]:
    parent = list(range(len(devices)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(len(devices)):
        for j in range(i + 1, len(devices)):
            if joined(devices[i], devices[j]):
                parent[find(i)] = find(j)
    groups: dict[int, list[Device]] = {}
    for i, d in enumerate(devices):
        groups.setdefault(find(i), []).append(d)
    return list(groups.values())


def pcie_switch_groups(topology: NodeTopology) -> list[list[Device]]:
    """Cliques of devices that are pairwise `PIX`; only groups of two or more.

    A component of the `PIX` relation that is already a clique is one group
    (the common case: a switch and everything below it). Otherwise it is split
    greedily in device-key order, each device joining the first group it is
    `PIX` to in full, so no group ever holds a pair that is not `PIX`.
    """
    def direct(a: Device, b: Device) -> bool:
        return topology.link(a.name, b.name).level == LinkLevel.PIX

    def pix(a: Device, b: Device) -> bool:
        if direct(a, b):
            return True
        return topology.link(a.name, b.name).nvlinks > 0 and any(
            direct(a, x) and direct(b, x) for x in topology.devices if x.name not in (a.name, b.name))

    out: list[list[Device]] = []
    for comp in _components(topology.devices, pix):
        if len(comp) < 2:
            continue
        cliques: list[list[Device]] = []
        for d in sorted(comp, key=device_key):
            home = next((c for c in cliques if all(pix(d, m) for m in c)), None)
            if home is None:
                cliques.append([d])
            else:
                home.append(d)
        out.extend(c for c in cliques if len(c) >= 2)
    return out


def root_complex_groups(topology: NodeTopology) -> list[list[Device]]:
    """Connected components of "same PCIe root complex" (`PIX`, `PXB` or `PHB`), singletons included."""
    return _components(topology.devices,
                       lambda a, b: topology.link(a.name, b.name).level >= LinkLevel.PHB)


def nvlink_domains(topology: NodeTopology) -> list[list[Device]]:
    """Connected components of NVLink among GPUs; GPUs with no NVLink are in none."""
    gpus = topology.of_kind(DeviceKind.GPU)
    comps = _components(gpus, lambda a, b: topology.link(a.name, b.name).nvlinks > 0)
    return [c for c in comps if len(c) >= 2]


def membership(groups: Iterable[list[Device]], prefix: str) -> dict[str, str]:
    """{device name: group ID} for `groups`."""
    out: dict[str, str] = {}
    for g in groups:
        gid = group_id(prefix, g)
        for d in g:
            out[d.name] = gid
    return out
