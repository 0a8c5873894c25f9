"""The config file's `sharing:` section: NVIDIA's time-slicing configuration, read as NVIDIA writes it.

Why NVIDIA's format as is: an operator switching from NVIDIA's device plugin
brings a ConfigMap with `sharing.timeSlicing`; it must work unchanged
(docs/sharing.md has the compatibility table). The JSON schema
(`config-v1.json`, `$defs.replicatedResources`) checks the shapes and NVIDIA's
rules (at least one resource, `replicas >= 2`, `devices` is `all`, a count > 0
or a list of GPU indexes, MIG indexes `<gpu>:<mig>` and UUIDs); this module
keeps what the resource layer needs, with the file and line of each entry so
a rule that can only be checked against the node's devices (in
`plugin.model.time_slicing`) still names the place to fix.

Where we differ from NVIDIA: `rename` and `devices` are honoured (NVIDIA
parses them but ignores them with a "not yet supported" warning),
and a node advertises at most `MAX_REPLICAS` replicas (NVIDIA has no bound;
a larger list never reaches the kubelet, see there).

`sharing.mps` (NVIDIA's MPS, the same shape) reads into the same `TimeSlicing` with `strategy` `mps`: the replicas are built
the same way, and `plugin.model.mps_allocate` adds what a container needs to
reach the MPS control daemon (`plugin.mps` runs it). As in NVIDIA's plugin, a
request for more than one MPS replica is always refused
(`failRequestsGreaterThanOne` is implied, whatever the file says), and both sections at once are refused
(one GPU cannot be time-sliced and under MPS at once).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ..errors import InputError
from ..inputs.yamlpath import line_of

#: Suffix `renameByDefault` appends, as NVIDIA's `DefaultSharedRename`.
SHARED_SUFFIX = ".shared"
#: The domain NVIDIA puts in front of a name without one (`gpu` -> `nvidia.com/gpu`).
NVIDIA_DOMAIN = "nvidia.com"

#: The largest message the kubelet receives on a ListAndWatch stream: grpc-go's default client
#: receive limit (4 MiB); the kubelet's device-plugin client sets no other (its `dial` passes only
#: the authority, credentials, blocking and the unix dialer).
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: The largest request the daemon reads (`plugin.serving.server.MAX_REQUEST_BYTES`, which keeps hostile
#: requests from costing memory); repeated here because this module must not import the server.
DAEMON_MAX_REQUEST_BYTES = 1 << 20
#: The most time-slicing replicas one resource may advertise, and the node in all.
#:
#: Why per resource: both directions of the kubelet protocol carry a whole resource at once. The
#: kubelet's GetPreferredAllocation lists every free device in `available_deviceIDs` (and the
#: ones it keeps in `must_include_deviceIDs`): past `DAEMON_MAX_REQUEST_BYTES` the request is
#: refused and pod admission fails. Our ListAndWatch message is the whole list: past
#: `KUBELET_MAX_MESSAGE_BYTES` the kubelet's stream fails (RESOURCE_EXHAUSTED), it disconnects
#: the plugin and marks every device unhealthy, again after each re-registration. For the longest
#: ID we can send, a replica of a MIG device with a pre-R470 UUID
#: (`MIG-GPU-<uuid>/<gi>/<ci>::7999`, 55 characters), protobuf's ByteSize gives 57 bytes per ID
#: in a request and 77 per Device (health `Unhealthy`, a NUMA node up to 1023) in a list. The
#: request binds: 8,000 IDs listed twice (every one available *and* must-include, the most a
#: request can hold) take 912,000 bytes, 87% of the 1 MiB cap; a usual request (UUID replica IDs,
#: few must-include) takes under 40% of it. The list takes 616,000 bytes, 15% of the kubelet's
#: 4 MiB. tests/sharing/test_replica_limit.py checks this arithmetic.
#:
#: Why per node too: the daemon's memory grows with the replicas it serves (docs/sharing.md has
#: the table), and the chart's memory limit is measured at this many.
MAX_REPLICAS = 8_000


class SharingError(InputError):
    """A `sharing:` section the daemon cannot serve; the message names the file, line, field and fix."""


@dataclass(frozen=True)
class DeviceSelection:
    """`devices:` of one entry: all of them (NVIDIA's default), the first `count`, or the listed `refs`."""

    count: int | None = None
    #: GPU indexes (`"3"`), MIG indexes (`"0:1"`) and UUIDs (`GPU-…`, `MIG-…`), as written.
    refs: tuple[str, ...] = ()

    @property
    def all(self) -> bool:
        return self.count is None and not self.refs


@dataclass(frozen=True)
class SharedResource:
    """One `sharing.timeSlicing.resources[i]` entry, names as written (qualified by `qualify`)."""

    name: str
    replicas: int
    rename: str | None = None
    devices: DeviceSelection = DeviceSelection()
    #: `file:line: field sharing.timeSlicing.resources[i]`, for messages about this entry.
    where: str = "sharing.timeSlicing.resources"


#: `TimeSlicing.strategy` values: the config section each one came from.
TIME_SLICING = "timeSlicing"
MPS = "mps"


@dataclass(frozen=True)
class TimeSlicing:
    """Replicated GPUs: `sharing.timeSlicing`, or `sharing.mps` (`strategy`), as read."""

    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    resources: tuple[SharedResource, ...] = ()
    #: `TIME_SLICING` or `MPS`: which section the replicas come from.
    strategy: str = TIME_SLICING

    @property
    def mps(self) -> bool:
        return self.strategy == MPS

    def target(self, entry: SharedResource, domain: str) -> str:
        """The resource the entry's replicas are served as: `rename`, else `<name>.shared` with
        `renameByDefault`, else the name itself."""
        if entry.rename:
            return qualify(entry.rename, domain)
        name = qualify(entry.name, domain)
        return name + SHARED_SUFFIX if self.rename_by_default else name


def device_limit_reason() -> str:
    """Why `MAX_REPLICAS` exists, for error messages."""
    return (f"the kubelet sends every free replica's ID in one GetPreferredAllocation request, which the daemon "
            f"reads up to {DAEMON_MAX_REQUEST_BYTES >> 20} MiB, and receives the whole list in one ListAndWatch "
            f"message of at most {KUBELET_MAX_MESSAGE_BYTES >> 20} MiB")


def qualify(name: str, domain: str = NVIDIA_DOMAIN) -> str:
    """`gpu` -> `<domain>/gpu` (NVIDIA prefixes names that have no domain); a full name stays."""
    return name if "/" in name else f"{domain}/{name}"


def parse_sharing(section: Mapping[str, Any] | None, root: yaml.Node | None, path: str) -> TimeSlicing | None:
    """The schema-checked `sharing:` section -> `TimeSlicing` (None when there is none)."""
    if not section:
        return None
    ts, mps = section.get("timeSlicing"), section.get("mps")
    if ts and mps:
        line = line_of(root, ["sharing", "mps"])
        raise SharingError(
            f"{path}:{line}: field sharing.mps: a config cannot share GPUs both by time-slicing and by MPS "
            "(fix: keep sharing.timeSlicing or sharing.mps, not both; see docs/sharing.md)")
    if mps:
        return _replicated(mps, MPS, root, path)
    if ts:
        return _replicated(ts, TIME_SLICING, root, path)
    return None


def _replicated(body: Mapping[str, Any], key: str, root: yaml.Node | None, path: str) -> TimeSlicing:
    entries = []
    for i, raw in enumerate(body["resources"]):
        where = f"{path}:{line_of(root, ['sharing', key, 'resources', i])}: field " \
                f"sharing.{key}.resources[{i}]"
        if raw["replicas"] > MAX_REPLICAS:  # before anything is built: no node can serve it
            line = line_of(root, ["sharing", key, "resources", i, "replicas"])
            raise SharingError(
                f"{path}:{line}: field sharing.{key}.resources[{i}].replicas: {raw['replicas']} is more than "
                f"the {MAX_REPLICAS} replicas one resource may advertise ({device_limit_reason()}) "
                f"(fix: lower replicas so that replicas x the devices the entry shares stays within "
                f"{MAX_REPLICAS}: {MAX_REPLICAS // 8} on a node of 8 GPUs)")
        devices = raw.get("devices", "all")
        if devices == "all":
            selection = DeviceSelection()
        elif isinstance(devices, int):
            selection = DeviceSelection(count=devices)
        else:
            selection = DeviceSelection(refs=tuple(str(d) for d in devices))
        entries.append(SharedResource(name=raw["name"], replicas=raw["replicas"], rename=raw.get("rename") or None,
                                      devices=selection, where=where))
    return TimeSlicing(
        rename_by_default=bool(body.get("renameByDefault", False)),
        # NVIDIA's MPS has no such key: a container gets one replica, its share of one GPU.
        fail_requests_greater_than_one=key == MPS or bool(body.get("failRequestsGreaterThanOne", False)),
        resources=tuple(entries),
        strategy=key,
    )
