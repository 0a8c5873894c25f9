"""MIG in the ResourceSlices: static MIG devices with their GPU's topology, partitionable GPUs with shared counters.

The slices go through the Kubernetes 1.37 API server's own validation (slice-validate, as in
test_slice_validation.py), and the counters are checked the way the scheduler uses them: a
set of devices fits when, per counter set, what they consume stays within what it offers.
"""

from __future__ import annotations

import itertools
import json
import re

import pytest

from allocator.topology import DeviceKind
from plugin.dra.mig.devices import DraMig, counter_set_name
from plugin.dra.slices.build import SliceOptions, build_resource_slices, device_table
from plugin.sources.mig_profiles import A100_80GB, H100_80GB, table_for
from plugin.sources.simulated import load_node_yaml
from test_slice_validation import accepted, validate, validator  # noqa: F401 (the fixture)
from topo_testkit.mig_node import mig_node_text

NODE = "node-a"


def table_placements(gpu):
    return table_for(gpu.model, gpu.memory_mib).placements()


def node(**kw):
    return load_node_yaml(mig_node_text(**kw), "mig-node")


def slices(topology, mode: str, gpus=None):
    return build_resource_slices(topology, SliceOptions(node_name=NODE, mig=DraMig(mode, gpus, table_placements)))


def devices(out) -> dict[str, dict]:
    return {d["name"]: d for s in out for d in s["spec"].get("devices", [])}


def counters(out) -> dict[str, dict[str, int]]:
    return {c["name"]: {k: _n(v["value"]) for k, v in c["counters"].items()}
            for s in out for c in s["spec"].get("sharedCounters", [])}


def _n(q: str) -> int:
    m = re.fullmatch(r"(\d+)(Mi)?", q)
    assert m, q
    return int(m.group(1))


def fits(out, names: list[str]) -> bool:
    """Whether the scheduler could allocate these devices together: counters never go below zero."""
    left = counters(out)
    devs = devices(out)
    for name in names:
        for use in devs[name].get("consumesCounters", []):
            for k, v in use["counters"].items():
                left[use["counterSet"]][k] -= _n(v["value"])
    return all(v >= 0 for c in left.values() for v in c.values())


def test_static_mig_devices_carry_their_gpus_topology_and_replace_the_gpu(validator):
    t = node(partitionable=(0,))
    out = slices(t, "static")
    devs = devices(out)
    gpu2 = next(d for d in t.gpus if d.index == 2)
    migs = [m for m in t.of_kind(DeviceKind.MIG) if m.parent == gpu2.name]
    assert "gpu-2" not in devs  # its memory and SMs are carved up
    assert sorted(n for n in devs if n.startswith("gpu-2-")) == [f"gpu-2-mig-{m.index}" for m in migs]
    whole = build_resource_slices(t, SliceOptions(node_name=NODE))
    parent = devices(whole)["gpu-2"]["attributes"]
    for m in migs:
        a = devs[f"gpu-2-mig-{m.index}"]["attributes"]
        assert a["type"] == {"string": "mig"} and a["uuid"] == {"string": m.uuid}
        assert a["profile"] == {"string": m.attributes["profile"]}
        assert a["parentUUID"] == parent["uuid"] and a["parentIndex"] == {"int": 2}
        for k in ("pcieSwitch", "nvlinkDomain", "resource.kubernetes.io/numaNode", "resource.kubernetes.io/pcieRoot"):
            assert a[k] == parent[k], k
        assert devs[f"gpu-2-mig-{m.index}"]["capacity"]["memory"] == {"value": f"{m.memory_mib}Mi"}
    # A GPU in MIG mode without MIG devices serves nothing statically; GPUs not in MIG mode are unchanged.
    assert "gpu-0" not in devs and not any(n.startswith("gpu-0-") for n in devs)
    assert devs["gpu-5"] == devices(whole)["gpu-5"]
    accepted(validate(validator, out))


def test_a_mig_device_of_an_unhealthy_gpu_is_tainted_too():
    t = node(partitionable=())
    gpu2 = next(d for d in t.gpus if d.index == 2)
    out = slices(t.with_health({gpu2.name: "Unhealthy"}), "static")
    tainted = sorted(n for n, d in devices(out).items() if d.get("taints"))
    assert tainted == [n for n in sorted(devices(out)) if n.startswith("gpu-2-mig-")]


def test_partitionable_gpus_publish_every_placement_with_counters_in_a_slice_of_their_own(validator):
    t = node()
    out = slices(t, "dynamic", frozenset({0, 1}))
    assert [bool(s["spec"].get("devices")) for s in out] == [True] * (len(out) - 1) + [False]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in out} == {len(out)}
    devs = devices(out)
    for i in (0, 1):
        names = sorted(n for n in devs if n.startswith(f"gpu-{i}-mig-"))
        want = sorted(f"gpu-{i}-mig-{p.profile.name.replace('.', '-')}-{p.start}" for p in H100_80GB.placements())
        assert names == want and len(names) == 18
        assert devs[f"gpu-{i}"]["consumesCounters"][0]["counterSet"] == f"gpu-{i}-mig"
        p = devs[f"gpu-{i}-mig-3g-40gb-4"]
        assert p["attributes"]["placementStart"] == {"int": 4} and p["attributes"]["placementSize"] == {"int": 4}
        assert p["attributes"]["profile"] == {"string": "3g.40gb"}
        assert p["attributes"]["pcieSwitch"] == devs[f"gpu-{i}"]["attributes"]["pcieSwitch"]
    # GPU2 is in MIG mode but not listed as partitionable: its MIG devices are static.
    assert sorted(n for n in devs if n.startswith("gpu-2")) == ["gpu-2-mig-0", "gpu-2-mig-1", "gpu-2-mig-2"]
    assert sorted(counters(out)) == ["gpu-0-mig", "gpu-1-mig"]
    checked = accepted(validate(validator, out))
    assert sum(c["devices"] for c in checked) == len(devs)


def test_every_gpu_partitionable_needs_more_counter_slices_and_the_api_server_accepts_them(validator):
    t = node(partitionable=tuple(range(8)), static={})
    out = build_resource_slices(t, SliceOptions(node_name=NODE, mig=DraMig("dynamic", None, table_placements)))
    assert len(counters(out)) == 8 and len(devices(out)) == 8 * 19 + 8
    assert all(len(s["spec"].get("devices", [])) <= 64 and len(s["spec"].get("sharedCounters", [])) <= 8 for s in out)
    accepted(validate(validator, out))


@pytest.mark.parametrize("together, ok", [
    (["gpu-0-mig-1g-10gb-%d" % s for s in range(7)], True),  # seven 1g: the classic full split
    (["gpu-0-mig-3g-40gb-4", "gpu-0-mig-4g-40gb-0"], True),
    (["gpu-0-mig-3g-40gb-0", "gpu-0-mig-4g-40gb-0"], False),  # memory slices 0-3 twice
    (["gpu-0-mig-1g-10gb-0", "gpu-0-mig-1g-10gb-0"], False),
    (["gpu-0", "gpu-0-mig-1g-10gb-6"], False),  # the whole GPU excludes every placement
    (["gpu-0-mig-7g-80gb-0", "gpu-1-mig-7g-80gb-0"], True),  # counters are per GPU
    (["gpu-0-mig-1g-20gb-%d" % s for s in (0, 2, 4, 6)] + ["gpu-0-mig-2g-20gb-0"], False),
])
def test_counters_let_exactly_the_placements_that_fit_go_together(together, ok):
    assert fits(slices(node(), "dynamic"), together) is ok


def test_no_two_overlapping_placements_ever_fit():
    out = slices(node(), "dynamic")
    placements = {f"gpu-0-mig-{p.profile.name.replace('.', '-')}-{p.start}": p for p in H100_80GB.placements()}
    for (a, pa), (b, pb) in itertools.combinations(placements.items(), 2):
        if pa.overlaps(pb):
            assert not fits(out, [a, b]), (a, b)


def test_prepare_sees_placements_as_dynamic_mig_devices_and_the_whole_gpu_as_the_full_placement():
    t = node()
    table = device_table(t, SliceOptions(node_name=NODE, mig=DraMig("dynamic", frozenset({0, 1}), table_placements)))
    p = table["gpu-0-mig-1g-10gb-3"]
    assert (p.kind, p.parent, p.attributes["profile"], p.attributes["placement_start"]) == (
        DeviceKind.MIG, "GPU0", "1g.10gb", "3")
    assert table["gpu-0"].attributes["profile"] == "7g.80gb"
    assert table["gpu-2-mig-0"].uuid.startswith("MIG-") and "gpu-2" not in table
    assert "gpu-3" in table and table["gpu-3"].kind == DeviceKind.GPU


def test_only_the_listed_gpus_are_partitionable_and_a100_has_its_own_multiprocessors():
    t = load_node_yaml(mig_node_text(base="dgx-a100", static={}), "a100-mig")
    out = slices(t, "dynamic", frozenset({1}))
    assert sorted(counters(out)) == ["gpu-1-mig"]
    assert counters(out)["gpu-1-mig"]["multiprocessors"] == A100_80GB.multiprocessors
    # GPU0 is in MIG mode but not listed: served static (it has no MIG devices, so nothing).
    assert not any(n.startswith("gpu-0") for n in devices(out))
    assert json.dumps(out)  # plain JSON
    assert counter_set_name(next(d for d in t.gpus if d.index == 1)) == "gpu-1-mig"
