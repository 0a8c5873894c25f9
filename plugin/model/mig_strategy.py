"""Which GPU-family resources a node has under NVIDIA's MIG strategies (`--mig-strategy`).

Why NVIDIA's rules exactly (k8s-device-plugin `internal/rm/device_map.go`,
`rm.go`): operators choose the strategy to match how they partitioned their
GPUs, and pods already ask for `nvidia.com/gpu` or `nvidia.com/mig-<profile>`.

- `none`: MIG is ignored; every GPU, MIG-enabled or not, is served whole as
  the GPU resource (NVIDIA does the same).
- `single`: when no GPU has MIG enabled, GPUs are served as under `none`.
  Otherwise every GPU must have MIG enabled with at least one MIG device, and
  all MIG devices must have one profile; they are served as the GPU resource.
  Anything else refuses to start (NVIDIA: "invalid MIG configuration").
- `mixed`: GPUs without MIG are the GPU resource; MIG devices are one
  resource per profile, `<domain>/mig-<profile>` with `+` turned into `.`
  (`1g.10gb+me` -> `mig-1g.10gb.me`). A profile whose compute-instance slices
  differ from its GPU-instance slices (`1c.3g.40gb`) has no resource in
  NVIDIA's plugin, which then refuses to start; so do we. A MIG-enabled GPU
  without MIG devices is logged and serves nothing.

A MIG device carries its parent GPU's NUMA node, and is Unhealthy whenever
its parent is (health events arrive for the parent GPU).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, replace

from allocator.topology import UNHEALTHY, Device, DeviceKind, NodeTopology

from ..errors import OptionError

log = logging.getLogger(__name__)

#: `Device.attributes` keys written by MIG discovery (NVML or a simulated node).
MIG_MODE = "mig_mode"
PROFILE = "profile"
_SPLIT_PROFILE = re.compile(r"^\d+c\.")


class MigStrategyError(OptionError):
    """The node's MIG layout does not fit `--mig-strategy` (exit 2: change the strategy or the layout)."""


@dataclass(frozen=True)
class GpuGroup:
    """One GPU-family resource before time-slicing: its name, kind and devices (MIG devices parent-major)."""

    name: str
    kind: DeviceKind
    devices: tuple[Device, ...]


def mig_enabled(gpu: Device) -> bool:
    return gpu.attributes.get(MIG_MODE) == "enabled"


def profile_resource(domain: str, profile: str) -> str:
    """NVIDIA's resource name of a MIG profile under `mixed`: `<domain>/mig-<profile>`, `+` -> `.`."""
    return f"{domain}/mig-{profile.replace('+', '.')}"


def _children(topology: NodeTopology) -> dict[str, list[Device]]:
    out: dict[str, list[Device]] = {}
    for m in topology.of_kind(DeviceKind.MIG):
        out.setdefault(m.parent or "", []).append(m)
    return out


def _with_parent_health(gpu: Device, migs: list[Device]) -> list[Device]:
    if gpu.healthy:
        return migs
    return [replace(m, health=UNHEALTHY, health_reason=gpu.health_reason) for m in migs]


def _names(devices: list[Device]) -> str:
    return ", ".join(d.name for d in devices)


def _have(devices: list[Device]) -> str:
    return "has" if len(devices) == 1 else "have"


def group_gpus(topology: NodeTopology, strategy: str, gpu_resource_name: str) -> list[GpuGroup]:
    """The GPU-family resources of `topology` under `strategy`; raises `MigStrategyError` as NVIDIA refuses."""
    gpus = list(topology.gpus)
    whole_node = [GpuGroup(gpu_resource_name, DeviceKind.GPU, tuple(gpus))] if gpus else []
    if strategy == "none":
        return whole_node
    if strategy not in ("single", "mixed"):
        raise MigStrategyError(f"MIG strategy {strategy!r} is not one of none, single, mixed")
    children = _children(topology)
    enabled = [g for g in gpus if mig_enabled(g)]
    whole = [g for g in gpus if not mig_enabled(g)]
    migs = [m for g in enabled for m in _with_parent_health(g, children.get(g.name, []))]
    if strategy == "single":
        if not enabled:
            return whole_node
        empty = [g for g in enabled if not children.get(g.name)]
        if empty:
            raise MigStrategyError(f"--mig-strategy single: {_names(empty)} {_have(empty)} MIG enabled but no MIG "
                                   "devices (fix: create MIG devices on every GPU in MIG mode, or use "
                                   "--mig-strategy mixed; docs/sharing.md)")
        profiles: dict[str, list[str]] = {}
        for m in migs:
            profiles.setdefault(m.attributes.get(PROFILE, "?"), []).append(m.parent or "?")
        if len(profiles) > 1:
            seen = "; ".join(f"{p} on {', '.join(dict.fromkeys(ps))}" for p, ps in sorted(profiles.items()))
            raise MigStrategyError(f"--mig-strategy single: more than one MIG profile on the node ({seen}) "
                                   "(fix: use --mig-strategy mixed, or give every GPU the same MIG profile; "
                                   "docs/sharing.md)")
        if whole:
            raise MigStrategyError(f"--mig-strategy single: all GPUs must have MIG enabled, but {_names(whole)} "
                                   f"{_have(whole)} it disabled (fix: use --mig-strategy mixed, or enable MIG on "
                                   "every GPU; docs/sharing.md)")
        return [GpuGroup(gpu_resource_name, DeviceKind.MIG, tuple(migs))]
    out = [GpuGroup(gpu_resource_name, DeviceKind.GPU, tuple(whole))] if whole else []
    for g in enabled:
        if not children.get(g.name):
            log.warning("GPU has MIG enabled but no MIG devices; it serves nothing", extra={"gpu": g.name})
    domain = gpu_resource_name.partition("/")[0]
    by_profile: dict[str, list[Device]] = {}
    for m in migs:
        by_profile.setdefault(m.attributes.get(PROFILE, ""), []).append(m)
    for profile, devices in sorted(by_profile.items()):
        if not profile or _SPLIT_PROFILE.match(profile):
            raise MigStrategyError(f"--mig-strategy mixed: MIG profile {profile or '(unknown)'!r} of "
                                   f"{_names(devices)} has no resource: only profiles whose compute instance "
                                   "spans the whole GPU instance are served, as in NVIDIA's plugin (fix: "
                                   "repartition with whole GPU instances; docs/sharing.md)")
        out.append(GpuGroup(profile_resource(domain, profile), DeviceKind.MIG, tuple(devices)))
    return out
