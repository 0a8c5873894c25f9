"""Generated nodes for the NCCL hint tests, and the hint a container must get, read off the node's layout.

Why generated sysfs trees rather than the built-in simulated nodes: the hint
names RDMA devices and netdevs, which only discovery of real sysfs files
records on a NIC (the simulated node format names neither). The shapes are
the built-in ones where it matters:

- `dgx_h100_node`: the built-in `dgx-h100` (8 H100 on NVSwitch, 2 sockets, one
  ConnectX-7 InfiniBand port beside each GPU on its PCIe switch);
- `dgx_h100_ethernet_node`: the same machine with plain Ethernet NICs (a
  netdev each, no RDMA device), the socket-transport case;
- `dgx_h100_mixed_node`: half of each (two NIC pools in one container);
- `gb300_cx8_dd_node` (from `sysfs_fixture`): GPU0's NIC is the *second* NIC in
  PCI order, so a hint in GPU order differs from one in NIC order.

`expected_hint` derives the answer from the layout alone (which NIC sits on
each GPU's switch or complex, and the names the generator gave it), never
from the code under test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .sysfs_fixture import (
    GeneratedNode,
    Gpu,
    HostBridge,
    NicCard,
    NodeSpec,
    Port,
    Socket,
    Switch,
    gb300_cx8_dd_node,
)

__all__ = ["dgx_h100_node", "dgx_h100_ethernet_node", "dgx_h100_mixed_node", "expected_hint", "gb300_cx8_dd_node", "partner"]

_H100 = Gpu(model="NVIDIA H100 80GB HBM3", device_id="2330", memory_mib=81559)


def _dgx(name: str, port: Callable[[int], Port]) -> NodeSpec:
    def pair(k: int) -> Switch:
        return Switch((_H100, NicCard(ports=(port(k),), device="1021", vf_device="101e")))

    def socket(numa: int) -> Socket:
        base = 4 * numa
        return Socket(numa, (HostBridge((pair(base), pair(base + 1))), HostBridge((pair(base + 2), pair(base + 3)))))

    return NodeSpec(name=name, sockets=(socket(0), socket(1)), nvswitch_links=18)


def dgx_h100_node() -> NodeSpec:
    """DGX H100: GPU i and an InfiniBand ConnectX-7 (RDMA device, netdev `ibp<i>s0`) on one PCIe switch."""
    return _dgx("gen-dgx-h100", lambda k: Port(f"ibp{k}s0", total_vfs=0, link_type="infiniband", rdma=True))


def dgx_h100_ethernet_node() -> NodeSpec:
    """The same machine with Ethernet NICs without RDMA: netdev `ens<i>np0`, no RDMA device."""
    return _dgx("gen-dgx-h100-eth", lambda k: Port(f"ens{k}np0", total_vfs=0))


def dgx_h100_mixed_node() -> NodeSpec:
    """GPUs 0-3 with InfiniBand NICs (`ibp<i>s0`, RDMA), GPUs 4-7 with Ethernet NICs (`ens<i>np0`, no RDMA)."""
    return _dgx("gen-dgx-h100-mixed", lambda k: Port(f"ibp{k}s0", total_vfs=0, link_type="infiniband", rdma=True)
                if k < 4 else Port(f"ens{k}np0", total_vfs=0))


def partner(node: GeneratedNode, gpu_bdf: str, nic_bdfs: Iterable[str]) -> str | None:
    """The NIC (BDF) among `nic_bdfs` that is the GPU's own: on its PCIe switch, or of its complex."""
    gpu = node.function(gpu_bdf)
    for bdf in nic_bdfs:
        nic = node.function(bdf)
        if nic.parent == gpu.parent:
            return bdf
        if gpu.gpu is not None and gpu.gpu.complex and nic.nic is not None and nic.nic.complex == gpu.gpu.complex:
            return bdf
    return None


def expected_hint(node: GeneratedNode, gpu_bdfs: Iterable[str], nic_bdfs: Iterable[str]) -> dict[str, str]:
    """The NCCL variables for a container with these GPUs and NICs (docs/networking.md, "NCCL hints"):
    GPUs in PCI order, each one's own NIC next; then the NICs that are no GPU's own, in PCI order."""
    gpus, nics = sorted(gpu_bdfs), sorted(nic_bdfs)
    if not gpus or not nics:
        return {}
    order: list[str] = []
    for g in gpus:
        p = partner(node, g, [n for n in nics if n not in order])
        if p is not None:
            order.append(p)
    order += [n for n in nics if n not in order]
    hcas = [f"{node.function(n).rdma_dev}:1" for n in order if node.function(n).rdma_dev]
    ifnames = [node.function(n).netdev or "" for n in order if not node.function(n).rdma_dev]
    out = {}
    if hcas:
        out["NCCL_IB_HCA"] = "=" + ",".join(hcas)
    if any(ifnames):
        out["NCCL_SOCKET_IFNAME"] = "=" + ",".join(i for i in ifnames if i)
    return out
