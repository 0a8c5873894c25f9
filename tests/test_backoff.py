"""The one backoff (plugin/backoff.py): jittered so nodes that failed together do not retry together, capped.

What a user would notice: a recovering API server (or kubelet, or containerd)
hit by every node's daemon in the same instant again and again. The tests draw
from seeded sources, so they are deterministic; the thresholds are far from
what the seeds give (the margins are in the comments), so a change of seeds
would not flip them either.
"""

from __future__ import annotations

import random
from bisect import bisect_left

import pytest

from plugin.backoff import Backoff


class _Ceiling:
    """A random source that always draws the top of the range: the delays are the ceilings."""

    def uniform(self, a: float, b: float) -> float:
        return b


def _retry_times(backoff: Backoff, retries: int) -> list[float]:
    """When each retry happens, in seconds after the failure, when every retry fails again at once."""
    t, out = 0.0, []
    for _ in range(retries):
        t += backoff.next()
        out.append(t)
    return out


def test_two_instances_started_together_do_not_retry_in_lockstep():
    # 200 pairs of daemons that saw the same failure at the same moment, 8 failed retries each.
    close = 0
    for pair in range(200):
        a = _retry_times(Backoff(0.5, 30.0, rng=random.Random(2 * pair)), 8)
        b = _retry_times(Backoff(0.5, 30.0, rng=random.Random(2 * pair + 1)), 8)
        together = sum(abs(x - y) < 0.05 for x, y in zip(a, b))
        assert together < 8, f"pair {pair} retried in lockstep: {a} vs {b}"
        close += together
    # Without jitter every one of the 1,600 retries coincides; with it about 4.5 % fall within 50 ms.
    assert close / 1600 < 0.2, f"{close} of 1600 retries within 50 ms of the partner's"


def test_a_fleet_that_failed_together_spreads_its_retries():
    # 1,000 nodes, 6 failed retries each: the most retries any 10 ms window sees.
    times = sorted(t for node in range(1000) for t in _retry_times(Backoff(0.5, 30.0, rng=random.Random(node)), 6))
    peak = max(i - bisect_left(times, t - 0.01) + 1 for i, t in enumerate(times))
    # Without jitter: all 1,000 in the same instant at each retry. With it: about 40 (41-51 over ten seed ranges).
    assert peak <= 100, f"{peak} of 1000 nodes retried within the same 10 ms"


def test_instances_without_a_given_source_draw_different_delays():
    a, b = Backoff(1.0, 30.0), Backoff(1.0, 30.0)
    assert _retry_times(a, 8) != _retry_times(b, 8)


def test_the_ceiling_doubles_up_to_the_cap_and_reset_starts_over():
    b = Backoff(0.5, 30.0, rng=_Ceiling())
    assert [b.next() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    b.reset()
    assert b.ceiling == 0.5 and b.next() == 0.5


def test_no_delay_exceeds_the_cap_or_the_ceiling():
    for seed in range(100):
        b = Backoff(0.5, 30.0, rng=random.Random(seed))
        for _ in range(50):
            ceiling = b.ceiling
            d = b.next()
            assert 0.0 <= d <= ceiling <= 30.0
    # The delays do use the whole window (the cap is reached, not just respected).
    b = Backoff(0.5, 30.0, rng=random.Random(7))
    assert max(b.next() for _ in range(200)) > 27.0


def test_an_initial_above_the_cap_is_clamped():
    b = Backoff(2.0, 0.05, rng=_Ceiling())
    assert [b.next() for _ in range(3)] == [0.05, 0.05, 0.05]


@pytest.mark.parametrize(("initial", "cap"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0), (float("nan"), 1.0)])
def test_nonsense_bounds_are_refused(initial: float, cap: float):
    with pytest.raises(ValueError, match="initial > 0 and cap > 0"):
        Backoff(initial, cap)
