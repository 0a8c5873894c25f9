"""The DRA driver's NodePrepareResources under a big backlog, a departing kubelet, SIGTERM and an API server
in trouble (issue 19), over real gRPC on real unix sockets, with real checkpoint and CDI files.

What a user would notice if these failed: a 1,500-claim prepare that keeps working (and writing) after the
kubelet gave up on it, leaving claims half-prepared; a one-claim pod stuck behind somebody else's big
batch; the device-plugin side of the same process going quiet; a driver pod that takes seconds to stop; a
hung API server making every prepare wait; a pod reported Ready while its devices cannot be published.

The kubelet's DRA side is tests/dra/kubelet_standin.py, the API server tests/dra/apiserver_standin.py
(told to answer slowly, hang or fail). Some tests run the driver in this process (to see when it has
stopped working), the others as a real `serve` child process. No assertion depends on a duration: the
stand-in's read counter is the clock (order of events), and bounds are generous safety nets. The
durations themselves are measured by benchmarks/dra_prepare_bench.py (docs/dra.md, "Hardening").
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import socket
import sys
import urllib.error
import urllib.request

import grpc
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT / "tests" / "dra") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests" / "dra"))

from apiserver_standin import ApiServerStandIn, write_kubeconfig
from kubelet_standin import register, registration_sockets

from plugin.api.dra.v1 import api_pb2 as dra_pb2
from plugin.api.dra.v1 import api_pb2_grpc as dra_grpc
from plugin.dra import DraDriver, DraOptions, SliceOptions
from plugin.dra.kubelet.cdi import ClaimSpecs
from plugin.kube.client import kubeconfig_api
from plugin.dra.kubelet.prepare import PrepareLimits
from plugin.runtime.compose.dra import dra_driver
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(300)

NODE = "node-a"
DRIVER = "topo.dev"
NIC = "topo.dev/nic"
BIG = 1500
#: What the kubelet allows a NodePrepareResources call (pkg/kubelet/cm/dra: 45 s).
KUBELET_DEADLINE_S = 45


# ---- fixtures and helpers -------------------------------------------------------------------------


@pytest.fixture
def roots(short_tmp):
    # unix socket paths are short (tests/conftest.py)
    return os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi")


class CountingCdi(ClaimSpecs):
    """The shipped CDI writer, counting spec writes per claim (a claim prepared twice would show)."""

    def __init__(self, root: str):
        super().__init__(root, DRIVER)
        self.writes: dict[str, int] = {}

    def write_claim_spec(self, claim_uid, devices, settings=None):
        self.writes[claim_uid] = self.writes.get(claim_uid, 0) + 1
        return super().write_claim_spec(claim_uid, devices, settings)


@pytest.fixture
async def driver(roots, apiserver, tmp_path):
    api = await kubeconfig_api(write_kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    started: list[DraDriver] = []

    async def start(limits: PrepareLimits = PrepareLimits()) -> DraDriver:
        opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[0],
                          cdi_root=roots[1], instance_id="pod-1", resync_s=3600, prepare_limits=limits)
        drv = dra_driver(opts, api, cdi=CountingCdi(roots[1]))
        await drv.start(load_simulated("dgx-h100"))
        started.append(drv)
        return drv

    yield start
    for d in started:
        await d.stop()
    await api.close()


def add_claims(apiserver: ApiServerStandIn, prefix: str, n: int) -> list[tuple[str, str, str]]:
    """`n` one-GPU claims `<prefix>-<i>` allocated by the scheduler from our pool: (namespace, uid, name)."""
    out = []
    for i in range(n):
        name = f"{prefix}-{i}"
        uid = apiserver.add_claim("team", name, [{"request": "gpu", "driver": DRIVER, "pool": NODE,
                                                 "device": f"gpu-{i % 8}"}])
        out.append(("team", uid, name))
    return out


async def prepare(endpoint: str, claims: list[tuple[str, str, str]], timeout: float = KUBELET_DEADLINE_S):
    """NodePrepareResources (v1) as the kubelet sends it, with the kubelet's deadline."""
    async with grpc.aio.insecure_channel(f"unix:{endpoint}") as ch:
        req = dra_pb2.NodePrepareResourcesRequest(claims=[dra_pb2.Claim(namespace=n, uid=u, name=m)
                                                          for n, u, m in claims])
        return await dra_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=timeout)


async def until(predicate, what: str, timeout: float = 120.0, proc=None):
    for _ in range(int(timeout / 0.02)):
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the daemon exited (code {proc.returncode}) while waiting for {what}")
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def checkpointed(kubelet_root: str) -> set[str]:
    path = os.path.join(kubelet_root, "plugins", DRIVER, "checkpoint.json")
    if not os.path.exists(path):
        return set()
    with open(path, encoding="utf-8") as f:
        return set(json.load(f)["claims"])


def spec_files(cdi_root: str) -> set[str]:
    prefix = f"{DRIVER}-claim_"
    if not os.path.isdir(cdi_root):
        return set()
    return {n[len(prefix):-len(".json")] for n in os.listdir(cdi_root)
            if n.startswith(prefix) and n.endswith(".json")}


def assert_consistent(roots: tuple[str, str], asked: set[str]) -> set[str]:
    """Every recorded claim has its CDI spec, every spec is recorded, and only asked-for claims are there."""
    recorded, specs = checkpointed(roots[0]), spec_files(roots[1])
    assert recorded == specs, (f"recorded without a spec: {sorted(recorded - specs)[:5]}; "
                               f"a spec without a record: {sorted(specs - recorded)[:5]}")
    assert recorded <= asked
    return recorded


# ---- in-process driver: a departing kubelet, fairness, a hung API server --------------------------


async def test_a_1500_claim_prepare_stops_when_the_kubelets_deadline_passes(driver, roots, apiserver):
    drv = await driver()
    plugin = await register(registration_sockets(roots[0])[0])
    claims = add_claims(apiserver, "big", BIG)
    # The API server stops answering for claims 300 and later: the call cannot finish before its deadline.
    apiserver.hold(lambda ns, name: int(name.rsplit("-", 1)[1]) >= 300)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await prepare(plugin.endpoint, claims, timeout=5)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    print(f"when the deadline passed: {apiserver.claim_reads} claims read, {apiserver.held} reads hanging, "
          f"{len(checkpointed(roots[0]))} prepared")

    # The caller has gone: the driver stops working on the call (the hung reads are never answered).
    await until(lambda: not drv.preparer.busy, "the driver to abandon the call")
    asked = {u for _, u, _ in claims}
    done = assert_consistent(roots, asked)
    assert len(done) < 300  # nothing past the hung reads

    # The kubelet retries with the server back: everything is prepared, nothing twice.
    apiserver.release()
    resp = await prepare(plugin.endpoint, claims)
    assert all(resp.claims[u].error == "" for u in asked)
    assert assert_consistent(roots, asked) == asked
    assert set(drv.cdi.writes) == asked and set(drv.cdi.writes.values()) == {1}


async def test_a_one_claim_prepare_is_answered_before_a_big_backlog(driver, roots, apiserver):
    drv = await driver()
    plugin = await register(registration_sockets(roots[0])[0])
    big_claims = add_claims(apiserver, "big", BIG)
    [one] = add_claims(apiserver, "one", 1)
    big = asyncio.create_task(prepare(plugin.endpoint, big_claims, timeout=240))
    await until(lambda: apiserver.claim_reads >= 100, "the big prepare to be under way")

    small = await prepare(plugin.endpoint, [one])
    backlog_left = BIG - len(checkpointed(roots[0]) - {one[1]})
    big_done_first = big.done()

    assert small.claims[one[1]].error == ""
    assert not big_done_first and backlog_left > 0, "the one-claim call waited for the big backlog"
    resp = await big
    assert all(resp.claims[u].error == "" for _, u, _ in big_claims)
    assert drv.checkpoint.writes < BIG / 10  # a batch per write, not a claim per write


async def test_a_hung_api_server_fails_prepare_promptly_with_the_reason(driver, roots, apiserver):
    limits = PrepareLimits()
    await driver(limits)
    plugin = await register(registration_sockets(roots[0])[0])
    claims = add_claims(apiserver, "c", 100)
    apiserver.hold()  # accepts connections, never answers

    resp = await prepare(plugin.endpoint, claims)  # answered well within the kubelet's deadline
    reason = f"the API server did not answer within {limits.read_timeout_s:g} s"
    for ns, uid, name in claims:
        assert f"reading ResourceClaim {ns}/{name}" in resp.claims[uid].error
        assert reason in resp.claims[uid].error
    # Fail fast: only the first wave of reads was sent; the other claims were not tried one by one.
    assert apiserver.claim_reads <= limits.reads_per_call
    assert assert_consistent(roots, set()) == set()


async def test_an_api_server_that_refuses_connections_fails_prepare_at_once_naming_it(driver, roots, apiserver):
    await driver()
    plugin = await register(registration_sockets(roots[0])[0])
    claims = add_claims(apiserver, "c", 20)
    url = apiserver.url
    await apiserver.stop()
    resp = await prepare(plugin.endpoint, claims)
    for _, uid, _ in claims:
        assert f"the API server at {url} is unreachable (no connection" in resp.claims[uid].error


# ---- a real daemon process: the device-plugin side, SIGTERM, readiness ---------------------------


@pytest.fixture
def dra_daemon(start_daemon, roots, apiserver, tmp_path, monkeypatch):
    """`serve` with the GPUs on DRA and the NICs on the device-plugin API, talking to the stand-ins."""
    monkeypatch.setenv("NODE_NAME", NODE)
    monkeypatch.setenv("POD_UID", "pod-1")
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)

    def start(*args: str):
        return start_daemon("--kubelet-root-dir", roots[0], "--cdi-spec-dir", roots[1],
                            "--dra-resources", "nvidia.com/gpu", *args, simulate="dgx-h100")

    return start


async def dra_plugin(roots, daemon):
    registry = os.path.join(roots[0], "plugins_registry")
    sockets = await until(lambda: os.path.isdir(registry) and registration_sockets(roots[0]),
                          "the DRA registration socket", proc=daemon.proc)
    return await register(sockets[0])


async def test_the_device_plugin_side_keeps_answering_during_a_big_prepare(dra_daemon, kubelet, roots, apiserver):
    daemon = dra_daemon()
    await kubelet.wait_for(lambda: len(kubelet.devices(NIC)) == 8, timeout=60)
    nic = sorted(kubelet.devices(NIC))[0]
    plugin = await dra_plugin(roots, daemon)
    claims = add_claims(apiserver, "big", BIG)
    last = claims[-1][2]
    apiserver.hold(lambda ns, name: name == last)  # the call stays open until the test has seen enough
    big = asyncio.create_task(prepare(plugin.endpoint, claims, timeout=240))

    # Allocate on the device-plugin side over and over while the DRA side works through the backlog;
    # the stand-in's read count at each answer says how far the backlog had got.
    progress_at_answer = []
    while apiserver.held == 0 and not big.done():
        await kubelet.allocate(NIC, [nic])
        progress_at_answer.append(apiserver.claim_reads)
    apiserver.release()
    resp = await big
    assert all(resp.claims[u].error == "" for _, u, _ in claims)
    during = {p for p in progress_at_answer if 0 < p < BIG}
    assert len(during) >= 3, f"device-plugin answers came only at backlog positions {sorted(during)}"
    assert daemon.proc.poll() is None


async def test_sigterm_with_a_backlog_exits_cleanly(dra_daemon, kubelet, roots, apiserver):
    daemon = dra_daemon()
    plugin = await dra_plugin(roots, daemon)
    claims = add_claims(apiserver, "big", BIG)
    last = claims[-1][2]
    apiserver.claim_delay_s = 0.005  # a loaded API server: the backlog drains slowly
    apiserver.hold(lambda ns, name: name == last)  # and the call cannot finish before the signal
    big = asyncio.create_task(prepare(plugin.endpoint, claims, timeout=240))
    await until(lambda: apiserver.claim_reads >= 200, "the big prepare to be under way", proc=daemon.proc)

    daemon.proc.send_signal(signal.SIGTERM)
    assert await daemon.wait(timeout=30) == 0, daemon.log()[-3000:]  # generous; measured: docs/dra.md
    assert registration_sockets(roots[0]) == []
    assert not os.path.exists(plugin.endpoint)
    done = assert_consistent(roots, {u for _, u, _ in claims})
    assert len(done) < BIG
    # The kubelet got an answer saying which claims were prepared and why the others were not (or, where
    # the call was still reading after the grace period, a cancelled call): never a claim reported prepared
    # without its record and spec.
    try:
        resp = await big
    except grpc.aio.AioRpcError as e:
        assert e.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED), e
    else:
        for _, uid, _ in claims:
            error = resp.claims[uid].error
            assert (error == "") == (uid in done), (uid, error)
            assert error == "" or "the DRA driver is stopping" in error, error


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def readyz(port: int) -> tuple[int, str]:
    def fetch() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    return await asyncio.to_thread(fetch)


async def test_readiness_says_why_while_publishing_slices_fails_and_recovers(dra_daemon, kubelet, roots,
                                                                             apiserver):
    apiserver.slice_failure = 503
    port = free_port()
    daemon = dra_daemon("--metrics-address", f"127.0.0.1:{port}")
    await kubelet.wait_for(lambda: len(kubelet.devices(NIC)) == 8, timeout=60)
    await dra_plugin(roots, daemon)  # registered on both sides: only the publishing is wrong

    last: list[tuple[int, str]] = []

    async def answered(status: int, words: str) -> bool:
        last[:] = [await readyz(port)]
        return last[0][0] == status and words in last[0][1]

    for _ in range(600):
        if await answered(503, "publishing ResourceSlices failed"):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"/readyz never reported the publishing failure: {last}")
    assert "503" in last[0][1] and "retrying in" in last[0][1], last

    apiserver.slice_failure = None
    for _ in range(900):  # the next retry comes after the publisher's backoff (2 s, 4 s, ...)
        if await answered(200, ""):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"/readyz did not recover after publishing did: {last}")
    assert apiserver.slices and daemon.proc.poll() is None
