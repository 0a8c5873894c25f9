"""Fixtures of the DRA e2e: the local cluster of tests/e2e/cluster, on a containerd with CDI.

The cluster, its build inputs and the skip-or-fail rule (TOPO_DP_REQUIRE_KUBELET_E2E /
TOPO_DP_REQUIRE_CHART_TOOLS: a missing tool fails in CI) come from tests/e2e/cluster. The one
difference: containerd v2 built from its Go module (tests/e2e/dra/containerd, cached by
scripts/go_build_cached.sh) with CDI on for /var/run/cdi, because Debian's containerd 1.6.20
cannot inject CDI devices. Its runc shim of the same release (tests/e2e/dra/containerd-shim)
sits beside it, as `containerd` and `containerd-shim-runc-v2` in a directory of this session
(hard links, or copies) put first in containerd's PATH.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (HERE, HERE.parent / "cluster", ROOT / "tests" / "kubelet", ROOT / "scripts", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import cluster_fixtures
from containerd_v2 import containerd_with_cdi


@pytest.fixture(scope="session")
def cluster_inputs(tmp_path_factory) -> dict[str, Any]:
    inputs = cluster_fixtures.build_inputs()
    containerd = containerd_with_cdi(tmp_path_factory.mktemp("containerd-v2"))
    bins = dataclasses.replace(inputs["bins"], containerd=containerd, cdi=True)
    return {**inputs, "bins": bins}
