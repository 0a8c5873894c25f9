"""Mode per resource: one `serve` process serves some resources through the device-plugin API and the
others through DRA, never a device both ways; bad combinations stop start-up naming file, field and fix.

The daemon is a real child process (`python -m plugin serve`), the kubelet's device manager is the
device-plugin stand-in on real sockets, the kubelet's DRA side is tests/dra/kubelet_standin and the API
server is tests/dra/apiserver_standin (reached through KUBECONFIG, as outside a pod).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from kubelet_standin import register, registration_sockets
from topo_testkit import pythonpath_env
from topo_testkit.child_wait import until_child as until

from apiserver_standin import write_kubeconfig
from plugin.cli import cli
from topo_testkit.kubelet_standin import KubeletStandin

NODE = "node-a"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def root(short_tmp):
    return short_tmp  # unix socket paths are short (tests/conftest.py)



async def test_one_process_serves_gpus_through_dra_and_nics_through_the_device_plugin(root, apiserver, tmp_path):
    kubelet_root = os.path.join(root, "k")
    plugin_dir = os.path.join(kubelet_root, "device-plugins")
    cdi = os.path.join(root, "cdi")
    os.makedirs(plugin_dir)
    dp_kubelet = KubeletStandin(plugin_dir)
    await dp_kubelet.start()
    env = pythonpath_env(dict(os.environ, PYTHONUNBUFFERED="1", NODE_NAME=NODE, POD_UID="pod-1",
                              KUBECONFIG=write_kubeconfig(tmp_path / "kubeconfig", apiserver.url)))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    log = str(tmp_path / "daemon.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-h100",
                                 "--kubelet-root-dir", kubelet_root, "--cdi-spec-dir", cdi,
                                 "--dra-resources", "nvidia.com/gpu", "--log-level", "debug"],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        # Device-plugin side: the NICs, and nothing else.
        await until(lambda: dp_kubelet.registrations_of("topo.dev/nic"), "the NIC resource to register", proc, log)
        assert not dp_kubelet.registrations_of("nvidia.com/gpu")
        await dp_kubelet.wait_for(lambda: len(dp_kubelet.devices("topo.dev/nic")) == 8)
        nic_ids = set(dp_kubelet.devices("topo.dev/nic"))

        # DRA side: the GPUs, and nothing else.
        sockets = await until(lambda: registration_sockets(kubelet_root), "the DRA registration socket", proc, log)
        plugin = await register(sockets[0])
        assert plugin.name == "topo.dev"
        devices = await until(lambda: [d for s in apiserver.slices.values() for d in s["spec"]["devices"]],
                              "the ResourceSlices", proc, log)
        types = {d["attributes"]["type"]["string"] for d in devices}
        assert types == {"gpu"} and len(devices) == 8
        assert not {d["name"] for d in devices} & {f"nic-{i}".lower() for i in nic_ids}

        uid = apiserver.add_claim("team", "one-gpu", [{"request": "gpu", "driver": "topo.dev", "pool": NODE,
                                                       "device": "gpu-3"}])
        resp = await plugin.prepare(("team", uid, "one-gpu"))
        assert resp.claims[uid].error == ""
        assert list(resp.claims[uid].devices[0].cdi_device_ids) == [f"topo.dev/claim={uid}-gpu-3"]
        with open(os.path.join(cdi, f"topo.dev-claim_{uid}.json"), encoding="utf-8") as f:
            spec = json.load(f)
        assert spec["devices"][0]["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia3"

        # A NIC is not a DRA device here: a claim for one is refused, per claim.
        nic_uid = apiserver.add_claim("team", "nic", [{"request": "nic", "driver": "topo.dev", "pool": NODE,
                                                       "device": "nic-mlx5-0"}])
        resp = await plugin.prepare(("team", nic_uid, "nic"))
        assert "not on this node" in resp.claims[nic_uid].error

        # The device-plugin side still allocates NICs in the same process.
        got = await dp_kubelet.allocate("topo.dev/nic", sorted(nic_ids)[:1])
        assert got is not None

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert registration_sockets(kubelet_root) == []
        # The prepared claim survives the process (checkpoint and spec), for the next instance.
        with open(os.path.join(kubelet_root, "plugins", "topo.dev", "checkpoint.json"), encoding="utf-8") as f:
            assert uid in f.read()
        assert os.path.exists(os.path.join(cdi, f"topo.dev-claim_{uid}.json"))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        await dp_kubelet.stop()


@pytest.mark.parametrize("config,extra_env,words", [
    ("flags: {draResources: [example.com/nope]}", {}, ["field flags.draResources", "'example.com/nope'",
                                                       "nvidia.com/gpu, topo.dev/nic", "fix:"]),
    ("flags: {draResources: nvidia.com/gpu, migStrategy: mixed}", {}, ["field flags.draResources",
                                                                     "draMig", "fix:"]),
    ("flags: {draResources: [nvidia.com/gpu]}\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, "
     "replicas: 4}]}}", {}, ["field flags.draResources", "time-sliced", "fix:"]),
    ("flags: {draResources: [nvidia.com/gpu]}", {"NODE_NAME": ""}, ["NODE_NAME", "fix:"]),
    ("flags: {draResources: 'nvidia.com/gpu,,x'}", {}, ["field flags.draResources"]),
    ("flags: {draResources: [topo.dev/nic], draMig: static}", {}, ["field flags.draMig", "nvidia.com/gpu",
                                                                    "draResources", "fix:"]),
    ("flags: {draResources: [nvidia.com/gpu], draMig: dynamic, draMigGpus: [GPU0]}", {}, ["flags.draMigGpus"]),
    ("flags: {draResources: [topo.dev/nic], podPrimaryInterface: eth0/1}", {},
     ["field flags.podPrimaryInterface", "eth0/1", "fix:"]),
], ids=["unknown-resource", "mig", "time-slicing", "no-node-name", "bad-list", "dra-mig-without-gpus",
        "dra-mig-gpus-not-indexes", "bad-primary-interface"])
def test_bad_combinations_stop_start_up_naming_file_field_and_fix(tmp_path, config, extra_env, words):
    path = tmp_path / "config.yaml"
    path.write_text(f"version: v1\n{config}\n")
    env = {"NODE_NAME": NODE, **extra_env}
    r = CliRunner().invoke(cli, ["serve", "--config", str(path), "--simulate", "dgx-h100",
                                 "--kubelet-root-dir", str(tmp_path / "k")], env=env)
    assert r.exit_code == 2, r.output
    assert str(path) in r.output or "NODE_NAME" in words, r.output
    for w in words:
        assert w in r.output, r.output
    assert not (tmp_path / "k").exists()  # nothing started


def test_the_flag_is_named_when_it_is_the_source(tmp_path):
    r = CliRunner().invoke(cli, ["serve", "--simulate", "dgx-h100", "--kubelet-root-dir", str(tmp_path / "k"),
                                 "--dra-resources", "topo.dev/nic,example.com/x"], env={"NODE_NAME": NODE})
    assert r.exit_code == 2, r.output
    assert "--dra-resources: 'example.com/x'" in r.output


def test_a_config_reload_never_moves_a_resource_between_the_two_sides(tmp_path, caplog):
    """draResources needs a restart: a reload keeps the running split (never both ways, not even briefly)."""
    from plugin.cli.options import resolve, resource_options, resource_reloader
    from plugin.config.flags import options_for

    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nflags: {draResources: [nvidia.com/gpu]}\n")
    params = {o.dest: o.default_for("serve") for o in options_for("serve")} | {"config_path": str(path)}
    settings = resolve(params, {}, "serve")
    assert resource_options(settings).dra_resources == {"nvidia.com/gpu"}
    path.write_text("version: v1\nflags: {draResources: [topo.dev/nic], logLevel: debug}\n")
    with caplog.at_level("WARNING"):
        reloaded = resource_reloader(settings)()
    assert reloaded.dra_resources == {"nvidia.com/gpu"}
    assert any("--dra-resources" in getattr(r, "options", "") for r in caplog.records), caplog.text


def test_no_api_server_access_stops_start_up_with_the_fix_and_leaves_nothing(root, tmp_path):
    env = pythonpath_env(dict(os.environ, NODE_NAME=NODE))
    for v in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        env.pop(v, None)
    kubelet_root, cdi = os.path.join(root, "k"), os.path.join(root, "cdi")
    proc = subprocess.run([sys.executable, "-m", "plugin", "serve", "--simulate", "dgx-h100", "--kubelet-root-dir",
                           kubelet_root, "--cdi-spec-dir", cdi, "--dra-resources", "nvidia.com/gpu"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DRA mode cannot reach the API server" in proc.stderr and "fix:" in proc.stderr, proc.stderr
    assert not os.path.exists(os.path.join(kubelet_root, "plugins_registry"))
    assert not os.path.isdir(cdi) or os.listdir(cdi) == []


def test_a_bad_primary_interface_flag_stops_start_up_naming_it(tmp_path):
    r = CliRunner().invoke(cli, ["serve", "--simulate", "dgx-h100", "--dra-resources", "topo.dev/nic",
                                 "--pod-primary-interface", "eth0/1", "--kubelet-root-dir", str(tmp_path / "k")],
                           env={"NODE_NAME": NODE})
    assert r.exit_code == 2, r.output
    assert "--pod-primary-interface: 'eth0/1' is not a Linux interface name (fix:" in r.output, r.output
    assert not (tmp_path / "k").exists()
