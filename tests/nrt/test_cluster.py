"""`explain --cluster`: which nodes admit a pod aligned, from the published objects (plugin/nrt/cluster.py,
plugin/cli/explain_cluster.py)."""

from __future__ import annotations

import asyncio
import json

import pytest
from click.testing import CliRunner

from apiserver_standin import write_kubeconfig
from plugin.cli.explain import explain
from plugin.model.resources import ResourceOptions, build_resources
from plugin.nrt.build import TopologyManagerSettings, build_nrt, published_resources
from plugin.nrt.cluster import PodSpecError, cluster_verdicts, node_verdict, pod_from_spec
from plugin.sources.simulated import load_simulated

GPU = "nvidia.com/gpu"
SNN = TopologyManagerSettings("single-numa-node", "container")


def published(node: str, simulated: str, held_per_zone: dict[int, int], settings=SNN) -> dict:
    topology = load_simulated(simulated)
    resources = published_resources(build_resources(topology, ResourceOptions()))
    gpus = next(r for r in resources if r.name == GPU)
    held = set()
    for numa, k in held_per_zone.items():
        held |= {(GPU, d.id) for d in [d for d in gpus.devices if d.numa == numa][:k]}
    return build_nrt(node, topology, resources, held, settings)


def pod(gpus: int, **extra) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "trainer"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {GPU: gpus, "cpu": "4", **extra}}}]}}


# DGX H100: 4 GPUs on each of NUMA 0 and 1. Three nodes with 4 free GPUs by count, one with them on one NUMA node.
NODES = [published("aligned", "dgx-h100", {0: 4}),              # 4 free, all on NUMA 1
         published("split", "dgx-h100", {0: 2, 1: 2}),          # 4 free, 2 + 2
         published("restricted-split", "dgx-h100", {0: 2, 1: 2}, TopologyManagerSettings("restricted", "pod")),
         published("unknown-policy", "dgx-h100", {0: 2, 1: 2}, TopologyManagerSettings())]


def test_only_the_node_with_four_gpus_on_one_numa_node_admits_four_gpus_under_single_numa_node():
    verdicts = {v.node: v for v in cluster_verdicts(NODES, pod_from_spec(pod(4)))}
    assert verdicts["aligned"].admit and verdicts["aligned"].numa == (1,)
    assert not verdicts["split"].admit and "TopologyAffinityError" in verdicts["split"].reason
    assert not verdicts["restricted-split"].admit and verdicts["restricted-split"].scope == "pod"
    # Published without the policy: judged as none (admitted, not aligned), and marked as assumed.
    assert verdicts["unknown-policy"].admit and verdicts["unknown-policy"].policy_assumed


def test_two_gpus_fit_every_node():
    assert all(v.admit for v in cluster_verdicts(NODES, pod_from_spec(pod(2))))


def test_a_resource_a_node_does_not_publish_is_refused_by_name():
    v = node_verdict(NODES[0], pod_from_spec(pod(1, **{"example.com/fpga": 1})))
    assert not v.admit and v.reason == "publishes no example.com/fpga"


@pytest.mark.parametrize("spec,field", [({"spec": {}}, "spec.containers"),
                                        ({"spec": {"containers": [{"resources": {"limits": {GPU: "four"}}}]}},
                                         "spec.containers[0].resources.limits.nvidia.com/gpu")])
def test_a_bad_pod_spec_names_the_field(spec, field):
    with pytest.raises(PodSpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        pod_from_spec(spec)


def test_a_deployment_is_read_through_its_pod_template():
    deployment = {"kind": "Deployment", "spec": {"template": pod(4)}}
    assert pod_from_spec(deployment).containers[0].limits == {GPU: 4}


async def test_the_command_reads_the_objects_through_the_api_server(nrt_server, tmp_path):
    for o in NODES:
        nrt_server.objects[o["metadata"]["name"]] = o
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", nrt_server.url)
    pod_file = tmp_path / "pod.yaml"
    pod_file.write_text(json.dumps(pod(4)))
    runner = CliRunner()
    text = await asyncio.to_thread(runner.invoke, explain, ["--cluster", kubeconfig, "--pod", str(pod_file)])
    assert text.exit_code == 0, text.output
    lines = {line.split()[0]: line for line in text.output.splitlines()[1:5]}
    assert "yes" in lines["aligned"].split() and "no" in lines["split"].split()
    assert "2 of 4 nodes admit the pod under their policy" in text.output
    out = await asyncio.to_thread(runner.invoke, explain, ["--cluster", kubeconfig, "--request", f"{GPU}=8",
                                                           "--format", "json", "--fail-on-reject"])
    assert out.exit_code == 1
    assert [n["admit"] for n in json.loads(out.output)["nodes"]] == [False, False, False, False]


@pytest.mark.parametrize("refusal,fix", [
    ((404, "NotFound", "the server could not find the requested resource"),
     "fix: install the chart with nrt.enabled (the CRD comes with it)"),
    ((403, "Forbidden", 'cannot list resource "noderesourcetopologies"'),
     "fix: use a kubeconfig that may list noderesourcetopologies")])
async def test_a_refused_list_names_what_to_fix(nrt_server, tmp_path, refusal, fix):
    """No CRD and no permission are told apart by the error's type, each with its own fix (exit 1)."""
    nrt_server.list_refused = refusal
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", nrt_server.url)
    out = await asyncio.to_thread(CliRunner().invoke, explain, ["--cluster", kubeconfig, "--request", f"{GPU}=1"])
    assert out.exit_code == 1, out.output
    assert f"cannot list NodeResourceTopology objects: {refusal[0]} {refusal[1]}: {refusal[2]}" in out.output
    assert fix in out.output


def test_the_command_without_a_pod_or_with_both_is_a_usage_error(tmp_path):
    runner = CliRunner()
    assert runner.invoke(explain, ["--cluster", str(tmp_path / "k")]).exit_code == 2
    r = runner.invoke(explain, ["--cluster", str(tmp_path / "k"), "--pod", "x.yaml", "--request", f"{GPU}=1"])
    assert r.exit_code == 2 and "not both" in r.output
