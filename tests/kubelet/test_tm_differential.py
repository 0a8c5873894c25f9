"""Differential test: our Topology Manager model (allocator/topologymanager) against the
real kubelet's topologymanager + devicemanager code (the Go harness), on generated cases.

Two kinds of case, in the JSON shapes of the model's evaluate_merge_case and
evaluate_admission_case:

* merge cases: NUMA machines of 1-8 nodes (and a few of 9, where the kubelet refuses to
  start unless max-allowable-numa-nodes allows it), every policy and option, 1-3
  providers each with 1-2 resources and random hints (nil, [], masks, preferred or not).
  The real policy's Merge gives the best hint and admit; the model must agree exactly.
* admission cases: a node with 1-2 device resources (devices on NUMA nodes, some without
  topology, some unhealthy, some already in use), a pod with init and app containers,
  a stub plugin answering GetPreferredAllocation with a fixed rule; the real device
  manager + Topology Manager admit it. The model must agree on admit/reject and the
  reason, each container's affinity, and the devices and GetPreferredAllocation requests
  wherever the kubelet's choice is not random (the model marks random fills
  "arbitrary"; after one, later choices can differ legitimately and are only checked
  for their sizes).

Every mismatch fails, with the case and both answers printed.
"""

from __future__ import annotations

import json
import random
import subprocess
from typing import Any

import pytest
from kubelet_testlib import ROOT, unshare_prefix

# The first test of a fresh machine builds the harness/kubelet (minutes on 2 cores;
# scripts/kubelet_tests.sh prepare does it up front). Each run below has its own timeout.
pytestmark = pytest.mark.timeout(1500)

N_MERGE = 3000
N_ADMISSION = 400
POLICIES = ["none", "best-effort", "restricted", "single-numa-node"]
DISTANCE_CHOICES = [11, 12, 16, 20, 21, 22, 30, 32]


def _model():
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from topo_testkit.tm_cases import evaluate_admission_case, evaluate_merge_case

    return evaluate_merge_case, evaluate_admission_case


# ---------------------------------------------------------------- case generation

def _numa_nodes(rng: random.Random, n: int) -> list[int]:
    if rng.random() < 0.15 and n < 8:
        # Sparse NUMA IDs happen (offline nodes, CXL memory nodes).
        return sorted(rng.sample(range(12), n))
    return list(range(n))


def _distances(rng: random.Random, nodes: list[int]) -> dict[str, list[int]] | None:
    if rng.random() < 0.1:
        return None  # the kubelet errors out with prefer-closest-numa-nodes and no distances
    top = max(nodes)
    rows: dict[int, list[int]] = {a: [0] * (top + 1) for a in nodes}
    for a in nodes:
        for b in nodes:
            if a == b:
                rows[a][b] = 10
            elif b > a:
                rows[a][b] = rows[b][a] = rng.choice(DISTANCE_CHOICES)
    return {str(a): row for a, row in rows.items()}


def _options(rng: random.Random, n: int) -> dict[str, str]:
    opts: dict[str, str] = {}
    if rng.random() < 0.4:
        opts["prefer-closest-numa-nodes"] = rng.choice(["true", "true", "false"])
    if n > 8 or rng.random() < 0.05:
        opts["max-allowable-numa-nodes"] = str(rng.choice([8, n, n + 2, 16]))
    return opts


def _mask(rng: random.Random, nodes: list[int]) -> list[int]:
    k = rng.choices(range(1, len(nodes) + 1), weights=[4] + [1] * (len(nodes) - 1))[0]
    return sorted(rng.sample(nodes, k))


def _hints(rng: random.Random, nodes: list[int]) -> list[dict[str, Any]] | None:
    r = rng.random()
    if r < 0.1:
        return None
    if r < 0.2:
        return []
    out = []
    for _ in range(rng.randint(1, 4)):
        if rng.random() < 0.05:
            out.append({"affinity": None, "preferred": rng.random() < 0.5})
        else:
            out.append({"affinity": _mask(rng, nodes), "preferred": rng.random() < 0.5})
    return out


def merge_cases(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        count = rng.choices(range(1, 10), weights=[2, 5, 3, 4, 1, 2, 1, 3, 1])[0]
        nodes = _numa_nodes(rng, count)
        providers: list[Any] = []
        for _ in range(rng.randint(1, 3)):
            r = rng.random()
            if r < 0.1:
                providers.append(None)
            elif r < 0.15:
                providers.append({})
            else:
                providers.append({res: _hints(rng, nodes)
                                  for res in rng.sample(["gpu", "nic", "cpu", "memory"], rng.randint(1, 2))})
        case = {"id": f"merge-{seed}-{i}", "numa_nodes": nodes, "policy": rng.choice(POLICIES),
                "scope": rng.choice(["container", "pod"]), "options": _options(rng, count),
                "distances": _distances(rng, nodes), "providers": providers}
        if rng.random() < 0.05:
            case["feature_gates"] = {"alpha": rng.random() < 0.5, "beta": rng.random() < 0.5}
        cases.append(case)
    return cases


def admission_cases(seed: int, n: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        count = rng.choices([1, 2, 3, 4, 8], weights=[1, 5, 1, 3, 1])[0]
        nodes = _numa_nodes(rng, count)
        resources: dict[str, Any] = {}
        in_use: dict[str, list[str]] = {}
        for r_i, res in enumerate(rng.sample(["example.com/gpu", "example.com/nic"], rng.randint(1, 2))):
            devs = []
            no_topo = rng.random() < 0.15
            for d in range(rng.randint(1, 10)):
                numa = None
                if not (no_topo and rng.random() < 0.5):
                    numa = [rng.choice(nodes)] if rng.random() < 0.9 else sorted(rng.sample(nodes, min(2, len(nodes))))
                devs.append({"id": f"{res.split('/')[1]}{d}", "numa_nodes": numa, "healthy": rng.random() > 0.08})
            rule = rng.choice([None, "lowest", "lowest", "fixed"])
            if rule == "fixed":
                rule = [d["id"] for d in rng.sample(devs, rng.randint(1, len(devs)))]
            resources[res] = {"devices": devs, "preferred": rule}
            if rng.random() < 0.5:
                used = rng.sample(devs, rng.randint(0, len(devs) // 2))
                if used:
                    in_use[res] = [d["id"] for d in used]
        names = list(resources)

        def limits(max_each: int, names: list[str] = names) -> dict[str, int]:
            out = {}
            for res in rng.sample(names, rng.randint(1, len(names))):
                out[res] = rng.randint(1, max_each)
            return out

        pod = {"uid": f"pod-{i}", "name": f"pod-{i}",
               "init_containers": [{"name": f"init{j}", "limits": limits(3), "restartable": rng.random() < 0.2}
                                   for j in range(rng.choices([0, 1, 2], weights=[6, 3, 1])[0])],
               "containers": [{"name": f"app{j}", "limits": limits(4)} for j in range(rng.randint(1, 2))]}
        policy = rng.choice(POLICIES)
        case = {"id": f"adm-{seed}-{i}", "numa_nodes": nodes, "policy": policy,
                "scope": rng.choice(["container", "pod"]), "options": _options(rng, count),
                "distances": _distances(rng, nodes) or {str(a): [10 if a == b else 20 for b in range(max(nodes) + 1)]
                                                         for a in nodes},
                "resources": resources, "in_use": in_use, "pod": pod}
        cases.append(case)
    return cases


# ---------------------------------------------------------------- running the real code

def run_real(harness, tmp_path, mode: str, cases: list[dict[str, Any]], timeout: float = 900) -> list[dict[str, Any]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    inp, out = tmp_path / f"{mode}.jsonl", tmp_path / f"{mode}-out.jsonl"
    inp.write_text("".join(json.dumps(c) + "\n" for c in cases))
    cmd = [str(harness.binary), "-mode", mode, "-in", str(inp), "-out", str(out)]
    if mode == "tm-admission":
        cmd = [*unshare_prefix(), *cmd, "-workdir", str(tmp_path / "work")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"harness failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    results = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    assert len(results) == len(cases)
    bad = [r for r in results if r.get("harness_error")]
    assert not bad, f"harness could not evaluate {len(bad)} cases, e.g. {bad[:3]}"
    return results


def _fmt(case, real, model) -> str:
    return (f"case:  {json.dumps(case)}\nreal:  {json.dumps(real, sort_keys=True)}\n"
            f"model: {json.dumps(model, sort_keys=True, default=str)}")


# ---------------------------------------------------------------- merge

def compare_merge(case, real, model) -> list[str]:
    diffs = []
    if (real.get("error") is None) != (model.get("error") is None):
        diffs.append(f"start-up error: real {real.get('error')!r} model {model.get('error')!r}")
        return diffs
    if real.get("error") is not None:
        if real["error"] != model["error"]:
            diffs.append(f"error message: real {real['error']!r} model {model['error']!r}")
        return diffs
    for k in ("admit", "affinity", "preferred"):
        if real[k] != model[k]:
            diffs.append(f"{k}: real {real[k]!r} model {model[k]!r}")
    return diffs


@pytest.fixture(scope="module")
def merge_results(harness, tmp_path_factory):
    cases = merge_cases(seed=20240601, n=N_MERGE)
    return cases, run_real(harness, tmp_path_factory.mktemp("tm-merge"), "tm-merge", cases)


def merge_failures(cases, real) -> list[str]:
    evaluate_merge_case, _ = _model()
    failures = []
    for case, r in zip(cases, real):
        m = evaluate_merge_case(case)
        d = compare_merge(case, r, m)
        if d:
            failures.append("; ".join(d) + "\n" + _fmt(case, r, m))
    return failures


def test_merge_cases_agree_with_the_kubelet(merge_results):
    cases, real = merge_results
    failures = merge_failures(cases, real)
    kinds = {(c["policy"], bool(r.get("error")), r.get("admit")) for c, r in zip(cases, real)}
    # The generator must reach every policy, admits and rejections, and start-up errors.
    assert {k[0] for k in kinds} == set(POLICIES)
    assert any(k[1] for k in kinds) and any(k[2] is False and not k[1] for k in kinds)
    assert not failures, f"{len(failures)} of {len(cases)} merge cases differ; first ones:\n\n" + "\n\n".join(failures[:5])


def test_differential_catches_a_mutated_model(merge_results, monkeypatch):
    """Proof the comparison has teeth: reverse the model's tie-break between equally wide
    masks (the kubelet prefers the numerically lower mask) and the same real results
    must show mismatches."""
    from allocator.topologymanager.bitmask import BitMask

    def wrong(self, other):
        return self.count() < other.count() or (self.count() == other.count() and self.value > other.value)

    monkeypatch.setattr(BitMask, "is_narrower_than", wrong)
    cases, real = merge_results
    failures = merge_failures(cases, real)
    print(f"mutated model: {len(failures)} of {len(cases)} merge cases differ, e.g.\n{failures[0] if failures else ''}")
    assert len(failures) > 10


# ---------------------------------------------------------------- admission

def compare_admission(case, real, model) -> list[str]:
    diffs = []
    if (real.get("error") is None) != (model.get("error") is None):
        return [f"start-up error: real {real.get('error')!r} model {model.get('error')!r}"]
    if real.get("error") is not None:
        return [] if real["error"] == model["error"] else [f"error: real {real['error']!r} model {model['error']!r}"]
    if real["admit"] != model["admit"]:
        diffs.append(f"admit: real {real['admit']} ({real['reason']}: {real['message']}) "
                     f"model {model['admit']} ({model.get('reason')}: {model.get('message')})")
        return diffs
    if real["reason"] != model.get("reason"):
        diffs.append(f"reason: real {real['reason']!r} model {model.get('reason')!r}")
    for cname, h in (model.get("affinities") or {}).items():
        if real["affinities"].get(cname) != h:
            diffs.append(f"affinity of {cname}: real {real['affinities'].get(cname)} model {h}")
    if not real["admit"]:
        return diffs
    real_allocs = {(a["container"], a["resource"]): sorted(a["devices"]) for a in real["allocations"] or []}
    real_prefs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for p in real["preferred_calls"] or []:
        real_prefs.setdefault((p["container"], p["resource"]), []).append(p)
    arbitrary_before = set()  # resources where an earlier random choice makes later ones free to differ
    for a in model.get("allocations", []):
        key = (a["container"], a["resource"])
        want = sorted(a["devices"])
        if not a.get("allocate_rpc", True) and not want:
            continue
        got = real_allocs.get(key, [])
        exact = a["resource"] not in arbitrary_before and not a.get("arbitrary")
        mp, rp = a.get("preferred_call"), real_prefs.get(key, [])
        if a["resource"] not in arbitrary_before:
            if (mp is None) != (not rp):
                diffs.append(f"{key}: GetPreferredAllocation called: real {bool(rp)} model {mp is not None}")
            elif mp is not None:
                r0 = rp[0]
                for f in ("available", "must_include", "size"):
                    mv = sorted(mp[f]) if isinstance(mp[f], list) else mp[f]
                    if r0[f] != mv:
                        diffs.append(f"{key}: GetPreferredAllocation {f}: real {r0[f]} model {mv}")
        if exact and got and got != want:
            diffs.append(f"{key}: devices real {got} model {want}")
        if len(got) != len(set(want)) and got:
            diffs.append(f"{key}: device count real {len(got)} model {len(want)}")
        if a.get("arbitrary"):
            arbitrary_before.add(a["resource"])
    return diffs


def test_admission_cases_agree_with_the_kubelet(harness, tmp_path):
    _, evaluate_admission_case = _model()
    cases = admission_cases(seed=7, n=N_ADMISSION)
    real = run_real(harness, tmp_path, "tm-admission", cases)
    failures = []
    for case, r in zip(cases, real):
        m = evaluate_admission_case(case)
        d = compare_admission(case, r, m)
        if d:
            failures.append("; ".join(d) + "\n" + _fmt(case, r, m))
    admitted = sum(1 for r in real if r.get("admit"))
    assert 0.2 * len(cases) < admitted < 0.95 * len(cases), f"generator imbalance: {admitted} admitted"
    assert any(r.get("preferred_calls") for r in real)
    assert not failures, f"{len(failures)} of {len(cases)} admission cases differ; first ones:\n\n" + "\n\n".join(failures[:5])
