"""A ResourceClaim parsed once (plugin/dra/claims/claim.py) and the one reader of opaque config under it.

What a user would notice: a subrequest of a prioritized list whose own config is not applied (the result's
subrequest lost on the way), a NicConfig or GpuConfig error that points at the wrong entry of their claim,
another driver's config taken for ours, or a half-written claim that crashes the driver instead of being
refused with a reason. The claims here are what the API server returns (`status.allocation` as the scheduler
writes it); the NIC plan and the time-slicing read the same parse.
"""

from __future__ import annotations

import pytest

from allocator.topology import Device, DeviceKind
from plugin.dra.claims.claim import AllocationResult, DeviceRequest, parse_claim
from plugin.dra.claims.gpu_config import API_VERSION as GPU_API, KIND as GPU_KIND
from plugin.dra.claims.sharing import GpuSharing, SharingRefused, SimulatedTimeSlice
from plugin.dra.network.nic_config import API_VERSION as NIC_API, KIND as NIC_KIND, NicConfigError, PlanLimits, \
    nic_plan

DRIVER = "topo.dev"


def prioritized_claim() -> dict:
    """A claim with a prioritized-list GPU request, a NIC request, configs of two kinds and of another driver."""
    return {
        "metadata": {"namespace": "team", "name": "train", "uid": "u-1"},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "firstAvailable": [{"name": "fast", "deviceClassName": "gpu.topo.dev"},
                                               {"name": "slow", "deviceClassName": "gpu.topo.dev"}]},
            {"name": "nic", "exactly": {"deviceClassName": "nic.topo.dev"}},
        ]}},
        "status": {
            "allocation": {"devices": {
                "results": [
                    {"request": "gpu/fast", "driver": DRIVER, "pool": "node-a", "device": "gpu-0"},
                    {"request": "nic", "driver": DRIVER, "pool": "node-a", "device": "nic-0", "shareID": "s1"},
                    {"request": "other", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-0"},
                ],
                "config": [
                    {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {
                        "apiVersion": GPU_API, "kind": GPU_KIND, "sharing": {"strategy": "TimeSlicing"}}}},
                    {"source": "FromClaim", "requests": ["gpu/fast"], "opaque": {"driver": DRIVER, "parameters": {
                        "apiVersion": GPU_API, "kind": GPU_KIND,
                        "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}}},
                    {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com", "parameters": {"kind": "X"}}},
                    {"source": "FromClaim", "requests": ["nic"], "opaque": {"driver": DRIVER, "parameters": {
                        "apiVersion": NIC_API, "kind": NIC_KIND, "mtu": 40}}},
                ],
            }},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"},
                            {"resource": "jobs", "apiGroup": "batch", "name": "j", "uid": "job-1"}],
        },
    }


def test_requests_results_configs_and_pods_are_parsed_with_the_subrequest_each_result_came_from():
    claim = parse_claim(prioritized_claim())
    assert (claim.namespace, claim.name, claim.uid) == ("team", "train", "u-1")
    assert claim.requests == (DeviceRequest("gpu", ("fast", "slow")), DeviceRequest("nic"))
    assert claim.results_of(DRIVER) == (
        AllocationResult("gpu", "fast", DRIVER, "node-a", "gpu-0"),
        AllocationResult("nic", "", DRIVER, "node-a", "nic-0", share_id="s1"))
    assert [r.request_path for r in claim.results_of(DRIVER)] == ["gpu/fast", "nic"]
    assert claim.reserved_pods == ("pod-1",)
    # Opaque configs by driver and kind; each knows where it is in the status and where its author wrote it.
    ours = claim.opaque(DRIVER)
    assert [(c.index, c.kind) for c in ours] == [(0, GPU_KIND), (1, GPU_KIND), (3, NIC_KIND)]
    assert [c.index for c in claim.opaque(DRIVER, kinds=(NIC_KIND,))] == [3]
    assert [c.authored_where for c in ours] == ["config[0] from the DeviceClass", "spec.devices.config[0]",
                                                "spec.devices.config[2]"]
    assert [c.index for c in claim.opaque("gpu.nvidia.com")] == [2]


@pytest.mark.parametrize("raw", [
    {},
    {"metadata": {"uid": "u-1"}},
    {"metadata": {"uid": "u-1"}, "status": None},
    {"metadata": {"uid": "u-1"}, "status": {"allocation": {"devices": {"results": "not a list", "config": 7}}}},
    {"metadata": {"uid": "u-1"}, "status": {"allocation": {"devices": {"results": [None, 3],
                                                                       "config": [None, {"source": "FromClaim"}]}},
                                            "reservedFor": [{"resource": "pods"}]}},
], ids=["empty", "no-status", "null-status", "wrong-types", "junk-entries"])
def test_a_half_written_claim_parses_to_nothing_allocated_rather_than_raising(raw):
    """The preparer then refuses it with its usual reason ("has no devices allocated from driver ...")."""
    claim = parse_claim(raw)
    assert claim.results == () and claim.configs == () and claim.reserved_pods == ()


def _device(name: str, kind: DeviceKind, **attributes: str) -> Device:
    return Device(name=name, kind=kind, index=0, numa=0, attributes=attributes)


def test_gpu_and_nic_configs_come_from_the_one_parse_with_their_own_names_in_errors(tmp_path):
    """The subrequest's own GpuConfig wins over the class's; the NicConfig's error names the claim's own entry
    (spec.devices.config[2]) while GpuConfig errors name the status entry, as before the one reader."""
    claim = parse_claim(prioritized_claim())
    gpu, nic = _device("GPU0", DeviceKind.GPU), _device("NIC0", DeviceKind.NIC, netdev="ens1")
    allocated = [("gpu-0", gpu, ["gpu"]), ("nic-0", nic, ["nic"])]
    sharing = GpuSharing(DRIVER, SimulatedTimeSlice(str(tmp_path / "timeslice.json")))  # `wanted` applies nothing
    wanted = sharing.wanted(claim, allocated)
    assert {k: v.value for k, v in wanted.items()} == {"gpu-0": "Long"}
    with pytest.raises(NicConfigError, match=r"ResourceClaim team/train: spec\.devices\.config\[2\]\.opaque\.parameters"
                                             r"\.mtu: 40 is not an MTU"):
        nic_plan("team/train", claim, DRIVER, allocated, lambda _: 9000, PlanLimits())
    bad = prioritized_claim()
    bad["status"]["allocation"]["devices"]["config"][1]["opaque"]["parameters"]["sharing"]["strategy"] = "Fractional"
    with pytest.raises(SharingRefused, match=r"status\.allocation\.devices\.config\[1\] \(FromClaim\)\.opaque"
                                             r"\.parameters\.sharing\.strategy: 'Fractional' is not a sharing strategy"):
        sharing.wanted(parse_claim(bad), allocated)
