"""The call-sequence group tracker, table-driven with a hand-driven clock.

Each case is the sequence of calls the kubelet's device manager makes
(`allocateContainerResources` walks a container's resources one after
another: `GetPreferredAllocation` when it has a choice, then `Allocate`), with
the time of each call; `P` lines give the partners the tracker must return
for that `GetPreferredAllocation`.
"""

from __future__ import annotations

import pytest

from plugin.allocation.pairing_groups import DEFAULT_PAIRING_WINDOW_S, PairingGroups

GPU, NIC, NIC2 = "nvidia.com/gpu", "example.com/nic", "example.com/nic-b"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# Steps: ("A", t, resource, ids) = Allocate; ("P", t, resource, {resource: ids}) = GetPreferredAllocation
# and the partners it must get.
CASES = {
    "spec example: container 2's GPU request has none, its NIC request has its own GPUs": [
        ("P", 0.00, GPU, {}),
        ("A", 0.01, GPU, ["0", "1"]),
        ("P", 0.02, NIC, {GPU: ("0", "1")}),
        ("A", 0.03, NIC, ["n0", "n1"]),
        ("P", 0.04, GPU, {}),
        ("A", 0.05, GPU, ["2", "3"]),
        ("P", 0.06, NIC, {GPU: ("2", "3")}),
        ("A", 0.07, NIC, ["n2", "n3"]),
    ],
    "NICs first: the GPU request gets the NICs": [
        ("P", 0.0, NIC, {}),
        ("A", 0.1, NIC, ["n5"]),
        ("P", 0.2, GPU, {NIC: ("n5",)}),
        ("A", 0.3, GPU, ["5"]),
    ],
    "no GetPreferredAllocation (no choice): the Allocate alone still joins the group": [
        ("A", 0.0, GPU, ["7"]),
        ("P", 0.1, NIC, {GPU: ("7",)}),
    ],
    "three resources: the last one gets both others": [
        ("A", 0.0, GPU, ["0", "1"]),
        ("A", 0.1, NIC, ["n0"]),
        ("P", 0.2, NIC2, {GPU: ("0", "1"), NIC: ("n0",)}),
        ("A", 0.3, NIC2, ["m0"]),
        ("P", 0.4, GPU, {}),
    ],
    "next pod starts with the other resource: its first request ends the group": [
        ("A", 0.0, GPU, ["0"]),
        ("A", 0.1, NIC, ["n0"]),
        ("P", 0.2, NIC, {}),
        ("A", 0.3, NIC, ["n1"]),
        ("P", 0.4, GPU, {NIC: ("n1",)}),
    ],
    "a GetPreferredAllocation for a resource in the group ends it, for every later request": [
        ("A", 0.0, GPU, ["0"]),
        ("P", 0.1, GPU, {}),
        ("P", 0.2, NIC, {}),
    ],
    "window: more than 1 s since the group's last Allocate ends it": [
        ("A", 0.0, GPU, ["0"]),
        ("P", 1.5, NIC, {}),
        ("A", 1.6, NIC, ["n0"]),
        ("P", 1.7, GPU, {NIC: ("n0",)}),  # GPU was in the expired group only; the new one has the NIC
        ("A", 1.8, GPU, ["1"]),
        ("P", 1.9, NIC2, {NIC: ("n0",), GPU: ("1",)}),
    ],
    "window: exactly 1 s is still inside": [
        ("A", 0.0, GPU, ["0"]),
        ("P", 1.0, NIC, {GPU: ("0",)}),
    ],
    "window: counted from the group's last Allocate, not its first": [
        ("A", 0.0, GPU, ["0"]),
        ("A", 0.9, NIC, ["n0"]),
        ("P", 1.8, NIC2, {GPU: ("0",), NIC: ("n0",)}),
        ("P", 2.0, NIC2, {}),
    ],
    "init container then app container reusing its devices (Allocate of the same IDs, no preference asked)": [
        # init container
        ("P", 0.0, GPU, {}),
        ("A", 0.1, GPU, ["0", "1"]),
        ("P", 0.2, NIC, {GPU: ("0", "1")}),
        ("A", 0.3, NIC, ["n0", "n1"]),
        # app container: reuse covers both requests, so only Allocates come, in another order
        ("A", 0.4, NIC, ["n0", "n1"]),
        ("A", 0.5, GPU, ["0", "1"]),
        # next pod
        ("P", 0.6, NIC, {}),
    ],
    "app container needs more GPUs than its init container left: asks with must-include, no partners": [
        ("A", 0.0, GPU, ["0"]),  # init container: one GPU, no choice
        ("P", 0.1, GPU, {}),  # app: GPU first (must-include 0); GPU was in the init group
        ("A", 0.2, GPU, ["0", "1"]),
        ("P", 0.3, NIC, {GPU: ("0", "1")}),
    ],
    "several containers of one pod, GPU-only then NIC-only: the spec's rule pairs them (a guess)": [
        ("P", 0.0, GPU, {}),
        ("A", 0.1, GPU, ["3"]),
        ("P", 0.2, NIC, {GPU: ("3",)}),
    ],
    "two Allocates of one resource in a row (two containers): the second starts a new group": [
        ("A", 0.0, GPU, ["0"]),
        ("A", 0.1, GPU, ["1"]),
        ("P", 0.2, NIC, {GPU: ("1",)}),
    ],
}


@pytest.mark.parametrize("steps", list(CASES.values()), ids=list(CASES))
def test_call_sequences(steps: list[tuple]) -> None:
    clock = FakeClock()
    start = clock.now
    groups = PairingGroups(DEFAULT_PAIRING_WINDOW_S, clock)
    for n, (kind, t, resource, arg) in enumerate(steps):
        clock.now = start + t
        if kind == "A":
            groups.on_allocate(resource, arg)
        else:
            got = groups.on_get_preferred_allocation(resource)
            assert dict(got) == arg, f"step {n}: GetPreferredAllocation({resource}) at {t}s"


@pytest.mark.parametrize("steps", list(CASES.values()), ids=list(CASES))
def test_window_zero_turns_pairing_off(steps: list[tuple]) -> None:
    clock = FakeClock()
    groups = PairingGroups(0, clock)
    assert not groups.enabled
    for kind, t, resource, arg in steps:
        clock.now += t
        if kind == "A":
            groups.on_allocate(resource, arg)
        else:
            assert dict(groups.on_get_preferred_allocation(resource)) == {}
    assert dict(groups.current()) == {}


def test_configurable_window() -> None:
    clock = FakeClock()
    groups = PairingGroups(5.0, clock)
    groups.on_allocate(GPU, ["0"])
    clock.now += 4.0
    assert dict(groups.on_get_preferred_allocation(NIC)) == {GPU: ("0",)}
    clock.now += 1.5
    assert dict(groups.on_get_preferred_allocation(NIC)) == {}


def test_partners_are_a_snapshot() -> None:
    """What a request got does not change when later calls arrive (it may be searched in a thread)."""
    clock = FakeClock()
    groups = PairingGroups(1.0, clock)
    ids = ["0", "1"]
    groups.on_allocate(GPU, ids)
    got = groups.on_get_preferred_allocation(NIC)
    ids.append("2")
    groups.on_allocate(NIC, ["n0"])
    groups.on_allocate(GPU, ["5"])
    assert dict(got) == {GPU: ("0", "1")}
    with pytest.raises(TypeError):
        got[NIC] = ("x",)
    assert dict(groups.current()) == {GPU: ("5",)}


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "1s"])
def test_bad_window_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="pairing window"):
        PairingGroups(bad)
