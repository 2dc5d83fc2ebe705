"""--emissions-csv: codecarbon's emissions.csv schema, read back with codecarbon's own code.

The run tests use the real CLI in a subprocess on a replayed 50 W "cpu" trace (known joules);
codecarbon's FileOutput, EmissionsData and an OfflineEmissionsTracker (country code, no network)
are the other side of every check.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import energyprof
from energyprof.analysis.carbon import CarbonSettings
from energyprof.analysis.report import RenderOptions, build
from energyprof.output.emissions import COLUMNS
from energyprof.output.emissions import append
from energyprof.output.emissions import rows
from energyprof.carbon.intensity import Intensity
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile

codecarbon = pytest.importorskip("codecarbon", reason="codecarbon's reader is the [carbon] extra")
pd = pytest.importorskip("pandas")

KWH = 3.6e6
SCRIPT = """\
import sys, time
from pathlib import Path
end = time.perf_counter() + 0.3
while time.perf_counter() < end:
    pass
Path(sys.argv[1]).write_text("ran")
"""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1]) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def run_cli(tmp: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp / "script.py").write_text(SCRIPT)
    (tmp / "trace.csv").write_text("t_s,cpu\n0,50\n")
    cmd = [sys.executable, "-m", "energyprof", "--power-trace", "trace.csv", "--json", "p.json", "-o", "report.html",
           "-q", *flags, "script.py", "marker.txt"]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=120, env=_env(), check=False)


def emissions_data(row: dict) -> object:
    """A row as codecarbon's own record: every column must be one of its fields, and all of them there."""
    from codecarbon.output_methods.emissions_data import EmissionsData

    return EmissionsData(**row)


def test_run_row_reads_back_with_codecarbon_and_matches_the_report(tmp_path: Path) -> None:
    from codecarbon.output_methods.file import FileOutput

    proc = run_cli(tmp_path, "--country", "FRA", "--pue", "1.5", "--emissions-csv", "emissions.csv")
    assert proc.returncode == 0, proc.stderr
    saved = json.loads((tmp_path / "p.json").read_text())
    profile = energyprof.load(tmp_path / "p.json")
    df = pd.read_csv(tmp_path / "emissions.csv")
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 1
    row = df.iloc[0].to_dict()
    record = emissions_data(row)
    out = FileOutput("emissions.csv", str(tmp_path))
    assert out.has_valid_headers(record)  # codecarbon would append to this file, not move it aside
    program_j = sum(profile.totals.attributed_j.values())
    assert program_j > 0
    assert row["energy_consumed"] == pytest.approx(program_j * 1.5 / KWH, rel=1e-9)
    assert row["cpu_energy"] == pytest.approx(profile.totals.attributed_j["cpu"] * 1.5 / KWH, rel=1e-9)
    assert row["cpu_power"] == pytest.approx(row["cpu_energy"] * KWH / row["duration"], rel=1e-9)
    assert row["emissions"] == pytest.approx(saved["derived"]["totals"]["carbon_g"] / 1000, rel=1e-9)
    assert row["emissions"] / row["energy_consumed"] == pytest.approx(codecarbon_kg_per_kwh("FRA"), rel=1e-3)
    assert row["emissions_rate"] == pytest.approx(row["emissions"] / row["duration"], rel=1e-9)
    assert row["duration"] == pytest.approx(profile.totals.duration_s)
    assert (row["country_iso_code"], row["country_name"], row["pue"]) == ("FRA", "France", 1.5)
    assert row["gpu_energy"] == 0 and row["tracking_mode"] == "process"

    # A second run appends under the same header; codecarbon's own writer then appends its row too.
    proc = run_cli(tmp_path, "--country", "FRA", "--pue", "1.5", "--emissions-csv", "emissions.csv")
    assert proc.returncode == 0, proc.stderr
    out.out(record, None)
    df = pd.read_csv(tmp_path / "emissions.csv")
    assert len(df) == 3
    assert df["run_id"].nunique() == 2  # two runs, and codecarbon's copy of the first
    assert sorted(p.name for p in tmp_path.iterdir() if "emissions" in p.name) == ["emissions.csv"]  # no backup


def codecarbon_kg_per_kwh(country: str) -> float:
    from codecarbon.core.emissions import Emissions
    from codecarbon.core.units import Energy
    from codecarbon.external.geography import GeoMetadata
    from codecarbon.input import DataSource

    return Emissions(DataSource()).get_private_infra_emissions(Energy.from_energy(kWh=1),
                                                               GeoMetadata(country_iso_code=country))


def test_appends_to_a_file_codecarbon_wrote(tmp_path: Path) -> None:
    """codecarbon's OfflineEmissionsTracker (a country code, no network) writes the file; energyprof's row
    follows in the file's own column order and pandas reads both back under codecarbon's names."""
    from codecarbon import OfflineEmissionsTracker

    tracker = OfflineEmissionsTracker(country_iso_code="FRA", output_dir=str(tmp_path), save_to_file=True,
                                      log_level="error", measure_power_secs=1, project_name="theirs")
    tracker.start()
    sum(i * i for i in range(200_000))
    tracker.stop()
    path = tmp_path / "emissions.csv"
    with open(path, newline="") as f:
        theirs = next(csv.reader(f))
    assert sorted(theirs) == sorted(COLUMNS)
    append(str(path), rows(build(two_epochs(), at_56_g())))
    df = pd.read_csv(path)
    assert len(df) == 2
    assert list(df["project_name"]) == ["theirs", "train.py"]
    mine = df.iloc[1].to_dict()
    assert mine["energy_consumed"] == pytest.approx(22.0 / KWH)  # the program's 20 J cpu + 2 J dram
    assert mine["ram_energy"] == pytest.approx(2.0 / KWH)
    emissions_data(mine)


def two_epochs() -> Profile:
    root = Node("train.py", energy_j={"cpu": 30.0}, self_energy_j={"cpu": 30.0}, time_s=3.0, samples=300)
    windows = [{"name": "epoch", "index": i, "start_s": float(i), "end_s": i + 1.0, "time_s": 1.0,
                "energy_j": {"cpu": 8.0 + i, "dram": 1.0}, "program_energy_j": {"cpu": 6.0 + i, "dram": 0.5}}
               for i in range(2)]
    return Profile(meta={"idle_policy": "share", "target": "train.py", "started_at": "2026-01-01T00:00:00+00:00"},
                   sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "rapl"},
                            {"id": "dram", "component": "dram", "method": "estimated", "sensor": "model"}],
                   totals={"energy_j": {"cpu": 30.0, "dram": 3.0}, "attributed_j": {"cpu": 20.0, "dram": 2.0},
                           "duration_s": 3.0}, root=root, windows=windows)


def at_56_g() -> RenderOptions:
    return RenderOptions(carbon=CarbonSettings(intensity=Intensity(56.0, "fixed", "country", country="FRA")))


def test_window_rows_share_the_run_id_and_hold_each_windows_program_energy() -> None:
    out = rows(build(two_epochs(), at_56_g()), windows=True)
    assert [r["experiment_id"] for r in out] == ["", "epoch[0]", "epoch[1]"]
    assert len({r["run_id"] for r in out}) == 1
    assert [r["timestamp"] for r in out] == ["2026-01-01T00:00:03", "2026-01-01T00:00:01", "2026-01-01T00:00:02"]
    for r, program in zip(out[1:], (6.5, 7.5)):
        assert r["energy_consumed"] == pytest.approx(program / KWH)
        assert r["emissions"] == pytest.approx(program / KWH * 56.0 / 1000)
        assert r["cpu_power"] + r["ram_power"] == pytest.approx(program / 1.0)  # W over the 1 s window
        emissions_data(r)
    assert out[0]["emissions"] == pytest.approx(22.0 / KWH * 56.0 / 1000)
    assert rows(build(two_epochs(), at_56_g()), windows=False) == out[:1]


def test_a_file_of_another_schema_is_refused_before_the_program_runs(tmp_path: Path) -> None:
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    proc = run_cli(tmp_path, "--emissions-csv", "other.csv")
    assert proc.returncode == 2
    assert "--emissions-csv" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "marker.txt").exists()
    assert (tmp_path / "other.csv").read_text() == "a,b\n1,2\n"


def test_windows_flag_needs_the_file(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "--emissions-csv-windows")
    assert proc.returncode == 2 and "--emissions-csv" in proc.stderr
    assert not (tmp_path / "marker.txt").exists()


def test_a_last_line_without_its_newline_is_not_glued_to(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    append(str(path), rows(build(two_epochs(), at_56_g())))
    path.write_text(path.read_text().rstrip("\n"))
    append(str(path), rows(build(two_epochs(), at_56_g())))
    assert len(pd.read_csv(path)) == 2
