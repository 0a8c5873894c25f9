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

This module is the pure part: the slice devices (the major and the node to inject: plugin/model/imex.py);
`slices.build_devices` publishes the devices (`SliceOptions.imex`, `--dra-imex-channels`) and
prepare puts each allocated channel's node in the claim's CDI spec.
"""

from __future__ import annotations

from typing import Any

from allocator.topology import NodeTopology

# The channels' node, major and the `ImexChannels` prepare uses are shared with the device plugin's channels
# (plugin/model/imex.py); re-exported so the DRA side keeps one import place.
from ...model.imex import CHANNEL_DIR, MAX_CHANNELS, PROC_DEVICES_NAME, ImexChannels, ImexChannelsError, \
    channels_of, read_major

__all__ = ["CHANNEL_DIR", "DEVICE_TYPE", "MAX_CHANNELS", "PROC_DEVICES_NAME", "ImexChannels", "ImexChannelsError",
           "channel_devices", "channel_name", "channel_of", "channels_of", "node_clique", "read_major"]

DEVICE_TYPE = "imex-channel"


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
