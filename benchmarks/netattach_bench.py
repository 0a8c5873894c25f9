"""Netattach benchmark: what attaching a pod's NICs costs, and what the ledger adds.

Printed tables, not pass/fail. Real network namespaces (`unshare --net=FILE`
under a temp dir) and veth pairs standing in for NICs, as in tests/netattach;
needs root. Per round: one namespace, N veths (2 addresses, 1 route, MTU each).

1. `attach`/`detach` per interface (pyroute2 netlink, a socket made inside the
   pod's namespace per call), p50/p99 ms.
2. `NetAttacher.attach_pod`/`detach_pod` of N interfaces: the same work plus a
   durable ledger write (fsync of file and directory) before every step;
   ledger writes per pod.
3. Open descriptors and threads of this process before and after all rounds
   (a leak would show as growth).

Usage: sudo python benchmarks/netattach_bench.py [--rounds 30] [--nics 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))

from plugin.netattach import InterfaceSpec, NetAttacher, RouteSpec, attach, detach


def sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--nics", type=int, default=2)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces, veth pairs)")
    tag = secrets.token_hex(2)
    names = [f"tb{tag}n{i}" for i in range(args.nics)]
    specs = [InterfaceSpec(n, f"net{i + 1}", addresses=(f"10.{100 + i}.0.2/24", f"fd00:{i + 1}::2/64"),
                           routes=(RouteSpec(f"10.{200 + i}.0.0/16", f"10.{100 + i}.0.1"),), mtu=9000)
             for i, n in enumerate(names)]
    tmp = tempfile.mkdtemp(prefix="netattach-bench-")
    ns = os.path.join(tmp, "ns")
    open(ns, "w").close()
    sh("unshare", f"--net={ns}", "true")
    for n in names:
        sh("ip", "link", "add", n, "type", "veth", "peer", "name", n + "p")
    fds0, threads0 = len(os.listdir("/proc/self/fd")), threading.active_count()
    t_attach: list[float] = []
    t_detach: list[float] = []
    p_attach: list[float] = []
    p_detach: list[float] = []
    writes: list[int] = []
    try:
        for _ in range(args.rounds):
            for s in specs:
                t = time.perf_counter()
                a = attach(s, ns)
                t_attach.append(time.perf_counter() - t)
                t = time.perf_counter()
                detach(a)
                t_detach.append(time.perf_counter() - t)
        ledger = os.path.join(tmp, "ledger.json")

        async def pods() -> None:
            att = NetAttacher(ledger)
            for r in range(args.rounds):
                before = att.ledger.writes
                t = time.perf_counter()
                await att.attach_pod(f"pod{r}", ns, specs)
                p_attach.append(time.perf_counter() - t)
                t = time.perf_counter()
                await att.detach_pod(f"pod{r}")
                p_detach.append(time.perf_counter() - t)
                writes.append(att.ledger.writes - before)

        asyncio.run(pods())
        fds1, threads1 = len(os.listdir("/proc/self/fd")), threading.active_count()
    finally:
        subprocess.run(["umount", ns], capture_output=True)
        for n in names:
            subprocess.run(["ip", "link", "del", n], capture_output=True)
    print(f"\nnetattach, {args.rounds} rounds, {args.nics} veth(s) (2 addresses, 1 route, MTU 9000 each)\n")
    print(f"{'operation':<44} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"{'attach (one interface)':<44} {pct(t_attach, .5):8.1f} {pct(t_attach, .99):8.1f}")
    print(f"{'detach (one interface)':<44} {pct(t_detach, .5):8.1f} {pct(t_detach, .99):8.1f}")
    for what, xs in (("attach_pod", p_attach), ("detach_pod", p_detach)):
        label = f"NetAttacher.{what} ({args.nics} interfaces)"
        print(f"{label:<44} {pct(xs, .5):8.1f} {pct(xs, .99):8.1f}")
    print(f"\nledger writes per pod (attach + detach): {statistics.median(writes):.0f}")
    print(f"open descriptors before/after: {fds0}/{fds1}; threads before/after: {threads0}/{threads1}")


if __name__ == "__main__":
    main()
