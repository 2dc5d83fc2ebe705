"""The online power-limit optimizer against a simulated GPU whose time and power follow a real A40 sweep."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
from hypothesis import example, given, settings, strategies as st

from energyprof.analysis.optimize import Cost, Energy, MaxSlowdown, Time
from energyprof.collect.sensors.gpu import nvml_device
from energyprof.knobs.base import KnobError
from energyprof.knobs.nvml import NvmlPowerLimit
from energyprof.optimize import PowerLimitOptimizer
import knob_trees
import sim_gpu
from sim_gpu import TIME_SCALE, FakeNvml, SimGpu, load_table, run
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TABLE = load_table()
TESTS = os.path.dirname(__file__)


def optimizer(gpu: SimGpu, objective, **kw) -> PowerLimitOptimizer:
    return PowerLimitOptimizer(objective=objective, gpus=[0], binding=FakeNvml([gpu]), clock=lambda: gpu.clock_s,
                               sync=lambda: None, **kw)


def steps_needed(table, warmup=10, profile=40) -> int:
    return len(table) * (warmup + profile)


# Independent of analysis/optimize.py: the argmin written out from the definitions.
def brute(table, objective, world_size=1):
    max_w = max(table)
    if isinstance(objective, Energy):
        return min(table, key=lambda lim: table[lim][0])
    if isinstance(objective, Time):
        return min(table, key=lambda lim: table[lim][1])
    if isinstance(objective, MaxSlowdown):
        return min(lim for lim in table if table[lim][1] <= objective.factor * table[max_w][1])
    return min(table, key=lambda lim: objective.eta * table[lim][0] + (1 - objective.eta) * max_w * table[lim][1] * world_size)


def test_the_a40_table_gives_the_known_answers_analytically():
    assert brute(TABLE, Energy()) == 175
    assert brute(TABLE, Time()) == 300
    assert brute(TABLE, MaxSlowdown(1.1)) == 200
    assert brute(TABLE, Cost(0.5)) == 200


@pytest.mark.parametrize("objective,expected", [(Energy(), 175), (Time(), 300), (MaxSlowdown(1.1), 200), (Cost(0.5), 200)])
def test_optimizer_picks_the_a40_answer(objective, expected):
    gpu = SimGpu(TABLE)
    plo = optimizer(gpu, objective)
    assert plo.candidates == [300, 275, 250, 225, 200, 175, 150, 125, 100]
    assert plo.state == "warmup"
    run(plo, gpu, steps_needed(TABLE) + 5)
    assert plo.state == "optimal"
    assert plo.optimal_limit_w == expected
    assert gpu.limit_w == expected
    # each window is the table's 40-step window, scaled in time
    for lim, (e, t) in plo.windows.items():
        assert e == pytest.approx(TABLE[lim][0] * TIME_SCALE, rel=1e-9)
        assert t == pytest.approx(TABLE[lim][1] * TIME_SCALE, rel=1e-9)
    assert [r["chosen"] for r in plo.table()].count(True) == 1
    plo.close()
    assert gpu.limit_w == 300  # the original


def test_states_follow_warmup_then_one_window_per_limit():
    gpu = SimGpu(TABLE)
    plo = optimizer(gpu, Energy(), warmup_steps=3, profile_steps=5)
    seen = []
    for _ in range(8 * 9):
        plo.on_step_begin()
        seen.append((plo.state, gpu.limit_w))
        gpu.step()
        plo.on_step_end()
    assert seen[:3] == [("warmup", 300)] * 3
    assert seen[3:8] == [("profiling", 300)] * 5
    assert seen[8] == ("warmup", 275)
    assert plo.state == "optimal"
    plo.close()


def test_an_epoch_ending_mid_window_discards_that_window():
    gpu = SimGpu(TABLE)
    plo = optimizer(gpu, Energy())
    # epochs of 33 steps: every window of 40 would straddle an epoch end unless restarted
    run(plo, gpu, 12 * 33 * 9, epoch_steps=33)
    assert plo.state == "warmup" and plo.windows == {}  # 10 + 40 never fits in 33 steps
    plo.close()
    gpu = SimGpu(TABLE)
    plo = optimizer(gpu, Energy())
    run(plo, gpu, 60 * 9 * 2, epoch_steps=60)  # 60 steps: warm-up + window fit once per epoch
    assert plo.state == "optimal" and plo.optimal_limit_w == 175
    for lim, (e, t) in plo.windows.items():  # no window spans two limits or two epochs
        assert (e, t) == pytest.approx((TABLE[lim][0] * TIME_SCALE, TABLE[lim][1] * TIME_SCALE), rel=1e-9)
    plo.close()


def test_keep_leaves_the_chosen_limit_and_default_restores():
    gpu = SimGpu(TABLE, default_w=250)
    plo = optimizer(gpu, Energy(), keep=True)
    run(plo, gpu, steps_needed(TABLE))
    plo.on_train_end()
    assert gpu.limit_w == 175
    gpu = SimGpu(TABLE, default_w=250)
    plo = optimizer(gpu, Energy())
    run(plo, gpu, steps_needed(TABLE))
    plo.on_train_end()
    assert gpu.limit_w == 250


def test_no_permission_is_one_line_at_construction_and_training_goes_on():
    gpu = SimGpu(TABLE, settable=False)
    with pytest.warns(RuntimeWarning, match="no permission to set the GPU power limit"):
        plo = optimizer(gpu, Energy())
    assert not plo.enabled
    run(plo, gpu, 100)  # nothing raises mid-training
    assert gpu.limit_w == 300 and gpu.sets == []
    with pytest.raises(KnobError, match="no permission"):
        optimizer(SimGpu(TABLE, settable=False), Energy(), strict=True)


def test_no_device_is_one_line_at_construction():
    gpu = SimGpu(TABLE)
    with pytest.warns(RuntimeWarning, match="gpu_power_limit:3"):
        plo = PowerLimitOptimizer(gpus=[3], binding=FakeNvml([gpu]), sync=lambda: None)
    assert not plo.enabled and plo.disabled_reason


def test_knob_reads_sets_and_restores_in_watts(keeper):
    gpu = SimGpu(TABLE, default_w=280)
    knob = NvmlPowerLimit(0, binding=FakeNvml([gpu]))
    assert knob.read() == 280 and (knob.range().low, knob.range().high) == (100, 300)
    keeper.set(knob, 150)
    keeper.set(knob, 125)
    assert gpu.limit_w == 125
    with pytest.raises(KnobError, match="outside its range"):
        keeper.set(knob, 350)
    keeper.restore()
    assert gpu.limit_w == 280


@st.composite
def tables(draw):
    high = draw(st.sampled_from([250.0, 300.0, 350.0, 450.0]))
    n = draw(st.integers(2, 8))
    out = {}
    for i in range(n):
        lim = high - 25 * i
        out[lim] = (draw(st.floats(100, 10000)), draw(st.floats(5, 100)))  # (energy J, time s) per 40 steps
    return out


@settings(max_examples=40, deadline=None)
@given(table=tables(), objective=st.one_of(st.just(Energy()), st.just(Time()), st.floats(1.0, 2.0).map(MaxSlowdown),
                                          st.floats(0.0, 1.0).map(Cost)))
# equal times at the highest and lowest limits: the clock's rounding may put the lowest just past the budget
@example(table={250.0: (100.0, 7.0), 225.0: (100.0, 5.0), 200.0: (100.0, 5.0), 175.0: (100.0, 5.0), 150.0: (100.0, 5.0),
                125.0: (100.0, 5.0), 100.0: (100.0, 7.0)},
         objective=MaxSlowdown(1.0))
def test_pick_is_the_objectives_argmin_over_any_table(table, objective):
    gpu = SimGpu(table)
    plo = optimizer(gpu, objective)
    run(plo, gpu, steps_needed(table))
    scaled = {lim: (e * TIME_SCALE, t * TIME_SCALE) for lim, (e, t) in table.items()}
    assert plo.state == "optimal"
    assert plo.optimal_limit_w in acceptable(scaled, objective)
    plo.close()
    assert gpu.limit_w == max(table)


def acceptable(table, objective, rel=1e-9):
    """The brute-force answer, and any other the simulated clock's rounding (relative 1e-16) could give: limits
    scoring within `rel` of the best, or, for MaxSlowdown, any limit whose time is within `rel` of the budget
    (rounding may put it on either side) and the lowest limit clearly within it (the highest when none is)."""
    if isinstance(objective, MaxSlowdown):
        budget = objective.factor * table[max(table)][1]
        clearly = [lim for lim, (_, t) in table.items() if t <= budget * (1 - rel)]
        edge = {lim for lim, (_, t) in table.items() if budget * (1 - rel) < t <= budget * (1 + rel)}
        return {min(clearly, default=max(table)), max(table)} | edge
    score = {Energy: lambda e, t: e, Time: lambda e, t: t}.get(
        type(objective), lambda e, t: objective.eta * e + (1 - objective.eta) * max(table) * t)
    best = min(score(*v) for v in table.values())
    return {lim for lim, v in table.items() if score(*v) <= best + rel * abs(best) + 1e-15}


def test_a_second_gpu_table_gives_its_own_answers():
    # a synthetic table with a different shape from the A40's: energy falls to 200 W, time rises steeply below 225 W
    table = {250.0: (5000.0, 20.0), 225.0: (4700.0, 20.5), 200.0: (4600.0, 23.5), 175.0: (4800.0, 28.0), 150.0: (5400.0, 36.0)}
    answers = {"e": brute(table, Energy()), "t": brute(table, Time()), "s": brute(table, MaxSlowdown(1.1)),
               "c": brute(table, Cost(0.5))}
    assert answers == {"e": 200.0, "t": 250.0, "s": 225.0, "c": 225.0}
    for obj, key in [(Energy(), "e"), (Time(), "t"), (MaxSlowdown(1.1), "s"), (Cost(0.5), "c")]:
        gpu = SimGpu(table)
        plo = optimizer(gpu, obj)
        run(plo, gpu, steps_needed(table))
        assert plo.optimal_limit_w == answers[key]
        plo.close()


EXIT_SCRIPT = textwrap.dedent("""
    import atexit, sys
    sys.path.insert(0, {tests!r})
    from sim_gpu import FakeNvml, SimGpu, load_table, run
    from energyprof.optimize import PowerLimitOptimizer, Energy
    gpu = SimGpu(load_table(), default_w=260)
    # registered first, so it runs last: after the optimizer's own atexit handler
    atexit.register(lambda: print("limit at exit", gpu.limit_w, "lowest set", min(gpu.sets), flush=True))
    plo = PowerLimitOptimizer(objective=Energy(), gpus=[0], binding=FakeNvml([gpu]), clock=lambda: gpu.clock_s,
                              sync=lambda: None, keep={keep})
    run(plo, gpu, {steps})
    {end}
""")


@pytest.mark.parametrize("steps,end,keep,rc,limit", [
    (120, "", False, 0, 260),                                   # normal exit mid-sweep, at a lowered limit
    (120, "raise RuntimeError('the training failed')", False, 1, 260),  # an exception out of the program
    (120, "sys.exit(3)", False, 3, 260),
    (450, "", True, 0, 175),                                    # keep=True after the choice
    (120, "", True, 0, 260),                                    # keep=True before any choice: restored
])
def test_every_exit_path_restores_the_knob(steps, end, keep, rc, limit):
    script = EXIT_SCRIPT.format(tests=TESTS, keep=keep, steps=steps, end=end)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == rc, p.stderr
    line = [lim for lim in p.stdout.splitlines() if lim.startswith("limit at exit")][0].split()
    assert float(line[3]) == limit
    assert float(line[6]) < 260  # it did lower the limit before exiting


DDP_TABLES = [TABLE, {lim: (e * 0.9, t * (1.3 if lim <= 150 else 1.02)) for lim, (e, t) in TABLE.items()}]


def _ddp_rank(rank: int, port: int, out_dir: str, objective, settable=(True, True)) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        gpu = SimGpu(DDP_TABLES[rank], settable=settable[rank])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plo = optimizer(gpu, objective)
        if not plo.enabled:
            run(plo, gpu, steps_needed(TABLE))  # training goes on; no rank waits in an all-reduce
            with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as fh:
                fh.write(repr((plo.disabled_reason, [str(w.message) for w in caught], gpu.sets)))
            return
        run(plo, gpu, steps_needed(TABLE))
        with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as fh:
            fh.write(repr((plo.optimal_limit_w, plo.world_size(), plo.windows, gpu.limit_w)))
        plo.close()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("objective", [Energy(), Cost(0.8)])
def test_ddp_two_gloo_ranks_sum_energy_max_time_and_agree(tmp_path, objective):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_rank, args=(port, str(tmp_path), objective), nprocs=2, join=True)
    results = [eval((tmp_path / f"rank{r}.txt").read_text()) for r in range(2)]
    scaled = [{lim: (e * TIME_SCALE, t * TIME_SCALE) for lim, (e, t) in tbl.items()} for tbl in DDP_TABLES]
    combined = {lim: (scaled[0][lim][0] + scaled[1][lim][0], max(scaled[0][lim][1], scaled[1][lim][1])) for lim in TABLE}
    expected = brute(combined, objective, world_size=2)
    for chosen, world, windows, limit in results:
        assert world == 2
        assert chosen == expected and limit == expected
        for lim, (e, t) in windows.items():
            assert e == pytest.approx(combined[lim][0], rel=1e-9) and t == pytest.approx(combined[lim][1], rel=1e-9)
    if isinstance(objective, Cost):
        # the real world size matters here: Zeus's world size of 1 leans to a lower limit on this table
        assert brute(combined, objective, world_size=1) < expected


def test_sensor_nvml_named_explicitly_uses_an_importable_binding_without_the_driver_check(monkeypatch, tmp_path):
    from energyprof.collect import sensors
    from test_nvml import FakeGpu, FakeNvml as SensorNvml

    stand_in = SensorNvml([FakeGpu()])
    monkeypatch.setattr(nvml_device, "BINDING", None)
    monkeypatch.setattr(nvml_device, "DRIVER_PATHS", (str(tmp_path / "no-driver"),))
    monkeypatch.setitem(sys.modules, "pynvml", stand_in)  # an importable pynvml, no /proc/driver/nvidia
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    implicit = sensors.discover(gpus=True)  # auto-discovery keeps the cheap driver check
    assert not any(s.sensor == "nvml" for s in implicit.sensors)
    for s in implicit.sensors:
        s.close()
    explicit = sensors.discover(only=["nvml"])  # --sensor nvml
    try:
        assert [s.id for s in explicit.sensors] == ["gpu:0"], explicit.notes
        assert stand_in.inits == 1
    finally:
        for s in explicit.sensors:
            s.close()
    # and a GPU named to the optimizer (gpus=[0]) reaches the stand-in the same way
    gpu = SimGpu(TABLE, default_w=225)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([gpu]))
    plo = PowerLimitOptimizer(gpus=[0], clock=lambda: gpu.clock_s, sync=lambda: None)
    assert plo.enabled and gpu.limit_w == 300  # the first candidate is set
    plo.close()
    assert gpu.limit_w == 225


def test_track_calls_the_callbacks_and_the_profile_keeps_each_limits_window():
    from energyprof.drive.profiler import Profiler
    from energyprof.torch import track

    gpu = SimGpu(TABLE)
    plo = optimizer(gpu, MaxSlowdown(1.1), warmup_steps=2, profile_steps=4)
    prof = Profiler(quiet=True, summary=False, gpus=False)
    prof.start()
    try:
        for _epoch in range(4):
            for _ in track(list(range(28)), optimizer=plo):  # 28 steps an epoch: the 5th limit's window straddles it
                gpu.step()
    finally:
        profile = prof.stop()
        plo.close()
    assert plo.state == "optimal" and plo.optimal_limit_w == 200
    names = [w["name"] for w in profile.windows]
    measured = [n for n in names if n.startswith("power_limit:")]
    # one window per limit that completed, plus the discarded ones cut at an epoch's end
    assert set(measured) == {f"power_limit:{lim:g}W" for lim in TABLE}
    # 28 = 4 limits x (2 + 4) + 4: the 5th limit's window is cut at each epoch's end and redone (200 W, then 100 W)
    assert measured.count("power_limit:200W") == measured.count("power_limit:100W") == 2 and len(measured) == 11
    assert plo.windows[200][1] == pytest.approx(TABLE[200][1] * TIME_SCALE * 4 / 40, rel=1e-9)  # the redone one, whole
    wins = [w for w in profile.windows if w.name.startswith("power_limit:")]
    assert [w.loop.get("discarded") for w in wins].count(1.0) == 2
    kept = [w for w in wins if not w.loop.get("discarded")]
    assert [w.loop["limit_w"] for w in kept] == sorted(TABLE, reverse=True)
    assert kept[-1].loop["chosen_w"] == 200 and all("chosen_w" not in w.loop for w in kept[:-1])
    assert kept[0].loop["window_time_s"] == pytest.approx(TABLE[300][1] * TIME_SCALE * 4 / 40, rel=1e-9)
    # the report's sweep of power_limit: one point per limit, the cut windows left out
    from energyprof.analysis.pareto import sweep_names, window_points

    assert "power_limit" in sweep_names(profile.windows)
    points, _ = window_points([profile.windows], "power_limit")
    assert sorted(p.label for p in points) == sorted(f"{lim:g}W" for lim in TABLE)
    from energyprof.analysis.report import build
    from energyprof.render.html import render_html

    page = render_html(build(profile))
    assert "Chosen by the program: <b>200W</b>" in page
    rows = re.findall(r'<td class="fn">(\d+W)( \(chosen\))?</td>', page)
    assert sorted(r[0] for r in rows) == sorted(f"{lim:g}W" for lim in TABLE) and [r[0] for r in rows if r[1]] == ["200W"]
    assert len(plo.windows) == 9
    assert gpu.limit_w == 300


def test_the_same_optimizer_drives_a_cpu_knob_with_a_rapl_energy_reader(tmp_path):
    from energyprof.knobs.base import Knob, KnobRange

    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "constraint_0_power_limit_uw").write_text("65000000\n")
    (zone / "energy_uj").write_text("0\n")
    clock = [0.0]
    # a CPU whose step time and power follow a table: (energy J, time s) per 40 steps at each package limit
    table = {65.0: (2600.0, 40.0), 55.0: (2420.0, 44.0), 45.0: (2340.0, 52.0), 35.0: (2380.0, 68.0)}

    class RaplLimit(Knob):
        kind, unit = "cpu_power_limit", "W"

        def read(self) -> float:
            return int((zone / "constraint_0_power_limit_uw").read_text()) / 1e6

        def range(self) -> KnobRange:
            return KnobRange(35.0, 65.0)

        def _write(self, value: float) -> None:
            (zone / "constraint_0_power_limit_uw").write_text(f"{int(value * 1e6)}\n")

    def cpu_step() -> None:
        e, t = table[RaplLimit("0").read()]
        dt = t / 40 * TIME_SCALE
        clock[0] += dt
        (zone / "energy_uj").write_text(f"{int((zone / 'energy_uj').read_text()) + round(e / t * dt * 1e6)}\n")

    def rapl_energy_j() -> float:
        return int((zone / "energy_uj").read_text()) / 1e6

    plo = PowerLimitOptimizer(objective=Energy(), knobs=[RaplLimit("0")], energy=rapl_energy_j, step_w=10,
                              clock=lambda: clock[0], sync=lambda: None)
    assert plo.candidates == [65, 55, 45, 35]
    for _ in range(4 * 50):
        plo.on_step_begin()
        cpu_step()
        plo.on_step_end()
    assert plo.optimal_limit_w == 45 == brute(table, Energy())
    assert (zone / "constraint_0_power_limit_uw").read_text() == "45000000\n"
    plo.close()
    assert (zone / "constraint_0_power_limit_uw").read_text() == "65000000\n"
    with pytest.warns(RuntimeWarning, match="no energy reader"):  # a knob without a counter needs energy=
        assert not PowerLimitOptimizer(knobs=[RaplLimit("0")]).enabled


def test_ddp_a_rank_without_privilege_disables_every_rank_at_construction(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_ddp_rank, args=(port, str(tmp_path), Energy(), (True, False)), nprocs=2, join=True)
    (r0, w0, sets0), (r1, w1, sets1) = [eval((tmp_path / f"rank{r}.txt").read_text()) for r in range(2)]
    assert "another rank cannot set its limit" in r0 and "no permission" in r1
    assert len(w0) == len(w1) == 1  # one line each
    assert sets1 == [] and sets0 == [300.0, 300.0]  # rank 0 only re-set the value it had (the privilege check), then restored it


STAND_IN_PYNVML = '''
"""A stand-in pynvml: one GPU drawing a constant 50 W, its counter on the system's monotonic clock."""
import time


class NVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value


class _Pci:
    busId = b"00000000:3B:00.0"


class _Process:
    pid = 0


def nvmlInit(): pass
def nvmlShutdown(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return "gpu0"
def nvmlSystemGetDriverVersion(): return "550.00"
def nvmlDeviceGetPciInfo(h): return _Pci()
def nvmlDeviceGetUUID(h): return "GPU-standin"
def nvmlDeviceGetName(h): return "Stand-in GPU"
def nvmlDeviceGetMigMode(h): raise NVMLError(3)
def nvmlDeviceGetEnforcedPowerLimit(h): return 300000
def nvmlDeviceGetTotalEnergyConsumption(h): return int(time.monotonic() * 50_000)  # 50 W in mJ
def nvmlDeviceGetComputeRunningProcesses(h): return []
'''


def test_run_with_sensor_nvml_measures_a_stand_in_pynvml_without_the_driver_folder(tmp_path):
    if any(os.path.exists(p) for p in nvml_device.DRIVER_PATHS):
        pytest.skip("this machine has an NVIDIA driver: the missing-driver path cannot be shown here")
    from conftest import run_cli
    from energyprof.facts.profile import load

    site = tmp_path / "site"
    site.mkdir()
    (site / "pynvml.py").write_text(STAND_IN_PYNVML)
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(0.3)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = run_cli(["-q", "--sensor", "nvml", "--json", "p.json", "prog.py"], tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "p.json")
    assert [(s.id, s.sensor) for s in prof.sources] == [("gpu:0", "nvml")]
    # 50 W over the run: the counter's difference over the measured span (a counter step is 1 mJ)
    assert prof.totals.energy_j["gpu:0"] / prof.totals.duration_s == pytest.approx(50.0, rel=0.05)


def test_a_gpu_lost_mid_training_stops_the_optimizer_not_the_training():
    gpu = SimGpu(TABLE, default_w=200)
    fake = FakeNvml([gpu])
    plo = PowerLimitOptimizer(gpus=[0], binding=fake, clock=lambda: gpu.clock_s, sync=lambda: None)
    run(plo, gpu, 120)
    assert plo.state == "warmup" and gpu.limit_w == 250  # two limits measured, the third being set

    def lost(g):
        raise sim_gpu.NVMLError(15)

    fake.nvmlDeviceGetTotalEnergyConsumption = lost
    with pytest.warns(RuntimeWarning, match="PowerLimitOptimizer stopped"):
        run(plo, gpu, 200)
    assert not plo.enabled and gpu.limit_w == 200  # restored when it stopped


# ---------------------------------------------------------------- every end of the program restores the limit

# The GPU's limit lives in a file (tests/sim_pynvml.py), so what is left after the program is gone can be read,
# and the keeper's process reaches the GPU through the same binding.
KILLED_SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {tests!r})
    import sim_pynvml
    from energyprof.optimize import PowerLimitOptimizer, Energy
    plo = PowerLimitOptimizer(objective=Energy(), gpus=[0], binding=sim_pynvml, clock=lambda: sim_pynvml.clock_s,
                              sync=lambda: None)
    for _ in range(120):  # two windows measured: now at the third limit
        plo.on_step_begin()
        sim_pynvml.step()
        plo.on_step_end()
    print("lowered", sim_pynvml.limit_w(), os.getpid(), flush=True)
    how = sys.argv[1]
    if how == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)  # the default action: no atexit, no finally
    elif how == "os_exit":
        os._exit(0)
    time.sleep(120)  # killed with -9 by the test
""")


@pytest.mark.parametrize("supervised,how", [(s, h) for s in (False, True) for h in ("sigterm", "os_exit", "kill")]
                         + [(True, "kill-energyprof")])
def test_the_optimizer_restores_the_limit_however_the_program_ends(tmp_path, supervised, how):
    import signal

    import sim_pynvml

    state = tmp_path / "gpu-limit"
    sim_pynvml.reset(260, str(state))
    (tmp_path / "prog.py").write_text(KILLED_SCRIPT.format(tests=TESTS))
    (tmp_path / "trace.csv").write_text("t_s,gpu\n0,100\n")
    env = dict(os.environ, SIM_GPU_STATE=str(state),
               PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "prog.py", how]
    if supervised:
        cmd = [sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "-o", "p.html", "--", *cmd]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:2] == ["lowered", "250.0"], (line, proc.stderr.read() if proc.poll() is not None else "")
        if how == "kill":
            os.kill(int(line[2]), signal.SIGKILL)  # the program itself
        elif how == "kill-energyprof":
            proc.kill()  # energyprof first, then what is left of the run (its program) at once
            proc.wait(timeout=60)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert knob_trees.wait_for(lambda: sim_pynvml.limit_w(str(state)) == 260), sim_pynvml.limit_w(str(state))
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- the first window holds nothing of energyprof's

# A V100 (Zeus's ResNet-50 sweep) at 1/40 of its time: the 250 W window lasts 0.667 s. The clock is the simulated
# GPU's time plus this thread's CPU time: what the host does between steps (energyprof's own imports included)
# lengthens a synchronous step, and CPU time, unlike the wall clock, does not grow on a loaded machine. The margins
# are the table's: the 250 W window wins Time() by 15 ms and keeps 175 W out of MaxSlowdown(1.1) by 2.5 ms, where
# importing energyprof.drive.profiler costs 28-93 ms. The run starts in a fresh interpreter, so that import is real.
V100_SCRIPT = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from sim_gpu import V100, FakeNvml, SimGpu, load_table, run
    from energyprof.optimize import MaxSlowdown, PowerLimitOptimizer, Time
    gpu = SimGpu(load_table(V100), time_scale=1 / 40)
    plo = PowerLimitOptimizer(objective={objective}, gpus=[0], binding=FakeNvml([gpu]),
                              clock=lambda: gpu.clock_s + time.thread_time(), sync=lambda: None)
    run(plo, gpu, 7 * 50)
    print(plo.optimal_limit_w, plo.windows[250.0][1], plo.windows[225.0][1], flush=True)
""")


@pytest.mark.parametrize("supervised", [False, True], ids=["plain", "python-m-energyprof"])
@pytest.mark.parametrize("objective,expected", [("Time()", 250.0), ("MaxSlowdown(1.1)", 200.0)])
def test_the_simulated_v100_picks_the_tables_answer_from_the_first_window(tmp_path, objective, expected, supervised):
    table = load_table(sim_gpu.V100)
    assert brute(table, Time()) == 250 and brute(table, MaxSlowdown(1.1)) == 200  # and Zeus's
    (tmp_path / "prog.py").write_text(V100_SCRIPT.format(tests=TESTS, objective=objective))
    (tmp_path / "trace.csv").write_text("t_s,gpu\n0,100\n")
    cmd = [sys.executable, "prog.py"]
    if supervised:
        cmd = [sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "-o", "p.html", "--", *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    chosen, t250, t225 = (float(v) for v in p.stdout.split())
    assert t250 < t225, (t250, t225, table[250][1] / 40)
    assert chosen == expected, (chosen, t250, table[250][1] / 40)


ONE_FIGURE_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from sim_gpu import V100, FakeNvml, SimGpu, load_table, run
    from energyprof.optimize import PowerLimitOptimizer, Time
    gpu = SimGpu(load_table(V100), time_scale=1 / 40)
    plo = PowerLimitOptimizer(objective=Time(), warmup_steps=1, profile_steps=4, gpus=[0], binding=FakeNvml([gpu]),
                              sync=lambda: None)  # the default clock: the profile's
    run(plo, gpu, 7 * 5)
    print(repr(plo.windows), flush=True)
""")


@pytest.mark.parametrize("supervised", [False, True], ids=["in-process", "python-m-energyprof"])
def test_a_windows_time_is_one_figure_in_the_optimizer_and_the_profile(tmp_path, supervised):
    """The window the profile keeps and the optimizer's own measurement of it are the same instants: its time
    is one figure (under `python -m energyprof` it read 0.6701 s, and its stored facts 0.6884 s)."""
    from energyprof.facts.profile import load

    script = ONE_FIGURE_SCRIPT.format(tests=TESTS)
    if not supervised:  # the in-process profile around the same program
        script = script.replace("run(plo, gpu, 7 * 5)\n", "from energyprof.drive.profiler import Profiler\n"
                                "prof = Profiler(quiet=True, summary=False, gpus=False)\n"
                                "prof.start()\nrun(plo, gpu, 7 * 5)\n"
                                "open('p.json', 'w').write(prof.stop().to_json())\n")
        assert "prof.start()" in script
    (tmp_path / "prog.py").write_text(script)
    (tmp_path / "trace.csv").write_text("t_s,gpu\n0,100\n")
    cmd = [sys.executable, "prog.py"]
    if supervised:
        cmd = [sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--json", "p.json", "-o",
               "p.html", "--", *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(TESTS), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    measured = eval(p.stdout.strip())
    windows = [w for w in load(str(tmp_path / "p.json")).windows if w.name.startswith("power_limit:")]
    assert len(windows) == 7
    for w in windows:
        assert w.time_s == w.loop["window_time_s"] == measured[w.loop["limit_w"]][1], (w.name, w.time_s, w.loop)


@pytest.mark.parametrize("clock", ["perf_counter", "the GPU's"])
def test_the_optimizer_windows_a_monitor_through_the_one_protocol(tmp_path, clock):
    """drive/windows.py: the optimizer opens and ends its windows on a Monitor as on a Profiler (edges and
    facts handed over, nothing probed); each one it opened is ended."""
    import time

    from energyprof import Monitor

    (tmp_path / "t.csv").write_text("t_s,cpu\n0,40\n")
    gpu = SimGpu(TABLE)
    ended: list[str] = []
    with Monitor(power_trace=str(tmp_path / "t.csv")) as mon:
        end = mon.end_window

        def end_window(name=None, facts=None, t_ns=None):
            ended.append(name)
            return end(name, facts=facts, t_ns=t_ns)

        mon.end_window = end_window
        tick = time.perf_counter if clock == "perf_counter" else (lambda: gpu.clock_s)
        plo = PowerLimitOptimizer(objective=Energy(), gpus=[0], binding=FakeNvml([gpu]), sync=lambda: None,
                                  profiler=mon, clock=tick)
        try:
            run(plo, gpu, steps_needed(TABLE) + 5)
            assert plo.state == "optimal" and mon._open == []
        finally:
            plo.close()
    assert len(ended) == len(TABLE) and len(set(ended)) == len(TABLE)  # one window per limit, each ended
