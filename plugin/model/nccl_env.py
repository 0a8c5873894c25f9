"""NCCL told the pairs: `NCCL_IB_HCA` / `NCCL_SOCKET_IFNAME` for a container's GPUs and NICs (opt-in, `--nccl-env`).

Why: we hand each GPU the NIC on its own PCIe switch, but NCCL does not know
which NICs are the container's. On a node where the container sees more RDMA
devices than its own (the RDMA subsystem in shared netns mode shows every
device of the host), NCCL may pick a NIC another pod uses. Naming the
container's devices, exactly, keeps it on the NICs it was given.

What is named (NCCL's syntax, docs.nvidia.com "Environment Variables"): a
list whose leading `=` makes every entry an exact name rather than a prefix;
an `NCCL_IB_HCA` entry may add `:<port>`:
- `NCCL_IB_HCA=` the NICs that have an RDMA device (InfiniBand, RoCE), as
  `<rdma device>:1`. Port 1: every function we offer carries its RDMA device
  on port 1 (mlx5 gives each PCI function a device of its own with one port;
  discovery reads that port, `plugin.sources.sysfs_nics`);
- `NCCL_SOCKET_IFNAME=` the NICs with a netdev and no RDMA device (plain
  Ethernet: NCCL's socket transport), by their netdev name on the host: the
  name in the pod with host networking and for a NIC the DRA path moves
  without renaming it (docs/networking.md, "NCCL hints").
A container with no GPU or no NIC gets nothing, and a key without a NIC of
its kind is left out.

Order: "GPU i's NIC first". The GPUs are taken as CUDA numbers them (PCI bus
ID order, the tie-break of CUDA's default order for identical GPUs; device
index where there is no bus ID), each GPU's partner in the best one-to-one
GPU–NIC matching comes next in the list, and NICs that pair with no GPU
follow in PCI order. The matching is the one pairing uses (`allocator.pairing`:
maximum total link weight, `PIX` highest), so on a DGX-style node GPU i's
entry is the NIC on its PCIe switch. NCCL itself picks, for each GPU, the
closest NIC among those named; the order makes the hint readable and stable.

Pure (no gRPC, no files): the device-plugin side (`plugin.allocation.pairing_service`)
and the DRA side (`plugin.dra.kubelet.cdi`) give it the devices and a weight.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from allocator.pairing import Matching
from allocator.topology import Device, DeviceKind

IB_HCA = "NCCL_IB_HCA"
SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
#: The RDMA port named for each device (see the module doc).
RDMA_PORT = 1

#: Pairing weight of a GPU and a NIC (0: they do not pair).
Weight = Callable[[Device, Device], int]


def rdma_device(nic: Device) -> str | None:
    """The NIC's RDMA device (`mlx5_3`), or None: the first of `rdma_devices` as discovery records it."""
    names = [n for n in nic.attributes.get("rdma_devices", "").split(",") if n]
    return names[0] if names else None


def _pci_key(d: Device) -> tuple[int, str, int]:
    bus = (d.pci_bus_id or "").lower()
    return (0 if bus else 1, bus, d.index)


def gpu_order(gpus: Sequence[Device]) -> list[Device]:
    """The GPUs in the order CUDA numbers them (PCI bus ID; index without one); each device once."""
    seen: dict[str, Device] = {}
    for g in gpus:
        seen.setdefault(g.name, g)
    return sorted(seen.values(), key=_pci_key)


def nic_order(gpus: Sequence[Device], nics: Sequence[Device], weight: Weight) -> list[Device]:
    """The NICs, GPU i's partner first (GPU order), then NICs that pair with no GPU (PCI order)."""
    order = gpu_order(gpus)
    unique: dict[str, Device] = {}
    for n in nics:
        unique.setdefault(n.name, n)
    cols = sorted(unique.values(), key=_pci_key)
    m = Matching(len(cols))
    for g in order:
        m.push([max(0, weight(g, n)) for n in cols])
    paired = [cols[j] for _, j in m.pairs()]
    taken = {n.name for n in paired}
    return paired + [n for n in cols if n.name not in taken]


def nccl_env(gpus: Sequence[Device], nics: Sequence[Device], weight: Weight) -> dict[str, str]:
    """`NCCL_IB_HCA` and `NCCL_SOCKET_IFNAME` for a container with `gpus` and `nics` (module doc).

    Interfaces are named by the NIC's netdev on the host (docs/networking.md says where the pod's
    name differs).
    """
    real_gpus = [g for g in gpus if g.kind is DeviceKind.GPU]
    real_nics = [n for n in nics if n.kind is DeviceKind.NIC]
    if not real_gpus or not real_nics:
        return {}
    hcas: list[str] = []
    ifnames: list[str] = []
    for n in nic_order(real_gpus, real_nics, weight):
        rdma = rdma_device(n)
        if rdma:
            hcas.append(f"{rdma}:{RDMA_PORT}")
            continue
        ifname = n.attributes.get("netdev", "")
        if ifname:
            ifnames.append(ifname)
    env: dict[str, str] = {}
    if hcas:
        env[IB_HCA] = "=" + ",".join(hcas)
    if ifnames:
        env[SOCKET_IFNAME] = "=" + ",".join(ifnames)
    return env
