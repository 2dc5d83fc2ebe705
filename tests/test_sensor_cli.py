"""`--sensor`, `energyprof sensors` (list, record) and the tier a source declares, through the real CLI."""

from __future__ import annotations

import json
import re

import pytest

from energyprof.collect.sensors import BACKENDS
from energyprof.collect.sensors.replay import load_trace
from energyprof.setup.options import SENSORS
from energyprof.setup.options import OptionError
from energyprof.setup.options import Options
from energyprof.facts.profile import load

import sensor_standins as standins
from conftest import run_cli

XAVIER = "tegrastats_held-out_agx_xavier.txt"  # one line: a constant 6.928 W module


def test_every_name_has_a_backend():
    assert tuple(BACKENDS) == SENSORS


@pytest.mark.parametrize("kwargs,message", [
    ({"sensor": ["rapl", "nvidia"]}, "--sensor must be one of"),
    ({"sensor": ["replay"]}, "--sensor replay needs --power-trace"),
    ({"sensor": ["rapl"], "power_trace": "t.csv"}, "add --sensor replay"),
])
def test_bad_sensor_options(kwargs, message):
    with pytest.raises(OptionError, match=message):
        Options(**kwargs)


def test_an_unknown_sensor_is_one_line_and_exit_2_before_the_program(tmp_path):
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    done = run_cli(["--sensor", "tegra", "prog.py"], tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "'tegra'" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_sensors_lists_what_it_found_and_the_step_for_each_missing(tmp_path):
    bin_dir = tmp_path / "bin"
    standins.install(bin_dir, "tegrastats")
    done = run_cli(["sensors", "--powercap-root", str(tmp_path / "none")], tmp_path,
                   env=standins.env_for(bin_dir, XAVIER, "tegrastats"))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    found, missing = out.split("missing (and the step that enables each):")
    for rail in ("GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"):
        assert f"\n  {rail} " in found
    assert "tegrastats    measured  integrated every 0.1 s" in found
    steps = dict(line.strip().split(None, 1) for line in missing.splitlines() if line.startswith("  "))
    assert "tegrastats" not in steps
    assert {"rapl", "perf", "nvml", "amdsmi", "jtop", "powermetrics", "macmon"} <= set(steps)
    assert "modprobe" in steps["rapl"] and "pip install jetson-stats" in steps["jtop"]
    assert "brew install macmon" in steps["macmon"]


def test_record_writes_a_trace_that_replays_the_same_power(tmp_path):
    """Known answer: a module at a constant 6.928 W (AGX Xavier's six rails, no input rail)
    records rows that each sum to 6.928 W, and a run replaying them measures 6.928 W."""
    bin_dir = tmp_path / "bin"
    standins.install(bin_dir, "tegrastats")
    env = standins.env_for(bin_dir, XAVIER, "tegrastats")
    done = run_cli(["sensors", "record", "-o", "rec.csv", "--seconds", "0.4", "--interval", "0.05",
                    "--sensor", "tegrastats"], tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    trace = load_trace(tmp_path / "rec.csv")
    assert trace.columns == ["CPU", "CV", "GPU", "SOC", "SYS5V", "VDDRQ"]
    assert len(trace.t_s) >= 2 and trace.t_s[0] == 0.0
    for k in range(len(trace.t_s)):
        assert sum(trace.watts[c][k] for c in trace.columns) == pytest.approx(6.928, rel=1e-9)
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(0.2)\n")
    done = run_cli(["-q", "--power-trace", "rec.csv", "--json", "p.json", "-o", "r.html", "prog.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    prof = load(tmp_path / "p.json")
    assert sum(prof.totals.energy_j.values()) == pytest.approx(6.928 * prof.totals.duration_s, rel=1e-6)
    assert {s.sensor for s in prof.sources} == {"replay"}
    # the recorder's comments keep each column measured, by the sensor that read it
    assert {(s.method, s.sensor_text) for s in prof.sources} == {("measured", "replayed (tegrastats)")}


def test_a_recorded_estimate_replays_as_an_estimate_in_console_report_and_json(tmp_path):
    """The model's figures recorded to a trace are still the model's when replayed: never "measured"."""
    done = run_cli(["sensors", "record", "-o", "rec.csv", "--seconds", "0.2", "--interval", "0.05",
                    "--sensor", "model", "--cpu-tdp", "40", "--no-gpu"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "rec.csv").read_text()
    assert "# column cpu: method=estimated sensor=model tier=model" in text
    assert load_trace(tmp_path / "rec.csv").origin["cpu"] == {"method": "estimated", "sensor": "model", "tier": "model"}
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(0.1)\n")
    done = run_cli(["--power-trace", "rec.csv", "--json", "p.json", "-o", "r.html", "prog.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "measured" not in done.stderr
    cpu_line = next(line for line in done.stderr.splitlines() if line.lstrip().startswith("cpu "))
    assert "estimated (replayed model estimate)" in cpu_line
    assert any(line.lstrip().startswith("total") and line.rstrip().endswith("estimated") for line in done.stderr.splitlines())
    raw = json.loads((tmp_path / "p.json").read_text())
    assert {(s["method"], s["sensor"], s["tier"], s["detail"]["recorded_with"]) for s in raw["sources"]} == \
        {("estimated", "replay", "model", "model")}
    html = (tmp_path / "r.html").read_text()
    assert "<td>replayed (model)</td><td>model estimate</td>" in html
    assert re.search(r'cpu: [^<]* \(replayed \(model\)\) <span class="tag estimated">estimated</span>', html)
    assert re.search(r"of the machine&#39;s <span class=\"tag estimated\">estimated</span>", html)  # the program's card


def test_a_trace_without_the_recorders_comments_is_an_external_meters_measurement(tmp_path):
    (tmp_path / "meter.csv").write_text("# a meter's own comment\nt_s,cpu\n0,50\n")
    (tmp_path / "prog.py").write_text("pass\n")
    done = run_cli(["--power-trace", "meter.csv", "--json", "p.json", "-o", "r.html", "prog.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "measured  (replayed (external meter), power samples integrated over time)" in done.stderr
    src = load(tmp_path / "p.json").sources[0]
    assert (src.method, src.tier, src.sensor_text) == ("measured", "integrated", "replayed (external meter)")
    assert "<td>replayed (external meter)</td>" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("comment,message", [
    ("# column gpu:0: method=measured sensor=nvml", "names column gpu:0, which the header lacks"),
    ("# column cpu: method=guessed sensor=model", "must be measured or estimated, not 'guessed'"),
    ("# column cpu: sensor=model", "must be measured or estimated, not None"),
])
def test_a_trace_whose_comments_contradict_it_is_refused_before_the_program(tmp_path, comment, message):
    (tmp_path / "rec.csv").write_text(f"{comment}\nt_s,cpu\n0,50\n")
    (tmp_path / "prog.py").write_text("open('ran', 'w').close()\n")
    done = run_cli(["--power-trace", "rec.csv", "prog.py"], tmp_path)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "ran").exists()


def test_record_refuses_bad_input(tmp_path):
    for args, message in ((["--seconds", "0"], "--seconds"), (["--seconds", "1", "--interval", "100"], "--interval"),
                          (["--seconds", "1", "--sensor", "replay"], "recording already")):
        done = run_cli(["sensors", "record", "-o", "r.csv", *args], tmp_path)
        assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "r.csv").exists()


def test_tier_and_period_in_the_profile_the_console_and_the_methodology(tmp_path):
    bin_dir = tmp_path / "bin"
    standins.install(bin_dir, "tegrastats")
    (tmp_path / "prog.py").write_text("import time\ntime.sleep(0.2)\n")
    done = run_cli(["--sensor", "tegrastats", "--sensor", "model", "--json", "p.json", "-o", "r.html", "prog.py"],
                   tmp_path, env=standins.env_for(bin_dir, XAVIER, "tegrastats"))
    assert done.returncode == 0, done.stderr
    raw = json.loads((tmp_path / "p.json").read_text())
    tiers = {s["id"]: s["tier"] for s in raw["sources"]}
    assert tiers["GPU"] == "integrated" and tiers["cpu"] == "model"
    assert "ram" not in tiers  # VDDRQ already measures the memory: the model adds no RAM estimate
    assert "(tegrastats, power samples integrated over time, every 0.1 s)" in done.stderr
    assert "estimated (model estimate)" in done.stderr  # each word once, not "(model, model estimate)"
    html = (tmp_path / "r.html").read_text()
    assert "<td>power samples integrated over time</td>" in html and "<td>model estimate</td>" in html


def test_a_profile_without_tiers_still_loads(tmp_path):
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "prog.py").write_text("pass\n")
    assert run_cli(["-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "prog.py"],
                   tmp_path).returncode == 0
    raw = json.loads((tmp_path / "p.json").read_text())
    for s in raw["sources"]:
        del s["tier"]
    (tmp_path / "old.json").write_text(json.dumps(raw))
    prof = load(tmp_path / "old.json")
    assert prof.sources[0].tier is None and prof.sources[0].tier_or_guess == "counter"
    done = run_cli(["report", "old.json", "-o", "again.html"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "<td>hardware energy counter</td>" in (tmp_path / "again.html").read_text()


def test_the_benchmark_runs_and_reports_every_backend(tmp_path):
    """A smoke run of benchmarks/sensors.py: it prints a row per backend (figures are not
    checked here: timings belong to the benchmark, not to tests)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "sensors.py"), "--quick"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    names = [line.split("  ")[0] for line in done.stdout.splitlines()[2:]]
    for backend in ("rapl", "rapl via `sensors serve`", "amdsmi (injected binding)", "model", "tegrastats",
                    "tegrastats, parsing", "powermetrics, parsing"):
        assert backend in names, done.stdout


def test_the_recorders_comments_round_trip_for_every_source_name(tmp_path):
    from energyprof.cli.sensors import trace_csv

    sources = [{"id": "cpu", "method": "measured", "sensor": "rapl", "tier": "counter"},
               {"id": "gpu:0", "method": "measured", "sensor": "nvml", "tier": "integrated"},
               {"id": "ram", "method": "estimated", "sensor": "model", "tier": "model"}]
    (tmp_path / "rec.csv").write_text(trace_csv([s["id"] for s in sources], [(0.0, [10.0, 20.0, 3.0])], sources))
    trace = load_trace(tmp_path / "rec.csv")
    assert trace.columns == ["cpu", "gpu:0", "ram"]
    assert trace.origin == {s["id"]: {k: s[k] for k in ("method", "sensor", "tier")} for s in sources}
