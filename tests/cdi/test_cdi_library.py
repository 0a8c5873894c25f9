"""Every spec we write passes the CDI project's own Go validation, and injects what Allocate promises.

For several simulated nodes (built-ins with both device-ID strategies, a
time-sliced GPU resource, MIG devices, RDMA/vfio NICs) we write the specs
with `CdiSpecWriter` into a temporary directory and run `cdi-validate`
(tests/cdi/validate): the current CDI library (strict parse, spec/device/edit
rules, version rules), the v0.5.4 library that containerd 1.7.0-1.7.13
vendor, its JSON schema, a runtime-style cache load (no conflicts), and
injection of the CDI names `names_for` returns for an allocation into an OCI
spec. A deliberately broken spec must fail, so the check can fail.
"""

from __future__ import annotations

import json
import pathlib

import pytest

from plugin.cdi_files.writer import CdiSpecWriter
from plugin.model.cdi import CdiOptions, names_for, spec_for_resource

from cdi_nodes import BUILTINS, TIME_SLICED, mig_resource, nic_resource, resources_of, served, served_by_nvml, \
    time_sliced

OPTS = CdiOptions()


def node_cases() -> list[tuple[str, list]]:
    cases = []
    for name in BUILTINS:
        for strategy in ("uuid", "index"):
            cases.append((f"{name}-{strategy}", resources_of(name, strategy)))
    a100 = resources_of("dgx-a100")
    cases.append(("dgx-a100-time-sliced", [time_sliced(a100[0], 10), *a100[1:]]))
    cases.append(("mig-and-nics", [mig_resource(), mig_resource("nvidia.com/mig-3g.40gb", 1, 2), nic_resource()]))
    # What the daemon serves: MIG strategies, time-slicing of GPUs and of a MIG profile, MIG devices
    # found through NVML (the fake, with procfs giving the capability nodes and their major).
    cases.append(("dgx-a100-mig-mixed-time-sliced", served("dgx-a100-mig", "mixed", TIME_SLICED)))
    cases.append(("dgx-a100-mig-1g-single", served("dgx-a100-mig-1g", "single")))
    cases.append(("dgx-a100-mig-nvml-mixed", served_by_nvml("dgx-a100-mig", "mixed")))
    return cases


CASES = node_cases()


@pytest.mark.parametrize("label,resources", CASES, ids=[c[0] for c in CASES])
def test_our_specs_pass_the_cdi_library_and_inject_allocations(cdi_validator, tmp_path, label, resources) -> None:
    specs = {r.name: spec_for_resource(r, OPTS) for r in resources}
    written = CdiSpecWriter(str(tmp_path)).sync(s for s in specs.values() if s is not None)
    assert written.written
    # One container per resource, allocated its first two devices (replicas: two of one GPU and one
    # of the next), plus one container holding a device of every resource.
    allocations = {}
    for r in resources:
        spec = specs[r.name]
        if spec is None:
            continue
        ids = [d.id for d in r.devices]
        picked = ids[:2] + ids[-1:] if "::" in ids[0] else ids[:2]
        allocations[r.name] = (picked, names_for(spec, picked))
        assert allocations[r.name][1], f"{r.name}: no CDI name for {picked}"
    inject = [names for _, names in allocations.values()]
    inject.append([names[0] for names in inject])
    v = cdi_validator.run(tmp_path, inject)
    assert v.ok, json.dumps(v.report, indent=1)
    assert v.report["schemaSelfCheck"] is None
    for r_name, spec in specs.items():
        if spec is None:
            continue
        f = v.file(spec.file_name)
        assert f["error"] is None and f["legacyError"] is None and f["schemaError"] is None
        assert f["kind"] == spec.kind and f["version"] == spec.version == "0.5.0"
        # We write the newest version every containerd 1.7/2.x accepts, never below what the
        # content needs (the library's own MinimumRequiredVersion).
        assert _v(f["minVersion"]) <= _v(f["version"])
        assert f["devices"] == list(spec.device_names())
    expected = sorted(spec.qualified(n) for spec in specs.values() if spec for n in spec.device_names())
    assert v.report["devices"] == expected and not v.report["cacheErrors"]
    for (r_name, (picked, names)), inj in zip(allocations.items(), v.report["injections"]):
        spec = specs[r_name]
        assert inj["error"] is None and not inj["unresolved"]
        want = {n.path for d in spec.devices if spec.qualified(d.name) in names for n in d.edits.device_nodes}
        want |= {n.path for n in spec.edits.device_nodes}
        assert {n["path"] for n in inj["deviceNodes"]} == want
        assert set(inj["env"]) == set(spec.edits.env)
        if spec.kind.startswith("topo-dp.nvidia.com/gpu"):
            gpus = sorted(n["minor"] for n in inj["deviceNodes"] if n["path"].startswith("/dev/nvidia")
                          and n["path"][len("/dev/nvidia"):].isdigit())
            by_id = next(r for r in resources if r.name == r_name).by_id()
            # each physical GPU once: a replica's GPU, a MIG device's parent
            assert len(gpus) == len({by_id[p].device.parent or by_id[p].device.name for p in picked})
            assert not any(e.startswith("NVIDIA_VISIBLE_DEVICES=") for e in inj["env"])  # Allocate decides


def _v(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("."))


BROKEN = [
    # (what, spec document, words the library's complaint must contain)
    ("digit-leading name at 0.3.0", {"cdiVersion": "0.3.0", "kind": "topo-dp.nvidia.com/gpu",
     "devices": [{"name": "0", "containerEdits": {"env": ["A=1"]}}]}, "version"),
    ("name with a slash", {"cdiVersion": "0.5.0", "kind": "topo-dp.nvidia.com/gpu",
     "devices": [{"name": "MIG-GPU-1/2/3", "containerEdits": {"env": ["A=1"]}}]}, "MIG-GPU-1/2/3"),
    ("device without edits", {"cdiVersion": "0.5.0", "kind": "topo-dp.nvidia.com/gpu",
     "devices": [{"name": "GPU-1", "containerEdits": {}}]}, "empty"),
    ("env without =", {"cdiVersion": "0.5.0", "kind": "topo-dp.nvidia.com/gpu",
     "devices": [{"name": "GPU-1", "containerEdits": {"env": ["NOVALUE"]}}]}, "NOVALUE"),
    ("unknown field", {"cdiVersion": "0.5.0", "kind": "topo-dp.nvidia.com/gpu", "devicez": [],
     "devices": [{"name": "GPU-1", "containerEdits": {"env": ["A=1"]}}]}, "devicez"),
    ("dot in class before 0.6.0", {"cdiVersion": "0.5.0", "kind": "topo-dp.nvidia.com/gpu.shared",
     "devices": [{"name": "GPU-1", "containerEdits": {"env": ["A=1"]}}]}, "0.6.0"),
]


@pytest.mark.parametrize("what,doc,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_the_validator_rejects_a_broken_spec(cdi_validator, tmp_path: pathlib.Path, what, doc, words) -> None:
    path = tmp_path / "topo-dp.nvidia.com-gpu.json"
    path.write_text(json.dumps(doc))
    v = cdi_validator.run(tmp_path)
    assert not v.ok, what
    f = v.file(path.name)
    assert f["error"] is not None and words in f["error"], f
    assert v.report["cacheErrors"]


def test_conflicting_devices_in_one_directory_are_dropped_by_the_runtime(cdi_validator, tmp_path) -> None:
    """Why our kinds are our own: two specs of one directory defining the same device cancel out."""
    spec = spec_for_resource(resources_of("pcie-2socket-4gpu-2nic")[0], OPTS)
    assert spec is not None
    CdiSpecWriter(str(tmp_path)).sync([spec])
    (tmp_path / "copy-of-it.json").write_text(spec.to_json())
    v = cdi_validator.run(tmp_path, [[spec.qualified(spec.device_names()[0])]])
    assert not v.ok
    assert any("conflicting device" in e for errs in v.report["cacheErrors"].values() for e in errs)
    assert v.report["injections"][0]["unresolved"]


@pytest.mark.parametrize("name", ["GPU-1c2e", "0", "0000:3b:00.2", "3:1", "MIG-GPU-5a1b/1/0", "-x", "x-",
                                  "a_b.c", "x y"])
def test_our_name_rule_is_the_librarys(cdi_validator, tmp_path: pathlib.Path, name: str) -> None:
    """`CdiDevice` refuses a device name exactly when the CDI library does."""
    from plugin.model.cdi import CdiDevice, CdiError, DeviceNode, Edits

    edits = Edits((DeviceNode("/dev/null", major=1, minor=3),))
    try:
        CdiDevice(name, edits)
        ours = True
    except CdiError:
        ours = False
    doc = {"cdiVersion": "0.5.0", "kind": "topo-dp.example.com/xy",
           "devices": [{"name": name, "containerEdits": {"env": ["A=1"]}}]}
    (tmp_path / "topo-dp.example.com-xy.json").write_text(json.dumps(doc))
    assert cdi_validator.run(tmp_path).ok == ours


def test_a_one_character_class_crashes_the_library_so_we_never_write_one(cdi_validator, tmp_path) -> None:
    """Why `CdiSpec` wants two characters in vendor and class (and `kind_for_resource` pads)."""
    from plugin.model.cdi import CdiDevice, CdiError, CdiSpec, DeviceNode, Edits, kind_for_resource

    doc = {"cdiVersion": "0.5.0", "kind": "topo-dp.example.com/x",
           "devices": [{"name": "GPU-1", "containerEdits": {"env": ["A=1"]}}]}
    (tmp_path / "topo-dp.example.com-x.json").write_text(json.dumps(doc))
    v = cdi_validator.run(tmp_path)
    assert not v.ok and v.report["panicked"]
    assert v.file("topo-dp.example.com-x.json")["error"].startswith("panic:")
    with pytest.raises(CdiError):
        CdiSpec("topo-dp.example.com/x", (CdiDevice("GPU-1", Edits((DeviceNode("/dev/null", major=1, minor=3),))),))
    assert kind_for_resource("example.com/x") == "topo-dp.example.com/r-x"


def test_dra_claim_specs_pass_the_cdi_library_beside_the_device_plugin_specs(cdi_validator, tmp_path) -> None:
    """The DRA side's one-spec-per-claim files (plugin.dra.kubelet.cdi, written through plugin.model.cdi) load in one
    directory with the device-plugin side's specs, and the IDs prepare returns inject the claim's devices."""
    from allocator.topology import DeviceKind
    from plugin.dra.kubelet.cdi import ClaimSpecs
    from plugin.dra.slices.build import SliceOptions, device_table
    from plugin.sources.simulated.source import SimulatedSource

    topology = SimulatedSource("dgx-h100").load()
    table = device_table(topology, SliceOptions(node_name="node-a"))
    gpus = sorted(n for n, d in table.items() if d.kind is DeviceKind.GPU)
    nics = sorted(n for n, d in table.items() if d.kind is DeviceKind.NIC)
    CdiSpecWriter(str(tmp_path)).sync(s for s in (spec_for_resource(r, OPTS) for r in resources_of("dgx-h100"))
                                      if s is not None)
    claims = ClaimSpecs(str(tmp_path), "topo.dev")
    pair = [(n, table[n]) for n in (gpus[0], nics[0])]
    ids_a = claims.write_claim_spec("0b7c6a5e-1111-4c3a-9d1e-aaaaaaaaaaaa", pair)
    ids_b = claims.write_claim_spec("0b7c6a5e-2222-4c3a-9d1e-bbbbbbbbbbbb", [(gpus[1], table[gpus[1]])])
    v = cdi_validator.run(tmp_path, [[i for ids in ids_a for i in ids], ids_b[0]])
    assert v.ok, json.dumps(v.report, indent=1)
    assert not v.report["cacheErrors"]
    a, b = v.report["injections"]
    assert a["error"] is None and not a["unresolved"] and b["error"] is None and not b["unresolved"]
    gpu_minor = table[gpus[0]].minor if table[gpus[0]].minor is not None else table[gpus[0]].index
    assert f"/dev/nvidia{gpu_minor}" in {n["path"] for n in a["deviceNodes"]}
    assert "/dev/nvidiactl" in {n["path"] for n in a["deviceNodes"]}
    assert any(e.startswith(f"TOPO_DEV_{nics[0].replace('-', '_').upper()}=") for e in a["env"])
    assert not any(e.startswith(f"TOPO_DEV_{gpus[0].replace('-', '_').upper()}=") for e in b["env"])
    claims.remove_claim_spec("0b7c6a5e-1111-4c3a-9d1e-aaaaaaaaaaaa")
    claims.remove_claim_spec("0b7c6a5e-1111-4c3a-9d1e-aaaaaaaaaaaa")  # idempotent
    assert claims.claim_uids() == ["0b7c6a5e-2222-4c3a-9d1e-bbbbbbbbbbbb"]
