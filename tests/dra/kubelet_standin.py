"""What the kubelet does with a DRA driver, over real gRPC on the driver's real unix sockets.

Modelled on pkg/kubelet/pluginmanager (plugin watcher, operation_generator.go)
and pkg/kubelet/cm/dra/plugin (Kubernetes 1.37):
- find registration sockets in plugins_registry/ (names starting with '.' are
  ignored), dial one, call GetInfo, validate it like the DRA handler does
  (type DRAPlugin, a driver name, an endpoint, a supported service the kubelet
  knows, chosen as the first of the plugin's list the kubelet supports), then
  NotifyRegistrationStatus;
- call NodePrepareResources / NodeUnprepareResources on the advertised endpoint
  with the chosen service version;
- pick the newest DRAResourceHealth service both sides list (optional: none is
  fine) and open its NodeWatchResources stream on the same endpoint
  (dra_plugin_manager.go pickHealthService, dra_plugin.go NodeWatchResources).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import grpc

from plugin.api.pluginregistration.v1 import api_pb2 as reg_pb2
from plugin.api.pluginregistration.v1 import api_pb2_grpc as reg_grpc

#: What a 1.37 kubelet supports, newest first (pkg/kubelet/cm/dra/plugin servicesSupportedByKubelet).
KUBELET_137_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
#: The health services a 1.37 kubelet supports, newest first (healthServicesSupportedByKubelet); 1.36: v1alpha1.
KUBELET_137_HEALTH = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")


class RegistrationRefused(AssertionError):
    pass


@dataclass
class RegisteredPlugin:
    name: str
    endpoint: str
    service: str  # "v1.DRAPlugin" or "v1beta1.DRAPlugin"
    socket: str
    health_service: str | None = None  # "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth" or None

    def watch_health(self, channel: grpc.aio.Channel) -> Any:
        """Open NodeWatchResources on `channel` (to `endpoint`) with the negotiated version: the call,
        iterable over NodeWatchResourcesResponse messages; `.cancel()` ends it as the kubelet does."""
        if self.health_service is None:
            raise AssertionError("the plugin does not list a DRAResourceHealth service the kubelet supports")
        version = self.health_service.split(".", 1)[0]
        pb2 = importlib.import_module(f"plugin.api.drahealth.{version}.api_pb2")
        grpc_mod = importlib.import_module(f"plugin.api.drahealth.{version}.api_pb2_grpc")
        return grpc_mod.DRAResourceHealthStub(channel).NodeWatchResources(pb2.NodeWatchResourcesRequest())

    @property
    def version(self) -> str:
        return self.service.split(".", 1)[0]

    def _modules(self) -> tuple[Any, Any]:
        pb2 = importlib.import_module(f"plugin.api.dra.{self.version}.api_pb2")
        grpc_mod = importlib.import_module(f"plugin.api.dra.{self.version}.api_pb2_grpc")
        return pb2, grpc_mod

    async def prepare(self, *claims: tuple[str, str, str]) -> Any:
        """NodePrepareResources for (namespace, uid, name) claims; the response message."""
        pb2, grpc_mod = self._modules()
        async with grpc.aio.insecure_channel(f"unix:{self.endpoint}") as ch:
            req = pb2.NodePrepareResourcesRequest(claims=[pb2.Claim(namespace=n, uid=u, name=m) for n, u, m in claims])
            return await grpc_mod.DRAPluginStub(ch).NodePrepareResources(req, timeout=45)

    async def unprepare(self, *claims: tuple[str, str, str]) -> Any:
        pb2, grpc_mod = self._modules()
        async with grpc.aio.insecure_channel(f"unix:{self.endpoint}") as ch:
            req = pb2.NodeUnprepareResourcesRequest(claims=[pb2.Claim(namespace=n, uid=u, name=m)
                                                            for n, u, m in claims])
            return await grpc_mod.DRAPluginStub(ch).NodeUnprepareResources(req, timeout=45)


def registration_sockets(kubelet_root: str) -> list[str]:
    d = os.path.join(kubelet_root, "plugins_registry")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if not n.startswith(".") and n.endswith(".sock"))


async def register(socket_path: str, kubelet_services: tuple[str, ...] = KUBELET_137_SERVICES,
                   kubelet_health: tuple[str, ...] = KUBELET_137_HEALTH) -> RegisteredPlugin:
    async with grpc.aio.insecure_channel(f"unix:{socket_path}") as ch:
        stub = reg_grpc.RegistrationStub(ch)
        info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=1)  # the kubelet allows one second
        endpoint = info.endpoint or socket_path
        chosen = next((s for s in info.supported_versions if s in kubelet_services), None)
        problem = None
        if info.type != "DRAPlugin":
            problem = f"no handler registered for plugin type: {info.type}"
        elif not info.name:
            problem = "DRA driver name is empty"
        elif chosen is None:
            problem = f"none of services supported by the plugin ({list(info.supported_versions)}) are supported"
        elif not os.path.isabs(endpoint):
            problem = f"endpoint {endpoint} is not absolute"
        await stub.NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=problem is None, error=problem or ""), timeout=10)
        if problem:
            raise RegistrationRefused(problem)
        health = next((s for s in kubelet_health if s in info.supported_versions), None)
        return RegisteredPlugin(info.name, endpoint, chosen, socket_path, health)
