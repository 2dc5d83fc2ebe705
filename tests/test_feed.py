"""The shared feed (core/feed.py): held readings released once the clock passes them or after
MAX_HOLD_NS, and a sampler's clock interpolated to a reading's time. Known answers, by hand."""

from __future__ import annotations

import pytest

from energyprof.core.feed import MAX_HOLD_NS, Clock, HeldTicks


def test_counters_are_interpolated_between_points_and_flat_after_the_last() -> None:
    c = Clock(counters=2)
    c.add(100, 1_000, 10)
    c.add(300, 3_000, 50)
    assert c.at(100) == (1_000, 10)
    assert c.at(200) == (2_000, 30)  # half way: half of each rise
    assert c.at(250) == (2_500, 40)
    assert c.at(300) == (3_000, 50)
    assert c.at(900) == (3_000, 50)  # nothing read after the last point: held
    assert c.at(50) == (1_000, 10)  # no `before`: flat at the first point


def test_before_the_first_point_a_clock_reads_its_before_value() -> None:
    c = Clock(counters=2, levels=1, before=(0, 0, 0))
    c.add(1_000, 500, 20, 4096)
    assert c.at(999) == (0, 0, 0)
    assert c.at(1_000) == (500, 20, 4096)


def test_levels_are_the_last_read_never_interpolated() -> None:
    c = Clock(counters=1, levels=1)
    c.add(0, 0, 1_000)
    c.add(10, 100, 9_000)
    assert c.at(5) == (50, 1_000)  # RSS as last read at t=0, CPU half way
    assert c.at(10) == (100, 9_000)


def test_forget_before_keeps_the_point_a_later_time_still_needs() -> None:
    c = Clock(counters=1)
    for t, v in ((0, 0), (10, 10), (20, 30), (30, 60)):
        c.add(t, v)
    c.forget_before(25)
    assert [p[0] for p in c.points] == [20, 30]
    assert c.at(25) == (45,)  # interpolated between the two kept points, as before forgetting
    c.forget_before(20)  # idempotent below what is kept
    assert len(c) == 2


def test_a_clock_with_no_reading_has_no_value_and_a_point_must_be_whole() -> None:
    c = Clock(counters=2)
    assert not c and c.last is None and c.last_t is None
    with pytest.raises(LookupError):
        c.at(0)
    with pytest.raises(ValueError):
        c.add(0, 1)


def test_held_readings_go_once_the_bound_passes_them_in_order_and_once() -> None:
    held: HeldTicks[tuple[int, str]] = HeldTicks(lambda r: r[0])
    for t in (10, 20, 30):
        held.add((t, f"r{t}"))
    assert list(held.release(None)) == []  # no bound yet, none held long enough
    assert list(held.release(5)) == []
    assert list(held.release(20)) == [(10, "r10"), (20, "r20")]  # a reading at the bound has its samples in
    assert list(held.release(20)) == []  # each released once
    assert len(held) == 1
    assert list(held.release(None, final=True)) == [(30, "r30")]
    assert not held


def test_a_reading_is_released_after_max_hold_even_when_the_clock_stands_still() -> None:
    held: HeldTicks[int] = HeldTicks(lambda t: t)
    held.add(0)
    held.add(MAX_HOLD_NS - 1)
    assert list(held.release(None)) == []  # one nanosecond short
    held.add(MAX_HOLD_NS)
    # the first has waited MAX_HOLD_NS for a sampler that never read past it; the others have not
    assert list(held.release(None)) == [0]
    assert list(held.release(-1)) == []
    held.add(2 * MAX_HOLD_NS)
    assert list(held.release(None)) == [MAX_HOLD_NS - 1, MAX_HOLD_NS]


def test_without_max_hold_only_the_bound_releases() -> None:
    held: HeldTicks[int] = HeldTicks(lambda t: t, max_hold_ns=None)
    held.add(0)
    held.add(100 * MAX_HOLD_NS)
    assert list(held.release(None)) == []
    assert list(held.release(0)) == [0]


def test_the_local_feed_charges_each_interval_the_cpu_its_sampler_read() -> None:
    """The in-process feed on top of the shared one: a tick waits for the sampler's clock to
    pass it, then carries the program's CPU interpolated to its time."""
    from energyprof.collect.collector import LocalFeed
    from energyprof.core.ledger import Ledger

    class Own:
        def read_ns(self) -> int:
            return 0

    ledger = Ledger([{"id": "cpu", "component": "cpu"}])
    feed = LocalFeed(ledger, Own(), children=False, rss=False)  # type: ignore[arg-type]
    feed.queue.append(("clock", 1_000, 0, 0))
    feed.on_tick(1_500, (0.0,), None)
    assert ledger.last_tick is None  # the sampler has not read past 1500 yet
    feed.queue.append(("clock", 2_000, 1_000, 100))
    feed.on_tick(2_500, (1.0,), None)
    assert ledger.last_tick is not None and ledger.last_tick.t_ns == 1_500
    assert ledger.last_tick.process_cpu_ns == 500  # half way from 0 to 1000
    assert ledger.last_tick.own_cpu_ns == 50
    feed.finish()  # the last, past the sampler's last reading: flat at it
    assert ledger.last_tick.t_ns == 2_500 and ledger.last_tick.process_cpu_ns == 1_000
