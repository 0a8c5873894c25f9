"""IMEX channels as DRA devices, for host-managed IMEX (the IMEX daemon runs on the host).

Why: on a multi-node NVLink rack (GB200/GB300 NVL72) CUDA shares memory across trays only in a
process that holds an IMEX channel, the character device `/dev/nvidia-caps-imex-channels/channel<N>`
(major: the `nvidia-caps-imex-channels` line of /proc/devices, minor: N). NVIDIA's DRA driver
publishes channels as devices of their own (type `channel`, `id`); in its host-managed mode
(v0.5.0, `HostManagedIMEXDaemon`) the host's `nvidia-imex` serves the domain and the driver only
hands channels out. Here each channel device also carries the node's `clique` (the value the GPUs
publish), so a job's claims can ask for channels on the nodes of one clique: a CEL selector on
`clique` in the job's template (a claim is allocated on one node, so `matchAttribute` on `clique`
only holds one claim's channel and GPUs together, never two pods' claims; docs/dra.md).

This module is the pure part: the major number, the slice devices and the device node to inject;
`slices.build_devices` publishes the devices (`SliceOptions.imex`, `--dra-imex-channels`) and
prepare puts each allocated channel's node in the claim's CDI spec.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from allocator.topology import NodeTopology

from ...model.cdi.spec import DeviceNode

#: The driver's name for the channels' character device in /proc/devices.
PROC_DEVICES_NAME = "nvidia-caps-imex-channels"
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
#: NVIDIA's driver offers 2048 channels per node (NVIDIA's DRA driver assumes the same).
MAX_CHANNELS = 2048
DEVICE_TYPE = "imex-channel"


class ImexChannelsError(ValueError):
    """The node cannot serve IMEX channels; the message names the file and the fix."""


def read_major(proc_root: str = "/proc") -> int | None:
    """The channels' major number from `<proc_root>/devices`, or None when the driver registered none.

    Only the "Character devices:" section counts (a block device of that name would not be one).
    """
    path = os.path.join(proc_root, "devices")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    section = ""
    for line in text.splitlines():
        line = line.strip()
        if line.endswith(":"):
            section = line
            continue
        parts = line.split()
        if section == "Character devices:" and len(parts) == 2 and parts[1] == PROC_DEVICES_NAME:
            if parts[0].isdigit():
                return int(parts[0])
            raise ImexChannelsError(f"{path}: {line!r} has no number before {PROC_DEVICES_NAME}")
    return None


def node_clique(topology: NodeTopology) -> str | None:
    """The node's NVLink clique: the one `clique` all its GPUs in a completed fabric share, else None.

    A node whose GPUs are in two cliques (a partitioned tray) gets none: a channel is the node's,
    and pairing it with one clique would put a job's other pods on the wrong side.
    """
    cliques = {g.fabric.clique for g in topology.gpus if g.fabric is not None and g.fabric.state == "completed"}
    return cliques.pop() if len(cliques) == 1 else None


def channel_name(channel: int) -> str:
    return f"{DEVICE_TYPE}-{channel}"


def channel_of(name: str) -> int | None:
    """The channel number of a slice device name (`imex-channel-3` -> 3), None for any other device."""
    prefix = f"{DEVICE_TYPE}-"
    rest = name[len(prefix):] if name.startswith(prefix) else ""
    return int(rest) if rest.isdigit() and str(int(rest)) == rest else None


def channel_devices(topology: NodeTopology, count: int) -> list[dict[str, Any]]:
    """Slice devices for channels 0..count-1 (type, id and, where the node has one, clique)."""
    if not 0 <= count <= MAX_CHANNELS:
        raise ImexChannelsError(f"IMEX channel count {count} is not 0..{MAX_CHANNELS}")
    clique = node_clique(topology)
    out = []
    for n in range(count):
        attrs: dict[str, Any] = {"type": {"string": DEVICE_TYPE}, "id": {"int": n}}
        if clique is not None:
            attrs["clique"] = {"string": clique}
        out.append({"name": channel_name(n), "attributes": dict(sorted(attrs.items()))})
    return out


@dataclass(frozen=True)
class ImexChannels:
    """What prepare needs: the major number read at start and how many channels are published."""

    major: int
    count: int

    def device_node(self, channel: int) -> DeviceNode:
        """The node to create in the container, with its numbers (a simulated node need not have it)."""
        if not 0 <= channel < self.count:
            raise ImexChannelsError(f"IMEX channel {channel} is not published here (0..{self.count - 1})")
        return DeviceNode(path=f"{CHANNEL_DIR}/channel{channel}", type="c", major=self.major, minor=channel)


def channels_of(proc_root: str, count: int) -> ImexChannels | None:
    """`ImexChannels` for `count` channels, None when count is 0; an error naming /proc/devices when the
    driver has no channel device (an IMEX-less driver or node)."""
    if count == 0:
        return None
    major = read_major(proc_root)
    if major is None:
        raise ImexChannelsError(f"{os.path.join(proc_root, 'devices')} has no {PROC_DEVICES_NAME} character "
                                "device: the NVIDIA driver does not offer IMEX channels here (fix: a driver with "
                                "IMEX support, or publish no channels)")
    return ImexChannels(major, count)
