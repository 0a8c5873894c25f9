"""The few API server calls the program makes (DRA driver, node labels), through lightkube's asyncio client.

Why lightkube (`lightkube` + `lightkube-models` 1.37): the typed models of
resource.k8s.io/v1 as served by a 1.37 API server (ResourceSlice with taints,
binding conditions, counters...; ResourceClaim) and an asyncio client that
runs on our loop, with auth (in-cluster service account, kubeconfig) and TLS
of its own, in a few MB installed. The official `kubernetes` client does the
same but installs about 125 MB of generated code, most of the product image's
size budget. The callers deal in JSON-shaped dicts (what the API
documents); this module converts at the edge with the models' own
`from_dict`/`to_dict`, so nothing else depends on the model classes.

Errors (`plugin.kube.errors`): an error answer of the API server raises a
`KubeApiError` of the type its code means (`KubeNotFound`, `KubeConflict`,
`KubeForbidden`, `KubeInvalid`, or the plain type), with `status` the HTTP
code, `reason` the Status reason (`NotFound`, `Conflict`...) and `message` the
server's own words. No answer at all (refused or reset connection, TLS failure,
timeout) raises `KubeApiUnreachable`, naming the server and what went wrong,
so a caller can stop trying other requests at once instead of waiting for
each to fail the same way.

Connections (issue 24): one client, one pool of kept-alive connections for
every call. httpx keeps an idle connection only 5 s by default, and the
kubelet's prepare calls come seconds to minutes apart, so nearly every claim
read opened a new TCP (and TLS) connection; `KEEPALIVE_S` keeps one for a
minute, below the idle timeouts of API servers and load balancers. A
connection the server closed while idle is seen by the pool before reuse (its
socket reads EOF) and replaced; one closed at the moment a read is sent on it
fails that read with no answer at all, so the reads (`GET`, idempotent) are
tried once more on a new connection. A refused connection or a timeout is not
retried: a dead or hung server still fails fast.

RBAC the DRA driver needs (the chart adds it): `get` nodes; `get` resourceclaims;
`list`, `create`, `update`, `delete` resourceslices; `patch` resourceclaims/status
and, since 1.36, `associated-node:patch` on the synthetic subresource
resourceclaims/driver named after our driver (the NICs' `networkData`, issue 21).
The node labeller (`--fabric-labels-node`) needs `get` and `patch` on nodes.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx2
import yaml
from lightkube import AsyncClient, ConfigError, KubeConfig, SingleConfig
from lightkube.config.client_adapter import verify_cluster
from lightkube.config.kubeconfig import SERVICE_ACCOUNT
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from .errors import KubeApiError, KubeApiUnreachable, KubeConfigError, api_error

__all__ = ["KubeApi", "KubeApiError", "KubeApiUnreachable", "KubeConfigError", "call", "in_cluster_api",
           "kubeconfig_api"]

T = TypeVar("T")

#: Seconds an idle connection to the API server is kept for the next call (httpx's default: 5).
KEEPALIVE_S = 60.0
#: The pool: `PrepareLimits.reads_per_call` reads in flight per call stay well below it.
LIMITS = httpx2.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S)
#: No answer because the connection went away under the request (the server closed a kept-alive connection
#: as the request arrived, or reset it): a read is tried again once. Not a refused connection, not a timeout.
_LOST = (httpx2.RemoteProtocolError, httpx2.ReadError, httpx2.WriteError)


async def _call(request: Awaitable[T]) -> T:
    try:
        return await request
    except httpx2.HTTPStatusError as e:  # lightkube's ApiError is one; so is an answer it could not decode
        status = _status_body(e.response)
        raise api_error(e.response.status_code, status.get("reason") or e.response.reason_phrase,
                        status.get("message") or "") from e
    except httpx2.TransportError as e:
        what = "no answer in time" if isinstance(e, httpx2.TimeoutException) else "no connection"
        raise KubeApiUnreachable(f"the API server{_server(e)} is unreachable ({what}: "
                                 f"{type(e).__name__}{': ' + str(e) if str(e) else ''})") from e


async def call(request: Awaitable[T]) -> T:
    """One request of `KubeApi.client` made outside this module (the NodeResourceTopology calls, on a resource
    lightkube has no model for): its answer, or the error typed as every other call's (`plugin.kube.errors`),
    so their callers ask `KubeNotFound`, not the HTTP code."""
    return await _call(request)


async def _read(request: Callable[[], Awaitable[T]]) -> T:
    """`_call` for an idempotent read, sent once more when its connection was lost under it (see `_LOST`)."""
    try:
        return await _call(request())
    except KubeApiUnreachable as e:
        if not isinstance(e.__cause__, _LOST):
            raise
    return await _call(request())


def _server(e: httpx2.TransportError) -> str:
    """` at scheme://host:port` of the failed request, when the error carries one."""
    try:
        url = e.request.url
    except RuntimeError:  # raised outside a request
        return ""
    return f" at {url.scheme}://{url.netloc.decode()}"


def _status_body(response: httpx2.Response) -> dict[str, Any]:
    """The Status object of an error answer; lightkube decodes it only when the Content-Type is exactly
    application/json, and a proxy in between may add a charset or answer with a page of its own."""
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


class KubeApi:
    """The calls, each failing with one of `plugin.kube.errors`; `client` is lightkube's, for tests."""

    def __init__(self, client: AsyncClient):
        self.client = client

    async def node_uid(self, name: str) -> str:
        node = await _read(lambda: self.client.get(Node, name))
        if node.metadata is None or not node.metadata.uid:
            raise ValueError(f"the API server's Node {name} has no metadata.uid")
        return node.metadata.uid

    async def list_slices(self, node_name: str, driver: str) -> list[dict[str, Any]]:
        found = self.client.list(ResourceSlice, fields={"spec.nodeName": node_name, "spec.driver": driver})

        async def collect() -> list[dict[str, Any]]:
            return [s.to_dict() async for s in found]

        return await _call(collect())

    async def create_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        created = await _call(self.client.create(ResourceSlice.from_dict(obj)))
        return created.to_dict()

    async def replace_slice(self, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT with the object's metadata.resourceVersion: a concurrent change gives 409 Conflict."""
        replaced = await _call(self.client.replace(ResourceSlice.from_dict(obj)))
        return replaced.to_dict()

    async def delete_slice(self, name: str) -> None:
        try:
            await _call(self.client.delete(ResourceSlice, name))
        except KubeApiError as e:
            if e.status != 404:
                raise

    async def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        claim = await _read(lambda: self.client.get(ResourceClaim, name, namespace=namespace))
        return claim.to_dict()

    async def apply_claim_status(self, namespace: str, name: str, devices: list[dict[str, Any]],
                                 field_manager: str) -> None:
        """Server-side apply of the claim's `status.devices` entries that `field_manager` (our driver name) owns.

        Why apply and not a merge patch: `status.devices` is a map list keyed by driver, pool, device (and
        shareID), whose entries belong to the driver that wrote them; an apply sets exactly ours, leaves any
        other driver's alone, and drops the entries we owned but no longer list (`devices=[]` clears ours).
        `force`: the entries are ours by definition (`driver` is our name), so a conflict with another
        manager (a person's `kubectl edit`) is resolved in our favour.
        """
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": name, "namespace": namespace}, "status": {"devices": devices}}
        await _call(self.client.patch(ResourceClaim.Status, name, body, namespace=namespace,
                                      patch_type=PatchType.APPLY, field_manager=field_manager, force=True))

    async def patch_node_labels(self, node: str, labels: dict[str, str | None]) -> None:
        """A JSON merge patch of the Node's labels: only the keys named change (`None` removes one), so labels
        others own are untouched and no read-modify-write race with them exists."""
        await _call(self.client.patch(Node, node, {"metadata": {"labels": labels}}, patch_type=PatchType.MERGE))

    async def close(self) -> None:
        await self.client.close()


def _api(load: Callable[[], KubeConfig | SingleConfig | None], where: str) -> KubeApi:
    try:
        config = load()
        if config is None:  # lightkube's KubeConfig.get(): no such context and no current-context
            raise ValueError("no context to use (set current-context in the file or name a context)")
        transport = _transport(config)
    except (ConfigError, OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        raise KubeConfigError(f"{where}: {type(e).__name__}: {e}") from None
    return KubeApi(AsyncClient(config, lazy=False, transport=transport))


def _transport(config: KubeConfig | SingleConfig) -> httpx2.AsyncHTTPTransport:
    """The client's connection pool with our keep-alive (`LIMITS`). lightkube takes a transport but then
    leaves TLS to it, so the server's CA and the client certificate are set here as lightkube would."""
    single = config.get() if isinstance(config, KubeConfig) else config
    if single is None:
        raise ValueError("no context to use (set current-context in the file or name a context)")
    verify = verify_cluster(single.cluster, single.user, single.abs_file) if single.user else True
    return httpx2.AsyncHTTPTransport(verify=verify, limits=LIMITS)


async def in_cluster_api(service_account: str = SERVICE_ACCOUNT) -> KubeApi:
    """The API through the pod's service account (what the DaemonSet uses).

    The token file is re-read when the API server answers 401 (the kubelet
    rotates projected service account tokens); the CA is the service
    account's ca.crt; the address comes from KUBERNETES_SERVICE_HOST/PORT.
    """
    missing = [v for v in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT") if not os.environ.get(v)]
    if missing:
        raise KubeConfigError(f"not running in a pod: {' and '.join(missing)} not set "
                              "(give a kubeconfig file to run outside the cluster)")
    return _api(lambda: KubeConfig.from_service_account(service_account),
                f"in-cluster configuration from {service_account}")


async def kubeconfig_api(path: str, context: str | None = None) -> KubeApi:
    """The API as a kubeconfig file says (tests, e2e, the driver run outside the cluster).

    `context` None: the file's current-context.
    """
    return _api(lambda: KubeConfig.from_file(path).get(context), f"kubeconfig {path}")
