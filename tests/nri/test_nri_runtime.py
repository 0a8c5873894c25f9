"""NriPlugin against NRI's real runtime side: containerd/nri v0.8.0 pkg/adaptation, the code containerd v2.1.4 runs.

tests/support/nri_runtime is a small Go program around `adaptation.Adaptation`
listening on a socket in the test's temp dir; the test drives it over
stdin/stdout (JSON lines: add a pod, relay RunPodSandbox/StopPodSandbox/
RemovePodSandbox, quit) and reads what the runtime saw: the plugin's
registration, the synchronization, and the error (or none) each event got
back. So registration, Configure, Synchronize (whole and split), the events
and the error answers are checked by NRI's own Go code, not by our reading of it.

Built once with scripts/go_build_cached.sh (cached under ~/.cache/topo-device-plugin).
Without a Go toolchain the tests skip and say why; TOPO_DP_REQUIRE_NRI_TOOLS=1
(set by .ci/run) turns that into a failure.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from topo_testkit.nri_runtime import Runtime, build

from plugin.backoff import Backoff
from plugin.nri import NriPlugin, PodSandbox

pytestmark = pytest.mark.timeout(900)  # a cold Go build runs inside the first test


@pytest.fixture(scope="module")
def runtime_binary() -> str:
    binary, reason = build()
    if binary:
        return binary
    print(reason, file=sys.stderr)
    if os.environ.get("TOPO_DP_REQUIRE_NRI_TOOLS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


class Recorder:
    """A PodSandboxHandler that records every call; pods named in `fail` make run_pod_sandbox raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: set[str] = set()
        self.fail_syncs = 0  # how many synchronize calls raise before one succeeds
        self.changed = asyncio.Event()

    def _record(self, what: str, arg: Any) -> None:
        self.calls.append((what, arg))
        self.changed.set()

    async def synchronize(self, pods: list[PodSandbox]) -> None:
        self._record("synchronize", pods)
        if self.fail_syncs:
            self.fail_syncs -= 1
            raise RuntimeError("the API server is unreachable")

    async def run_pod_sandbox(self, pod: PodSandbox) -> None:
        self._record("run", pod)
        if pod.name in self.fail:
            raise RuntimeError(f"eth1 cannot move into {pod.netns}: no such namespace")

    async def stop_pod_sandbox(self, pod: PodSandbox) -> None:
        self._record("stop", pod)

    async def remove_pod_sandbox(self, pod: PodSandbox) -> None:
        self._record("remove", pod)

    def syncs(self) -> list[list[PodSandbox]]:
        return [arg for what, arg in self.calls if what == "synchronize"]


POD_A = {"id": "sandbox-a", "uid": "uid-a", "namespace": "team", "name": "trainer-0",
         "netns": "/var/run/netns/cni-aaaa"}
POD_B = {"id": "sandbox-b", "uid": "uid-b", "namespace": "kube-system", "name": "host-net"}  # no netns
PYPOD_A = PodSandbox(uid="uid-a", namespace="team", name="trainer-0", netns="/var/run/netns/cni-aaaa")
PYPOD_B = PodSandbox(uid="uid-b", namespace="kube-system", name="host-net", netns=None)


@pytest.fixture
async def socket_path(tmp_path) -> str:
    return str(tmp_path / "nri" / "nri.sock")


@pytest.fixture
async def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
async def plugin(socket_path, recorder) -> AsyncIterator[NriPlugin]:
    p = NriPlugin(socket_path, recorder, backoff=Backoff(initial=0.05, cap=0.5))
    yield p
    await p.stop()


@pytest.fixture
async def runtime(runtime_binary, socket_path) -> AsyncIterator[Runtime]:
    rt = await Runtime.start(runtime_binary, socket_path)
    yield rt
    await rt.close()


async def test_registers_and_synchronize_delivers_the_pods_the_runtime_knows(runtime, plugin, recorder):
    assert await runtime.command("add_pod", pod=POD_A) == ""
    assert await runtime.command("add_pod", pod=POD_B) == ""
    assert not plugin.connected
    await plugin.start()

    registered = await runtime.next_event("registered")
    assert registered["plugin"] == "10-topo-device-plugin"  # index-name, as containerd lists plugins
    synced = await runtime.next_event("synchronized")
    assert synced == {"event": "synchronized", "pods": ["uid-a", "uid-b"], "error": ""}
    assert recorder.syncs() == [[PYPOD_A, PYPOD_B]]
    assert plugin.connected
    assert (await runtime.next_event("connected"))["plugin"] == "10-topo-device-plugin"


async def test_pod_sandbox_events_reach_the_handler_in_order(runtime, plugin, recorder):
    await runtime.command("add_pod", pod=POD_A)
    await plugin.start()
    await runtime.next_event("connected")  # synchronized, and the events go to it

    assert await runtime.command("run_pod", id="sandbox-a") == ""
    assert await runtime.command("stop_pod", id="sandbox-a") == ""
    assert await runtime.command("remove_pod", id="sandbox-a") == ""
    assert recorder.calls[1:] == [("run", PYPOD_A), ("stop", PYPOD_A), ("remove", PYPOD_A)]


async def test_a_handler_error_is_the_runtimes_error_and_the_plugin_stays_connected(runtime, plugin, recorder):
    await runtime.command("add_pod", pod=POD_A)
    await runtime.command("add_pod", pod=POD_B)
    recorder.fail.add("trainer-0")
    await plugin.start()
    await runtime.next_event("connected")  # synchronized, and the events go to it

    error = await runtime.command("run_pod", id="sandbox-a")
    # What containerd would fail RunPodSandbox with: our plugin, the event, the pod and the reason.
    assert "RUN_POD_SANDBOX of pod team/trainer-0" in error
    assert "eth1 cannot move into /var/run/netns/cni-aaaa: no such namespace" in error
    # The connection survives: the next event is delivered and answered without error.
    assert await runtime.command("run_pod", id="sandbox-b") == ""
    assert recorder.calls[-1] == ("run", PYPOD_B)
    assert runtime.events("closed") == [] and plugin.connected


async def test_a_runtime_restart_reconnects_and_synchronizes_again(runtime_binary, socket_path, plugin, recorder):
    first = await Runtime.start(runtime_binary, socket_path)
    try:
        await first.command("add_pod", pod=POD_A)
        await plugin.start()
        await first.next_event("synchronized")
    finally:
        await first.close()  # containerd exits: the connection drops, the socket goes away
    # ... and comes back, knowing other pods: the plugin reconnects by itself.
    second = await Runtime.start(runtime_binary, socket_path, pods=[POD_B])
    try:
        await second.next_event("registered")
        synced = await second.next_event("synchronized")
        assert synced == {"event": "synchronized", "pods": ["uid-b"], "error": ""}
        assert recorder.syncs() == [[PYPOD_A], [PYPOD_B]]
        await second.next_event("connected")
        # Events flow on the new connection.
        assert await second.command("run_pod", id="sandbox-b") == ""
        assert recorder.calls[-1] == ("run", PYPOD_B)
        assert plugin.connected and plugin.sessions == 2
    finally:
        await second.close()


async def test_a_failed_synchronize_is_reported_then_retried_on_a_new_connection(runtime, plugin, recorder):
    """NRI drops a plugin whose Synchronize failed; the plugin registers again and gets a fresh Synchronize."""
    await runtime.command("add_pod", pod=POD_A)
    recorder.fail_syncs = 1
    await plugin.start()
    failed = await runtime.next_event("synchronized")
    assert "Synchronize of 1 pods: the API server is unreachable" in failed["error"]
    await runtime.next_event("registered")  # the plugin came back
    again = await runtime.next_event("synchronized")
    assert again == {"event": "synchronized", "pods": ["uid-a"], "error": ""}
    assert recorder.syncs() == [[PYPOD_A], [PYPOD_A]] and plugin.connected
    await runtime.next_event("connected")
    assert await runtime.command("run_pod", id="sandbox-a") == ""
    assert recorder.calls[-1] == ("run", PYPOD_A)


async def test_a_plugin_started_before_the_runtime_connects_when_the_socket_appears(
        runtime_binary, socket_path, plugin, recorder):
    await plugin.start()  # nothing listens yet: the plugin keeps retrying, quietly
    rt = await Runtime.start(runtime_binary, socket_path)
    try:
        await rt.next_event("registered")
        assert (await rt.next_event("synchronized"))["pods"] == []
        assert recorder.syncs() == [[]] and plugin.connected
    finally:
        await rt.close()


async def test_a_synchronize_split_over_several_messages_reaches_the_handler_whole(runtime, plugin, recorder):
    """12 pods with 400 kB annotations outgrow one 4 MiB ttrpc message: NRI sends them in parts with `more`."""
    pods = [{"id": f"s{i}", "uid": f"uid-{i}", "namespace": "bulk", "name": f"p{i}", "pad": 400_000}
            for i in range(12)]
    for pod in pods:
        await runtime.command("add_pod", pod=pod)
    await plugin.start()
    synced = await runtime.next_event("synchronized")
    assert synced["error"] == "" and len(synced["pods"]) == 12
    # The runtime did split (its first attempt was refused as oversized), and the handler saw one call.
    assert "(more: true)" in runtime.log() and "(more: false)" in runtime.log()
    (delivered,) = recorder.syncs()
    assert [p.uid for p in delivered] == [f"uid-{i}" for i in range(12)]


async def test_stop_closes_the_connection_and_the_runtime_sees_it(runtime, plugin):
    await plugin.start()
    await runtime.next_event("connected")  # synchronized, and the events go to it
    await plugin.stop()
    assert (await runtime.next_event("closed"))["plugin"] == "10-topo-device-plugin"
    assert not plugin.connected
