"""Shared test fixtures: paths to the shared data, and the project root."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
TOPOLOGIES = sorted((SHARED / "topologies").glob("*.txt"))


@pytest.fixture(scope="session")
def shared_topologies() -> list[pathlib.Path]:
    if not TOPOLOGIES:
        pytest.fail(f"no topology fixtures found under {SHARED / 'topologies'}; the checkout needs ../shared beside it")
    return TOPOLOGIES
