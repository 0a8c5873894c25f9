"""The committed gRPC stubs match the .proto files, and those match the kubelet's wire format.

Covered: the device plugin API (v1beta1), the plugin watcher's registration API
(pluginregistration), the kubelet's DRA plugin service (dra v1 and v1beta1, Kubernetes 1.37), its DRA
health stream (dra-health v1 and v1alpha1)
and the kubelet's pod-resources API (podresources v1, Kubernetes 1.37).
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

from plugin.api import api_pb2

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_committed_stubs_are_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (a test dependency) generates the stubs")
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    fresh_files = gen.generate(tmp_path)
    assert any(f.parent.name == "v1beta1" and f.parent.parent.name == "dra" for f in fresh_files)
    assert any(f.parent.name == "v1" and f.parent.parent.name == "podresources" for f in fresh_files)
    for fresh in fresh_files:
        committed = ROOT / "plugin" / "api" / fresh.relative_to(tmp_path)
        assert committed.read_text() == fresh.read_text(), (
            f"{committed} is stale: run `python scripts/gen_proto.py` and commit the result"
        )


# The kubelet's v1beta1 API (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto, 1.28+):
# message -> {field name: (number, repeated)}. Wire compatibility is exactly this.
KUBELET_API = {
    "DevicePluginOptions": {"pre_start_required": (1, False), "get_preferred_allocation_available": (2, False)},
    "RegisterRequest": {"version": (1, False), "endpoint": (2, False), "resource_name": (3, False),
                        "options": (4, False)},
    "Empty": {},
    "ListAndWatchResponse": {"devices": (1, True)},
    "TopologyInfo": {"nodes": (1, True)},
    "NUMANode": {"ID": (1, False)},
    "Device": {"ID": (1, False), "health": (2, False), "topology": (3, False)},
    "PreStartContainerRequest": {"devices_ids": (1, True)},
    "PreStartContainerResponse": {},
    "PreferredAllocationRequest": {"container_requests": (1, True)},
    "ContainerPreferredAllocationRequest": {"available_deviceIDs": (1, True), "must_include_deviceIDs": (2, True),
                                            "allocation_size": (3, False)},
    "PreferredAllocationResponse": {"container_responses": (1, True)},
    "ContainerPreferredAllocationResponse": {"deviceIDs": (1, True)},
    "AllocateRequest": {"container_requests": (1, True)},
    "ContainerAllocateRequest": {"devices_ids": (1, True)},
    "CDIDevice": {"name": (1, False)},
    "AllocateResponse": {"container_responses": (1, True)},
    "ContainerAllocateResponse": {"envs": (1, True), "mounts": (2, True), "devices": (3, True),
                                  "annotations": (4, True), "cdi_devices": (5, True)},
    "Mount": {"container_path": (1, False), "host_path": (2, False), "read_only": (3, False)},
    "DeviceSpec": {"container_path": (1, False), "host_path": (2, False), "permissions": (3, False)},
}


def _wire(desc, expected: dict) -> None:
    assert set(desc.message_types_by_name) == set(expected)
    for name, fields in expected.items():
        msg = desc.message_types_by_name[name]
        got = {f.name: (f.number, f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED)
               for f in msg.fields}
        assert got == fields, name


def test_messages_match_the_kubelet_wire_format():
    assert api_pb2.DESCRIPTOR.package == "v1beta1"
    _wire(api_pb2.DESCRIPTOR, KUBELET_API)


# k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto (1.37): package `pluginregistration`.
REGISTRATION_API = {
    "PluginInfo": {"type": (1, False), "name": (2, False), "endpoint": (3, False), "supported_versions": (4, True)},
    "RegistrationStatus": {"plugin_registered": (1, False), "error": (2, False)},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}

# k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto (1.37); v1 adds Device.share_id = 5 (proto3 optional).
DRA_V1BETA1_API = {
    "NodePrepareResourcesRequest": {"claims": (1, True)},
    "NodePrepareResourcesResponse": {"claims": (1, True)},
    "NodePrepareResourceResponse": {"devices": (1, True), "error": (2, False)},
    "Device": {"request_names": (1, True), "pool_name": (2, False), "device_name": (3, False),
               "cdi_device_ids": (4, True)},
    "NodeUnprepareResourcesRequest": {"claims": (1, True)},
    "NodeUnprepareResourcesResponse": {"claims": (1, True)},
    "NodeUnprepareResourceResponse": {"error": (1, False)},
    "Claim": {"namespace": (1, False), "uid": (2, False), "name": (3, False)},
}
DRA_V1_API = {**DRA_V1BETA1_API, "Device": {**DRA_V1BETA1_API["Device"], "share_id": (5, False)}}


def test_registration_api_matches_the_kubelet():
    from plugin.api.pluginregistration.v1 import api_pb2 as reg

    assert reg.DESCRIPTOR.package == "pluginregistration"
    _wire(reg.DESCRIPTOR, REGISTRATION_API)
    svc = reg.DESCRIPTOR.services_by_name["Registration"]
    # The kubelet's method paths: /pluginregistration.Registration/GetInfo, .../NotifyRegistrationStatus.
    assert svc.full_name == "pluginregistration.Registration"
    assert [m.name for m in svc.methods] == ["GetInfo", "NotifyRegistrationStatus"]
    assert svc.methods_by_name["GetInfo"].input_type.name == "InfoRequest"
    assert svc.methods_by_name["GetInfo"].output_type.name == "PluginInfo"


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_dra_api_matches_the_kubelet(version):
    import importlib

    pb2 = importlib.import_module(f"plugin.api.dra.{version}.api_pb2")
    assert pb2.DESCRIPTOR.package == f"k8s.io.kubelet.pkg.apis.dra.{version}"
    _wire(pb2.DESCRIPTOR, DRA_V1_API if version == "v1" else DRA_V1BETA1_API)
    # The maps are map<string, ...> keyed by claim UID.
    for resp in ("NodePrepareResourcesResponse", "NodeUnprepareResourcesResponse"):
        entry = pb2.DESCRIPTOR.message_types_by_name[resp].fields_by_name["claims"].message_type
        assert entry.GetOptions().map_entry and entry.fields_by_name["key"].type == entry.fields_by_name["key"].TYPE_STRING
    if version == "v1":
        share = pb2.DESCRIPTOR.message_types_by_name["Device"].fields_by_name["share_id"]
        assert share.has_presence  # `optional`: unset and "" differ on the wire
    svc = pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
    # Method paths the kubelet calls: /k8s.io.kubelet.pkg.apis.dra.<version>.DRAPlugin/NodePrepareResources.
    assert svc.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    assert [m.name for m in svc.methods] == ["NodePrepareResources", "NodeUnprepareResources"]
    assert all(not m.client_streaming and not m.server_streaming for m in svc.methods)


# k8s.io/kubelet/pkg/apis/podresources/v1/api.proto (1.37): package `v1`.
_TOPOLOGY = {"topology": (3, False)}
PODRESOURCES_API = {
    "AllocatableResourcesRequest": {},
    "AllocatableResourcesResponse": {"devices": (1, True), "cpu_ids": (2, True), "memory": (3, True)},
    "ListPodResourcesRequest": {},
    "ListPodResourcesResponse": {"pod_resources": (1, True)},
    "PodResources": {"name": (1, False), "namespace": (2, False), "containers": (3, True), "cpu_ids": (4, True),
                     "memory": (5, True)},
    "ContainerResources": {"name": (1, False), "devices": (2, True), "cpu_ids": (3, True), "memory": (4, True),
                           "dynamic_resources": (5, True)},
    "ContainerMemory": {"memory_type": (1, False), "size": (2, False), **_TOPOLOGY},
    "ContainerDevices": {"resource_name": (1, False), "device_ids": (2, True), **_TOPOLOGY},
    "TopologyInfo": {"nodes": (1, True)},
    "NUMANode": {"ID": (1, False)},
    "DynamicResource": {"claim_name": (2, False), "claim_namespace": (3, False), "claim_resources": (4, True)},
    "ClaimResource": {"cdi_devices": (1, True), "driver_name": (2, False), "pool_name": (3, False),
                      "device_name": (4, False), "share_id": (5, False)},
    "CDIDevice": {"name": (1, False)},
    "GetPodResourcesRequest": {"pod_name": (1, False), "pod_namespace": (2, False)},
    "GetPodResourcesResponse": {"pod_resources": (1, False)},
}


def test_podresources_api_matches_the_kubelet():
    from plugin.api.podresources.v1 import api_pb2 as pr

    assert pr.DESCRIPTOR.package == "v1"
    _wire(pr.DESCRIPTOR, PODRESOURCES_API)
    svc = pr.DESCRIPTOR.services_by_name["PodResourcesLister"]
    # The method path the daemon calls: /v1.PodResourcesLister/List.
    assert svc.full_name == "v1.PodResourcesLister"
    assert [m.name for m in svc.methods] == ["List", "GetAllocatableResources", "Get"]
    assert svc.methods_by_name["List"].output_type.name == "ListPodResourcesResponse"


# k8s.io/kubelet/pkg/apis/dra-health/{v1,v1alpha1}/api.proto (1.37): packages `v1` and `v1alpha1`, same messages.
DRA_HEALTH_API = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, False), "device_name": (2, False)},
    "DeviceHealth": {"device": (1, False), "health": (2, False), "last_updated_time": (3, False),
                     "health_check_timeout_seconds": (4, False), "message": (5, False)},
    "NodeWatchResourcesResponse": {"devices": (1, True)},
}


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_dra_health_api_matches_the_kubelet(version):
    import importlib

    pb2 = importlib.import_module(f"plugin.api.drahealth.{version}.api_pb2")
    assert pb2.DESCRIPTOR.package == version
    _wire(pb2.DESCRIPTOR, DRA_HEALTH_API)
    status = pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in status.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
    svc = pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"]
    # What the kubelet matches against PluginInfo.supported_versions, and its method path
    # /<version>.DRAResourceHealth/NodeWatchResources: a server stream.
    assert svc.full_name == f"{version}.DRAResourceHealth"
    (method,) = svc.methods
    assert method.name == "NodeWatchResources" and method.server_streaming and not method.client_streaming


def test_service_method_paths():
    services = api_pb2.DESCRIPTOR.services_by_name
    assert [m.name for m in services["Registration"].methods] == ["Register"]
    assert [m.name for m in services["DevicePlugin"].methods] == [
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"]
    law = services["DevicePlugin"].methods_by_name["ListAndWatch"]
    assert law.server_streaming and not law.client_streaming
    assert services["DevicePlugin"].full_name == "v1beta1.DevicePlugin"


def test_python_path_untouched():
    assert "api_pb2" not in sys.modules  # stubs import relatively, never as a top-level module
