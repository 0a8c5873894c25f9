"""Helpers for the tests that drive the real kubelet code (tests/kubelet).

The Go harness (tests/kubelet/harness) runs a script of steps against the real
device manager and Topology Manager inside a private mount namespace and returns
one JSON result per step; these helpers write the scripts, run the harness and
check what it saw.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn, TypeVar

import kubelet_build

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable
KUBELET_DIR = "/var/lib/kubelet"
PLUGIN_DIR = f"{KUBELET_DIR}/device-plugins"
TAP_DIR = f"{KUBELET_DIR}/tap"
GPU = "nvidia.com/gpu"
NIC = "topo.dev/nic"


# ---- skip or fail: one rule for every real-kubelet test ----

#: Set by .ci/run (and by scripts/kubelet_tests.sh): a real-kubelet test that cannot run is a failure.
REQUIRE_ENV = "TOPO_DP_REQUIRE_KUBELET_E2E"
T = TypeVar("T")


def kubelet_tests_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in ("1", "true", "yes")


def unavailable(what: str, reason: str) -> NoReturn:
    """A real-kubelet test cannot run here: skip with the reason printed, or, where
    TOPO_DP_REQUIRE_KUBELET_E2E=1 (CI), fail with it."""
    import pytest

    if kubelet_tests_required():
        pytest.fail(f"{what} is required here ({REQUIRE_ENV}=1) but cannot run: {reason}", pytrace=False)
    print(f"\nSKIP ({what}): {reason}", file=sys.stderr)
    pytest.skip(f"{what}: {reason}")


def build_or_skip(what: str, build: Callable[[], T]) -> T:
    """Run a kubelet_build step. A tool that cannot exist here (no Go, no busybox-static)
    goes through `unavailable`; a build that fails is always a failure, never a skip."""
    import pytest

    try:
        return build()
    except kubelet_build.BuildUnavailable as e:
        unavailable(what, str(e))
    except Exception as e:  # noqa: BLE001 - a failed build must fail the tests, with its output
        pytest.fail(f"{what}: build failed: {e}", pytrace=False)


def unshare_prefix(net: bool = False) -> list[str]:
    """How to enter a private mount namespace (and with `net`, a private network namespace
    with only a loopback, still down): plain as root, via a user namespace otherwise."""
    if shutil.which("unshare") is None:
        raise RuntimeError("`unshare` (util-linux) is missing")
    private = ["--mount", *(["--net"] if net else []), "--propagation", "private"]
    if os.geteuid() == 0:
        return ["unshare", *private]
    return ["unshare", "--user", "--map-root-user", *private]


def daemon_argv(simulate: str, *extra: str, plugin_dir: str | None = None, wrapper: Sequence[str] = ()) -> list[str]:
    """Our daemon as the harness starts it (PYTHONPATH is the checkout)."""
    argv = [PYTHON, *wrapper] if wrapper else [PYTHON, "-m", "plugin"]
    argv += ["serve", "--simulate", simulate, "--kubelet-root-dir", KUBELET_DIR,
             "--device-id-strategy", "index", "--log-level", "debug"]
    if plugin_dir:
        argv += ["--device-plugin-path", plugin_dir]
    return argv + list(extra)


def plugin_env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


_CLI_CACHE: dict[tuple[str, ...], Any] = {}


def cli_json(*args: str) -> Any:
    """`topo-device-plugin <args> --format json`, parsed (run in-process through click; memoised)."""
    if args in _CLI_CACHE:
        return _CLI_CACHE[args]
    from click.testing import CliRunner

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from plugin.cli import cli

    res = CliRunner().invoke(cli, [*args, "--format", "json"], catch_exceptions=False)
    if res.exit_code != 0:
        raise AssertionError(f"plugin {' '.join(args)} failed ({res.exit_code}):\n{res.output}")
    _CLI_CACHE[args] = data = json.loads(res.stdout)
    return data


def discover(simulate: str) -> dict[str, Any]:
    return cli_json("discover", "--simulate", simulate, "--device-id-strategy", "index")


def machine_for(simulate: str) -> dict[str, Any]:
    """The harness machine (cadvisor NUMA nodes and distances) matching a simulated node."""
    sys.path.insert(0, str(ROOT))
    from allocator.topologymanager import machine_numa
    from plugin.sources.simulated import load_simulated

    nodes, rows = machine_numa(load_simulated(simulate))
    return {"numa_nodes": list(nodes), "distances": {str(k): v for k, v in rows.items()}}


def preferred_offline(simulate: str, resource: str, size: int, available: Iterable[str],
                      must_include: Iterable[str], partners: dict[str, Sequence[str]] | None = None) -> list[str]:
    """What `plugin allocate` (offline, same allocator) answers for one GetPreferredAllocation,
    with the GPU–NIC pairing partners the call had (`--with`)."""
    args = ["allocate", "--simulate", simulate, "--device-id-strategy", "index", "--resource", resource,
            "--size", str(size), "--available", ",".join(available)]
    must = list(must_include)
    if must:
        args += ["--must-include", ",".join(must)]
    for res, ids in sorted((partners or {}).items()):
        args += ["--with", f"{res}={','.join(ids)}"]
    return list(cli_json(*args)["ids"])


def call_partners(rpcs: list[dict[str, Any]]) -> list[dict[str, tuple[str, ...]]]:
    """The spec's pairing partners of each tapped GetPreferredAllocation, from the tapped call order
    (no window: the scenarios run the daemon with a window far longer than any gap between calls)."""
    from topo_testkit.pairing_oracle import LoggedCall, spec_partners

    calls = [LoggedCall(r["method"], r["resource"], tuple(r["request"][0]) if r["method"] == "Allocate" else ())
             for r in rpcs if r["method"] in ("GetPreferredAllocation", "Allocate") and not r.get("error")]
    return spec_partners(calls, None)


class HarnessError(AssertionError):
    pass


class Harness:
    """Runs scripts through the Go harness binary built against one Kubernetes line."""

    def __init__(self, binary: pathlib.Path, line: kubelet_build.Line):
        self.binary = binary
        self.line = line

    @property
    def has_121994_race(self) -> bool:
        """Kubernetes 1.34 and older key device-plugin clients by resource name only: when
        an old ListAndWatch stream ends, the kubelet disconnects whatever client is current
        (kubernetes #121994). Later releases (the fix, PR #135437; read in 1.37) key them by
        (name, socket path) and refuse a second connection on the same path instead."""
        major, minor = (int(x) for x in self.line.minor.split("."))
        return (major, minor) <= (1, 34)

    def __repr__(self) -> str:
        return f"Harness({self.line.name} {self.line.kubernetes})"

    def run(self, steps: list[dict[str, Any]], machine: dict[str, Any], workdir: pathlib.Path,
            timeout: float = 240, allow_errors: bool = False) -> Run:
        workdir.mkdir(parents=True, exist_ok=True)
        script = workdir / "script.json"
        out = workdir / "result.json"
        script.write_text(json.dumps({"machine": machine, "steps": steps}, indent=1))
        cmd = [*unshare_prefix(), str(self.binary), "-mode", "script", "-workdir", str(workdir),
               "-in", str(script), "-out", str(out), "-v", "2"]
        with open(workdir / "harness.log", "w") as log:
            proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT)
        if proc.returncode != 0 or not out.exists():
            raise HarnessError(f"harness exited {proc.returncode}; log tail:\n{_tail(workdir / 'harness.log')}")
        run = Run(json.loads(out.read_text()), workdir)
        if not allow_errors:
            bad = [s for s in run.steps if not s["ok"] and not steps[s["i"]].get("may_fail")]
            if bad:
                raise HarnessError("harness steps failed:\n" + "\n".join(
                    f"  step {s['i']} {s['op']}: {s.get('error')}" for s in bad) + "\n" + run.logs())
        return run


def _tail(path: pathlib.Path, n: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class Run:
    def __init__(self, data: dict[str, Any], workdir: pathlib.Path):
        self.data = data
        self.steps: list[dict[str, Any]] = data["steps"]
        self.rpcs: list[dict[str, Any]] = data.get("rpcs") or []
        self.workdir = workdir

    def ops(self, op: str) -> list[dict[str, Any]]:
        return [s for s in self.steps if s["op"] == op]

    def step(self, i: int) -> dict[str, Any]:
        return self.steps[i]

    def admits(self) -> dict[str, dict[str, Any]]:
        return {s["pod"]: s for s in self.ops("admit")}

    def logs(self) -> str:
        parts = [f"--- harness.log\n{_tail(self.workdir / 'harness.log', 40)}"]
        for p in sorted(self.workdir.glob("plugin-*.log")):
            parts.append(f"--- {p.name}\n{_tail(p, 40)}")
        return "\n".join(parts)


# ---- script building blocks ----

def start_kubelet(policy: str = "none", scope: str = "container", **kw: Any) -> dict[str, Any]:
    return {"op": "start_kubelet", "policy": policy, "scope": scope, **kw}


def start_plugin(argv: list[str], id: str = "plugin") -> dict[str, Any]:
    return {"op": "start_plugin", "id": id, "argv": argv, "env": plugin_env()}


def wait_resource(resource: str = GPU, **kw: Any) -> dict[str, Any]:
    return {"op": "wait_resource", "resource": resource, **kw}


def pod(name: str, *containers: dict[str, int], init: Sequence[dict[str, int]] = (),
        restartable_init: bool = False) -> dict[str, Any]:
    return {"op": "admit", "pod": {
        "name": name,
        "init_containers": [{"name": f"init{i}", "limits": lim, "restartable": restartable_init}
                            for i, lim in enumerate(init)],
        "containers": [{"name": f"c{i}", "limits": lim} for i, lim in enumerate(containers)],
    }}


# ---- checks (each returns a list of human-readable violations; [] = fine) ----

def container_devices(c: dict[str, Any], resource: str) -> set[str]:
    return set((c.get("devices") or {}).get(resource) or {})


def check_admitted_pod(step: dict[str, Any], resource_of_env: dict[str, str] | None = None,
                       env_ids: Callable[[set[str]], set[str]] = lambda ids: ids) -> list[str]:
    """An admitted pod's containers got exactly their limits, and the runtime options name them
    (`env_ids`: the IDs the env names for the assigned ones, e.g. each replica's GPU, once)."""
    v: list[str] = []
    resource_of_env = resource_of_env or {"NVIDIA_VISIBLE_DEVICES": GPU}
    for c in step["containers"]:
        for res, n in c["limits"].items():
            got = container_devices(c, res)
            if len(got) != n:
                v.append(f"{step['pod']}/{c['name']}: {res} wants {n}, kubelet gave {sorted(got)}")
        if c.get("run_error"):
            v.append(f"{step['pod']}/{c['name']}: GetDeviceRunContainerOptions failed: {c['run_error']}")
        envs = (c.get("run_options") or {}).get("envs") or {}
        for env, res in resource_of_env.items():
            if res in c["limits"]:
                listed = set(filter(None, envs.get(env, "").split(",")))
                if listed != env_ids(container_devices(c, res)):
                    v.append(f"{step['pod']}/{c['name']}: {env}={envs.get(env)!r} but the kubelet assigned "
                             f"{sorted(container_devices(c, res))}")
    return v


def check_no_double_assignment(admit_steps: list[dict[str, Any]], deleted: Iterable[str] = ()) -> list[str]:
    """No device is held by two live app containers (init containers' devices are reused on purpose)."""
    owner: dict[tuple[str, str], str] = {}
    v = []
    gone = set(deleted)
    for s in admit_steps:
        if not s["admit"] or s["pod"] in gone:
            continue
        for c in s["containers"]:
            if c["init"]:
                continue
            for res, devs in (c.get("devices") or {}).items():
                for d in devs:
                    key = (res, d)
                    if key in owner:
                        v.append(f"{res} device {d} given to {owner[key]} and {s['pod']}/{c['name']}")
                    owner[key] = f"{s['pod']}/{c['name']}"
    return v


def check_preferred_calls(admit_step: dict[str, Any]) -> list[str]:
    """Every GetPreferredAllocation answer is well-formed and is what the container ended up with.

    The kubelet silently drops or randomises a bad answer, so the only proof that our
    answer was used is that the final assignment equals it.
    """
    v = []
    by_container = {c["name"]: c for c in admit_step["containers"]}
    for r in admit_step["rpcs"]:
        if r["method"] != "GetPreferredAllocation":
            continue
        where = f"{admit_step['pod']}/{r['container']} {r['resource']}"
        if r.get("error"):
            v.append(f"{where}: GetPreferredAllocation failed: {r['error']}")
            continue
        req, resp = r["request"][0], r["response"][0]
        if len(resp) != req["size"]:
            v.append(f"{where}: answered {len(resp)} IDs {resp} for allocation_size {req['size']}")
        if len(set(resp)) != len(resp):
            v.append(f"{where}: duplicate IDs in {resp}")
        if not set(resp) <= set(req["available"]):
            v.append(f"{where}: {sorted(set(resp) - set(req['available']))} not in available {req['available']}")
        if not set(req["must_include"]) <= set(resp):
            v.append(f"{where}: must_include {req['must_include']} missing from {resp}")
        final = container_devices(by_container.get(r["container"], {}), r["resource"])
        if admit_step["admit"] and final != set(resp):
            v.append(f"{where}: kubelet assigned {sorted(final)}, our answer was {resp}")
    return v


def check_affinity(admit_step: dict[str, Any], numa_of: dict[str, dict[str, list[int] | None]],
                   policy: str) -> list[str]:
    """Under restricted/single-numa-node every aligned device lies inside the container's affinity."""
    v = []
    if policy not in ("restricted", "single-numa-node") or not admit_step["admit"]:
        return v
    for c in admit_step["containers"]:
        aff = c.get("affinity")
        if not aff or aff.get("affinity") is None:
            continue
        mask = set(aff["affinity"])
        for res, devs in (c.get("devices") or {}).items():
            for d in devs:
                nodes = numa_of.get(res, {}).get(d)
                if nodes and not set(nodes) & mask:
                    v.append(f"{admit_step['pod']}/{c['name']}: {res} {d} on NUMA {nodes} outside affinity {sorted(mask)}")
        if policy == "single-numa-node" and len(mask) != 1:
            v.append(f"{admit_step['pod']}/{c['name']}: single-numa-node admitted with affinity {sorted(mask)}")
    return v


def numa_map(disc: dict[str, Any]) -> dict[str, dict[str, list[int] | None]]:
    out: dict[str, dict[str, list[int] | None]] = {}
    for r in disc["resources"]:
        out[r["name"]] = {d["id"]: (None if d.get("numa") is None else [d["numa"]]) for d in r["devices"]}
    return out


# ---- scenarios shared by test_harness.py and test_broken_plugin.py ----

def wait_all(disc, **kw):
    return [wait_resource(r["name"], capacity=len(r["devices"]),
                          allocatable=sum(d["health"] == "Healthy" for d in r["devices"]), **kw)
            for r in disc["resources"]]


ADMISSION_PODS = [
    pod("p1", {GPU: 2}),
    pod("p2", {GPU: 3, NIC: 1}),
    pod("p3", {GPU: 2}, {GPU: 1}),
    pod("p4", {GPU: 1, NIC: 2}),
    pod("p5", {GPU: 8}),  # more than is free: the kubelet must refuse it
    {"op": "delete_pod", "name": "p1"},
    pod("p6", {GPU: 2}),
]


#: The pairing window of the admission scenarios: far longer than any gap between calls on a loaded
#: machine, so a group ends only by the spec's other rule and the partners follow from the call order.
LONG_PAIRING_WINDOW = ("--pairing-window-ms", "60000")


def admission_run(harness, tmp_path, simulate, policy, scope, pods, argv=None):
    argv = argv or daemon_argv(simulate, *LONG_PAIRING_WINDOW, plugin_dir=TAP_DIR)
    disc = discover(simulate)
    steps = [start_kubelet(policy, scope), {"op": "start_tap", "dir": TAP_DIR}, start_plugin(argv),
             *wait_all(disc, timeout=60), *pods, {"op": "snapshot"}]
    return harness.run(steps, machine_for(simulate), tmp_path), disc


def node_yaml(unhealthy: tuple[str, ...] = ()) -> str:
    """The built-in DGX A100 node as a simulated-node file, with some GPUs unhealthy."""
    import yaml

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from plugin.sources.simulated import builtin_text

    data = yaml.safe_load(builtin_text("dgx-a100"))
    for g in data["gpus"]:
        if g["name"] in unhealthy:
            g["health"] = "Unhealthy"
    return yaml.safe_dump(data, sort_keys=False)


def reregistration_steps(argv: list[str], node: pathlib.Path) -> list[dict[str, Any]]:
    """Delete our GPU socket while the kubelet lives: the daemon must serve again and
    register again, and the kubelet must then be listening to the NEW stream.

    `argv` serves the simulated node file `node` (healthy DGX A100 on entry). Every wait is
    for a state, never for a time: the second registration (the kubelet's own counter),
    then 8 healthy GPUs held for a while, then a health change made through the node file
    reaching the kubelet (only a live stream of the new registration carries it).
    """
    gpu_sock = next(r["socket"] for r in discover("dgx-a100")["resources"] if r["name"] == GPU)
    return [
        start_kubelet("none"), start_plugin(argv),
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60),
        {"op": "remove_file", "path": f"{PLUGIN_DIR}/{gpu_sock}"},
        {"op": "wait_registrations", "resource": GPU, "at_least": 2, "timeout": 60},
        wait_resource(GPU, capacity=8, allocatable=8, timeout=60, hold_s=4),
        {"op": "snapshot"},
        {"op": "write_file", "path": str(node), "content": node_yaml(unhealthy=("GPU3",))},
        wait_resource(GPU, capacity=8, allocatable=7, timeout=30),
        {"op": "write_file", "path": str(node), "content": node_yaml()},
        wait_resource(GPU, capacity=8, allocatable=8, timeout=30),
        {"op": "snapshot"},
        pod("works", {GPU: 2}),
    ]
