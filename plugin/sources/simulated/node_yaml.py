"""Our own simulated-node format (`apiVersion: topo-device-plugin/v1`, `kind: SimulatedNode`).

Why our own format next to `nvidia-smi topo -m` text: it can say what the
text cannot (health, UUIDs, models, NUMA distances, NIC ports), it is what
users edit to simulate failures while the daemon runs, and the built-in nodes
are written in it. The JSON schema in `plugin/sources/schema/` is the
reference; errors name the file, the line and the field.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from allocator.topology import HEALTHY, ComplexKind, Device, DeviceKind, FabricInfo, Link, LinkLevel, NodeTopology

from ...inputs import yaml_input
from ...inputs.yamlpath import field_path, line_of
from ..errors import TopologyError
from ..nvml_mig import caps_attribute, cap_minors
from .driver_health import NodeDriverFacts, driver_facts
from .topo_matrix import load_topo_matrix

API_VERSION = "topo-device-plugin/v1"
KIND = "SimulatedNode"
_MIG_NS = uuid.UUID("2c7d5a1e-8f34-4b6a-9d0e-71f3a6c2b845")


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    text = resources.files("plugin.sources").joinpath("schema/simulated-node-v1.json").read_text()
    return json.loads(text)


def load_node_yaml(text: str, source: str) -> NodeTopology:
    return _build(*_validated(text, source), source)


def load_node_yaml_with_driver(text: str, source: str) -> tuple[NodeTopology, NodeDriverFacts]:
    """The topology and the GPUs' simulated driver facts (`driver:`, `bootId`; see driver_health.py)."""
    data, root = _validated(text, source)
    return _build(data, root, source), driver_facts(data)


def _validated(text: str, source: str) -> tuple[Mapping[str, Any], yaml.Node | None]:
    try:
        data, root = yaml_input.load(text)
        if not isinstance(data, Mapping):
            raise TopologyError(source, "expected a mapping with apiVersion: topo-device-plugin/v1",
                                fix="start the file with `apiVersion: topo-device-plugin/v1` and `kind: SimulatedNode`")
        bad = yaml_input.first_schema_error(schema(), data, root)
    except yaml_input.YamlProblem as e:
        raise TopologyError(source, e.message, line=e.line, fix=e.fix) from None
    if bad is not None:
        fix = "see docs/simulated-nodes.md for the format"
        if bad.validator == "additionalProperties":
            fix = "remove or rename the unknown field; " + fix
        raise TopologyError(source, f"field {bad.field}: {bad.message}", line=bad.line, fix=fix)
    return data, root


def _build(data: Mapping[str, Any], root: yaml.Node | None, source: str) -> NodeTopology:
    name = (data.get("metadata") or {}).get("name") or source
    links: dict[tuple[str, str], Link] = {}
    devices: list[Device] = []

    def err(path: list[Any], msg: str, fix: str | None = None) -> TopologyError:
        return TopologyError(source, f"field {field_path(path)}: {msg}", line=line_of(root, path), fix=fix)

    if "topoMatrix" in data:
        try:
            base = load_topo_matrix(data["topoMatrix"], f"{source} (topoMatrix)", name)
        except TopologyError as e:
            line = line_of(root, ["topoMatrix"])
            raise TopologyError(source, f"field topoMatrix: {e.detail}",
                                line=(line + (e.line or 0)) if line else None, fix=e.fix) from None
        devices = list(base.devices)
        links = dict(base.links)
        by_name = {d.name: i for i, d in enumerate(devices)}
        for kind, key in ((DeviceKind.GPU, "gpus"), (DeviceKind.NIC, "nics")):
            for i, spec in enumerate(data.get(key) or []):
                dname = spec.get("name") or (f"GPU{i}" if kind is DeviceKind.GPU else None)
                if dname not in by_name:
                    raise err([key, i, "name"], f"{dname!r} is not a device of topoMatrix",
                              fix="use a GPU<i> or NIC name from the matrix")
                devices[by_name[dname]] = _apply(devices[by_name[dname]], spec)
    else:
        for kind, key in ((DeviceKind.GPU, "gpus"), (DeviceKind.NIC, "nics")):
            for i, spec in enumerate(data.get(key) or []):
                dname = spec.get("name") or f"GPU{i}"
                dev = Device(name=dname, kind=kind, index=i, port=dname if kind is DeviceKind.NIC else None)
                devices.append(_apply(dev, spec))
        names = [d.name for d in devices]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise err(["gpus"], f"duplicate device names: {', '.join(dup)}", fix="give every device a unique name")
        defaults = data.get("defaults") or {}
        same = Link(level=LinkLevel[defaults.get("sameNuma", "NODE")])
        cross = Link(level=LinkLevel[defaults.get("crossNuma", "SYS")])
        for i, a in enumerate(devices):
            for b in devices[i + 1:]:
                both = a.numa is not None and a.numa == b.numa
                links[(a.name, b.name)] = same if both else cross
    gpu_specs = [(i, spec) for i, spec in enumerate(data.get("gpus") or []) if "mig" in spec]
    for i, spec in gpu_specs:
        pos = next(p for p, d in enumerate(devices) if d.name == (spec.get("name") or f"GPU{i}"))
        gpu, migs = _mig_devices(devices[pos], spec["mig"], name, err, ["gpus", i, "mig"])
        devices[pos] = gpu
        devices += migs
    known = {d.name for d in devices if d.kind is not DeviceKind.MIG}
    for i, entry in enumerate(data.get("links") or []):
        link = Link.parse(entry["link"])
        members = entry["devices"]
        for j, m in enumerate(members):
            if m not in known:
                raise err(["links", i, "devices", j], f"unknown device {m!r}",
                          fix=f"use one of: {', '.join(sorted(known))}")
        for x, a in enumerate(members):
            for b in members[x + 1:]:
                pair = (a, b) if (a, b) in links or (b, a) not in links else (b, a)
                links[pair] = link
    numa_cfg = data.get("numa") or {}
    nodes = numa_cfg.get("nodes")
    distances: dict[tuple[int, int], int] = {}
    if "distances" in numa_cfg:
        order = nodes if nodes is not None else sorted({d.numa for d in devices if d.numa is not None})
        matrix = numa_cfg["distances"]
        if len(matrix) != len(order) or any(len(r) != len(order) for r in matrix):
            raise err(["numa", "distances"], f"needs a {len(order)}x{len(order)} matrix, one row per NUMA node",
                      fix="list one row per node in numa.nodes order")
        for r, a in enumerate(order):
            for c, b in enumerate(order):
                distances[(a, b)] = matrix[r][c]
    _check_complexes(data, devices, err)
    for i, d in enumerate(devices):
        if nodes is not None and d.numa is not None and d.numa not in nodes:
            raise err(["numa", "nodes"], f"device {d.name} is on NUMA node {d.numa}, which is not listed",
                      fix=f"add {d.numa} to numa.nodes")
    try:
        return NodeTopology.build(devices, links, source=name, numa_nodes=nodes, numa_distances=distances)
    except ValueError as e:
        raise TopologyError(source, str(e)) from None


def _apply(dev: Device, spec: Mapping[str, Any]) -> Device:
    changes: dict[str, Any] = {}
    if "numa" in spec:
        changes["numa"] = spec["numa"]
    changes["health"] = spec.get("health", dev.health or HEALTHY)
    for key, attr in (("model", "model"), ("memoryMiB", "memory_mib"), ("uuid", "uuid"),
                      ("pciBusId", "pci_bus_id"), ("minor", "minor"), ("port", "port"), ("complex", "complex")):
        if key in spec:
            changes[attr] = spec[key]
    if "complexKind" in spec:
        changes["complex_kind"] = ComplexKind(spec["complexKind"])
    # A NIC's network interface and RDMA device, under the names sysfs discovery gives them
    # (plugin/sources/sysfs_nics.py ATTRIBUTES): DRA attaches that netdev to the pod (docs/networking.md).
    # Only the RDMA device's name: `rdma` stays unset, as no /dev/infiniband node is simulated.
    extra = {attr: spec[key] for key, attr in (("netdev", "netdev"), ("rdmaDevice", "rdma_devices")) if key in spec}
    # An NVSwitch board's module ID and Fabric Manager partitions (plugin/dra/slices.py partition_attributes).
    if "moduleId" in spec:
        extra["module_id"] = str(spec["moduleId"])
    extra.update({f"partition_{key.removeprefix('partition')}": str(pid)
                  for key, pid in (spec.get("partitions") or {}).items()})
    if extra:
        changes["attributes"] = {**dev.attributes, **extra}
    if "fabric" in spec:
        f = spec["fabric"]
        changes["fabric"] = FabricInfo(cluster_uuid=f["clusterUuid"].lower(), clique_id=f["cliqueId"],
                                       state=f.get("state", "completed"))
    return replace(dev, **changes)


def _check_complexes(data: Mapping[str, Any], devices: list[Device], err: Any) -> None:
    """A complex is a GPU and a NIC the platform ties together: each device that names one says
    how (`complexKind`), all its members say the same, and it holds at least one GPU and one NIC.

    Why strict: a complex turns a pair into `PIX` whatever its PCIe path, so a typo in an ID
    would silently pair a GPU with nothing (or with the wrong NIC)."""
    where: dict[str, list[Any]] = {}
    for kind, key in ((DeviceKind.GPU, "gpus"), (DeviceKind.NIC, "nics")):
        for i, spec in enumerate(data.get(key) or []):
            has_id, has_kind = "complex" in spec, "complexKind" in spec
            if has_id != has_kind:
                present, missing = ("complex", "complexKind") if has_id else ("complexKind", "complex")
                raise err([key, i, present], f"`complex` and `complexKind` go together; this device has no `{missing}`",
                          fix=f"add `{missing}` (kinds: inline, data-direct, cpu-root) or remove `{present}`")
            if has_id:
                where.setdefault(spec["complex"], []).append([key, i])
    by_name = {d.name: d for d in devices}
    members: dict[str, list[Device]] = {}
    for d in devices:
        if d.complex is not None and d.kind is not DeviceKind.MIG:
            members.setdefault(d.complex, []).append(d)
    for cid, devs in members.items():
        kinds = sorted({d.complex_kind.value for d in devs if d.complex_kind is not None})
        if len(kinds) > 1:
            raise err([*where[cid][-1], "complexKind"],
                      f"complex {cid!r} is given kinds {', '.join(kinds)}",
                      fix=f"give every device of complex {cid!r} the same complexKind")
        for want, word in ((DeviceKind.GPU, "GPU"), (DeviceKind.NIC, "NIC")):
            if not any(by_name[d.name].kind is want for d in devs):
                raise err([*where[cid][0], "complex"], f"complex {cid!r} has no {word}",
                          fix=f"give the {word} of this complex `complex: {cid}` too, or check the ID for a typo")


def _mig_devices(gpu: Device, specs: list[Mapping[str, Any]], node: str, err: Any,
                 path: list[Any]) -> tuple[Device, list[Device]]:
    """The GPU in MIG mode and its MIG devices (`GPU<i>-mig<j>`), as NVML discovery describes them.

    Defaults: GPU instance j, compute instance 0, capability minors in NVIDIA's
    numbering, memory from the profile, a stable UUID from the node and names;
    the parent's device minor (its index when the file gives none), so a MIG
    device always names its parent's /dev/nvidia<minor>.
    """
    gpu = replace(gpu, attributes={**gpu.attributes, "mig_mode": "enabled"})
    minor = gpu.minor if gpu.minor is not None else gpu.index
    out: list[Device] = []
    seen: set[tuple[int, int]] = set()
    for j, spec in enumerate(specs):
        gi, ci = spec.get("gi", j), spec.get("ci", 0)
        if (gi, ci) in seen:
            raise err([*path, j], f"GPU instance {gi} / compute instance {ci} is used twice on {gpu.name}",
                      fix="give each MIG device its own gi (or ci)")
        seen.add((gi, ci))
        profile = spec["profile"]
        gb = int(profile.split("g.")[-1].split("gb")[0])
        mig_name = f"{gpu.name}-mig{j}"
        attrs = {"profile": profile, "gi": str(gi), "ci": str(ci), "index": f"{gpu.index}:{j}",
                 "caps": caps_attribute(*cap_minors(minor, gi, ci))}
        out.append(Device(
            name=mig_name, kind=DeviceKind.MIG, index=j, numa=gpu.numa, health=spec.get("health", HEALTHY),
            uuid=spec.get("uuid") or "MIG-" + str(uuid.uuid5(_MIG_NS, f"{node}/{mig_name}")),
            pci_bus_id=gpu.pci_bus_id, model=gpu.model, minor=minor,
            memory_mib=spec.get("memoryMiB", gb * 1024), attributes=attrs, parent=gpu.name,
        ))
    return gpu, out
