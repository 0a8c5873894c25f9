"""The DRA (Dynamic Resource Allocation) driver side of topo-device-plugin.

Modules, one job each:

- `slices`: topology + options -> ResourceSlice objects (pure); `topology_groups`
  derives the PCIe-switch, root-complex and NVLink groups behind the attributes;
- `publisher`: keeps the node's slices in the API server current; `kubeapi`: the
  API calls, through lightkube's asyncio client (in-cluster or a kubeconfig);
- `service`: the kubelet's DRAPlugin gRPC service (v1 and v1beta1) and the plugin
  watcher's Registration service; `prepare`: what NodePrepare/UnprepareResources do;
- `checkpoint`: prepared claims on disk (atomic, flock-serialised); `cdi`: the CDI
  interface the driver needs and a minimal writer; `paths`: the socket layout;
- `claim_config`: the allocation's opaque configs for our driver, per request;
  `gpu_config`: the `GpuConfig` kind (time-slicing); `sharing`: one time-slice
  setting per GPU, applied through a simulated file or nvidia-smi;
- `network_config`: a claim's NicConfig checked and turned into each NIC's pod interface;
  `pod_network`: the NRI sandbox handler that moves prepared NICs into their pods and back;
  `claim_status`: our entries of a claim's `status.devices` (networkData), written in the background;
- `driver`: composes them for one node (`DraDriver`, `DraOptions`).
"""

from .driver import DraDriver, DraOptions
from .slices.build import SliceOptions, build_resource_slices

__all__ = ["DraDriver", "DraOptions", "SliceOptions", "build_resource_slices"]
