"""10,000 generated RPCs, good and bad, against a real daemon process over its unix sockets.

What a user would notice if this failed: a kubelet (or anything that can reach the socket)
crashing, bloating or wedging the node's plugin with odd requests, or getting a wrong
allocation or an unreadable error back. Every answer must be a valid allocation or a short
gRPC error that names the problem; afterwards the daemon still runs, its memory, threads and
file descriptors are where they were, and a health change still reaches the kubelet.

The inputs come from a seeded generator (the seed is printed); rerun with
TOPO_DP_FUZZ_SEED=<seed> to reproduce.
"""

from __future__ import annotations

import asyncio
import os
import random

import grpc
import pytest
import yaml
from daemon_testlib import GPU, allocate_request, preferred_request
from topo_testkit.procfs import footprint

from plugin.api import api_pb2, api_pb2_grpc

pytestmark = pytest.mark.timeout(600)

RPCS = 10_000
BATCH = 40
#: Status codes a client may get for a bad request (never UNKNOWN or a crash).
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}
MAX_MESSAGE = 512


def bad_id(rng: random.Random) -> str:
    return rng.choice([
        "", " ", "GPU-does-not-exist", "x" * rng.choice([300, 10_000]), "é\u0000\u202e", "../../etc/passwd",
        str(rng.randint(8, 10**9)), "-1", "0,1",
    ])


def id_list(rng: random.Random, ids: list[str], bad: bool) -> list[str]:
    out = rng.sample(ids, rng.randint(0, len(ids)))
    if bad:
        out += [bad_id(rng) for _ in range(rng.randint(1, 3))]
        if out and rng.random() < 0.3:
            out.append(out[0])  # a duplicate
        if rng.random() < 0.03:
            out = out * rng.randint(50, 400)  # a long list (up to a few MB with long IDs)
    rng.shuffle(out)
    return out


def generate(rng: random.Random, ids: list[str]) -> tuple[str, object, bool]:
    """(method, request, whether it is well-formed)."""
    kind = rng.random()
    bad = rng.random() < 0.6
    if kind < 0.45:
        reqs = []
        for _ in range(rng.choice([1, 1, 1, 2, 3, 50]) if bad else rng.randint(1, 2)):
            avail = id_list(rng, ids, bad) if bad else rng.sample(ids, rng.randint(1, len(ids)))
            must = (rng.sample(avail, rng.randint(0, min(2, len(avail)))) if avail and not bad
                    else id_list(rng, ids, True)[:2] if bad else [])
            size = (rng.choice([0, -1, -2**31, 2**31 - 1, len(avail) + 1, rng.randint(1, 8)]) if bad
                    else rng.randint(max(1, len(must)), len(avail)))
            reqs.append((avail, must, size))
        return "GetPreferredAllocation", preferred_request(*reqs), not bad
    if kind < 0.85:
        lists = [id_list(rng, ids, bad) if bad else rng.sample(ids, rng.randint(1, len(ids)))
                 for _ in range(rng.choice([0, 1, 2, 30]) if bad else 1)]
        return "Allocate", allocate_request(*lists), not bad
    if kind < 0.95:
        req = api_pb2.PreStartContainerRequest(devices_ids=id_list(rng, ids, bad) if bad else rng.sample(ids, 1))
        return "PreStartContainer", req, not bad
    return "GetDevicePluginOptions", api_pb2.Empty(), True


def check_ok(method: str, request, reply, ids: set[str]) -> str | None:
    if method == "GetPreferredAllocation":
        for creq, cresp in zip(request.container_requests, reply.container_responses, strict=True):
            got = list(cresp.deviceIDs)
            if (len(got) != creq.allocation_size or len(set(got)) != len(got)
                    or not set(got) <= set(creq.available_deviceIDs)
                    or not set(creq.must_include_deviceIDs) <= set(got)):
                return f"invalid answer {got} for {creq}"
    if method == "Allocate" and len(reply.container_responses) != len(request.container_requests):
        return "Allocate answered a different number of containers"
    return None


async def call(stub, method: str, request):
    try:
        return await getattr(stub, method)(request, timeout=60), None
    except grpc.aio.AioRpcError as e:
        return None, e


async def test_ten_thousand_generated_rpcs(kubelet, start_daemon, tmp_path, plugin_dir):
    seed = int(os.environ.get("TOPO_DP_FUZZ_SEED", random.randrange(1 << 32)))
    print(f"\nfuzz seed {seed} (TOPO_DP_FUZZ_SEED={seed} reproduces it)")
    rng = random.Random(seed)
    from plugin.sources.simulated import builtin_text

    node = tmp_path / "node.yaml"
    node.write_text(builtin_text("dgx-a100"))
    daemon = start_daemon("--simulate", str(node), "--device-plugin-path", plugin_dir, "--device-id-strategy",
                          "index", raw=True)
    await kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=60)
    ids = sorted(kubelet.devices(GPU))
    endpoint = kubelet.registrations_of(GPU)[0].endpoint
    problems: list[str] = []
    counts: dict[str, int] = {}
    async with grpc.aio.insecure_channel(f"unix:{plugin_dir}/{endpoint}") as channel:
        stub = api_pb2_grpc.DevicePluginStub(channel)
        raw = channel.unary_unary("/v1beta1.DevicePlugin/GetPreferredAllocation")  # bytes in, bytes out
        await call(stub, "GetDevicePluginOptions", api_pb2.Empty())
        before = footprint(daemon.pid)
        sent = 0
        while sent < RPCS:
            batch = [generate(rng, ids) for _ in range(BATCH)]
            garbage = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
            results = await asyncio.gather(*(call(stub, m, r) for m, r, _ in batch))
            try:
                await raw(garbage, timeout=60)
            except grpc.aio.AioRpcError as e:
                # A request protobuf cannot parse never reaches our code: grpc answers it itself
                # (UNKNOWN, naming the parse error), and the daemon lives on.
                if e.code() not in REFUSALS and "Error parsing message" not in (e.details() or ""):
                    problems.append(f"garbage {garbage!r}: {e.code()} {e.details()}")
            sent += len(batch) + 1
            for (method, request, good), (reply, error) in zip(batch, results):
                key = f"{method} {'ok' if error is None else error.code().name}"
                counts[key] = counts.get(key, 0) + 1
                if error is None:
                    bad = check_ok(method, request, reply, set(ids))
                    if bad:
                        problems.append(f"{method}: {bad}")
                elif good:
                    problems.append(f"{method}: a well-formed request refused: {error.code()} {error.details()}")
                elif error.code() not in REFUSALS:
                    problems.append(f"{method}: {error.code()} {error.details()[:200]}")
                elif not error.details() or len(error.details()) > MAX_MESSAGE:
                    problems.append(f"{method}: error message of {len(error.details() or '')} characters")
            if len(problems) > 20:
                break
        after = footprint(daemon.pid)
    print("answers:", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())))
    print(f"daemon before: {before}; after {sent} RPCs: {after}")
    assert not problems, f"seed {seed}:\n" + "\n".join(problems[:20])
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    assert sent >= RPCS
    assert after.rss_mib - before.rss_mib < 30, (before, after)
    assert after.threads <= before.threads + 4 and after.fds <= before.fds + 8, (before, after)

    # The kubelet's stream still works: a GPU turning unhealthy reaches it.
    data = yaml.safe_load(node.read_text())
    data["gpus"][3]["health"] = "Unhealthy"
    node.write_text(yaml.safe_dump(data, sort_keys=False))
    await kubelet.wait_for(lambda: kubelet.devices(GPU)[ids[3]].health == "Unhealthy", timeout=60)
    assert await daemon.terminate(timeout=60) == 0
