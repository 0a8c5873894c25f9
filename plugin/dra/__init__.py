"""The DRA (Dynamic Resource Allocation) driver side of topo-device-plugin.

Subpackages by concept (docs/architecture.md has a row for each):

- `kubelet/`: the kubelet's side: the DRAPlugin and registration services, prepare/unprepare,
  the checkpoint, one CDI spec per claim, the socket layout, device health;
- `slices/`: what is published: ResourceSlices (pure), their GPU order, and the publisher;
- `claims/`: a claim parsed once, the one opaque-config reader, GpuConfig with time-slicing
  and MPS, and our entries of the claim's status;
- `network/`: a claim's NICs: NicConfig, conflicts with other claims, the NRI sandbox handler;
- `mig/`: MIG devices, instances made at prepare, and the backends that make them;
- `driver`: runs them for one node (`DraDriver`, `DraOptions`), with the collaborators
  `plugin/runtime/compose/` builds. The Kubernetes client is `plugin/kube/`.
"""

from .driver import DraDriver, DraOptions
from .slices.build import SliceOptions, build_resource_slices

__all__ = ["DraDriver", "DraOptions", "SliceOptions", "build_resource_slices"]
