"""Power drawn from a counter that moves more slowly than it is read: NVML's energy counter moves every
~100 ms, the ticks come every 20 ms, so four reads in five see no change and the fifth holds the whole
update period's energy. The timeline spreads each jump over the counter's own period, so no cell draws
more than the real mean power over the step, the peak is a power the device drew, and the cells still
sum to the counter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.analysis.report import build
from energyprof.core.ledger import Ledger
from energyprof.core.recording import Sample, Tick
from energyprof.core.timeline import Timeline
from energyprof.core.tree import build_profile
from energyprof.render.charts import timeline_figure

MS = 1_000_000
READ_MS = 20
UPDATE_MS = 100
OFFSET_MS = 7  # the reads fall between the counter's updates, as they do
# the real mean power over each 100-ms update period (a 700 W card: up to 650 W, idle near 80 W)
STEPS_W = [80.0, 650.0, 300.0, 650.0, 120.0, 500.0, 80.0, 640.0, 200.0, 410.0] * 3


def gpu_source(period_s: float | None) -> dict:
    src = {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "nvml", "tier": "counter"}
    if period_s is not None:
        src["update_period_s"] = period_s
    return src


def counter_at(t_ns: int) -> float:
    """The counter's value at t: it moves only at each update, by the whole period's energy."""
    k = t_ns // (UPDATE_MS * MS)  # updates done by t
    return sum(w * UPDATE_MS / 1000 for w in STEPS_W[:k])


def replayed_profile(period_s: float | None):
    led = Ledger([gpu_source(period_s)], cpus=2)
    sid = led.stacks.intern([("train", "/home/u/train.py", 1)])
    end = len(STEPS_W) * UPDATE_MS * MS
    t = OFFSET_MS * MS
    while t <= end + READ_MS * MS:
        led.add_tick(Tick(t, (counter_at(t),), t // 2, 0, t // 2))
        if t > OFFSET_MS * MS:
            led.add_sample(Sample(t - READ_MS * MS, t, sid, READ_MS * MS // 2))
        t += READ_MS * MS
    led.finish()
    return build_profile(led, "share", {"target": "/home/u/train.py"})


@pytest.mark.parametrize("period_s", [0.1, None], ids=["declared", "detected"])
def test_a_counter_stepping_every_100ms_draws_no_power_above_its_real_mean(period_s: float | None) -> None:
    model = build(replayed_profile(period_s))
    tl = model.profile.timeline
    power = tl.power_w["gpu:0"]
    top = max(STEPS_W)
    assert max(power) <= top * (1 + 1e-9), max(power)  # before: the jump in one 20-ms read, ~5x the step's mean
    assert model.peak_power_w is not None and model.peak_power_w <= top * (1 + 1e-9)
    # each update period's energy lies between the two reads that saw the counter move (the profile's time
    # starts at the first read, 7 ms after an update): its real mean, exactly
    for k, watts in enumerate(STEPS_W[1:-1], start=1):
        lo, hi = k * UPDATE_MS / 1000 - 1e-9, (k + 1) * UPDATE_MS / 1000 + 1e-9
        inside = [p for p, a, b in zip(power, tl.start_s, tl.end_s) if a >= lo and b <= hi]
        assert inside and all(p == pytest.approx(watts) for p in inside), (k, inside)
    # the program's line (the only process on the card: all of it) is spread the same way
    program = tl.program_w["share"]
    assert max(program) <= top * (1 + 1e-9)
    figure = timeline_figure(model)
    assert figure is not None
    drawn = [y for trace in figure["data"] if trace["name"] in ("gpu:0 (W)", "the program (W)") for y in trace["y"]]
    assert drawn and max(drawn) <= top * (1 + 1e-6)
    # conservation: the spread energy sums to the counter's
    energy = sum(p * (b - a) for p, a, b in zip(power, tl.start_s, tl.end_s))
    assert energy == pytest.approx(model.totals.energy_j["gpu:0"], rel=1e-9)
    assert model.totals.energy_j["gpu:0"] == pytest.approx(sum(STEPS_W) * UPDATE_MS / 1000)


def test_a_counter_that_moves_every_read_is_drawn_as_read() -> None:
    """RAPL moves every millisecond: each tick's energy stays in its own tick."""
    tl = Timeline(1, periods_s=[0.001], counters=[True])
    ticks = [i * 10 * MS for i in range(101)]
    for i, (a, b) in enumerate(zip(ticks, ticks[1:])):
        tl.add(a, b, [(10.0 if i % 2 else 30.0) * (b - a) / 1e9], 0)
    out = tl.export(0, ["cpu"])
    assert sorted(set(round(p, 9) for p in out["power_w"]["cpu"])) == [10.0, 30.0]


def test_a_source_that_drew_nothing_for_a_while_is_not_smeared_over_the_silence() -> None:
    """A replayed trace (power samples, not a counter) at 0 W for a second, then 50 W: the first reading
    after the silence stays in its own tick."""
    tl = Timeline(1, counters=[False])
    ticks = [i * 10 * MS for i in range(201)]
    for a, b in zip(ticks, ticks[1:]):
        tl.add(a, b, [(50.0 if a >= 1000 * MS else 0.0) * (b - a) / 1e9], 0)
    out = tl.export(0, ["cpu"])
    assert all(p == 0.0 for p, e in zip(out["power_w"]["cpu"], out["end_s"]) if e <= 1.0)
    assert all(p == pytest.approx(50.0) for p, s in zip(out["power_w"]["cpu"], out["start_s"]) if s >= 1.0)


@given(st.lists(st.tuples(st.integers(min_value=1, max_value=40_000_000), st.integers(min_value=0, max_value=4)),
                min_size=1, max_size=400),
       st.sampled_from([None, 0.1]), st.booleans())
@settings(max_examples=80, deadline=None)
def test_spreading_conserves_the_counters_energy(reads: list[tuple[int, int]], period: float | None,
                                                 counter: bool) -> None:
    """Whatever the reads and moves, the cells hold exactly the counter's energy, machine and program."""
    tl = Timeline(1, max_points=100, periods_s=[period], counters=[counter])
    t, total = 0, 0.0
    for gap, moved in reads:
        e = float(moved) * 0.37
        tl.add(t, t + gap, [e], 0)
        tl.note_program(t, t + gap, [e / 2], [e])
        t += gap
        total += e
    assert sum(c[0] for c in tl.energy) == pytest.approx(total, abs=1e-9)
    assert sum(p[0] for p in tl.program) == pytest.approx(total / 2, abs=1e-9)
    assert sum(p[1] for p in tl.program) == pytest.approx(total, abs=1e-9)
    assert len(tl.t0) <= 100


def test_the_program_line_takes_per_source_figures_only() -> None:
    """The ledger hands the program's energy per source; a single figure for all sources has no span
    of its own to be spread over, so it is refused, not spread some other way."""
    tl = Timeline(2, max_points=100)
    tl.add(0, 10_000_000, [1.0, 2.0], 0)
    with pytest.raises(TypeError):
        tl.note_program(0, 10_000_000, 1.5, 3.0)  # type: ignore[arg-type]
    tl.note_program(0, 10_000_000, [0.5, 1.0], [1.0, 2.0])
    assert sum(p[0] for p in tl.program) == pytest.approx(1.5)
    assert sum(p[1] for p in tl.program) == pytest.approx(3.0)
