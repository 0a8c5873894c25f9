"""The fabric manager registering the GPUs after the daemon started: the clique appears without a restart.

On GB200/GB300 NVL72 trays the fabric manager often finishes after the node's daemons are up. The
daemon is a real child process serving real hardware through `topo_testkit.with_fake_nvml` (NVML
answered from the node description, the rest the shipped code) on a generated GB200 tray; the
fake's fabric-manager file (`TOPO_TESTKIT_FABRIC_FILE`) says what `nvmlDeviceGetGpuFabricInfoV`
answers. It starts "not started", then turns "completed" with a clique: the NFD label file and the
GPUs' `clique` attribute in the ResourceSlices (API server stand-in) must follow, with the same
process (`--fabric-recheck-s`, 0.2 s here; 60 s by default). The in-progress step, one GPU at a
time, is tests/sources/test_fabric_labels.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from apiserver_standin import write_kubeconfig
from kubelet_standin import register, registration_sockets
from topo_testkit import pythonpath_env
from topo_testkit.child_wait import until_child as until
from topo_testkit import sysfs_fixture as sf

from plugin.sources.fabric_labels import CLIQUE_LABEL

NODE = "node-a"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FABRIC = sf.NVL72_FABRIC


@pytest.fixture
def root():
    base = tempfile.mkdtemp(prefix="fab-", dir="/tmp")  # unix socket paths are short
    yield base
    shutil.rmtree(base, ignore_errors=True)


def write_fabric(path: str, gpus: list[str], state: str) -> None:
    entry = {"state": state, "clusterUuid": FABRIC.cluster_uuid, "cliqueId": FABRIC.clique_id}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(dict.fromkeys(gpus, entry), f)
    os.replace(tmp, path)


def label_file(path: str) -> dict[str, str]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return dict(line.strip().split("=", 1) for line in f if "=" in line and not line.startswith("#"))



async def test_the_clique_label_and_slice_attribute_appear_when_the_fabric_completes(root, apiserver, tmp_path):
    node = sf.write_demo(os.path.join(root, "node"), sf.gb200_cx7_node())
    gpus = [g.name for g in node.topology.gpus]
    fabric_file = os.path.join(root, "fabric.json")
    write_fabric(fabric_file, gpus, "not-started")
    features = os.path.join(root, "features.d")
    os.makedirs(features)
    labels = os.path.join(features, "topo-device-plugin")
    kubelet_root = os.path.join(root, "k")
    for d in ("device-plugins", "plugins_registry"):  # the kubelet makes both
        os.makedirs(os.path.join(kubelet_root, d))
    env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1", NODE_NAME=NODE, TOPO_TESTKIT_FABRIC_FILE=fabric_file,
                              KUBECONFIG=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = str(tmp_path / "daemon.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "topo_testkit.with_fake_nvml", os.path.join(node.root, "node.yaml"), "serve",
             "--config", os.path.join(node.root, "config.yaml"), "--kubelet-root-dir", kubelet_root,
             "--cdi-spec-dir", os.path.join(root, "cdi"), "--dra-resources", "nvidia.com/gpu",
             "--fabric-labels-file", labels, "--fabric-recheck-s", "0.2", "--log-level", "debug"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    def cliques() -> dict[str, str | None]:
        return {d["name"]: d["attributes"].get("clique", {}).get("string")
                for s in apiserver.slices.values() for d in s["spec"].get("devices", ())
                if d["attributes"].get("type", {}).get("string") == "gpu"}

    try:
        sockets = await until(lambda: registration_sockets(kubelet_root), "the DRA registration socket", proc, log)
        await register(sockets[0])
        first = await until(lambda: cliques() if len(cliques()) == len(gpus) else None, "the GPU slices", proc, log)
        assert set(first.values()) == {None} and label_file(labels) == {}
        pid = proc.pid

        write_fabric(fabric_file, gpus, "completed")  # the fabric manager has registered every GPU
        await until(lambda: label_file(labels).get(CLIQUE_LABEL) == FABRIC.clique, "the clique label", proc, log)
        done = await until(lambda: cliques() if set(cliques().values()) == {FABRIC.clique} else None,
                           "the clique attribute on every GPU", proc, log)
        assert len(done) == len(gpus)
        assert proc.pid == pid and proc.poll() is None, "the same process, no restart"
        with open(log, encoding="utf-8", errors="replace") as f:
            assert "NVLink fabric state changed; rescanning" in f.read()

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
