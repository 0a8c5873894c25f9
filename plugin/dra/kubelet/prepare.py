"""Preparing and unpreparing ResourceClaims on this node: the logic behind the kubelet's DRA calls.

What "prepared" means here: the claim's devices (those the scheduler
allocated from our pool) have a CDI spec on disk, and the claim is recorded in
the checkpoint with the CDI device IDs the kubelet hands to the runtime.

Rules (kubelet DRA plugin contract, pkg/kubelet/cm/dra):
- idempotent per claim UID: the kubelet repeats NodePrepareResources after
  restarts; a recorded claim is answered from the checkpoint, never prepared
  twice, and its answer does not change while it stays prepared;
- unprepare of a claim we do not know succeeds (it may never have been
  prepared here, or was already unprepared);
- a failure is reported per claim (the `error` field), never by failing the
  whole RPC, so one bad claim does not block the others.

The ResourceClaim itself is read from the API server (the kubelet only sends
namespace, name and UID): its `status.allocation.devices.results` for our
driver say which devices of our pool to prepare.

How a call with many claims is worked (issue 19: one call of 1,500 claims ran
past the kubelet's 45 s deadline, kept working after the kubelet had gone and
made every other call wait):
- a call is worked in batches of `PrepareLimits.batch` claims: the batch's
  claims are read with at most `reads_per_call` reads in flight, then its CDI
  specs are written and the whole batch recorded in ONE checkpoint write;
- between batches nothing runs on behalf of the call: when the kubelet
  cancels or its deadline passes (gRPC cancels the handler) the call stops at
  the next await; a batch being recorded is finished in its thread, so the
  checkpoint always says exactly which claims have specs;
- each call has its own read limit and at most one checkpoint write queued, so
  a one-claim call never waits behind another call's backlog (at most behind
  one batch being written);
- on stop (SIGTERM) calls in flight answer at once: the batch being written
  records the claims it has written so far, the other claims fail saying the
  driver is stopping;
- each read is bounded (`read_timeout_s`), and once the API server proved
  unreachable in a call (timeout, refused connection) the call's remaining
  claims fail at once with that reason instead of each waiting for it.

NICs (issue 21): the claim's NicConfig is checked here, through `ClaimNetwork`
(`plugin.dra.network.pod_network`), before anything is written: a bad one fails the
claim with the field and the fix, and the reason also goes on the claim. What
each NIC becomes in the pod, and the pods the claim is reserved for, are
recorded with the claim; the NICs move when the pod's sandbox starts. What only
shows against the other prepared claims (an address another claim holds, an
interface name two claims of one pod ask for, `plugin.dra.network.conflicts`)
is checked under the checkpoint lock as the claim is recorded. Unprepare
first has the claim's NICs given back to the node (a failure keeps the claim
recorded, so the kubelet's retry finds it).

IMEX channels (host-managed IMEX): before a claim holding a channel is recorded, the host's IMEX daemon
is asked once per call (`imex_ready.ImexReadiness`, NVIDIA's `nvidia-imex-ctl -q`); unless it answers
READY the claim fails with its state and the fix, nothing is recorded, and the kubelet's retry asks again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, Union

from allocator.topology import Device, NodeTopology

from ...model.mps_allocate import DEFAULT_HOST_ROOT
from ...mps.control import MpsControl
from ..mig.instances import MigError
from .cdi import ClaimCdi
from .imex_ready import ImexReadiness
from .checkpoint import ClaimCheckpoint
from ..claims.claim import Claim, parse_claim
from ..claims.prepared import Allocated, ClaimRef, NicNetwork, PreparedClaim, PreparedDevice
from ..claims.gpu_config import Interval
from ..claims.mps import ClaimMpsDaemons, MpsSettings
from ..claims.mps_claims import MpsRefused, mps_wanted
from ...kube.errors import KubeApiError, KubeApiUnreachable, KubeNotFound
from ..mig.prepare import MigPreparer
from ..network.nic_config import NicConfigError, PlanLimits, nic_plan
from ..network.conflicts import check_conflicts
from ..slices.imex_channels import channel_of
from ..claims.sharing import GpuSharing, Holders, SharingRefused, SimulatedTimeSlice, TimeSliceApplyError, \
    device_settings, state_path
from ..slices.build import SliceOptions, device_table

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], Awaitable[dict[str, Any]]]


class Planned(NamedTuple):
    """A claim ready to be recorded."""

    devices: Allocated
    #: Per entry of `devices`: its share ID (consumable capacity, KEP-5075), "" for a whole device.
    shares: list[str]
    #: The time-slice each GPU asks for (plugin/dra/claims/sharing.py).
    timeslices: dict[str, Interval]
    #: The claim's NICs' pod interfaces, by slice device name (plugin/dra/network/pod_network.py).
    networks: dict[str, NicNetwork]
    #: The pods the claim is reserved for (their sandboxes get its NICs).
    pods: tuple[str, ...]
    #: The GPUs (GpuConfig) and MIG devices (MigDeviceConfig) put under MPS, with their limits (plugin/dra/claims/mps.py).
    mps: dict[str, tuple[Device, MpsSettings]] = {}
    #: The claim's IMEX channels: (slice device name, channel, request names); no Device of the topology.
    channels: tuple[tuple[str, int, list[str]], ...] = ()


class PrepareError(Exception):
    """A claim cannot be prepared; the message goes to the kubelet (and the pod's events)."""


class NicConflict(PrepareError):
    """The claim's NICs clash with another prepared claim's (`plugin.dra.network.conflicts`): found under the
    checkpoint lock, reported on the claim once the lock is released."""

    def __init__(self, error: NicConfigError):
        super().__init__(str(error))
        self.error = error


class ClaimNetwork(Protocol):
    """The NIC side of prepare and unprepare (`plugin.dra.network.pod_network.PodNetwork`)."""

    #: False: no NIC is ever attached here, so unprepare need not look for any (no extra checkpoint read).
    active: bool

    async def plan(self, ref: ClaimRef, claim: Claim, allocated: Allocated) -> dict[str, NicNetwork]:
        """The claim's NICs to attach, by slice device name; raises NicConfigError (field and fix)."""
        ...

    async def refused(self, ref: ClaimRef, allocated: Allocated, error: NicConfigError) -> None:
        """Say on the claim why its NIC configuration was refused (best effort, never raises)."""
        ...

    async def release(self, claims: Sequence[PreparedClaim]) -> dict[str, Exception | None]:
        """Give the claims' NICs back to the node and clear their status; per claim UID, None when done."""
        ...


class NoNetwork:
    """No NIC attachment on this node: NICs stay in the node's namespace and a NicConfig is refused."""

    active = False

    def __init__(self, driver: str):
        self.driver = driver

    async def plan(self, ref: ClaimRef, claim: Claim, allocated: Allocated) -> dict[str, NicNetwork]:
        return nic_plan(f"{ref.namespace}/{ref.name}", claim, self.driver, allocated, lambda _: None,
                        PlanLimits(unavailable="NIC attachment is off on this node (--netdev-attach off)",
                                   unavailable_fix="start the driver with --netdev-attach auto (chart: "
                                                   "dra.netdevAttach: auto)"))

    async def refused(self, ref: ClaimRef, allocated: Allocated, error: NicConfigError) -> None:
        return None

    async def release(self, claims: Sequence[PreparedClaim]) -> dict[str, Exception | None]:
        return {c.uid: None for c in claims}


#: What a call answers per claim UID: the prepared claim, or why not.
Outcome = Union[PreparedClaim, Exception]


@dataclass(frozen=True)
class PrepareLimits:
    """How much one call may do at once; see the module docstring for why each exists."""

    #: Claims recorded per checkpoint write (their CDI specs are written under the same lock hold).
    batch: int = 64
    #: ResourceClaim reads in flight per call (below the API client's connection pool, so calls never queue
    #: behind each other there).
    reads_per_call: int = 16
    #: Bound on one ResourceClaim read; the API client's own bound is 10 s per request.
    read_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        for f in ("batch", "reads_per_call", "read_timeout_s"):
            if getattr(self, f) <= 0:
                raise ValueError(f"PrepareLimits.{f} must be positive, not {getattr(self, f)!r}")


class _CallReads:
    """One call's view of the API server: its own read limit, and the first sign that the server is out of
    reach, after which the call's other reads are not even tried."""

    def __init__(self, limit: int):
        self.slots = asyncio.Semaphore(limit)
        self.unreachable: str | None = None
        #: The host IMEX daemon's readiness, asked once per call for all its channel claims (`ImexReadiness`).
        self.imex: asyncio.Task[str | None] | None = None


def _batches(items: Sequence[ClaimRef], size: int) -> Iterator[Sequence[ClaimRef]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class ClaimPreparer:
    def __init__(self, *, options: SliceOptions, checkpoint: ClaimCheckpoint, cdi: ClaimCdi,
                 read_claim: ClaimReader, topology: Callable[[], NodeTopology],
                 limits: PrepareLimits = PrepareLimits(), mig: MigPreparer | None = None,
                 sharing: GpuSharing | None = None, network: ClaimNetwork | None = None,
                 mps: ClaimMpsDaemons | None = None, imex_ready: ImexReadiness | None = None):
        self.options = options
        #: Host-managed IMEX: the host's IMEX daemon must answer READY before a claim's channel is handed out
        #: (plugin/dra/kubelet/imex_ready.py); None: channels are handed out unchecked.
        self.imex_ready = imex_ready
        self.network: ClaimNetwork = network or NoNetwork(options.driver_name)
        #: Dynamic MIG: creates a claim's MIG instances before its CDI spec is written (plugin/dra/mig/prepare.py).
        self.mig = mig
        #: GPU time-slicing through claim config; simulated GPUs' settings go to a file beside the checkpoint.
        self.sharing = sharing or GpuSharing(options.driver_name, SimulatedTimeSlice(state_path(checkpoint.path)))
        self.checkpoint = checkpoint
        #: MPS through claim config: one control daemon per GPU, held by the claims sharing it.
        self.mps = mps or ClaimMpsDaemons(os.path.dirname(checkpoint.path), DEFAULT_HOST_ROOT, MpsControl())
        self.cdi = cdi
        self.read_claim = read_claim
        self.topology = topology
        self.limits = limits
        #: Prepare/unprepare calls being worked now.
        self.calls = 0
        # Set from the loop, read in checkpoint threads too: a stop cuts a batch being written short.
        self._stopping = threading.Event()
        #: The device table of the topology it was built from (see `_device_table`).
        self._table: tuple[NodeTopology, dict[str, Device]] | None = None

    def _device_table(self) -> dict[str, Device]:
        """`device_table` of the current topology, built once per topology rather than once per call (a
        quarter of a millisecond on the loop, issue 24): the topology and its devices are immutable and the
        driver replaces the whole object on every change (health, hot-plug). Read only."""
        topology = self.topology()
        if self._table is None or self._table[0] is not topology:
            self._table = (topology, device_table(topology, self.options))
        return self._table[1]

    def stop(self) -> None:
        """The driver is stopping: calls in flight answer now, claims not yet prepared fail with that reason
        (a batch being written records the claims whose specs it wrote), and new calls prepare nothing."""
        self._stopping.set()

    @property
    def busy(self) -> bool:
        """Work is going on: a call, or a checkpoint write whose caller may have gone."""
        return self.calls > 0 or self.checkpoint.pending > 0

    # -- prepare -------------------------------------------------------------------------------
    async def prepare(self, ref: ClaimRef) -> PreparedClaim:
        """One claim (from the checkpoint when already prepared); raises PrepareError."""
        outcome = (await self.prepare_many([ref]))[ref.uid]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def prepare_many(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        """Prepare the claims of one call in batches; the outcome per claim UID.

        Cancelling the caller stops the work at the next batch (see the module docstring).
        """
        self.calls += 1
        try:
            return await self._prepare_many(refs)
        finally:
            self.calls -= 1

    async def _prepare_many(self, refs: Sequence[ClaimRef]) -> dict[str, Outcome]:
        out: dict[str, Outcome]
        out, todo = _complete_refs(refs)
        if not todo:
            return out
        known = await self.checkpoint.read()
        out.update({r.uid: known[r.uid] for r in todo if r.uid in known})
        todo = [r for r in todo if r.uid not in known]
        if not todo:
            return out
        table = self._device_table()
        reads = _CallReads(self.limits.reads_per_call)
        for batch in _batches(todo, self.limits.batch):
            if self._stopping.is_set():
                out.update({ref.uid: _stopping() for ref in batch})
                continue
            found = await asyncio.gather(*(self._allocation(ref, reads, table) for ref in batch))
            ready = []
            for ref, got in zip(batch, found):
                if isinstance(got, Exception):
                    out[ref.uid] = got
                else:
                    ready.append((ref, got))
            if ready:
                done = await self.checkpoint.update(functools.partial(self._record, ready=ready))
                out.update(done)
                for ref, (allocated, *_) in ready:
                    refusal = done.get(ref.uid)
                    if isinstance(refusal, NicConflict):
                        log.warning("claim refused: its NICs clash with a prepared claim's",
                                    extra={"uid": ref.uid, "reason": str(refusal)})
                        await self.network.refused(ref, allocated, refusal.error)
        return out

    def _record(self, claims: dict[str, PreparedClaim],
                ready: list[tuple[ClaimRef, Planned]]) -> dict[str, Outcome]:
        """Under the checkpoint lock: write the batch's CDI specs and record the batch (one file write)."""
        done: dict[str, Outcome] = {}
        holders: Holders | None = None  # who holds a time-slice on which GPU: built once per batch, when needed
        for ref, (allocated, shares, wants, networks, pods, mps, channels) in ready:
            if ref.uid in claims:  # another call or instance prepared it meanwhile
                done[ref.uid] = claims[ref.uid]
                continue
            if self._stopping.is_set():
                done[ref.uid] = _stopping()
                continue
            try:  # against every claim prepared here, this batch's earlier ones included
                check_conflicts(f"{ref.namespace}/{ref.name}", ref.uid, pods, networks, claims)
            except NicConfigError as e:
                done[ref.uid] = NicConflict(e)
                continue
            devices = {name: dev for name, dev, _ in allocated}
            if wants:  # one time-slice setting per GPU: checked against every prepared claim, then applied
                holders = Holders.of(claims) if holders is None else holders
                try:
                    self.sharing.admit(ref.uid, wants, devices, holders)
                except (SharingRefused, TimeSliceApplyError) as e:
                    done[ref.uid] = PrepareError(f"ResourceClaim {ref.namespace}/{ref.name}: {e}")
                    continue
            try:
                if self.mig is not None:
                    allocated = self.mig.prepare(ref.uid, allocated)
                    devices = {name: dev for name, dev, _ in allocated}
                    # A dynamic MIG device has its UUID only now: its MPS daemon is the made instance's.
                    mps = {name: (devices[name], settings) for name, (_, settings) in mps.items()}
                # One CDI device per device, however many shares of it the claim holds. A NIC that moves into
                # the pod is named there as its NicConfig says: its env (and the NCCL hint) give that name.
                in_pod = {name: _renamed(dev, networks[name].pod_name) if name in networks else dev
                          for name, dev in devices.items()}
                # MPS: the claim joins (or starts) each GPU's control daemon; its spec gets the pipe and limits.
                extras: dict[str, Any] = {"edits": self.mps.acquire(ref.uid, mps)} if mps else {}
                nodes = [(name, self.options.imex.device_node(n)) for name, n, _ in channels
                         if self.options.imex is not None]
                if nodes:  # `channels=` only when there are some: stand-ins of ClaimCdi in tests predate it
                    extras["channels"] = nodes
                ids = self.cdi.write_claim_spec(ref.uid, list(in_pod.items()), device_settings(wants), **extras)
                cdi_ids = dict(zip([*devices, *(name for name, _ in nodes)], ids))
            except Exception as e:  # noqa: BLE001 (this claim fails alone; the batch is still recorded)
                if mps:
                    self.mps.release(ref.uid)
                done[ref.uid] = e if self.mig is None else self._undo_mig(ref.uid, e)
                if wants and holders is not None:  # nothing records the setting just applied: undo it where no
                    self.sharing.release({n: devices[n] for n in wants}, holders)  # other claim holds one
                continue
            claims[ref.uid] = done[ref.uid] = PreparedClaim(
                uid=ref.uid, namespace=ref.namespace, name=ref.name,
                devices=tuple(PreparedDevice(pool=self.options.pool, device=name, requests=tuple(reqs),
                                             cdi_device_ids=tuple(cdi_ids[name]),
                                             timeslice=wants[name].value if name in wants else "", share_id=share,
                                             network=networks.get(name))
                              for (name, _, reqs), share in zip(allocated, shares))
                + tuple(PreparedDevice(pool=self.options.pool, device=name, requests=tuple(reqs),
                                       cdi_device_ids=tuple(cdi_ids[name])) for name, _, reqs in channels),
                pods=pods,
            )
            if wants and holders is not None:
                holders.add(claims[ref.uid])
            log.info("prepared claim", extra={"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid,
                                              "devices": [name for name, _, _ in allocated]})
        return done

    def _undo_mig(self, uid: str, error: Exception) -> Exception:
        """A claim that failed after its MIG instances were made gives them back (or says why it could not)."""
        try:
            self.mig.release(uid)  # type: ignore[union-attr]  # only called where self.mig is set (see _record)
        except Exception as e:  # noqa: BLE001 (whatever the MIG backend raises is logged; unprepare retries)
            log.error("MIG instances of a failed prepare not destroyed; unprepare retries", extra={"uid": uid,
                                                                                                  "reason": str(e)})
        return error if not isinstance(error, MigError) else PrepareError(f"MIG: {error}")

    async def _allocation(self, ref: ClaimRef, reads: _CallReads,
                          table: dict[str, Device]) -> Planned | Exception:
        try:
            claim = parse_claim(await self._read(ref, reads))  # the one parse; everything below reads `claim`
            allocated, shares, channels = self._allocated_devices(ref, claim, table)
            if channels and self.imex_ready is not None:
                if reads.imex is None:
                    reads.imex = asyncio.ensure_future(self.imex_ready.problem())
                problem = await reads.imex
                if problem:
                    names = ", ".join(name for name, _, _ in channels)
                    log.warning("claim's IMEX channel not handed out: the host's IMEX daemon is not ready",
                                extra={"uid": ref.uid, "reason": problem})
                    raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name}: IMEX channel {names} not "
                                       f"handed out: {problem}")
            try:
                wants = self.sharing.wanted(claim, allocated)
                mps = mps_wanted(claim, allocated, self.options.driver_name)
            except (SharingRefused, MpsRefused) as e:
                raise PrepareError(f"ResourceClaim {ref.namespace}/{ref.name}: {e}") from None
            try:
                networks = await self.network.plan(ref, claim, allocated)
            except NicConfigError as e:
                log.warning("claim refused: bad NIC configuration", extra={"uid": ref.uid, "reason": str(e)})
                await self.network.refused(ref, allocated, e)
                return PrepareError(str(e))
            return Planned(allocated, shares, wants, networks, claim.reserved_pods, mps, channels)
        except PrepareError as e:
            return e
        except Exception as e:
            log.exception("prepare failed unexpectedly", extra={"uid": ref.uid})
            return e

    async def _read(self, ref: ClaimRef, reads: _CallReads) -> dict[str, Any]:
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        async with reads.slots:
            if self._stopping.is_set():
                raise _stopping()
            if reads.unreachable is not None:
                raise PrepareError(f"reading {where}: not tried, {reads.unreachable}")
            try:
                async with asyncio.timeout(self.limits.read_timeout_s):
                    return await self.read_claim(ref.namespace, ref.name)
            except TimeoutError:
                reads.unreachable = (f"the API server did not answer within {self.limits.read_timeout_s:g} s "
                                     "(overloaded or unreachable)")
                raise PrepareError(f"reading {where}: {reads.unreachable}") from None
            except KubeApiUnreachable as e:
                reads.unreachable = str(e)
                raise PrepareError(f"reading {where}: {e}") from None
            except KubeNotFound:
                raise PrepareError(f"{where} not found") from None
            except KubeApiError as e:
                raise PrepareError(f"reading {where}: {e.status}: {e.reason or e}") from None
            except Exception as e:  # noqa: BLE001 (any other failure of the read becomes a per-claim error too)
                raise PrepareError(f"reading {where}: {type(e).__name__}: {e}") from None

    def _allocated_devices(self, ref: ClaimRef, claim: Claim, table: dict[str, Device]
                           ) -> tuple[Allocated, list[str], tuple[tuple[str, int, list[str]], ...]]:
        """The claim's devices of our pool, per entry its share ID, and its IMEX channels (see `Planned`)."""
        where = f"ResourceClaim {ref.namespace}/{ref.name}"
        uid = claim.uid
        if uid != ref.uid:
            raise PrepareError(f"{where} has UID {uid}, the kubelet asked for {ref.uid} (deleted and created again?)")
        ours = claim.results_of(self.options.driver_name)
        if not ours:
            raise PrepareError(f"{where} has no devices allocated from driver {self.options.driver_name}")
        out: dict[tuple[str, str], tuple[str, Device, list[str]]] = {}
        channels: dict[str, tuple[str, int, list[str]]] = {}
        imex = self.options.imex
        for r in ours:
            pool, name = r.pool, r.device
            if pool != self.options.pool:
                raise PrepareError(f"{where}: device {name} is from pool {pool}, this node serves pool "
                                   f"{self.options.pool}")
            dev = table.get(name) if name is not None else None
            channel = channel_of(str(name)) if dev is None and name is not None and imex is not None else None
            if channel is not None and imex is not None and channel < imex.count:
                entry_c = channels.setdefault(str(name), (str(name), channel, []))
                if r.request and r.request not in entry_c[2]:
                    entry_c[2].append(r.request)
                continue
            if dev is None or name is None:
                raise PrepareError(f"{where}: device {name} is not on this node any more")
            if not dev.healthy:
                raise PrepareError(f"{where}: device {name} ({dev.name}) is {dev.health}")
            request = r.request  # the parent request; sharing reads the subrequest from `claim` itself
            share = r.share_id  # set when the device allows multiple allocations
            entry = out.setdefault((name, share), (name, dev, []))
            if request and request not in entry[2]:
                entry[2].append(request)
        return list(out.values()), [share for _, share in out], tuple(channels.values())

    # -- unprepare -----------------------------------------------------------------------------
    async def unprepare(self, ref: ClaimRef) -> None:
        outcome = (await self.unprepare_many([ref]))[ref.uid]
        if outcome is not None:
            raise outcome

    async def unprepare_many(self, refs: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        """Unprepare the claims of one call, a batch per checkpoint write; None per claim that is done."""
        self.calls += 1
        try:
            out: dict[str, Exception | None]
            out, todo = _complete_refs(refs)
            if self.network.active and todo:
                out.update(await self._release_nics(todo))
                todo = [r for r in todo if out.get(r.uid) is None]
            for batch in _batches(todo, self.limits.batch):
                out.update(await self.checkpoint.update(functools.partial(self._drop, batch=batch)))
            return out
        finally:
            self.calls -= 1

    async def _release_nics(self, refs: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        """NICs back to the node before the claims are dropped: a claim whose NICs could not be given back
        stays recorded (its error says why), so the kubelet's retry finds what is left to undo."""
        known = await self.checkpoint.read()
        with_nics = [known[r.uid] for r in refs if r.uid in known and known[r.uid].networks]
        if not with_nics:
            return {}
        try:
            done = await self.network.release(with_nics)
        except Exception as e:
            log.exception("giving NICs back failed unexpectedly", extra={"claims": len(with_nics)})
            done = {c.uid: e for c in with_nics}
        return {uid: e for uid, e in done.items() if e is not None}

    def _drop(self, claims: dict[str, PreparedClaim], batch: Sequence[ClaimRef]) -> dict[str, Exception | None]:
        out: dict[str, Exception | None] = {}
        table: dict[str, Device] | None = None
        holders: Holders | None = None
        for ref in batch:
            try:
                if self.mig is not None:  # destroyed before the claim is forgotten: a crash cannot leak one
                    self.mig.release(ref.uid)
                # Also when unknown: a crash between writing the CDI spec and the checkpoint leaves a spec behind.
                self.cdi.remove_claim_spec(ref.uid)
            except Exception as e:  # noqa: BLE001 (this claim stays recorded; the others go on)
                out[ref.uid] = e
                continue
            gone = claims.pop(ref.uid, None)
            self.mps.release(ref.uid)  # the control daemons it held quit when no other claim holds them
            if gone is not None:
                log.info("unprepared claim", extra={"claim": f"{ref.namespace}/{ref.name}", "uid": ref.uid})
                shared = [d.device for d in gone.devices if d.timeslice]
                if shared:  # GPUs it had time-sliced go back to Default once no prepared claim holds a setting
                    table = table if table is not None else self._device_table()
                    if holders is None:
                        holders = Holders.of(claims)
                    else:
                        holders.drop(ref.uid)
                    self.sharing.release({n: table[n] for n in shared if n in table}, holders)
            out[ref.uid] = None
        return out


def _renamed(dev: Device, netdev: str) -> Device:
    """`dev` as the container sees it once its network interface is `netdev` in the pod."""
    if dev.attributes.get("netdev") == netdev:
        return dev
    return dataclasses.replace(dev, attributes={**dev.attributes, "netdev": netdev})


def _stopping() -> PrepareError:
    return PrepareError("the DRA driver is stopping (pod deleted or updated); the kubelet retries the claim "
                        "with the next instance")


def _complete_refs(refs: Sequence[ClaimRef]) -> tuple[dict, list[ClaimRef]]:
    """({uid: PrepareError} for the claims the kubelet named incompletely, the others to work on)."""
    refused: dict = {}
    todo: list[ClaimRef] = []
    for ref in refs:
        missing = [f for f in ("namespace", "uid", "name") if not getattr(ref, f)]
        if missing:
            refused[ref.uid] = PrepareError(f"claim {ref.namespace}/{ref.name}: {', '.join(missing)} must be set")
        else:
            todo.append(ref)
    return refused, todo
