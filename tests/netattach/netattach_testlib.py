"""Real network namespaces and veth pairs for the netattach tests, always cleaned up (see conftest.py).

A namespace is made by `unshare --net=FILE` (bind-mounted on a file under the
test's temp dir, never /var/run/netns); a veth pair stands in for a NIC (one end
plays the NIC, the peer stays in the host). Names are unique per test (≤ 15
characters, prefix "tn") so that parallel runs and the host's real interfaces
are never touched. Teardown unmounts the namespaces first (which destroys every
veth inside them, and so their peers) and then deletes what is left by name.
Checks run through `ip` and `nsenter`, not through the code under test.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from allocator.topology import NodeTopology
from plugin.sources.simulated import load_node_yaml


def needs_root() -> None:
    if os.geteuid() == 0:
        return
    reason = "network namespaces and veth pairs need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    if os.environ.get("TOPO_DP_REQUIRE_KUBELET_E2E") == "1":
        pytest.fail(f"tests/netattach are required in CI but {reason}")
    print(f"\nSKIP (tests/netattach): {reason}", file=sys.stderr)
    pytest.skip(reason)


def run(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def ip_json(netns: str | None, *args: str) -> list[dict]:
    """`ip -j ARGS`, in the namespace at path `netns` (through nsenter) or in the host's."""
    prefix = ("nsenter", f"--net={netns}") if netns else ()
    return json.loads(run(*prefix, "ip", "-j", *args) or "[]")


def link(netns: str | None, name: str) -> dict | None:
    """`ip -d link show NAME` as JSON, or None when there is no such link there."""
    prefix = ("nsenter", f"--net={netns}") if netns else ()
    p = subprocess.run((*prefix, "ip", "-j", "-d", "link", "show", "dev", name), capture_output=True, text=True)
    return json.loads(p.stdout)[0] if p.returncode == 0 else None


def link_by_mac(netns: str | None, mac: str) -> dict | None:
    found = [x for x in ip_json(netns, "-d", "link", "show") if x.get("address") == mac]
    return found[0] if found else None


@dataclass
class Veth:
    name: str  # the end that plays the NIC
    peer: str  # stays in the host
    mac: str


class Net:
    """Factory of namespaces and veth pairs for one test; `close()` removes them all."""

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.tag = secrets.token_hex(3)
        self.namespaces: list[str] = []
        self.links: list[str] = []
        self.macs: set[str] = set()
        self._n = 0

    def netns(self) -> str:
        path = str(self.tmp / f"ns{len(self.namespaces)}")
        open(path, "w").close()
        self.namespaces.append(path)
        run("unshare", f"--net={path}", "true")
        return path

    def name(self, what: str = "") -> str:
        self._n += 1
        return f"tn{self.tag}{what}{self._n}"[:15]

    def veth(self, *, mtu: int | None = None, up: bool = False) -> Veth:
        a, b = self.name("a"), self.name("b")
        self.links += [a, b]
        run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        if mtu is not None:
            run("ip", "link", "set", a, "mtu", str(mtu))
        if up:
            run("ip", "link", "set", a, "up")
        v = Veth(a, b, link(None, a)["address"])
        self.macs |= {v.mac, link(None, b)["address"]}
        return v

    def occupy(self, netns: str | None, name: str) -> None:
        """Another interface called `name` (a veth; this kernel may have no dummy driver), in `netns` or the host."""
        peer = self.name("o")
        prefix = ("nsenter", f"--net={netns}") if netns else ()
        run(*prefix, "ip", "link", "add", name, "type", "veth", "peer", "name", peer)
        if netns is None:
            self.links += [name, peer]
            self.macs |= {link(None, name)["address"], link(None, peer)["address"]}

    def kill(self, netns: str) -> None:
        """The pod dies: its namespace is unmounted and removed (what the runtime does)."""
        subprocess.run(["umount", netns], capture_output=True)
        if os.path.exists(netns):
            os.unlink(netns)

    def close(self) -> None:
        for path in self.namespaces:
            self.kill(path)
        for name in self.links:
            subprocess.run(["ip", "link", "del", name], capture_output=True)
        # a test that failed half-way may have left one renamed in the host: ours by hardware address
        for x in ip_json(None, "link", "show"):
            if x.get("address") in self.macs:
                subprocess.run(["ip", "link", "del", x["ifname"]], capture_output=True)


@pytest.fixture
def net(tmp_path) -> Iterator[Net]:
    """Real namespaces and veth pairs for one test, all removed after it (root only: skipped with the reason)."""
    needs_root()
    n = Net(tmp_path)
    try:
        yield n
    finally:
        n.close()


def node_with_netdevs(*netdevs: str) -> NodeTopology:
    """A simulated one-GPU node whose NICs are the given netdevs (veths of a test), in order."""
    nics = "\n".join(f"  - {{name: nic{i}, numa: 0, netdev: {n}}}" for i, n in enumerate(netdevs))
    return load_node_yaml(f"apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus: [{{numa: 0}}]\n"
                          f"nics:\n{nics}\n", "node.yaml")

