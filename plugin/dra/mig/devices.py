"""MIG in the ResourceSlices: static MIG devices, and partitionable GPUs (KEP-4815) for dynamic MIG.

Two ways, chosen by `--dra-mig` (`DraMig.mode`) for the GPUs in MIG mode:

- `static` (NVIDIA's DRA driver does the same): the MIG devices that exist on the node are the
  DRA devices, `gpu-<i>-mig-<slot>`; their GPU is not published (its memory and SMs are carved
  up already). Each carries its parent's topology attributes (`pcieSwitch`, `nvlinkDomain`,
  `complex`, `pcieRoot`, `numaNode`, `pciBusID`), so a claim can still pair a MIG device with
  the NIC beside its GPU, plus `type: mig`, `uuid`, `parentUUID`, `parentIndex`, `profile`
  and the capacity `memory` (the names NVIDIA's DRA driver uses where it has one).
- `dynamic`: a partitionable GPU publishes every possible MIG placement,
  `gpu-<i>-mig-<profile>-<start>` (`1g.10gb` at memory slice 3: `gpu-0-mig-1g-10gb-3`), and
  itself, `gpu-<i>`; all consume counters of the GPU's counter set `gpu-<i>-mig`:
  `memory` (MiB), `multiprocessors`, `compute-slices` (7) and one counter per memory slice
  (`memory-slice-0`..`7`, value 1). A placement consumes the memory slices it covers, so two
  overlapping placements never fit together; the whole GPU consumes everything, so it and any
  placement exclude each other. The scheduler does the arithmetic; the driver creates the
  instance at prepare (plugin/dra/mig/prepare.py). Placement devices carry `placementStart`
  and `placementSize` too.

API rules (resource.k8s.io/v1, Kubernetes 1.37): counter sets live in slices of their own
(a slice has `devices` or `sharedCounters`, not both), at most 8 sets per slice and 32
counters per set; a device consumes from at most 2 sets; a slice whose devices consume
counters holds at most 64 devices (our limit anyway).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import Device, DeviceKind, NodeTopology

from ...health.policy import taint_value
from ...model.mig_strategy import mig_enabled
from ...sources.mig_profiles import COMPUTE_SLICES, MEMORY_SLICES, Placement, table_for

MIG_MODES = ("none", "static", "dynamic")
#: `Device.attributes` of a placement device (prepare creates its instance).
DYNAMIC = "mig_dynamic"
START = "placement_start"
#: Counter sets per ResourceSlice (ResourceSliceMaxCounterSets).
MAX_COUNTER_SETS_PER_SLICE = 8
_DNS_BAD = re.compile(r"[^a-z0-9]+")


def _no_placements(_: Device) -> list[Placement]:
    return []


@dataclass(frozen=True)
class DraMig:
    """How GPUs in MIG mode are served through DRA (see the module docstring)."""

    mode: str = "none"
    #: GPU indexes that are partitionable under `dynamic`; None: every GPU in MIG mode with a profile table.
    #: The other GPUs in MIG mode are served static.
    gpus: frozenset[int] | None = None
    #: A partitionable GPU's possible placements (the MIG backend's answer; NVML on real GPUs).
    placements: Callable[[Device], list[Placement]] = field(default=_no_placements, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MIG_MODES:
            raise ValueError(f"DRA MIG mode {self.mode!r} is not one of {', '.join(MIG_MODES)}")

    def partitionable(self, gpu: Device) -> bool:
        return (self.mode == "dynamic" and mig_enabled(gpu) and (self.gpus is None or gpu.index in self.gpus)
                and table_for(gpu.model, gpu.memory_mib) is not None)

    def static(self, gpu: Device) -> bool:
        return self.mode != "none" and mig_enabled(gpu) and not self.partitionable(gpu)


def counter_set_name(gpu: Device) -> str:
    return f"gpu-{gpu.index}-mig"


def placement_name(gpu: Device, p: Placement) -> str:
    return f"gpu-{gpu.index}-mig-{_DNS_BAD.sub('-', p.profile.name.lower()).strip('-')}-{p.start}"


def static_name(gpu: Device, mig: Device) -> str:
    return f"gpu-{gpu.index}-mig-{mig.index}"


def _q(n: int) -> dict[str, str]:
    return {"value": str(n)}


def gpu_counters(gpu: Device) -> dict[str, dict[str, str]]:
    """Everything a partitionable GPU has: what the whole GPU consumes and its counter set offers."""
    table = table_for(gpu.model, gpu.memory_mib)
    assert table is not None
    out = {"memory": {"value": f"{gpu.memory_mib}Mi"}, "multiprocessors": _q(table.multiprocessors),
           "compute-slices": _q(COMPUTE_SLICES)}
    out.update({f"memory-slice-{i}": _q(1) for i in range(MEMORY_SLICES)})
    return out


def placement_counters(gpu: Device, p: Placement) -> dict[str, dict[str, str]]:
    table = table_for(gpu.model, gpu.memory_mib)
    assert table is not None
    out = {"memory": {"value": f"{table.memory_mib(p.profile, gpu.memory_mib or 0)}Mi"},
           "multiprocessors": _q(p.profile.multiprocessors), "compute-slices": _q(p.profile.compute_slices)}
    out.update({f"memory-slice-{i}": _q(1) for i in p.slices})
    return out


#: The GPU's own attributes a MIG device does not share (its MIG attributes take their place).
_GPU_ONLY = ("type", "index", "uuid", "minor")


def _mig_attributes(gpu_entry: dict[str, Any], gpu: Device, profile: str) -> dict[str, Any]:
    attrs = {k: v for k, v in gpu_entry["attributes"].items() if k not in _GPU_ONLY}
    attrs.update({"type": {"string": "mig"}, "profile": {"string": profile}, "parentIndex": {"int": gpu.index}})
    if "uuid" in gpu_entry["attributes"]:
        attrs["parentUUID"] = gpu_entry["attributes"]["uuid"]
    return attrs


def _entry(name: str, attrs: dict[str, Any], capacity: dict[str, Any], gpu_entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "attributes": dict(sorted(attrs.items())), "capacity": capacity}
    if "taints" in gpu_entry:  # a MIG device is as healthy as its GPU
        out["taints"] = gpu_entry["taints"]
    return out


def expand_gpu(topology: NodeTopology, gpu: Device, gpu_entry: dict[str, Any], mig: DraMig,
               driver: str = "") -> list[dict[str, Any]]:
    """The slice entries for one GPU: itself, its static MIG devices, or itself and its placements.

    A static MIG device is tainted with its GPU, and on its own (`<driver>/unhealthy`) when it alone is
    unhealthy (its MPS control daemon down, plugin/dra/claims/mps.py)."""
    if mig.static(gpu):
        out = []
        for m in sorted((m for m in topology.of_kind(DeviceKind.MIG) if m.parent == gpu.name), key=lambda m: m.index):
            attrs = _mig_attributes(gpu_entry, gpu, m.attributes.get("profile", ""))
            if m.uuid:
                attrs["uuid"] = {"string": m.uuid}
            capacity = {"memory": {"value": f"{m.memory_mib}Mi"}} if m.memory_mib else {}
            e = _entry(static_name(gpu, m), attrs, capacity, gpu_entry)
            if not m.healthy and "taints" not in e and driver:
                e["taints"] = [{"key": f"{driver}/unhealthy", "effect": "NoSchedule",
                                "value": taint_value(m.health_reason) if m.health_reason else m.health}]
            out.append(e)
        return out
    if not mig.partitionable(gpu):
        return [gpu_entry]
    whole = dict(gpu_entry)
    whole["consumesCounters"] = [{"counterSet": counter_set_name(gpu), "counters": gpu_counters(gpu)}]
    out = [whole]
    for p in mig.placements(gpu):
        attrs = _mig_attributes(gpu_entry, gpu, p.profile.name)
        attrs.update({"placementStart": {"int": p.start}, "placementSize": {"int": p.size}})
        counters = placement_counters(gpu, p)
        capacity = {"memory": counters["memory"], "multiprocessors": counters["multiprocessors"]}
        entry = _entry(placement_name(gpu, p), attrs, capacity, gpu_entry)
        entry["consumesCounters"] = [{"counterSet": counter_set_name(gpu), "counters": counters}]
        out.append(entry)
    return out


def counter_sets(gpus: list[Device], mig: DraMig) -> list[dict[str, Any]]:
    """The `sharedCounters` entries of the partitionable GPUs among `gpus`."""
    return [{"name": counter_set_name(g), "counters": gpu_counters(g)}
            for g in sorted(gpus, key=lambda g: g.index) if mig.partitionable(g)]


def table_entries(topology: NodeTopology, gpu: Device, mig: DraMig) -> dict[str, Device] | None:
    """{slice device name: Device} that prepare works from, for a GPU in MIG mode; None for any other GPU.

    A placement (and the whole partitionable GPU, which prepare makes the full-size instance of, so the
    container gets a usable device) is a `Device` of kind MIG marked `mig_dynamic`, with its profile and start.
    """
    if mig.static(gpu):
        return {static_name(gpu, m): m for m in topology.of_kind(DeviceKind.MIG) if m.parent == gpu.name}
    if not mig.partitionable(gpu):
        return None
    placements = mig.placements(gpu)
    out = {placement_name(gpu, p): _placement_device(gpu, p) for p in placements}
    full = max(placements, key=lambda p: (p.size, p.profile.compute_slices), default=None)
    if full is not None:
        out[f"gpu-{gpu.index}"] = _placement_device(gpu, full)
    return out


def _placement_device(gpu: Device, p: Placement) -> Device:
    return Device(name=f"{gpu.name}-mig-{p.profile.name}-{p.start}", kind=DeviceKind.MIG, index=gpu.index,
                  numa=gpu.numa, health=gpu.health, health_reason=gpu.health_reason, pci_bus_id=gpu.pci_bus_id,
                  model=gpu.model, minor=gpu.minor,
                  memory_mib=gpu.memory_mib, parent=gpu.name,
                  attributes={DYNAMIC: "true", "profile": p.profile.name, START: str(p.start)})
