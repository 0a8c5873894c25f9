"""The bound on time-slicing replicas: why it is what it is, and how a config past it is refused.

Both directions of the kubelet protocol carry a whole resource in one message: the kubelet's
GetPreferredAllocation lists every free replica (the daemon reads requests up to 1 MiB), and our
ListAndWatch sends the whole list (the kubelet reads up to 4 MiB: grpc-go's default, which it
does not change). `MAX_REPLICAS` is checked here against protobuf's own ByteSize for the longest
IDs we can send. A config past the bound is refused before anything is built, naming the file,
line, field `...replicas` and the limit (exit 2 at start-up, "config change ignored" on a live
edit: tests/reliability/test_replica_scale.py).
"""

from __future__ import annotations

import pytest

from plugin.api import api_pb2
from plugin.config import parse_config
from plugin.config.sharing import DAEMON_MAX_REQUEST_BYTES, KUBELET_MAX_MESSAGE_BYTES, MAX_REPLICAS, SharingError
from plugin.model.resources import ResourceOptions, build_resources
from plugin.serving.server import MAX_REQUEST_BYTES, device_message
from plugin.sources.simulated import load_simulated

HEAD = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
#: The longest parent ID we can advertise: a MIG device's UUID as drivers before R470 wrote it.
OLD_MIG_UUID = "MIG-GPU-b8ea3855-276c-c9cb-b366-c6fa655957c5/14/7"
LONGEST = f"{OLD_MIG_UUID}::{MAX_REPLICAS - 1}"


def served(body: str, strategy: str = "uuid") -> dict[str, list[str]]:
    ts = parse_config(HEAD + body, "config.yaml").time_slicing
    options = ResourceOptions(device_id_strategy=strategy, time_slicing=ts)
    return {r.name: [d.id for d in r.devices] for r in build_resources(load_simulated("dgx-a100"), options)}


def test_the_kubelets_largest_request_at_the_bound_fits_what_the_daemon_reads():
    assert DAEMON_MAX_REQUEST_BYTES == MAX_REQUEST_BYTES  # the copy in the config layer is the server's cap
    # The most a GetPreferredAllocation can list: every replica available, and every one must-include too.
    req = api_pb2.PreferredAllocationRequest()
    req.container_requests.add(available_deviceIDs=[LONGEST] * MAX_REPLICAS,
                               must_include_deviceIDs=[LONGEST] * MAX_REPLICAS, allocation_size=MAX_REPLICAS)
    assert req.ByteSize() <= MAX_REQUEST_BYTES, req.ByteSize()
    # ...and the bound is not needlessly low: the same request for a fifth more replicas would not fit.
    more = MAX_REPLICAS * 6 // 5
    over = api_pb2.PreferredAllocationRequest()
    over.container_requests.add(available_deviceIDs=[LONGEST] * more, must_include_deviceIDs=[LONGEST] * more,
                                allocation_size=more)
    assert over.ByteSize() > MAX_REQUEST_BYTES


def test_the_longest_device_list_at_the_bound_fits_the_kubelets_message_with_room():
    longest = api_pb2.Device(ID=LONGEST, health="Unhealthy",
                             topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1023)]))
    msg = api_pb2.ListAndWatchResponse(devices=[longest] * MAX_REPLICAS)
    assert msg.ByteSize() * 4 <= KUBELET_MAX_MESSAGE_BYTES, msg.ByteSize()


def test_the_largest_config_on_an_8_gpu_node_is_served_and_its_list_fits():
    per_gpu = MAX_REPLICAS // 8
    resources = build_resources(load_simulated("dgx-a100"), ResourceOptions(
        device_id_strategy="uuid",
        time_slicing=parse_config(HEAD + f"    - {{name: nvidia.com/gpu, replicas: {per_gpu}}}\n",
                                  "config.yaml").time_slicing))
    (gpu,) = [r for r in resources if r.name == "nvidia.com/gpu"]
    assert len(gpu.devices) == MAX_REPLICAS and gpu.devices[-1].id.endswith(f"::{per_gpu - 1}")
    assert device_message(gpu).ByteSize() * 4 <= KUBELET_MAX_MESSAGE_BYTES


def test_a_count_no_node_can_serve_is_refused_while_reading_the_file():
    with pytest.raises(SharingError) as e:
        parse_config(HEAD + "    - name: nvidia.com/gpu\n      replicas: 1000000000\n", "config.yaml")
    msg = str(e.value)
    assert msg.startswith("config.yaml:6: field sharing.timeSlicing.resources[0].replicas: 1000000000"), msg
    assert f"the {MAX_REPLICAS} replicas one resource may advertise" in msg and "GetPreferredAllocation" in msg
    assert f"(fix: lower replicas so that replicas x the devices the entry shares stays within {MAX_REPLICAS}" in msg


@pytest.mark.parametrize("body, words", [
    # 8 GPUs x 1,001 = 8,008 in one resource
    (f"    - {{name: nvidia.com/gpu, replicas: {MAX_REPLICAS // 8 + 1}}}\n",
     f"resources[0].replicas: {MAX_REPLICAS // 8 + 1} replicas of 8 devices make {8 * (MAX_REPLICAS // 8 + 1)} "
     f"nvidia.com/gpu devices, more than the {MAX_REPLICAS} one resource may advertise"),
    # two entries of one resource (per-GPU counts) add up
    (f"    - {{name: nvidia.com/gpu, replicas: {MAX_REPLICAS // 4}, devices: [0, 1, 2, 3], rename: s}}\n"
     f"    - {{name: nvidia.com/gpu, replicas: 2, devices: [4, 5, 6, 7], rename: s}}\n",
     f"resources[1].replicas: 2 replicas of 4 devices make {MAX_REPLICAS + 8} (with {MAX_REPLICAS} of earlier "
     f"entries) nvidia.com/s devices"),
    # two renamed resources, each within the bound, past it together
    (f"    - {{name: nvidia.com/gpu, replicas: {MAX_REPLICAS // 4}, devices: [0, 1, 2, 3], rename: a}}\n"
     f"    - {{name: nvidia.com/gpu, replicas: 3, devices: [4, 5, 6, 7], rename: b}}\n",
     f"resources[1].replicas: 3 replicas of 4 devices make {MAX_REPLICAS + 12} (with {MAX_REPLICAS} of earlier "
     f"entries) replicas on this node in all, more than the {MAX_REPLICAS} the daemon serves"),
])
def test_a_node_past_the_bound_is_refused_naming_the_entry_and_the_room_left(body, words):
    with pytest.raises(SharingError) as e:
        served(body)
    msg = str(e.value)
    assert words in msg and "config.yaml:" in msg and "(fix: replicas: " in msg, msg


def test_the_bound_itself_is_served():
    quarter = MAX_REPLICAS // 4
    res = served(f"    - {{name: nvidia.com/gpu, replicas: {quarter // 2}, devices: [0, 1, 2, 3], rename: a}}\n"
                 f"    - {{name: nvidia.com/gpu, replicas: {quarter // 2}, devices: [4, 5, 6, 7], rename: b}}\n",
                 strategy="index")
    assert len(res["nvidia.com/a"]) + len(res["nvidia.com/b"]) == MAX_REPLICAS
    assert res["nvidia.com/b"][-1] == f"7::{quarter // 2 - 1}"
