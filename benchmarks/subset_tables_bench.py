"""The table scan against the branch and bound it replaces on small resources (printed table, not pass/fail).

For requests of growing candidate count C(|free|, size) on a DGX-1 (8 GPUs, cube-mesh NVLink)
and on irregular 16-device nodes (random links and NUMA, as in tests/allocator), times one
`allocate` through the table scan (`allocator.policies.subsets`) and through the search (the
same policy with the scan switched off), interleaved, median of rounds; both give the same
answer (checked here too). Also the one-time cost of a 16-device graph's tables and one
order's keys, which the daemon pays where it builds the resource, never in an RPC.
This is how `TABLE_MAX_SETS` was chosen: about where the scan stops being the cheaper one.

Usage: python benchmarks/subset_tables_bench.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import math
import pathlib
import random
import statistics
import sys
import time
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "allocator"))

from alloc_testlib import random_graph, request

from allocator.policies import get_policy
from allocator.policies.subsets import TABLE_MAX_SETS, SubsetTables
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated


def searching(name: str):
    cls = type(get_policy(name))
    return dataclass(frozen=True)(type("Searching", (cls,), {"subset_order": None}))()


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def main(rounds: int) -> None:
    table, search = get_policy("numa-first"), searching("numa-first")
    dgx1 = build_resources(load_simulated("dgx-1-v100"), ResourceOptions(device_id_strategy="index"))[0].graph
    rng = random.Random(1)
    irregular = random_graph(rng, 16)
    cases = [("dgx-1-v100", dgx1, f, k) for f, k in ((8, 1), (8, 2), (8, 4), (6, 3))]
    cases += [("irregular 16", irregular, f, k) for f, k in ((8, 4), (10, 5), (16, 2), (16, 3), (12, 5), (16, 4))]
    print(f"{'node':<14}{'free':>5}{'size':>5}{'sets':>7}{'scan us':>10}{'search us':>11}{'ratio':>7}")
    for node, g, f, k in cases:
        req = request(g, range(f), [], k)
        assert table.allocate(g, req).ids == search.allocate(g, req).ids
        sets = math.comb(f, k)
        calls = max(3, 3000 // sets)
        a: list[float] = []
        b: list[float] = []
        for _ in range(rounds):
            a.append(per_call_us(lambda g=g, req=req: table.allocate(g, req), calls))
            b.append(per_call_us(lambda g=g, req=req: search.allocate(g, req), calls))
        scan = statistics.median(a) if sets <= TABLE_MAX_SETS else float("nan")
        print(f"{node:<14}{f:>5}{k:>5}{sets:>7}{scan:>10.0f}{statistics.median(b):>11.0f}"
              f"{statistics.median(b) / scan:>7.1f}" + ("" if sets <= TABLE_MAX_SETS else "  (above TABLE_MAX_SETS: searched)"))
    t0 = time.perf_counter()
    tables = SubsetTables.build(irregular)
    t1 = time.perf_counter()
    tables.keys("numa-first")
    t2 = time.perf_counter()
    print(f"16-device tables: {(t1 - t0) * 1e3:.0f} ms, keys of one order: {(t2 - t1) * 1e3:.0f} ms (once per topology)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    main(ap.parse_args().rounds)
