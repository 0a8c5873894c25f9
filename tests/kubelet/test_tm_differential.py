"""Differential test: our Topology Manager model (allocator/topologymanager) against the
real kubelet's topologymanager + devicemanager code (the Go harness, current Kubernetes
line of k8s_versions.json), on generated cases.

Two kinds of case, in the JSON shapes of the model's evaluate_merge_case and
evaluate_admission_case:

* merge cases: NUMA machines of 1-8 nodes (and a few of 9, where the kubelet refuses to
  start unless max-allowable-numa-nodes allows it), every policy and option, 1-3
  providers each with 1-2 resources and random hints (nil, [], masks, preferred or not).
  The real policy's Merge gives the best hint and admit; every field either side
  reports must agree.
* admission cases: a node with 1-2 device resources (devices on NUMA nodes, some without
  topology, some unhealthy, some already in use), a pod with init and app containers,
  a stub plugin answering GetPreferredAllocation with a fixed rule; the real device
  manager + Topology Manager admit it. Plus cases built to make the kubelet fill from
  both of its last buckets (`fallback_cases`). Compared both ways, field by field:
  admit, reason, message, each container's stored affinity, the device manager's hints,
  the devices per container and resource, every GetPreferredAllocation and Allocate
  call (see "admission" below for the few places the kubelet is random).

Every mismatch fails, with the case and both answers printed. The guard tests below run
deliberately broken models against the same real results and require mismatches: they
are how we know the comparison can fail.
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
N_FALLBACK = 40
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


def _reaches_fallback_order(allocation: dict[str, Any]) -> bool:
    """In the model's report, this allocation filled from the unaligned devices while some
    without NUMA affinity were free too, so the order of the two decides what it gets."""
    chosen, unaligned, none = (set(allocation[k]) for k in ("devices", "unaligned", "no_affinity"))
    return (allocation["case"] == "B" and bool(chosen & unaligned) and bool(none)
            and not (unaligned | none) <= chosen)


def fallback_cases(seed: int, n: int) -> list[dict[str, Any]]:
    """Cases where the kubelet must fill from BOTH its last buckets (devicesToAllocate,
    Case B: unaligned devices before devices without NUMA affinity).

    That takes a stored affinity narrower than the devices a container needs: a GPU that
    only NUMA 0 has pulls the merged affinity (best-effort) to {0}, while the same
    container asks for more NICs than NUMA 0 holds; some NICs sit on other nodes, some
    report no topology, and the plugin answers too little (no GetPreferredAllocation, or a
    fixed partial answer). Candidates are drawn at random and kept where the model says
    the order matters; the real kubelet then checks the model there.
    """
    _, evaluate = _model()
    rng = random.Random(seed)
    cases: list[dict[str, Any]] = []
    tries = 0
    while len(cases) < n:
        tries += 1
        assert tries < 50 * n, "fallback case generator cannot reach the fallback order"
        nodes = list(range(rng.choice([2, 2, 3, 4])))
        gpus = [{"id": f"gpu{i}", "numa_nodes": [0], "healthy": True} for i in range(rng.randint(1, 3))]
        nics: list[dict[str, Any]] = []
        for i in range(rng.randint(1, 2)):
            nics.append({"id": f"nic{len(nics)}", "numa_nodes": [0], "healthy": True})
        for i in range(rng.randint(1, 3)):
            nics.append({"id": f"nic{len(nics)}", "numa_nodes": [rng.choice(nodes[1:])], "healthy": True})
        for i in range(rng.randint(1, 3)):
            nics.append({"id": f"nic{len(nics)}", "numa_nodes": None, "healthy": True})
        rng.shuffle(nics)
        for i, d in enumerate(nics):
            d["id"] = f"nic{i}"
        aligned = [d["id"] for d in nics if d["numa_nodes"] == [0]]
        rule = rng.choice([None, None, "fixed"])
        if rule == "fixed":
            rule = rng.sample(aligned, 1)
        in_use = {}
        if rng.random() < 0.3:
            others = [d["id"] for d in nics if d["numa_nodes"] != [0]]
            in_use["example.com/nic"] = rng.sample(others, 1)
        free = len(nics) - len(in_use.get("example.com/nic", []))
        want = rng.randint(len(aligned) + 1, max(len(aligned) + 1, free - 1))
        case = {"id": f"fallback-{seed}-{len(cases)}", "numa_nodes": nodes, "policy": "best-effort",
                "scope": rng.choice(["container", "pod"]), "options": {},
                "distances": {str(a): [10 if a == b else 20 for b in nodes] for a in nodes},
                "resources": {"example.com/gpu": {"devices": gpus, "preferred": None},
                              "example.com/nic": {"devices": nics, "preferred": rule}},
                "in_use": in_use,
                "pod": {"uid": f"fallback-{len(cases)}", "name": f"fallback-{len(cases)}", "init_containers": [],
                        "containers": [{"name": "app0", "limits": {"example.com/gpu": 1, "example.com/nic": want}}]}}
        model = evaluate(case)
        if model.get("admit") and any(_reaches_fallback_order(a) for a in model.get("allocations", [])):
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
    retried = [r["id"] for r in results if r.get("harness_tries")]
    if retried:  # the restarted kubelet lost the filler to a late checkpoint write (tmcases.go): run again
        print(f"{mode}: {len(retried)} cases set up again after a stale checkpoint: {retried[:10]}")
    bad = [r for r in results if r.get("harness_error")]
    assert not bad, f"harness could not evaluate {len(bad)} cases, e.g. {bad[:3]}"
    return results


def _fmt(case, real, model) -> str:
    return (f"case:  {json.dumps(case)}\nreal:  {json.dumps(real, sort_keys=True)}\n"
            f"model: {json.dumps(model, sort_keys=True, default=str)}")


# ---------------------------------------------------------------- merge

def compare_merge(case, real, model) -> list[str]:
    """Every field either side reports (admit, affinity, its mask, preferred, start-up error)."""
    keys = (set(real) | set(model)) - {"id"}
    return [f"{k}: real {real.get(k, '<missing>')!r} model {model.get(k, '<missing>')!r}"
            for k in sorted(keys) if real.get(k, "<missing>") != model.get(k, "<missing>")]


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
#
# Both sides are brought to one shape (`_norm_real`, `_norm_model`) and every key of
# either side is compared: a field one side reports and the other does not is a
# mismatch. The only relaxations are where the kubelet is random (Go map order):
# * a fill the model marks `arbitrary` (several devices, fewer needed): the chosen
#   devices may differ, but their number may not, nor (where the random pick is within
#   one of the kubelet's buckets: no reuse, no over-long plugin answer) how many came
#   from each bucket (aligned / unaligned / no NUMA affinity);
# * after such a fill, later containers asking for that resource start from different
#   free devices: their hints, affinity and devices may differ (sizes may not); where
#   the outcome differs too, such a container may be where it turned;
# * the container whose allocation failed (the kubelet walks its resources in map
#   order, so which ones it allocated before failing varies): skipped, and its error
#   message may be the one the model gives for another order of its resources.

def _hint_key(h: dict[str, Any] | None) -> tuple[Any, ...]:
    h = h or {"affinity": None, "preferred": False}
    return (None if h.get("affinity") is None else tuple(h["affinity"]), bool(h.get("preferred")))


def _hints_key(per_res: dict[str, Any] | None) -> dict[str, Any]:
    return {res: None if hs is None else tuple(_hint_key(h) for h in hs) for res, hs in (per_res or {}).items()}


def _containers(case: dict[str, Any]) -> list[str]:
    return [c["name"] for c in case["pod"]["init_containers"]] + [c["name"] for c in case["pod"]["containers"]]


def _norm_real(case, real) -> dict[str, Any]:
    out: dict[str, Any] = {k: real.get(k) for k in ("admit", "reason", "message")}
    out["affinity"] = {c: _hint_key((real.get("affinities") or {}).get(c)) for c in _containers(case)}
    out["hints"] = {c: _hints_key(h) for c, h in (real.get("hints") or {}).items()}
    out["devices"] = {(a["container"], a["resource"]): tuple(sorted(a["devices"]))
                      for a in real.get("allocations") or [] if a["devices"]}
    out["preferred"] = {}
    for p in real.get("preferred_calls") or []:
        call = (tuple(p["available"]), tuple(p["must_include"]), p["size"], tuple(sorted(p["answer"])))
        out["preferred"].setdefault((p["container"], p["resource"]), []).append(call)
    out["allocate"] = {}
    for a in real.get("allocate_calls") or []:
        out["allocate"].setdefault((a["container"], a["resource"]), []).append(tuple(sorted(a["devices"])))
    return out


def _norm_model(case, model) -> dict[str, Any]:
    out: dict[str, Any] = {k: model.get(k) for k in ("admit", "reason", "message")}
    out["affinity"] = {c: _hint_key((model.get("affinities") or {}).get(c)) for c in _containers(case)}
    out["hints"] = {}
    for m in model.get("merges") or []:
        key = "" if model.get("scope") == "pod" else m["containers"][0]
        out["hints"][key] = _hints_key({r["resource"]: r["hints"] for r in m["resources"]})
    out["devices"], out["preferred"], out["allocate"] = {}, {}, {}
    # Where a random pick may span buckets: reuse, or a plugin answer longer than the request.
    out["arbitrary"], out["mixed_pick"] = set(), set()
    for a in model.get("allocations") or []:
        key = (a["container"], a["resource"])
        if a["devices"]:
            out["devices"][key] = tuple(sorted(a["devices"]))
        if a.get("preferred_call") is not None:
            p = a["preferred_call"]
            out["preferred"].setdefault(key, []).append(
                (tuple(sorted(p["available"])), tuple(sorted(p["must_include"])), p["size"], tuple(sorted(p["answer"]))))
        if a.get("allocate_rpc"):
            out["allocate"].setdefault(key, []).append(tuple(sorted(a["devices"])))
        if a.get("arbitrary"):
            out["arbitrary"].add(key)
        p = a.get("preferred_call")
        if a.get("reused") or (p is not None and len(p["accepted"]) > p["size"]):
            out["mixed_pick"].add(key)
    return out


def _bucket(case, resource: str, device: str, affinity: tuple[int, ...] | None) -> str:
    """The kubelet's filterByAffinity bucket of one device for a stored affinity."""
    devices = {d["id"]: d.get("numa_nodes") or [] for d in case["resources"][resource]["devices"]}
    if affinity is None or not any(devices.values()):
        return "no-affinity"
    nodes = devices[device]
    if any(n in affinity for n in nodes):
        return "aligned"
    return "unaligned" if any(n != -1 for n in nodes) else "no-affinity"


def _resource_orders(case, container: str) -> list[dict[str, Any]]:
    """The case with `container`'s resources listed in every order (the model allocates in
    the listed order; the kubelet in Go map order)."""
    import itertools

    out = []
    for kind in ("init_containers", "containers"):
        for i, c in enumerate(case["pod"][kind]):
            if c["name"] == container:
                for perm in itertools.permutations(c["limits"].items()):
                    variant = json.loads(json.dumps(case))
                    variant["pod"][kind][i]["limits"] = dict(perm)
                    out.append(variant)
    return out


def compare_admission(case, real, model, evaluate=None) -> list[str]:
    if (real.get("error") is None) != (model.get("error") is None):
        return [f"start-up error: real {real.get('error')!r} model {model.get('error')!r}"]
    if real.get("error") is not None:
        return [] if real["error"] == model["error"] else [f"error: real {real['error']!r} model {model['error']!r}"]
    r, m = _norm_real(case, real), _norm_model(case, model)
    outcome = [f"{k}: real {r[k]!r} model {m[k]!r}" for k in ("admit", "reason", "message") if r[k] != m[k]]
    if outcome == [f"message: real {r['message']!r} model {m['message']!r}"] and evaluate and model.get("failed_container"):
        # Which of the failed container's resources the kubelet tried first is random.
        if r["message"] in {evaluate(v).get("message") for v in _resource_orders(case, model["failed_container"])}:
            outcome = []
    diffs: list[str] = []
    if r["hints"].get("") != m["hints"].get(""):  # pod scope: computed before any allocation
        diffs.append(f"device hints for the pod: real {r['hints'].get('')} model {m['hints'].get('')}")
    limits = {c["name"]: c["limits"] for kind in ("init_containers", "containers") for c in case["pod"][kind]}
    keys = set(r["devices"]) | set(m["devices"]) | set(r["preferred"]) | set(m["preferred"]) \
        | set(r["allocate"]) | set(m["allocate"])
    drifted: set[str] = set()  # resources whose free devices an earlier random pick changed
    for c in _containers(case):
        tainted = bool(drifted & set(limits[c]))
        if tainted and outcome:
            # A random pick upstream may decide this container's fate: nothing after is comparable.
            return diffs
        if not tainted:
            if r["affinity"][c] != m["affinity"][c]:
                diffs.append(f"affinity of {c}: real {r['affinity'][c]} model {m['affinity'][c]}")
            if r["hints"].get(c) != m["hints"].get(c):
                diffs.append(f"device hints for {c}: real {r['hints'].get(c)} model {m['hints'].get(c)}")
        if c == model.get("failed_container"):
            continue
        for res in sorted({k[1] for k in keys if k[0] == c}):
            key = (c, res)
            exact = not tainted and key not in m["arbitrary"]
            got, want = r["devices"].get(key, ()), m["devices"].get(key, ())
            if len(got) != len(want):
                diffs.append(f"{key}: device count real {len(got)} {list(got)} model {len(want)} {list(want)}")
            elif exact and got != want:
                diffs.append(f"{key}: devices real {list(got)} model {list(want)}")
            elif not tainted and key not in m["mixed_pick"]:
                aff = r["affinity"][c][0]
                rb = sorted(_bucket(case, res, d, aff) for d in got)
                mb = sorted(_bucket(case, res, d, aff) for d in want)
                if rb != mb:
                    diffs.append(f"{key}: devices by NUMA bucket real {rb} {list(got)} model {mb} {list(want)}")
            rp, mp = r["preferred"].get(key, []), m["preferred"].get(key, [])
            if not tainted and rp != mp:
                diffs.append(f"{key}: GetPreferredAllocation (available, must_include, size, answer) "
                             f"real {rp} model {mp}")
            ra, ma = r["allocate"].get(key, []), m["allocate"].get(key, [])
            if [len(x) for x in ra] != [len(x) for x in ma] or (exact and ra != ma):
                diffs.append(f"{key}: Allocate RPCs real {ra} model {ma}")
            if key in m["arbitrary"]:
                drifted.add(res)
    return outcome + diffs


def admission_failures(cases, real, evaluate=None) -> list[str]:
    evaluate = evaluate or _model()[1]
    failures = []
    for case, r in zip(cases, real):
        m = evaluate(case)
        d = compare_admission(case, r, m, evaluate)
        if d:
            failures.append("; ".join(d) + "\n" + _fmt(case, r, m))
    return failures


@pytest.fixture(scope="module")
def admission_results(harness, tmp_path_factory):
    cases = admission_cases(seed=7, n=N_ADMISSION) + fallback_cases(seed=11, n=N_FALLBACK)
    return cases, run_real(harness, tmp_path_factory.mktemp("tm-admission"), "tm-admission", cases)


def test_admission_cases_agree_with_the_kubelet(admission_results):
    cases, real = admission_results
    failures = admission_failures(cases, real)
    admitted = sum(1 for r in real if r.get("admit"))
    assert 0.2 * len(cases) < admitted < 0.95 * len(cases), f"generator imbalance: {admitted} admitted"
    assert any(r.get("preferred_calls") for r in real)
    assert not failures, f"{len(failures)} of {len(cases)} admission cases differ; first ones:\n\n" + "\n\n".join(failures[:5])


def test_admission_comparison_catches_a_model_that_allocates_nothing(admission_results):
    """A model that admits like the kubelet but reports no devices, no GetPreferredAllocation
    or Allocate calls and no affinities must fail the comparison wherever the kubelet
    allocated something or stored an affinity."""
    cases, real = admission_results
    _, evaluate = _model()

    def empty(case):
        out = evaluate(case)
        return {**out, "allocations": [], "affinities": {}}

    failures = admission_failures(cases, real, empty)
    allocated = sum(1 for r in real if r.get("allocations"))
    print(f"model without allocations/affinities: {len(failures)} of {len(cases)} cases differ "
          f"({allocated} where the kubelet allocated), e.g.\n{failures[0][:600] if failures else ''}")
    assert allocated > 50 and len(failures) >= allocated


def test_admission_comparison_catches_a_model_without_hints(admission_results):
    cases, real = admission_results
    _, evaluate = _model()
    failures = admission_failures(cases, real, lambda case: {**evaluate(case), "merges": []})
    hinted = sum(1 for r in real if any(h for h in (r.get("hints") or {}).values()))
    assert hinted > 50 and len(failures) >= hinted


def test_admission_comparison_catches_a_swapped_fallback_order(admission_results, monkeypatch):
    """The kubelet fills a Case B shortfall from the unaligned devices before those without
    NUMA affinity (devicesToAllocate). A model that swaps the two must fail against the
    real kubelet: the fallback cases (fallback_cases) make the kubelet take that path."""
    import importlib

    # The package re-exports the function under the module's name: fetch the module itself.
    dta = importlib.import_module("allocator.topologymanager.devices_to_allocate")

    right = dta.filter_by_affinity

    def swapped(*args, **kw):
        aligned, unaligned, none = right(*args, **kw)
        return aligned, none, unaligned

    monkeypatch.setattr(dta, "filter_by_affinity", swapped)
    cases, real = admission_results
    failures = admission_failures(cases, real)
    print(f"model with the fallback order swapped: {len(failures)} of {len(cases)} cases differ, e.g.\n"
          f"{failures[0][:600] if failures else ''}")
    assert len(failures) >= N_FALLBACK // 2
