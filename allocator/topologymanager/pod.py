"""The slice of a pod the Topology Manager and the device manager look at.

Why our own tiny model: the what-if report needs pods with init containers,
sidecars and several app containers, but nothing else of the Kubernetes API.
Extended resources have requests == limits, so a container is just its limits.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Container:
    name: str
    #: Extended-resource limits, e.g. {"nvidia.com/gpu": 4}.
    limits: Mapping[str, int] = field(default_factory=dict)
    #: An init container with `restartPolicy: Always` (a sidecar). Ignored for app containers.
    restartable: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "limits": dict(self.limits), "restartable": self.restartable}


@dataclass(frozen=True)
class Pod:
    uid: str
    containers: tuple[Container, ...]
    init_containers: tuple[Container, ...] = ()
    name: str = ""

    @classmethod
    def single(cls, limits: Mapping[str, int], uid: str = "pod", name: str = "explain") -> Pod:
        """The usual what-if: one app container with these limits."""
        return cls(uid=uid, containers=(Container("main", dict(limits)),), name=name or uid)

    def all_containers(self) -> tuple[Container, ...]:
        """Init containers first, then app containers: the kubelet's admission order."""
        return tuple(self.init_containers) + tuple(self.containers)

    def is_init(self, container: Container) -> bool:
        return any(c.name == container.name for c in self.init_containers)

    def to_dict(self) -> dict[str, Any]:
        return {
            "uid": self.uid,
            "name": self.name,
            "init_containers": [c.to_dict() for c in self.init_containers],
            "containers": [c.to_dict() for c in self.containers],
        }


def _add(into: dict[str, int], limits: Mapping[str, int]) -> None:
    for k, v in limits.items():
        into[k] = into.get(k, 0) + int(v)


def _max_into(into: dict[str, int], limits: Mapping[str, int]) -> None:
    for k, v in limits.items():
        if k not in into or into[k] < v:
            into[k] = int(v)


def pod_effective_limits(pod: Pod, resources: Iterable[str] | None = None) -> dict[str, int]:
    """The pod's effective limits (the kubelet's `resource.PodLimits`, no overhead).

    Sum of app containers plus sidecars, versus, for each init container in
    order, its own limit plus the sidecars started before it; the larger wins.
    With `resources`, only those names are kept (the device manager keeps the
    resources of registered device plugins).
    """
    limits: dict[str, int] = {}
    for c in pod.containers:
        _add(limits, c.limits)
    sidecars: dict[str, int] = {}
    init_max: dict[str, int] = {}
    for c in pod.init_containers:
        if c.restartable:
            _add(limits, c.limits)
            _add(sidecars, c.limits)
            current = dict(sidecars)
        else:
            current = {}
            _add(current, c.limits)
            _add(current, sidecars)
        _max_into(init_max, current)
    _max_into(limits, init_max)
    if resources is not None:
        keep = set(resources)
        limits = {k: v for k, v in limits.items() if k in keep}
    return limits
