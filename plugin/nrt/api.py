"""The NodeResourceTopology calls, through the one Kubernetes API client (`plugin.kube.client`).

Why a module of its own: the object is a custom resource (lightkube has no
model for it; a generic resource of `topology.node.k8s.io/v1alpha2`), and the
publisher needs four calls and the Node's UID (for the owner reference).
Imported only with `--nrt` (lightkube).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from lightkube.generic_resource import create_global_resource

from ..kube.client import KubeApi, call, in_cluster_api, kubeconfig_api
from ..kube.errors import KubeNotFound
from .build import API_VERSION, KIND

GROUP, VERSION = API_VERSION.split("/")
PLURAL = "noderesourcetopologies"
NodeResourceTopology = create_global_resource(GROUP, VERSION, KIND, PLURAL)


class NrtApi(Protocol):
    """What the writer calls; the API server's refusals as `plugin.kube.errors` types (`KubeNotFound`, ...)."""

    async def node_uid(self, name: str) -> str: ...
    async def get(self, name: str) -> dict[str, Any] | None: ...
    async def list(self) -> list[dict[str, Any]]: ...
    async def create(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]: ...
    async def delete(self, name: str) -> None: ...
    async def close(self) -> None: ...


class LightkubeNrtApi:
    def __init__(self, api: KubeApi):
        self.api = api

    async def node_uid(self, name: str) -> str:
        return await self.api.node_uid(name)

    async def get(self, name: str) -> dict[str, Any] | None:
        try:
            found = await call(self.api.client.get(NodeResourceTopology, name))
        except KubeNotFound:
            return None
        return dict(found.to_dict())

    async def list(self) -> list[dict[str, Any]]:
        """Every node's object (`explain --cluster`)."""
        async def collect() -> list[dict[str, Any]]:
            return [dict(o.to_dict()) async for o in self.api.client.list(NodeResourceTopology)]

        return await call(collect())

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return dict((await call(self.api.client.create(NodeResourceTopology.from_dict(obj)))).to_dict())

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        return dict((await call(self.api.client.replace(NodeResourceTopology.from_dict(obj)))).to_dict())

    async def delete(self, name: str) -> None:
        try:
            await call(self.api.client.delete(NodeResourceTopology, name))
        except KubeNotFound:
            pass  # already gone: what delete wanted

    async def close(self) -> None:
        await self.api.close()


async def connect_nrt_api() -> NrtApi:
    """The pod's service account, or KUBECONFIG outside a pod (as the DRA driver and node labeller do)."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") or not os.environ.get("KUBECONFIG"):
        api = await in_cluster_api()
    else:
        api = await kubeconfig_api(os.environ["KUBECONFIG"])
    return LightkubeNrtApi(api)
