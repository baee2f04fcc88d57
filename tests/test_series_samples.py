"""The alert engine's sample reads from the newest end (:class:`Samples`, :func:`between`,
:func:`window`, :func:`last_at_or_before`) give what a whole scan gives: on steps in order,
on a job resumed from an earlier checkpoint (steps falling back), and after the fallen
samples have left the deque."""

from __future__ import annotations

import random
from collections import deque

import pytest

from logitwatch.server.alerts.series import (
    Memory,
    Samples,
    between,
    last_at_or_before,
    window,
)


def scan_window(recent: deque[tuple[int, float]], step: int, lag: int, span: int,
                min_samples: int) -> list[tuple[int, float]]:
    """``window`` as a whole scan: what the engine read on every step before."""
    end = step - lag
    eligible = [p for p in recent if p[0] < end]
    inside = [p for p in eligible if p[0] >= end - span]
    if len(inside) >= min_samples:
        return inside
    return eligible[-min_samples:] if min_samples > 0 else inside


def steps_of(rnd: random.Random, n: int, resumes: int) -> list[int]:
    """``n`` steps of a job sampled at uneven intervals (with repeats), resumed
    ``resumes`` times from an earlier step."""
    out, s = [], 0
    at = set(rnd.sample(range(n // 4, n), resumes))
    for i in range(n):
        if i in at:
            s = max(0, s - rnd.randint(5, 300))  # back to an earlier checkpoint
        s += rnd.choice((0, 1, 1, 1, 2, 7, 40))
        out.append(s)
    return out


@pytest.mark.parametrize("resumes", [0, 1, 3])
@pytest.mark.parametrize("seed", range(4))
def test_reads_from_the_newest_end_agree_with_a_whole_scan(seed: int, resumes: int) -> None:
    rnd = random.Random(seed * 10 + resumes)
    m = Memory(recent=Samples(maxlen=rnd.choice((16, 64, 256))))
    plain: deque[tuple[int, float]] = deque(maxlen=m.recent.maxlen)
    fast_reads = 0
    for step in steps_of(rnd, 1500, resumes):
        for _ in range(3):
            lag, span = rnd.choice((0, 0, 3, 20)), rnd.choice((1, 10, 50, 200, 1000))
            k = rnd.choice((-1, 0, 1, 5, 30))
            probe = step + rnd.choice((0, 1, -3))
            assert window(m, probe, lag, span, k) == scan_window(plain, probe, lag, span, k)
            lo, hi = probe - span, rnd.choice((probe, probe + 1, float("inf")))
            assert between(m.recent, lo, hi) == [p for p in plain if lo <= p[0] < hi]
            before = [p for p in plain if p[0] <= probe - span]
            assert last_at_or_before(m.recent, probe - span) == (before[-1] if before
                                                                 else None)
            fast_reads += m.recent.in_order
        value = rnd.gauss(0.0, 1.0)
        m.push(step, value)
        plain.append((step, value))
        assert list(m.recent) == list(plain)
        ordered = all(a[0] <= b[0] for a, b in zip(plain, list(plain)[1:], strict=False))
        assert m.recent.in_order <= ordered  # never claims an order that is not there
    assert fast_reads > 0  # the fast path was taken (and agreed)


def test_samples_fall_back_on_a_resume_and_read_in_order_again_once_it_has_left() -> None:
    s = Samples(maxlen=4)
    for step in (10, 11, 12):
        s.append((step, 0.0))
    assert s.in_order
    s.append((5, 1.0))  # the job resumed from step 5
    assert not s.in_order
    assert between(s, 0, 11) == [(10, 0.0), (5, 1.0)]  # a whole scan while out of order
    for step in (6, 7):
        s.append((step, 0.0))
    assert list(s) == [(12, 0.0), (5, 1.0), (6, 0.0), (7, 0.0)] and not s.in_order
    for step in (8, 9):  # within maxlen appends of the fall, it has left
        s.append((step, 0.0))
    assert list(s) == [(6, 0.0), (7, 0.0), (8, 0.0), (9, 0.0)]
    assert s.in_order
    assert between(s, 7) == [(7, 0.0), (8, 0.0), (9, 0.0)]


def test_samples_copy_keeps_the_samples_and_their_bound() -> None:
    import copy

    s = Samples([(1, 1.0), (3, 2.0), (2, 0.5)], maxlen=8)
    c = copy.copy(s)
    assert list(c) == list(s) and c.maxlen == 8 and not c.in_order


@pytest.mark.parametrize("change", ["extend", "iadd", "appendleft", "extendleft", "insert",
                                    "rotate", "reverse", "setitem"])
def test_every_way_to_change_samples_keeps_the_reads_right(change: str) -> None:
    """Only ``append`` looked at the order: a deque's other mutators (``extend`` among
    them, which bypasses ``append``) put samples out of order behind its back."""
    s = Samples([(1, 0.0), (5, 0.0), (9, 0.0)], maxlen=8)
    more = [(2, 1.0), (3, 1.0)]  # steps below the newest kept: out of order after it
    if change == "extend":
        s.extend(more)
    elif change == "iadd":
        s += more
    elif change == "appendleft":
        s.appendleft((20, 1.0))
    elif change == "extendleft":
        s.extendleft([(20, 1.0)])
    elif change == "insert":
        s.insert(1, (20, 1.0))
    elif change == "rotate":
        s.rotate(1)
    elif change == "reverse":
        s.reverse()
    else:
        s[0] = (20, 1.0)
    plain = list(s)
    assert between(s, 2, 10) == [p for p in plain if 2 <= p[0] < 10]
    before = [p for p in plain if p[0] <= 4]
    assert last_at_or_before(s, 4) == (before[-1] if before else None)
    m = Memory(recent=s)
    assert window(m, 10, 0, 8, 2) == scan_window(deque(plain), 10, 0, 8, 2)
