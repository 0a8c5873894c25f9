"""Registration and restarts, as the kubelet sees them (real daemon process, real sockets, real inotify)."""

from __future__ import annotations

import asyncio
import os
import stat

import grpc

from plugin.demo.kubelet_standin import _Refused
from topo_testkit.kubelet_standin import KubeletStandin

GPU = "nvidia.com/gpu"
NIC = "topo.dev/nic"


async def registered(kubelet: KubeletStandin, n: int = 1, resource: str = GPU, timeout: float = 10.0) -> None:
    await kubelet.wait_for(
        lambda: len(kubelet.registrations_of(resource)) >= n and bool(kubelet.clients.get(resource))
        and bool(kubelet.clients[resource].devices),
        timeout=timeout,
    )


async def test_registers_each_resource_with_bare_endpoint_and_preferred_option(kubelet, start_daemon, plugin_dir):
    start_daemon()
    await registered(kubelet)
    await registered(kubelet, resource=NIC)
    regs = {r.resource: r for r in kubelet.registrations}
    assert set(regs) == {GPU, NIC}
    for r in regs.values():
        # a bare file name the kubelet joins to its directory, one socket per resource
        assert "/" not in r.endpoint
        path = os.path.join(plugin_dir, r.endpoint)
        st = os.lstat(path)
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o600
        # the kubelet stores the GetDevicePluginOptions answer, which it gets by dialing back
        assert r.options.get_preferred_allocation_available is True
        assert r.options.pre_start_required is False
    assert regs[GPU].endpoint != regs[NIC].endpoint


async def test_lists_all_gpus_with_numa_and_health(kubelet, start_daemon):
    start_daemon()
    await registered(kubelet)
    devs = kubelet.devices(GPU)
    assert sorted(devs, key=int) == [str(i) for i in range(8)]
    assert {i: d.numa for i, d in devs.items()} == {str(i): (i // 4,) for i in range(8)}
    assert {d.health for d in devs.values()} == {"Healthy"}


async def test_waits_for_missing_kubelet_without_busy_looping(plugin_dir, start_daemon):
    daemon = start_daemon()
    await asyncio.sleep(1.0)  # let it start and find no kubelet.sock
    assert daemon.proc.poll() is None, daemon.log()
    cpu_before = _cpu_seconds(daemon.pid)
    await asyncio.sleep(3.0)
    cpu_spent = _cpu_seconds(daemon.pid) - cpu_before
    # An idle wait costs almost nothing; a polling loop would burn a large share of a core.
    assert cpu_spent < 0.5, f"daemon used {cpu_spent:.2f}s CPU in 3s while waiting for the kubelet"
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    try:
        await registered(kubelet, timeout=5.0)
        assert len(kubelet.registrations_of(GPU)) == 1
    finally:
        await kubelet.stop()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def test_twenty_kubelet_restarts_give_one_registration_each(kubelet, start_daemon):
    daemon = start_daemon()
    await registered(kubelet)
    await registered(kubelet, resource=NIC)
    for n in range(2, 22):
        await kubelet.restart()
        await registered(kubelet, n=n)
        await registered(kubelet, n=n, resource=NIC)
        await asyncio.sleep(0.3)  # a late duplicate registration would show up here
        assert len(kubelet.registrations_of(GPU)) == n, daemon.log()[-3000:]
        assert len(kubelet.registrations_of(NIC)) == n
    # never two live streams for one resource, and no old stream ever killed a newer client (#121994)
    assert kubelet.max_live_streams == {GPU: 1, NIC: 1}
    assert kubelet.disconnected_newer == []
    assert not kubelet.client(GPU).stopped
    assert len(kubelet.devices(GPU)) == 8


async def test_own_socket_deleted_re_registers_after_old_stream_ended(kubelet, start_daemon, plugin_dir):
    daemon = start_daemon()
    await registered(kubelet)
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    os.unlink(os.path.join(plugin_dir, endpoint))
    await registered(kubelet, n=2, timeout=10)
    await asyncio.sleep(0.5)
    assert len(kubelet.registrations_of(GPU)) == 2, daemon.log()[-3000:]
    # only the GPU resource restarted
    assert len(kubelet.registrations_of(NIC)) == 1
    # the old stream ended before the new registration, so the kubelet kept the new client
    assert kubelet.disconnected_newer == []
    ended = [t for name, t in kubelet.stream_ends if name == GPU]
    assert ended and ended[0] < kubelet.registrations_of(GPU)[1].at
    assert not kubelet.client(GPU).stopped
    assert os.path.exists(os.path.join(plugin_dir, endpoint))


async def test_sigterm_sends_empty_list_removes_sockets_exits_zero(kubelet, start_daemon, plugin_dir):
    daemon = start_daemon()
    await registered(kubelet)
    await registered(kubelet, resource=NIC)
    sockets = [os.path.join(plugin_dir, r.endpoint) for r in kubelet.registrations]
    client = kubelet.client(GPU)
    updates = client.updates
    assert await daemon.terminate() == 0
    await kubelet.wait_for(lambda: client.updates > updates, timeout=5)
    assert client.devices == {}  # the kubelet drops the devices instead of keeping stale capacity
    for s in sockets:
        assert not os.path.exists(s)
    assert os.path.exists(kubelet.socket_path)  # never touches the kubelet's socket


async def test_kubelet_root_dir_selects_device_plugins_subdir(start_daemon, short_tmp):
    root = short_tmp
    plugin_dir = os.path.join(root, "device-plugins")
    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    try:
        start_daemon("--simulate", "pcie-2socket-4gpu-2nic", "--kubelet-root-dir", root, raw=True)
        await registered(kubelet)
        assert len(kubelet.devices(GPU)) == 4
        assert kubelet.registrations_of(GPU)[0].endpoint in os.listdir(plugin_dir)
    finally:
        await kubelet.stop()


class _RefusingKubelet(KubeletStandin):
    """A kubelet whose first `refusals` Register calls fail, as one still starting its device manager."""

    def __init__(self, plugin_dir: str, refusals: int):
        super().__init__(plugin_dir)
        self.refusals = refusals
        self.refused = 0

    async def _do_register(self, request) -> None:
        if self.refused < self.refusals:
            self.refused += 1
            raise _Refused(grpc.StatusCode.UNAVAILABLE, "device manager not ready (stand-in refusal)")
        await super()._do_register(request)


async def test_a_refused_registration_is_retried_until_accepted_then_once_per_resource(plugin_dir, start_daemon):
    kubelet = _RefusingKubelet(plugin_dir, refusals=6)
    await kubelet.start()
    try:
        daemon = start_daemon()
        await registered(kubelet, timeout=60)
        await registered(kubelet, resource=NIC, timeout=60)
        await asyncio.sleep(0.5)  # a late duplicate registration would show up here
        assert kubelet.refused == 6 and kubelet.register_calls == 6 + 2
        assert [len(kubelet.registrations_of(r)) for r in (GPU, NIC)] == [1, 1]
        assert kubelet.max_live_streams == {GPU: 1, NIC: 1}
        # each refusal is logged with the kubelet's reason, never as a traceback
        log = daemon.log()
        assert "device manager not ready" in log and "Traceback" not in log, log[-3000:]
        assert daemon.proc.poll() is None
    finally:
        await kubelet.stop()
