"""Every kind of bad request of the spec is rejected, by every policy, with a precise message.

The gRPC layer turns AllocationError into INVALID_ARGUMENT; the message must
name the offending IDs or numbers so an operator can see what was wrong.
"""

from __future__ import annotations

import pytest

from allocator.policies import POLICY_NAMES, get_policy
from allocator.request import AllocationError, AllocationRequest

from alloc_testlib import nvswitch

G = nvswitch(4)

BAD = [
    # (name, available, must, size, words the message must contain)
    ("size zero", ["GPU0", "GPU1"], [], 0, ["0"]),
    ("negative size", ["GPU0", "GPU1"], [], -2, ["-2"]),
    ("size above available", ["GPU0", "GPU1"], [], 3, ["3", "2"]),
    ("must above size", ["GPU0", "GPU1", "GPU2"], ["GPU0", "GPU1"], 1, ["2", "1"]),
    ("must not available", ["GPU0", "GPU1"], ["GPU2"], 1, ["GPU2"]),
    ("repeated available", ["GPU0", "GPU1", "GPU0"], [], 1, ["GPU0"]),
    ("repeated must", ["GPU0", "GPU1"], ["GPU1", "GPU1"], 2, ["GPU1"]),
    ("unknown available", ["GPU0", "GPU9"], [], 1, ["GPU9"]),
    ("unknown must", ["GPU0", "GPU1"], ["nope"], 1, ["nope"]),
]


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("name,available,must,size,words", BAD, ids=[b[0] for b in BAD])
def test_bad_request_is_rejected(policy: str, name: str, available: list[str], must: list[str],
                                 size: int, words: list[str]) -> None:
    req = AllocationRequest.of(available, must, size)
    with pytest.raises(AllocationError) as err:
        get_policy(policy).allocate(G, req)
    for word in words:
        assert word in str(err.value), (name, str(err.value))


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_policy_keeps_serving_after_a_bad_request(policy: str) -> None:
    p = get_policy(policy)
    with pytest.raises(AllocationError):
        p.allocate(G, AllocationRequest.of(["GPU0"], [], 2))
    assert len(p.allocate(G, AllocationRequest.of(G.ids, [], 2)).ids) == 2


def test_allocate_calls_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation is the request's own (one place for every message), and it runs first."""
    seen = []
    original = AllocationRequest.validate

    def spy(self: AllocationRequest, graph) -> None:
        seen.append(self)
        original(self, graph)

    monkeypatch.setattr(AllocationRequest, "validate", spy)
    req = AllocationRequest.of(G.ids, [], 2)
    for policy in POLICY_NAMES:
        get_policy(policy).allocate(G, req)
    assert len(seen) == len(POLICY_NAMES)
