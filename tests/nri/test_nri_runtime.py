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
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from plugin.nri import NriPlugin, PodSandbox
from plugin.watch.health import Backoff

BUILD = Path(__file__).resolve().parents[1] / "support" / "nri_runtime" / "build.sh"
#: Generous safety net for one expected event on a busy 2-core machine; never a timing assertion.
WAIT_S = 60.0

pytestmark = pytest.mark.timeout(900)  # a cold Go build runs inside the first test


@pytest.fixture(scope="module")
def runtime_binary() -> str:
    proc = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True)
    if proc.returncode == 0 and proc.stdout.strip():
        return proc.stdout.strip().splitlines()[-1]
    tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
    reason = f"cannot build nri-runtime ({BUILD} exited {proc.returncode}):\n{tail}"
    print(reason, file=sys.stderr)
    if os.environ.get("TOPO_DP_REQUIRE_NRI_TOOLS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


class Runtime:
    """The Go NRI runtime as a subprocess: commands in, replies and events out, in order."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path):
        self.proc = proc
        self.log_path = log_path
        self.lines: list[dict[str, Any]] = []
        self._seen = 0  # lines already handed to a waiter
        self._changed = asyncio.Condition()
        self._pump = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, binary: str, socket_path: str, pods: list[dict[str, Any]] | None = None) -> Runtime:
        """A runtime listening on `socket_path`, knowing `pods` from the start (as after a restart)."""
        log_path = Path(socket_path).parent / f"runtime-{os.urandom(4).hex()}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(binary, "-socket", socket_path, "-pods", json.dumps(pods or []),
                                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        rt = cls(proc, log_path)
        await rt.next_event("listening")
        return rt

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            async with self._changed:
                self.lines.append(json.loads(raw))
                self._changed.notify_all()

    async def _next(self, pred: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first line after the last one returned that satisfies `pred`."""
        async def find() -> dict[str, Any]:
            async with self._changed:
                while True:
                    for i in range(self._seen, len(self.lines)):
                        if pred(self.lines[i]):
                            self._seen = i + 1
                            return self.lines[i]
                    if self.proc.returncode is not None or self._pump.done():
                        raise AssertionError(f"nri-runtime exited waiting for {what}; it said {self.lines}\n"
                                             f"{self.log()}")
                    await self._changed.wait()

        try:
            return await asyncio.wait_for(find(), WAIT_S)
        except TimeoutError:
            raise AssertionError(f"no {what} from nri-runtime; it said {self.lines}\n{self.log()}") from None

    def log(self) -> str:
        """What NRI's runtime logged (stderr)."""
        return self.log_path.read_text(errors="replace")

    async def next_event(self, name: str) -> dict[str, Any]:
        return await self._next(lambda line: line.get("event") == name, f"event {name!r}")

    async def command(self, cmd: str, **fields: Any) -> str:
        """Send a command; the error the runtime got doing it ("" for none)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"cmd": cmd, **fields}) + "\n").encode())
        await self.proc.stdin.drain()
        reply = await self._next(lambda line: line.get("reply") == cmd, f"reply to {cmd}")
        return reply["error"]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == name]

    async def close(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(b'{"cmd": "quit"}\n')
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), WAIT_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        await self._pump


class Recorder:
    """A PodSandboxHandler that records every call; pods named in `fail` make run_pod_sandbox raise."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.fail: set[str] = set()
        self.changed = asyncio.Event()

    def _record(self, what: str, arg: Any) -> None:
        self.calls.append((what, arg))
        self.changed.set()

    async def synchronize(self, pods: list[PodSandbox]) -> None:
        self._record("synchronize", pods)

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


async def test_pod_sandbox_events_reach_the_handler_in_order(runtime, plugin, recorder):
    await runtime.command("add_pod", pod=POD_A)
    await plugin.start()
    await runtime.next_event("synchronized")

    assert await runtime.command("run_pod", id="sandbox-a") == ""
    assert await runtime.command("stop_pod", id="sandbox-a") == ""
    assert await runtime.command("remove_pod", id="sandbox-a") == ""
    assert recorder.calls[1:] == [("run", PYPOD_A), ("stop", PYPOD_A), ("remove", PYPOD_A)]


async def test_a_handler_error_is_the_runtimes_error_and_the_plugin_stays_connected(runtime, plugin, recorder):
    await runtime.command("add_pod", pod=POD_A)
    await runtime.command("add_pod", pod=POD_B)
    recorder.fail.add("trainer-0")
    await plugin.start()
    await runtime.next_event("synchronized")

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
        # Events flow on the new connection.
        assert await second.command("run_pod", id="sandbox-b") == ""
        assert recorder.calls[-1] == ("run", PYPOD_B)
        assert plugin.connected and plugin.sessions == 2
    finally:
        await second.close()


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
    await runtime.next_event("synchronized")
    await plugin.stop()
    assert (await runtime.next_event("closed"))["plugin"] == "10-topo-device-plugin"
    assert not plugin.connected
