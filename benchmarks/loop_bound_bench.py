"""The search time under the event-loop bound of GetPreferredAllocation (printed table, not pass/fail).

`plugin.allocation.preferred.on_loop` answers a request on the event loop when its resource has at most
`LOOP_MAX_DEVICES` devices and it has at most `LOOP_MAX_SETS` candidate sets (C(|available| -
|must|, size - |must|)). The rule is safe only if every such search ends well inside CPython's
switch interval (5 ms), since a search on a worker thread would hold the loop off that long
anyway. This measures the worst case it can meet, in process (the policy's own cost):

- irregular nodes of 16 and 64 GPUs on one NUMA node (tests/daemon/daemon_testlib.hard_node_yaml:
  no symmetry for the search to collapse), every availability size up to 16 and every k, random
  availability, numa-first and link-first;
- the DGX-2 (16 GPUs, 8 NICs) with partners (k GPUs or NICs, k NICs or GPUs as partners).

Each request is timed 3 times and its fastest kept (other processes' pauses filtered out); the
table shows the slowest request per bucket of candidate sets, those above the bound marked.

Usage: python benchmarks/loop_bound_bench.py [--seeds 3]
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import random
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "daemon"))

from daemon_testlib import hard_node_yaml

from allocator.pairing import PairingIndex
from allocator.policies import get_policy
from allocator.request import AllocationRequest
from plugin.allocation.preferred import LOOP_MAX_SETS, candidate_sets
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated


def fastest(policy, graph, request: AllocationRequest, tries: int = 3) -> float:
    best = float("inf")
    for _ in range(tries):
        t0 = time.perf_counter()
        policy.allocate(graph, request)
        best = min(best, time.perf_counter() - t0)
    return best


def bucket(sets: int) -> int:
    b = 1
    while b < sets:
        b *= 2
    return b


def main(seeds: int) -> None:
    rng = random.Random(1)
    worst: dict[tuple[str, int], float] = collections.defaultdict(float)
    for gpus in (16, 64):
        for seed in range(seeds):
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(hard_node_yaml(gpus, seed))
            try:
                resource = build_resources(load_simulated(f.name), ResourceOptions(device_id_strategy="index"))[0]
            finally:
                os.unlink(f.name)
            ids = [d.id for d in resource.devices]
            for name in ("numa-first", "link-first"):
                policy = get_policy(name)
                for a in range(2, 17):
                    for k in range(1, a):
                        req = AllocationRequest.of(rng.sample(ids, a), [], k)
                        key = (f"irregular {gpus} GPUs", bucket(candidate_sets(a, 0, k)))
                        worst[key] = max(worst[key], fastest(policy, resource.graph, req))
    topology = load_simulated("dgx-2-v100")
    resources = build_resources(topology, ResourceOptions(device_id_strategy="index"))
    index = PairingIndex.build(topology, {r.name: r.devices for r in resources})
    for r in resources:
        other = next(o for o in resources if o is not r)
        policy = get_policy(r.policy)
        ids, others = [d.id for d in r.devices], [d.id for d in other.devices]
        for _ in range(200 * seeds):
            k = rng.randint(1, 4)
            a = rng.randint(k, len(ids))
            partners = index.partners(r.name, {other.name: rng.sample(others, min(k, len(others)))})
            req = AllocationRequest.of(rng.sample(ids, a), [], k, partners)
            key = ("dgx-2-v100 with partners", bucket(candidate_sets(a, 0, k)))
            worst[key] = max(worst[key], fastest(policy, r.graph, req))
    print(f"\nSlowest search per bucket of candidate sets (ms, fastest of 3); loop bound {LOOP_MAX_SETS} sets; "
          f"load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}\n")
    print(f"{'instances':<26}  {'candidate sets':>16}  {'slowest':>8}")
    for (what, b), s in sorted(worst.items()):
        mark = "" if b <= LOOP_MAX_SETS else "  (above the bound: pool)"
        print(f"{what:<26}  {'<= ' + str(b):>16}  {s * 1000:8.2f}{mark}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="irregular nodes per size (and DGX-2 rounds / 200)")
    main(ap.parse_args().seeds)
