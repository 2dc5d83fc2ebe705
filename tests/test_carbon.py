"""Carbon and cost: exact arithmetic per node, codecarbon's figures, clear errors, trace weighting.

The CLI tests run the real `python -m energyprof` in a subprocess on a replayed power trace
(a constant 50 W "cpu"), so the joules are known and the run takes well under a second.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import energyprof
from energyprof.carbon import data as carbon_data
from energyprof.carbon import intensity
from energyprof.analysis.carbon import CarbonSettings
from energyprof.analysis.report import RenderOptions, build
from energyprof.carbon.intensity import Intensity
from energyprof.facts.profile import Node
from energyprof.facts.profile import Profile

J_PER_KWH = 3.6e6

SCRIPT = """\
import sys, time
from pathlib import Path

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

def outer():
    spin(0.12)
    inner()

def inner():
    spin(0.12)

Path(sys.argv[1]).write_text("ran")
outer()
"""


def _kwh(energy_j: dict[str, float]) -> float:
    return sum(energy_j.values()) / J_PER_KWH


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONSTARTUP", None)
    return env


def run_cli(tmp: Path, *flags: str, name: str = "p.json") -> subprocess.CompletedProcess[str]:
    """Profile SCRIPT under the real CLI with a replayed 50 W CPU trace."""
    (tmp / "script.py").write_text(SCRIPT)
    (tmp / "trace.csv").write_text("t_s,cpu\n0,50\n")
    cmd = [sys.executable, "-m", "energyprof", "--power-trace", "trace.csv", "--json", name,
           "-o", "report.html", *flags, "script.py", "marker.txt"]
    return subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=60, env=_env(), check=False)


def profile_from(tmp: Path, *flags: str) -> Profile:
    proc = run_cli(tmp, *flags)
    assert proc.returncode == 0, proc.stderr
    return energyprof.load(tmp / "p.json")


def codecarbon_g_per_kwh(country: str, region: str | None = None) -> float:
    """codecarbon's own figure, through its API (not through its data files)."""
    pytest.importorskip("codecarbon", reason="comparing with codecarbon needs the [carbon] extra")
    from codecarbon.core.emissions import Emissions
    from codecarbon.core.units import Energy
    from codecarbon.external.geography import GeoMetadata
    from codecarbon.input import DataSource

    kg = Emissions(DataSource()).get_private_infra_emissions(
        Energy.from_energy(kWh=1), GeoMetadata(country_iso_code=country, region=region))
    return kg * 1000.0


# --- fixed intensity, PUE, cost ----------------------------------------------------------------

def derived_of(tmp: Path, name: str = "p.json") -> dict:
    """The figures the run computed from its facts with its settings (saved beside them, ignored on load)."""
    return json.loads((tmp / name).read_text())["derived"]


def fixed(g_per_kwh: float, pue: float = 1.0, price: float | None = None, currency: str = "EUR") -> CarbonSettings:
    return CarbonSettings(Intensity(g_per_kwh, "given (--carbon-intensity)", "as given by the user"), pue=pue,
                          price_per_kwh=price, currency=currency)


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Profile, dict, str]:
    tmp = tmp_path_factory.mktemp("fixed")
    proc = run_cli(tmp, "--carbon-intensity", "100", "--pue", "1.5", "--price-per-kwh", "0.3", "--currency", "USD")
    assert proc.returncode == 0, proc.stderr
    return energyprof.load(tmp / "p.json"), derived_of(tmp), proc.stderr


def test_program_is_the_headline_and_the_machine_sits_beside_it(fixed_run) -> None:
    profile, derived, stderr = fixed_run
    assert any(n.function == "inner" for n, _ in profile.nodes())
    assert profile.total_energy_j > 1.0  # 50 W for a quarter of a second or so
    t = profile.totals
    # one formula, two energies: the program's attributed joules and everything measured
    assert derived["totals"]["carbon_g"] == pytest.approx(_kwh(t["attributed_j"]) * 150.0, rel=1e-12)
    assert derived["totals"]["machine_carbon_g"] == pytest.approx(_kwh(t["energy_j"]) * 150.0, rel=1e-12)
    assert derived["totals"]["cost"] == pytest.approx(_kwh(t["attributed_j"]) * 1.5 * 0.3, rel=1e-12)
    assert derived["totals"]["machine_cost"] == pytest.approx(_kwh(t["energy_j"]) * 1.5 * 0.3, rel=1e-12)
    c = derived["carbon"]
    assert c["intensity_g_per_kwh"] == 100.0 and c["pue"] == 1.5 and c["time_series"] is False
    assert "given" in c["source"] and c["currency"] == "USD"
    assert "carbon  " in stderr and "program" in stderr and "machine" in stderr


def test_saved_facts_carry_no_carbon_and_a_re_render_is_a_render(fixed_run, tmp_path: Path) -> None:
    profile, derived, _ = fixed_run
    assert not hasattr(profile.root, "carbon_g") and "carbon_g" not in profile.totals
    assert profile.meta["carbon_settings"] == {"carbon_intensity": 100.0, "pue": 1.5, "price_per_kwh": 0.3,
                                               "currency": "USD"}
    profile.save(tmp_path / "p.json")
    before = (tmp_path / "p.json").read_bytes()
    # the run's settings are the starting point; --price-per-kwh alone keeps its intensity and PUE
    proc = subprocess.run([sys.executable, "-m", "energyprof", "report", "p.json", "--price-per-kwh", "0.6",
                           "--json", "q.json", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    again = derived_of(tmp_path, "q.json")
    assert again["totals"]["carbon_g"] == pytest.approx(derived["totals"]["carbon_g"], rel=1e-12)
    assert again["totals"]["cost"] == pytest.approx(2 * derived["totals"]["cost"], rel=1e-12)
    # a new location replaces the old one as a whole
    proc = subprocess.run([sys.executable, "-m", "energyprof", "report", "p.json", "--country", "FRA",
                           "--json", "r.json", "-q"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    assert derived_of(tmp_path, "r.json")["carbon"]["country"] == "FRA"
    assert (tmp_path / "p.json").read_bytes() == before  # rendering never edits the profile


def test_node_and_window_figures_use_the_same_formula(fixed_run) -> None:
    profile, _, _ = fixed_run
    model = build(profile, RenderOptions(carbon=fixed(100.0, pue=1.5, price=0.3)))
    c = model.carbon
    assert c is not None
    for node, _ in profile.nodes():
        assert c.grams(node.energy_j) == pytest.approx(_kwh(node.energy_j) * 150.0, rel=1e-12, abs=1e-15)
        assert c.cost(node.energy_j) == pytest.approx(_kwh(node.energy_j) * 1.5 * 0.3, rel=1e-12, abs=1e-15)
    assert c.program_g == pytest.approx(c.grams(profile.totals["attributed_j"]))
    assert build(profile, RenderOptions(carbon=fixed(100.0))).carbon.program_cost is None


def test_equivalents_are_cited_and_consistent(fixed_run) -> None:
    profile, derived, _ = fixed_run
    eqs = derived["carbon"]["equivalents"]
    assert len(eqs) >= 2
    grams = derived["totals"]["carbon_g"]  # the program's, like the headline
    kwh = _kwh(profile.totals["attributed_j"]) * 1.5
    for e in eqs:
        assert e["source"] and e["unit"] and e["factor"] > 0
        expected = (grams if e["basis"] == "carbon" else kwh) / e["factor"]
        assert e["value"] == pytest.approx(expected, rel=1e-12)
    car = next(e for e in eqs if "US passenger car" in e["name"])
    assert car["factor"] == pytest.approx(251.0, abs=0.1)  # 8,887 g/gal / 22.0 mpg, per km
    assert "EPA-420-F-23-014" in car["source"]


@pytest.mark.parametrize("value,text", [
    (2.013e-06, "0.0000020 EUR"), (0.25, "0.25 EUR"), (1234.5, "1,234.50 EUR"), (0.0, "0.00 EUR"),
    (0.0123, "0.01 EUR"), (3e-12, "< 0.0000000001 EUR"),
])
def test_money_prints_with_sensible_digits(value: float, text: str) -> None:
    from energyprof.render.format import fmt_money

    assert fmt_money(value, "EUR") == text


# --- locations: codecarbon's figures -----------------------------------------------------------

def test_country_fra_is_codecarbons_figure(tmp_path: Path) -> None:
    profile = profile_from(tmp_path, "--country", "FRA")
    expected = codecarbon_g_per_kwh("FRA")
    assert 40 < expected < 80  # France's grid is mostly nuclear: a sanity bound, not the figure
    c = derived_of(tmp_path)["carbon"]
    assert c["intensity_g_per_kwh"] == pytest.approx(expected, rel=1e-12)
    assert c["country"] == "FRA" and "lifecycle" in c["scope"]
    assert derived_of(tmp_path)["totals"]["carbon_g"] == pytest.approx(
        _kwh(profile.totals["attributed_j"]) * expected, rel=1e-12)


@pytest.mark.parametrize("country,region,scope_word", [
    ("USA", "california", "combustion"),
    ("CAN", "quebec", "combustion"),
    ("SWE", "SE3", "lifecycle"),
    ("CHN", "inner mongolia", "CO2 only"),
])
def test_regions_match_codecarbon(country: str, region: str, scope_word: str) -> None:
    found = intensity.region_intensity(region, country)
    assert found.g_per_kwh == pytest.approx(codecarbon_g_per_kwh(country, region), rel=1e-12)
    assert scope_word in found.scope
    # the region alone names its country
    assert intensity.region_intensity(region).g_per_kwh == found.g_per_kwh


def test_gcp_region_matches_codecarbon() -> None:
    pytest.importorskip("codecarbon", reason="comparing with codecarbon needs the [carbon] extra")
    from codecarbon.core.emissions import Emissions
    from codecarbon.core.units import Energy
    from codecarbon.external.geography import CloudMetadata
    from codecarbon.input import DataSource

    kg = Emissions(DataSource()).get_cloud_emissions(Energy.from_energy(kWh=1),
                                                     CloudMetadata(provider="gcp", region="europe-west1"))
    found = intensity.cloud_intensity("gcp:europe-west1")
    assert found.g_per_kwh == pytest.approx(kg * 1000, rel=1e-12)
    assert found.country == "BEL" and found.cloud == "gcp:europe-west1"
    # AWS has no figure in codecarbon: the country stands in, and says so
    aws = intensity.cloud_intensity("aws:eu-west-3", "FRA")
    assert aws.g_per_kwh == intensity.country_intensity("FRA").g_per_kwh and "no per-region" in aws.source


def test_default_is_the_world_average_and_says_so(tmp_path: Path) -> None:
    proc = run_cli(tmp_path)
    assert proc.returncode == 0, proc.stderr
    profile = energyprof.load(tmp_path / "p.json")
    derived = derived_of(tmp_path)
    c = derived["carbon"]
    assert c["source"] == "world average (no location given)"
    assert c["intensity_g_per_kwh"] == 475.0
    for tables in (carbon_data.snapshot(), carbon_data.codecarbon()):  # the constant is codecarbon's figure
        assert tables is None or tables.json(carbon_data.PER_SOURCE)["world_average"] == 475
    assert derived["totals"]["machine_carbon_g"] == pytest.approx(_kwh(profile.totals["energy_j"]) * 475.0,
                                                                  rel=1e-12)
    assert "cost" not in derived["totals"]
    assert "world average (no location given)" in proc.stderr + proc.stdout


def test_lookups_never_import_codecarbon() -> None:
    """Reading the tables must not run codecarbon (trackers, pynvml, requests) in the program."""
    code = ("import sys, energyprof.carbon.intensity as c, energyprof.analysis.report\n"
            "from energyprof.setup.options import Options\n"
            "c.lookup(Options(country='FRA')); c.lookup(Options(region='california'));"
            " c.lookup(Options(cloud='gcp:europe-west1'))\n"
            "bad = [m for m in ('codecarbon', 'pynvml', 'pandas', 'requests') if m in sys.modules]\n"
            "print(bad); sys.exit(1 if bad else 0)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- errors: one line, exit 2, before the program runs -------------------------------------------

@pytest.mark.parametrize("flags,named", [
    (["--country", "XXX"], "XXX"),
    (["--region", "narnia"], "narnia"),
    (["--country", "DEU", "--region", "bavaria"], "bavaria"),
    (["--cloud", "gcp-europe-west1"], "gcp-europe-west1"),
    (["--cloud", "gcp:mars-central1"], "gcp:mars-central1"),
    (["--cloud", "aws:eu-west-3"], "aws:eu-west-3"),
    (["--carbon-intensity-trace", "bad.csv"], "bad.csv"),
])
def test_bad_location_is_one_line_exit_2_before_the_program(tmp_path: Path, flags: list[str], named: str) -> None:
    (tmp_path / "bad.csv").write_text("timestamp,g_per_kwh\n2024-01-01T00:00:00Z,100\nyesterday,200\n")
    proc = run_cli(tmp_path, *flags)
    assert proc.returncode == 2
    assert not (tmp_path / "marker.txt").exists(), "the program ran despite the bad option"
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert named in lines[0] and lines[0].startswith("energyprof: error:")
    assert "Traceback" not in proc.stderr


# --- intensity trace ---------------------------------------------------------------------------

T0 = dt.datetime(2024, 6, 1, 12, 0, 0, tzinfo=dt.timezone.utc).timestamp()


def hand_profile() -> Profile:
    """Three timeline buckets with known joules; a node and two windows with known joules.

    bucket  span     cpu W  gpu W   cpu J  gpu J
      0     0-1 s     100      0     100      0
      1     1-2 s     300    200     300    200
      2     2-4 s      50    200     100    400
    """
    root = Node("<program>", energy_j={"cpu": 500.0, "gpu:0": 600.0}, children=[
        Node("work", energy_j={"cpu": 200.0, "gpu:0": 600.0}),
        Node("rest", energy_j={"cpu": 300.0, "gpu:0": 0.0}),
    ])
    return Profile(
        meta={"started_at": dt.datetime.fromtimestamp(T0, dt.timezone.utc).isoformat()},
        sources=[{"id": "cpu"}, {"id": "gpu:0"}],
        totals={"energy_j": {"cpu": 500.0, "gpu:0": 600.0}, "attributed_j": {"cpu": 500.0, "gpu:0": 600.0},
                "duration_s": 4.0},
        root=root,
        windows=[{"name": "second", "index": 0, "start_s": 1.0, "end_s": 2.0, "time_s": 1.0,
                  "energy_j": {"cpu": 300.0, "gpu:0": 200.0}},
                 {"name": "first3", "index": 1, "start_s": 0.0, "end_s": 3.0, "time_s": 3.0,
                  "energy_j": {"cpu": 450.0, "gpu:0": 400.0}}],
        timeline={"t_s": [0.5, 1.5, 3.0], "start_s": [0.0, 1.0, 2.0], "end_s": [1.0, 2.0, 4.0],
                  "power_w": {"cpu": [100.0, 300.0, 50.0], "gpu:0": [0.0, 200.0, 200.0]}},
    )


def test_trace_gives_the_hand_computed_weighted_sum(tmp_path: Path) -> None:
    # 200 g/kWh from an hour before the run, 400 from t=1 s, 100 from t=3 s (unix seconds).
    trace = tmp_path / "intensity.csv"
    trace.write_text(f"timestamp,g_per_kwh\n{T0 - 3600},200\n{T0 + 1},400\n{T0 + 3},100\n")
    profile = hand_profile()
    settings = CarbonSettings(trace=intensity.load_trace(trace), trace_name="intensity.csv", pue=1.2)
    model = build(profile, RenderOptions(carbon=settings))
    c = model.carbon
    assert c is not None and c.time_series is True
    # bucket intensities: 200, 400, and bucket 2 (2-4 s) spends half at 400 and half at 100: 250
    cpu_g_kwh = 100 * 200 + 300 * 400 + 100 * 250      # J * g/kWh = 165,000
    gpu_g_kwh = 0 * 200 + 200 * 400 + 400 * 250        # 180,000
    assert c.machine_g == pytest.approx((cpu_g_kwh + gpu_g_kwh) / J_PER_KWH * 1.2, rel=1e-12)
    assert c.machine_g == pytest.approx(0.115, rel=1e-12)
    assert c.program_g == pytest.approx(c.machine_g, rel=1e-12)  # everything attributed in this profile
    assert c.intensity_g_per_kwh == pytest.approx((cpu_g_kwh + gpu_g_kwh) / 1100, rel=1e-12)
    assert c.trace is not None and c.trace["per_node"] == "energy-weighted mean intensity of the run"
    # nodes: each source at its run-mean intensity (cpu 330, gpu 300 g/kWh)
    work = profile.find("work")[0]
    assert c.grams(work.energy_j) == pytest.approx((200 * 330 + 600 * 300) / J_PER_KWH * 1.2, rel=1e-12)
    assert c.grams(profile.root.energy_j) == pytest.approx(c.machine_g, rel=1e-12)
    # windows: exact over the buckets they overlap
    second, first3 = model.windows
    assert second.carbon_g == pytest.approx((300 + 200) * 400 / J_PER_KWH * 1.2, rel=1e-12)
    # first 3 s: buckets 0 and 1 whole, half of bucket 2 (2-3 s, all at 400 g/kWh)
    assert first3.carbon_g == pytest.approx(
        (100 * 200 + 300 * 400 + 50 * 400 + 0 * 200 + 200 * 400 + 200 * 400) / J_PER_KWH * 1.2, rel=1e-12)
    # a fixed intensity is another render of the same facts
    assert build(profile, RenderOptions(carbon=fixed(100.0))).carbon.time_series is False


def test_trace_through_the_cli_re_render(tmp_path: Path) -> None:
    """A real run, then `energyprof report --carbon-intensity-trace` with a step mid-run."""
    profile = profile_from(tmp_path)
    t0 = dt.datetime.fromisoformat(profile.meta["started_at"]).timestamp()
    step = 0.12  # seconds into the run; the run lasts about a quarter of a second

    def iso(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    (tmp_path / "intensity.csv").write_text(f"timestamp,g_per_kwh\n{iso(t0 - 60)},100\n{iso(t0 + step)},500\n")
    proc = subprocess.run([sys.executable, "-m", "energyprof", "report", "p.json", "--carbon-intensity-trace",
                           "intensity.csv", "--json", "p2.json"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env=_env(), check=False)
    assert proc.returncode == 0, proc.stderr
    # the step as written (microsecond ISO text), in seconds from the start
    step = dt.datetime.fromisoformat(iso(t0 + step).replace("Z", "+00:00")).timestamp() - t0
    again = energyprof.load(tmp_path / "p2.json")
    derived = derived_of(tmp_path, "p2.json")
    tl = again.timeline
    expected = 0.0
    bucket_j = 0.0
    for a, b, watts in zip(tl["start_s"], tl["end_s"], tl["power_w"]["cpu"]):
        joules = watts * (b - a)
        bucket_j += joules
        before = max(0.0, min(b, step) - a)   # seconds of this bucket at 100 g/kWh
        after = max(0.0, b - max(a, step))    # seconds at 500 g/kWh
        expected += joules / J_PER_KWH * (100 * before + 500 * after) / (b - a)
    assert bucket_j == pytest.approx(again.totals["energy_j"]["cpu"], rel=1e-9)
    # unix times near 1.7e9 s carry ~0.2 us of float error: 1e-6 of a quarter-second run
    assert derived["totals"]["machine_carbon_g"] == pytest.approx(expected, rel=1e-6)
    mean = derived["carbon"]["intensity_g_per_kwh"]
    assert 100 < mean < 500  # the step fell inside the run, so both values count


@pytest.mark.parametrize("text,error", [
    ("", "no rows"),
    ("timestamp,g_per_kwh\n", "no rows"),
    ("timestamp,g_per_kwh\n1700000000,100\n1699999999,200\n", "line 3: timestamps must increase"),
    ("timestamp,g_per_kwh\n1700000000,lots\n", "line 2: 'lots' is not a number"),
    ("timestamp,g_per_kwh\n1700000000,-5\n", "line 2"),
    ("1700000000,100,7\n", "expected 2 columns"),
])
def test_trace_errors_name_the_line(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=error) as info:
        intensity.load_trace(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_trace_formats_and_step_function(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("2024-06-01T12:00:00Z,100\n2024-06-01T13:00:00+01:00,999\n2024-06-01T12:30:00,300\n")
    with pytest.raises(ValueError, match="line 2: timestamps must increase"):  # 13:00+01:00 is 12:00Z
        intensity.load_trace(path)
    path.write_text("timestamp,g_per_kwh\n2024-06-01T12:00:00Z,100\n2024-06-01T12:30:00,300\n"
                    f"{T0 + 3600},50\n")
    trace = intensity.load_trace(path)
    assert trace.t == [T0, T0 + 1800, T0 + 3600]  # naive ISO times are UTC
    assert trace.at(T0 - 1e6) == 100  # before the first row: the first
    assert trace.at(T0 + 1799) == 100 and trace.at(T0 + 1800) == 300 and trace.at(T0 + 1e6) == 50
    assert trace.mean(T0 + 1700, T0 + 1900) == pytest.approx(200.0)
