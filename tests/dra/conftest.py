"""Fixtures for the DRA tests: the stand-in API server, the official client pointed at it, topologies."""

from __future__ import annotations

import pathlib
import sys

import pytest

from plugin.sources.simulated import load_simulated

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from apiserver_standin import ApiServerStandIn  # noqa: E402

NODE = "node-a"


@pytest.fixture
async def apiserver():
    server = ApiServerStandIn(NODE)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def kube_api(apiserver):
    from kubernetes.aio import client

    from plugin.dra.kubeapi import KubeApi

    config = client.Configuration(host=apiserver.url)
    api = KubeApi(client.ApiClient(config))
    yield api
    await api.close()


@pytest.fixture
def dgx_h100():
    return load_simulated("dgx-h100")
