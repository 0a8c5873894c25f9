"""Fixtures of the DRA e2e: the local cluster of tests/e2e/cluster, reused as it is.

The cluster, its build inputs and the skip-or-fail rule (TOPO_DP_REQUIRE_KUBELET_E2E /
TOPO_DP_REQUIRE_CHART_TOOLS: a missing tool fails in CI) all come from tests/e2e/cluster.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
for p in (HERE.parent / "cluster", ROOT / "tests" / "kubelet", ROOT / "scripts", ROOT):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import cluster_fixtures  # noqa: E402


@pytest.fixture(scope="session")
def cluster_inputs() -> dict[str, Any]:
    return cluster_fixtures.build_inputs()
