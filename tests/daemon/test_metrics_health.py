"""The operator's view of a running daemon: /healthz, /readyz, Prometheus metrics, and what the
HTTP endpoint does under 1,000 idle connections.

Issue 9, defect 1: the endpoint used to hold a thread and an fd per idle or
half-sent connection, forever (1,000 of them: 1,000 threads, 1,020 fds,
+26 MiB; under a low fd limit gRPC aborted the daemon at the next kubelet
restart). The daemon's threads, fds and RSS are read from /proc; every wait
polls for the state itself with a generous deadline (CI runs on a loaded
2-core machine).
"""

from __future__ import annotations

import asyncio
import resource
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from plugin.observability.http_server import ACCEPT_BATCH, HTTPLimits
from topo_testkit.kubelet_standin import KubeletStandin
from topo_testkit.idle_clients import closed_by_peer, connect_all, open_half_requests
from topo_testkit.procfs import Footprint, footprint

GPU = "nvidia.com/gpu"
NIC = "topo.dev/nic"
IDLE = 1000
SLOW = 20
CAP = HTTPLimits().max_connections
DAEMON_FD_LIMIT = 256


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
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    start_daemon("--metrics-address", f"127.0.0.1:{port}")
    await wait_http(base + "/healthz")
    assert (await get(base + "/healthz"))[0] == 200
    code, body = await get(base + "/readyz")  # no kubelet yet: nothing can be registered
    assert code == 503 and "not registered" in body and GPU in body
    # a typo in a scrape config or probe shows (it used to return the metrics)
    code, body = await get(base + "/metricz")
    assert code == 404 and "/metrics" in body

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


async def eventually(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        await asyncio.sleep(0.1)


class Slowloris(threading.Thread):
    """Clients that each send one more header byte every 0.2 s, never finishing the request."""

    def __init__(self, port: int, n: int):
        super().__init__(name="slowloris", daemon=True)
        self.socks = connect_all(port, n)
        self.sent = [0] * n
        self.stop = threading.Event()

    def run(self) -> None:
        header = b"GET /metrics HTTP/1.1\r\nHost: attacker\r\nX-Slow: " + b"a" * 100_000
        while not self.stop.wait(0.2):
            for i, s in enumerate(self.socks):
                if self.sent[i] >= 0:
                    try:
                        s.send(header[self.sent[i]:self.sent[i] + 1])
                        self.sent[i] += 1
                    except BlockingIOError:
                        pass  # not connected yet
                    except OSError:
                        self.sent[i] = -1  # cut by the server


def dropped(metrics: str, reason: str) -> float:
    prefix = f'topo_dp_http_connections_dropped_total{{reason="{reason}"}} '
    for line in metrics.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix):])
    return 0.0


@pytest.fixture
def many_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = IDLE + SLOW + 1024
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(hard, want)))
        except (ValueError, OSError) as e:
            pytest.fail(f"cannot raise this test's fd limit to {want} for {IDLE} client sockets: {e}")
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_thousand_idle_connections_cost_bounded_threads_fds_and_memory(
        many_fds, plugin_dir, kubelet: KubeletStandin, start_daemon):
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    daemon = start_daemon("--metrics-address", f"127.0.0.1:{port}")
    await kubelet.wait_for(lambda: bool(kubelet.devices(GPU)) and bool(kubelet.devices(NIC)), timeout=60)
    assert (await poll_http(base_url + "/readyz", lambda c, _: c == 200, timeout=60))[0] == 200
    assert daemon.proc.poll() is None, daemon.log()
    # The production failure: with few fds left, gRPC aborted at the next kubelet restart.
    _, hard = resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(daemon.pid, resource.RLIMIT_NOFILE, (DAEMON_FD_LIMIT, hard))
    before = footprint(daemon.pid)
    peak = before

    def sample() -> None:
        nonlocal peak
        now = footprint(daemon.pid)
        peak = Footprint(max(peak.rss_mib, now.rss_mib), max(peak.threads, now.threads), max(peak.fds, now.fds))

    def assert_bounded() -> None:
        sample()
        report = f"daemon before: {before}; peak under {IDLE + SLOW} connections: {peak}"
        print(report)
        assert peak.threads <= before.threads + 8, report  # no thread per connection (before: +1,000)
        # at most the cap, plus cut ones closing on the next loop turn (before: +1,000)
        assert peak.fds <= before.fds + CAP + 2 * ACCEPT_BATCH + 16, report
        assert peak.rss_mib <= before.rss_mib + 12, report  # before: +26 MiB

    idle = await asyncio.to_thread(open_half_requests, port, IDLE)
    slow = Slowloris(port, SLOW)  # the newest connections: they outlive the evictions, so the deadline cuts them
    slow.start()
    try:
        sample()
        # meanwhile: probes, RPCs, a kubelet restart and re-registration
        for path in ("/healthz", "/readyz", "/metrics"):
            code, body = await get(base_url + path)
            assert code == 200, (path, body)
            sample()
        assert len(await kubelet.preferred(GPU, [str(i) for i in range(8)], [], 2)) == 2
        assert (await kubelet.allocate(GPU, ["0", "1"])).envs
        sample()
        await kubelet.restart()
        await kubelet.wait_for(lambda: len(kubelet.registrations_of(GPU)) == 2 and bool(kubelet.devices(GPU))
                               and len(kubelet.registrations_of(NIC)) == 2 and bool(kubelet.devices(NIC)),
                               timeout=60)
        sample()
        assert len(await kubelet.preferred(GPU, [str(i) for i in range(8)], [], 4)) == 4
        # ready again after re-registration
        assert (await poll_http(base_url + "/readyz", lambda c, _: c == 200, timeout=60))[0] == 200
        assert (await get(base_url + "/healthz"))[0] == 200
        assert_bounded()

        # connections beyond the cap were closed, not queued; the rest are cut at the request deadline,
        # the trickling ones included
        await eventually(lambda: all(closed_by_peer(s) for s in idle), "every idle connection closed")
        await eventually(lambda: all(n < 0 for n in slow.sent), "every slowloris connection closed")
        # and no fd is left behind by the ones it cut
        await eventually(lambda: footprint(daemon.pid).fds <= before.fds + 4, "the daemon's fds back to its own")
        assert daemon.proc.poll() is None, daemon.log()
        _, metrics = await get(base_url + "/metrics")
        evicted, timed_out = dropped(metrics, "evicted"), dropped(metrics, "timeout")
        assert evicted >= 1 and timed_out >= 1, metrics
        assert evicted + timed_out >= IDLE + SLOW, metrics  # every attacking connection was cut by the server
    finally:
        slow.stop.set()
        slow.join()
        for s in idle + slow.socks:
            s.close()

    assert_bounded()
    # and the daemon still answers, with its sockets served after all that
    assert (await get(base_url + "/healthz"))[0] == 200
    assert len(await kubelet.preferred(GPU, [str(i) for i in range(8)], [], 2)) == 2
    assert daemon.proc.poll() is None, daemon.log()
