"""`serve --nrt` as the chart runs it: a real daemon process, its options from the command line, the
kubelet's pod-resources on a real socket, the object over real HTTP (KUBECONFIG, as outside a pod)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import subprocess
import sys

from apiserver_standin import write_kubeconfig
from topo_testkit import pythonpath_env

from test_side import PodResources
from test_writer import NODE, until

ROOT = pathlib.Path(__file__).resolve().parents[2]


async def test_serve_nrt_publishes_with_the_kubelets_policy_and_deletes_on_sigterm(nrt_server, short_tmp, tmp_path):
    root = pathlib.Path(short_tmp)
    (root / "device-plugins").mkdir()
    kubelet_config = tmp_path / "kubelet.yaml"
    kubelet_config.write_text("kind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n")
    pod_resources = PodResources()
    await pod_resources.start(str(root / "pod-resources" / "kubelet.sock"))
    env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1", NODE_NAME=NODE,
                              KUBECONFIG=write_kubeconfig(tmp_path / "kubeconfig", nrt_server.url)))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-h100",
                                 "--kubelet-root-dir", str(root), "--nrt", f"--kubelet-config={kubelet_config}"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        await until(lambda: NODE in nrt_server.objects or proc.poll() is not None, "the object is published")
        assert proc.poll() is None, log.read_text()[-3000:]
        attrs = {a["name"]: a["value"] for a in nrt_server.objects[NODE]["attributes"]}
        assert (attrs["topologyManagerPolicy"], attrs["topologyManagerScope"]) == ("restricted", "container")
        assert [z["name"] for z in nrt_server.objects[NODE]["zones"]] == ["node-0", "node-1"]
    finally:
        proc.terminate()
        code = await asyncio.to_thread(proc.wait, 60)
        await pod_resources.stop()
    assert code == 0, log.read_text()[-3000:]
    assert NODE not in nrt_server.objects, "deleted when the daemon stopped"


def test_the_option_needs_the_node_name(tmp_path):
    env = pythonpath_env(dict(os.environ))
    env.pop("NODE_NAME", None)
    proc = subprocess.run([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-h100",
                           "--device-plugin-path", str(tmp_path / "dp"), "--nrt"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--nrt" in proc.stderr and "NODE_NAME" in proc.stderr and "fix:" in proc.stderr
