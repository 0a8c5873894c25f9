"""The operator's view: /healthz, /readyz and Prometheus metrics of a running daemon."""

from __future__ import annotations

import asyncio
import socket
import time
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
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(fetch)


async def wait_http(url: str) -> None:
    for _ in range(300):
        try:
            await get(url)
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never answered")


async def poll_http(url: str, until, timeout: float = 30.0) -> tuple[int, str]:
    """GET `url` until `until(code, body)` holds; the last answer. Waits for the state, not for a time."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = await get(url)
        if until(code, body) or time.monotonic() > deadline:
            return code, body
        await asyncio.sleep(0.1)


async def test_ready_only_once_registered_and_metrics_count(plugin_dir, start_daemon):
    from plugin.kubelet_standin import KubeletStandin

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start_daemon("--metrics-address", f"127.0.0.1:{port}")
    await wait_http(base + "/healthz")
    assert (await get(base + "/healthz"))[0] == 200
    code, body = await get(base + "/readyz")  # no kubelet yet: nothing can be registered
    assert code == 503 and "not registered" in body and GPU in body

    kubelet = KubeletStandin(plugin_dir)
    await kubelet.start()
    try:
        await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)), timeout=30)
        # The daemon counts a registration when its Register call returns, which can be after the
        # kubelet's stream has started: wait for the daemon's own view, not for a time.
        code, body = await poll_http(base + "/readyz", lambda c, _: c == 200)
        assert code == 200 and GPU in body
        await kubelet.preferred(GPU, [str(i) for i in range(8)], [], 2)
        await kubelet.restart()
        await kubelet.wait_for(lambda: len(kubelet.registrations_of(GPU)) == 2, timeout=30)
        registered_twice = f'topo_dp_registrations_total{{resource="{GPU}"}} 2.0'
        _, metrics = await poll_http(base + "/metrics", lambda _, b: registered_twice in b)
        assert (await poll_http(base + "/readyz", lambda c, _: c == 200))[0] == 200
    finally:
        await kubelet.stop()
    assert f'topo_dp_devices{{health="Healthy",resource="{GPU}"}} 8.0' in metrics
    assert registered_twice in metrics
    assert "topo_dp_kubelet_restarts_total 1.0" in metrics
    assert f'topo_dp_preferred_allocation_seconds_count{{resource="{GPU}"}} 1.0' in metrics
