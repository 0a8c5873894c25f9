"""How one GetPreferredAllocation RPC is answered: bounded, off the event loop, under a deadline.

Why a module of its own: the server only moves messages; the rules that keep
a request from freezing or bloating the daemon live here, next to each other,
and so does their order (`answer`: shape, partners, the loop or the pool, the
deadline).

- Absurd requests are refused before any work proportional to their size:
  more container requests than the resource has devices (the kubelet sends
  one per call), more IDs than devices, IDs longer than any advertised ID.
- A request whose searches are provably cheap is answered on the event
  loop (`on_loop`): at most `LOOP_MAX_DEVICES` devices in the resource and at
  most `LOOP_MAX_SETS` candidate sets C(|available| - |must|, size - |must|)
  summed over its container requests (forced answers count one). Why that
  is safe: the search holds the GIL, so a search on a worker thread keeps the
  loop waiting for up to the interpreter's switch interval (5 ms) anyway; one
  that is certain to end well inside it delays other RPCs no more on the loop
  than on a thread, and it saves the two thread hand-offs that cost about
  0.5 ms, as much as the whole empty RPC (measured with
  `benchmarks/loop_bound_bench.py`: the slowest search under these bounds, on
  irregular 16- and 64-GPU nodes built so that no symmetry helps, took about
  2 ms on a loaded 2-core machine, and with partners on a DGX-2 about 3 ms).
- Every other request is validated and searched on the `SearchPool`'s
  threads, one container request at a time (validation in the same job as
  the first search), so the loop stays free and a second request is not
  queued behind all of a big one.
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

import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from allocator import Allocation, AllocationError, AllocationRequest, Policy
from allocator.pairing import NO_PARTNERS, Partners
from allocator.request import check_list_sizes
from allocator.topology import DeviceGraph

from ..api import api_pb2
from .search_pool import SearchPool

DEFAULT_DEADLINE_S = 1.0
#: Largest resource (devices) whose requests may be answered on the event loop: validation and
#: the search's set-up are linear in the resource's devices, so a large one goes to the pool whatever it asks.
LOOP_MAX_DEVICES = 64
#: Most candidate sets (summed over a call's container requests) answered on the event loop (module doc).
LOOP_MAX_SETS = 2048


def candidate_sets(available: int, must: int, size: int) -> int:
    """How many sets a search may choose from: C(available - must, size - must); 1 when the answer is forced
    (everything, or only the must-include) or the request is invalid (validation, linear, refuses it)."""
    free, picks = available - must, size - must
    if picks <= 0 or free <= picks:
        return 1
    return math.comb(free, picks)


def on_loop(request: api_pb2.PreferredAllocationRequest, devices: int) -> bool:
    """True when every search of `request` (already through `check_shape`) is provably cheap (module doc)."""
    if devices > LOOP_MAX_DEVICES:
        return False
    total = 0
    for creq in request.container_requests:
        total += candidate_sets(len(creq.available_deviceIDs), len(creq.must_include_deviceIDs),
                                creq.allocation_size)
        if total > LOOP_MAX_SETS:
            return False
    return True


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


def answer_here(policy: Policy, graph: DeviceGraph, request: api_pb2.PreferredAllocationRequest,
                partners: Partners) -> list[Allocation]:
    """Every container request answered in this thread (the event loop: only under `on_loop`).

    One container request (all the kubelet sends) is validated once, by the policy itself, which
    runs the very checks `validate_all` runs; several are all validated before the first search,
    as on the pool, so a bad one refuses the call before any work.
    """
    if len(request.container_requests) == 1:
        creq = request.container_requests[0]
        req = AllocationRequest.of(creq.available_deviceIDs, creq.must_include_deviceIDs, creq.allocation_size,
                                   partners)
        try:
            return [policy.allocate(graph, req)]
        except AllocationError as e:
            raise AllocationError(f"container_requests[0]: {e}") from None
    return [policy.allocate(graph, req) for req in validate_all(graph, request, partners)]


def validate_and_search_first(policy: Policy, graph: DeviceGraph, request: api_pb2.PreferredAllocationRequest,
                              partners: Partners) -> tuple[list[AllocationRequest], Allocation]:
    """Every container request validated, and the first one answered with the policy's full budget:
    one job on a worker thread, so a request of one container (all the kubelet sends) costs one hand-off."""
    requests = validate_all(graph, request, partners)
    return requests, policy.allocate(graph, requests[0])


def search(policy: Policy, graph: DeviceGraph, request: AllocationRequest, deadline: float | None) -> Allocation:
    """One search (runs on a worker thread); `deadline` (time.monotonic) caps its budget when given."""
    if deadline is not None:
        policy = policy.within(deadline - time.monotonic())  # the policy declares its budget (Policy)
    return policy.allocate(graph, request)


@dataclass
class Answer:
    """The allocations of one GetPreferredAllocation, one per container request, and how they were found."""

    results: list[Allocation]
    #: Seconds each result took (on the loop: the call's time shared out evenly).
    seconds: list[float]
    #: "loop" (answered on the event loop, `on_loop`) or "pool" (on the search pool's threads).
    where: str


async def answer(policy: Policy, graph: DeviceGraph, request: api_pb2.PreferredAllocationRequest, devices: int,
                 partners: Callable[[], Awaitable[Partners]], pool: SearchPool, deadline_s: float,
                 client_left_s: Callable[[], float | None]) -> Answer:
    """One GetPreferredAllocation, in order: the shape checks, the call's partners (asked for at arrival:
    the call may end the current group, docs/pairing.md), then every container request on the loop when
    provably cheap, else on `pool` under the whole-request deadline (`deadline_s`, or what the client's
    own deadline leaves when that is shorter: `client_left_s()`, read once the partners are known).
    Raises AllocationError for a bad request."""
    started = time.perf_counter()
    check_shape(request, devices)
    found = await partners()
    if on_loop(request, devices):
        results = answer_here(policy, graph, request, found)
        share = (time.perf_counter() - started) / len(results)
        return Answer(results, [share] * len(results), "loop")
    # The deadline counts from arrival: time spent waiting for a worker is part of it.
    client_left = client_left_s()
    budget = deadline_s if client_left is None else min(deadline_s, client_left)
    deadline = time.monotonic() + budget
    requests, first = await pool.run(validate_and_search_first, policy, graph, request, found)
    results = [first]
    seconds = [time.perf_counter() - started]
    for req in requests[1:]:
        started = time.perf_counter()
        # Later container requests share what is left of the whole-request deadline (module doc).
        results.append(await pool.run(search, policy, graph, req, deadline))
        seconds.append(time.perf_counter() - started)
    return Answer(results, seconds, "pool")
