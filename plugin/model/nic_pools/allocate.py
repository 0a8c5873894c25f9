"""What a container gets for a NIC pool's devices (Allocate), as the SR-IOV network device plugin builds it.

Why these pieces: Multus and the SR-IOV CNI read `PCIDEVICE_<PREFIX>_<NAME>`
and its `_INFO` JSON (`../shared/research/nic-and-other-plugins.md` §2.4);
DPDK and RDMA workloads need the vfio, uio and `/dev/infiniband` device
nodes. Device specs are deduplicated by host path. Differences, each
deliberate: RDMA char devices go to every RDMA-capable device of any pool
(the default pool included), not only where the selector says `isRdma` (they
belong to that function; without them RDMA in the pod fails), and device
nodes that do not exist under the dev root are left out rather than failing
container creation.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

from allocator.topology import Device

from ..allocate_response import ContainerAllocation, DeviceNode
from .selectors import PoolSpec

log = logging.getLogger(__name__)


def go_json(obj: Any) -> str:
    """JSON as Go's `json.Marshal` writes a map: sorted keys, no spaces, HTML characters escaped."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    for ch, esc in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                    ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


class NicAllocateBuilder:
    """The container's share of a pool's devices, as the SR-IOV network device plugin builds it."""

    def __init__(self, spec: PoolSpec, dev_root: str = "/dev"):
        self.spec = spec
        self.dev_root = dev_root

    def _host(self, container_path: str) -> str:
        rel = container_path[len("/dev/"):] if container_path.startswith("/dev/") else container_path.lstrip("/")
        return os.path.join(self.dev_root, rel)

    def _exists(self, container_path: str) -> bool:
        return os.path.exists(self._host(container_path))

    def _node(self, out: ContainerAllocation, container: str, host: str | None = None) -> bool:
        host_path = self._host(host or container)
        if not os.path.exists(host_path):
            log.warning("%s: device node %s does not exist; not handing it to the container",
                        self.spec.resource_name, host_path)
            return False
        out.add_device(DeviceNode(container_path=container, host_path=host_path, permissions="rw"))
        return True

    def device_info(self, out: ContainerAllocation, d: Device, device_id: str | None = None) -> dict[str, dict[str, str]]:
        """Add `d`'s device nodes to `out` and return its `_INFO` entry (`generic.deviceID`: its plugin ID)."""
        a = d.attributes
        info: dict[str, dict[str, str]] = {"generic": {"deviceID": device_id or d.name}}
        if a.get("driver", "") == "vfio-pci":
            info["vfio"] = self._vfio(out, d)
        elif a.get("uio_device"):
            info["uio"] = self._uio(out, d)
        if self.spec.additional_info is not None:
            extra: dict[str, str] = {}
            for key in ("*", d.name):
                extra.update(self.spec.additional_info.get(key, {}))
            info["extra"] = extra
        selector = self.spec.selector_for(d)
        if a.get("rdma") == "true":
            info["rdma"] = self._rdma(out, d)
        elif selector is not None and selector.is_rdma:
            log.warning("%s: %s was selected as RDMA but has no RDMA device now", self.spec.resource_name, d.name)
        if selector is not None and selector.need_vhost_net:
            vhost = self._vhost(out)
            if vhost:
                info["vhost"] = vhost
        return info

    def _vfio(self, out: ContainerAllocation, d: Device) -> dict[str, str]:
        self._node(out, "/dev/vfio/vfio")
        vinfo = {"mount": "/dev/vfio/vfio"}
        dev = d.attributes.get("vfio_device")
        if dev and self._node(out, dev, d.attributes.get("vfio_host_device") or dev):
            vinfo["dev-mount"] = dev
        return vinfo

    def _uio(self, out: ContainerAllocation, d: Device) -> dict[str, str]:
        uio = d.attributes["uio_device"]
        return {"mount": uio} if self._node(out, uio) else {}

    def _rdma(self, out: ContainerAllocation, d: Device) -> dict[str, str]:
        """The function's `/dev/infiniband` char devices plus `rdma_cm`, and its RDMA device name."""
        a = d.attributes
        rinfo: dict[str, str] = {}
        chars = [c for c in a.get("rdma_char_devices", "").split(",") if c]
        if self._exists("/dev/infiniband/rdma_cm"):
            chars.append("/dev/infiniband/rdma_cm")
        for c in chars:
            if self._node(out, c):
                for key in ("uverbs", "umad", "issm", "rdma_cm"):
                    if key in c:
                        rinfo[key] = c
                        break
        devs = [r for r in a.get("rdma_devices", "").split(",") if r]
        if devs:
            rinfo["rdma_dev"] = devs[0]
        return rinfo

    def _vhost(self, out: ContainerAllocation) -> dict[str, str] | None:
        if not (self._exists("/dev/vhost-net") and self._exists("/dev/net/tun")):
            log.warning("%s: needVhostNet is set but %s/vhost-net or net/tun does not exist",
                        self.spec.resource_name, self.dev_root)
            return None
        self._node(out, "/dev/vhost-net")
        self._node(out, "/dev/net/tun")
        return {"net-mount": "/dev/vhost-net", "tun-mount": "/dev/net/tun"}

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        out = ContainerAllocation()
        infos: dict[str, dict[str, dict[str, str]]] = {}
        for i, d in zip(ids, devices):
            infos[i] = self.device_info(out, d, i)
        env = self.spec.env_name
        out.envs[env] = ",".join(ids)
        out.envs[env + "_INFO"] = go_json(infos)
        return out

