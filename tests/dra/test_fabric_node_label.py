"""The NVLink clique as a label of the Node object, patched through the API server (`--fabric-labels-node`).

The daemon is a real child process (`python -m plugin serve`) serving a simulated GB300 tray from a
file; the API server is tests/dra/apiserver_standin (reached through KUBECONFIG, as outside a pod),
which applies merge patches as the real one does. Editing the node file (watched with inotify) is
how a fabric change reaches the daemon. The retry tests drive `NodeLabeller` in-process against a
stand-in that refuses, or a port that is not yet listening.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

import pytest
import yaml

from apiserver_standin import ApiServerStandIn, write_kubeconfig
from plugin.sources.fabric_labels import CLIQUE_LABEL
from plugin.runtime.node_labels import NodeLabeller, connect_node_api
from plugin.sources.simulated import builtin_text, load_simulated
from topo_testkit import pythonpath_env
from topo_testkit.child_wait import until_child as until

NODE = "node-a"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OTHERS = {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.product": "NVIDIA-GB300", "team": "ml"}


def gb300(tmp_path):
    data = yaml.safe_load(builtin_text("gb300-cx8-dd"))
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, data


def clique_of_builtin() -> str:
    (clique,) = {g.fabric.clique for g in load_simulated("gb300-cx8-dd").gpus}
    return clique


def edit(path, data, change) -> None:
    """Rewrite the node file atomically (as an editor saving does), with `change` applied to each GPU."""
    for g in data["gpus"]:
        change(g)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False))
    os.replace(tmp, path)



def labels(server: ApiServerStandIn) -> dict[str, str]:
    return server.nodes[NODE]["metadata"].get("labels", {})


async def test_serve_keeps_the_clique_label_on_its_node_and_touches_no_other_label(apiserver, tmp_path):
    apiserver.nodes[NODE]["metadata"]["labels"] = dict(OTHERS)
    node_file, data = gb300(tmp_path)
    env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1", NODE_NAME=NODE,
                              KUBECONFIG=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = str(tmp_path / "daemon.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", str(node_file),
                                 "--device-plugin-path", str(tmp_path / "dp"), "--fabric-labels-node",
                                 "--log-level", "debug"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        first = clique_of_builtin()
        await until(lambda: labels(apiserver).get(CLIQUE_LABEL) == first, "the clique label", proc, log)
        assert labels(apiserver) == {**OTHERS, CLIQUE_LABEL: first}

        # The fabric manager put the tray in another clique: the label follows.
        edit(node_file, data, lambda g: g["fabric"].update(cliqueId=9))
        second = first.rsplit(".", 1)[0] + ".9"
        await until(lambda: labels(apiserver).get(CLIQUE_LABEL) == second, "the changed clique label", proc, log)
        assert labels(apiserver) == {**OTHERS, CLIQUE_LABEL: second}

        # Someone else changes their own label meanwhile; ours going away leaves theirs as they are.
        apiserver.nodes[NODE]["metadata"]["labels"]["team"] = "infra"
        edit(node_file, data, lambda g: g.pop("fabric"))
        await until(lambda: CLIQUE_LABEL not in labels(apiserver), "the clique label removed", proc, log)
        assert labels(apiserver) == {**OTHERS, "team": "infra"}
        patches = [w for w in apiserver.writes if w[0] == "PATCH"]
        assert patches == [("PATCH", NODE)] * 3, "one patch per change, none repeated"
        assert not [w for w in apiserver.writes if w[0] != "PATCH"], "nothing but the Node was written"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert proc.returncode == 0, open(log, encoding="utf-8").read()[-3000:]
    assert labels(apiserver) == {**OTHERS, "team": "infra"}


def test_the_option_needs_the_node_name(tmp_path):
    env = pythonpath_env(dict(os.environ))
    env.pop("NODE_NAME", None)
    proc = subprocess.run([sys.executable, "-m", "plugin", "serve", "--simulate", "gb300-cx8-dd",
                           "--device-plugin-path", str(tmp_path / "dp"), "--fabric-labels-node"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--fabric-labels-node" in proc.stderr and "NODE_NAME" in proc.stderr and "fix:" in proc.stderr


def gpus():
    return load_simulated("gb300-cx8-dd").gpus


async def wait_for(pred, timeout: float = 30.0):
    for _ in range(int(timeout / 0.02)):
        if pred():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not met in time")


async def test_a_refusing_api_server_is_retried_until_the_label_is_set(apiserver, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    apiserver.refuse_node_patches = 2
    labeller = NodeLabeller(NODE, connect_node_api, min_backoff_s=0.01, max_backoff_s=0.05)
    labeller.update(gpus())
    task = asyncio.create_task(labeller.run())
    try:
        await wait_for(lambda: CLIQUE_LABEL in labels(apiserver))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert labels(apiserver)[CLIQUE_LABEL] == clique_of_builtin()
    refused = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert len(refused) == 2 and all("503" in r.reason for r in refused)
    assert all("get and patch nodes" in r.fix for r in refused)


async def test_an_unreachable_api_server_is_retried_until_it_listens(tmp_path, monkeypatch):
    # A bound port that does not listen yet refuses connections; the stand-in then listens on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "kubeconfig", url))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    tries: list[str] = []

    async def connect():
        """The daemon's own connection, with each patch attempt counted."""
        api = await connect_node_api()
        patch = api.patch_node_labels

        async def counted(node, new):
            tries.append(node)
            return await patch(node, new)
        api.patch_node_labels = counted
        return api

    labeller = NodeLabeller(NODE, connect, min_backoff_s=0.01, max_backoff_s=0.05)
    labeller.update(gpus())
    task = asyncio.create_task(labeller.run())
    server = ApiServerStandIn(NODE)
    try:
        # A few tries refused (nothing listens), then the API server comes up on that port.
        await wait_for(lambda: len(tries) >= 2)
        assert CLIQUE_LABEL not in labels(server)
        await server.start(sock=sock)
        await wait_for(lambda: CLIQUE_LABEL in labels(server))
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.stop()
    assert labels(server)[CLIQUE_LABEL] == clique_of_builtin()


@pytest.mark.parametrize("start_with", ["clique", "none"])
async def test_the_first_wanted_value_is_always_sent_so_a_stale_label_is_removed(apiserver, tmp_path, monkeypatch,
                                                                               start_with):
    """A label left by an earlier run on a node whose GPUs now have no clique is removed at start."""
    monkeypatch.setenv("KUBECONFIG", write_kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    apiserver.nodes[NODE]["metadata"]["labels"] = {CLIQUE_LABEL: "stale.1", "team": "ml"}
    labeller = NodeLabeller(NODE, connect_node_api)
    labeller.update(gpus() if start_with == "clique" else load_simulated("dgx-h100").gpus)
    want = {"team": "ml", CLIQUE_LABEL: clique_of_builtin()} if start_with == "clique" else {"team": "ml"}
    task = asyncio.create_task(labeller.run())
    try:
        await wait_for(lambda: labels(apiserver) == want)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
