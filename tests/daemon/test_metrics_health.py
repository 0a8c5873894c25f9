"""The operator's view: /healthz, /readyz and Prometheus metrics of a running daemon."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

GPU = "nvidia.com/gpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def get(url: str) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(fetch)


async def wait_http(url: str) -> None:
    for _ in range(100):
        try:
            await get(url)
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered")


async def test_ready_only_once_registered_and_metrics_count(plugin_dir, start_daemon):
    from plugin.demo.kubelet_standin import KubeletStandin

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start_daemon("--metrics-address", f"127.0.0.1:{port}")
    await wait_http(base + "/healthz")
    assert (await get(base + "/healthz"))[0] == 200
    code, body = await get(base + "/readyz")
    assert code == 503 and "not registered" in body and GPU in body

    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    try:
        await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=10)
        # Register returns to us just after the kubelet's stream starts: ready follows within moments
        for _ in range(50):
            code, body = await get(base + "/readyz")
            if code == 200:
                break
            await asyncio.sleep(0.1)
        assert code == 200 and GPU in body
        await kubelet.preferred(GPU, [str(i) for i in range(8)], [], 2)
        await kubelet.restart()
        await kubelet.wait_for(lambda: len(kubelet.registrations_of(GPU)) == 2, timeout=10)
        _, metrics = await get(base + "/metrics")
    finally:
        await kubelet.stop()
    assert f'topo_dp_devices{{health="Healthy",resource="{GPU}"}} 8.0' in metrics
    assert f'topo_dp_registrations_total{{resource="{GPU}"}} 2.0' in metrics
    assert "topo_dp_kubelet_restarts_total 1.0" in metrics
    assert f'topo_dp_preferred_allocation_seconds_count{{resource="{GPU}"}} 1.0' in metrics
