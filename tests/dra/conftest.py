"""Fixtures for the DRA tests: the stand-in API server, the driver's API client pointed at it, topologies."""

from __future__ import annotations

import pathlib
import sys

import pytest

from plugin.sources.simulated import load_simulated

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from apiserver_standin import ApiServerStandIn, write_kubeconfig
from claim_validation import build_validator

NODE = "node-a"


@pytest.fixture
async def apiserver():
    server = ApiServerStandIn(NODE)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def kube_api(apiserver, tmp_path):
    """The driver's API client as the kubeconfig path option (tests, e2e) builds it."""
    from plugin.kube.client import kubeconfig_api

    api = await kubeconfig_api(write_kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    yield api
    await api.close()


@pytest.fixture
def dgx_h100():
    return load_simulated("dgx-h100")


@pytest.fixture(scope="session")
def claim_validator() -> str:
    """The 1.37 API server's ResourceClaim status-update check (claim_validation.py); skips without Go."""
    return build_validator()
