"""Topology-aware allocation: the node model, preferred-allocation policies, and a
model of the kubelet Topology Manager. Pure Python, no I/O, no gRPC."""

from .request import Allocation, AllocationError, AllocationRequest, Policy
from .topology import (
    HEALTHY,
    UNHEALTHY,
    Device,
    DeviceGraph,
    DeviceKind,
    Link,
    LinkLevel,
    NodeTopology,
)
from .policies import POLICY_NAMES, get_policy

__all__ = [
    "HEALTHY",
    "UNHEALTHY",
    "Allocation",
    "AllocationError",
    "AllocationRequest",
    "Device",
    "DeviceGraph",
    "DeviceKind",
    "Link",
    "LinkLevel",
    "NodeTopology",
    "Policy",
    "POLICY_NAMES",
    "get_policy",
]
