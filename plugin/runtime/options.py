"""What the daemon is told: its options, and the DRA driver as the daemon drives it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from allocator import NodeTopology
from allocator.topology import Device

from ..allocation.pod_resources import DEFAULT_TIMEOUT_S as POD_RESOURCES_TIMEOUT_S
from ..allocation.preferred import DEFAULT_DEADLINE_S


@dataclass(frozen=True)
class DaemonOptions:
    plugin_dir: str
    metrics_address: str | None = None
    #: Where our CDI specs go (`plugin.cdi_files.sync`); None: never write any.
    cdi_spec_dir: str | None = None
    #: Quiet time after a filesystem event before acting (one kubelet restart = one re-registration).
    debounce_s: float = 0.05
    #: After ending a stream a live kubelet still holds, wait this long before registering again,
    #: so the kubelet handles the disconnect first (kubernetes #121994).
    stream_end_grace_s: float = 1.0
    #: First retry ceiling after a resource failed to serve or to register (per resource; doubles up
    #: to `retry_max_s`; each delay is drawn below it: plugin/backoff.py).
    retry_initial_s: float = 0.2
    retry_max_s: float = 10.0
    #: Slow re-check while kubelet.sock is missing, in case an inotify event is lost.
    kubelet_poll_s: float = 5.0
    #: A Register unanswered this long is logged as slow. It is never abandoned: the kubelet
    #: completes it anyway, and a second one would leave two registrations and two streams
    #: (kubernetes #121994).
    register_timeout_s: float = 15.0
    #: The config file to watch; a valid change is applied live (see `reload_resources`).
    config_path: str | None = None
    #: Whole-request deadline of GetPreferredAllocation (why 1 s: `plugin.allocation.preferred`).
    preferred_deadline_s: float = DEFAULT_DEADLINE_S
    #: Threads for preferred-allocation searches (why threads, why two: `plugin.allocation.search_pool`).
    search_workers: int = 2
    #: The kubelet's pod-resources socket, to check pairing partners against (None: not read).
    pod_resources_socket: str | None = None
    #: Deadline of one pod-resources `List` (why short: `plugin.allocation.pod_resources`).
    pod_resources_timeout_s: float = POD_RESOURCES_TIMEOUT_S
    #: NVIDIA's MPS control program (`--mps-control-binary`), started for the `sharing.mps` resources.
    mps_control_binary: str = "nvidia-cuda-mps-control"
    #: How often a ready MPS control daemon is asked whether it still answers (`plugin.mps.supervisor`).
    mps_probe_interval_s: float = 5.0


class DraSide(Protocol):
    """The DRA driver as the daemon drives it (`plugin.dra.DraDriver`)."""

    async def start(self, topology: NodeTopology) -> None: ...

    def update(self, topology: NodeTopology) -> None: ...

    async def stop(self) -> None: ...

    def ready(self) -> tuple[bool, str]: ...


#: Makes the DRA driver for the devices `include` accepts (those of the DRA resources, see
#: `plugin.model.serving_modes`); raises `TopoDevicePluginError`s when it cannot (no API access...).
DraFactory = Callable[[Callable[[Device], bool]], Awaitable[DraSide]]


class NrtHook(Protocol):
    """The NodeResourceTopology publisher as the daemon drives it (`plugin.nrt.side.NrtSide`): started with the
    first resources, told every new build (health, hot-plug, reload), stopped at shutdown (it deletes its object)."""

    async def start(self, topology: NodeTopology, resources: Iterable[Any]) -> None: ...

    def update(self, topology: NodeTopology, resources: Iterable[Any]) -> None: ...

    async def stop(self) -> None: ...


#: Makes the publisher (`plugin.nrt.side.make_nrt_side`); called once, at start-up.
NrtFactory = Callable[[], NrtHook]
