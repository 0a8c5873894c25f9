"""Fixtures of the network-attach e2e: the DRA e2e's cluster (containerd v2 with CDI), with NRI on.

Everything else comes from tests/e2e/cluster (the cluster, the skip-or-fail rule:
TOPO_DP_REQUIRE_KUBELET_E2E / TOPO_DP_REQUIRE_CHART_TOOLS make a missing tool a failure in CI)
and tests/e2e/dra (containerd v2 and its shim, built from their Go modules). The pods that get
the NICs run busybox (the real-kubelet e2e's image: Debian's busybox-static, whose `ip` and
`ping` applets show what a user of the pod sees).
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (HERE, HERE.parent / "dra", HERE.parent / "cluster", ROOT / "tests" / "kubelet", ROOT / "scripts", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import cluster_fixtures
import kubelet_build
from containerd_v2 import containerd_with_cdi

#: containerd's default NRI socket (github.com/containerd/nri pkg/api DefaultSocketPath), which the
#: chart mounts and the daemon's --nri-socket defaults to.
NRI_SOCKET = "/var/run/nri/nri.sock"


@pytest.fixture(scope="session")
def cluster_inputs(tmp_path_factory) -> dict[str, Any]:
    inputs = cluster_fixtures.build_inputs()
    containerd = containerd_with_cdi(tmp_path_factory.mktemp("containerd-v2"))
    bins = dataclasses.replace(inputs["bins"], containerd=containerd, cdi=True, nri_socket=NRI_SOCKET)
    try:
        busybox = kubelet_build.e2e_images()["busybox"]
    except kubelet_build.BuildUnavailable as e:
        cluster_fixtures.unavailable(str(e))
    return {**inputs, "bins": bins, "busybox": busybox}
