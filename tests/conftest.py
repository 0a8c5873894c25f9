"""Shared test fixtures: paths to the shared data, and the project root."""

from __future__ import annotations

import os
import pathlib
import tempfile
from collections.abc import Iterator

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


@pytest.fixture(scope="session", autouse=True)
def private_cdi_spec_dir() -> Iterator[str]:
    """Every daemon a test starts (in-process or as a child) writes CDI specs to a private directory,
    never to the real /var/run/cdi: `--cdi-spec-dir` comes from TOPO_DP_CDI_SPEC_DIR unless a test passes it."""
    with tempfile.TemporaryDirectory(prefix="tdp-cdi-") as d:
        saved = os.environ.get("TOPO_DP_CDI_SPEC_DIR")
        os.environ["TOPO_DP_CDI_SPEC_DIR"] = d
        try:
            yield d
        finally:
            if saved is None:
                os.environ.pop("TOPO_DP_CDI_SPEC_DIR", None)
            else:
                os.environ["TOPO_DP_CDI_SPEC_DIR"] = saved
