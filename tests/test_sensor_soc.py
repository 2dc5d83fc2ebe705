"""Jetson and Apple silicon backends: the tools' formats parsed, rails that never overlap, and the
real CLI run end to end against stand-in executables of the tools' names on PATH."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from energyprof.collect.sensors.base import PowerIntegrator, split_total
from energyprof.collect.sensors.soc import jtop, macmon, powermetrics, rails, tegrastats
from energyprof.facts.profile import load

import sensor_standins as standins
from conftest import run_cli

TEGRA = sorted(p.name for p in standins.FIXTURES.glob("tegrastats_*.txt"))
GENERATIONS = ["tegrastats_tx2_l4t32.txt", "tegrastats_orin_nano_jp6.txt", "tegrastats_agx_orin_jp7.txt"]


def tegra_lines(name: str) -> list[str]:
    return [ln.split("\t", 1)[1] for ln in (standins.FIXTURES / name).read_text().splitlines() if "\t" in ln]


# ---------------------------------------------------------------- tegrastats lines


def test_each_generation_reads_the_instantaneous_value_never_the_average():
    old = rails.parse_line(tegra_lines("tegrastats_tx2_l4t32.txt")[1])  # `cur/avg`, no unit
    assert old["VDD_IN"] == 1720 and old["VDD_SYS_CPU"] == 240
    mw = rails.parse_line(tegra_lines("tegrastats_orin_nano_jp6.txt")[0])  # `curmW/avgmW`
    assert mw == {"VDD_IN": 5250, "VDD_CPU_GPU_CV": 510, "VDD_SOC": 2720}
    jp7 = rails.parse_line(tegra_lines("tegrastats_agx_orin_jp7.txt")[1])  # JetPack 7: `cur/avg/max`
    assert jp7 == {"VDD_GPU_SOC": 6100, "VDD_CPU_CV": 3700, "VIN_SYS_5V0": 5500}


def test_memory_and_engine_fields_are_not_rails():
    line = tegra_lines("tegrastats_held-out_nano_and_tx2_variant.txt")[1]
    found = rails.parse_line(line)
    assert not {"RAM", "SWAP", "NVENC", "NVDEC", "APE", "EMC_FREQ"} & set(found)
    assert set(found) == {"VDD_IN", "VDD_CPU", "VDD_GPU", "VDD_SOC", "VDD_WIFI", "VDD_DDR"}


def test_not_connected_rails_are_skipped():
    found = rails.parse_line(tegra_lines("tegrastats_held-out_agx_orin_jp5.txt")[0])
    assert "NC" not in found and found["VDDQ_VDD2_1V8AO"] == 301


@pytest.mark.parametrize("name", TEGRA)
def test_sources_sum_to_the_board_power_once(name):
    """Every board, the held-out ones included: the sources add up to the board's own figure
    (input rail where there is one, else the sum of the rails), and none is the input rail."""
    for line, board in zip(tegra_lines(name), standins.board_mw(name)):
        watts = rails.sources_watts(rails.parse_line(line))
        assert sum(watts.values()) == pytest.approx(board / 1000, rel=1e-12)
        assert not set(watts) & set(rails.INPUT_RAILS)
        assert all(w >= 0 for w in watts.values())


def test_components_follow_the_rail_names():
    assert rails.component("VDD_SYS_GPU") == "gpu:0" and rails.component("GPU") == "gpu:0"
    assert rails.component("VDD_SYS_CPU") == "cpu" and rails.component("VDD_SYS_DDR") == "dram"
    assert rails.component("VDD_CPU_GPU_CV") == "soc" and rails.component("VDDRQ") == "dram"


@given(total=st.floats(0, 1e3), parts=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.floats(0, 1e3)))
def test_split_never_counts_twice_and_never_goes_negative(total, parts):
    out = split_total(("t", total), parts)
    assert out["other"] >= 0
    assert sum(out.values()) == pytest.approx(max(total, sum(parts.values())), rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- the integrator (pure)


def test_trapezoids_of_instant_readings_are_exact_for_linear_power():
    integ = PowerIntegrator()
    for k in range(5):  # power rises 1 W per second: 0,1,2,3,4 W at 0..4 s
        integ.add_instant(k * 10**9, {"a": float(k)})
    assert integ.energy("a", 4 * 10**9) == pytest.approx(8.0)  # the integral of t over [0, 4]
    assert integ.energy("a", 5 * 10**9) == pytest.approx(12.0)  # the last power (4 W) held for a second
    integ.end()
    assert integ.energy("a", 6 * 10**9) == pytest.approx(12.0)  # never steps back, no extrapolation after the end


def test_interval_means_are_mean_times_elapsed():
    integ = PowerIntegrator()
    integ.add_mean(100_000_000, 100_000_000, {"a": 2.0})
    integ.add_mean(150_000_000, 250_000_000, {"a": 4.0})  # reached the reader late and bunched: the tool's interval counts
    assert integ.energy("a", 150_000_000) == pytest.approx(2.0 * 0.1 + 4.0 * 0.25)
    since = PowerIntegrator()  # no stated interval: since the previous reading (the first marks the start)
    since.add_mean(10**9, None, {"a": 5.0})
    since.add_mean(3 * 10**9, None, {"a": 7.0})
    assert since.energy("a", 3 * 10**9) == pytest.approx(14.0)


@given(st.lists(st.tuples(st.integers(1, 10**9), st.floats(0, 500)), min_size=1, max_size=30),
       st.lists(st.integers(0, 3 * 10**10), max_size=30))
def test_energy_is_monotone_whatever_the_reads(readings, reads):
    integ = PowerIntegrator()
    t = 0
    last = 0.0
    events = sorted([("r", x) for x in reads] + [("w", i) for i in range(len(readings))],
                    key=lambda e: e[1] if e[0] == "r" else sum(g for g, _ in readings[: e[1] + 1]))
    for kind, x in events:
        if kind == "w":
            gap, w = readings[x]
            t += gap
            integ.add_instant(t, {"a": w})
        else:
            e = integ.energy("a", x)
            assert e >= last - 1e-9
            last = e


# ---------------------------------------------------------------- powermetrics


def parse_file(parse, name: str):
    return list(parse(io.BytesIO((standins.FIXTURES / name).read_bytes())))


@pytest.mark.parametrize("name", ["powermetrics_macos12.txt", "powermetrics_macos12.plist"])
def test_powermetrics_macos12_package_and_dram(name):
    first = parse_file(powermetrics.parse, name)[0]
    assert first.elapsed_ns == 104_510_000
    assert first.watts == pytest.approx({"cpu": 0.947, "gpu:0": 0.153, "ane": 0.0, "dram": 0.220,
                                         "other": 1.473 - 0.947 - 0.153 - 0.220})
    readings = parse_file(powermetrics.parse, name)
    assert [round(sum(r.watts.values()), 6) for r in readings] == [1.473, 0.773, 0.396]


@pytest.mark.parametrize("name", ["powermetrics_macos14.txt", "powermetrics_macos14.plist"])
def test_powermetrics_macos13_combined_power_gpu_once(name):
    readings = parse_file(powermetrics.parse, name)
    assert len(readings) == 3  # GPU Power printed twice per sample does not make a second sample
    assert readings[0].watts == pytest.approx({"cpu": 2.310, "gpu:0": 0.512, "ane": 0.0, "other": 0.0})
    assert [round(sum(r.watts.values()), 6) for r in readings] == [2.822, 2.305, 5.650]
    assert readings[1].elapsed_ns == 101_200_000


def test_macmon_splits_the_system_power():
    r = macmon.reading(json.loads((standins.FIXTURES / "macmon.jsonl").read_text().splitlines()[2]))
    assert r is not None and sum(r.watts.values()) == pytest.approx(14.0726)
    assert r.watts["cpu"] == pytest.approx(1.9021) and r.watts["dram"] == pytest.approx(0.305)


def test_jtop_uses_power_not_avg_and_splits_the_input_rail():
    power = json.loads((standins.FIXTURES / "jtop_orin_nano.json").read_text())
    w = jtop.watts(power)
    assert w == pytest.approx({"VDD_CPU_GPU_CV": 1.064, "VDD_SOC": 1.540, "other": 5.133 - 1.064 - 1.540})
    del power["tot"]["name"]  # a board without an input rail (Xavier): tot is the rails' sum, not a part
    assert set(jtop.watts(power)) == {"VDD_CPU_GPU_CV", "VDD_SOC"}


def test_jtop_backend_integrates_the_rails(monkeypatch):
    import time

    monkeypatch.setenv("FAKE_JTOP_POWER", (standins.FIXTURES / "jtop_orin_nano.json").read_text())
    monkeypatch.setattr(jtop, "BINDING", standins.load_module("fake_jtop"))
    found = jtop.discover(explicit=True, interval_s=0.01)
    try:
        assert [s.id for s in found.sensors] == ["VDD_CPU_GPU_CV", "VDD_SOC", "other"]
        assert {s.tier for s in found.sensors} == {"integrated"}
        t0 = time.perf_counter_ns()
        for s in found.sensors:
            s.start(t0)
        time.sleep(0.1)
        t1 = time.perf_counter_ns()
        total = sum(s.read(t1) for s in found.sensors)
        # constant power: every trapezoid is exact, so the sources hold the board's 5.133 W x the time
        assert total == pytest.approx(5.133 * (t1 - t0) / 1e9, rel=1e-9)
    finally:
        for s in found.sensors:
            s.close()


# ---------------------------------------------------------------- the real CLI against stand-ins


PROGRAM = """
import time
end = time.perf_counter() + 0.6
while time.perf_counter() < end:
    sum(i * i for i in range(1000))
print("done")
"""


def run_with(tmp_path: Path, tool: str, fixture: str, kind: str, *extra: str, **env: str):
    bin_dir = tmp_path / "bin"
    standins.install(bin_dir, tool)
    (tmp_path / "prog.py").write_text(PROGRAM)
    return run_cli(["-q", "--sensor", tool, *extra, "--json", "p.json", "-o", "r.html", "prog.py"], tmp_path,
                   env=standins.env_for(bin_dir, fixture, kind, **env))


def mean_power(profile) -> float:
    return sum(profile.totals.energy_j.values()) / profile.totals.duration_s


@pytest.mark.parametrize("fixture", GENERATIONS + [n for n in TEGRA if "held-out" in n])
def test_tegrastats_end_to_end(tmp_path, fixture):
    """The real CLI with `--sensor tegrastats` and a stand-in: measured, and the sources' mean
    power lies within the board's range over the lines (a trapezoid of a signal inside [lo, hi]
    stays inside it), to 10%."""
    done = run_with(tmp_path, "tegrastats", fixture, "tegrastats")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    prof = load(tmp_path / "p.json")
    assert {s.sensor for s in prof.sources} == {"tegrastats"}
    assert {s.method for s in prof.sources} == {"measured"} and {s.tier for s in prof.sources} == {"integrated"}
    assert all(s.update_period_s == 0.1 for s in prof.sources)
    board = standins.board_mw(fixture)
    assert 0.9 * min(board) / 1000 <= mean_power(prof) <= 1.1 * max(board) / 1000
    assert not set(s.id for s in prof.sources) & set(rails.INPUT_RAILS)


@pytest.mark.parametrize("fixture,kind,totals", [
    ("powermetrics_macos12.txt", "text", [1.473, 0.773, 0.396]),
    ("powermetrics_macos14.txt", "text", [2.822, 2.305, 5.650]),
    ("powermetrics_macos12.plist", "plist", [1.473, 0.773, 0.396]),
    ("powermetrics_macos14.plist", "plist", [2.822, 2.305, 5.650]),
])
def test_powermetrics_end_to_end(tmp_path, fixture, kind, totals):
    done = run_with(tmp_path, "powermetrics", fixture, kind)
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "p.json")
    assert {s.sensor for s in prof.sources} == {"powermetrics"}
    assert "cpu" in {s.id for s in prof.sources} and "gpu:0" in {s.id for s in prof.sources}
    assert 0.9 * min(totals) <= mean_power(prof) <= 1.1 * max(totals)


def test_macmon_end_to_end(tmp_path):
    done = run_with(tmp_path, "macmon", "macmon.jsonl", "lines")
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "p.json")
    assert {s.sensor for s in prof.sources} == {"macmon"}
    assert 0.9 * 12.6174 <= mean_power(prof) <= 1.1 * 14.0726


def test_powermetrics_without_root_says_how(tmp_path):
    done = run_with(tmp_path, "powermetrics", "powermetrics_macos14.txt", "text",
                    STANDIN_FAIL="powermetrics must be invoked as the superuser")
    assert done.returncode == 2 and "found no source" in done.stderr
    assert done.stderr.count("\n") == 1
    assert "superuser" in done.stderr
    if os.geteuid() != 0:
        assert "sudo energyprof" in done.stderr
    assert not (tmp_path / "p.json").exists()


def test_a_named_tool_that_is_missing_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "prog.py").write_text("print('ran')\n")
    done = run_cli(["--sensor", "tegrastats", "prog.py"], tmp_path, env={"PATH": str(tmp_path / "empty")})
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.count("\n") == 1 and "tegrastats" in done.stderr


def test_the_tool_runs_once_per_run_and_is_gone_after(tmp_path):
    """One long-running child, stopped when the run ends (no tool left behind)."""
    import subprocess

    done = run_with(tmp_path, "tegrastats", "tegrastats_orin_nano_jp6.txt", "tegrastats")
    assert done.returncode == 0, done.stderr
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "bin" / "tegrastats")], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_tegrastats_stream_skips_lines_without_rails():
    lines = tegra_lines("tegrastats_tx2_l4t32.txt")
    stream = io.BytesIO(("Tue Jan 26 18:22:31 UTC 2021\n" + "\n".join(lines) + "\n").encode())
    readings = list(tegrastats.parse(stream))  # the `date` line between samples is not a reading
    assert [round(sum(r.watts.values()) * 1000) for r in readings] == standins.board_mw("tegrastats_tx2_l4t32.txt")
    assert not any(r.mean for r in readings)  # instantaneous values: trapezoids


def test_a_tool_that_stops_mid_run_is_dropped_with_a_note_and_the_run_goes_on(tmp_path):
    done = run_with(tmp_path, "tegrastats", "tegrastats_orin_nano_jp6.txt", "tegrastats", STANDIN_MAX_RECORDS="3")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "done\n"
    prof = load(tmp_path / "p.json")
    dropped = [n for n in prof.notes if n.kind == "sensor-dropped"]
    assert {n["source"] for n in dropped} == {"VDD_CPU_GPU_CV", "VDD_SOC", "other"}
    assert all("tegrastats stopped (exit status 0)" in n.message for n in dropped)


def fake_jtop_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    import shutil

    fake = tmp_path / "fake"
    fake.mkdir()
    shutil.copy(standins.FIXTURES / "fake_jtop.py", fake / "jtop.py")
    return {"PYTHONPATH": f"{fake}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
            "FAKE_JTOP_POWER": (standins.FIXTURES / "jtop_orin_nano.json").read_text(), **extra}


def test_jtop_end_to_end(tmp_path):
    """The real CLI with `--sensor jtop` and jetson-stats' module stood in: constant rails, so the
    sources hold the board's 5.133 W exactly (trapezoids of a constant)."""
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = run_cli(["-q", "--sensor", "jtop", "--json", "p.json", "-o", "r.html", "prog.py"], tmp_path,
                   env=fake_jtop_env(tmp_path))
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "p.json")
    assert [s.id for s in prof.sources] == ["VDD_CPU_GPU_CV", "VDD_SOC", "other"]
    assert mean_power(prof) == pytest.approx(5.133, rel=1e-6)


def test_jtop_without_its_service_says_how(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    done = run_cli(["-q", "--sensor", "jtop", "prog.py"], tmp_path, env=fake_jtop_env(tmp_path, FAKE_JTOP_NO_SERVICE="1"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "systemctl" in done.stderr and done.stdout == ""


def test_in_process_the_tool_is_not_one_of_the_programs_children(tmp_path):
    """The with-block runs the tool from inside the program's process; it is energyprof's, so
    the profile lists no child process and charges the program no CPU of it."""
    bin_dir = tmp_path / "bin"
    standins.install(bin_dir, "tegrastats")
    code = ("from energyprof import energy_profile\nimport time\n"
            "with energy_profile(output='w.html', json='w.json', sensor='tegrastats', quiet=True):\n"
            "    time.sleep(1.2)\n")
    (tmp_path / "inproc.py").write_text(code)
    import subprocess
    import sys

    env = {**os.environ, **standins.env_for(bin_dir, "tegrastats_held-out_agx_xavier.txt", "tegrastats")}
    done = subprocess.run([sys.executable, "inproc.py"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "w.json")
    assert {s.sensor for s in prof.sources} == {"tegrastats"}
    assert not [p for p in prof.processes if "tegrastats" in (p.command or "")]
    assert "tegrastats" not in json.dumps(prof.extra.get("child_processes", []))
    assert mean_power(prof) == pytest.approx(6.928, rel=1e-6)
