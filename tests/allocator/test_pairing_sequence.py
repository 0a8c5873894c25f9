"""The tracker, the pairing index and the policies together, driven by a model of the kubelet.

`pairing_bench.KubeletNode` walks pods as the kubelet's device manager does
(pods one at a time, init containers first, each container's resources in
random order, `devicesToAllocate` with reuse, the preference call only when
there is a choice, random fill) and records, for every
GetPreferredAllocation, the partners the tracker gave and what the container
really held. What a user would notice:
- the partners are exactly the container's own devices of its other
  resources (when every container asks for both, as GPUDirect pods do);
- on a simulated DGX H100, every GPU of such pods ends up with its PIX NIC,
  and without pairing (window 0) many do not.
"""

from __future__ import annotations

import random

import pytest

from allocator.topology import DeviceKind
from plugin.sources.simulated import load_simulated

from pairing_bench import Container, KubeletNode, simulate


def _pods(rng: random.Random, gpu: str, nic: str, n: int) -> list[list[Container]]:
    pods = []
    for _ in range(n):
        containers = []
        if rng.random() < 0.3:
            g = rng.randint(1, 2)
            containers.append(Container("init", {gpu: g, nic: g}, init=True))
        for c in range(rng.randint(1, 2)):
            g = rng.randint(1, 2)
            containers.append(Container(f"app{c}", {gpu: g, nic: g}))
        pods.append(containers)
    return pods


@pytest.mark.parametrize("node", ["dgx-h100", "dgx-a100", "pcie-2socket-4gpu-2nic"])
@pytest.mark.parametrize("seed", range(3))
def test_partners_are_the_containers_own_devices(node: str, seed: int) -> None:
    rng = random.Random(seed)
    k = KubeletNode(load_simulated(node), 1.0, random.Random(seed + 100))
    gpu, nic = k.resource_of(DeviceKind.GPU), k.resource_of(DeviceKind.NIC)
    running: list[str] = []
    for n, containers in enumerate(_pods(rng, gpu, nic, 60)):
        # Init containers' devices are reused by the app containers: a pod holds the larger of the two.
        need = {r: max(sum(c.requests[r] for c in containers if not c.init),
                       max((c.requests[r] for c in containers if c.init), default=0)) for r in (gpu, nic)}
        while running and any(k.free(r) < need[r] for r in need):
            k.release(running.pop(rng.randrange(len(running))))
        if any(k.free(r) < need[r] for r in need):
            continue  # too big for this node even when empty
        k.wait(rng.choice((0.01, 0.4, 2.5)))
        k.admit(f"pod{n}", containers)
        running.append(f"pod{n}")
    assert len(k.calls) > 40
    paired = [c for c in k.calls if c.held]
    assert paired, "no call came after another resource of the same container"
    for call in k.calls:
        assert call.partners == call.held, (call.pod, call.container, call.resource)


@pytest.mark.parametrize("seed", range(3))
def test_dgx_h100_gpus_get_their_pix_nic(seed: int) -> None:
    """Pods asking g GPUs and g NICs with churn: every GPU gets its own PIX NIC with pairing;
    without (window 0) the two resources are chosen blind to each other and many do not."""
    with_pairing = simulate("dgx-h100", 1.0, pods=120, seed=seed)
    without = simulate("dgx-h100", 0.0, pods=120, seed=seed)
    assert with_pairing.gpus == without.gpus > 120
    assert with_pairing.share == 1.0
    assert without.share < 0.9
    assert with_pairing.paired_ms and not without.paired_ms
