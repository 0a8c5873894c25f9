"""NVIDIA's go-gpuallocator, the real one, against our numa-first policy on the same requests.

Printed tables, not pass/fail. `benchmarks/gpuallocator_real/` is a small Go program built
against NVIDIA's `github.com/NVIDIA/go-gpuallocator` v0.6.0 (the best-effort policy NVIDIA's
device plugin calls for GetPreferredAllocation). What it is given:

- The built-in nodes people run (DGX H100, HGX B200, DGX A100, GB200): served through go-nvml's
  NVML mock answering what our NVML double (`topo_testkit.fake_nvml`) answers for the node: bus
  IDs, every NVLink's remote PCI address (the NVSwitch's on HGX/DGX, `FFFFFFFF:FF:FF.0` on a
  GB200 tray) and the PCIe common ancestor of each pair, so NVIDIA's own link discovery runs.
  Under an NVLink the simulated node records no PCIe level; a real board reports NODE for two
  GPUs of one socket and SYS across, and that is what the mock answers there.
- The random mix of `allocator_bench.py` (NVSwitch, cube-mesh, PCIe-tree and random topologies,
  4-12 GPUs): these are synthetic (a random GPU may have more NVLinks than NVML can report), so
  the policy gets the link table its discovery would record (`p2p`): the PCIe level of each pair
  (NODE/SYS by NUMA node under an NVLink) plus its NVLink count.
- Requests: `allocator_bench.random_request` (every k from 1 to n-1; a random free set two
  thirds of the time; one or two must-include devices a quarter of the time). NVIDIA's policy
  gets the free GPUs in index order (the device plugin passes the kubelet's list as it comes).

Columns: "optimal (ours)" is the share of requests whose answer is optimal by our objective
(NUMA span, then W(S), then W(A\\S); ours is proven optimal at these sizes); "optimal (NVIDIA)"
the share whose answer has the highest go-gpuallocator set score (the sum over pairs of 100 per
NVLink plus 10-60 by PCIe level, computed on the links NVIDIA's discovery recorded) among all
sets of that size holding the must-include devices, found by enumeration; "never worse" the
share where ours is at least as good as theirs by our objective; "invalid" an empty or padded
answer. Latency: each request timed 3 times and the fastest kept, both sides (Go in-process
around `Allocate`; ours in-process CPython).

Usage: python benchmarks/gpuallocator_real_bench.py [--quick] [--seed N]
Needs Go (and a C compiler: go-nvml uses cgo); about a minute on 2 cores, --quick about 15 s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import random
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests" / "support"))  # topo_testkit: test support, not in the wheel

from allocator_bench import FAMILIES, Cell, random_request, table, timed
from topo_testkit.fake_nvml import FakeNvml, nvml_bus_id

from allocator.policies import get_policy
from allocator.request import AllocationRequest
from allocator.scoring import evaluate, objective_key
from allocator.topology import DeviceGraph, LinkLevel
from plugin.sources.simulated import load_simulated

BUILTINS = ("dgx-h100", "hgx-b200", "dgx-a100", "gb200-cx7")
#: NVML_TOPOLOGY_* for our PCIe levels (what nvmlDeviceGetTopologyCommonAncestor answers).
NVML_LEVEL = {LinkLevel.PIX: 10, LinkLevel.PXB: 20, LinkLevel.PHB: 30, LinkLevel.NODE: 40, LinkLevel.SYS: 50}
#: go-gpuallocator's P2PLinkType for our PCIe levels (P2PLinkCrossCPU=1 ... P2PLinkSingleSwitch=5).
P2P_LEVEL = {LinkLevel.SYS: 1, LinkLevel.NODE: 2, LinkLevel.PHB: 3, LinkLevel.PXB: 4, LinkLevel.PIX: 5}
#: P2PLinkType of n NVLinks is 6 + n (SingleNVLINKLink=7 ... EighteenNVLINKLinks=24).
P2P_NVLINK_BASE = 6
REPEATS = 3


def build_driver() -> str:
    """The go-gpuallocator driver's binary (built once, cached); raises with the build's output."""
    proc = subprocess.run(["bash", str(ROOT / "gpuallocator_real" / "build.sh")], capture_output=True, text=True,
                          timeout=1800, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"cannot build benchmarks/gpuallocator_real (exit {proc.returncode}): "
                           f"{proc.stderr.strip()[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def run_driver(binary: str, nodes: list[dict[str, Any]], requests: list[dict[str, Any]],
               repeats: int = REPEATS) -> dict[str, Any]:
    """Run NVIDIA's policy on `requests` over `nodes` (the driver's JSON input; see its main.go)."""
    proc = subprocess.run([binary], input=json.dumps({"repeats": repeats, "nodes": nodes, "requests": requests}),
                          capture_output=True, text=True, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"gpuallocator-real failed (exit {proc.returncode}): {proc.stderr.strip()}")
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


def pair_points(link_type: int) -> int:
    """go-gpuallocator's score of one link of a pair (its besteffort_policy.go pair score, restated)."""
    if link_type > P2P_NVLINK_BASE:
        return 100 * (link_type - P2P_NVLINK_BASE)
    return {1: 10, 2: 20, 3: 30, 4: 40, 5: 50, 6: 60}.get(link_type, 0)


def nvidia_set_score(links: Sequence[Sequence[Sequence[int]]], members: Sequence[int]) -> int:
    return sum(pair_points(t) for a, b in itertools.combinations(members, 2) for t in links[a][b])


def nvidia_best(links: Sequence[Sequence[Sequence[int]]], available: Sequence[int], required: Sequence[int],
                size: int) -> int:
    """The highest go-gpuallocator set score of any `size` free GPUs holding the required ones."""
    rest = [i for i in available if i not in required]
    return max(nvidia_set_score(links, [*required, *c]) for c in itertools.combinations(rest, size - len(required)))


# -- what NVIDIA is given ---------------------------------------------------------------------------
def _pcie_under_nvlink(numa_a: int | None, numa_b: int | None) -> LinkLevel:
    return LinkLevel.NODE if numa_a is not None and numa_a == numa_b else LinkLevel.SYS


def builtin_node(name: str) -> tuple[dict[str, Any], DeviceGraph]:
    """A built-in node as NVML shows it (through our NVML double), and our graph of its GPUs."""
    sim = load_simulated(name)
    gpus_only = sim.without(d.name for d in sim.devices if d not in sim.gpus)
    fake = FakeNvml(gpus_only)
    graph = DeviceGraph.from_topology(gpus_only, [g.device for g in fake.gpus])
    gpus, ancestor = [], []
    for a in fake.gpus:
        ends = [bus if bus.startswith("FFFFFFFF") else nvml_bus_id(bus) for _, (bus, _) in sorted(a.links.items())]
        gpus.append({"bus_id": nvml_bus_id(a.bdf), "nvlinks": ends})
        row = []
        for b in fake.gpus:
            if a is b:
                row.append(0)
                continue
            link = gpus_only.link(a.device.name, b.device.name)
            level = _pcie_under_nvlink(a.device.numa, b.device.numa) if link.nvlinks else link.level
            row.append(NVML_LEVEL[level])
        ancestor.append(row)
    return {"name": name, "gpus": gpus, "ancestor": ancestor}, graph


def _level_of_weight(w: int) -> LinkLevel:
    return LinkLevel(w)


def table_node(name: str, g: DeviceGraph) -> dict[str, Any]:
    """A synthetic graph as the link table go-gpuallocator's discovery would record."""
    n = len(g.ids)
    p2p: list[list[list[int]]] = [[[] for _ in range(n)] for _ in range(n)]
    for a, b in itertools.permutations(range(n), 2):
        w = g.weights[a][b]
        if w >= 100:
            p2p[a][b] = [P2P_LEVEL[_pcie_under_nvlink(g.numa[a], g.numa[b])], P2P_NVLINK_BASE + w // 100]
        else:
            p2p[a][b] = [P2P_LEVEL[_level_of_weight(w)]]
    return {"name": name, "gpus": [], "ancestor": [], "p2p": p2p}


# -- the comparison ----------------------------------------------------------------------------------
@dataclass
class Row:
    label: str
    requests: int = 0
    theirs_opt_ours: int = 0
    ours_opt_ours: int = 0
    theirs_opt_nvidia: int = 0
    ours_opt_nvidia: int = 0
    never_worse: int = 0
    invalid: int = 0
    #: Worse by our objective, by its first criterion that differs (NUMA span, W(S), W(A\S)).
    worse_by: list[int] = field(default_factory=lambda: [0, 0, 0])
    theirs_ms: list[float] = field(default_factory=list)
    ours_ms: list[float] = field(default_factory=list)

    def add(self, other: Row) -> None:
        for name in ("requests", "theirs_opt_ours", "ours_opt_ours", "theirs_opt_nvidia", "ours_opt_nvidia",
                     "never_worse", "invalid"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.worse_by = [a + b for a, b in zip(self.worse_by, other.worse_by, strict=True)]
        self.theirs_ms += other.theirs_ms
        self.ours_ms += other.ours_ms

    def cells(self) -> list[object]:
        def share(x: int) -> str:
            return f"{100 * x / self.requests:.0f} %" if self.requests else "-"
        return [self.label, self.requests, share(self.theirs_opt_ours), share(self.ours_opt_ours),
                share(self.theirs_opt_nvidia), share(self.ours_opt_nvidia), share(self.never_worse),
                self.invalid, Cell(self.theirs_ms).text(), Cell(self.ours_ms).text()]


HEADERS = ["node", "requests", "go-gpuallocator optimal (ours)", "numa-first optimal (ours)",
           "go-gpuallocator optimal (NVIDIA)", "numa-first optimal (NVIDIA)", "numa-first never worse",
           "go-gpuallocator invalid", "go-gpuallocator ms p50/p99", "numa-first ms p50/p99"]


@dataclass
class Case:
    node: int
    graph: DeviceGraph
    request: AllocationRequest


def cases_for(node: int, g: DeviceGraph, rng: random.Random, trials: int) -> list[Case]:
    n = len(g.ids)
    return [Case(node, g, random_request(rng, g, k)) for k in range(1, n) for _ in range(trials)]


def compare(binary: str, groups: list[tuple[str, dict[str, Any], DeviceGraph, list[Case]]]) -> list[Row]:
    """Run every group's cases through both policies; one Row per group."""
    nodes = [spec for _, spec, _, _ in groups]
    requests: list[dict[str, Any]] = []
    for _, _, g, cases in groups:
        pos = g.index_of()
        for c in cases:
            requests.append({"node": c.node, "available": sorted(pos[i] for i in c.request.available),
                             "required": sorted(pos[i] for i in c.request.must_include), "size": c.request.size})
    out = run_driver(binary, nodes, requests)
    policy = get_policy("numa-first")
    rows, at = [], 0
    for k, (label, _, g, cases) in enumerate(groups):
        links = out["nodes"][k]["links"]
        row = Row(label)
        for c in cases:
            req, answer = requests[at], out["answers"][at]
            at += 1
            ours, ms = timed(policy, g, c.request)
            assert ours.optimal, "numa-first is exact at these sizes"
            row.requests += 1
            row.ours_ms.append(ms)
            row.theirs_ms.append(answer["ns"] / 1e6)
            pos = g.index_of()
            ours_idx = [pos[i] for i in ours.ids]
            best_nv = nvidia_best(links, req["available"], req["required"], req["size"])
            row.ours_opt_ours += 1
            row.ours_opt_nvidia += nvidia_set_score(links, ours_idx) == best_nv
            chosen = answer["chosen"]
            if len(chosen) != req["size"] or -1 in chosen:
                row.invalid += 1
                row.never_worse += 1
                continue
            ko = objective_key("numa-first", evaluate(g, c.request.available, ours.ids))
            kt = objective_key("numa-first", evaluate(g, c.request.available, [g.ids[i] for i in chosen]))
            row.theirs_opt_ours += kt == ko
            row.never_worse += ko <= kt
            if kt > ko:
                row.worse_by[next(i for i in range(3) if kt[i] != ko[i])] += 1
            row.theirs_opt_nvidia += nvidia_set_score(links, chosen) == best_nv
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (about 15 s)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    started = time.perf_counter()
    binary = build_driver()
    trials = 2 if args.quick else 10
    groups: list[tuple[str, dict[str, Any], DeviceGraph, list[Case]]] = []
    for name in BUILTINS:
        spec, g = builtin_node(name)
        groups.append((name, spec, g, cases_for(len(groups), g, random.Random(repr((args.seed, name))), trials)))
    mix_start = len(groups)
    for n in (4, 6, 8, 10, 12):
        for fam, build in FAMILIES.items():
            g = build(n, args.seed + 3)
            label = f"{fam} n={n}"
            groups.append((label, table_node(label, g), g,
                           cases_for(len(groups), g, random.Random(repr((args.seed, fam, n, "real"))),
                                     1 if args.quick else 5)))
    rows = compare(binary, groups)
    builtin_rows, mix = rows[:mix_start], rows[mix_start:]
    by_n: dict[str, Row] = {}
    for r in mix:
        size = r.label.split("n=")[1]
        by_n.setdefault(size, Row(f"random mix, {size} GPUs")).add(r)
    total = Row("all")
    for r in rows:
        total.add(r)
    print(f"# NVIDIA go-gpuallocator v0.6.0 (best-effort, real Go code) vs numa-first, seed {args.seed}"
          f"{' (quick)' if args.quick else ''}\n")
    print(table(HEADERS, [r.cells() for r in [*builtin_rows, *by_n.values(), total]]))
    print("\n(optimal (ours): as good as the proven optimum of NUMA span, then W(S), then W(A\\S); optimal (NVIDIA):"
          " the highest go-gpuallocator set score,\n 100 per NVLink plus 10-60 by PCIe level, on the links NVIDIA's"
          " discovery recorded; never worse: ours at least as good as theirs by our objective)")
    for label, part in (("built-in nodes", builtin_rows), ("random mix", mix), ("all", rows)):
        n = sum(r.requests for r in part)
        worse = sum(r.requests - r.theirs_opt_ours - r.invalid for r in part)
        invalid = sum(r.invalid for r in part)
        span, w, left = (sum(r.worse_by[i] for r in part) for i in range(3))
        print(f"{label}: go-gpuallocator's set worse by our objective for {worse} of {n} requests "
              f"({100 * worse / n:.0f} %: {span} by NUMA span, {w} by W(S), {left} by W(A\\S)), invalid for {invalid}")
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
