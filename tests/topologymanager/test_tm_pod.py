"""Effective pod request, ported from the kubelet's TestGetPodDeviceRequest, plus sidecars."""

from __future__ import annotations

import pytest

from allocator.topologymanager import Container, Pod, pod_effective_limits


def C(name, restartable=False, **limits):
    return Container(name, dict(limits), restartable)


@pytest.mark.parametrize(
    "description, init, app, registered, expected",
    [
        ("empty pod", [], [], [], {}),
        ("Init container requests device plugin resource", [C("i", gpu=2, cpu=2)], [], ["gpu"], {"gpu": 2}),
        ("Init containers request device plugin resource",
         [C("i1", gpu=2, cpu=2), C("i2", gpu=4, cpu=2)], [], ["gpu"], {"gpu": 4}),
        ("User container requests device plugin resource", [], [C("a", gpu=2, cpu=2)], ["gpu"], {"gpu": 2}),
        ("Init containers and user containers request the same amount",
         [C("i1", gpu=2, nic=2), C("i2", gpu=2, nic=2)], [C("a1", gpu=1, nic=1), C("a2", gpu=1, nic=1)],
         ["gpu", "nic"], {"gpu": 2, "nic": 2}),
        ("Init containers request more than user containers",
         [C("i1", gpu=2, nic=1), C("i2", gpu=3, nic=2)], [C("a1", gpu=1, nic=1), C("a2", gpu=1)],
         ["gpu", "nic"], {"gpu": 3, "nic": 2}),
        ("User containers request more than init containers",
         [C("i1", gpu=2, nic=1), C("i2", gpu=2, nic=1)], [C("a1", gpu=3, nic=2), C("a2", gpu=3, nic=2)],
         ["gpu", "nic"], {"gpu": 6, "nic": 4}),
        # Sidecars (restartable init containers) run alongside everything after them.
        ("sidecar adds to the app sum", [C("s", True, gpu=1)], [C("a", gpu=2)], ["gpu"], {"gpu": 3}),
        ("init after a sidecar counts the sidecar",
         [C("s", True, gpu=1), C("i", gpu=4)], [C("a", gpu=1)], ["gpu"], {"gpu": 5}),
        ("init before a sidecar does not", [C("i", gpu=4), C("s", True, gpu=1)], [C("a", gpu=1)], ["gpu"],
         {"gpu": 4}),
    ],
)
def test_pod_effective_limits(description, init, app, registered, expected):
    pod = Pod("uid", tuple(app), tuple(init))
    assert pod_effective_limits(pod, registered) == expected


def test_all_containers_order_and_is_init():
    pod = Pod("uid", (C("a"),), (C("i"),))
    assert [c.name for c in pod.all_containers()] == ["i", "a"]
    assert pod.is_init(C("i")) and not pod.is_init(C("a"))
