"""A faithful model of the kubelet (1.32) Topology Manager and the device manager's
hint generation and device choice. Pure: no I/O, no gRPC, no global state.

Entry points:
- `explain(...)` - a whole pod admission as a report (`ExplainResult`);
- `TopologyManager.new(...)` - the kubelet's NewManager, with its errors.

The JSON in/out case evaluators of the differential test against the real
kubelet live with the tests (`tests/support/topo_testkit/tm_cases.py`).
"""

from .bitmask import BitMask, BitMaskError, iterate_bitmasks
from .device_hints import (
    DeviceInfo,
    ResourceHints,
    device_has_topology_alignment,
    generate_device_topology_hints,
    min_affinity_size,
    resource_hints,
)
from .device_manager import DeviceManagerModel, ResourceSpec
from .devices_to_allocate import (
    DeviceAllocationError,
    DevicesToAllocate,
    PreferredCall,
    PreferredFn,
    devices_to_allocate,
    filter_by_affinity,
    natural_sorted,
)
from .explain import AllocationReport, ExplainResult, MergeReport, explain, machine_numa
from .hint import (
    TOPOLOGY_AFFINITY_ERROR,
    TOPOLOGY_AFFINITY_MESSAGE,
    UNEXPECTED_ADMISSION_ERROR,
    AdmissionError,
    PodAdmitResult,
    TopologyAffinityError,
    TopologyHint,
    TopologyManagerError,
)
from .merge import (
    POLICY_BEST_EFFORT,
    POLICY_NONE,
    POLICY_RESTRICTED,
    POLICY_SINGLE_NUMA_NODE,
    HintMerger,
    filter_providers_hints,
    max_of_min_affinity_counts,
    merge_permutation,
)
from .numa_info import NUMAInfo
from .options import FeatureGates, PolicyOptionError, PolicyOptions, parse_policy_options
from .pod import Container, Pod, pod_effective_limits
from .policy_best_effort import BestEffortPolicy
from .policy_none import NonePolicy
from .policy_restricted import RestrictedPolicy
from .policy_single_numa_node import SingleNumaNodePolicy, filter_single_numa_hints
from .scope import SCOPE_CONTAINER, SCOPE_POD
from .topology_manager import POLICIES, SCOPES, TopologyManager

__all__ = [
    "POLICIES",
    "POLICY_BEST_EFFORT",
    "POLICY_NONE",
    "POLICY_RESTRICTED",
    "POLICY_SINGLE_NUMA_NODE",
    "SCOPES",
    "SCOPE_CONTAINER",
    "SCOPE_POD",
    "TOPOLOGY_AFFINITY_ERROR",
    "TOPOLOGY_AFFINITY_MESSAGE",
    "UNEXPECTED_ADMISSION_ERROR",
    "AdmissionError",
    "AllocationReport",
    "BestEffortPolicy",
    "BitMask",
    "BitMaskError",
    "Container",
    "DeviceAllocationError",
    "DeviceInfo",
    "DeviceManagerModel",
    "DevicesToAllocate",
    "ExplainResult",
    "FeatureGates",
    "HintMerger",
    "MergeReport",
    "NUMAInfo",
    "NonePolicy",
    "Pod",
    "PodAdmitResult",
    "PolicyOptionError",
    "PolicyOptions",
    "PreferredCall",
    "PreferredFn",
    "ResourceHints",
    "ResourceSpec",
    "RestrictedPolicy",
    "SingleNumaNodePolicy",
    "TopologyAffinityError",
    "TopologyHint",
    "TopologyManager",
    "TopologyManagerError",
    "device_has_topology_alignment",
    "devices_to_allocate",
    "explain",
    "filter_by_affinity",
    "filter_providers_hints",
    "filter_single_numa_hints",
    "generate_device_topology_hints",
    "iterate_bitmasks",
    "machine_numa",
    "max_of_min_affinity_counts",
    "merge_permutation",
    "min_affinity_size",
    "natural_sorted",
    "parse_policy_options",
    "pod_effective_limits",
    "resource_hints",
]
