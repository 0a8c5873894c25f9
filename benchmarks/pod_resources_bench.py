"""Pod-resources `List`: how large the kubelet's answers get, and how long reading one stalls the event loop.

Printed tables, not pass/fail (issue 19; the figures are recorded in docs/pairing.md).

1. Answer sizes (`ByteSize` of a `ListPodResourcesResponse` built with the proto) for a node at
   the kubelet's default pod limit, 110 pods:
   - typical: 3 containers per pod (app, a sidecar, a restartable init container), 2 exclusive
     CPUs each, 8 of the pods holding a GPU (UUID IDs) and a NIC each, one entry per NUMA node;
   - dense: 4 containers per pod, every container holding 2 GPUs and 2 NICs (possible only with
     time-slicing replicas), 16 CPUs, 2 memory blocks and one DRA claim with 2 CDI devices;
   - absurd: as dense, every container holding 8 GPUs and 8 NICs.
2. The loop stall: `PodResourcesReader.holdings()` against a pod-resources server (another
   process, as the kubelet is) answering with N filler pods; a ticker task on the loop records its
   largest gap (the time no other RPC could have been served) and the call's duration. The call's
   timeout is raised to 10 s here, so the decoding is measured, not the 250 ms deadline.

Usage: python benchmarks/pod_resources_bench.py [--sizes-only]
The code measured is the `plugin` importable first: run it with PYTHONPATH=<another checkout> to
measure that one (the "before" figures came from the commit before the cap, 04946f3).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import sys
import tempfile
import time
import uuid

from plugin.api.podresources.v1 import api_pb2

PODS = 110


def _uuid(rng_seed: int) -> str:
    return "GPU-" + str(uuid.UUID(int=rng_seed * 7919 + 1))


def build_answer(pods: int, containers: int, gpus: int, nics: int, cpus: int, memory: int, claims: int,
                 holders: int | None = None) -> api_pb2.ListPodResourcesResponse:
    """`holders`: how many pods hold devices (None: all of them)."""
    out = api_pb2.ListPodResourcesResponse()
    for p in range(pods):
        pod = out.pod_resources.add(name=f"workload-{p:03d}-7d9f8c6b5-x2x4z", namespace="team-inference")
        for c in range(containers):
            cont = pod.containers.add(name=("main", "istio-proxy", "log-shipper", "metrics")[c % 4])
            cont.cpu_ids.extend(range(c * cpus, (c + 1) * cpus))
            if holders is None or p < holders:
                for g in range(gpus):
                    d = cont.devices.add(resource_name="nvidia.com/gpu", device_ids=[_uuid(p * 64 + g)])
                    d.topology.nodes.add(ID=g % 2)
                for n in range(nics):
                    d = cont.devices.add(resource_name="topo.dev/nic", device_ids=[f"0000:{0x18 + n:02x}:00.1"])
                    d.topology.nodes.add(ID=n % 2)
            for m in range(memory):
                cm = cont.memory.add(memory_type="memory", size=64 << 30)
                cm.topology.nodes.add(ID=m % 2)
            for k in range(claims):
                dr = cont.dynamic_resources.add(claim_name=f"claim-{k}", claim_namespace="team-inference")
                cr = dr.claim_resources.add(driver_name="topo.dev", pool_name="node-a", device_name=f"gpu-{k}")
                cr.cdi_devices.add(name=f"topo.dev/claim={uuid.UUID(int=p * 16 + k)}-gpu-{k}")
                cr.cdi_devices.add(name=f"topo.dev/claim={uuid.UUID(int=p * 16 + k)}-nic-{k}")
    return out


SCENARIOS = {
    "typical": dict(containers=3, gpus=1, nics=1, cpus=2, memory=0, claims=0, holders=8),
    "dense": dict(containers=4, gpus=2, nics=2, cpus=16, memory=2, claims=1),
    "absurd": dict(containers=4, gpus=8, nics=8, cpus=16, memory=2, claims=1),
}


def sizes() -> dict[str, int]:
    return {name: build_answer(PODS, **kw).ByteSize() for name, kw in SCENARIOS.items()}


def _serve(path: str, answer: bytes, ready) -> None:
    """The stand-in kubelet, in its own process: the stall measured is the reader's alone."""
    import grpc

    async def main() -> None:
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(lambda req, ctx: answer)})
        server = grpc.aio.server(options=[("grpc.max_send_message_length", 64 << 20)])
        server.add_generic_rpc_handlers((handler,))
        server.add_insecure_port(f"unix:{path}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(main())


async def _stall(path: str) -> tuple[float, float, str]:
    from plugin.allocation.pod_resources import PodResourcesReader

    reader = PodResourcesReader(path, timeout_s=10.0)
    gaps = [0.0]
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    start = time.perf_counter()
    holdings = await reader.holdings()
    took = time.perf_counter() - start
    done.set()
    await tick
    await reader.close()
    return max(gaps), took, "refused" if holdings is None else f"{len(holdings.holder)} devices"


def stall(answer: api_pb2.ListPodResourcesResponse) -> tuple[float, float, str]:
    raw = answer.SerializeToString()
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        path = os.path.join(d, "kubelet.sock")
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        proc = ctx.Process(target=_serve, args=(path, raw, ready), daemon=True)
        proc.start()
        try:
            ready.wait(60)
            return asyncio.run(_stall(path))
        finally:
            proc.kill()
            proc.join()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-only", action="store_true")
    args = ap.parse_args()
    import plugin

    print(f"plugin from {os.path.dirname(plugin.__file__)}; python {sys.version.split()[0]}")
    print(f"\n{PODS}-pod List answers (ByteSize):")
    print(f"{'scenario':10} {'bytes':>10} {'KiB':>8}")
    for name, size in sizes().items():
        print(f"{name:10} {size:>10} {size / 1024:>8.1f}")
    if args.sizes_only:
        return
    print("\nloop stall while reading one answer (the largest gap of a 1 ms ticker on the loop):")
    print(f"{'answer':>12} {'max gap ms':>11} {'call ms':>8}  result")
    for pods in (1_500, 33_000, 111_000):  # about 0.2, 3.9 and 13 MiB of one-GPU pods
        answer = build_answer(pods, containers=1, gpus=1, nics=0, cpus=0, memory=0, claims=0)
        gap, took, what = stall(answer)
        print(f"{answer.ByteSize() / (1 << 20):>8.2f} MiB {gap * 1000:>11.1f} {took * 1000:>8.1f}  {what}")


if __name__ == "__main__":
    main()
