"""GPU–NIC pairing through the real daemon over gRPC: how often a GPU gets a close NIC, and what it costs.

Printed tables, not pass/fail. For each simulated node, a real daemon process
(`python -m plugin serve --simulate NODE`) serves the kubelet stand-in over
real unix sockets, once with the pairing window at 1 s and once at 0 (off).
The stand-in's device-manager walk (`topo_testkit.device_manager`) admits the
same random pod sequence with churn in both runs: each pod one container
asking g GPUs and g NICs (g = 1..4), its two resources in random order (Go map
order), Topology Manager policy none, GetPreferredAllocation where the
kubelet has a choice, then Allocate; after each pod every running pod leaves
with probability 1/4 (and more leave while the next pod does not fit).

Reported per node and window:
- the share of placed GPUs with a close NIC of their own in the container
  (one NIC per GPU: the largest one-to-one matching of such pairs; close is a
  PIX/PXB path, or on Grace / ConnectX-8 nodes such as gb300-cx8-dd the NIC of
  the GPU's complex);
- every GetPreferredAllocation answer checked against the spec's brute force
  with the spec's partners from the call log (`topo_testkit.pairing_oracle`);
- GetPreferredAllocation round trips over gRPC (ms, p50/p99) as the client
  sees them: all calls, and the calls for a container's second resource
  (with partners at 1 s, the same calls without at window 0). The acceptance
  ratio is p99(second resource, window 1 s) / p99(second resource, window 0).

Every run warms the daemon up first (one pod, not counted). Timings depend
on the machine; a loaded CI box shows it in p99.

Usage: python benchmarks/pairing_grpc_bench.py [--quick] [--seed N] [--nodes dgx-h100,dgx-a100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import pathlib
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent / "tests" / "support"))

from allocator.topology import DeviceKind
from allocator_bench import pct, table
from pairing_bench import churn
from topo_testkit.device_manager import StandinDeviceManager, pod
from topo_testkit.kubelet_standin import KubeletStandin
from plugin.model.resources import ResourceOptions, build_resources
from plugin.sources.simulated import load_simulated
from topo_testkit import pythonpath_env
from topo_testkit.pairing_oracle import LoggedCall, oracle_for, spec_partners

NODES = ("dgx-h100", "dgx-a100", "dgx-2-v100")


@dataclass
class Run:
    gpus: int = 0
    close: int = 0
    checked: int = 0
    optimal: int = 0
    with_partners: int = 0
    problems: list[str] = field(default_factory=list)
    #: Per GetPreferredAllocation: whether it had partners at A, then A first, A fastest, B first, B fastest (ms).
    latency: list[tuple[bool, float, float, float, float]] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.close / self.gpus if self.gpus else 0.0


@contextlib.asynccontextmanager
async def daemon(node: str, window_ms: float, tmp: str) -> AsyncIterator[KubeletStandin]:
    """A real daemon process serving `node` to a kubelet stand-in in `tmp`."""
    kubelet = KubeletStandin(tmp)
    await kubelet.start()
    log = open(os.path.join(tmp, "daemon.log"), "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "plugin", "serve", "--simulate", node, "--device-plugin-path", tmp,
         "--device-id-strategy", "index", "--pairing-window-ms", str(window_ms), "--log-level", "warning"],
        cwd=ROOT.parent, stdout=log, stderr=subprocess.STDOUT, env=pythonpath_env(dict(os.environ)))
    try:
        await kubelet.wait_for(lambda: len(kubelet.clients) == 2 and all(c.devices for c in kubelet.clients.values()),
                               timeout=30)
        yield kubelet
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
        await kubelet.stop()


class Mirror:
    """Looks like a `KubeletStandin` to the walk: every call goes to daemon A (whose answers are used)
    and to daemon B. A GetPreferredAllocation is sent `repeats` times to each, alternating A and B
    (the daemons' answers do not change: a request for a resource not in the group leaves the group
    as it is); per daemon the first round trip and the fastest are kept (the fastest filters out
    pauses other processes on the machine cause, as `allocator_bench` does)."""

    def __init__(self, a: KubeletStandin, b: KubeletStandin, repeats: int = 5):
        self.a, self.b = a, b
        self.repeats = repeats
        #: per call: (A first, A fastest, B first, B fastest), ms
        self.times: list[tuple[float, float, float, float]] = []

    def devices(self, resource: str):
        return self.a.devices(resource)

    async def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        ms: dict[int, list[float]] = {id(self.a): [], id(self.b): []}
        answer: list[str] = []
        for n in range(self.repeats):
            for k in ((self.a, self.b) if (n + len(self.times)) % 2 else (self.b, self.a)):
                started = time.perf_counter()
                ids = await k.preferred(resource, available, must, size)
                ms[id(k)].append(1000 * (time.perf_counter() - started))
                if k is self.a and not n:
                    answer = ids
        a, b = ms[id(self.a)], ms[id(self.b)]
        self.times.append((a[0], min(a), b[0], min(b)))
        return answer

    async def allocate(self, resource: str, ids: list[str]):
        await self.b.allocate(resource, ids)
        return await self.a.allocate(resource, ids)


async def walk(dm: StandinDeviceManager, gpu: str, nic: str, pods: int, seed: int, on_pod=None) -> None:
    """The pod sequence with churn (the same for every run with the same seed and answers)."""
    seq = random.Random(seed)
    await dm.admit(pod("warm-up", {gpu: 1, nic: 1}))
    dm.release("warm-up")
    dm.calls.clear()
    running: list[str] = []
    cap = min(4, len(dm.kubelet.devices(gpu)), len(dm.kubelet.devices(nic)))
    for n in range(pods):
        g = seq.randint(1, cap)
        churn(seq, running, dm.release, lambda: dm.free(gpu) >= g and dm.free(nic) >= g)
        got = (await dm.admit(pod(f"pod{n}", {gpu: g, nic: g})))["main"]
        running.append(f"pod{n}")
        if on_pod is not None:
            on_pod(g, got)


def check(dm: StandinDeviceManager, oracle, window_s: float, out: Run) -> list[dict]:
    """Every answer against the spec's optimum with the spec's partners; returns the partners per call."""
    calls = [LoggedCall(c.method, c.resource, c.ids, c.t) for c in dm.calls]
    partners = spec_partners(calls, window_s)
    prefs = [c for c in dm.calls if c.method == "GetPreferredAllocation"]
    for c, p in zip(prefs, partners):
        problem = oracle.check(c.resource, c.available, c.must_include, c.size, p, c.ids)
        out.checked += 1
        out.optimal += problem is None
        out.with_partners += bool(p)
        if problem:
            out.problems.append(problem)
    return partners


async def share_run(node: str, window_ms: float, pods: int, seed: int) -> Run:
    """One daemon with the given window: the close-NIC share and the answers' optimality."""
    topology = load_simulated(node)
    resources = build_resources(topology, ResourceOptions(device_id_strategy="index"))
    gpu = next(r.name for r in resources if r.kind is DeviceKind.GPU)
    nic = next(r.name for r in resources if r.kind is DeviceKind.NIC)
    device = {d.id: d.device for r in resources for d in r.devices}
    oracle = oracle_for(topology, resources)
    out = Run()

    def count(g: int, got) -> None:
        out.gpus += g
        out.close += oracle.close_pairs([device[i] for i in got[gpu]], [device[i] for i in got[nic]])

    with tempfile.TemporaryDirectory(prefix="tdp-bench-") as tmp:
        async with daemon(node, window_ms, tmp) as kubelet:
            dm = StandinDeviceManager(kubelet, random.Random(seed + 1))
            await walk(dm, gpu, nic, pods, seed, count)
    check(dm, oracle, window_ms / 1000.0, out)
    return out


async def latency_run(node: str, pods: int, seed: int) -> Run:
    """Daemon A (window 1 s) drives the walk; daemon B (window 0) gets the very same calls:
    the same GetPreferredAllocation requests timed with partners (A) and without (B)."""
    topology = load_simulated(node)
    resources = build_resources(topology, ResourceOptions(device_id_strategy="index"))
    gpu = next(r.name for r in resources if r.kind is DeviceKind.GPU)
    nic = next(r.name for r in resources if r.kind is DeviceKind.NIC)
    out = Run()
    with tempfile.TemporaryDirectory(prefix="tdp-a-") as ta, tempfile.TemporaryDirectory(prefix="tdp-b-") as tb:
        async with daemon(node, 1000.0, ta) as a, daemon(node, 0.0, tb) as b:
            mirror = Mirror(a, b)
            dm = StandinDeviceManager(mirror, random.Random(seed + 1))
            await walk(dm, gpu, nic, pods, seed)
    partners = check(dm, oracle_for(topology, resources), 1.0, out)
    timed = mirror.times[-len(partners):]  # the warm-up's calls come first
    out.latency = [(bool(p), *t) for p, t in zip(partners, timed)]
    return out


def p50_99(values: list[float]) -> str:
    return f"{pct(values, 50):.2f}/{pct(values, 99):.2f}" if values else "-"


async def main_async(nodes: list[str], pods: int, seed: int, parts: str = "share,latency") -> None:
    if "share" in parts:
        await share_table(nodes, pods, seed)
    if "latency" in parts:
        await latency_table(nodes, pods, seed)


async def share_table(nodes: list[str], pods: int, seed: int) -> None:
    print(f"\n## 1. {pods} pods with churn per node, each one container asking g GPUs and g NICs (g = 1..4),"
          "\n##    resources in random order; a real daemon process over gRPC with the pairing window"
          "\n##    at 1 s and at 0 (off): share of GPUs with a close NIC of their own in the container"
          "\n##    (PIX/PXB, or the NIC of the GPU's complex),"
          "\n##    and preferred answers that are the spec's optimum (with the spec's partners)")
    rows = []
    for node in nodes:
        on = await share_run(node, 1000.0, pods, seed)
        off = await share_run(node, 0.0, pods, seed)
        rows.append([node, on.gpus, f"{100 * on.share:.1f} %", f"{100 * off.share:.1f} %",
                     f"{on.optimal}/{on.checked} ({on.with_partners} with partners)", f"{off.optimal}/{off.checked}"])
        for p in (on.problems + off.problems)[:5]:
            print("NOT OPTIMAL:", p)
    print(table(["node", "GPUs placed", "close NIC, window 1 s", "close NIC, window 0",
                 "optimal answers, 1 s", "optimal answers, 0"], rows))


async def latency_table(nodes: list[str], pods: int, seed: int) -> None:
    print(f"\n## 2. GetPreferredAllocation round trips over gRPC, ms p50/p99: the same {pods}-pod walk sent to"
          "\n##    two daemons, A (window 1 s, whose answers the walk uses) and B (window 0); each request goes"
          "\n##    5 times to each, alternating; 'fastest' keeps each request's fastest round trip per daemon,"
          "\n##    'first' its first. The calls with partners at A are the acceptance pair (p99 ratio A/B).")
    rows = []
    for node in nodes:
        r = await latency_run(node, pods, seed)
        paired = [x for x in r.latency if x[0]]
        other = [x for x in r.latency if not x[0]]
        col = lambda xs, i: [x[i] for x in xs]  # noqa: E731 (a one-line shorthand)
        rows.append([node, len(paired),
                     p50_99(col(paired, 2)), p50_99(col(paired, 4)),
                     f"{pct(col(paired, 2), 99) / max(pct(col(paired, 4), 99), 1e-9):.2f}x",
                     p50_99(col(paired, 1)), p50_99(col(paired, 3)),
                     f"{pct(col(paired, 1), 99) / max(pct(col(paired, 3), 99), 1e-9):.2f}x",
                     f"{p50_99(col(other, 2))} / {p50_99(col(other, 4))}", f"{r.optimal}/{r.checked}"])
    print(table(["node", "calls with partners", "A fastest", "B fastest", "p99 ratio", "A first", "B first",
                 "p99 ratio (first)", "other calls, fastest A / B", "A optimal"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 pods per node and window instead of 600")
    ap.add_argument("--pods", type=int, default=0, help="pods per node and window (overrides --quick)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--nodes", default=",".join(NODES))
    ap.add_argument("--parts", default="share,latency", help="share, latency or both (comma list)")
    args = ap.parse_args()
    started = time.perf_counter()
    print(f"# pairing over gRPC ({'quick' if args.quick else 'full'}), Python {sys.version.split()[0]}")
    asyncio.run(main_async(args.nodes.split(","), args.pods or (60 if args.quick else 600), args.seed,
                            args.parts))
    print(f"\ntotal {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
