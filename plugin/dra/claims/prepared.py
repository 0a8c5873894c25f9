"""The records a claim leaves once allocated and prepared, shared by the kubelet side and the pod network.

Why here, in `claims/`: the kubelet side (`plugin.dra.kubelet`: prepare, the checkpoint) writes them and
the pod network (`plugin.dra.network`: the NIC plan, the conflicts, the sandbox handler) reads them. They
used to live in the kubelet package, so the network package imported upward into it while the kubelet
side imported the network package: a cycle between the two packages. Kept in the package both already
stand on, the direction is one way: kubelet → network → claims. Pure data: no I/O, no imports of the
driver.

- `ClaimRef`: the claim a kubelet call names; `Allocated`: its devices of our pool;
- `NicNetwork` (with its `Route`s): what one NIC becomes in the pod, planned by
  `plugin.dra.network.nic_config` and applied when the sandbox starts;
- `PreparedDevice`, `PreparedClaim`: the checkpoint's record of a prepared claim and its JSON form
  (the file itself is `plugin.dra.kubelet.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from allocator.topology import Device

#: One claim's allocated devices: (slice device name, Device, request names); a device the claim holds several
#: shares of (consumable capacity) appears once per share.
Allocated = list[tuple[str, Device, list[str]]]


@dataclass(frozen=True)
class ClaimRef:
    """Which claim a kubelet call names: the three fields NodePrepareResources sends (the claim itself is read
    from the API server)."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True)
class Route:
    destination: str
    gateway: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"destination": self.destination, **({"gateway": self.gateway} if self.gateway else {})}


@dataclass(frozen=True)
class NicNetwork:
    """What one NIC of a prepared claim becomes in the pod: recorded in the checkpoint at prepare, applied when
    the pod's sandbox starts (this is `plugin.netattach.InterfaceSpec`'s content, kept in our own record so the
    checkpoint format does not follow another package's types)."""

    host_name: str
    pod_name: str
    addresses: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()
    mtu: int | None = None
    rdma_device: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"host_name": self.host_name, "pod_name": self.pod_name}
        if self.addresses:
            out["addresses"] = list(self.addresses)
        if self.routes:
            out["routes"] = [r.to_json() for r in self.routes]
        if self.mtu is not None:
            out["mtu"] = self.mtu
        if self.rdma_device:
            out["rdma_device"] = self.rdma_device
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> NicNetwork:
        return cls(host_name=str(d["host_name"]), pod_name=str(d["pod_name"]),
                   addresses=tuple(str(a) for a in d.get("addresses", ())),
                   routes=tuple(Route(str(r["destination"]), r.get("gateway")) for r in d.get("routes", ())),
                   mtu=int(d["mtu"]) if d.get("mtu") is not None else None,
                   rdma_device=d.get("rdma_device") or None)


@dataclass(frozen=True)
class PreparedDevice:
    """One device of a prepared claim, as NodePrepareResources reports it."""

    pool: str
    device: str
    requests: tuple[str, ...] = ()
    cdi_device_ids: tuple[str, ...] = ()
    #: The GPU's time-slice interval this claim asked for and got (plugin/dra/claims/sharing.py); "" when none.
    timeslice: str = ""
    #: The allocation's share ID when the claim holds a share of the device (consumable capacity); "" otherwise.
    share_id: str = ""
    #: A NIC the pod-network side attaches to the pod when its sandbox starts (plugin/dra/network/pod_network.py).
    network: NicNetwork | None = None


@dataclass(frozen=True)
class PreparedClaim:
    """One claim as the checkpoint records it once prepared: what the kubelet is answered, and what the pod
    network and unprepare read back later, possibly in another instance of the driver."""

    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...] = field(default_factory=tuple)
    #: UIDs of the pods the claim was reserved for when prepared (`status.reservedFor`, kind Pod): whose
    #: sandbox gets the claim's NICs.
    pods: tuple[str, ...] = ()

    @property
    def networks(self) -> list[tuple[PreparedDevice, NicNetwork]]:
        return [(d, d.network) for d in self.devices if d.network is not None]

    def to_json(self) -> dict[str, Any]:
        # By hand rather than dataclasses.asdict (a recursive deep copy): the whole file is encoded on every
        # write, in a worker thread whose Python work competes with the event loop for the GIL.
        out: dict[str, Any] = {"uid": self.uid, "namespace": self.namespace, "name": self.name,
                               "devices": [_device_json(x) for x in self.devices]}
        if self.pods:
            out["pods"] = list(self.pods)
        return out

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PreparedClaim:
        """Also reads files of earlier releases (no `pods`, no `network`)."""
        return cls(
            uid=str(d["uid"]), namespace=str(d["namespace"]), name=str(d["name"]),
            devices=tuple(PreparedDevice(pool=str(x["pool"]), device=str(x["device"]),
                                         requests=tuple(x.get("requests", ())),
                                         cdi_device_ids=tuple(x.get("cdi_device_ids", ())),
                                         timeslice=str(x.get("timeslice", "")),
                                         share_id=str(x.get("share_id", "")),
                                         network=NicNetwork.from_json(x["network"]) if x.get("network") else None)
                          for x in d.get("devices", ())),
            pods=tuple(str(p) for p in d.get("pods", ())),
        )


def _device_json(x: PreparedDevice) -> dict[str, Any]:
    out: dict[str, Any] = {"pool": x.pool, "device": x.device, "requests": list(x.requests),
                           "cdi_device_ids": list(x.cdi_device_ids)}
    # Only when set: files of claims without sharing stay as earlier releases wrote them.
    if x.timeslice:
        out["timeslice"] = x.timeslice
    if x.share_id:
        out["share_id"] = x.share_id
    if x.network is not None:  # absent otherwise: a GPU-only checkpoint reads as before
        out["network"] = x.network.to_json()
    return out
