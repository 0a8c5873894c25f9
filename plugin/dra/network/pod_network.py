"""The pod's NICs into its network namespace when its sandbox starts, and back when it goes (issue 21).

Where it sits: the DRA driver prepares a claim (`plugin.dra.kubelet.prepare`, with
`plan` below checking its NicConfig and deciding each NIC's pod interface);
the container runtime then creates the pod's sandbox and, through NRI
(`plugin.nri`), tells us (`run_pod_sandbox`) with the pod's UID and network
namespace. Only then can a netdev move: the namespace did not exist at
prepare. `plugin.netattach.NetAttacher` moves and configures it and keeps the
ledger that makes a restart safe; this module only decides which NICs belong
to which pod (the prepared claims reserved for it, from the checkpoint) and
reports the result on the claim (`status.devices[].networkData`, through
`plugin.dra.claims.status`, in the background).

The way back: StopPodSandbox and RemovePodSandbox detach the pod's NICs
(either may come first, both may come; detaching twice is a no-op), and so
does unpreparing its claim (`release`), which the kubelet does after the pod
is gone. Synchronize (NRI's list of the pods running when we connect, also
after a restart of either side) detaches what belongs to pods that are gone
and attaches NICs of running pods that missed their sandbox start while we
were away.

Raising from a sandbox event makes the runtime fail that step (a failed
attach fails the pod's start, with the reason in the kubelet's events, rather
than starting it without its network).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from allocator.topology import DeviceKind

from ..claims.prepared import Allocated, ClaimRef, NicNetwork, PreparedClaim
from ..claims.status import ClaimStatusWriter, condition, device_entry
from ..claims.claim import Claim
from .nic_config import NicConfigError, NicProbe, PlanLimits, nic_plan

log = logging.getLogger(__name__)

#: Reasons of the `Ready` condition we put on our devices of a claim.
REASON_ATTACHED = "InterfaceAttached"
REASON_INVALID = "InvalidNicConfig"


class Sandbox(Protocol):
    """What NRI tells of a pod sandbox (`plugin.nri.PodSandbox`)."""

    uid: str
    namespace: str
    name: str
    netns: str | None


class PreparedClaims(Protocol):
    """The part of `plugin.dra.kubelet.checkpoint.ClaimCheckpoint` read here: its file (whose bytes tell whether
    anything changed) and its claims. A protocol, not the class: the kubelet side stands on this package, not the
    other way round."""

    path: str

    async def read(self) -> Mapping[str, PreparedClaim]: ...


class Attacher(Protocol):
    """The part of `plugin.netattach.NetAttacher` used here."""

    async def attach_pod(self, pod_uid: str, netns: str, specs: Sequence[Any]) -> list[Any]: ...

    async def detach_pod(self, pod_uid: str) -> Mapping[str, Any]: ...

    async def reconcile(self, live: Mapping[str, str]) -> None: ...

    def attached(self, pod_uid: str) -> list[Any]: ...


def interface_spec(n: NicNetwork) -> Any:
    """Our checkpoint's record of a NIC as `plugin.netattach.InterfaceSpec` (imported here, not at module
    import: pyroute2 loads only on nodes that attach NICs)."""
    from ...netattach import InterfaceSpec, RouteSpec  # noqa: PLC0415 (pyroute2 only where NICs move)

    return InterfaceSpec(host_name=n.host_name, pod_name=n.pod_name, addresses=n.addresses,
                         routes=tuple(RouteSpec(r.destination, r.gateway) for r in n.routes), mtu=n.mtu,
                         rdma_device=n.rdma_device)


class PodNetwork:
    """`plugin.nri.PodSandboxHandler` and `plugin.dra.kubelet.prepare.ClaimNetwork` for one driver on one node."""

    active = True

    def __init__(self, *, driver: str, pool: str, checkpoint: PreparedClaims, attacher: Attacher, status: ClaimStatusWriter,
                 probe: NicProbe, taken_names: tuple[str, ...] = ("lo", "eth0"),
                 connected: Callable[[], bool] = lambda: True, nri_socket: str = "/var/run/nri/nri.sock"):
        self.driver = driver
        self.pool = pool
        self.checkpoint = checkpoint
        self.attacher = attacher
        self.status = status
        self.probe = probe
        self.taken_names = taken_names
        #: Whether NRI is connected now: a NicConfig is refused while it is not (nobody would apply it).
        self.connected = connected
        self.nri_socket = nri_socket
        #: The prepared claims with NICs, and the checkpoint file's bytes they were read from (see `_nic_claims`).
        self._cache: tuple[bytes | None, list[PreparedClaim]] = (None, [])
        #: Pods already logged as stopped by `synchronize` (said once, not at every reconnection).
        self._told_stopped: set[str] = set()

    # -- prepare side (ClaimNetwork) --------------------------------------------------------------
    async def plan(self, ref: ClaimRef, claim: Claim, allocated: Allocated) -> dict[str, NicNetwork]:
        # The node's answer about each netdev first, in a worker thread: netlink calls block (and pyroute2's
        # synchronous socket cannot even be opened on a thread running an event loop).
        netdevs = sorted({d.attributes["netdev"] for _, d, _ in allocated
                          if d.kind is DeviceKind.NIC and d.attributes.get("netdev")})
        known = await asyncio.to_thread(lambda: {n: self.probe(n) for n in netdevs}) if netdevs else {}
        unavailable = None if self.connected() else (
            f"the driver is not connected to the container runtime's NRI socket {self.nri_socket}, so nothing would "
            "move the NICs into the pod")
        return nic_plan(f"{ref.namespace}/{ref.name}", claim, self.driver, allocated, known.get,
                        PlanLimits(taken_names=self.taken_names, unavailable=unavailable,
                                   unavailable_fix="turn NRI on in containerd (2.x: on by default; 1.7: "
                                                   "[plugins.\"io.containerd.nri.v1.nri\"] disable = false) and mount "
                                                   "its socket into the driver (docs/networking.md)"))

    async def refused(self, ref: ClaimRef, allocated: Allocated, error: NicConfigError) -> None:
        self.status.set(ref.namespace, ref.name, [
            device_entry(self.driver, self.pool, name, [condition(False, REASON_INVALID, str(error))])
            for name, _, _ in allocated])

    async def release(self, claims: Sequence[PreparedClaim]) -> dict[str, Exception | None]:
        out: dict[str, Exception | None] = {}
        for c in claims:
            try:
                for pod in c.pods:
                    await self.attacher.detach_pod(pod)
            except Exception as e:  # noqa: BLE001 (the claim stays prepared; the kubelet retries)
                log.error("giving a claim's NICs back failed", extra={"claim": f"{c.namespace}/{c.name}",
                                                                      "error": str(e)})
                out[c.uid] = e
                continue
            self.status.set(c.namespace, c.name, [])
            out[c.uid] = None
        return out

    # -- NRI side (PodSandboxHandler) --------------------------------------------------------------
    async def _nic_claims(self) -> list[PreparedClaim]:
        """The prepared claims that hold NICs to attach.

        Every pod started on the node comes through here, inside the runtime's NRI deadline (2 s), and most
        have no NIC of ours: the parsed checkpoint is kept while the file's bytes are the same (reading them
        needs no lock, the file is only ever replaced whole by a rename; parsing and checking it is what
        costs). Whoever wrote it, this instance or another, a change is seen."""
        try:
            with open(self.checkpoint.path, "rb") as f:
                raw: bytes | None = f.read()
        except FileNotFoundError:
            raw = None
        if raw is None or raw != self._cache[0]:
            claims = [c for c in (await self.checkpoint.read()).values() if c.networks]
            self._cache = (raw, claims)
        return self._cache[1]

    async def _claims_of(self, pod_uid: str) -> list[PreparedClaim]:
        return [c for c in await self._nic_claims() if pod_uid in c.pods]

    async def run_pod_sandbox(self, pod: Sandbox) -> None:
        claims = await self._claims_of(pod.uid)
        if not claims:
            return
        where = f"pod {pod.namespace}/{pod.name}"
        if not pod.netns:
            log.warning("pod has NICs to attach but no network namespace of its own (hostNetwork?): they stay "
                        "in the node's namespace", extra={"pod": where, "claims": [c.name for c in claims]})
            return
        specs = [interface_spec(n) for c in claims for _, n in c.networks]
        attached = await self.attacher.attach_pod(pod.uid, pod.netns, specs)
        log.info("attached the pod's NICs", extra={"pod": where, "netns": pod.netns,
                                                   "interfaces": {s.host_name: s.pod_name for s in specs}})
        self._report(claims, attached, where)

    def _report(self, claims: Sequence[PreparedClaim], attached: Sequence[Any], where: str) -> None:
        by_host = {a.spec.host_name: a for a in attached}
        for c in claims:
            entries = []
            for d, n in c.networks:
                a = by_host.get(n.host_name)
                if a is None:
                    continue
                entries.append(device_entry(
                    self.driver, d.pool, d.device,
                    [condition(True, REASON_ATTACHED, f"{n.host_name} is {n.pod_name} in {where}")],
                    {"interfaceName": n.pod_name, "ips": list(n.addresses), "hardwareAddress": a.hw_address}))
            self.status.set(c.namespace, c.name, entries)

    async def stop_pod_sandbox(self, pod: Sandbox) -> None:
        await self._detach(pod)

    async def remove_pod_sandbox(self, pod: Sandbox) -> None:
        self._told_stopped.discard(pod.uid)
        await self._detach(pod)

    async def _detach(self, pod: Sandbox) -> None:
        outcomes = await self.attacher.detach_pod(pod.uid)
        if not outcomes:
            return
        log.info("returned the pod's NICs to the node", extra={
            "pod": f"{pod.namespace}/{pod.name}", "outcomes": {k: getattr(v, "value", v) for k, v in outcomes.items()}})
        for c in await self._claims_of(pod.uid):
            self.status.set(c.namespace, c.name, [])

    async def synchronize(self, pods: Sequence[Sandbox]) -> None:
        # NRI lists every sandbox containerd knows, stopped ones too: a pod stopped while we were away (a
        # restart during its teardown) still names its network namespace, which is gone by then. It is not
        # running: nothing to attach, and what it had is back in the node (the kernel returns a physical NIC
        # from a namespace that goes), so reconcile treats it as gone.
        stopped = {p.uid for p in pods if p.netns and not os.path.exists(p.netns)}
        live = {p.uid: p.netns for p in pods if p.netns and p.uid not in stopped}
        await self.attacher.reconcile(live)
        claims = await self._nic_claims()
        for p in pods:
            mine = [c for c in claims if p.uid in c.pods]
            if not mine or not p.netns:
                continue
            if p.uid in stopped:
                if p.uid not in self._told_stopped:  # each synchronize lists it again until it is removed
                    self._told_stopped.add(p.uid)
                    log.info("pod is stopped (its network namespace is gone): its NICs stay in the node",
                             extra={"pod": f"{p.namespace}/{p.name}", "netns": p.netns,
                                    "claims": [c.name for c in mine]})
                continue
            try:
                if not self.attacher.attached(p.uid):
                    await self.run_pod_sandbox(p)  # started while we were away
                else:
                    self._report(mine, self.attacher.attached(p.uid), f"pod {p.namespace}/{p.name}")
            except Exception as e:  # noqa: BLE001 (one pod's failure must not keep the others' NICs away)
                log.error("attaching a running pod's NICs failed", extra={"pod": f"{p.namespace}/{p.name}",
                                                                         "error": str(e)})
        for c in claims:  # NICs of pods that are not running are back in the node: say so
            if not any(pod in live for pod in c.pods):
                self.status.set(c.namespace, c.name, [])
