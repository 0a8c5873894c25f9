"""How one GetPreferredAllocation RPC is answered: bounded, off the event loop, under a deadline.

Why a module of its own: the server only moves messages; the rules that keep
a request from freezing or bloating the daemon live here, next to each other.

- Absurd requests are refused before any work proportional to their size:
  more container requests than the resource has devices (the kubelet sends
  one per call), more IDs than devices, IDs longer than any advertised ID.
- Validation and every search run on the `SearchPool`'s threads, one
  container request at a time, so the loop stays free and a second request
  is not queued behind all of a big one.
- A whole-request deadline, `DEFAULT_DEADLINE_S`. The kubelet puts no
  deadline on GetPreferredAllocation (or Allocate): it calls them with a
  background context inside pod admission, which it does one pod at a time,
  so a slow answer holds up every admission on the node, with nothing to end
  it (research/kubelet-device-manager.md §2.8). The only deadlines the
  kubelet does set on calls to a plugin are 10 s (the blocking dial inside
  Register) and 30 s (PreStartContainer); our answer must come well inside
  the smallest of them, and an error is worse than a modest answer (an RPC
  error fails the pod's admission, a valid preference is simply used). So
  the deadline never fails a request: container requests that start after it
  get the quick greedy answer (valid, reported as not proven optimal; one
  greedy pass costs about 10 ms for 64 candidates, and there are at most as
  many container requests as devices). 1 s is 50 times the spec's 20 ms
  search budget and a tenth of the kubelet's dial timeout. The first
  container request always gets its full configured budget, so a request of
  one container (all the kubelet ever sends) is answered exactly as the spec
  says; a client deadline shorter than ours is respected.
"""

from __future__ import annotations

import dataclasses
import time

from allocator import Allocation, AllocationError, AllocationRequest, Policy
from allocator.pairing import NO_PARTNERS, Partners
from allocator.request import check_list_sizes
from allocator.topology import DeviceGraph

from ..api import api_pb2

DEFAULT_DEADLINE_S = 1.0
#: The budget of a search that starts after the deadline: the greedy answer and nothing more.
_NO_TIME_S = 1e-6


def check_shape(request: api_pb2.PreferredAllocationRequest, devices: int) -> None:
    """O(number of container requests) checks, safe on the event loop; raise AllocationError."""
    n = len(request.container_requests)
    if n == 0:
        raise AllocationError("request has no container_requests")
    if n > max(1, devices):
        raise AllocationError(
            f"{n} container_requests, more than the {devices} devices of this resource "
            "(the kubelet asks for one container per call)"
        )
    for i, creq in enumerate(request.container_requests):
        try:
            check_list_sizes(devices, len(creq.available_deviceIDs), len(creq.must_include_deviceIDs))
        except AllocationError as e:
            raise AllocationError(f"container_requests[{i}]: {e}") from None


def validate_all(graph: DeviceGraph, request: api_pb2.PreferredAllocationRequest,
                 partners: Partners = NO_PARTNERS) -> list[AllocationRequest]:
    """Every container request as an `AllocationRequest` with the call's `partners`, validated
    (runs on a worker thread)."""
    out = []
    for i, creq in enumerate(request.container_requests):
        req = AllocationRequest.of(creq.available_deviceIDs, creq.must_include_deviceIDs, creq.allocation_size,
                                   partners)
        try:
            req.validate(graph)
        except AllocationError as e:
            raise AllocationError(f"container_requests[{i}]: {e}") from None
        out.append(req)
    return out


def search(policy: Policy, graph: DeviceGraph, request: AllocationRequest, deadline: float | None) -> Allocation:
    """One search (runs on a worker thread); `deadline` (time.monotonic) caps its budget when given."""
    if deadline is not None:
        policy = within(policy, deadline - time.monotonic())
    return policy.allocate(graph, request)


def within(policy: Policy, remaining_s: float) -> Policy:
    """`policy` with its time budget cut to `remaining_s` (greedy only when no time is left).

    Only policies that expose `time_budget_s`/`exact_limit` as dataclass fields (every
    `SearchPolicy`) can be cut; any other policy is returned unchanged.
    """
    names = {f.name for f in dataclasses.fields(policy)} if dataclasses.is_dataclass(policy) else set()
    if not {"time_budget_s", "exact_limit"} <= names:
        return policy
    if remaining_s <= 0:
        return dataclasses.replace(policy, time_budget_s=_NO_TIME_S, exact_limit=0)
    budget = policy.time_budget_s  # type: ignore[attr-defined]
    if budget is None or budget > remaining_s:
        return dataclasses.replace(policy, time_budget_s=remaining_s)
    return policy
