"""Allocator benchmark: latency and quality above the exact range (go-gpuallocator: gpuallocator_real_bench.py).

Printed tables, not pass/fail. Everything is in-process CPython on this
machine (no gRPC), so the numbers are the policy's own cost.

1. Latency (p50/p99, ms) of `numa-first` for n = 4..64 devices and several k
   on NVSwitch, cube-mesh (DGX-1 Volta tables, replicated above 8 GPUs),
   PCIe tree (PIX pairs under PXB under NODE per socket, SYS across) and
   random topologies, with random availability and must-include; plus a
   per-n summary for the other policies.
2. Quality above the exact range (n = 32, 64, default 20 ms budget): how often
   the answer is proven optimal, and how a much longer budget compares.

NVIDIA's go-gpuallocator on the same kind of requests is `gpuallocator_real_bench.py` (its real
Go code, built from its module), which imports this module's topologies and requests.

Usage: python benchmarks/allocator_bench.py [--quick] [--seed N]
A full run takes about 2-3 minutes on 2 cores; --quick under 30 s.
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from allocator.policies import SubsetTableCache, get_policy
from allocator.request import Allocation, AllocationRequest
from allocator.scoring import evaluate, objective_key
from allocator.topology import DeviceGraph, Link

# -- topologies ----------------------------------------------------------------
_VOLTA = {
    (0, 1): "NV1", (0, 2): "NV1", (0, 3): "NV2", (0, 4): "NV2", (1, 2): "NV2", (1, 3): "NV1",
    (1, 5): "NV2", (2, 3): "NV2", (2, 6): "NV1", (3, 7): "NV1", (4, 5): "NV1", (4, 6): "NV1",
    (4, 7): "NV2", (5, 6): "NV2", (5, 7): "NV1", (6, 7): "NV2",
}


#: One cache of subset tables for every policy here, as the daemon has (allocator.policies.subsets).
TABLES = SubsetTableCache()


def _graph(n: int, weight: Callable[[int, int], int], numa: Sequence[int | None]) -> DeviceGraph:
    w = [[0 if a == b else weight(min(a, b), max(a, b)) for b in range(n)] for a in range(n)]
    return DeviceGraph(ids=tuple(f"GPU{i}" for i in range(n)), numa=tuple(numa),
                       weights=tuple(tuple(r) for r in w))


def _tok(t: str) -> int:
    return Link.parse(t).weight


def nvswitch(n: int) -> DeviceGraph:
    """HGX: every pair NV18 through NVSwitch; two sockets."""
    half = max(1, n // 2)
    return _graph(n, lambda a, b: _tok("NV18"), [min(i // half, 1) for i in range(n)])


def cube_mesh(n: int) -> DeviceGraph:
    """DGX-1 Volta boxes side by side: cube-mesh NVLink inside each 8, PIX/PHB per socket half,
    NODE to another box on the same socket, SYS across sockets (two sockets in all)."""
    half = max(1, n // 2)

    def weight(a: int, b: int) -> int:
        if a // 8 == b // 8:
            la, lb = a % 8, b % 8
            if (la, lb) in _VOLTA:
                return _tok(_VOLTA[(la, lb)])
            if la // 4 == lb // 4:
                return _tok("PIX" if la // 2 == lb // 2 else "PHB")
        return _tok("NODE" if a // half == b // half else "SYS")

    return _graph(n, weight, [min(i // half, 1) for i in range(n)])


def pcie_tree(n: int) -> DeviceGraph:
    """PCIe servers: PIX pairs under PXB switches (4 GPUs) under NODE per socket, SYS across."""
    half = max(1, n // 2)

    def weight(a: int, b: int) -> int:
        if a // half != b // half:
            return _tok("SYS")
        if a // 2 == b // 2:
            return _tok("PIX")
        return _tok("PXB" if a // 4 == b // 4 else "NODE")

    return _graph(n, weight, [min(i // half, 1) for i in range(n)])


def random_topology(n: int, seed: int) -> DeviceGraph:
    """Random NUMA (10% unknown) and random spec weights, 30% of pairs NVLink: a stress case."""
    rng = random.Random(seed)
    numa = [None if rng.random() < 0.1 else rng.randrange(2) for _ in range(n)]
    table = {}
    for a in range(n):
        for b in range(a + 1, n):
            table[(a, b)] = (100 * rng.choice((1, 2, 4, 12)) if rng.random() < 0.3
                             else rng.choice((10, 20, 30, 40, 50)))
    return _graph(n, lambda a, b: table[(a, b)], numa)


FAMILIES: dict[str, Callable[[int, int], DeviceGraph]] = {
    "nvswitch": lambda n, s: nvswitch(n),
    "cube-mesh": lambda n, s: cube_mesh(n),
    "pcie-tree": lambda n, s: pcie_tree(n),
    "random": random_topology,
}


# -- requests -------------------------------------------------------------------
K_LABELS = ("1", "2", "n/4", "n/2", "3n/4")


def k_of(label: str, n: int) -> int:
    return {"1": 1, "2": 2, "n/4": max(1, n // 4), "n/2": max(1, n // 2), "3n/4": max(1, 3 * n // 4)}[label]


def random_request(rng: random.Random, g: DeviceGraph, k: int) -> AllocationRequest:
    """All devices available a third of the time, else a random subset; must-include a quarter."""
    n = len(g.ids)
    if rng.random() < 1 / 3 or k >= n:
        avail = list(range(n))
    else:
        avail = sorted(rng.sample(range(n), rng.randint(max(k + 1, n // 2), n)))
    must = rng.sample(avail, rng.randint(1, min(2, k))) if rng.random() < 0.25 else []
    rng.shuffle(avail)
    return AllocationRequest.of([g.ids[i] for i in avail], [g.ids[i] for i in must], k)


def pct(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[max(0, min(len(s) - 1, round(p / 100 * (len(s) - 1))))]


#: Each request is timed this many times and the fastest run kept (set by --repeats).
REPEATS = 3


def timed(policy: object, g: DeviceGraph, req: AllocationRequest) -> tuple[Allocation, float]:
    """(answer, ms). The policy is deterministic, so repeating a request and keeping the fastest
    run filters out pauses caused by other processes on a shared machine (not by the policy)."""
    best = float("inf")
    a = None
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        a = policy.allocate(g, req)
        best = min(best, (time.perf_counter() - t0) * 1e3)
    assert a is not None
    return a, best


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for j, r in enumerate(cells):
        out.append("  ".join(c.rjust(widths[i]) if i else c.ljust(widths[i]) for i, c in enumerate(r)))
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


# -- 1. latency -----------------------------------------------------------------
@dataclass
class Cell:
    times: list[float]
    proven: int = 0
    explored: int = 0

    def text(self) -> str:
        if not self.times:
            return "-"
        return f"{pct(self.times, 50):.2f}/{pct(self.times, 99):.2f}"


def latency(ns: Sequence[int], trials: int, seed: int) -> None:
    policy = get_policy("numa-first", tables=TABLES)
    print(f"\n## 1. numa-first latency, ms p50/p99 ({trials} random requests per cell; "
          f"exact up to 16, 20 ms budget above)\n")
    rows = []
    per_n: dict[int, list[float]] = {n: [] for n in ns}
    proven: dict[int, list[int]] = {n: [0, 0] for n in ns}
    for fam, build in FAMILIES.items():
        for label in K_LABELS:
            row: list[object] = [fam, f"k={label}"]
            for n in ns:
                k = k_of(label, n)
                g = build(n, seed)
                rng = random.Random(repr((seed, fam, label, n)))
                cell = Cell([])
                for _ in range(trials):
                    a, ms = timed(policy, g, random_request(rng, g, k))
                    cell.times.append(ms)
                    cell.proven += a.optimal
                per_n[n] += cell.times
                proven[n][0] += cell.proven
                proven[n][1] += trials
                row.append(cell.text() + ("" if cell.proven == trials else f" ({cell.proven}/{trials} opt)"))
            rows.append(row)
    rows.append(["all", "all k", *(Cell(per_n[n]).text() for n in ns)])
    rows.append(["all", "max ms", *(f"{max(per_n[n]):.2f}" for n in ns)])
    rows.append(["all", "proven optimal", *(f"{100 * proven[n][0] / proven[n][1]:.0f}%" for n in ns)])
    print(table(["topology", "k", *(f"n={n}" for n in ns)], rows))


def policy_summary(ns: Sequence[int], trials: int, seed: int) -> None:
    print(f"\n## 1b. every policy, ms p50/p99 over all topologies and k ({trials} requests per "
          "topology and k)\n")
    rows = []
    for name in ("numa-first", "link-first", "spread", "packed"):
        policy = get_policy(name, tables=TABLES)
        row: list[object] = [name]
        for n in ns:
            times: list[float] = []
            for fam, build in FAMILIES.items():
                g = build(n, seed + 1)
                rng = random.Random(repr((seed, name, fam, n)))
                for label in K_LABELS:
                    for _ in range(trials):
                        times.append(timed(policy, g, random_request(rng, g, k_of(label, n)))[1])
            row.append(Cell(times).text())
        rows.append(row)
    print(table(["policy", *(f"n={n}" for n in ns)], rows))


# -- 2. quality above the exact range ---------------------------------------------
def quality(ns: Sequence[int], trials: int, long_budget: float, seed: int) -> None:
    print(f"\n## 2. above the exact range: default 20 ms budget vs {long_budget * 1e3:.0f} ms "
          f"({trials} requests per topology and k; numa-first and link-first)\n")
    rows = []
    for name in ("numa-first", "link-first"):
        short = get_policy(name, tables=TABLES)
        long = get_policy(name, time_budget_s=long_budget, tables=TABLES)
        for n in ns:
            cases = proven = improved = long_proven = 0
            gaps: list[float] = []
            for fam, build in FAMILIES.items():
                g = build(n, seed + 2)
                rng = random.Random(repr((seed, name, fam, n, "q")))
                for label in ("2", "n/4", "n/2", "3n/4"):
                    for _ in range(trials):
                        req = random_request(rng, g, k_of(label, n))
                        a = short.allocate(g, req)
                        cases += 1
                        if a.optimal:
                            proven += 1
                            continue
                        b = long.allocate(g, req)
                        long_proven += b.optimal
                        ka = objective_key(name, evaluate(g, req.available, a.ids))
                        kb = objective_key(name, evaluate(g, req.available, b.ids))
                        if kb < ka:
                            improved += 1
                            gaps.append(100 * (b.score - a.score) / max(1, b.score))
            rows.append([
                name, n, cases, f"{100 * proven / cases:.0f}%", cases - proven, long_proven,
                improved, f"{statistics.mean(gaps):.2f}%" if gaps else "-",
                f"{max(gaps):.2f}%" if gaps else "-",
            ])
    print(table(["policy", "n", "requests", "proven in 20ms", "not proven", "proven w/ long",
                 "long run better", "mean W(S) gap", "max W(S) gap"], rows))
    print("\n(gap = how much larger W(S) the long run found, among requests where it found a better set)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (under 30 s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3,
                    help="time each request this many times, keep the fastest (1 = raw single runs)")
    args = ap.parse_args()
    global REPEATS
    REPEATS = max(1, args.repeats)
    gc.collect()
    started = time.perf_counter()
    print(f"# allocator benchmark ({'quick' if args.quick else 'full'}), Python {sys.version.split()[0]}, "
          f"each request timed {REPEATS}x, fastest kept")
    ns = (4, 8, 16, 32, 64)
    if args.quick:
        latency(ns, trials=8, seed=args.seed)
        policy_summary((8, 16, 32), trials=2, seed=args.seed)
        quality((32, 64), trials=1, long_budget=0.1, seed=args.seed)
    else:
        latency(ns, trials=50, seed=args.seed)
        policy_summary(ns, trials=6, seed=args.seed)
        quality((32, 64), trials=5, long_budget=1.0, seed=args.seed)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
