"""What a container gets for an MPS replica: the control daemon's pipe directory and its share's limits.

Why a wrapper around the replicas' builder: MPS replicas are time-slicing
replicas (`plugin.model.time_slicing`) plus the way to the MPS control daemon
that `plugin.mps` runs for the resource; the GPU part of the answer stays the
GPU builder's.

What is added, as NVIDIA's device plugin hands it out (k8s-device-plugin
`cmd/mps-control-daemon/mps/root.go`, `internal/plugin/server.go`):

- the host's `<mps root>/<resource>/pipe` mounted at `/mps/<resource>/pipe`
  (read-write: clients create their own pipes in it) and `CUDA_MPS_PIPE_DIRECTORY`
  naming it, so CUDA in the container talks to our daemon;
- the host's `<mps root>/shm` mounted at `/dev/shm`: MPS clients and their
  server meet in POSIX shared memory, so the container's `/dev/shm` must be the
  server's (the chart mounts the same directory at the daemon's `/dev/shm`, as
  NVIDIA's chart does for its control daemon);
- `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`: 100 / replicas, the share of the GPU's
  SMs one replica stands for (the most-shared GPU of the request decides);
- `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: `<ordinal>=<MiB>M` per GPU, the GPU's
  memory / replicas, where the ordinal is the GPU's place among the container's
  GPUs (what CUDA in the container numbers them), left out for a GPU whose
  memory is unknown. The control daemon is given the same defaults
  (`set_default_*`), so a client that drops the variables is still bounded.

The resource's own name is the directory name with `/` turned into `_`
(`nvidia.com/gpu.shared` -> `nvidia.com_gpu.shared`), one directory per
shared resource, as one control daemon serves one resource.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from allocator.subdevices import physical_id
from allocator.topology import Device

from .allocate_response import ContainerAllocation, HostMount

#: Where containers see the MPS directories (NVIDIA's `ContainerRoot`).
CONTAINER_ROOT = "/mps"
DEFAULT_HOST_ROOT = "/run/nvidia/mps"
#: Where MPS clients and servers keep their shared memory.
SHM_DIR = "/dev/shm"


def resource_dir(resource: str) -> str:
    """A resource name as one directory name (no `/`)."""
    return resource.replace("/", "_")


@dataclass(frozen=True)
class MpsPaths:
    """The directories of one shared resource's control daemon, on the host and in containers."""

    host_root: str
    resource: str

    @property
    def host_pipe_dir(self) -> str:
        return os.path.join(self.host_root, resource_dir(self.resource), "pipe")

    @property
    def host_log_dir(self) -> str:
        return os.path.join(self.host_root, resource_dir(self.resource), "log")

    @property
    def host_shm_dir(self) -> str:
        """Shared by every resource's daemon and its clients (NVIDIA's `Root.ShmDir`)."""
        return os.path.join(self.host_root, "shm")

    @property
    def container_pipe_dir(self) -> str:
        return os.path.join(CONTAINER_ROOT, resource_dir(self.resource), "pipe")


@dataclass(frozen=True)
class MpsShare:
    """What one replica of a GPU is worth, from the replica count and the GPU's memory."""

    replicas: int
    memory_mib: int | None

    @property
    def active_thread_percentage(self) -> int:
        return max(1, 100 // self.replicas)

    @property
    def pinned_mib(self) -> int | None:
        return self.memory_mib // self.replicas if self.memory_mib else None


def client_env(paths_pipe_dir: str, shares: Sequence[MpsShare]) -> dict[str, str]:
    """The MPS client variables for a container holding one replica of each GPU in `shares` (in order)."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": paths_pipe_dir}
    if shares:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(s.active_thread_percentage for s in shares))
    limits = [f"{n}={s.pinned_mib}M" for n, s in enumerate(shares) if s.pinned_mib]
    if limits:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    return env


class MpsAllocateBuilder:
    """Allocate for MPS replicas: the replicas' answer, plus the pipe directory and this share's limits."""

    def __init__(self, inner, paths: MpsPaths, replicas: Mapping[str, int]):
        #: The replicas' builder (`ReplicaAllocateBuilder`): refuses more than one replica, names each GPU once.
        self.inner = inner
        self.paths = paths
        #: Replicas per physical device ID.
        self.replicas = dict(replicas)

    def build(self, ids: Sequence[str], devices: Sequence[Device]) -> ContainerAllocation:
        out: ContainerAllocation = self.inner.build(ids, devices)
        seen: dict[str, Device] = {}
        for i, d in zip(ids, devices):
            seen.setdefault(physical_id(i), d)
        shares = [MpsShare(self.replicas.get(p, 1), d.memory_mib) for p, d in seen.items()]
        out.envs.update(client_env(self.paths.container_pipe_dir, shares))
        out.mounts.append(HostMount(self.paths.container_pipe_dir, self.paths.host_pipe_dir, read_only=False))
        out.mounts.append(HostMount(SHM_DIR, self.paths.host_shm_dir, read_only=False))
        return out
