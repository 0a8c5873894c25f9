"""CDI and DRA failures by kind, never an "internal error" with a traceback (issue 19).

A user would notice: a claim refused with "internal error: ..." and a traceback in the driver's
log when the claim itself is bad (a UID too long for a file name, a path) or when the node is
misconfigured (the CDI directory replaced by a file), with no hint of what to fix; a driver that
exits 1 without saying what to do, leaves a socket behind and prints "Event loop is closed"; a
SIGTERM that exits 1 because a spec file could not be removed.

Real parts throughout: the DRA driver over real gRPC on real unix sockets, driven by the
kubelet-side stand-in (tests/dra/kubelet_standin.py), claims from the API server stand-in, real
files in temporary directories; the daemon cases run `python -m plugin serve` as a child process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pathlib
import shutil
import socket
import stat
import subprocess
import sys

import pytest
from topo_testkit import ROOT, pythonpath_env

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "dra"))

from apiserver_standin import ApiServerStandIn, write_kubeconfig
from kubelet_standin import register, registration_sockets

from plugin.dra import DraOptions, SliceOptions
from plugin.runtime.compose.dra import dra_driver
from plugin.sources.simulated import load_simulated

pytestmark = pytest.mark.timeout(300)

NODE = "node-a"
DRIVER = "topo.dev"
GPU = "nvidia.com/gpu"


@pytest.fixture
def roots(short_tmp):
    # unix socket paths: 107 bytes at most (tests/conftest.py)
    return short_tmp, os.path.join(short_tmp, "kubelet"), os.path.join(short_tmp, "cdi")


@pytest.fixture
async def driver(roots, apiserver, tmp_path):
    from plugin.kube.client import kubeconfig_api

    api = await kubeconfig_api(write_kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    opts = DraOptions(slices=SliceOptions(node_name=NODE, driver_name=DRIVER), kubelet_root=roots[1],
                      cdi_root=roots[2], instance_id="pod-1", resync_s=3600)
    drv = dra_driver(opts, api)
    await drv.start(load_simulated("dgx-h100"))
    yield drv
    await drv.stop()
    await api.close()


def no_traceback(caplog) -> None:
    bugs = [r for r in caplog.records if r.exc_info or "a bug" in r.getMessage()]
    assert not bugs, [r.getMessage() for r in bugs]
    assert "Traceback" not in caplog.text


def claim_with_uid(apiserver: ApiServerStandIn, name: str, uid: str) -> None:
    """A claim the API server answers with `uid` (a real API server only issues UUIDs: the kubelet
    cannot send anything else in practice, so this is the request at its worst)."""
    apiserver.add_claim("team", name, [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}])
    apiserver.claims[("team", name)]["metadata"]["uid"] = uid


# ---- the DRA driver, per claim ---------------------------------------------------------------------

async def test_a_cdi_directory_replaced_by_a_file_gives_the_reason_and_the_fix(driver, roots, apiserver, caplog):
    caplog.set_level(logging.INFO)
    plugin = await register(registration_sockets(roots[1])[0])
    cdi = roots[2]
    shutil.rmtree(cdi, ignore_errors=True)
    pathlib.Path(cdi).write_text("a file where the CDI directory goes\n")
    uid = apiserver.add_claim("team", "one", [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "gpu-1"}])
    resp = await plugin.prepare(("team", uid, "one"))
    error = resp.claims[uid].error
    assert "internal error" not in error
    assert f"(fix: {cdi} is not a directory: remove or rename it" in error, error
    assert not resp.claims[uid].devices
    # The node's problem is logged as an error with the same reason and fix, without a traceback.
    [line] = [r for r in caplog.records if r.name == "plugin.dra.kubelet.service" and r.levelno >= logging.WARNING]
    assert line.levelno == logging.ERROR and "CDI directory is unusable" in line.getMessage()
    assert "fix:" in line.reason
    no_traceback(caplog)
    # The claim was not recorded as prepared: once the directory is fixed, a retry prepares it.
    os.unlink(cdi)
    resp = await plugin.prepare(("team", uid, "one"))
    assert resp.claims[uid].error == "" and os.path.exists(os.path.join(cdi, f"{DRIVER}-claim_{uid}.json"))


@pytest.mark.parametrize("uid,words", [
    ("7" * 300, ["is 300 characters long", "a Kubernetes UID has 36"]),
    ("../../../etc/cdi/evil", ["is not a Kubernetes UID", "letters, digits"]),
    ("..", ["is not a Kubernetes UID"]),
], ids=["too-long", "path-traversal", "dot-dot"])
async def test_a_claim_uid_that_cannot_name_a_file_is_refused(driver, roots, apiserver, caplog, uid, words):
    caplog.set_level(logging.INFO)
    plugin = await register(registration_sockets(roots[1])[0])
    claim_with_uid(apiserver, "odd", uid)
    resp = await plugin.prepare(("team", uid, "odd"))
    error = resp.claims[uid].error
    assert "internal error" not in error
    for w in words:
        assert w in error, error
    # Refused before anything is touched: no spec file anywhere, nothing recorded.
    base = roots[0]
    assert not [f for _, _, files in os.walk(base) for f in files if f.endswith(".json") and "claim_" in f]
    assert driver.checkpoint.load() == {}
    # Unprepare of such a UID is refused the same way (it never removes a file outside the directory).
    resp = await plugin.unprepare(("team", uid, "odd"))
    assert all(w in resp.claims[uid].error for w in words)
    refusals = [r for r in caplog.records if r.name == "plugin.dra.kubelet.service" and r.levelno >= logging.WARNING]
    assert [r.levelno for r in refusals] == [logging.WARNING, logging.WARNING]
    no_traceback(caplog)


# ---- the daemon: start-up and shutdown ------------------------------------------------------------

def serve(kubelet_root: str, cdi: str, kubeconfig: str, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = pythonpath_env(dict(os.environ, NODE_NAME=NODE, POD_UID="pod-1", KUBECONFIG=kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-h100",
                           "--kubelet-root-dir", kubelet_root, "--cdi-spec-dir", cdi,
                           "--dra-resources", GPU, *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def sockets_under(path: str) -> list[str]:
    return [os.path.join(d, f) for d, _, files in os.walk(path) for f in files
            if stat.S_ISSOCK(os.lstat(os.path.join(d, f)).st_mode)]


@pytest.mark.parametrize("which", ["registration", "service"])
async def test_a_directory_at_a_dra_socket_path_stops_start_up_with_the_fix_and_leaves_nothing(
        roots, apiserver, tmp_path, which):
    _, kubelet_root, cdi = roots
    planted = (os.path.join(kubelet_root, "plugins_registry", f"{DRIVER}-pod-1-reg.sock") if which == "registration"
               else os.path.join(kubelet_root, "plugins", DRIVER, "dra-pod-1.sock"))
    os.makedirs(planted)
    proc = await asyncio.to_thread(serve, kubelet_root, cdi, write_kubeconfig(tmp_path / "kc", apiserver.url))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert f"{planted}: a directory sits where the DRA driver's socket goes (fix: remove it" in out, out
    assert "Traceback" not in out and "Event loop is closed" not in out and "internal error" not in out, out
    assert sockets_under(kubelet_root) == []
    assert os.path.isdir(planted)  # what is not ours is never removed
    assert not os.path.isdir(cdi) or os.listdir(cdi) == []


async def test_a_start_up_failure_after_the_dra_driver_started_stops_it(roots, apiserver, tmp_path):
    """The metrics port is taken: start-up fails after the DRA driver is serving; its sockets go."""
    _, kubelet_root, cdi = roots
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.to_thread(serve, kubelet_root, cdi, write_kubeconfig(tmp_path / "kc", apiserver.url),
                                       "--metrics-address", f"127.0.0.1:{port}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "DRA driver serving" in out, out  # the failure came after the driver had started
    assert "Traceback" not in out and "Event loop is closed" not in out, out
    assert sockets_under(kubelet_root) == [] and registration_sockets(kubelet_root) == []


async def test_sigterm_with_the_cdi_directory_replaced_by_a_file_exits_0_with_a_warning(kubelet, start_daemon,
                                                                                        tmp_path):
    cdi = tmp_path / "cdi"
    daemon = start_daemon("--device-list-strategy", "cdi-cri", "--cdi-spec-dir", str(cdi), simulate="dgx-h100")
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=60)
    assert any(n.endswith(".json") for n in os.listdir(cdi))  # our specs are there
    shutil.rmtree(cdi)
    cdi.write_text("a file where the CDI directory goes\n")
    assert await daemon.terminate(timeout=60) == 0, daemon.log()[-3000:]
    log = daemon.log()
    [line] = [ln for ln in log.splitlines() if "CDI specs not removed at shutdown" in ln]
    assert " warning " in f" {line.lower()} " and f"{cdi} is not a directory" in line, line
    assert "Traceback" not in log
