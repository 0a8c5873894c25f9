"""A small in-process stand-in for the Kubernetes API server, for the DRA driver's API side.

Why a stand-in here: these tests run where no API server exists (the real
single-node cluster proof is tests/e2e). It answers the API's REST paths that
the driver uses (Node get, and Node patch as a JSON merge patch for the fabric
clique label; ResourceSlice list with field selectors, create,
replace, delete; ResourceClaim get, and a server-side apply of a claim's
`status.devices`) over real HTTP, as the API server does:
JSON bodies with `Content-Type: application/json`, errors as Status objects
(404 NotFound, 409 Conflict on a stale resourceVersion in a PUT, 409
AlreadyExists on create), optionally a bearer token to check and TLS. It
keeps the server's rules that the driver relies on: `timeAdded` set on taints
and (with `drop_taints`) the field dropping of a server whose DRADeviceTaints
gate is off; and of server-side apply on `status.devices` (a map list keyed by
driver, pool, device, shareID): an apply sets the entries it lists, owned by
its field manager, removes the entries that manager owned and no longer lists,
keeps every other manager's, and answers 409 Conflict when it would take over
another manager's entry without `force`. What it does not do is validation:
that is checked against the real API server code by tests/dra/validate.

For the reliability tests it can also misbehave as a real one does under
load or in an outage: answer claim reads slowly (`claim_delay_s`), hang them
(`hold_claims`: reads of the claims it selects wait until `release()`, the
way a hung API server accepts a connection and never answers) and fail the
slice calls with an error status (`slice_failure`).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import json
import pathlib
import socket
import ssl
import uuid
from collections.abc import Callable
from typing import Any

import yaml
from aiohttp import web

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


#: What the API server sends with JSON (aiohttp's json_response would add "; charset=utf-8").
JSON = "application/json"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), status=status, headers={"Content-Type": JSON})


def _status(code: int, reason: str, message: str) -> web.Response:
    return _json({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
                  "reason": reason, "message": message}, code)


class ApiServerStandIn:
    def __init__(self, node_name: str = "node-a"):
        self.nodes: dict[str, dict[str, Any]] = {
            node_name: {"apiVersion": "v1", "kind": "Node",
                        "metadata": {"name": node_name, "uid": str(uuid.uuid4())}}}
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.drop_taints = False
        #: The Content-Type of every answer (a proxy in between may change it).
        self.content_type = JSON
        #: When set, requests without `Authorization: Bearer <token>` get 401 (as with a rotated token).
        self.token: str | None = None
        #: The Authorization header of every request, in order.
        self.authorizations: list[str | None] = []
        #: Every mutating request: (method, name).
        self.writes: list[tuple[str, str]] = []
        #: Seconds each ResourceClaim read waits before it is answered (a loaded API server).
        self.claim_delay_s = 0.0
        #: Reads of the claims this selects, by (namespace, name), hang until `release()` (a hung server).
        self.hold_claims: Callable[[str, str], bool] | None = None
        #: ResourceClaim reads received, and those hanging now.
        self.claim_reads = 0
        self.held = 0
        #: When set, every ResourceSlice call (and the Node get) is answered with this HTTP status.
        self.slice_failure: int | None = None
        self._released = asyncio.Event()
        #: Node PATCHes still to refuse with 503 (an API server that is not ready), then served.
        self.refuse_node_patches = 0
        #: Claim status applies still to refuse with 503, then served.
        self.refuse_status_applies = 0
        #: Every claim status apply received: (namespace, name, field manager, force, the applied body).
        self.status_applies: list[tuple[str, str, str, bool, dict[str, Any]]] = []
        #: Who owns each entry of a claim's status.devices: (namespace, name) -> {entry key: field manager}.
        self.device_owners: dict[tuple[str, str], dict[tuple, str]] = {}
        #: Claim reads still to drop when they arrive on a connection that already served a request: the
        #: connection is closed without an answer (a server closing an idle keep-alive connection just as a
        #: request comes in on it).
        self.drop_reused_reads = 0
        #: Connections that carried requests, with how many each (keep-alive: reads share connections).
        self.connections: dict[int, int] = {}
        self._transports: dict[int, asyncio.BaseTransport] = {}
        self._rv = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    # -- test helpers -----------------------------------------------------
    def add_claim(self, namespace: str, name: str, results: list[dict[str, Any]] | None,
                  config: list[dict[str, Any]] | None = None, pods: list[str] | None = None) -> str:
        """A claim allocated `results`; `config`: its spec.devices.config entries (copied into the allocation
        with source FromClaim, as the scheduler does); `pods`: UIDs of the pods it is reserved for."""
        uid = str(uuid.uuid4())
        claim: dict[str, Any] = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                 "metadata": {"name": name, "namespace": namespace, "uid": uid},
                                 "spec": {"devices": {"requests": [], **({"config": config} if config else {})}}}
        if results is not None:
            devices: dict[str, Any] = {"results": results}
            if config:
                devices["config"] = [{"source": "FromClaim", **c} for c in config]
            claim["status"] = {"allocation": {"devices": devices}}
            if pods:
                claim["status"]["reservedFor"] = [{"resource": "pods", "name": f"pod-{p[:8]}", "uid": p}
                                                  for p in pods]
        self.claims[(namespace, name)] = claim
        return uid

    def claim_devices(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The claim's status.devices now."""
        return (self.claims[(namespace, name)].get("status") or {}).get("devices") or []

    def hold(self, select: Callable[[str, str], bool] = lambda ns, name: True) -> None:
        """From now on, reads of the selected claims hang until `release()`."""
        self._released.clear()
        self.hold_claims = select

    def release(self) -> None:
        """Answer the hanging reads (and later ones) again."""
        self.hold_claims = None
        self._released.set()

    def close_idle_connections(self) -> int:
        """Close every open client connection, as a server does with idle keep-alive connections (the
        client sees its socket end); how many were closed."""
        open_ = [t for t in self._transports.values() if not t.is_closing()]
        for t in open_:
            t.close()
        return len(open_)

    def node_uid(self, name: str) -> str:
        return self.nodes[name]["metadata"]["uid"]

    # -- server -------------------------------------------------------------
    @web.middleware
    async def _http(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.authorizations.append(request.headers.get("Authorization"))
        transport = request.transport
        assert transport is not None
        conn = id(transport)
        self._transports[conn] = transport
        served = self.connections.get(conn, 0)
        self.connections[conn] = served + 1
        if served and self.drop_reused_reads > 0 and "/resourceclaims/" in request.path and request.method == "GET":
            self.drop_reused_reads -= 1
            transport.close()  # no status line: the client sees the connection end under its request
            return web.Response()  # never sent
        if self.token is not None and request.headers.get("Authorization") != f"Bearer {self.token}":
            response: web.StreamResponse = _status(401, "Unauthorized", "Unauthorized")
        elif self.slice_failure is not None and "/resourceclaims/" not in request.path:
            response = _status(self.slice_failure, "ServiceUnavailable", "the stand-in was told to fail")
        else:
            response = await handler(request)
        response.headers["Content-Type"] = self.content_type
        return response

    async def start(self, ssl_context: ssl.SSLContext | None = None, sock: socket.socket | None = None) -> str:
        """Serve on a new loopback port, or on `sock` (bound by the caller, so its address is known before)."""
        app = web.Application(middlewares=[self._http])
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_patch("/api/v1/nodes/{name}", self._patch_node)
        app.router.add_get(SLICES, self._list_slices)
        app.router.add_post(SLICES, self._create_slice)
        app.router.add_get(SLICES + "/{name}", self._get_slice)
        app.router.add_put(SLICES + "/{name}", self._replace_slice)
        app.router.add_delete(SLICES + "/{name}", self._delete_slice)
        app.router.add_get("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}", self._get_claim)
        app.router.add_patch("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}/status",
                             self._apply_claim_status)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site: web.BaseSite
        if sock is not None:
            site = web.SockSite(self._runner, sock, ssl_context=ssl_context)
            port = sock.getsockname()[1]
            await site.start()
        else:
            site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=ssl_context)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]
        self.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.release()  # hanging handlers must end, or the clean-up waits for them
        if self._runner is not None:
            await self._runner.cleanup()

    async def _get_node(self, request: web.Request) -> web.Response:
        node = self.nodes.get(request.match_info["name"])
        return _json(node) if node else _status(404, "NotFound", "node not found")

    async def _patch_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        node = self.nodes.get(name)
        if node is None:
            return _status(404, "NotFound", f"nodes \"{name}\" not found")
        if request.content_type != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"the stand-in takes merge patches, not {request.content_type}")
        if self.refuse_node_patches > 0:
            self.refuse_node_patches -= 1
            return _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        self.writes.append(("PATCH", name))
        self.nodes[name] = _merge_patch(node, await request.json())
        return _json(self.nodes[name])

    async def _get_claim(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self.claim_reads += 1
        if self.hold_claims is not None and self.hold_claims(ns, name):
            self.held += 1
            try:
                await self._released.wait()
            finally:
                self.held -= 1
        if self.claim_delay_s:
            await asyncio.sleep(self.claim_delay_s)
        claim = self.claims.get((ns, name))
        if claim is None:
            return _status(404, "NotFound", f"resourceclaims.resource.k8s.io \"{request.match_info['name']}\" not found")
        return _json(claim)

    async def _apply_claim_status(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        claim = self.claims.get((ns, name))
        if claim is None:
            return _status(404, "NotFound", f"resourceclaims.resource.k8s.io \"{name}\" not found")
        if request.content_type != "application/apply-patch+yaml":
            return _status(415, "UnsupportedMediaType", f"the stand-in takes server-side applies on claim status, "
                                                        f"not {request.content_type}")
        manager = request.query.get("fieldManager", "")
        if not manager:
            return _status(422, "Invalid", "fieldManager: Required value: is required for apply patch")
        force = request.query.get("force") == "true"
        body = yaml.safe_load(await request.text())  # the apply body is YAML (JSON is YAML too)
        meta = body.get("metadata") or {}
        if body.get("kind") != "ResourceClaim" or meta.get("name") != name:
            return _status(400, "BadRequest", "the apply body must be the ResourceClaim named in the path")
        if self.refuse_status_applies > 0:
            self.refuse_status_applies -= 1
            return _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        self.status_applies.append((ns, name, manager, force, body))

        def key(d: dict[str, Any]) -> tuple:
            return (d.get("driver"), d.get("pool"), d.get("device"), d.get("shareID"))

        owners = self.device_owners.setdefault((ns, name), {})
        applied = {key(d): d for d in (body.get("status") or {}).get("devices") or []}
        taken = [k for k in applied if owners.get(k, manager) != manager]
        if taken and not force:
            return _status(409, "Conflict", f"Apply failed with 1 conflict: conflict with \"{owners[taken[0]]}\": "
                                            f".status.devices[driver={taken[0][0]},device={taken[0][2]}]")
        status = claim.setdefault("status", {})
        kept = [d for d in status.get("devices") or () if owners.get(key(d)) != manager and key(d) not in applied]
        for k in [k for k, m in owners.items() if m == manager]:
            del owners[k]
        for k in applied:
            owners[k] = manager
        status["devices"] = kept + [copy.deepcopy(d) for d in applied.values()]
        if not status["devices"]:
            del status["devices"]
        claim["metadata"]["resourceVersion"] = str(next(self._rv))
        return _json(claim)

    async def _list_slices(self, request: web.Request) -> web.Response:
        want = {}
        for term in filter(None, request.query.get("fieldSelector", "").split(",")):
            k, _, v = term.partition("=")
            want[k] = v
        items = []
        for s in self.slices.values():
            have = {"spec.nodeName": s["spec"].get("nodeName"), "spec.driver": s["spec"]["driver"],
                    "spec.pool.name": s["spec"]["pool"]["name"]}
            if all(have.get(k) == v for k, v in want.items()):
                items.append(s)
        return _json({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                                  "metadata": {"resourceVersion": str(next(self._rv))}, "items": items})

    def _store(self, obj: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["uid"] = old["metadata"]["uid"] if old else str(uuid.uuid4())
        meta["resourceVersion"] = str(next(self._rv))
        meta["generation"] = (old["metadata"]["generation"] + (old["spec"] != obj["spec"])) if old else 1
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        for d in obj["spec"].get("devices", ()):
            if self.drop_taints:
                d.pop("taints", None)
            for t in d.get("taints", ()):
                t.setdefault("timeAdded", now)
        self.slices[meta["name"]] = obj
        return obj

    async def _create_slice(self, request: web.Request) -> web.Response:
        obj = await request.json()
        name = obj["metadata"].get("name")
        if not name:
            return _status(422, "Invalid", "metadata.name: Required value")
        if name in self.slices:
            return _status(409, "AlreadyExists", f"resourceslices.resource.k8s.io \"{name}\" already exists")
        self.writes.append(("POST", name))
        return _json(self._store(obj, None), status=201)

    async def _get_slice(self, request: web.Request) -> web.Response:
        s = self.slices.get(request.match_info["name"])
        return _json(s) if s else _status(404, "NotFound", "not found")

    async def _replace_slice(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        obj = await request.json()
        old = self.slices.get(name)
        if old is None:
            return _status(404, "NotFound", f"resourceslices.resource.k8s.io \"{name}\" not found")
        if obj["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified; please apply your changes "
                                            "to the latest version and try again")
        self.writes.append(("PUT", name))
        return _json(self._store(obj, old))

    async def _delete_slice(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        old = self.slices.pop(name, None)
        if old is None:
            return _status(404, "NotFound", f"resourceslices.resource.k8s.io \"{name}\" not found")
        self.writes.append(("DELETE", name))
        return _json(old)


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies `application/merge-patch+json`: null removes a key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def write_kubeconfig(path: pathlib.Path, server: str, user: dict | None = None, ca: str | None = None) -> str:
    """A kubeconfig with one cluster, one user and a current context, as kubectl writes it."""
    cluster = {"server": server, **({"certificate-authority": ca} if ca else {})}
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "standin",
              "clusters": [{"name": "standin", "cluster": cluster}],
              "users": [{"name": "driver", "user": user or {"token": "standin-token"}}],
              "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "driver"}}]}
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return str(path)
