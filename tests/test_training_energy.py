"""Energy per step, per sample and per epoch is the program's (its part of each window, as the headline
is), with the machine's beside it: a replayed constant power and a known CPU share give both exactly."""

from __future__ import annotations

import pytest

from energyprof.analysis.report import RenderOptions, build
from energyprof.core.ledger import Ledger
from energyprof.core.recording import Tick
from energyprof.core.tree import build_profile
from energyprof.render.html import render_html

CPU = {"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}
WATTS = 20.0
MS = 1_000_000
STEP_MS = 200
SAMPLES = 8


def tracked_loop(policy: str = "share"):
    """Two cores; 20 W all run. Every 100 ms the program burns 50 ms of CPU and the machine 150 ms
    (another process burns the rest), so the program's CPU share is 1/3 throughout. Four steps of
    200 ms (a 50 ms fetch, then compute), eight samples a batch, in one epoch."""
    led = Ledger([CPU], cpus=2)
    ticks = [Tick(k * 100 * MS, (WATTS * k * 0.1,), k * 50 * MS, 0, k * 150 * MS) for k in range(11)]
    led.add_tick(ticks[0])
    led.begin_window(0, "epoch", 0)
    for i in range(4):
        t = i * STEP_MS * MS
        led.begin_window(t, "step.fetch", i)
        led.end_window(t + 50 * MS, "step.fetch", facts={"samples": float(SAMPLES)})
        led.begin_window(t + 50 * MS, "step.compute", i)
        led.end_window(t + STEP_MS * MS, "step.compute")
    led.end_window(4 * STEP_MS * MS, "epoch")
    for tick in ticks[1:]:
        led.add_tick(tick)
    led.finish()
    return build_profile(led, policy, {"target": "train.py"})


def test_per_step_and_per_sample_energy_is_the_programs_with_the_machines_beside_it() -> None:
    machine_step = WATTS * STEP_MS / 1000  # 4 J: everything the sensor measured in a step
    program_step = machine_step / 3  # the program's CPU share of the machine's busy CPU
    model = build(tracked_loop("share"))
    b = model.training["step"]
    assert b["energy_of"] == "program"
    assert b["step_count"] == 4 and b["sample_count"] == 4 * SAMPLES
    assert b["energy_per_step_j"] == pytest.approx(program_step)
    assert b["energy_per_sample_j"] == pytest.approx(program_step / SAMPLES)
    assert b["energy_per_epoch_j"] == pytest.approx(4 * program_step)
    assert b["step_energy_j"]["mean"] == pytest.approx(program_step)
    assert b["machine_energy_per_step_j"] == pytest.approx(machine_step)
    assert b["machine_energy_per_sample_j"] == pytest.approx(machine_step / SAMPLES)
    assert b["machine_step_energy_j"]["mean"] == pytest.approx(machine_step)
    for row in b["steps"]:
        assert row["wait_j"] == pytest.approx(WATTS * 0.05 / 3) and row["compute_j"] == pytest.approx(WATTS * 0.15 / 3)
        assert row["machine_energy_j"] == pytest.approx(machine_step)
    (epoch,) = b["epochs"]
    assert epoch["energy_j"] == pytest.approx(4 * program_step)
    assert epoch["energy_per_sample_j"] == pytest.approx(program_step / SAMPLES)
    assert epoch["machine_energy_per_sample_j"] == pytest.approx(machine_step / SAMPLES)
    # the same kind of figure as the headline: the steps' program energy is the program's over their span
    assert b["training_energy_j"] == pytest.approx(model.attributed_j * 0.8)
    page = render_html(model)
    assert "Energy here is the program&#39;s" in page
    assert "Per sample 167 mJ (the machine's: 500 mJ)" in page  # the program's, the machine's beside it


def test_under_idle_all_the_program_pays_for_the_whole_machine() -> None:
    machine_step = WATTS * STEP_MS / 1000
    for profile in (tracked_loop("all"), tracked_loop("share")):
        b = build(profile, RenderOptions(idle="all")).training["step"]
        assert b["energy_per_step_j"] == pytest.approx(machine_step)
        assert b["machine_energy_per_step_j"] == pytest.approx(machine_step)


def test_a_file_whose_windows_hold_no_program_part_says_its_figures_are_the_machines() -> None:
    from energyprof.record import replace

    profile = tracked_loop("share")
    old = replace(profile, windows=[replace(w, program_energy_j={}, other_policy_program_energy_j={})
                                    for w in profile.windows])
    b = build(old).training["step"]
    assert b["energy_of"] == "machine"
    assert b["energy_per_step_j"] == pytest.approx(WATTS * STEP_MS / 1000)


def test_one_rule_for_a_windows_program_energy_in_every_view() -> None:
    """The program's part of a window, else (a file written before windows held it) the machine's: the
    report's window rows, the breakdown, the forecasts' passes and steps, and compare all read it from
    one place, and say alike whether the figures are the program's."""
    from energyprof.analysis.compare import _window_rows
    from energyprof.analysis.forecast import _program_step_energy
    from energyprof.analysis.training import energy_of, hold_program, window_program_j
    from energyprof.analysis.windows import WindowRow
    from energyprof.record import replace

    new = tracked_loop("share")
    old = replace(new, windows=[replace(w, program_energy_j={}, other_policy_program_energy_j={}) for w in new.windows])
    for profile, program in ((new, True), (old, False)):
        for w in profile.windows:
            want = w.program_total_j if program else w.total_j
            assert window_program_j(w) == pytest.approx(want) and WindowRow(w).program == window_program_j(w)
        assert hold_program(profile.windows) is program
        assert energy_of(profile.windows) == ("program" if program else "machine")
        steps = _program_step_energy(profile, "step")
        assert steps[0] == pytest.approx(sum(window_program_j(w) for w in profile.windows
                                             if w.index == 0 and w.name in ("step.fetch", "step.compute")))
    # compare: the program's part only where every run's windows hold it
    mixed = [c for c in _window_rows([build(new), build(old)]) if c.name == "step.compute"]
    assert [c.program for c in mixed] == [False]
    assert [c.program for c in _window_rows([build(new), build(new)]) if c.name == "step.compute"] == [True]
