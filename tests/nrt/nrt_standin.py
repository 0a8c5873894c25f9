"""The API server's NodeResourceTopology paths, over real HTTP, for the writer's tests.

What it keeps of the real server: JSON bodies, Status errors (404 NotFound,
409 AlreadyExists on create, 409 Conflict on a stale resourceVersion in a
PUT), a new resourceVersion per write, `Node` get with a UID. It records every
write with the time it arrived (for the coalescing checks: counted, never
timed in a pass/fail test beyond ordering).
"""

from __future__ import annotations

import copy
import itertools
import json
import time
import uuid
from typing import Any

from aiohttp import web

NRT = "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies"


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=json.dumps(obj).encode(), status=status, headers={"Content-Type": "application/json"})


def _status(code: int, reason: str, message: str) -> web.Response:
    return _json({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "reason": reason,
                  "message": message}, code)


class NrtApiStandIn:
    def __init__(self, node: str = "node-a"):
        self.nodes = {node: {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "uid": str(uuid.uuid4())}}}
        self.objects: dict[str, dict[str, Any]] = {}
        #: (method, name, monotonic time) of every write.
        self.writes: list[tuple[str, str, float]] = []
        #: Writes still to refuse with 503 (an API server that is not ready).
        self.refuse_writes = 0
        #: The Status (code, reason, message) every list is answered with instead of the objects: a cluster
        #: without the CRD (404) or an account that may not list them (403).
        self.list_refused: tuple[int, str, str] | None = None
        self._rv = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/api/v1/nodes/{name}", self._get_node)
        app.router.add_get(NRT, self._list)
        app.router.add_get(NRT + "/{name}", self._get)
        app.router.add_post(NRT, self._create)
        app.router.add_put(NRT + "/{name}", self._replace)
        app.router.add_delete(NRT + "/{name}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def put_foreign(self, name: str, manager: str, annotations: dict[str, str] | None = None) -> None:
        """An object another publisher wrote (NFD's topology-updater)."""
        self.objects[name] = {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
                              "metadata": {"name": name, "resourceVersion": str(next(self._rv)),
                                           "annotations": annotations or {},
                                           "managedFields": [{"manager": manager, "operation": "Update"}]},
                              "zones": []}

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(next(self._rv))
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    def _refused(self) -> web.Response | None:
        if self.refuse_writes > 0:
            self.refuse_writes -= 1
            return _status(503, "ServiceUnavailable", "the server is currently unable to handle the request")
        return None

    async def _get_node(self, request: web.Request) -> web.Response:
        node = self.nodes.get(request.match_info["name"])
        return _json(node) if node else _status(404, "NotFound", "node not found")

    async def _list(self, request: web.Request) -> web.Response:
        if self.list_refused is not None:
            return _status(*self.list_refused)
        return _json({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopologyList",
                      "metadata": {"resourceVersion": str(next(self._rv))}, "items": list(self.objects.values())})

    async def _get(self, request: web.Request) -> web.Response:
        obj = self.objects.get(request.match_info["name"])
        return _json(obj) if obj else _status(404, "NotFound", "not found")

    async def _create(self, request: web.Request) -> web.Response:
        obj = await request.json()
        name = obj["metadata"]["name"]
        if (refused := self._refused()) is not None:
            return refused
        if name in self.objects:
            return _status(409, "AlreadyExists", f"noderesourcetopologies \"{name}\" already exists")
        self.writes.append(("POST", name, time.monotonic()))
        return _json(self._store(obj), 201)

    async def _replace(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        obj = await request.json()
        if (refused := self._refused()) is not None:
            return refused
        old = self.objects.get(name)
        if old is None:
            return _status(404, "NotFound", "not found")
        if obj["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
            return _status(409, "Conflict", "the object has been modified")
        self.writes.append(("PUT", name, time.monotonic()))
        return _json(self._store(obj))

    async def _delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        old = self.objects.pop(name, None)
        if old is None:
            return _status(404, "NotFound", "not found")
        self.writes.append(("DELETE", name, time.monotonic()))
        return _json(old)
