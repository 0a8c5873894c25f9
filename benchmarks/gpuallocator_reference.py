"""OUR re-implementation of go-gpuallocator's best-effort policy, for side-by-side benchmarks.

This is not NVIDIA code and not a translation of it: it is written from the
algorithm's description in `shared/research/nvidia-device-plugin.md` §3.3,
so that `allocator_bench.py` can compare answers and timings on the same
inputs. It keeps the upstream behaviour that matters for a comparison,
including its weak spots:

1. Give up (empty answer) when size <= 0, fewer devices than size, or more
   required devices than size.
2. Enumerate every partition of the available devices into groups of `size`,
   padding the list with `None` up to a multiple of `size`. Each group starts
   with the first device not yet grouped (so every partition appears once);
   the rest of the group is a (size-1)-combination of the remaining devices in
   list order; a group holds either none or all of the padding. Size 1 is a
   special case: one singleton "partition" per device.
3. Keep the first partition (in enumeration order) with the highest total
   score among those that have a padding-free group containing all required
   devices.
4. In it, among the groups containing all required devices (padding is NOT
   excluded here: the bug of go-gpuallocator PR #80), return the first with the
   highest group score.

The pair score is a parameter; the benchmark passes our spec weights so that
only the *search objective* differs (upstream also adds the PCIe score to
NVLink pairs and knows nothing of NUMA).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence

PairScore = Callable[[int, int], int]


class ReferenceTimeout(Exception):
    """The partition enumeration ran past its deadline (it is exponential in the device count)."""


def _group_score(group: Sequence[int | None], pair: PairScore) -> int:
    total = 0
    for a, b in itertools.combinations(group, 2):
        if a is not None and b is not None:
            total += pair(a, b)
    return total


def _partitions(devices: list[int | None], size: int, padding: int) -> Iterator[list[list[int | None]]]:
    """Every partition of `devices` (already padded) into groups of `size`, in upstream order."""
    if len(devices) == size:
        yield [devices]
        return
    head, rest = devices[0], devices[1:]
    for combo in itertools.combinations(range(len(rest)), size - 1):
        group = [head, *(rest[i] for i in combo)]
        pads = sum(1 for g in group if g is None)
        if pads not in (0, padding):
            continue
        taken = set(combo)
        # Upstream removes every padding entry once a group holds padding; a
        # group holds all of it or none, so this is the same thing.
        remaining = [d for i, d in enumerate(rest) if i not in taken and not (pads and d is None)]
        for tail in _partitions(remaining, size, padding):
            yield [group, *tail]


def best_effort_allocate(
    available: Sequence[int],
    required: Sequence[int],
    size: int,
    pair: PairScore,
    deadline: float | None = None,
) -> list[int | None]:
    """The set the best-effort policy would return (possibly containing None, or empty).

    Raises ReferenceTimeout when `deadline` (a time.perf_counter value) passes.
    """
    if size <= 0 or len(available) < size or len(required) > size:
        return []
    need = set(required)

    def has_clean_group(part: list[list[int | None]]) -> bool:
        return any(need.issubset(g) and None not in g for g in part)

    if size == 1:
        parts: Iterator[list[list[int | None]]] = ([[d]] for d in available)
    else:
        padded: list[int | None] = list(available)
        while len(padded) % size:
            padded.append(None)
        parts = _partitions(padded, size, len(padded) - len(available))

    best: list[list[int | None]] | None = None
    best_score = 0
    for count, part in enumerate(parts):
        if deadline is not None and count % 256 == 0 and time.perf_counter() > deadline:
            raise ReferenceTimeout
        if not has_clean_group(part):
            continue
        score = sum(_group_score(g, pair) for g in part)
        if best is None or score > best_score:
            best, best_score = [list(g) for g in part], score
    if best is None:
        return []
    candidates = [g for g in best if need.issubset(g)]
    if not candidates:
        return []
    choice = candidates[0]
    choice_score = _group_score(choice, pair)
    for g in candidates[1:]:
        s = _group_score(g, pair)
        if s > choice_score:
            choice, choice_score = g, s
    return choice


def partition_count(n: int, size: int) -> int:
    """How many partitions the enumeration visits for n devices (for the benchmark's table).

    Counted, not enumerated: a group is its first free (real) device plus
    size-1 others, taking either no padding or all of it.
    """
    if size <= 1:
        return n
    padding = (-n) % size

    def count(real: int, pads: int) -> int:
        if real + pads == size:
            return 1
        total = 0
        for p_in in ((0, pads) if pads else (0,)):
            others = size - 1 - p_in
            if 0 <= others <= real - 1:
                total += math.comb(real - 1, others) * count(real - 1 - others, pads - p_in)
        return total

    return count(n, padding)
