"""What the local-cluster tests share: the skip-or-fail rule, the built inputs, one cluster per module.

Kept out of conftest.py so that test modules can import it by a name no other test
directory uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import build_image
import cluster_build
import kubelet_build
from cluster import Binaries, Cluster
from sandbox import host_mounts_under, tools_missing

TOOLS = ("unshare", "nsenter", "mount", "ip", "openssl", "containerd", "ctr", "runc")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def required() -> bool:
    return "1" in (os.environ.get("TOPO_DP_REQUIRE_KUBELET_E2E"), os.environ.get("TOPO_DP_REQUIRE_CHART_TOOLS"))


def unavailable(reason: str) -> None:
    if required():
        pytest.fail(f"local-cluster e2e required (TOPO_DP_REQUIRE_*=1) but {reason}")
    print(f"\nSKIP (tests/e2e/cluster): {reason}", file=sys.stderr)
    pytest.skip(reason)


def host_runs_a_node() -> str | None:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
            except OSError:
                continue
            if exe in ("kubelet", "kube-apiserver") and not os.environ.get("TOPO_DP_ALLOW_HOST_NODE"):
                # Only a process in our own (host) network namespace would clash with a real node.
                if os.readlink(f"/proc/{pid}/ns/net") == os.readlink("/proc/self/ns/net"):
                    return f"a {exe} (pid {pid}) runs on this machine"
    return None


def build_inputs() -> dict[str, Any]:
    """Everything the clusters need, built (or taken from the cache) once per session."""
    if os.geteuid() != 0:
        unavailable("the cluster needs root (namespaces, mounts, containerd)")
    real = host_runs_a_node()
    if real:
        unavailable(f"{real}; this test is for throwaway machines only")
    try:
        cluster_build.packages()
        missing = tools_missing(TOOLS)
        if missing:
            unavailable(f"missing {', '.join(missing)}")
        images = kubelet_build.e2e_images()
        image = build_image.build()
        helm = cluster_build.helm()
        bins = Binaries(controlplane=cluster_build.controlplane(), kubelet=cluster_build.kubelet(),
                        helm=helm, harness=kubelet_build.harness_binary(), cni_bin=cluster_build.cni_bin_dir(),
                        pause_archive=images["pause"], pause_image=PAUSE_IMAGE)
    except (kubelet_build.BuildUnavailable, build_image.Unavailable) as e:
        unavailable(str(e))
    return {"bins": bins, "image": image}


def start_cluster(tmp_path_factory, inputs: dict[str, Any], numa: dict[int, list[int]],
                  distances: dict[int, list[int]], tm_policy: str, cpu_policy: str = "none",
                  prepare: Callable[[Cluster], None] | None = None) -> Iterator[Cluster]:
    """Bring a cluster up for one module; always tear it down, also when bring-up failed.

    `prepare` runs on the cluster's work directory before anything starts (e.g. a CNI config
    that containerd must find at its start)."""
    w = tmp_path_factory.mktemp("cluster")
    c = Cluster(w, inputs["bins"])
    try:
        try:
            if prepare is not None:
                prepare(c)
            c.up(numa, distances, tm_policy, cpu_policy, images=[inputs["image"].archive])
        except Exception as e:  # noqa: BLE001 - report with the daemons' logs
            pytest.fail(f"cluster bring-up failed: {e}\n{c.logs_tail()}")
        yield c
    finally:
        c.down()
        left = host_mounts_under(w)
        assert not left, f"mounts left on the host under {w}: {left}"


def down_and_check_nothing_left(c: Cluster) -> None:
    """Tear the cluster down and assert that every process stopped by its PID and no mount is left."""
    pids = {n: p.pid for n, p in c.sb.procs.items()}
    c.down()
    assert c.sb.leftovers == [], "processes that were not stopped by their PID"
    assert c.sb.members() == []
    for name, pid in pids.items():
        assert not os.path.exists(f"/proc/{pid}"), f"{name} ({pid}) still runs"
    assert host_mounts_under(c.w) == []


def numa_layout(node_numa: list[int]) -> dict[int, list[int]]:
    """Split this machine's CPUs over the simulated node's NUMA nodes, in order."""
    cpus = list(range(os.cpu_count() or 1))
    per = max(1, len(cpus) // len(node_numa))
    out = {n: cpus[i * per:(i + 1) * per] for i, n in enumerate(node_numa)}
    out[node_numa[-1]] += cpus[len(node_numa) * per:]
    return out
