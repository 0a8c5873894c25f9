"""How `discover` shows a node: device tables, the link matrix, JSON/YAML, Graphviz.

Why a module of its own: the same views serve `discover`, `demo` and the docs,
and they are pure functions of the topology and resources (easy to test).
"""

from __future__ import annotations

from typing import Any

from allocator.pairing import pair_label, pair_weight
from allocator.topology import Device, DeviceKind, NodeTopology

from .resources import Resource, gpu_id


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join("{:<%d}" % w for w in widths)
    return [fmt.format(*header).rstrip()] + [fmt.format(*map(str, r)).rstrip() for r in rows]


def _linked(topology: NodeTopology) -> list:
    """GPUs and NICs: the devices with links (a MIG device has its parent GPU's)."""
    return [d for d in topology.devices if d.kind is not DeviceKind.MIG]


def link_matrix(topology: NodeTopology) -> list[str]:
    """The `nvidia-smi topo -m` style matrix over every GPU and NIC, with a NUMA column."""
    names = [d.name for d in _linked(topology)]
    rows = []
    for d in _linked(topology):
        cells = ["X" if o == d.name else topology.link(d.name, o).label for o in names]
        rows.append([d.name, *cells, "N/A" if d.numa is None else str(d.numa)])
    return _table(rows, ["", *names, "NUMA Affinity"])


def _numa(n: int | None) -> str:
    return "-" if n is None else str(n)


def plural(n: int, word: str) -> str:
    """`1 GPU`, `2 GPUs`, `0 NICs`."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def closest_nics(topology: NodeTopology, gpu: Device) -> tuple[str, list[str]]:
    """The NICs best linked to `gpu` (what pairing gives it when they are free) and that link's type;
    ("", []) on a node without NICs."""
    weights = {n.name: pair_weight(topology, gpu, n) for n in topology.nics}
    if not weights:
        return "", []
    top = max(weights.values())
    return pair_label(top), [n for n, w in weights.items() if w == top]


def _complex(d: Device) -> str:
    """`<id> (<kind>)`, or `-` for a device outside any complex."""
    if d.complex is None:
        return "-"
    return f"{d.complex} ({d.complex_kind.value})" if d.complex_kind else d.complex


def has_complexes(topology: NodeTopology) -> bool:
    """Whether any GPU or NIC names a complex (only then do the views show complexes, so a node
    without them prints exactly what it always did)."""
    return any(d.complex is not None for d in topology.devices)


def complex_pairs(topology: NodeTopology) -> list[tuple[Device, Device]]:
    """(GPU, NIC) pairs of one complex, in device order: the pairs the platform defines."""
    return [(g, n) for g in topology.gpus for n in topology.nics if g.complex is not None and g.complex == n.complex]


def render_table(topology: NodeTopology, resources: list[Resource], description: str) -> str:
    migs = topology.of_kind(DeviceKind.MIG)
    out = [f"Node {topology.source} ({description}): {plural(len(topology.gpus), 'GPU')}, "
           + (f"{plural(len(migs), 'MIG device')}, " if migs else "")
           + f"{plural(len(topology.nics), 'NIC')}, "
           f"NUMA nodes {', '.join(map(str, topology.numa_nodes)) or 'unknown'}", ""]
    complexes = has_complexes(topology)
    for r in resources:
        out.append(f"Resource {r.name}  policy={r.policy}  socket={r.socket_name}  devices={len(r.devices)}")
        if r.kind is DeviceKind.MIG:
            rows = [[d.id, d.device.name, d.device.attributes.get("profile", "-"), _numa(d.numa), d.health,
                     device_uuid(topology, d.device) or "-"] for d in r.devices]
            out += ["  " + line for line in _table(rows, ["ID", "DEVICE", "PROFILE", "NUMA", "HEALTH", "UUID"])]
        elif r.kind is DeviceKind.GPU:
            rows = [[d.id, d.device.name, _numa(d.numa), d.health, d.device.model or "-",
                     d.device.pci_bus_id or "-"] for d in r.devices]
            header = ["ID", "DEVICE", "NUMA", "HEALTH", "MODEL", "PCI"]
            if complexes:
                header.append("COMPLEX")
                for row, d in zip(rows, r.devices):
                    row.append(_complex(d.device))
            if topology.nics:
                header.append("CLOSEST NICS")
                for row, d in zip(rows, r.devices):
                    link, nics = closest_nics(topology, d.device)
                    row.append(f"{','.join(nics)} ({link})")
            out += ["  " + line for line in _table(rows, header)]
        else:
            rows = [[d.id, d.device.name, _numa(d.numa), d.health, d.device.port or "-",
                     d.device.attributes.get("netdev", "-"), d.device.attributes.get("driver", "-")]
                    for d in r.devices]
            header = ["ID", "DEVICE", "NUMA", "HEALTH", "PORT", "NETDEV", "DRIVER"]
            if complexes:
                header.append("COMPLEX")
                for row, d in zip(rows, r.devices):
                    row.append(_complex(d.device))
            out += ["  " + line for line in _table(rows, header)]
        out.append("")
    served = {rd.device.name for r in resources for rd in r.devices}
    unserved = [d.name for d in topology.nics if d.name not in served]
    if unserved:
        out += [f"Not served (no pool selects them): {', '.join(unserved)}", ""]
    idle = [d for d in topology.gpus if d.name not in served] + [d for d in migs if d.name not in served]
    if idle:
        out += [f"Not served under this --mig-strategy: {', '.join(d.name for d in idle)}", ""]
    out.append("Links (X = self, NV# = bonded NVLinks, PIX/PXB/PHB/NODE/SYS = PCIe path):")
    out += link_matrix(topology)
    if complexes:
        out += ["", "GPU–NIC complexes (each pair counts as PIX for pairing, whatever its PCIe path):"]
        out += ["  " + line for line in _table([[g.name, n.name, _complex(g), topology.link(g.name, n.name).label]
                                                for g, n in complex_pairs(topology)],
                                               ["GPU", "NIC", "COMPLEX", "PCIE PATH"])]
    return "\n".join(out) + "\n"


def device_uuid(topology: NodeTopology, device: Device) -> str | None:
    """A GPU's or MIG device's UUID as the plugin advertises it: a simulated one without a `uuid` field gets
    the stable made-up UUID its device ID is (`resources.gpu_id`, the one place that derives it)."""
    if device.kind in (DeviceKind.GPU, DeviceKind.MIG):
        return gpu_id(topology, device, "uuid")
    return device.uuid


def to_data(topology: NodeTopology, resources: list[Resource]) -> dict[str, Any]:
    return {
        "node": topology.source,
        "numaNodes": list(topology.numa_nodes),
        "devices": [
            {"name": d.name, "kind": d.kind.value, "index": d.index, "numa": d.numa, "health": d.health,
             "uuid": device_uuid(topology, d), "pciBusId": d.pci_bus_id, "model": d.model, "port": d.port,
             "parent": d.parent, "attributes": dict(d.attributes),
             **({"complex": d.complex, "complexKind": d.complex_kind.value if d.complex_kind else None}
                if d.complex is not None else {}),
             **({"fabric": {"clusterUuid": d.fabric.cluster_uuid, "cliqueId": d.fabric.clique_id,
                            "state": d.fabric.state, "clique": d.fabric.clique}} if d.fabric is not None else {}),
             **({"closestNics": dict(zip(("link", "nics"), closest_nics(topology, d)))}
                if d.kind is DeviceKind.GPU and topology.nics else {})}
            for d in topology.devices
        ],
        "resources": [
            {"name": r.name, "policy": r.policy, "socket": r.socket_name,
             "devices": [{"id": d.id, "device": d.device.name, "numa": d.numa, "health": d.health}
                         for d in r.devices]}
            for r in resources
        ],
        "links": [{"a": a, "b": b, "link": link.label, "weight": link.weight}
                  for (a, b), link in sorted(topology.links.items())],
    }


def render_dot(topology: NodeTopology) -> str:
    """Graphviz: one cluster per NUMA node, NVLink edges bold, PCIe edges only when closer than NODE,
    GPU–NIC complex pairs green (they pair whatever the PCIe path says)."""
    lines = ["graph topology {", '  graph [rankdir=LR, fontname="Helvetica"];', '  node [fontname="Helvetica"];']
    groups: dict[int | None, list[str]] = {}
    for d in _linked(topology):
        groups.setdefault(d.numa, []).append(d.name)
    for numa, names in groups.items():
        indent = "  "
        if numa is not None:
            lines.append(f'  subgraph "cluster_numa{numa}" {{ label="NUMA {numa}";')
            indent = "    "
        for n in names:
            shape = "box" if topology.device(n).kind is DeviceKind.GPU else "ellipse"
            lines.append(f'{indent}"{n}" [shape={shape}];')
        if numa is not None:
            lines.append("  }")
    for (a, b), link in sorted(topology.links.items()):
        if link.nvlinks:
            lines.append(f'  "{a}" -- "{b}" [label="{link.label}", penwidth={min(1 + link.nvlinks / 3, 6):.1f}];')
        elif link.level.name in ("PIX", "PXB", "PHB"):
            lines.append(f'  "{a}" -- "{b}" [label="{link.label}", style=dashed];')
    for gpu, nic in complex_pairs(topology):
        lines.append(f'  "{gpu.name}" -- "{nic.name}" [label="complex {gpu.complex}", style=bold, color=darkgreen];')
    lines.append("}")
    return "\n".join(lines) + "\n"
