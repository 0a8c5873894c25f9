"""GPU–NIC pairing of unchanged pods served through DRA's extended-resource mapping (KEP-5004).

A pod asking `nvidia.com/gpu: g` and `topo.dev/nic: g` with both names mapped to our DeviceClasses
gets one claim from kube-scheduler: one request per container and resource, no constraints
between them. The scheduler's structured allocator then fills each request first-fit: devices in
pool, slice and in-slice order (k8s.io/dynamic-resource-allocation structured allocator, 1.37:
`for pool / for slice / for device`, backtracking only when a constraint fails, and there is
none). So which NIC lands beside which GPU depends only on the order of devices in our slices and
on which devices are free.

This is a model of that allocator, not the scheduler itself (running kube-scheduler under churn
here costs minutes per thousand pods): the device order is what `build_resource_slices` publishes
for the node (our real code), first-fit per request over it, and pods come and go as in
pairing_bench.py (same churn, same "close" = PIX/PXB or the GPU's complex, same one-to-one
matching). Reported: the share of GPUs of pods that asked for NICs with a close NIC of their own.

Orders compared (GPUs by index in all):
- NICs by index: the order our slices had before (and any driver listing devices by number);
- NICs reversed: the same node numbered the other way round (a node whose NIC numbering runs
  against the GPUs' is common; this shows how much the alignment of the two orders carries);
- published: our slices as they are now (plugin/dra/slices/build.py pair_aligned_order: NICs in the
  order of the first GPU each is close to).

Workloads: "g GPUs + g NICs" (g = 1..4, every pod), and "mixed": a third of the pods ask for GPUs
only, which takes GPUs without their NICs and pulls the two free lists out of step.

A claim written with constraints (the chart's `two-gpu-nic-pairs`, `matchAttribute` on the PCIe
switch) always gets pairs or stays pending: that is the way to be sure; this is what the mapping
gives when workloads are not changed.

Second table (issue 35): the GPUs themselves. A pod asking `nvidia.com/gpu: g` (g = 1..4, churn
as above, GPUs only) gets the first g free GPUs in slice order; reported is the share of pods whose
set is our allocator's own answer for the same free GPUs (the numa-first policy the device plugin
serves: fewest NUMA nodes, then NVLink/PCIe score, then what stays free). A set that differs but
scores the same (span, score, left score) would count too; on these nodes none did. Orders: GPUs by index (before),
and as published now (`plugin.dra.slices.device_order.locality_order`). Nodes: every built-in, the real
`nvidia-smi topo -m` captures given with --captures, and the issue's workstation node
(tests/support/nodes/workstation-gpu0-numa1.yaml: GPU0 alone on NUMA node 1).

Usage: python benchmarks/dra_extended_pairing_bench.py [--pods N] [--seed N] [--captures DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

HERE = pathlib.Path(__file__).resolve().parent
for p in (HERE, HERE.parent):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from allocator.policies import get_policy
from allocator.request import AllocationRequest
from allocator.scoring import evaluate
from allocator.topology import DeviceGraph, DeviceKind, NodeTopology
from allocator_bench import table
from pairing_bench import close_pairs, is_close
from plugin.dra.slices.build import SliceOptions, build_resource_slices, device_name
from plugin.sources.simulated import builtin_names, load_simulated

WORKSTATION = HERE.parent / "tests" / "support" / "nodes" / "workstation-gpu0-numa1.yaml"
NODES = ("dgx-h100", "dgx-a100", "hgx-b200", "gb200-cx7", "gb300-cx8-dd", "pcie-2socket-4gpu-2nic")


def published_order(topology: NodeTopology) -> list[str]:
    """Device names (topology names) in the order our ResourceSlices list them."""
    by_slice_name = {device_name(d): d.name for d in topology.devices}
    slices = build_resource_slices(topology, SliceOptions(node_name="node"), node_uid="uid")
    return [by_slice_name[d["name"]] for s in slices for d in s["spec"]["devices"]]


def split(topology: NodeTopology, order: Sequence[str]) -> tuple[list[str], list[str]]:
    kind = {d.name: d.kind for d in topology.devices}
    return [n for n in order if kind[n] == DeviceKind.GPU], [n for n in order if kind[n] == DeviceKind.NIC]


def pair_aligned(topology: NodeTopology, gpus: list[str], nics: list[str]) -> list[str]:
    """NICs by the rank of the first GPU they are close to (NICs close to none go last): the
    benchmark's own statement of the order, checked against what the slices publish."""
    def rank(nic: str) -> tuple[int, int]:
        close = [i for i, g in enumerate(gpus) if is_close(topology, g, nic)]
        return (close[0] if close else len(gpus), nics.index(nic))
    return sorted(nics, key=rank)


@dataclass
class FirstFit:
    """The allocator's choice for a request without constraints: the first free devices in order."""

    order: list[str]

    def __post_init__(self) -> None:
        self.free = set(self.order)

    def take(self, count: int) -> list[str]:
        got = [n for n in self.order if n in self.free][:count]
        assert len(got) == count
        self.free -= set(got)
        return got

    def give(self, names: Sequence[str]) -> None:
        self.free |= set(names)


def run(topology: NodeTopology, gpus: list[str], nics: list[str], pods: int, seed: int,
        gpu_only_share: float) -> tuple[int, int]:
    """(GPUs of pods with NICs, of them with a close NIC of their own) over a churned pod sequence."""
    seq = random.Random(seed)
    g_alloc, n_alloc = FirstFit(gpus), FirstFit(nics)
    running: dict[str, tuple[list[str], list[str]]] = {}
    placed = close = 0
    cap = min(4, len(gpus), len(nics))

    def release(uid: str) -> None:
        got_g, got_n = running.pop(uid)
        g_alloc.give(got_g)
        n_alloc.give(got_n)

    for i in range(pods):
        g = seq.randint(1, cap)
        n = 0 if seq.random() < gpu_only_share else g
        churn(seq, list(running), release, lambda: len(g_alloc.free) >= g and len(n_alloc.free) >= n)
        got_g, got_n = g_alloc.take(g), n_alloc.take(n)
        running[f"pod{i}"] = (got_g, got_n)
        if n:
            placed += g
            close += close_pairs(topology, got_g, got_n)
    return placed, close


def churn(seq: random.Random, running: list[str], release: Callable[[str], None], fits: Callable[[], bool]) -> None:
    """pairing_bench's churn: each running pod leaves with probability 1/4, then random ones until the next fits."""
    for uid in list(running):
        if seq.random() < 0.25:
            running.remove(uid)
            release(uid)
    while not fits():
        release(running.pop(seq.randrange(len(running))))


def gpu_sets(topology: NodeTopology, order: list[str], pods: int, seed: int) -> tuple[int, int]:
    """(pods, whose first-fit set is the allocator's answer or as good) over a churned sequence."""
    graph = DeviceGraph.from_topology(topology, [topology.device(n) for n in order])
    policy = get_policy("numa-first")
    seq = random.Random(seed)
    alloc = FirstFit(order)
    running: dict[str, list[str]] = {}
    good = 0
    cap = min(4, len(order))

    def release(uid: str) -> None:
        alloc.give(running.pop(uid))

    for i in range(pods):
        g = seq.randint(1, cap)
        churn(seq, list(running), release, lambda: len(alloc.free) >= g)
        free = [n for n in order if n in alloc.free]
        best = policy.allocate(graph, AllocationRequest.of(free, [], g))
        got = alloc.take(g)
        running[f"pod{i}"] = got
        if set(got) == set(best.ids):
            good += 1
        else:  # another set of the same quality counts too
            mine, theirs = evaluate(graph, free, got), evaluate(graph, free, best.ids)
            good += (mine.span, mine.score, mine.left_score) == (theirs.span, theirs.score, theirs.left_score)
    return pods, good


def gpu_nodes(captures: pathlib.Path | None) -> list[tuple[str, str]]:
    """(label, source) of every node the GPU table covers."""
    nodes = [(n, n) for n in builtin_names()]
    if captures is not None and captures.is_dir():
        nodes += [(f"capture {p.name.split('-')[0]}: {p.stem.split('-', 1)[1][:34]}", str(p))
                  for p in sorted(captures.glob("*.txt"))]
    return nodes + [("workstation-gpu0-numa1 (issue 35)", str(WORKSTATION))]


def gpu_table(pods: int, seed: int, captures: pathlib.Path | None) -> None:
    print(f"\n## {pods} pods asking nvidia.com/gpu: 1..4 with churn, GPUs only; share of pods whose first-fit set"
          "\n## is the allocator's answer for the same free GPUs (the device plugin's answer)")
    rows = []
    for label, source in gpu_nodes(captures):
        topology = load_simulated(source)
        gpus, _ = split(topology, published_order(topology))
        if len(gpus) < 2:
            continue
        by_index = sorted(gpus, key=lambda n: (topology.device(n).index, n))
        row: list[object] = [label, len(gpus), "yes" if by_index == gpus else "no"]
        for order in (by_index, gpus):
            n, good = gpu_sets(topology, order, pods, seed)
            row.append(f"{100 * good / n:.1f} %")
        rows.append(row)
    print(table(["node", "GPUs", "published = index order", "GPUs by index (before)", "published (now)"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pods", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--captures", type=pathlib.Path, default=HERE.parent.parent / "shared" / "topologies",
                    help="a directory of nvidia-smi topo -m captures (*.txt) for the GPU table")
    ap.add_argument("--gpus-only", action="store_true", help="only the GPU table")
    args = ap.parse_args()
    if not args.gpus_only:
        pairing_table(args.pods, args.seed)
    gpu_table(args.pods, args.seed, args.captures)


def pairing_table(pods: int, seed: int) -> None:
    print(f"## {pods} pods with churn per node and order; share of GPUs (of pods that asked for NICs)"
          "\n## with a close NIC of their own; first-fit per request in slice order (the scheduler's allocator)")
    rows = []
    for node in NODES:
        topology = load_simulated(node)
        gpus, nics = split(topology, published_order(topology))
        by_index = sorted(nics, key=lambda n: (topology.device(n).index, n))
        assert pair_aligned(topology, gpus, by_index) == nics, "the published order is the pair-aligned one"
        orders = {"NICs by index": by_index, "NICs reversed": by_index[::-1], "published": nics}
        row: list[object] = [node, f"{len(gpus)}+{len(nics)}", "yes" if by_index == nics else "no"]
        for share in (0.0, 1 / 3):
            for order in orders.values():
                placed, close = run(topology, gpus, order, pods, seed, share)
                row.append(f"{100 * close / placed:.1f} %")
        rows.append(row)
    heads = [f"{w}: {o}" for w in ("g+g", "mixed") for o in ("NICs by index", "NICs reversed", "published")]
    print(table(["node", "GPUs+NICs", "index order aligned", *heads], rows))


if __name__ == "__main__":
    main()
