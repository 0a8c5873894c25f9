"""NUMA affinity masks, as the kubelet's Topology Manager represents them.

Why a dedicated type instead of a plain `frozenset[int]`: the Topology
Manager's tie-breaks are defined on the *integer* value of a 64-bit mask
("narrower" means fewer bits, then the numerically smaller mask), and hint
generation walks the masks in one specific order. Reproducing those exactly is
what makes the model agree with the real kubelet, so they live here, in one
place, on an immutable value type.

Bits are NUMA node IDs 0..63 (the kubelet uses a `uint64`); anything else is
rejected on construction and simply "not set" when queried, as in the kubelet.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

#: Highest NUMA node ID a mask can hold (the kubelet's mask is a uint64).
MAX_BIT = 63
_ALL_ONES = (1 << (MAX_BIT + 1)) - 1


class BitMaskError(ValueError):
    """A bit outside 0..63 was given to a mask constructor."""

    def __init__(self) -> None:
        # The kubelet's exact wording.
        super().__init__("bit number must be in range 0-63")


def _check(bit: int) -> None:
    if not 0 <= bit <= MAX_BIT:
        raise BitMaskError()


@dataclass(frozen=True, order=False)
class BitMask:
    """An immutable set of NUMA node IDs stored as a 64-bit integer."""

    value: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.value <= _ALL_ONES:
            raise ValueError(f"mask value {self.value} does not fit in 64 bits")

    # -- construction -----------------------------------------------------
    @classmethod
    def of(cls, *bits: int) -> BitMask:
        """A mask with exactly `bits` set; raises BitMaskError for a bit outside 0..63."""
        value = 0
        for b in bits:
            _check(b)
            value |= 1 << b
        return cls(value)

    @classmethod
    def from_bits(cls, bits: Iterable[int]) -> BitMask:
        return cls.of(*bits)

    @classmethod
    def empty(cls) -> BitMask:
        return cls(0)

    @classmethod
    def full(cls) -> BitMask:
        """All 64 bits set (the kubelet's `Fill`)."""
        return cls(_ALL_ONES)

    def add(self, *bits: int) -> BitMask:
        """A copy with `bits` added; raises BitMaskError for an invalid bit (the kubelet leaves the mask unchanged)."""
        return BitMask(self.value | BitMask.of(*bits).value)

    def remove(self, *bits: int) -> BitMask:
        """A copy with `bits` cleared; raises BitMaskError (mask unchanged) for an invalid bit."""
        return BitMask(self.value & ~BitMask.of(*bits).value)

    # -- queries ------------------------------------------------------------
    def is_set(self, bit: int) -> bool:
        """True if `bit` is in the mask; any bit outside 0..63 (such as -1) is never set."""
        if not 0 <= bit <= MAX_BIT:
            return False
        return bool(self.value >> bit & 1)

    def any_set(self, bits: Iterable[int]) -> bool:
        return any(self.is_set(b) for b in bits)

    @property
    def is_empty(self) -> bool:
        return self.value == 0

    def count(self) -> int:
        return self.value.bit_count()

    @property
    def bits(self) -> tuple[int, ...]:
        """The set bits, lowest first."""
        return tuple(i for i in range(MAX_BIT + 1) if self.value >> i & 1)

    def is_narrower_than(self, other: BitMask) -> bool:
        """Fewer bits set; on a tie, the numerically smaller mask (lower NUMA IDs) is narrower."""
        if self.count() == other.count():
            return self.is_less_than(other)
        return self.count() < other.count()

    def is_less_than(self, other: BitMask) -> bool:
        return self.value < other.value

    def is_greater_than(self, other: BitMask) -> bool:
        return self.value > other.value

    # -- combination ------------------------------------------------------------
    def and_(self, *others: BitMask) -> BitMask:
        value = self.value
        for o in others:
            value &= o.value
        return BitMask(value)

    def or_(self, *others: BitMask) -> BitMask:
        value = self.value
        for o in others:
            value |= o.value
        return BitMask(value)

    def __and__(self, other: BitMask) -> BitMask:
        return self.and_(other)

    def __or__(self, other: BitMask) -> BitMask:
        return self.or_(other)

    def __iter__(self) -> Iterator[int]:
        return iter(self.bits)

    def __len__(self) -> int:
        return self.count()

    def __str__(self) -> str:
        """Binary digits, padded to an even width, exactly as the kubelet logs a mask."""
        grouping = 2
        for shift in range(64 - grouping, 0, -grouping):
            if self.value > (1 << shift):
                return format(self.value, f"0{shift + grouping}b")
        return format(self.value, f"0{grouping}b")

    def __repr__(self) -> str:
        return f"BitMask({list(self.bits)})"


def and_masks(first: BitMask, *masks: BitMask) -> BitMask:
    """The kubelet's package-level `And(first, masks...)`."""
    return first.and_(*masks)


def or_masks(first: BitMask, *masks: BitMask) -> BitMask:
    return first.or_(*masks)


def iterate_bitmasks(bits: Sequence[int]) -> Iterator[BitMask]:
    """Every non-empty combination of `bits`, in the kubelet's order.

    The order matters: hint generation emits hints in this order and the
    merge visits permutations in that order, so ties resolve the same way.
    The kubelet goes by size (1, 2, ...), and within a size in the
    lexicographic order of positions in `bits` - exactly what
    `itertools.combinations` yields.
    """
    for size in range(1, len(bits) + 1):
        for combo in itertools.combinations(bits, size):
            yield BitMask.of(*combo)
