"""Fixtures for the NodeResourceTopology tests: the stand-in API server and the publisher's client on it."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "dra"))

from apiserver_standin import write_kubeconfig
from nrt_standin import NrtApiStandIn

NODE = "node-a"


@pytest.fixture
async def nrt_server():
    server = NrtApiStandIn(NODE)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def connect(nrt_server, tmp_path):
    """The publisher's real client (lightkube over HTTP) reaching the stand-in through a kubeconfig."""
    from plugin.kube.client import kubeconfig_api
    from plugin.nrt.api import LightkubeNrtApi

    path = write_kubeconfig(tmp_path / "kubeconfig", nrt_server.url)

    async def make():
        return LightkubeNrtApi(await kubeconfig_api(path))

    return make
