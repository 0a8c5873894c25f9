"""What a container gets for GPUs and MIG devices: `NVIDIA_VISIBLE_DEVICES`, device nodes, CDI names.

Why these pieces: the NVIDIA container runtime hook reads the env var (the
`envvar` strategy); a CDI-capable runtime reads `cdi_devices` (`cdi-cri`) or
annotations (`cdi-annotations`); device specs keep GPU access working when
the static CPU manager rewrites cgroups. Device nodes are only listed where
they exist under `dev_root`, so a simulated node never hands the runtime a
path that would make container creation fail.

`NVIDIA_VISIBLE_DEVICES` is always set, because CUDA images set it to `all`
and NVIDIA's runtime hook, where installed, acts on it:
- with `envvar` (alone or with a CDI strategy): the IDs, so the hook mounts
  the driver libraries for exactly these GPUs (on a node where the hook is
  what provides them, `[envvar, cdi-cri]` gives device nodes through CDI and
  libraries through the hook);
- with CDI strategies only: `void`, so the hook adds nothing; the container
  has exactly the devices of the CDI names (NVIDIA's CDI specs set `void`
  for the same reason).

A MIG device gets `nvidiactl`, its parent's `/dev/nvidia<minor>` and its GPU
and compute instance capability nodes (`/dev/nvidia-caps/nvidia-cap<N>`), as
NVIDIA's plugin passes them. CDI names come from the spec we wrote for the
resource (`plugin.model.cdi_names.CdiNamingBuilder` wraps this builder); with
`--cdi-specs external` they are `<cdi-vendor>/<cdi-class>=<UUID>` of a spec
another tool generated (NVIDIA's `nvidia-ctk cdi generate`, whose default names
every GPU both by index and by UUID; a MIG device's UUID name is its MIG UUID).
UUID, not index: an index name changes meaning when a GPU falls off the bus.
Allocate checks each name against the spec files in `toolkit_dirs` and refuses
the request, naming the fix, when a spec of that kind is there but lacks the
name (stale, or generated with `--device-name-strategy index` only): the
container would otherwise fail at creation with "unresolvable CDI devices".
With no spec of the kind readable in those directories (not mounted into the
daemon's container) the names are passed unchecked, as before.

IMEX channels (NVIDIA's `imex.channelIDs`, found at start: plugin/model/imex.py) go to every container of a
GPU-family resource, as NVIDIA's plugin gives them: `NVIDIA_IMEX_CHANNELS` with `envvar` (NVIDIA's hook reads
it), the node as a device spec; with specs we write, a CDI device of the resource's spec names it
(`plugin.model.resources`), so CDI alone still carries it. With `--cdi-specs external` the device spec is
always passed: the toolkit's GPU spec has no channel.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from allocator.topology import Device, DeviceKind

from .allocate_response import ContainerAllocation, DeviceNode
from .cdi.toolkit import DEFAULT_TOOLKIT_DIRS, ToolkitSpecError, ToolkitSpecs
from .cdi_names import add_names, uses_cdi
from .identity import device_uuid
from .imex import ENV_VAR as IMEX_ENV, ChannelNode
from ..config.flags import DEVICE_LIST_STRATEGIES
from ..errors import OptionError

CDI_SPEC_MODES = ("write", "external")
_CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
#: `Device.attributes` key of a MIG device's capability nodes (comma-separated `/dev/nvidia-caps/...`).
CAPS = "caps"


@dataclass(frozen=True)
class GpuAllocateOptions:
    device_list_strategy: tuple[str, ...] = ("envvar",)
    dev_root: str = "/dev"
    #: `write`: names come from our specs (`CdiNamingBuilder`); `external`: `<cdi_vendor>/<cdi_class>=<UUID>`.
    cdi_specs: str = "write"
    cdi_vendor: str = "nvidia.com"
    cdi_class: str = "gpu"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    #: False: a device named through CDI gets no device nodes from us (the runtime injects them from the spec).
    pass_device_specs: bool = True
    #: Where `--cdi-specs external` names are checked (the CDI spec directories the runtime reads).
    toolkit_dirs: tuple[str, ...] = DEFAULT_TOOLKIT_DIRS
    #: NVIDIA's `imex.channelIDs` as found on this node: every container of these resources gets them.
    imex_channels: tuple[ChannelNode, ...] = ()

    def __post_init__(self) -> None:
        bad = [s for s in self.device_list_strategy if s not in DEVICE_LIST_STRATEGIES]
        if bad or not self.device_list_strategy:
            raise OptionError(
                f"device list strategy {', '.join(bad) or '(empty)'} is not one of {', '.join(DEVICE_LIST_STRATEGIES)}"
            )
        if self.cdi_specs not in CDI_SPEC_MODES:
            raise OptionError(f"CDI spec mode {self.cdi_specs!r} is not one of {', '.join(CDI_SPEC_MODES)}")

    @property
    def uses_cdi(self) -> bool:
        return uses_cdi(self.device_list_strategy)

    @property
    def writes_specs(self) -> bool:
        """Allocate names devices from specs we write (a CDI strategy with `--cdi-specs write`)."""
        return self.uses_cdi and self.cdi_specs == "write"


def device_paths(d: Device) -> list[str]:
    """The device nodes (below /dev) a container needs for one GPU or MIG device."""
    paths = [f"nvidia{d.minor}"] if d.minor is not None else []
    if d.kind is DeviceKind.MIG:
        paths += [c.removeprefix("/dev/") for c in d.attributes.get(CAPS, "").split(",") if c]
    return paths


class GpuAllocateBuilder:
    """Builds the response for one container's GPUs or MIG devices (IDs of physical devices, each once)."""

    def __init__(self, options: GpuAllocateOptions, resource_name: str, source: str | None = None):
        self.options = options
        self.resource_name = resource_name
        #: The topology's source: a simulated GPU without its own UUID is named by its made-up one
        #: (`plugin.model.identity`), as its device-plugin ID and its DRA slice name it; None: `d.uuid or ID`.
        self.source = source
        self._toolkit = ToolkitSpecs(options.toolkit_dirs, f"{options.cdi_vendor}/{options.cdi_class}", "uuid")

    def _node(self, name: str) -> DeviceNode | None:
        host = os.path.join(self.options.dev_root, name)
        if not os.path.exists(host):
            return None
        return DeviceNode(container_path=f"/dev/{name}", host_path=host, permissions="rw")

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        out = ContainerAllocation()
        o = self.options
        strategies = o.device_list_strategy
        if "envvar" in strategies:
            out.envs["NVIDIA_VISIBLE_DEVICES"] = ",".join(ids)
        else:
            out.envs["NVIDIA_VISIBLE_DEVICES"] = "void"
        if o.imex_channels and "envvar" in strategies:
            out.envs[IMEX_ENV] = ",".join(str(c.id) for c in o.imex_channels)
        if o.uses_cdi and o.cdi_specs == "external":
            uuids = [device_uuid(self.source, d) if self.source is not None else d.uuid for d in devices]
            names = [f"{o.cdi_vendor}/{o.cdi_class}={u or i}" for i, u in zip(ids, uuids)]
            for d, u in zip(devices, uuids):
                problem = self._toolkit.check(d, u) if u else None
                if problem:
                    raise ToolkitSpecError(problem)
            add_names(out, names, strategies, o.cdi_annotation_prefix, self.resource_name)
            if not o.pass_device_specs:
                self._add_channels(out)  # the toolkit's GPU spec names no channel
                return out  # `nvidia-ctk cdi generate`'s spec has the device nodes; the runtime injects them
        for d in devices:
            for path in device_paths(d):
                node = self._node(path)
                if node:
                    out.add_device(node)
        if out.devices:
            for name in _CONTROL_NODES:
                node = self._node(name)
                if node:
                    out.add_device(node)
        self._add_channels(out)
        return out

    def _add_channels(self, out: ContainerAllocation) -> None:
        for c in self.options.imex_channels:
            out.add_device(DeviceNode(container_path=c.container_path, host_path=c.host_path, permissions="rw"))
