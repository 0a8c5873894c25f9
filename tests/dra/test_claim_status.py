"""Our entries of a claim's status.devices: written by server-side apply, in the background, retried, latest wins.

Against the stand-in API server over real HTTP (apiserver_standin.py: server-side apply on status.devices with
field managers); what a real 1.37 API server accepts is checked in test_pod_network.py (claim_validation.py).
"""

from __future__ import annotations

from plugin.dra.claims.status import ClaimStatusWriter, condition, device_entry

DRIVER = "topo.dev"


def nic(device: str, ifname: str) -> dict:
    return device_entry(DRIVER, "node-a", device, [condition(True, "InterfaceAttached", "up")],
                        {"interfaceName": ifname, "ips": ["192.0.2.1/24"], "hardwareAddress": "aa:bb:cc:00:00:01"})


async def test_apply_sets_ours_keeps_another_drivers_and_an_empty_list_clears_ours(apiserver, kube_api):
    apiserver.add_claim("team", "c", [{"request": "r", "driver": DRIVER, "pool": "node-a", "device": "nic-0"},
                                      {"request": "g", "driver": "gpu.example.com", "pool": "n", "device": "gpu-0"}])
    theirs = {"driver": "gpu.example.com", "pool": "n", "device": "gpu-0", "conditions": []}
    await kube_api.apply_claim_status("team", "c", [theirs], "gpu.example.com")
    await kube_api.apply_claim_status("team", "c", [nic("nic-0", "net1")], DRIVER)
    assert {d["driver"] for d in apiserver.claim_devices("team", "c")} == {DRIVER, "gpu.example.com"}
    await kube_api.apply_claim_status("team", "c", [], DRIVER)
    assert apiserver.claim_devices("team", "c") == [theirs]
    assert {(m, force) for _, _, m, force, _ in apiserver.status_applies} == {("gpu.example.com", True), (DRIVER, True)}


async def test_the_writer_retries_until_written_and_only_the_latest_state_is_written(apiserver, kube_api):
    apiserver.add_claim("team", "c", [{"request": "r", "driver": DRIVER, "pool": "node-a", "device": "nic-0"}])
    apiserver.refuse_status_applies = 2  # an API server that is not ready yet
    writer = ClaimStatusWriter(kube_api, DRIVER, retry_initial_s=0.01, retry_max_s=0.05)
    writer.start()
    try:
        writer.set("team", "c", [nic("nic-0", "net1")])
        writer.set("team", "c", [nic("nic-0", "net2")])  # before the first was written: only this one counts
        await writer.flush()
    finally:
        await writer.stop()
    [entry] = apiserver.claim_devices("team", "c")
    assert entry["networkData"]["interfaceName"] == "net2"
    assert (writer.failures, writer.written) == (2, 1)
    assert [body["status"]["devices"][0]["networkData"]["interfaceName"]
            for *_, body in apiserver.status_applies] == ["net2"]


async def test_a_claim_that_is_gone_is_dropped_and_the_others_are_still_written(apiserver, kube_api):
    apiserver.add_claim("team", "here", [{"request": "r", "driver": DRIVER, "pool": "node-a", "device": "nic-0"}])
    writer = ClaimStatusWriter(kube_api, DRIVER, retry_initial_s=0.01)
    writer.start()
    try:
        writer.set("team", "deleted", [nic("nic-1", "net1")])
        writer.set("team", "here", [nic("nic-0", "net1")])
        await writer.flush()
    finally:
        await writer.stop()
    assert writer.failures == 0 and writer.written == 1
    assert [d["device"] for d in apiserver.claim_devices("team", "here")] == ["nic-0"]
