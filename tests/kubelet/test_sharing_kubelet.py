"""Time-slicing replicas and MIG devices with the real kubelet device manager (Go harness, 1.37 and 1.34).

For each sharing set-up the daemon serves a simulated node: the kubelet's capacity per
resource is what `discover` lists (GPUs x replicas; one resource per MIG profile under the
`mixed` strategy, `nvidia.com/gpu` = MIG devices under `single`), pods asking for replicas
or MIG devices are admitted one at a time with churn, and every GetPreferredAllocation
answer is (1) what the kubelet then assigned, (2) the offline allocator's answer for the
same request (`topo-device-plugin allocate`, same options), and (3) proven optimal by it.
The objectives themselves are checked against brute force in tests/sharing.
"""

from __future__ import annotations

import pathlib

import pytest
from kubelet_testlib import (
    TAP_DIR,
    check_admitted_pod,
    check_no_double_assignment,
    check_preferred_calls,
    cli_json,
    container_devices,
    daemon_argv,
    machine_for,
    pod,
    start_kubelet,
    start_plugin,
    wait_all,
)

TIME_SLICING = """version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""

#: id -> (simulated node, extra options, {resource: sizes of the pods asked, in order}).
SETUPS = {
    "time-slicing": ("dgx-a100", ["--config", "{config}"], {"nvidia.com/gpu": [2, 3, 1, 4, 2, 6]}),
    "mig-mixed": ("dgx-a100-mig", ["--mig-strategy", "mixed"],
                  {"nvidia.com/mig-1g.10gb": [2, 3, 1, 4], "nvidia.com/mig-3g.40gb": [1, 2]}),
    "mig-single": ("dgx-a100-mig-1g", ["--mig-strategy", "single"], {"nvidia.com/gpu": [2, 7, 3, 5, 1]}),
}


def _pods(requests: dict[str, list[int]]) -> tuple[list[dict], list[str]]:
    steps, deleted, n = [], [], 0
    for resource, sizes in requests.items():
        for size in sizes:
            name = f"p{n}"
            steps.append(pod(name, {resource: size}))
            if n % 3 == 2:  # churn: every third pod leaves again
                steps.append({"op": "delete_pod", "name": name})
                deleted.append(name)
            n += 1
    return steps, deleted


@pytest.mark.parametrize("setup", list(SETUPS))
def test_capacity_admission_and_optimal_answers(line_harness, tmp_path: pathlib.Path, setup):
    simulate, extra, requests = SETUPS[setup]
    config = tmp_path / "config.yaml"
    config.write_text(TIME_SLICING)
    extra = [a.format(config=config) for a in extra]
    disc = cli_json("discover", "--simulate", simulate, "--device-id-strategy", "index", *extra)
    steps, deleted = _pods(requests)
    argv = daemon_argv(simulate, *extra, plugin_dir=TAP_DIR)
    run = line_harness.run([start_kubelet("none"), {"op": "start_tap", "dir": TAP_DIR}, start_plugin(argv),
                            *wait_all(disc, timeout=60), *steps, {"op": "snapshot"}],
                           machine_for(simulate), tmp_path)

    snap = run.ops("snapshot")[0]
    for r in disc["resources"]:
        assert snap["capacity"][r["name"]] == len(r["devices"]), r["name"]
    admits = run.admits()
    problems: list[str] = []
    for step in admits.values():
        assert step["admit"], step  # every pod fits what is free (see the sizes above)
        # NVIDIA_VISIBLE_DEVICES names each replica's GPU once (as NVIDIA's plugin does).
        problems += check_preferred_calls(step) + check_admitted_pod(
            step, env_ids=lambda ids: {i.split("::")[0] for i in ids})
    problems += check_no_double_assignment(list(admits.values()), deleted=deleted)
    assert not problems, "\n".join(problems)

    calls = [r for r in run.rpcs if r["method"] == "GetPreferredAllocation" and not r.get("error")]
    assert len(calls) >= len(admits) - 1, "the kubelet had a choice for (nearly) every pod"
    for r in calls:
        req = r["request"][0]
        args = ["allocate", "--simulate", simulate, "--device-id-strategy", "index", *extra,
                "--resource", r["resource"], "--size", str(req["size"]), "--available", ",".join(req["available"])]
        if req["must_include"]:
            args += ["--must-include", ",".join(req["must_include"])]
        offline = cli_json(*args)
        assert sorted(r["response"][0]) == sorted(offline["ids"]), (r["pod"], req, offline["ids"])
        assert offline["optimal"], (r["pod"], req)
    if setup == "time-slicing":
        # Replicas spread over distinct GPUs first: a pod of 2 on an empty node gets two GPUs.
        first = container_devices(admits["p0"]["containers"][0], "nvidia.com/gpu")
        assert len({i.split("::")[0] for i in first}) == 2, first
