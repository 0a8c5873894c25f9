"""The NodeResourceTopology writer under churn: API writes per second, and how late the last state lands.

A DGX H100's object is rebuilt with random held GPUs at random moments (a pod's admission and its
neighbours: bursts of changes tens of milliseconds apart, then quiet), and written through the real
client (lightkube over HTTP) to an in-process stand-in of the API server's NRT paths
(tests/nrt/nrt_standin.py). Printed: changes, writes, writes per second, object bytes, and per
quiet period the delay from its last change to the write that carries it (p50 / p99 / max).
A table to read, not a test: nothing here passes or fails.

    python benchmarks/nrt_writer_bench.py --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "nrt"))
sys.path.insert(0, str(ROOT / "tests" / "dra"))

from apiserver_standin import write_kubeconfig
from nrt_standin import NrtApiStandIn

from plugin.kube.client import kubeconfig_api
from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.api import LightkubeNrtApi
from plugin.nrt.build import TopologyManagerSettings, build_nrt, published_resources
from plugin.nrt.writer import NrtWriter
from plugin.sources.simulated import load_simulated

NODE = "bench-node"


async def run(seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    topology = load_simulated("dgx-h100")
    resources = published_resources(build_resources(topology, ResourceOptions()))
    gpus = next(r for r in resources if r.name == "nvidia.com/gpu")
    settings = TopologyManagerSettings("single-numa-node", "container")
    server = NrtApiStandIn(NODE)
    await server.start()
    with tempfile.TemporaryDirectory() as d:
        path = write_kubeconfig(pathlib.Path(d) / "kubeconfig", server.url)

        async def connect():
            return LightkubeNrtApi(await kubeconfig_api(path))

        writer = NrtWriter(NODE, connect)
        task = asyncio.create_task(writer.run())
        changes, lands = 0, []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(rng.randint(1, 8)):  # a burst
                held = {(gpus.name, d.id) for d in rng.sample(gpus.devices, rng.randint(0, len(gpus.devices)))}
                obj = build_nrt(NODE, topology, resources, held, settings)
                writer.want(obj)
                changes += 1
                await asyncio.sleep(rng.uniform(0.0, 0.05))
            last = time.monotonic()
            while not (NODE in server.objects and server.objects[NODE]["zones"] == obj["zones"]):
                await asyncio.sleep(0.005)
            lands.append(time.monotonic() - last)
            await asyncio.sleep(rng.uniform(0.0, 1.5))  # quiet
        task.cancel()
        await writer.stop(delete=False)
    await server.stop()
    writes = [w for w in server.writes if w[0] in ("POST", "PUT")]
    span = writes[-1][2] - writes[0][2] if len(writes) > 1 else 1.0
    gaps = [b[2] - a[2] for a, b in zip(writes, writes[1:])]
    lands.sort()
    size = len(json.dumps(server.objects[NODE]).encode())
    print(f"{'changes':>8} {'writes':>7} {'writes/s':>9} {'min gap s':>10} {'bytes':>6} "
          f"{'land p50 s':>11} {'land p99 s':>11} {'land max s':>11}")
    print(f"{changes:>8} {len(writes):>7} {len(writes) / span:>9.2f} {min(gaps) if gaps else 0:>10.3f} {size:>6} "
          f"{statistics.median(lands):>11.3f} {lands[int(0.99 * (len(lands) - 1))]:>11.3f} {lands[-1]:>11.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    asyncio.run(run(a.seconds, a.seed))


if __name__ == "__main__":
    main()
