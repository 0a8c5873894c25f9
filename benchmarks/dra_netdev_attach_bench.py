"""DRA netdev attach benchmark: what a pod's sandbox start and stop cost with NICs to attach, as the runtime sees it.

Printed tables, not pass/fail. The DRA driver in-process (`--netdev-attach auto`), the kubelet's DRA calls over
gRPC (tests/dra/kubelet_standin), claims from the stand-in API server, and the runtime side of NRI from
containerd/nri v0.8.0 (tests/support/nri_runtime, built by its build.sh); NICs are veth pairs moved between real
network namespaces (needs root). Per round: one pod, one claim of 1 GPU + N NICs, each NIC with a NicConfig
(name, address, route, MTU).

Columns: NodePrepareResources of the claim (NicConfig checked, netdevs probed); RunPodSandbox and
StopPodSandbox as the runtime times them (its request to our plugin and back: checkpoint read, attach or detach
of N NICs with durable ledger writes); the budget is containerd's default NRI plugin_request_timeout, 2 s.
`--other-claims K` first prepares K GPU-only claims, to show what a larger checkpoint adds to each sandbox event.

Usage: sudo python benchmarks/dra_netdev_attach_bench.py [--rounds 20] [--nics 2] [--other-claims 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "support"), str(ROOT / "tests" / "dra")]

from apiserver_standin import ApiServerStandIn, write_kubeconfig
from kubelet_standin import register, registration_sockets

from plugin.dra import DraOptions, SliceOptions
from plugin.kube.client import kubeconfig_api
from plugin.dra.network.nic_config import API_VERSION, KIND
from plugin.runtime.compose.dra import dra_driver
from plugin.sources.simulated import load_node_yaml

DRIVER, NODE = "topo.dev", "node-a"


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


class Runtime:
    def __init__(self, binary: str, socket: str):
        self.proc = subprocess.Popen([binary, "-socket", socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)

    async def until(self, what: str) -> dict:
        while True:
            line = json.loads(await asyncio.to_thread(self.proc.stdout.readline))
            if line.get("event") == what or line.get("reply") == what:
                return line

    async def send(self, cmd: str, **fields) -> float:
        t = time.perf_counter()
        self.proc.stdin.write(json.dumps({"cmd": cmd, **fields}) + "\n")
        reply = await self.until(cmd)
        if reply["error"]:
            raise SystemExit(f"{cmd}: {reply['error']}")
        return time.perf_counter() - t


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--nics", type=int, default=2)
    ap.add_argument("--other-claims", type=int, default=0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, veth pairs)")
    binary = subprocess.run(["bash", str(ROOT / "tests/support/nri_runtime/build.sh")], check=True,
                            capture_output=True, text=True).stdout.strip().splitlines()[-1]
    tag = secrets.token_hex(2)
    names = [f"tb{tag}d{i}" for i in range(args.nics)]
    base = tempfile.mkdtemp(prefix="dranet-", dir="/tmp")
    for n in names:
        sh("ip", "link", "add", n, "type", "veth", "peer", "name", n + "p")
    api_server = ApiServerStandIn(NODE)
    await api_server.start()
    api = await kubeconfig_api(write_kubeconfig(pathlib.Path(base) / "kubeconfig", api_server.url))
    rt = Runtime(binary, os.path.join(base, "nri.sock"))
    await rt.until("listening")
    nics = "\n".join(f"  - {{name: nic{i}, numa: 0, netdev: {n}}}" for i, n in enumerate(names))
    topo = load_node_yaml(f"apiVersion: topo-device-plugin/v1\nkind: SimulatedNode\ngpus: [{{numa: 0}}]\n"
                          f"nics:\n{nics}\n", "bench.yaml")
    drv = dra_driver(DraOptions(SliceOptions(node_name=NODE, driver_name=DRIVER),
                               kubelet_root=os.path.join(base, "kubelet"), cdi_root=os.path.join(base, "cdi"),
                               instance_id="bench", resync_s=3600, netdev_attach="auto",
                               nri_socket=os.path.join(base, "nri.sock")), api)
    times: dict[str, list[float]] = {"NodePrepareResources": [], "RunPodSandbox": [], "StopPodSandbox": []}
    try:
        await drv.start(topo)
        await rt.until("synchronized")
        plugin = await register(registration_sockets(os.path.join(base, "kubelet"))[0])
        for i in range(args.other_claims):
            uid = api_server.add_claim("bulk", f"g{i}", [{"request": "g", "driver": DRIVER, "pool": NODE,
                                                          "device": "gpu-0"}])
            await plugin.prepare(("bulk", uid, f"g{i}"))
        for r in range(args.rounds):
            pod = str(uuid.uuid4())
            ns = os.path.join(base, f"ns{r}")
            open(ns, "w").close()
            sh("unshare", f"--net={ns}", "true")
            results = [{"request": "gpus", "driver": DRIVER, "pool": NODE, "device": "gpu-0"}]
            config = []
            for i in range(args.nics):
                results.append({"request": f"nic{i}", "driver": DRIVER, "pool": NODE, "device": f"nic-nic{i}"})
                config.append({"requests": [f"nic{i}"], "opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": API_VERSION, "kind": KIND, "interfaceName": f"net{i + 1}",
                    "addresses": [f"10.{100 + i}.0.2/24"],
                    "routes": [{"destination": f"10.{200 + i}.0.0/16", "gateway": f"10.{100 + i}.0.1"}],
                    "mtu": 9000}}})
            uid = api_server.add_claim("team", f"c{r}", results, config=config, pods=[pod])
            t = time.perf_counter()
            resp = await plugin.prepare(("team", uid, f"c{r}"))
            times["NodePrepareResources"].append(time.perf_counter() - t)
            assert resp.claims[uid].error == "", resp.claims[uid].error
            await rt.send("add_pod", pod={"id": f"sb{r}", "uid": pod, "namespace": "team", "name": f"p{r}",
                                          "netns": ns})
            times["RunPodSandbox"].append(await rt.send("run_pod", id=f"sb{r}"))
            times["StopPodSandbox"].append(await rt.send("stop_pod", id=f"sb{r}"))
            await rt.send("remove_pod", id=f"sb{r}")
            await plugin.unprepare(("team", uid, f"c{r}"))
            subprocess.run(["umount", ns], capture_output=True)
            os.unlink(ns)
    finally:
        await drv.stop()
        await api.close()
        rt.proc.kill()
        await api_server.stop()
        for n in names:
            subprocess.run(["ip", "link", "del", n], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)
    print(f"{args.rounds} rounds, {args.nics} NICs per pod (name, address, route, MTU each), "
          f"{args.other_claims} other prepared claims in the checkpoint")
    print(f"{'step':<22} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8}")
    for step, xs in times.items():
        print(f"{step:<22} {pct(xs, 0.5):8.1f} {pct(xs, 0.9):8.1f} {max(xs) * 1000:8.1f}")
    print("budget: containerd's NRI plugin_request_timeout, 2000 ms per sandbox event")


if __name__ == "__main__":
    asyncio.run(main())
