"""Which container holds which device, from the kubelet's pod-resources API (`--pod-resources`, optional).

Why: the partners of a GetPreferredAllocation are a guess from the call
sequence (`plugin.allocation.pairing_groups`). The kubelet's pod-resources `List` says
which devices containers really hold, so it can catch some wrong guesses.

What `List` can and cannot tell (read in the kubelet,
`pkg/kubelet/apis/podresources/server_v1.go` and `kubelet.go`, 1.34 and 1.37):
- It lists the active pods, the one being admitted included (the kubelet adds
  a pod to its pod manager before admitting it), with each app container's
  and sidecar's devices as the device manager holds them. A container's
  devices of one resource are recorded as soon as its `Allocate` returns,
  before the kubelet walks on to the container's next resource, so when that
  next resource's GetPreferredAllocation reaches us, `List` already shows the
  container holding its partners.
- It leaves out non-restartable init containers. A device missing from
  `List` may therefore be an init container's (whose GetPreferredAllocation
  for its second resource must keep its partners): absence proves nothing.

So partners are dropped only on positive evidence that they belong to a
container other than the one asking (`drop_stale`):
1. a container that already holds devices of the requested resource is not
   the one asking for it (the kubelet asks each resource of a container once);
2. the kubelet finishes one container before it starts the next, so when the
   group's newest `Allocate` went to container C, devices `List` shows in
   another container are an earlier container's.
In the kubelet's own sequence neither happens to the asking container's real
partners, so the spec's rule for partners holds with or without this option;
what it removes are partners of a container the window wrongly joined (a
slow kubelet, a container that asked for one of our resources only).

Access: the socket is `<kubelet-root-dir>/pod-resources/kubelet.sock`. When it
is missing or refuses us, the check is quietly off (one INFO line each time
that changes) and partners are used as the call sequence gives them. A call
that fails or takes longer than `timeout_s` leaves the partners as they are:
the check may only ever remove a wrong guess, never delay an answer much.

Cost (issue 19): the answer is capped at `MAX_ANSWER_BYTES`; gRPC refuses a
larger one before decoding it (a WARNING names the size and the cap, and the
partners are left as the call sequence gives them). An accepted answer is
decoded and turned into `Holdings` in a worker thread, never on the event
loop the other resource's RPCs are served from: a 13 MiB answer decoded on
the loop stalled it for 0.5 s (the issue's machine) to 2.6 s (a loaded CI
machine). Why the cap is safe: a 110-pod node's answer is far smaller
(figures in docs/pairing.md, measured by `benchmarks/pod_resources_bench.py`).

Caveat (a kubelet race, not ours): `List` runs the device manager's
`UpdateAllocatedDevices`, which rebuilds its in-use set when a pod has just
left; the kubelet's own comments note that a `List` from any client during
an allocation can do this. Reading `List` only when there are partners to
check keeps such calls to one per container at most.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError

from ..api.podresources.v1 import api_pb2

log = logging.getLogger(__name__)

#: The socket under the kubelet's root directory.
SOCKET_IN_ROOT = os.path.join("pod-resources", "kubelet.sock")
#: The largest `List` answer accepted (the kubelet's own limit, podresources.DefaultMaxMsgSize, is
#: 16 MiB). A 110-pod node answers about 13 KiB typically and 458 KiB with 8 GPUs and 8 NICs in
#: every one of 440 containers (docs/pairing.md); a larger answer is refused by gRPC before decoding.
MAX_ANSWER_BYTES = 4 << 20
DEFAULT_TIMEOUT_S = 0.25
#: The method, called without a response deserializer: the raw answer is decoded in a thread.
LIST_METHOD = "/v1.PodResourcesLister/List"
#: Failures of one call that say nothing about access (logged at debug, the state is kept).
_PASSING = frozenset({grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED})
#: How gRPC says an answer was over `grpc.max_receive_message_length` (RESOURCE_EXHAUSTED, as the
#: kubelet's rate limit says "rejected by rate limit"): "Received message larger than max (N vs. M)".
_TOO_LARGE = re.compile(r"larger than max \((\d+) vs\. (\d+)\)")


def socket_path(kubelet_root_dir: str) -> str:
    return os.path.join(kubelet_root_dir, SOCKET_IN_ROOT)


@dataclass(frozen=True)
class Holdings:
    """What `List` says: who holds each device, and which resources each container holds."""

    #: (resource, device ID) -> container (`namespace/pod/container`).
    holder: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: container -> the resources it holds devices of.
    resources: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_list(cls, resp: api_pb2.ListPodResourcesResponse) -> Holdings:
        holder: dict[tuple[str, str], str] = {}
        resources: dict[str, set[str]] = {}
        for pod in resp.pod_resources:
            for c in pod.containers:
                who = f"{pod.namespace}/{pod.name}/{c.name}"
                held = resources.setdefault(who, set())
                for d in c.devices:
                    if d.device_ids:
                        held.add(d.resource_name)
                    for i in d.device_ids:
                        holder[(d.resource_name, i)] = who
        return cls(holder, {k: frozenset(v) for k, v in resources.items()})


def drop_stale(resource: str, group: Mapping[str, tuple[str, ...]], holdings: Holdings
               ) -> dict[str, tuple[str, ...]]:
    """`group` (resource -> device IDs, oldest `Allocate` first) without the devices `holdings`
    proves to be held by a container other than the one asking for `resource` (module doc, 1 and 2).
    Devices `List` does not show are kept (they may be an init container's)."""
    newest: str | None = None
    if group:
        last = list(group)[-1]
        owners = {holdings.holder.get((last, i)) for i in group[last]} - {None}
        if len(owners) == 1:
            newest = owners.pop()
    out: dict[str, tuple[str, ...]] = {}
    for res, ids in group.items():
        kept = []
        for i in ids:
            who = holdings.holder.get((res, i))
            if who is not None and (resource in holdings.resources.get(who, ()) or
                                    (newest is not None and who != newest)):
                continue
            kept.append(i)
        if kept:
            out[res] = tuple(kept)
    return out


def _decode(raw: bytes) -> Holdings:
    """The answer's bytes as `Holdings` (a worker thread's job: it is the costly part)."""
    return Holdings.from_list(api_pb2.ListPodResourcesResponse.FromString(raw))


class PodResourcesReader:
    """Calls `List` on the kubelet's pod-resources socket; None when it cannot be read."""

    def __init__(self, path: str, timeout_s: float = DEFAULT_TIMEOUT_S, max_answer_bytes: int = MAX_ANSWER_BYTES):
        self.path = path
        self.timeout_s = timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._channel: grpc.aio.Channel | None = None
        self._list: grpc.aio.UnaryUnaryMultiCallable | None = None
        #: "ok", "missing", "failing" or "too-large": each change is logged once (INFO; WARNING for too-large).
        self.state = ""

    def _set_state(self, state: str, message: str, level: int = logging.INFO, **extra: object) -> None:
        if state != self.state:
            self.state = state
            log.log(level, message, extra={"socket": self.path, **extra})

    async def holdings(self) -> Holdings | None:
        if not os.path.exists(self.path):
            self._set_state("missing", "pod-resources socket not found: pairing partners are not checked "
                                       "against the containers' devices")
            await self.close()
            return None
        if self._list is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix:{self.path}", options=[("grpc.max_receive_message_length", self.max_answer_bytes)])
            self._list = self._channel.unary_unary(
                LIST_METHOD, request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString)
        try:
            raw = await self._list(api_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as e:
            reason = f"{e.code().name}: {e.details()}"
            too_large = (_TOO_LARGE.search(e.details() or "")
                         if e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED else None)
            if too_large is not None:
                size = int(too_large.group(1))
                self._set_state("too-large", f"pod-resources answer refused: {size} bytes, over the cap of "
                                             f"{self.max_answer_bytes} bytes; pairing partners are not checked "
                                             "against the containers' devices", logging.WARNING,
                                size_bytes=size, cap_bytes=self.max_answer_bytes)
            elif e.code() in _PASSING:  # a busy kubelet (its rate limit, our timeout): this call only
                log.debug("pod-resources List failed; partners left as they are", extra={"reason": reason})
            else:
                self._set_state("failing", "cannot read pod-resources: pairing partners are not checked "
                                           "against the containers' devices", reason=reason)
            return None
        try:
            holdings = await asyncio.to_thread(_decode, raw)
        except DecodeError as e:
            self._set_state("failing", "cannot read pod-resources: the answer is not a pod-resources List answer; "
                                       "pairing partners are not checked against the containers' devices",
                            reason=str(e))
            return None
        self._set_state("ok", "reading pod-resources to check pairing partners")
        return holdings

    async def close(self) -> None:
        channel, self._channel, self._list = self._channel, None, None
        if channel is not None:
            await channel.close()
