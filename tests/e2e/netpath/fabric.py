"""The simulated node's NICs as real links: one veth pair per NIC in the node's network namespace.

There is no NIC hardware here, but what the driver does to a NIC's netdev (move it into a
pod's network namespace, rename it, set its MTU and addresses, move it back) is plain
netlink, and a veth end takes all of it. So each NIC of the simulated node is stood in by a
veth pair created in the node's namespace (the sandbox holder's, tests/e2e/cluster/sandbox.py):
the end named as the NIC's `netdev` is what the driver moves; its peer stays in the node as
the NIC's switch port, enslaved to a Linux bridge (one per rail, i.e. per subnet), so two
pods' attached interfaces reach each other and the ports' counters show which NIC carried
the traffic. Only a node-side end can come back: a veth left in a namespace that is destroyed
is destroyed with it (unlike a physical NIC, which the kernel hands to the initial namespace),
so a lost interface shows as a missing link here.

Everything lives in the holder's namespace and goes away with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sandbox import Sandbox

#: Rails: one bridge per subnet the pods' attached interfaces live on.
RAILS = ("tdpfab0", "tdpfab1")
#: The bridges and switch ports carry jumbo frames (the claims ask for MTU 9000 inside the pods).
FABRIC_MTU = 9000
#: The NIC ends start like a freshly brought-up NIC: standard MTU, administratively up.
NIC_MTU = 1500


@dataclass(frozen=True)
class LinkState:
    """What a user would notice of a link: its name, MTU, MAC and whether it is up."""

    name: str
    mtu: int
    mac: str
    up: bool

    @classmethod
    def of(cls, link: dict[str, Any]) -> LinkState:
        return cls(link["ifname"], link["mtu"], link["address"], "UP" in link.get("flags", []))


def port(netdev: str) -> str:
    """The switch port (node-side peer) of a NIC's netdev."""
    return f"{netdev}sw"


class Fabric:
    """The NIC stand-ins of one node: `netdevs` as veth ends, their ports on the rails' bridges."""

    def __init__(self, sb: Sandbox, netdevs: list[str]):
        self.sb = sb
        self.netdevs = list(netdevs)
        self.initial: dict[str, LinkState] = {}

    def build(self) -> None:
        for bridge in RAILS:
            self.sb.sh("ip", "link", "add", bridge, "mtu", str(FABRIC_MTU), "type", "bridge")
            self.sb.sh("ip", "link", "set", bridge, "up")
        for n in self.netdevs:
            self.sb.sh("ip", "link", "add", n, "mtu", str(NIC_MTU), "type", "veth",
                       "peer", "name", port(n), "mtu", str(FABRIC_MTU))
            self.sb.sh("ip", "link", "set", port(n), "master", RAILS[0], "up")
            self.sb.sh("ip", "link", "set", n, "up")
        self.initial = {n: s for n, s in self.nics().items()}
        assert sorted(self.initial) == sorted(self.netdevs), self.initial

    def links(self) -> list[dict[str, Any]]:
        """Every link of the node's network namespace (`ip -j link`)."""
        return json.loads(self.sb.sh("ip", "-j", "-s", "link", "show").stdout)

    def nics(self) -> dict[str, LinkState]:
        """The NIC netdevs present in the node's namespace now."""
        return {x["ifname"]: LinkState.of(x) for x in self.links() if x["ifname"] in self.netdevs}

    def absent(self) -> list[str]:
        present = self.nics()
        return [n for n in self.netdevs if n not in present]

    def wire(self, netdev: str, rail: int) -> None:
        """Plug the NIC's port into rail `rail`'s bridge (the rails are the pods' subnets)."""
        self.sb.sh("ip", "link", "set", port(netdev), "master", RAILS[rail])

    def port_counters(self, netdev: str) -> tuple[int, int]:
        """(rx packets, tx packets) of the NIC's switch port: what went in and out through that NIC."""
        link = next(x for x in self.links() if x["ifname"] == port(netdev))
        stats = link["stats64"]
        return stats["rx"]["packets"], stats["tx"]["packets"]

    def ports_present(self) -> list[str]:
        names = {x["ifname"] for x in self.links()}
        return [port(n) for n in self.netdevs if port(n) in names]
