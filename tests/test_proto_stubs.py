"""The committed gRPC stubs match api.proto, and api.proto matches the kubelet's wire format."""

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
    for fresh in gen.generate(tmp_path):
        committed = ROOT / "plugin" / "api" / fresh.name
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


def test_messages_match_the_kubelet_wire_format():
    desc = api_pb2.DESCRIPTOR
    assert desc.package == "v1beta1"
    assert set(desc.message_types_by_name) == set(KUBELET_API)
    for name, fields in KUBELET_API.items():
        msg = desc.message_types_by_name[name]
        got = {f.name: (f.number, f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED)
               for f in msg.fields}
        assert got == fields, name


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
