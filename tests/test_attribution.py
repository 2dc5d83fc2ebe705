"""The pure core: known answers on a replayed trace and synthetic samples, and invariants."""

from __future__ import annotations

from energyprof.core import ledger_state
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof.core.ledger import Ledger
from energyprof.core.tree import attribute, build_profile
from energyprof.facts.profile import IDLE_NODE
from energyprof.facts.profile import SELF_NODE
from energyprof.facts.profile import Profile
from energyprof.core.recording import Recording, Sample, Tick
from energyprof.collect.sensors.replay import PowerTrace, load_trace

S = 1_000_000_000


def trace(tmp_path, text: str) -> PowerTrace:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return load_trace(p)


def ticks_from(tr: PowerTrace, columns: list[str], times_s: list[float], busy_per_s: float, proc_per_s: float,
               own_per_s: float = 0.0) -> list[Tick]:
    return [Tick(int(round(t * S)), tuple(tr.energy_at(c, t) for c in columns), int(round(t * (proc_per_s + own_per_s) * S)),
                 int(round(t * own_per_s * S)), int(round(t * busy_per_s * S))) for t in times_s]


def node(profile: Profile, *path: str):
    cur = profile.root
    for name in path:
        matches = [c for c in cur.children if c.function == name]
        assert matches, f"{name} not under {cur.function}: {[c.function for c in cur.children]}"
        cur = matches[0]
    return cur


def check_invariants(profile: Profile) -> None:
    ids = [s["id"] for s in profile.sources]
    for sid in ids:
        total = profile.totals["energy_j"][sid]
        selfsum = math.fsum(n.self_energy_j.get(sid, 0.0) for n, _ in profile.nodes())
        assert math.isclose(selfsum, total, rel_tol=1e-9, abs_tol=1e-9), (sid, selfsum, total)
    for n, _ in profile.nodes():
        for sid in ids:
            e, se = n.energy_j.get(sid, 0.0), n.self_energy_j.get(sid, 0.0)
            assert math.isfinite(e) and e >= 0 and se >= 0
            kids = math.fsum(c.energy_j.get(sid, 0.0) for c in n.children)
            assert math.isclose(e, se + kids, rel_tol=1e-9, abs_tol=1e-9)


def two_function_recording(tmp_path, tick_s: float = 0.07) -> Recording:
    """30 W for 1 s then 60 W for 1 s; 'heavy' runs 0-1.5 s, 'light' 1.5-2 s, each at 1 CPU."""
    tr = trace(tmp_path, "t_s,cpu\n0,30\n1,60\n")
    rec = Recording(sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
    heavy = rec.stacks.intern([("main", "m.py", 1), ("heavy", "m.py", 5)])
    light = rec.stacks.intern([("main", "m.py", 1), ("light", "m.py", 9)])
    # Ticks every 70 ms (not aligned with the trace's 1 s step), machine 2 cores busy at 1.25 cores.
    times = [k * tick_s for k in range(int(2.0 / tick_s) + 1) if k * tick_s < 2.0 - 1e-9] + [2.0]
    rec.ticks = ticks_from(tr, ["cpu"], times, busy_per_s=1.25, proc_per_s=1.0)
    for k in range(20):
        sid = heavy if k < 15 else light
        rec.samples.append(Sample(k * S // 10, (k + 1) * S // 10, sid, S // 10))
    return rec


def test_known_answer_idle_all(tmp_path):
    p = attribute(two_function_recording(tmp_path), "all", cpus=2)
    # heavy: 1 s x 30 W + 0.5 s x 60 W; light: 0.5 s x 60 W
    assert node(p, "main", "heavy").energy_j["cpu"] == pytest.approx(60.0, rel=1e-9)
    assert node(p, "main", "light").energy_j["cpu"] == pytest.approx(30.0, rel=1e-9)
    assert p.totals["energy_j"]["cpu"] == pytest.approx(90.0, rel=1e-12)
    check_invariants(p)


def test_known_answer_idle_share(tmp_path):
    p = attribute(two_function_recording(tmp_path), "share", cpus=2)
    # The program used 1.0 of the 1.25 busy cores: phi = 0.8 everywhere.
    assert node(p, "main", "heavy").energy_j["cpu"] == pytest.approx(0.8 * 60.0, rel=1e-9)
    assert node(p, "main", "light").energy_j["cpu"] == pytest.approx(0.8 * 30.0, rel=1e-9)
    assert node(p, IDLE_NODE).energy_j["cpu"] == pytest.approx(0.2 * 90.0, rel=1e-9)
    check_invariants(p)


def test_cpu_weights_split_an_interval_and_gpu_goes_by_wall_time(tmp_path):
    """In one interval a thread burning 3x the CPU of another gets 3x the CPU energy, while
    the GPU's energy follows main-thread wall time."""
    tr = trace(tmp_path, "t_s,cpu,gpu:0\n0,40,100\n")
    src = [{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"},
           {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "replay"}]
    rec = Recording(sources=src)
    a = rec.stacks.intern([("work_a", "a.py", 1)])
    b = rec.stacks.intern([("[threads: T]", "", 0), ("work_b", "b.py", 1)])
    rec.ticks = ticks_from(tr, ["cpu", "gpu:0"], [0.0, 1.0], busy_per_s=1.0, proc_per_s=1.0)
    rec.samples = [Sample(0, S, a, 3 * S // 4, True), Sample(0, S, b, S // 4, False)]
    p = attribute(rec, "all", cpus=1)
    assert node(p, "work_a").energy_j["cpu"] == pytest.approx(30.0)
    assert node(p, "[threads: T]", "work_b").energy_j["cpu"] == pytest.approx(10.0)
    assert node(p, "work_a").energy_j["gpu:0"] == pytest.approx(100.0)
    assert node(p, "[threads: T]").energy_j["gpu:0"] == pytest.approx(0.0)
    check_invariants(p)


def test_sleeping_program_is_charged_nothing_under_share_and_energyprof_its_capacity(tmp_path):
    tr = trace(tmp_path, "t_s,cpu\n0,20\n")
    rec = Recording(sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
    sleep = rec.stacks.intern([("sleepy", "s.py", 1)])
    # 4 cores; energyprof's threads use 0.04 of a core, the program nothing, nobody else anything.
    rec.ticks = ticks_from(tr, ["cpu"], [k * 0.01 for k in range(101)], busy_per_s=0.04, proc_per_s=0.0,
                           own_per_s=0.04)
    rec.samples = [Sample(k * S // 200, (k + 1) * S // 200, sleep, 0) for k in range(200)]
    share = attribute(rec, "share", cpus=4)
    assert node(share, "sleepy").energy_j["cpu"] == pytest.approx(0.0, abs=1e-9)
    assert node(share, SELF_NODE).energy_j["cpu"] == pytest.approx(20.0 * 0.01, rel=1e-6)  # 1% of capacity
    assert node(share, IDLE_NODE).energy_j["cpu"] == pytest.approx(20.0 * 0.99, rel=1e-6)
    every = attribute(rec, "all", cpus=4)
    assert node(every, "sleepy").energy_j["cpu"] == pytest.approx(20.0 * 0.99, rel=1e-6)
    check_invariants(share)
    check_invariants(every)


def test_windows_get_the_energy_of_their_span(tmp_path):
    """Exact when window edges fall on sensor ticks; otherwise the edge intervals are split
    linearly (an error of at most one sensor interval's energy per edge)."""
    from energyprof.core.recording import WindowEvent

    rec = two_function_recording(tmp_path, tick_s=0.1)
    rec.windows = [WindowEvent(0, "begin", "epoch", 0), WindowEvent(S, "end", "epoch"),
                   WindowEvent(S, "begin", "epoch", 1), WindowEvent(2 * S, "end", "epoch")]
    p = attribute(rec, "all", cpus=2)
    assert [w["energy_j"]["cpu"] for w in p.windows] == [pytest.approx(30.0), pytest.approx(60.0)]
    assert sum(w["time_s"] for w in p.windows) == pytest.approx(p.totals["duration_s"])
    skew = two_function_recording(tmp_path, tick_s=0.07)
    skew.windows = rec.windows
    first = attribute(skew, "all", cpus=2).windows[0]["energy_j"]["cpu"]
    assert abs(first - 30.0) <= 0.07 * 60.0  # within one interval at the highest power


def test_checkpoint_state_round_trip_gives_the_same_profile(tmp_path):
    import json

    rec = two_function_recording(tmp_path)
    full = attribute(rec, "share", cpus=2)
    led = Ledger(rec.sources, rec.stacks, cpus=2)
    half = len(rec.ticks) // 2
    for t in rec.ticks[:half]:
        led.add_tick(t)
    for s in rec.samples:
        if s.t1_ns <= rec.ticks[half - 1].t_ns:
            led.add_sample(s)
    resumed = ledger_state.restore(json.loads(json.dumps(ledger_state.save(led))))
    for s in rec.samples:
        if s.t1_ns > rec.ticks[half - 1].t_ns:
            resumed.add_sample(s)
    for t in rec.ticks[half:]:
        resumed.add_tick(t)
    resumed.finish()
    p = build_profile(resumed, "share", {})
    assert node(p, "main", "heavy").energy_j["cpu"] == pytest.approx(node(full, "main", "heavy").energy_j["cpu"])
    assert node(p, "main", "light").energy_j["cpu"] == pytest.approx(node(full, "main", "light").energy_j["cpu"])


def test_counter_going_backwards_is_not_negative_energy(tmp_path):
    rec = Recording(sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl"}])
    a = rec.stacks.intern([("f", "f.py", 1)])
    energies = [0.0, 10.0, 5.0, 15.0]  # a reset between the 2nd and 3rd reading
    rec.ticks = [Tick(k * S, (e,), k * S, 0, k * S) for k, e in enumerate(energies)]
    rec.samples = [Sample(k * S, (k + 1) * S, a, S) for k in range(3)]
    p = attribute(rec, "all", cpus=1)
    assert p.totals["energy_j"]["cpu"] == pytest.approx(20.0)
    assert any(n["kind"] == "sensor-anomaly" for n in p.notes)
    check_invariants(p)


def test_timeline_stays_bounded():
    led = Ledger([{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}], timeline_points=100)
    for k in range(5000):
        led.add_tick(Tick(k * 10_000_000, (k * 0.5,), k, 0, k))
    led.finish()
    tl = build_profile(led, "all", {}).timeline
    assert 50 <= len(tl["t_s"]) <= 100
    # Power is preserved through the merging: 0.5 J per 10 ms = 50 W.
    assert all(w == pytest.approx(50.0) for w in tl["power_w"]["cpu"])


# -- property tests ----------------------------------------------------------------------
@st.composite
def recordings(draw):
    n_src = draw(st.integers(1, 3))
    comps = ["cpu", "dram", "gpu:0"][:n_src]
    rec = Recording(sources=[{"id": c, "component": c, "method": "measured", "sensor": "replay"} for c in comps])
    stacks = [rec.stacks.intern([("root", "r.py", 1)] + [(f"f{i}", "r.py", i + 2) for i in range(d)])
              for d in range(draw(st.integers(1, 5)))]
    n_ticks = draw(st.integers(0, 25))
    t = 0
    energy = [0.0] * n_src
    proc = own = busy = 0
    floats = st.one_of(st.floats(-5, 50), st.sampled_from([math.nan, math.inf]))
    for _ in range(n_ticks):
        t += draw(st.integers(0, 50_000_000))
        for i in range(n_src):
            energy[i] += draw(floats)  # sometimes backwards, NaN or inf: sensor garbage
        proc += draw(st.integers(0, 20_000_000))
        own += draw(st.integers(0, 2_000_000))
        busy += draw(st.integers(0, 40_000_000))
        gshare = draw(st.one_of(st.none(), st.just({"gpu:0": draw(st.floats(-1, 2))})))
        rec.ticks.append(Tick(t, tuple(energy), proc + own, own, busy, draw(st.integers(0, 10**9)),
                              draw(st.integers(0, 10**8)), gshare))
    for _ in range(draw(st.integers(0, 60))):
        a = draw(st.integers(0, max(t, 1)))
        b = a + draw(st.integers(0, 80_000_000))
        rec.samples.append(Sample(a, b, draw(st.sampled_from(stacks)), draw(st.integers(0, 10_000_000)),
                                  draw(st.booleans())))
    return rec


@settings(max_examples=150, deadline=None)
@given(recordings(), st.sampled_from(["share", "all"]), st.integers(1, 8))
def test_invariants_hold_for_any_input(rec, policy, cpus):
    p = attribute(rec, policy, cpus=cpus)
    check_invariants(p)
    # the other policy's figures, kept beside them, obey the same invariants and equal a run with it
    other = "all" if policy == "share" else "share"
    seen = p.with_policy(other)
    check_invariants(seen)
    direct = attribute(rec, other, cpus=cpus)
    for a, b in zip(seen.nodes(), direct.nodes()):
        assert a[0].function == b[0].function
        for sid, j in b[0].energy_j.items():
            assert math.isclose(a[0].energy_j.get(sid, 0.0), j, rel_tol=1e-9, abs_tol=1e-9)
    for v in p.totals["energy_j"].values():
        assert math.isfinite(v) and v >= 0
    for n, _ in p.nodes():
        if n.function in (IDLE_NODE, SELF_NODE):
            continue
        if n.samples == 0 and n is not p.root and not n.function.startswith("["):
            assert n.total_energy == 0.0  # a function that never ran has none


def test_the_exact_peak_is_never_below_a_sampled_one():
    """Defect: the kernel's mark (VmHWM), read from per-thread counters that lag, was saved 80-150
    KB below the sampled peak in about a third of runs; an exact peak under a seen one is no peak."""
    led = Ledger([{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
    rss = [40 << 20, 48 << 20, 52 << 20, 44 << 20]
    for k, r in enumerate(rss):
        led.add_tick(Tick(k * 10_000_000, (k * 0.5,), k, 0, k, rss_bytes=r))
    led.finish()
    lagging = build_profile(led, "share", {}, peak_rss_exact_bytes=(52 << 20) - 120_000).totals
    assert lagging.peak_rss_bytes == 52 << 20 and lagging.peak_rss_exact_bytes == 52 << 20
    higher = build_profile(led, "share", {}, peak_rss_exact_bytes=60 << 20).totals  # a peak between readings
    assert higher.peak_rss_exact_bytes == 60 << 20
    assert build_profile(led, "share", {}).totals.peak_rss_exact_bytes is None  # no mark read: none claimed
