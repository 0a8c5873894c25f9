"""Shared test fixtures: paths to the shared data, and the project root."""

from __future__ import annotations

import pathlib

import pytest
from topo_testkit import SHARED_DIR

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = SHARED_DIR
TOPOLOGIES = sorted((SHARED / "topologies").glob("*.txt"))


@pytest.fixture(scope="session")
def shared_topologies() -> list[pathlib.Path]:
    if not TOPOLOGIES:
        pytest.fail(f"no topology fixtures found under {SHARED / 'topologies'}; "
                    "the checkout needs ../shared beside it (or TOPO_DP_SHARED_DIR)")
    return TOPOLOGIES
