"""The prepared-claims checkpoint: atomic, shared safely by two driver instances, refusing damage."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading

import pytest

from plugin.dra.claims.prepared import PreparedClaim, PreparedDevice
from plugin.dra.kubelet.checkpoint import CheckpointError, ClaimCheckpoint


def _cp(tmp_path) -> ClaimCheckpoint:
    return ClaimCheckpoint(str(tmp_path / "checkpoint.json"), str(tmp_path / "serialize.lock"), "topo.dev")


def _claim(uid: str) -> PreparedClaim:
    return PreparedClaim(uid, "ns", f"claim-{uid}",
                         (PreparedDevice("node-a", "gpu-0", ("gpus",), (f"topo.dev/claim={uid}-gpu-0",)),))


async def test_round_trip_and_file_hygiene(tmp_path):
    cp = _cp(tmp_path)
    assert cp.load() == {}
    await cp.update(lambda claims: claims.update(u1=_claim("u1")))
    assert cp.load() == {"u1": _claim("u1")}
    assert stat.S_IMODE(os.stat(cp.path).st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.json", "serialize.lock"]  # no temp file left behind
    data = json.loads(open(cp.path, encoding="utf-8").read())
    assert data["version"] == 1 and data["driver"] == "topo.dev" and list(data["claims"]) == ["u1"]


async def test_a_change_that_fails_writes_nothing(tmp_path):
    cp = _cp(tmp_path)
    await cp.update(lambda claims: claims.update(u1=_claim("u1")))

    def half_way(claims):
        claims["u2"] = _claim("u2")
        raise RuntimeError("preparing failed half-way")

    with pytest.raises(RuntimeError):
        await cp.update(half_way)
    assert list(cp.load()) == ["u1"]


async def test_a_cancelled_caller_neither_tears_the_change_nor_keeps_the_lock(tmp_path):
    cp = _cp(tmp_path)
    started, release = threading.Event(), threading.Event()

    def slow(claims):
        started.set()
        release.wait(60)
        claims["u1"] = _claim("u1")

    task = asyncio.create_task(cp.update(slow))
    await asyncio.to_thread(started.wait, 60)
    task.cancel()  # e.g. the kubelet's deadline passed
    with pytest.raises(asyncio.CancelledError):
        await task
    release.set()
    # The change completes and the lock is free again: the next change goes through.
    await cp.update(lambda claims: claims.update(u2=_claim("u2")))
    assert sorted(cp.load()) == ["u1", "u2"]


@pytest.mark.parametrize("text, message", [
    ('{"version": 1, "claims": {}, "checksum": "bad"}', "checksum mismatch"),
    ('{"version": 9, "claims": {}, "checksum": "x"}', "format version 9"),
    ('{"claims": ', "not a valid checkpoint"),
    ('[]', "not a valid checkpoint"),
])
def test_damaged_files_are_refused_with_the_file_and_the_fix(tmp_path, text, message):
    cp = _cp(tmp_path)
    with open(cp.path, "w", encoding="utf-8") as f:
        f.write(text)
    with pytest.raises(CheckpointError) as e:
        cp.check()
    assert message in str(e.value) and cp.path in str(e.value) and "restart the driver" in str(e.value)


def test_two_instances_never_lose_each_others_claims(tmp_path):
    """Two driver instances (separate file descriptions, separate loops) add claims at the same time."""
    errors: list[BaseException] = []

    def instance(tag: str) -> None:
        async def run() -> None:
            cp = _cp(tmp_path)  # each instance has its own object, lock file descriptor and loop
            for i in range(25):
                await cp.update(lambda claims, i=i: claims.update({f"{tag}-{i}": _claim(f"{tag}-{i}")}))
        try:
            asyncio.run(run())
        except BaseException as e:  # noqa: BLE001 (a thread's failure, asserted empty below)
            errors.append(e)

    threads = [threading.Thread(target=instance, args=(t,)) for t in ("old", "new")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert len(_cp(tmp_path).load()) == 50


async def test_writes_and_pending_sections_are_counted(tmp_path):
    """What the claim preparer relies on: one write per changing update, and knowing when none is running."""
    cp = _cp(tmp_path)
    await cp.update(lambda claims: claims.update(u1=_claim("u1"), u2=_claim("u2")))
    await cp.update(lambda claims: None)  # no change: no write
    assert cp.writes == 1 and sorted(await cp.read()) == ["u1", "u2"] and cp.writes == 1
    started, release = threading.Event(), threading.Event()

    def slow(claims):
        started.set()
        release.wait(60)

    task = asyncio.create_task(cp.update(slow))
    await asyncio.to_thread(started.wait, 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cp.pending == 1  # the caller has gone; its locked section has not finished
    release.set()
    for _ in range(3000):
        if cp.pending == 0:
            break
        await asyncio.sleep(0.01)
    assert cp.pending == 0


def test_nic_networks_and_pods_round_trip_and_old_files_still_read(tmp_path):
    """Issue 21 adds the pods a claim is reserved for and each NIC's pod interface; a checkpoint written by the
    release before (no such keys) must still read, and a GPU-only claim is written exactly as before."""
    from plugin.dra.claims.prepared import NicNetwork, Route

    cp = _cp(tmp_path)
    net = NicNetwork("ens1f0", "net1", ("192.0.2.10/24", "2001:db8::10/64"),
                     (Route("198.51.100.0/24", "192.0.2.1"), Route("203.0.113.0/24")), 9000, "mlx5_0")
    nic = PreparedClaim("u2", "ns", "nic-claim", (PreparedDevice("node-a", "nic-0", ("nic",), ("topo.dev/claim=u2-nic-0",),
                                                                 network=net),), pods=("pod-uid-1",))
    cp.update_sync(lambda claims: claims.update(u1=_claim("u1"), u2=nic))
    assert cp.load() == {"u1": _claim("u1"), "u2": nic}
    assert nic.networks == [(nic.devices[0], net)]
    stored = json.loads(open(cp.path, encoding="utf-8").read())["claims"]
    assert "pods" not in stored["u1"] and "network" not in stored["u1"]["devices"][0]
    # The previous release's file: the same claim, written without the new keys, with its own checksum.
    from plugin.dra.kubelet.checkpoint import _checksum, _encode

    old_body = {"u1": {"uid": "u1", "namespace": "ns", "name": "claim-u1",
                       "devices": [{"pool": "node-a", "device": "gpu-0", "requests": ["gpus"],
                                    "cdi_device_ids": ["topo.dev/claim=u1-gpu-0"]}]}}
    with open(cp.path, "w", encoding="utf-8") as f:
        f.write(_encode({"version": 1, "driver": "topo.dev", "checksum": _checksum(old_body)}, old_body))
    assert cp.load() == {"u1": _claim("u1")}


async def test_what_one_instance_read_never_hides_what_another_wrote_or_damaged(tmp_path):
    """Issue 24: an instance keeps the claims it parsed while the file's bytes stay the same; any change to
    them (the other instance's write, a damaged file) is seen by its next read, locked or not."""
    a, b = _cp(tmp_path), _cp(tmp_path)
    await a.update(lambda claims: claims.update(u1=_claim("u1")))
    assert await a.read() == await b.read() == {"u1": _claim("u1")}
    await b.update(lambda claims: claims.update(u2=_claim("u2")))
    assert await a.read() == {"u1": _claim("u1"), "u2": _claim("u2")}
    assert await a.update(lambda claims: claims.pop("u1")) == _claim("u1")  # a's change starts from b's write
    assert await b.read() == {"u2": _claim("u2")}
    seen = await a.read()
    seen.clear()  # what a read gives is the caller's to change
    assert await a.read() == {"u2": _claim("u2")}
    with open(a.path, "r+", encoding="utf-8") as f:
        f.truncate(os.path.getsize(a.path) // 2)
    with pytest.raises(CheckpointError, match="checkpoint.json"):
        await a.read()
    with pytest.raises(CheckpointError, match="checkpoint.json"):
        await a.update(lambda claims: claims.update(u3=_claim("u3")))
