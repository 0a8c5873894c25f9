"""The few API server calls the DRA driver makes, through the official client's asyncio API.

Why `kubernetes.aio` (the official `kubernetes` package, 37.x): its generated
`ResourceV1Api` covers resource.k8s.io/v1 as served by a 1.37 API server
(ResourceSlice with taints, binding conditions, counters...; ResourceClaim),
it brings auth (in-cluster service account, kubeconfig), TLS and retries of
its own, and it runs on our asyncio loop without a thread per call. The rest
of plugin/dra/ deals in JSON-shaped dicts (what the API documents); this
module converts at the edge with the client's own (de)serializers, so nothing
else depends on the generated model classes.

RBAC the driver needs (the chart adds it): `get` nodes; `get` resourceclaims;
`list`, `create`, `update`, `delete` resourceslices.
"""

from __future__ import annotations

from typing import Any

from kubernetes.aio import client
from kubernetes.aio.client.exceptions import ApiException

__all__ = ["ApiException", "KubeApi", "in_cluster_api"]


class KubeApi:
    def __init__(self, api_client: client.ApiClient):
        self.api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._resource = client.ResourceV1Api(api_client)

    def _json(self, model: Any) -> Any:
        return self.api_client.sanitize_for_serialization(model)

    async def node_uid(self, name: str) -> str:
        node = await self._core.read_node(name)
        return node.metadata.uid

    async def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        selector = f"spec.nodeName={node_name},spec.driver={driver}"
        result = await self._resource.list_resource_slice(field_selector=selector)
        return [self._json(s) for s in result.items]

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        created = await self._resource.create_resource_slice(client.V1ResourceSlice.from_dict(obj))
        return self._json(created)

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT with the object's metadata.resourceVersion: a concurrent change gives 409 Conflict."""
        replaced = await self._resource.replace_resource_slice(obj["metadata"]["name"],
                                                               client.V1ResourceSlice.from_dict(obj))
        return self._json(replaced)

    async def delete_slice(self, name: str) -> None:
        try:
            await self._resource.delete_resource_slice(name)
        except ApiException as e:
            if e.status != 404:
                raise

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        claim = await self._resource.read_namespaced_resource_claim(name, namespace)
        return self._json(claim)

    async def close(self) -> None:
        await self.api_client.close()


async def in_cluster_api() -> KubeApi:
    """The API through the pod's service account (what the DaemonSet uses)."""
    from kubernetes.aio import config

    config.load_incluster_config()
    return KubeApi(client.ApiClient())
