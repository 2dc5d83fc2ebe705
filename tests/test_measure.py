"""Windows carry the program's share beside the machine's energy, and hand a live Measurement
to the code that opened them: the same figures the saved profile keeps."""

from __future__ import annotations

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof import Measurement, Profiler
from energyprof.core.tree import attribute
from energyprof.core.recording import Recording, Sample, Tick, WindowEvent
from energyprof.facts.records import read_window
from energyprof.collect.sensors.replay import load_trace

S = 1_000_000_000
CPU = {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}
GPU = {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "replay"}


def recording(tmp_path, tick_s: float, gpu_share: float | None = None) -> Recording:
    """30 W then 60 W on the CPU (and 100 W on a GPU); the program burns 1 core of the 1.25 busy
    on 2 cores, so under 'share' it pays 0.8 of the CPU, and `gpu_share` of the GPU."""
    p = tmp_path / "t.csv"
    p.write_text("t_s,cpu,gpu:0\n0,30,100\n1,60,100\n")
    tr = load_trace(p)
    rec = Recording(sources=[CPU, GPU])
    sid = rec.stacks.intern([("main", "m.py", 1)])
    times = [k * tick_s for k in range(int(2.0 / tick_s) + 1) if k * tick_s < 2.0 - 1e-9] + [2.0]
    share = None if gpu_share is None else {"gpu:0": gpu_share}
    rec.ticks = [Tick(round(t * S), (tr.energy_at("cpu", t), tr.energy_at("gpu:0", t)), round(t * S), 0,
                      round(t * 1.25 * S), gpu_share=share) for t in times]
    rec.samples = [Sample(k * S // 10, (k + 1) * S // 10, sid, S // 10) for k in range(20)]
    return rec


def window(rec: Recording, start_s: float, end_s: float, name: str = "w") -> None:
    rec.windows += [WindowEvent(round(start_s * S), "begin", name), WindowEvent(round(end_s * S), "end", name)]


@pytest.mark.parametrize("tick_s", [0.1, 0.07])
def test_a_windows_program_energy_is_the_hand_computed_share(tmp_path, tick_s):
    rec = recording(tmp_path, tick_s, gpu_share=0.25)
    window(rec, 0.5, 1.5)
    share = attribute(rec, "share", cpus=2).windows[0]
    every = attribute(rec, "all", cpus=2).windows[0]
    # Machine, CPU: 0.5 s x 30 W + 0.5 s x 60 W = 45 J, exactly when edges fall on ticks; the
    # program's share is 0.8 of every interval, so 0.8 x the window's figure whatever the edges.
    if tick_s == 0.1:
        assert share.energy_j["cpu"] == pytest.approx(45.0, rel=1e-9)
        assert share.program_energy_j["cpu"] == pytest.approx(36.0, rel=1e-9)
    assert share.program_energy_j["cpu"] == pytest.approx(0.8 * share.energy_j["cpu"], rel=1e-9)
    assert share.energy_j["gpu:0"] == pytest.approx(100.0, rel=1e-9)
    assert share.program_energy_j["gpu:0"] == pytest.approx(25.0, rel=1e-9)
    # 'all': the program pays the whole machine (no energyprof CPU here).
    assert every.program_energy_j == pytest.approx(every.energy_j, rel=1e-9)
    assert every.energy_j == share.energy_j


def test_nested_windows_each_get_their_own_span(tmp_path):
    rec = recording(tmp_path, 0.1)
    rec.windows = [WindowEvent(0, "begin", "epoch", 0), WindowEvent(S // 2, "begin", "step", 1),
                   WindowEvent(S, "end", "step"), WindowEvent(2 * S, "end", "epoch")]
    epoch, step = attribute(rec, "share", cpus=2).windows
    assert (epoch.depth, step.depth) == (0, 1)
    assert epoch.program_energy_j["cpu"] == pytest.approx(0.8 * 90.0, rel=1e-9)
    assert step.program_energy_j["cpu"] == pytest.approx(0.8 * 15.0, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 2.0)), min_size=1, max_size=6),
       st.sampled_from([0.03, 0.07, 0.1]), st.floats(0.0, 1.0), st.sampled_from(["share", "all"]))
def test_program_energy_never_exceeds_the_machines(tmp_path_factory, spans, tick_s, g, policy):
    rec = recording(tmp_path_factory.mktemp("w"), tick_s, gpu_share=g)
    for a, b in spans:
        window(rec, min(a, b), max(a, b))
    for w in attribute(rec, policy, cpus=2).windows:
        for sid, e in w.energy_j.items():
            p = w.program_energy_j[sid]
            assert 0.0 <= p <= e * (1 + 1e-12) + 1e-12
            # Each interval is split by overlap, so no window holds more than its time at peak power.
            assert e <= w.time_s * (100.0 if sid == "gpu:0" else 60.0) * (1 + 1e-9) + 1e-9


def test_a_profile_written_before_program_energy_still_loads():
    w = read_window({"name": "epoch", "index": 0, "time_s": 1.0, "energy_j": {"cpu": 5.0}})
    assert w.program_energy_j == {} and w.energy_j == {"cpu": 5.0}


def test_measurement_arithmetic():
    m = Measurement(time_s=2.0, energy_j={"cpu": 3.6e6, "dram": 1.8e6}, program_energy_j={"cpu": 1.8e6, "dram": 0.0},
                    intensity_g_per_kwh=100.0, pue=1.5)
    assert (m.total_j, m.program_total_j) == (5.4e6, 1.8e6)
    assert m.carbon_g == pytest.approx(0.5 * 1.5 * 100.0)
    assert Measurement(energy_j=None, program_energy_j=None).carbon_g is None


def busy(seconds: float) -> None:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass


def test_measurements_inside_the_loop_equal_the_saved_profiles_windows(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n1,70\n2,40\n")
    prof = Profiler(power_trace=str(trace), quiet=True, carbon_intensity=200.0).start()
    seen = []
    try:
        for epoch in range(3):
            with prof.window("epoch", epoch) as m:
                busy(0.05)
                with prof.window("step", epoch) as inner:
                    busy(0.03)
                assert inner.complete, inner.note  # read inside the loop, while the profile runs
            assert m.complete, m.note
            seen += [m, inner]
        so_far = prof.measure()
    finally:
        profile = prof.stop()
    assert profile is not None
    by_key = {(w.name, w.index): w for w in profile.windows}
    for m in seen:
        w = by_key[(m.name, m.index)]
        assert m.complete, m.note
        assert m.time_s == w.time_s
        for sid in w.energy_j:
            assert m.energy_j[sid] == pytest.approx(w.energy_j[sid], rel=1e-9, abs=1e-12)
            assert m.program_energy_j[sid] == pytest.approx(w.program_energy_j[sid], rel=1e-9, abs=1e-12)
            assert 0.0 <= m.program_energy_j[sid] <= m.energy_j[sid] * (1 + 1e-12)
        assert m.total_j == pytest.approx(sum(w.energy_j.values()), rel=1e-9)
        assert m.carbon_g == pytest.approx(m.program_total_j / 3.6e6 * 200.0, rel=1e-12)
        assert m.estimated is False
        # The replayed trace is 40-70 W: the window's machine energy is bounded by its time.
        assert 40.0 * m.time_s * (1 - 1e-9) <= m.total_j <= 70.0 * m.time_s * (1 + 1e-9)
    assert so_far.total_j <= sum(profile.totals.energy_j.values()) * (1 + 1e-12)
    assert so_far.program_total_j <= so_far.total_j * (1 + 1e-12)
    assert 40.0 * so_far.time_s * (1 - 1e-9) <= so_far.total_j <= 70.0 * so_far.time_s * (1 + 1e-9)


def test_an_estimated_source_says_so(tmp_path):
    (tmp_path / "no-rapl").mkdir()  # a powercap tree with no zones: nothing to measure, so estimated
    prof = Profiler(quiet=True, powercap_root=str(tmp_path / "no-rapl"), gpus=False).start()
    try:
        with prof.window("w") as m:
            busy(0.02)
    finally:
        prof.stop()
    assert m.estimated is True
    assert m.energy_j is not None and all(math.isfinite(v) for v in m.energy_j.values())


def test_torch_window_yields_the_measurement_of_the_profiler_or_monitor_or_of_time_only(tmp_path):
    import energyprof.torch as ept
    from energyprof import Monitor

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,cpu\n0,40\n")
    with ept.window("alone", 0) as bare:
        busy(0.01)
    assert bare.energy_j is None and bare.complete is False and bare.time_s > 0 and bare.carbon_g is None
    with Monitor(power_trace=str(trace)) as mon, ept.window("mon", 1, profiler=mon) as by_monitor:
        busy(0.01)
    assert by_monitor.energy_j["cpu"] == pytest.approx(40.0 * by_monitor.time_s, rel=1e-6)
    prof = Profiler(power_trace=str(trace), quiet=True).start()
    try:
        with ept.window("epoch", 2) as m:
            busy(0.05)
    finally:
        profile = prof.stop()
    assert profile is not None
    (w,) = profile.windows
    assert m.time_s == w.time_s and m.complete
    assert m.energy_j == pytest.approx(w.energy_j, rel=1e-9) and m.program_energy_j == pytest.approx(w.program_energy_j)


def test_a_supervised_programs_windows_get_the_supervisors_figures_back(tmp_path):
    """Under `python -m energyprof` the supervisor charges the windows and writes each one's
    figures back; inside the loop they equal the saved profile's windows."""
    import json
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n1,70\n")
    (tmp_path / "s.py").write_text(textwrap.dedent("""
        import json, sys, time
        import energyprof.torch as ept
        import energyprof.drive.profiler as p
        seen = []
        for epoch in range(3):
            with ept.window("epoch", epoch) as m:
                t = time.perf_counter()
                while time.perf_counter() - t < 0.03:
                    pass
            seen.append(m.to_dict())  # read inside the loop
        run = p.active_profiler().measure()
        assert run.time_s >= m.time_s and run.energy_j is None and not run.complete
        json.dump(seen, sys.stdout)
    """))
    env = dict(os.environ, PYTHONPATH=str(root))
    r = subprocess.run([sys.executable, "-m", "energyprof", "--power-trace", "t.csv", "--json", "p.json", "--quiet",
                        "--carbon-intensity", "300", "s.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    windows = json.loads((tmp_path / "p.json").read_text())["windows"]
    assert len(seen) == len(windows) == 3
    for m, w in zip(seen, windows):
        assert m["complete"], m.get("note")
        assert m["time_s"] == pytest.approx(w["time_s"], abs=1e-9)
        assert m["energy_j"] == pytest.approx(w["energy_j"], rel=1e-12)
        assert m["program_energy_j"] == pytest.approx(w["program_energy_j"], rel=1e-12)
        assert 0.0 <= m["program_total_j"] <= m["total_j"] * (1 + 1e-12)
        assert m["carbon_g"] == pytest.approx(m["program_total_j"] / 3.6e6 * 300.0, rel=1e-12)
        assert m["estimated"] is False


def test_the_back_channel_reads_whole_lines_only_and_says_when_a_window_never_came(tmp_path, monkeypatch):
    from energyprof.agent import supervised, wire
    from energyprof.core.ledger import Ledger
    from energyprof.supervise.job import window_reply

    monkeypatch.setattr(supervised, "REPLY_WAIT_S", 0.01)
    led = Ledger([CPU, {"id": "ram", "method": "estimated"}])
    w = {"name": "w", "index": None, "start_ns": 10, "end_ns": 20, "energy": [3.0, 1.0], "program": [1.5, 0.5],
         "program_all": [3.0, 1.0], "done": True}
    line = window_reply(led.account(w), "all")  # the supervisor applies the run's policy
    assert window_reply(led.account(w), "share") != line
    path = tmp_path / f"7{wire.REPLY_SUFFIX}"
    path.write_text(line[:-5])  # the supervisor's write is not whole yet
    replies = supervised._Replies({"spool": str(tmp_path), "carbon": "100.0,2.0"}, 7)
    late = Measurement(name="w")
    replies.fill(late, 10, 20)
    assert late.complete is False and late.energy_j is None and "0.01 s" in late.note
    path.write_text(line)
    m = Measurement(name="w")
    replies.fill(m, 10, 20)
    assert m.complete and m.estimated is True
    assert m.energy_j == {"cpu": 3.0, "ram": 1.0} and m.program_energy_j == {"cpu": 3.0, "ram": 1.0}  # idle=all
    assert m.carbon_g == pytest.approx(4.0 / 3.6e6 * 2.0 * 100.0)


def test_two_threads_reading_window_replies_at_once_skip_none(tmp_path, monkeypatch):
    """Defect: two threads ending windows read the reply file from one offset, each moved the
    offset past what it read, and the next reply was skipped (the window said it never came)."""
    import os
    import threading

    from energyprof.agent import supervised, wire

    path = tmp_path / f"7{wire.REPLY_SUFFIX}"
    path.write_text(wire.reply(10, 20, False, ["cpu"], [1.0], [0.5]) +
                    wire.reply(30, 40, False, ["cpu"], [2.0], [1.0]))
    replies = supervised._Replies({"spool": str(tmp_path)}, 7)
    both_read = threading.Barrier(2)
    real_pread = os.pread

    def pread_together(fd, n, offset):  # both threads hold the same bytes before either moves on
        data = real_pread(fd, n, offset)
        try:
            both_read.wait(timeout=2.0)  # a hang guard: with the reads in turn, the first waits alone
        except threading.BrokenBarrierError:
            pass
        return data

    monkeypatch.setattr(os, "pread", pread_together)
    got = [Measurement(name="a"), Measurement(name="b")]
    threads = [threading.Thread(target=replies.fill, args=(got[0], 10, 20)),
               threading.Thread(target=replies.fill, args=(got[1], 30, 40))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    monkeypatch.setattr(os, "pread", real_pread)
    assert [m.energy_j for m in got] == [{"cpu": 1.0}, {"cpu": 2.0}]
    with path.open("a") as fh:  # a third window, written after both were read
        fh.write(wire.reply(50, 60, False, ["cpu"], [3.0], [1.5]))
    third = Measurement(name="c")
    replies.fill(third, 50, 60)
    assert third.complete and third.energy_j == {"cpu": 3.0} and third.program_energy_j == {"cpu": 1.5}
    assert replies.offset == path.stat().st_size
