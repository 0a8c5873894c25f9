"""Which devices the kubelet hands a container (the kubelet's `devicesToAllocate`).

Why model it: the plugin's `GetPreferredAllocation` answer is only one input.
The kubelet first reuses an init container's devices, then splits the free
devices by the stored NUMA affinity into aligned / unaligned / no-affinity
buckets and

- Case A (strictly more aligned devices than still needed): asks the plugin
  with `available = aligned + already chosen`, keeps only the aligned IDs of
  the answer, then fills from aligned;
- Case B (otherwise): takes *all* aligned devices, and only if still short
  asks the plugin with `available = all free + already chosen`, keeps the
  free IDs of the answer, then fills from unaligned, then no-affinity.

`must_include` is always what is already chosen and `size` the *whole* request.
The plugin is not asked at all when reuse covers the request, when aligned is
exactly enough, or when the plugin does not offer the call. Where the kubelet
fills from a set it takes Go map order (random); the model takes a fixed order
and flags the result `arbitrary`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .device_hints import DeviceInfo, device_has_topology_alignment
from .hint import TopologyHint

#: The plugin's GetPreferredAllocation: (available, must_include, size) -> IDs.
PreferredFn = Callable[[list[str], list[str], int], Sequence[str] | None]

#: The kubelet's fake NUMA node for devices without topology.
NODE_WITHOUT_TOPOLOGY = -1

CASE_NOTHING = "nothing"
CASE_ALREADY_ALLOCATED = "already-allocated"
CASE_REUSE = "reuse"
CASE_A = "A"
CASE_B = "B"


class DeviceAllocationError(Exception):
    """`devicesToAllocate` failed; the message is the kubelet's."""


_DIGITS = re.compile(r"(\d+)")


def natural_key(device_id: str) -> tuple[Any, ...]:
    """Sort key putting GPU2 before GPU10 (used for the model's fixed fill order and display)."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(device_id))


def natural_sorted(ids: Iterable[str]) -> list[str]:
    return sorted(ids, key=natural_key)


def filter_by_affinity(
    all_devices: Mapping[str, DeviceInfo],
    available: Iterable[str],
    hint: TopologyHint,
) -> tuple[set[str], set[str], set[str]]:
    """Split free devices into (aligned, unaligned, no_affinity) for the stored hint.

    No topology on the resource, or a nil affinity (policy none, single-numa
    "don't care") puts everything in no_affinity. Otherwise a device is
    aligned if any of its nodes is in the mask; unaligned if it has a real
    node; no_affinity if it has no node (or only the fake node -1).
    """
    avail = set(available)
    if not device_has_topology_alignment(all_devices.values()) or hint.affinity is None:
        return set(), set(), avail
    aligned: set[str] = set()
    unaligned: set[str] = set()
    none: set[str] = set()
    for d in avail:
        dev = all_devices.get(d)
        nodes = dev.numa_ids if dev is not None else ()
        if any(hint.affinity.is_set(n) for n in nodes):
            aligned.add(d)
        elif any(n != NODE_WITHOUT_TOPOLOGY for n in nodes):
            unaligned.add(d)
        else:
            none.add(d)
    return aligned, unaligned, none


@dataclass(frozen=True)
class PreferredCall:
    """One GetPreferredAllocation request (lists sorted, as the kubelet sends them) and its answer."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int
    answer: tuple[str, ...]
    #: IDs of the answer the kubelet kept (those inside the bucket it allows).
    accepted: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "available": list(self.available),
            "must_include": list(self.must_include),
            "size": self.size,
            "answer": list(self.answer),
            "accepted": list(self.accepted),
        }


@dataclass
class DevicesToAllocate:
    """What `devicesToAllocate` decided for one (container, resource)."""

    resource: str
    required: int
    #: Chosen devices in the order the model took them (empty: no Allocate RPC).
    devices: tuple[str, ...] = ()
    case: str = ""
    reused: tuple[str, ...] = ()
    aligned: tuple[str, ...] = ()
    unaligned: tuple[str, ...] = ()
    no_affinity: tuple[str, ...] = ()
    preferred_call: PreferredCall | None = None
    #: Why the plugin was not asked (when it was not).
    preferred_skipped: str = ""
    #: True if the kubelet would pick some devices at random (Go map order).
    arbitrary: bool = False
    steps: list[str] = field(default_factory=list)

    @property
    def allocate_rpc(self) -> bool:
        return bool(self.devices)

    def to_dict(self) -> dict[str, Any]:
        return {
            "resource": self.resource,
            "required": self.required,
            "devices": list(self.devices),
            "case": self.case,
            "reused": list(self.reused),
            "aligned": list(self.aligned),
            "unaligned": list(self.unaligned),
            "no_affinity": list(self.no_affinity),
            "preferred_call": None if self.preferred_call is None else self.preferred_call.to_dict(),
            "preferred_skipped": self.preferred_skipped,
            "arbitrary": self.arbitrary,
            "allocate_rpc": self.allocate_rpc,
            "steps": list(self.steps),
        }


def devices_to_allocate(
    *,
    resource: str,
    required: int,
    all_devices: Mapping[str, DeviceInfo],
    healthy: Iterable[str],
    in_use: Iterable[str],
    hint: TopologyHint,
    already_allocated: Iterable[str] | None = None,
    reusable: Iterable[str] = (),
    preferred: PreferredFn | None = None,
    registered: bool = True,
    order: Callable[[Iterable[str]], list[str]] = natural_sorted,
    pod_uid: str = "pod",
    container_name: str = "container",
) -> DevicesToAllocate:
    """The kubelet's `devicesToAllocate` for one container and resource.

    `in_use` is every device of the resource allocated to any container (the
    reusable ones included: they belong to this pod's init container).
    `already_allocated` is what this container already holds (after a restart),
    `preferred` the plugin's GetPreferredAllocation (None: the plugin does not
    offer it). Raises DeviceAllocationError with the kubelet's messages.
    """
    out = DevicesToAllocate(resource, required)
    healthy_set = set(healthy)
    needed = required
    mine = set(already_allocated) if already_allocated is not None else None
    if mine is not None and mine:
        needed -= len(mine)
        if needed != 0:
            raise DeviceAllocationError(
                f'pod "{pod_uid}" container "{container_name}" changed request for resource '
                f'"{resource}" from {len(mine)} to {required}'
            )
    if not registered:
        raise DeviceAllocationError(f"cannot allocate unregistered device {resource}")
    if not healthy_set:
        raise DeviceAllocationError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
    if mine and not mine <= healthy_set:
        raise DeviceAllocationError(
            f"previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
        )
    if needed == 0:
        if required == 0:
            out.case = CASE_NOTHING
            out.steps.append("nothing requested: no Allocate RPC")
        else:
            out.case = CASE_ALREADY_ALLOCATED
            out.steps.append("already allocated to this container: no Allocate RPC, the stored response is reused")
        return out

    in_use_set = set(in_use)
    chosen: list[str] = []
    state = {"needed": needed}

    def take_from(devices: Iterable[str]) -> bool:
        """`allocateRemainingFrom`: take devices not yet chosen until none is needed."""
        candidates = [d for d in order(devices) if d not in chosen]
        if len(candidates) > state["needed"] > 0:
            out.arbitrary = True
        for d in candidates:
            in_use_set.add(d)
            chosen.append(d)
            state["needed"] -= 1
            if state["needed"] == 0:
                return True
        return False

    def done(case: str) -> DevicesToAllocate:
        out.case = case
        out.devices = tuple(chosen)
        return out

    reuse = set(reusable)
    if reuse:
        out.reused = tuple(order(reuse))
        out.steps.append(f"reuse devices of an earlier init container first: {', '.join(out.reused)}")
    if take_from(reuse):
        out.reused = tuple(chosen)
        out.preferred_skipped = "reuse covered the request"
        return done(CASE_REUSE)
    out.reused = tuple(chosen)

    available = healthy_set - in_use_set
    if len(available) < state["needed"]:
        raise DeviceAllocationError(
            f"requested number of devices unavailable for {resource}. "
            f"Requested: {state['needed']}, Available: {len(available)}"
        )
    aligned, unaligned, no_aff = filter_by_affinity(all_devices, available, hint)
    out.aligned, out.unaligned, out.no_affinity = (tuple(order(s)) for s in (aligned, unaligned, no_aff))
    if hint.affinity is None:
        out.steps.append("no NUMA affinity is stored for the container: every free device is 'no affinity'")
    elif not device_has_topology_alignment(all_devices.values()):
        out.steps.append("the resource reports no NUMA topology: every free device is 'no affinity'")

    def ask(avail: set[str], bucket: set[str]) -> set[str]:
        must = set(chosen)
        if preferred is None:
            out.preferred_skipped = "the plugin does not offer GetPreferredAllocation"
            return set()
        av, mi = sorted(avail | must), sorted(must)
        try:
            answer = preferred(list(av), list(mi), required)
        except Exception as err:  # any plugin error fails admission
            raise DeviceAllocationError(
                f"device plugin GetPreferredAllocation rpc failed with err: {err}"
            ) from err
        answer_t = tuple(answer or ())
        accepted = tuple(d for d in order(set(answer_t)) if d in bucket)
        out.preferred_call = PreferredCall(tuple(av), tuple(mi), required, answer_t, accepted)
        return set(accepted)

    if state["needed"] < len(aligned):
        out.steps.append(
            f"Case A: {len(aligned)} aligned devices for {state['needed']} needed: "
            "ask the plugin among the aligned ones"
        )
        pref = ask(aligned, aligned)
        if take_from(pref):
            return done(CASE_A)
        if take_from(aligned):
            return done(CASE_A)
        raise DeviceAllocationError(
            "unexpectedly allocated less resources than required. "
            f"Requested: {required}, Got: {required - state['needed']}"
        )

    out.steps.append(
        f"Case B: {len(aligned)} aligned devices for {state['needed']} needed: take all aligned first"
    )
    if take_from(aligned):
        out.preferred_skipped = "the aligned devices were exactly enough"
        return done(CASE_B)
    pref = ask(available, available)
    if take_from(pref):
        return done(CASE_B)
    if take_from(unaligned):
        return done(CASE_B)
    if take_from(no_aff):
        return done(CASE_B)
    raise DeviceAllocationError(
        "unexpectedly allocated less resources than required. "
        f"Requested: {required}, Got: {required - state['needed']}"
    )
