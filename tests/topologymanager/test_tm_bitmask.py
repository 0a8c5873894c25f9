"""Bitmask cases ported from the kubelet's bitmask_test.go (our tables, their cases)."""

from __future__ import annotations

import pytest

from allocator.topologymanager.bitmask import BitMask, BitMaskError, and_masks, iterate_bitmasks, or_masks


def M(*bits: int) -> BitMask:
    return BitMask.of(*bits)


@pytest.mark.parametrize(
    "bits, text",
    [
        ((), "00"),
        ((0,), "01"),
        ((1,), "10"),
        ((0, 1), "11"),
        ((2,), "100"),
        ((0, 2), "0101"),
        ((3,), "1000"),
    ],
)
def test_new_and_string(bits, text):
    assert str(M(*bits)) == text


def test_fill_sets_all_64_bits():
    for start in ((), (0,), (0, 1)):
        assert str(M(*start).or_(BitMask.full())) == "1" * 64
    assert BitMask.full().count() == 64


@pytest.mark.parametrize(
    "bits, text",
    [((0,), "01"), ((1,), "10"), ((0, 1), "11")],
)
def test_add(bits, text):
    assert str(BitMask.empty().add(*bits)) == text


def test_add_or_new_outside_range_raises_kubelet_error():
    with pytest.raises(BitMaskError, match="^bit number must be in range 0-63$"):
        BitMask.empty().add(-1, 64)
    with pytest.raises(BitMaskError):
        M(64)


@pytest.mark.parametrize(
    "start, remove, text",
    [((0,), (0,), "00"), ((0, 1), (1,), "01"), ((0, 1), (0, 1), "00")],
)
def test_remove(start, remove, text):
    assert str(M(*start).remove(*remove)) == text


def test_remove_outside_range_raises_and_leaves_mask():
    m = M(0)
    with pytest.raises(BitMaskError):
        m.remove(-1, 64)
    assert str(m) == "01"


@pytest.mark.parametrize(
    "masks, text",
    [
        ([(0, 1), (0, 1)], "11"),
        ([(0, 1), (1,)], "10"),
        ([(0,), (0, 1)], "01"),
        ([(0, 1), (0, 1), (1,)], "10"),
        ([(0,), (0,), (1,), (0, 1)], "00"),
        ([(0, 1, 2, 3), (1, 2, 3), (2, 3), (3,)], "1000"),
    ],
)
def test_and(masks, text):
    ms = [M(*b) for b in masks]
    assert str(and_masks(ms[0], *ms)) == text


@pytest.mark.parametrize(
    "masks, text",
    [
        ([(0,), ()], "01"),
        ([(1,), (1,)], "10"),
        ([(0,), (1,)], "11"),
        ([(0, 1), (0, 1)], "11"),
        ([(0,), (1,), (0, 1)], "11"),
        ([(3,), (2,), (1,), (0,)], "1111"),
    ],
)
def test_or(masks, text):
    ms = [M(*b) for b in masks]
    assert str(or_masks(ms[0], *ms)) == text


@pytest.mark.parametrize("bits, empty", [((), True), ((0,), False), ((0, 1), False)])
def test_is_empty(bits, empty):
    assert M(*bits).is_empty is empty


@pytest.mark.parametrize(
    "bits, check, expected",
    [((), 0, False), ((0,), 0, True), ((0, 1), 1, True), ((0, 1), 64, False), ((0, 1), -1, False)],
)
def test_is_set(bits, check, expected):
    assert M(*bits).is_set(check) is expected


@pytest.mark.parametrize(
    "bits, check, expected",
    [
        ((), (0, 1), False),
        ((0,), (0, 1), True),
        ((0, 1), (0, 1), True),
        ((0, 1), (64, 65), False),
        ((1, 2), (0, 3), False),
    ],
)
def test_any_set(bits, check, expected):
    assert M(*bits).any_set(check) is expected


@pytest.mark.parametrize(
    "a, b, equal",
    [((), (), True), ((), (0,), False), ((0,), (0,), True), ((0,), (1,), False), ((0, 1), (0, 1), True)],
)
def test_is_equal(a, b, equal):
    assert (M(*a) == M(*b)) is equal


@pytest.mark.parametrize("bits, count", [((), 0), ((0,), 1), ((0, 1), 2)])
def test_count(bits, count):
    assert M(*bits).count() == count


@pytest.mark.parametrize("bits", [(), (0,), (0, 1)])
def test_get_bits(bits):
    assert M(*bits).bits == bits


@pytest.mark.parametrize(
    "a, b, narrower",
    [
        ((0,), (0, 1), True),
        ((0, 1), (0,), False),
        ((0,), (1,), True),
        ((1,), (0,), False),
    ],
)
def test_is_narrower_than(a, b, narrower):
    assert M(*a).is_narrower_than(M(*b)) is narrower


@pytest.mark.parametrize(
    "a, b, less, greater",
    [((0,), (1,), True, False), ((1,), (0,), False, True), ((0, 1), (0, 1), False, False), ((2,), (0, 1), False, True)],
)
def test_is_less_and_greater_than(a, b, less, greater):
    assert M(*a).is_less_than(M(*b)) is less
    assert M(*a).is_greater_than(M(*b)) is greater


@pytest.mark.parametrize("numbits", [1, 2, 4, 8, 16])
def test_iterate_bitmasks_counts(numbits):
    assert sum(1 for _ in iterate_bitmasks(list(range(numbits)))) == (1 << numbits) - 1


def test_iterate_bitmasks_order_is_by_size_then_position():
    got = [m.bits for m in iterate_bitmasks([0, 1, 2])]
    assert got == [(0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]
    # Non-contiguous node IDs keep their given order.
    assert [m.bits for m in iterate_bitmasks([0, 2])] == [(0,), (2,), (0, 2)]
