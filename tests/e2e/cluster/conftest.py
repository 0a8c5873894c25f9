"""Fixtures of the local-cluster e2e: the built inputs (session) and one cluster per module.

Needs root, Linux namespaces, Debian's containerd/runc/CNI plugins, Go and the module proxy
(all installed or built by scripts/test.sh). Where one truly cannot exist here (not root)
the tests skip with the reason printed; under TOPO_DP_REQUIRE_KUBELET_E2E=1 or
TOPO_DP_REQUIRE_CHART_TOOLS=1 (set by .ci/run) any missing piece is a failure.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (HERE, ROOT / "tests" / "kubelet", ROOT / "scripts", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import cluster_fixtures


@pytest.fixture(scope="session")
def cluster_inputs() -> dict[str, Any]:
    """Everything the clusters need, built (or taken from the cache) once per session."""
    return cluster_fixtures.build_inputs()
