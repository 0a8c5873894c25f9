"""IMEX channels: the character devices both serving modes hand to containers, and how a node's are found.

Why one module for both modes: a channel is the same device node whether the device plugin gives it to
every GPU container (NVIDIA's `imex.channelIDs` config) or the DRA driver gives it to a claim that holds it
(`--dra-imex-channels`, plugin/dra/slices/imex_channels.py): `/dev/nvidia-caps-imex-channels/channel<N>`,
character major from the `nvidia-caps-imex-channels` line of /proc/devices (the driver picks it at load),
minor N. A simulated node has no procfs; its node file states the major (`imexChannelsMajor`), read by
`expected_major`.

The device plugin follows NVIDIA's k8s-device-plugin (`internal/imex`, `api/config/v1/imex.go`): the
channel IDs may only be `[]` or `[0]` (plugin/config/nvidia.py checks that); at start each channel's node must exist as a character device
(here under `--dev-root`); a missing one fails the start when `required` is true and is left out with a
warning when it is false. We also check the node's numbers where the major is known (a node of another
device at that path would give containers the wrong device).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from .cdi.spec import DeviceNode

log = logging.getLogger(__name__)

#: The driver's name for the channels' character device in /proc/devices.
PROC_DEVICES_NAME = "nvidia-caps-imex-channels"
CHANNEL_DIR = "/dev/nvidia-caps-imex-channels"
#: NVIDIA's driver offers 2048 channels per node (NVIDIA's DRA driver assumes the same).
MAX_CHANNELS = 2048
#: The variable NVIDIA's container runtime hook reads to inject channels (NVIDIA's `ImexChannelEnvVar`).
ENV_VAR = "NVIDIA_IMEX_CHANNELS"


class ImexChannelsError(ValueError):
    """The node cannot serve IMEX channels; the message names the file and the fix."""


def channel_path(channel: int) -> str:
    """The channel's path in a container (and on the host, below /dev)."""
    return f"{CHANNEL_DIR}/channel{channel}"


def cdi_name(channel: int) -> str:
    """The channel's CDI device name in a GPU resource's spec we write (NVIDIA names it `imex-channel=<N>`)."""
    return f"imex-channel{channel}"


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


def expected_major(proc_root: str, simulate: str | None) -> int | None:
    """The channels' major on this node: a simulated node's stated `imexChannelsMajor`, else /proc/devices'."""
    if simulate:
        from ..sources.simulated import stated_imex_major  # noqa: PLC0415 (simulated nodes only: YAML loading)

        return stated_imex_major(simulate)
    return read_major(proc_root)


# ---- DRA: channels published as devices --------------------------------------------------------


@dataclass(frozen=True)
class ImexChannels:
    """What DRA prepare needs: the major number read at start and how many channels are published."""

    major: int
    count: int

    def device_node(self, channel: int) -> DeviceNode:
        """The node to create in the container, with its numbers (a simulated node need not have it)."""
        if not 0 <= channel < self.count:
            raise ImexChannelsError(f"IMEX channel {channel} is not published here (0..{self.count - 1})")
        return DeviceNode(path=channel_path(channel), type="c", major=self.major, minor=channel)


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


# ---- device plugin: channels every GPU container gets ------------------------------------------


@dataclass(frozen=True)
class ChannelNode:
    """A channel found on this node for the device plugin: its ID and its node as this process sees it."""

    id: int
    major: int
    #: The node under `--dev-root` (the path the kubelet's DeviceSpec names; the runtime stats it).
    host_path: str

    @property
    def container_path(self) -> str:
        return channel_path(self.id)

    def cdi_node(self) -> DeviceNode:
        """The node in our CDI spec, with its numbers (the runtime then creates it without a stat)."""
        return DeviceNode(path=self.container_path, type="c", major=self.major, minor=self.id)


def _node_problem(path: str, channel: int, major: int | None) -> tuple[str, int]:
    """(why the node at `path` is no usable channel `channel`, "" when it is; its major)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist", 0
    except OSError as e:
        return f"cannot be read ({e.strerror})", 0
    if not stat.S_ISCHR(st.st_mode):
        return "is not a character device", 0
    got = (os.major(st.st_rdev), os.minor(st.st_rdev))
    if major is not None and got[0] != major:
        return (f"has major {got[0]}, not the {major} that {PROC_DEVICES_NAME} has (another device at the "
                "channel's path)"), got[0]
    if got[1] != channel:
        return f"has minor {got[1]}, not {channel} (channel N is minor N)", got[0]
    return "", got[0]


def device_plugin_channels(ids: Sequence[int], required: bool, dev_root: str, major: int | None,
                           where: str = "imex.channelIDs") -> tuple[ChannelNode, ...]:
    """The channels of NVIDIA's `imex.channelIDs` (checked by the config: `[]` or `[0]`) this node has,
    checked as NVIDIA's plugin does at start.

    `major`: the channels' major (`expected_major`), None when the node does not say (the node's own
    numbers are then taken, as NVIDIA's plugin takes any character device there). Raises
    `ImexChannelsError` for a required channel the node lacks; a channel not required is left out with
    a warning (the GPUs are served without it).
    """
    out = []
    for channel in ids:
        path = os.path.join(dev_root, channel_path(channel).removeprefix("/dev/"))
        why, got_major = _node_problem(path, channel, major)
        if not why:
            out.append(ChannelNode(channel, got_major, path))
            log.info("IMEX channel given to every GPU container", extra={"channel": channel, "path": path})
            continue
        message = f"IMEX channel {channel}: {path} {why}"
        if required:
            raise ImexChannelsError(f"{where}: {message}, and imex.required is true (fix: create the channel on "
                                    "the host, e.g. load nvidia with NVreg_CreateImexChannel0=1, check --dev-root, "
                                    "or set imex.required: false to serve the GPUs without it)")
        log.warning("requested IMEX channel left out: GPU containers get no channel (imex.required is false)",
                    extra={"channel": channel, "reason": message})
    return tuple(out)
