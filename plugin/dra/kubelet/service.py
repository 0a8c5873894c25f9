"""The gRPC services the kubelet calls: DRAPlugin (v1 and v1beta1) and the plugin watcher's Registration.

The DRA socket also serves DRAResourceHealth (plugin/dra/kubelet/health_service.py);
the registration lists it after the DRAPlugin versions, which is how the
kubelet learns it may open the health stream.

Why both DRA versions: the kubelet picks the first entry of our
`supported_versions` it knows ("v1.DRAPlugin" on 1.34+, "v1beta1.DRAPlugin"
on older kubelets), so one driver binary works across the supported
Kubernetes versions. Both services share one `ClaimPreparer`; only the
message classes differ (v1 adds Device.share_id, set for a claim that holds
a share of a GPU published with `allowMultipleAllocations`: consumable
capacity, docs/dra.md "Sharing a GPU").

Every per-claim problem goes into that claim's `error` field; the RPC itself
fails only for a malformed request (INVALID_ARGUMENT naming the problem).
The claim's error says what kind of problem it is (issue 19): the claim is
bad (`PrepareError`, `BadClaimUid`: a refusal, logged as a warning), or the
node is misconfigured (`CdiDirError`: the reason and the fix, logged as an
error). Neither is a bug, so neither is logged with a traceback; only what is
left ("internal error") is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

import grpc

from ...api.dra.v1 import api_pb2 as dra_v1
from ...api.dra.v1 import api_pb2_grpc as dra_v1_grpc
from ...api.dra.v1beta1 import api_pb2 as dra_v1beta1
from ...api.dra.v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from ...api.pluginregistration.v1 import api_pb2 as reg_pb2
from ...api.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from ...errors import shorten
from ...model.cdi.toolkit import ToolkitSpecError
from .cdi import BadClaimUid, CdiDirError, check_claim_uid
from .health_service import HEALTH_SERVICES, HealthBoard, add_health_services
from ..claims.prepared import ClaimRef
from .prepare import ClaimPreparer, PrepareError

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
#: Newest first: the kubelet takes the first one it supports.
SUPPORTED_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")


def _servicer(pb2: ModuleType, grpc_mod: ModuleType, version: str) -> type:
    class DraService(grpc_mod.DRAPluginServicer):  # type: ignore[name-defined]  # base from the module passed in (v1, v1beta1)
        def __init__(self, preparer: ClaimPreparer):
            self.preparer = preparer

        async def _claims(self, request, context) -> list[ClaimRef]:
            refs = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
            uids = [r.uid for r in refs]
            if len(set(uids)) != len(uids):
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a claim UID is listed twice")
            return refs

        async def NodePrepareResources(self, request, context):  # noqa: N802 (gRPC names)
            refs = await self._claims(request, context)
            refused, good = _checked_uids(refs)
            results: dict[str, object] = dict(refused)
            try:
                results.update(await self.preparer.prepare_many(good))  # batched; stops when the kubelet has gone
            except Exception as e:  # a request must never take the driver down
                log.exception("prepare failed unexpectedly", extra={"claims": len(good)})
                results.update({r.uid: e for r in good})
            resp = pb2.NodePrepareResourcesResponse()
            for ref in refs:
                resp.claims[ref.uid].CopyFrom(self._prepared(ref, results[ref.uid]))
            return resp

        def _prepared(self, ref: ClaimRef, prepared):
            if isinstance(prepared, Exception):
                return pb2.NodePrepareResourceResponse(error=_claim_error("prepare", ref, prepared, version))
            return pb2.NodePrepareResourceResponse(devices=[_device(pb2, d) for d in prepared.devices])

        async def NodeUnprepareResources(self, request, context):  # noqa: N802 (gRPC names)
            refs = await self._claims(request, context)
            refused, good = _checked_uids(refs)
            results: dict[str, Exception | None] = dict(refused)
            try:
                results.update(await self.preparer.unprepare_many(good))
            except Exception as e:  # a request must never take the driver down
                log.exception("unprepare failed unexpectedly", extra={"claims": len(good)})
                results.update({r.uid: e for r in good})
            resp = pb2.NodeUnprepareResourcesResponse()
            for ref in refs:
                resp.claims[ref.uid].CopyFrom(pb2.NodeUnprepareResourceResponse(
                    error=self._unprepared(ref, results[ref.uid])))
            return resp

        def _unprepared(self, ref: ClaimRef, e: Exception | None) -> str:
            return "" if e is None else _claim_error("unprepare", ref, e, version)

    DraService.__name__ = f"DraService_{version}"
    return DraService


def _device(pb2: ModuleType, d: Any) -> Any:
    """One prepared device as the kubelet gets it; `share_id` (v1 only, an optional field: unset means the whole
    device) when the claim holds a share of it (consumable capacity)."""
    msg = pb2.Device(request_names=list(d.requests), pool_name=d.pool, device_name=d.device,
                     cdi_device_ids=list(d.cdi_device_ids))
    if d.share_id and "share_id" in pb2.Device.DESCRIPTOR.fields_by_name:
        msg.share_id = d.share_id
    return msg


def _checked_uids(refs: list[ClaimRef]) -> tuple[dict[str, BadClaimUid], list[ClaimRef]]:
    """({uid: BadClaimUid} for the claims whose UID cannot name a file, the other claims): a bad UID is
    refused before any work, so nothing of it reaches the checkpoint or the CDI directory."""
    refused: dict[str, BadClaimUid] = {}
    good: list[ClaimRef] = []
    for ref in refs:
        try:
            check_claim_uid(ref.uid)
        except BadClaimUid as e:
            refused[ref.uid] = e
        else:
            good.append(ref)
    return refused, good


def _claim_error(what: str, ref: ClaimRef, e: Exception, version: str) -> str:
    """The claim's `error` text for `e`, logged by kind (module doc)."""
    where = {"claim": f"{ref.namespace}/{ref.name}", "uid": shorten(ref.uid, 60), "api": version}
    if isinstance(e, (PrepareError, BadClaimUid)):  # the claim or the request is bad
        log.warning(f"{what} refused", extra={**where, "reason": str(e)})
        return str(e)
    if isinstance(e, CdiDirError):  # the node is misconfigured: the message holds the fix
        log.error(f"{what} failed: the node's CDI directory is unusable", extra={**where, "reason": str(e)})
        return str(e)
    if isinstance(e, ToolkitSpecError):  # --dra-toolkit-cdi: the toolkit's spec is missing or stale; the fix is in it
        log.error(f"{what} failed: NVIDIA's toolkit's CDI spec cannot name the devices", extra={**where,
                                                                                              "reason": str(e)})
        return str(e)
    log.error(f"{what} failed unexpectedly (a bug)", exc_info=e, extra=where)
    return f"internal error: {type(e).__name__}: {e}"


DraServiceV1 = _servicer(dra_v1, dra_v1_grpc, "v1")
DraServiceV1beta1 = _servicer(dra_v1beta1, dra_v1beta1_grpc, "v1beta1")


def add_dra_services(server: grpc.aio.Server, preparer: ClaimPreparer, health: HealthBoard | None = None) -> None:
    dra_v1_grpc.add_DRAPluginServicer_to_server(DraServiceV1(preparer), server)
    dra_v1beta1_grpc.add_DRAPluginServicer_to_server(DraServiceV1beta1(preparer), server)
    if health is not None:
        add_health_services(server, health)


class RegistrationService(reg_grpc.RegistrationServicer):
    """Answers the plugin watcher: who we are and where the DRA service listens."""

    def __init__(self, driver: str, endpoint: str, on_status: Callable[[bool, str], None] | None = None):
        self.driver = driver
        self.endpoint = endpoint
        #: What GetInfo lists: the DRAPlugin versions first (the kubelet takes the first it knows), then health.
        self.services = SUPPORTED_SERVICES + HEALTH_SERVICES
        self.on_status = on_status
        #: (registered, error) of the last NotifyRegistrationStatus; None before the first.
        self.status: tuple[bool, str] | None = None

    async def GetInfo(self, request, context):  # noqa: N802 (gRPC names)
        return reg_pb2.PluginInfo(type=PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                                  supported_versions=list(self.services))

    async def NotifyRegistrationStatus(self, request, context):  # noqa: N802 (gRPC names)
        self.status = (request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"driver": self.driver, "endpoint": self.endpoint})
        else:
            log.error("the kubelet refused the registration",
                      extra={"driver": self.driver, "endpoint": self.endpoint, "reason": request.error})
        if self.on_status is not None:
            self.on_status(request.plugin_registered, request.error)
        return reg_pb2.RegistrationStatusResponse()
