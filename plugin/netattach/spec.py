"""What to attach (InterfaceSpec, RouteSpec), what was done (Attached), and how each went wrong.

Why records and not live objects: an attachment must outlive the process that
made it. The NetAttacher's ledger stores `Attached` as JSON, and a restarted
driver undoes an attachment from that record alone: the interface's original
name, MTU, admin state and hardware address (the one identity that survives a
namespace move and a kernel-chosen rename), and which namespace it went into.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from ..errors import RuntimeFailure

#: The kernel's limit on a netdev name (IFNAMSIZ 16, less the terminating NUL).
IFNAME_MAX = 15


class AttachError(RuntimeFailure):
    """Attaching an interface failed at `step`; whatever had been done was undone before this was raised."""

    def __init__(self, step: str, ifname: str, why: str):
        super().__init__(f"attaching interface {ifname}: {step} failed: {why}")
        self.step = step
        self.ifname = ifname
        self.why = why


class DetachError(RuntimeFailure):
    """Returning an interface to the host failed; the record is kept so that a later detach retries it."""

    def __init__(self, step: str, ifname: str, why: str):
        super().__init__(f"detaching interface {ifname}: {step} failed: {why}")
        self.step = step
        self.ifname = ifname
        self.why = why


class Outcome(enum.Enum):
    """How a detach ended; callers tell a lost interface from a returned one by this value."""

    #: Moved back from the pod's namespace (or its settings put right in the host): original name, MTU, state.
    RESTORED = "restored"
    #: Already in the host with its name and settings: nothing was done.
    ALREADY_HOME = "already-home"
    #: The pod's namespace was gone; the kernel had returned the device to the host (under its pod name
    #: or a name of its own choosing), found by hardware address and given back its name, MTU and state.
    RECOVERED = "recovered"
    #: Gone everywhere: a virtual device (veth) is destroyed with its namespace. Nothing left to restore.
    LOST = "lost"


def check_ifname(name: str, what: str) -> None:
    """Raise ValueError unless `name` is a netdev name the kernel accepts (dev_valid_name)."""
    if not name or len(name) > IFNAME_MAX or name in (".", "..") or any(c in name for c in "/: \t\n"):
        raise ValueError(f"{what} {name!r} is not a valid interface name "
                         f"(1-{IFNAME_MAX} characters, none of '/', ':' or white space)")


@dataclass(frozen=True)
class RouteSpec:
    """A route through the attached interface: `destination` a CIDR (0.0.0.0/0 or ::/0 for a default)."""

    destination: str
    gateway: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"destination": self.destination, "gateway": self.gateway}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RouteSpec:
        gw = d.get("gateway")
        return cls(destination=str(d["destination"]), gateway=None if gw is None else str(gw))


@dataclass(frozen=True)
class InterfaceSpec:
    """One NIC to attach: its host netdev, its name in the pod and the configuration it gets there."""

    host_name: str
    pod_name: str = ""
    addresses: tuple[str, ...] = ()
    routes: tuple[RouteSpec, ...] = ()
    mtu: int | None = None
    #: The NIC's RDMA device (e.g. mlx5_0): moved with the netdev when the RDMA netns mode is exclusive.
    rdma_device: str | None = None

    def __post_init__(self) -> None:
        if not self.pod_name:
            object.__setattr__(self, "pod_name", self.host_name)
        object.__setattr__(self, "addresses", tuple(self.addresses))
        object.__setattr__(self, "routes", tuple(self.routes))

    def validate(self) -> None:
        """Raise ValueError naming the field if the kernel would refuse this configuration."""
        check_ifname(self.host_name, "host_name")
        check_ifname(self.pod_name, "pod_name")
        for a in self.addresses:
            try:
                ipaddress.ip_interface(a)
            except ValueError:
                raise ValueError(f"address {a!r} is not an address with a prefix length (CIDR)") from None
            if "/" not in a:
                raise ValueError(f"address {a!r} has no prefix length (write it as CIDR, e.g. 10.0.0.2/24)")
        for r in self.routes:
            try:
                dst = ipaddress.ip_network(r.destination, strict=False)
            except ValueError:
                raise ValueError(f"route destination {r.destination!r} is not a CIDR") from None
            if r.gateway is not None:
                try:
                    gw = ipaddress.ip_address(r.gateway)
                except ValueError:
                    raise ValueError(f"route gateway {r.gateway!r} is not an IP address") from None
                if gw.version != dst.version:
                    raise ValueError(f"route to {r.destination}: gateway {r.gateway} is of another IP version")
        if self.mtu is not None and not (68 <= self.mtu < 2**31):  # the device's own maximum is checked on attach
            raise ValueError(f"mtu {self.mtu} is below 68, the least an IPv4 link may have")

    def to_json(self) -> dict[str, Any]:
        return {"host_name": self.host_name, "pod_name": self.pod_name, "addresses": list(self.addresses),
                "routes": [r.to_json() for r in self.routes], "mtu": self.mtu, "rdma_device": self.rdma_device}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> InterfaceSpec:
        mtu = d.get("mtu")
        rdma = d.get("rdma_device")
        return cls(host_name=str(d["host_name"]), pod_name=str(d.get("pod_name") or ""),
                   addresses=tuple(str(a) for a in d.get("addresses", ())),
                   routes=tuple(RouteSpec.from_json(r) for r in d.get("routes", ())),
                   mtu=None if mtu is None else int(mtu), rdma_device=None if rdma is None else str(rdma))


@dataclass(frozen=True)
class Attached:
    """What attaching did (or is about to do), enough to undo it from this record alone."""

    spec: InterfaceSpec
    #: The pod's network namespace, by path (e.g. /var/run/netns/cni-...).
    netns: str
    original_mtu: int
    #: The NIC's hardware address (lower case, colon-separated): finds it after its name changed.
    hw_address: str
    was_up: bool
    #: Whether its RDMA device goes (went) with it: the host's RDMA netns mode was exclusive.
    rdma_moved: bool = False
    #: (st_dev, st_ino) of the namespace file when attached: a path reused by another namespace is not ours.
    netns_id: tuple[int, int] = field(default=(0, 0))
    #: The factory address of a physical NIC (IFLA_PERM_ADDRESS; "" for a virtual one): finds it even if
    #: the pod changed its address.
    perm_address: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"spec": self.spec.to_json(), "netns": self.netns, "original_mtu": self.original_mtu,
                "hw_address": self.hw_address, "was_up": self.was_up, "rdma_moved": self.rdma_moved,
                "netns_id": list(self.netns_id), "perm_address": self.perm_address}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Attached:
        dev, ino = d.get("netns_id", (0, 0))
        return cls(spec=InterfaceSpec.from_json(d["spec"]), netns=str(d["netns"]),
                   original_mtu=int(d["original_mtu"]), hw_address=str(d["hw_address"]),
                   was_up=bool(d["was_up"]), rdma_moved=bool(d.get("rdma_moved", False)),
                   netns_id=(int(dev), int(ino)), perm_address=str(d.get("perm_address", "")))
