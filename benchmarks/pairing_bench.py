"""GPU–NIC pairing benchmark: allocator latency with and without partners, and how often
a container's GPUs get a close NIC of their own (PIX/PXB, or the NIC of the GPU's complex),
with pairing and without.

Printed tables, not pass/fail. In-process CPython, no gRPC: the numbers are
the allocator's own cost (the issue's "p99 within 1.2x over gRPC" is measured
once the servers are wired).

1. Latency (ms, p50/p99) of GetPreferredAllocation at the allocator on
   dgx-h100 (8 GPUs, one PIX NIC each), dgx-a100 (8 GPUs, NICs PXB to GPU
   pairs) and dgx-2-v100 (16 GPUs, 8 NICs): random requests as the kubelet
   sends them (random free set, k = 1..8, sometimes must-include), each
   timed without partners and with partners (k devices of the other
   resource, as a container's earlier Allocate gives them).
2. Simulation: random pod sequences with churn (pods come and go), each pod
   one container asking g GPUs and g NICs (g = 1..4); the kubelet's device
   manager is modelled (`KubeletNode`: per container, resources in random
   order, `devicesToAllocate` with random fill order, Topology Manager policy
   `none`), calling the allocator through the call-sequence tracker
   (`plugin.allocation.pairing_groups`) and `PairingIndex`. Nodes: the three above and
   the platforms of docs/platforms.md (hgx-b200; gb200-cx7 and gb300-cx8-dd,
   where the PCIe path says NODE and only the GPU–NIC complex names a GPU's
   NIC). Reported: the share of GPUs whose container has a close NIC for it
   (one NIC per GPU; close = PIX/PXB path or the GPU's own complex), with the
   pairing window at 1 s and at 0 (off), and the latency of the
   GetPreferredAllocation calls of each run.
3. The hard end of the exact range: generated nodes with 16 GPUs and 16 NICs
   (PCIe trees, 1-3 NUMA nodes, VFs sharing ports, random NVLinks, the
   generator of the property tests), all 16 devices available, k = 2..8,
   1-12 random partners: p50/p99/max per policy, without and with partners.

Every request is timed 3 times and the fastest run kept (the policy is
deterministic; this filters out pauses caused by other processes).

Usage: python benchmarks/pairing_bench.py [--quick] [--seed N]
A full run takes a few minutes on 2 cores; --quick under a minute.
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import random
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from allocator.pairing import Matching, PairingIndex
from allocator.policies import SubsetTableCache, get_policy
from allocator.request import Allocation, AllocationRequest, Policy
from allocator.topology import DeviceKind, LinkLevel, NodeTopology
from allocator.topologymanager.device_hints import DeviceInfo
from allocator.topologymanager.devices_to_allocate import devices_to_allocate
from allocator.topologymanager.hint import TopologyHint
from allocator_bench import pct, table, timed
from plugin.allocation.pairing_groups import PairingGroups
from plugin.model.resources import Resource, ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated

NODES = ("dgx-h100", "dgx-a100", "dgx-2-v100")
#: The pairing simulation also runs on the platforms of docs/platforms.md.
SIM_NODES = (*NODES, "hgx-b200", "gb200-cx7", "gb300-cx8-dd")
#: Topology Manager policy `none`: no NUMA affinity is stored for a container.
NO_AFFINITY = TopologyHint(None, True)


#: One cache of subset tables for the resources and policies here, as the daemon has (allocator.policies.subsets).
TABLES = SubsetTableCache()


# -- the kubelet side -------------------------------------------------------------
@dataclass(frozen=True)
class Container:
    name: str
    #: resource -> number of devices (limits = requests for extended resources).
    requests: Mapping[str, int]
    #: A non-restartable init container: its devices are reused by the later containers of the pod.
    init: bool = False


@dataclass(frozen=True)
class PreferredCall:
    """One GetPreferredAllocation as the allocator saw it (and, for tests, whose it really was)."""

    resource: str
    partners: Mapping[str, tuple[str, ...]]
    answer: Allocation
    ms: float
    pod: str
    container: str
    #: What the container really held from other resources when the call came.
    held: Mapping[str, tuple[str, ...]]


@dataclass
class KubeletNode:
    """One node's device manager driving our allocator in-process, as the kubelet drives the plugin.

    Per pod, containers in order (init containers first); per container its
    resources in random order (Go map order); per resource the project's model
    of `devicesToAllocate` (reuse first, then GetPreferredAllocation when
    there is a choice, then random fill), then `Allocate`. The tracker sees
    exactly the calls the plugin would get.
    """

    topology: NodeTopology
    window_s: float
    rng: random.Random
    policies: Mapping[str, str] = field(default_factory=dict)
    now: float = 0.0

    def __post_init__(self) -> None:
        rs = build_resources(self.topology, ResourceOptions(device_id_strategy="index"), TABLES)
        self.resources: dict[str, Resource] = {r.name: r for r in rs}
        self.index = PairingIndex.build(self.topology, {r.name: r.devices for r in rs})
        self.groups = PairingGroups(self.window_s, clock=lambda: self.now)
        self.policy: dict[str, Policy] = {
            r.name: get_policy(self.policies.get(r.name, r.policy), tables=TABLES) for r in rs
        }
        self.info = {r.name: {d.id: DeviceInfo(d.id, None if d.numa is None else (d.numa,)) for d in r.devices}
                     for r in rs}
        self.in_use: dict[str, set[str]] = {r.name: set() for r in rs}
        self.pods: dict[str, dict[str, dict[str, tuple[str, ...]]]] = {}
        self.calls: list[PreferredCall] = []
        self._who: tuple[str, str, Mapping[str, tuple[str, ...]]] = ("", "", {})

    def resource_of(self, kind: DeviceKind) -> str:
        return next(r.name for r in self.resources.values() if r.kind == kind)

    def free(self, resource: str) -> int:
        return len(self.resources[resource].devices) - len(self.in_use[resource])

    def _order(self, ids: Iterable[str]) -> list[str]:
        out = list(ids)
        self.rng.shuffle(out)
        return out

    def _preferred(self, resource: str, available: list[str], must: list[str], size: int) -> Sequence[str]:
        group = self.groups.on_get_preferred_allocation(resource)
        partners = self.index.partners(resource, group)
        req = AllocationRequest.of(available, must, size, partners)
        a, ms = timed(self.policy[resource], self.resources[resource].graph, req)
        pod, container, held = self._who
        self.calls.append(PreferredCall(resource, dict(group), a, ms, pod, container, dict(held)))
        return a.ids

    def admit(self, uid: str, containers: Sequence[Container]) -> dict[str, dict[str, tuple[str, ...]]]:
        """Admit one pod; returns container -> resource -> devices."""
        reuse: dict[str, set[str]] = {r: set() for r in self.resources}
        got_pod: dict[str, dict[str, tuple[str, ...]]] = {}
        for c in sorted(containers, key=lambda c: not c.init):
            got: dict[str, tuple[str, ...]] = {}
            self._who = (uid, c.name, got)
            for res in self._order(c.requests):
                self.now += 0.002
                d = devices_to_allocate(
                    resource=res, required=c.requests[res], all_devices=self.info[res],
                    healthy=self.info[res], in_use=self.in_use[res], hint=NO_AFFINITY,
                    reusable=reuse[res], order=self._order,
                    preferred=lambda av, mi, size, res=res: self._preferred(res, av, mi, size),
                )
                if d.devices:
                    self.now += 0.001
                    self.groups.on_allocate(res, d.devices)
                    self.in_use[res] |= set(d.devices)
                    got[res] = d.devices
            got_pod[c.name] = got
            for res, ids in got.items():
                if c.init:
                    reuse[res] |= set(ids)
                else:
                    reuse[res] -= set(ids)
        self.pods[uid] = got_pod
        return got_pod

    def release(self, uid: str) -> None:
        for got in self.pods.pop(uid).values():
            for res, ids in got.items():
                self.in_use[res] -= set(ids)

    def wait(self, seconds: float) -> None:
        self.now += seconds


def is_close(topology: NodeTopology, gpu: str, nic: str) -> bool:
    """A GPU's NIC is close when their PCIe path is PIX/PXB or they are one complex (the platform's pair)."""
    cid = topology.device(gpu).complex
    if cid is not None and cid == topology.device(nic).complex:
        return True
    link = topology.link(gpu, nic)
    return link.level >= LinkLevel.PXB and not link.nvlinks


def close_pairs(topology: NodeTopology, gpus: Sequence[str], nics: Sequence[str]) -> int:
    """How many GPUs get a close NIC of their own (a one-to-one matching of close pairs)."""
    m = Matching(len(nics))
    for g in gpus:
        m.push([1 if is_close(topology, g, n) else 0 for n in nics])
    return m.total


@dataclass
class SimResult:
    gpus: int = 0
    close: int = 0
    paired_ms: list[float] = field(default_factory=list)
    plain_ms: list[float] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.close / self.gpus if self.gpus else 0.0


def churn(seq: random.Random, running: list[str], release, fits) -> None:
    """Pods leave between two admissions: each running pod with probability 1/4, then random ones
    until `fits()` (the next pod fits the free devices)."""
    for uid in list(running):
        if seq.random() < 0.25:
            running.remove(uid)
            release(uid)
    while not fits():
        release(running.pop(seq.randrange(len(running))))


def simulate(node: str, window_s: float, pods: int, seed: int, max_g: int = 4) -> SimResult:
    """A pod sequence with churn; the same sequence for every window (the seed fixes it)."""
    topology = load_simulated(node)
    seq = random.Random(seed)
    k = KubeletNode(topology, window_s, random.Random(seed + 1))
    gpu, nic = k.resource_of(DeviceKind.GPU), k.resource_of(DeviceKind.NIC)
    names = {r: {d.id: d.device.name for d in k.resources[r].devices} for r in (gpu, nic)}
    out = SimResult()
    running: list[str] = []
    cap = min(max_g, len(k.resources[gpu].devices), len(k.resources[nic].devices))
    for n in range(pods):
        g = seq.randint(1, cap)
        churn(seq, running, k.release, lambda: k.free(gpu) >= g and k.free(nic) >= g)
        k.wait(seq.choice((0.05, 0.5, 3.0)))
        uid = f"pod{n}"
        got = k.admit(uid, [Container("main", {gpu: g, nic: g})])["main"]
        running.append(uid)
        out.gpus += g
        out.close += close_pairs(topology, [names[gpu][i] for i in got[gpu]], [names[nic][i] for i in got[nic]])
    for c in k.calls:
        (out.paired_ms if c.partners else out.plain_ms).append(c.ms)
    return out


# -- 1. latency ---------------------------------------------------------------------
def latency(nodes: Sequence[str], trials: int, seed: int) -> None:
    print("\n## 1. GetPreferredAllocation at the allocator: ms p50/p99, same requests without / with partners")
    rows = []
    for node in nodes:
        t = load_simulated(node)
        rs = {r.kind: r for r in build_resources(t, ResourceOptions(device_id_strategy="index"), TABLES)}
        index = PairingIndex.build(t, {r.name: r.devices for r in rs.values()})
        for kind, other in ((DeviceKind.GPU, DeviceKind.NIC), (DeviceKind.NIC, DeviceKind.GPU)):
            me, them = rs[kind], rs[other]
            policy = get_policy(me.policy, tables=TABLES)
            rng = random.Random(seed)
            plain: list[float] = []
            paired: list[float] = []
            proven = 0
            for _ in range(trials):
                ids = list(me.graph.ids)
                avail = ids if rng.random() < 1 / 3 else rng.sample(ids, rng.randint(1, len(ids)))
                size = rng.randint(1, min(8, len(avail)))
                must = rng.sample(avail, rng.randint(1, min(2, size))) if rng.random() < 0.25 else []
                partner_ids = rng.sample(them.graph.ids, min(size, len(them.graph.ids)))
                partners = index.partners(me.name, {them.name: partner_ids})
                _, ms = timed(policy, me.graph, AllocationRequest.of(avail, must, size))
                plain.append(ms)
                a, ms = timed(policy, me.graph, AllocationRequest.of(avail, must, size, partners))
                paired.append(ms)
                proven += a.optimal
            rows.append([node, f"{me.name} ({me.policy})", len(me.graph.ids), trials,
                         f"{pct(plain, 50):.2f}/{pct(plain, 99):.2f}", f"{pct(paired, 50):.2f}/{pct(paired, 99):.2f}",
                         f"{pct(paired, 99) / max(pct(plain, 99), 1e-9):.2f}x", f"{proven}/{trials}"])
    print(table(["node", "resource", "n", "requests", "no partners", "with partners", "p99 ratio",
                 "proven optimal"], rows))


# -- 2. simulation ------------------------------------------------------------------
def simulation(nodes: Sequence[str], pods: int, seed: int) -> None:
    print(f"\n## 2. {pods} pods with churn per node, each one container asking g GPUs and g NICs (g = 1..4),"
          "\n##    resources in random order, Topology Manager policy none; share of GPUs with a close NIC"
          "\n##    of their own in the container (PIX/PXB, or the GPU's complex), and the GetPreferredAllocation"
          "\n##    calls' latency (ms p50/p99)")
    rows = []
    for node in nodes:
        on = simulate(node, 1.0, pods, seed)
        off = simulate(node, 0.0, pods, seed)
        rows.append([node, on.gpus, f"{100 * on.share:.1f} %", f"{100 * off.share:.1f} %",
                     f"{pct(off.plain_ms, 50):.2f}/{pct(off.plain_ms, 99):.2f} ({len(off.plain_ms)})",
                     f"{pct(on.plain_ms, 50):.2f}/{pct(on.plain_ms, 99):.2f} ({len(on.plain_ms)})",
                     f"{pct(on.paired_ms, 50):.2f}/{pct(on.paired_ms, 99):.2f} ({len(on.paired_ms)})"])
    print(table(["node", "GPUs placed", "close NIC with pairing", "without (window 0)",
                 "calls, window 0", "window 1 s: no partners", "window 1 s: with partners"], rows))


# -- 3. the hard end of the exact range ---------------------------------------------
def hard_end(nodes: int, seed: int) -> None:
    sys.path.insert(0, str(ROOT.parent / "tests" / "allocator"))
    sys.path.insert(0, str(ROOT.parent / "tests" / "support"))  # pairing_testlib uses topo_testkit
    from pairing_testlib import generated_node

    print(f"\n## 3. {nodes} generated nodes with 16 GPUs and 16 NICs, all available, k = 2..8, 1-12 partners:"
          "\n##    ms p50/p99/max per policy")
    times: dict[str, tuple[list[float], list[float]]] = {}
    proven = 0
    for n in range(nodes):
        rng = random.Random(seed * 1000 + n)
        t = generated_node(rng, 16, 16, rng.randint(1, 3), p_nvlink=rng.random())
        rs = {r.kind: r for r in build_resources(t, ResourceOptions(device_id_strategy="index"), TABLES)}
        index = PairingIndex.build(t, {r.name: r.devices for r in rs.values()})
        for name, kind, other in (("numa-first", DeviceKind.GPU, DeviceKind.NIC),
                                  ("link-first", DeviceKind.GPU, DeviceKind.NIC),
                                  ("spread", DeviceKind.NIC, DeviceKind.GPU),
                                  ("packed", DeviceKind.NIC, DeviceKind.GPU)):
            me, them = rs[kind], rs[other]
            policy = get_policy(name, tables=TABLES)
            plain, paired = times.setdefault(name, ([], []))
            for _ in range(4):
                size = rng.randint(2, 8)
                must = rng.sample(me.graph.ids, rng.randint(0, 2))
                partners = index.partners(me.name, {them.name: rng.sample(them.graph.ids, rng.randint(1, 12))})
                plain.append(timed(policy, me.graph, AllocationRequest.of(me.graph.ids, must, size))[1])
                a, ms = timed(policy, me.graph, AllocationRequest.of(me.graph.ids, must, size, partners))
                paired.append(ms)
                proven += a.optimal
    rows = []
    for name, (plain, paired) in times.items():
        rows.append([name, len(plain), f"{pct(plain, 50):.2f}/{pct(plain, 99):.2f}/{max(plain):.2f}",
                     f"{pct(paired, 50):.2f}/{pct(paired, 99):.2f}/{max(paired):.2f}"])
    print(table(["policy", "requests", "no partners", "with partners"], rows))
    print(f"proven optimal with partners: {proven}/{sum(len(p) for _, p in times.values())}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests and pods (a few seconds)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    gc.collect()
    started = time.perf_counter()
    print(f"# pairing benchmark ({'quick' if args.quick else 'full'}), Python {sys.version.split()[0]}")
    if args.quick:
        latency(NODES, trials=40, seed=args.seed)
        simulation(SIM_NODES, pods=150, seed=args.seed)
        hard_end(5, seed=args.seed)
    else:
        latency(NODES, trials=400, seed=args.seed)
        simulation(SIM_NODES, pods=1500, seed=args.seed)
        hard_end(60, seed=args.seed)
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
