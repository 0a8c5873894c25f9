"""NRI plugin side (plugin/nri): what one pod-sandbox event costs, and how fast the framing decodes.

Printed tables, not pass/fail.

1. Event round trip: NRI's own runtime (tests/support/nri_runtime: containerd/nri v0.8.0
   pkg/adaptation, another process, as containerd is) relays RunPodSandbox, StopPodSandbox and
   RemovePodSandbox to our NriPlugin, whose handler returns at once; the runtime measures each
   relay (its `us`): the ttrpc call through the multiplexer and back, our decoding and dispatch.
   This is the floor under whatever a handler does; containerd's default
   `plugin_request_timeout` (2 s) is the ceiling for both together.
2. Decoding: bytes of N ttrpc messages wrapped in multiplexer frames, cut into 64 KiB reads,
   through `FrameReader` and `MessageReader` (what every byte from the runtime goes through).

Usage: python benchmarks/nri_bench.py [--events N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from topo_testkit.nri_runtime import Runtime, build

from plugin.nri import NriPlugin, PodSandbox
from plugin.nri import ttrpc
from plugin.nri.mux import FrameReader, encode_frames
from plugin.backoff import Backoff


class Quick:
    async def synchronize(self, pods: list[PodSandbox]) -> None: ...
    async def run_pod_sandbox(self, pod: PodSandbox) -> None: ...
    async def stop_pod_sandbox(self, pod: PodSandbox) -> None: ...
    async def remove_pod_sandbox(self, pod: PodSandbox) -> None: ...


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def events(binary: str, n: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        sock = str(Path(tmp) / "nri.sock")
        rt = await Runtime.start(binary, sock)
        plugin = NriPlugin(sock, Quick(), backoff=Backoff(initial=0.05, cap=0.5))
        try:
            await plugin.start()
            await rt.next_event("connected")
            out: dict[str, list[float]] = {"run_pod": [], "stop_pod": [], "remove_pod": []}
            for i in range(n):
                pod = {"id": f"s{i}", "uid": f"uid-{i}", "namespace": "bench", "name": f"p{i}",
                       "netns": f"/var/run/netns/cni-{i:08x}"}
                await rt.command("add_pod", pod=pod)
                for cmd in out:
                    reply = await rt.reply(cmd, id=f"s{i}")
                    assert reply["error"] == "", reply
                    out[cmd].append(reply["us"] / 1000)
            return out
        finally:
            await plugin.stop()
            await rt.close()


def decoding(payload: int, count: int) -> tuple[float, float]:
    """(MB/s, messages/s) through both decoders."""
    one = ttrpc.encode(1, ttrpc.MessageType.REQUEST, b"x" * payload)
    wire = encode_frames(1, one * count)
    start = time.perf_counter()
    frames, messages, got = FrameReader(), ttrpc.MessageReader(), 0
    for i in range(0, len(wire), 1 << 16):
        for _, data in frames.feed(wire[i:i + (1 << 16)]):
            got += len(messages.feed(data))
    elapsed = time.perf_counter() - start
    assert got == count
    return len(wire) / elapsed / 1e6, count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200, help="pods run, stopped and removed (default 200)")
    args = parser.parse_args()
    binary, reason = build()
    if binary is None:
        print(reason, file=sys.stderr)
        return 1
    times = asyncio.run(events(binary, args.events))
    print(f"Event round trip through NRI v0.8.0's runtime, {args.events} pods (ms, measured by the runtime)")
    print(f"{'event':<20}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}{'mean':>8}")
    for cmd, name in (("run_pod", "RunPodSandbox"), ("stop_pod", "StopPodSandbox"), ("remove_pod", "RemovePodSandbox")):
        v = times[cmd]
        print(f"{name:<20}{_pct(v, .5):>8.2f}{_pct(v, .9):>8.2f}{_pct(v, .99):>8.2f}{max(v):>8.2f}"
              f"{statistics.mean(v):>8.2f}")
    print()
    print("Decoding (multiplexer frames + ttrpc messages, 64 KiB reads)")
    print(f"{'payload':>10}{'messages':>10}{'MB/s':>10}{'msgs/s':>12}")
    for payload, count in ((200, 20_000), (4_096, 5_000), (1 << 20, 40)):
        mbs, rate = decoding(payload, count)
        print(f"{payload:>10}{count:>10}{mbs:>10.0f}{rate:>12.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
