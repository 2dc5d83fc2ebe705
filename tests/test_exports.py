"""Exports: speedscope, folded stacks and CSV carry the same energy as the report: the program's."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest_report import XSS_FUNCTION, hostile_profile, small_profile
from energyprof.analysis.report import RenderOptions, build
from energyprof.facts.profile import Profile
from energyprof.render import exports


def m(profile: Profile, **options):
    return build(profile, RenderOptions(**options))


@pytest.fixture(scope="module")
def small() -> Profile:
    return small_profile()


def _total_uj(profile: Profile) -> int:
    """The program's energy (the idle node and energyprof's own are not the program's), in uJ."""
    return round(sum(profile.totals["attributed_j"].values()) * 1e6)


def check_speedscope(doc: dict) -> None:
    """The parts of speedscope's file-format schema a sampled profile must satisfy."""
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    assert all(isinstance(f["name"], str) for f in frames)
    assert all(isinstance(f.get("line", 0), int) and isinstance(f.get("file", ""), str) for f in frames)
    assert isinstance(doc.get("activeProfileIndex", 0), int)
    assert doc["profiles"]
    for p in doc["profiles"]:
        assert p["type"] == "sampled"
        assert p["unit"] in ("none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes")
        assert isinstance(p["name"], str)
        assert len(p["samples"]) == len(p["weights"])
        assert all(isinstance(w, int) and w >= 0 for w in p["weights"])
        assert all(0 <= i < len(frames) for stack in p["samples"] for i in stack)
        assert p["endValue"] - p["startValue"] == sum(p["weights"])


def test_speedscope_weights_sum_to_total_energy(small: Profile) -> None:
    doc = json.loads(exports.speedscope_text(m(small)))
    check_speedscope(doc)
    energy, time = doc["profiles"][:2]
    assert (energy["name"], energy["unit"]) == ("energy (uJ)", "none")
    assert time["unit"] == "microseconds"
    assert sum(energy["weights"]) == _total_uj(small)
    self_time_us = sum(n.self_time_s for n, _ in small.nodes()) * 1e6
    assert abs(sum(time["weights"]) - self_time_us) <= 1
    # one more profile per source, each with the program's energy of that source
    per_source = {p["name"]: sum(p["weights"]) for p in doc["profiles"][2:]}
    for sid, j in small.totals["attributed_j"].items():
        assert per_source[f"energy {sid} (uJ)"] == round(j * 1e6)


def test_speedscope_stacks_are_call_paths(small: Profile) -> None:
    doc = exports.speedscope_document(m(small))
    names = [f["name"] for f in doc["shared"]["frames"]]
    energy = doc["profiles"][0]
    stacks = [[names[i] for i in s] for s in energy["samples"]]
    assert all(s[0] == small.root.function for s in stacks)
    forward = [w for s, w in zip(stacks, energy["weights"]) if s[-1] == "forward"]
    assert forward == [round(9.0 * 1e6)]


def test_folded_lines_sum_to_total_energy(small: Profile) -> None:
    lines = exports.folded_text(m(small)).splitlines()
    weights = [int(line.rsplit(" ", 1)[1]) for line in lines]
    assert sum(weights) == _total_uj(small)
    assert all(w > 0 for w in weights)
    assert any(line.startswith("example.py;<module> (example.py:") for line in lines)


def test_folded_survives_separators_in_names() -> None:
    profile = hostile_profile()
    lines = exports.folded_lines(m(profile))
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == _total_uj(profile)
    for line in lines:
        stack, weight = line.rsplit(" ", 1)
        assert "\n" not in stack and weight.isdigit()
    assert any("a:b c.py" in line for line in lines)  # ';' and a newline in a file name were neutralised


def test_integer_weights_keep_the_sum() -> None:
    values = [0.3e-6] * 10 + [1.7e-6, 0.0, 2.5e-6]
    weights = exports.integer_weights(values, 1e6)
    assert sum(weights) == round(sum(values) * 1e6)
    assert all(w >= 0 for w in weights)


def test_csv_one_row_per_function(small: Profile) -> None:
    rows = list(csv.DictReader(io.StringIO(exports.csv_text(m(small)))))
    keys = {(n.function, n.file, n.line) for n, _ in small.nodes()}
    assert len(rows) == len(keys)
    assert len({(r["function"], r["file"], r["line"]) for r in rows}) == len(rows)
    assert sum(float(r["self_energy_j"]) for r in rows) == pytest.approx(small.total_energy_j)
    assert sum(float(r["self_energy_j[gpu:0]"]) for r in rows) == pytest.approx(small.totals["energy_j"]["gpu:0"])
    # recursion counted once: fib's inclusive energy is the outer call's, not outer + inner
    fib = [r for r in rows if r["function"] == "fib"]
    assert max(float(r["energy_j"]) for r in fib) == pytest.approx(0.6)


def test_csv_keeps_hostile_names_intact() -> None:
    rows = list(csv.DictReader(io.StringIO(exports.csv_text(m(hostile_profile())))))
    assert XSS_FUNCTION in {r["function"] for r in rows}
    assert "a;b\nc.py" in {r["file"] for r in rows}


def test_cli_writes_every_export(tmp_path: Path) -> None:
    (tmp_path / "work.py").write_text("s = 0\nfor i in range(300000):\n    s += i * i\n")
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,30\n")
    run = subprocess.run([sys.executable, "-m", "energyprof", "--power-trace", "trace.csv", "--json", "p.json",
                          "--speedscope", "s.json", "--folded", "f.txt", "--csv", "c.csv", "work.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    from energyprof import load

    profile = load(tmp_path / "p.json")
    doc = json.loads((tmp_path / "s.json").read_text())
    check_speedscope(doc)
    program_j = sum(profile.totals["attributed_j"].values())
    assert abs(sum(doc["profiles"][0]["weights"]) - program_j * 1e6) <= 1
    folded = (tmp_path / "f.txt").read_text().splitlines()
    assert abs(sum(int(line.rsplit(" ", 1)[1]) for line in folded) - program_j * 1e6) <= 1
    rows = list(csv.DictReader((tmp_path / "c.csv").open()))
    # the CSV keeps every row (idle and energyprof's own too): its self energies add up to the machine
    assert rows and sum(float(r["self_energy_j"]) for r in rows) == pytest.approx(profile.total_energy_j, rel=1e-9)
    # ... and its share is the report's: of the program, the root's row being the program itself
    from energyprof.render.charts import function_table

    model = build(profile, RenderOptions())
    root = next(r for r in rows if r["function"] == profile.root.function and not r["file"])
    assert float(root["share"]) == 1.0 and float(root["machine_share"]) == pytest.approx(program_j / profile.total_energy_j)
    table = function_table(model)
    for r, tot_p in zip(rows, table["tot_p"]):
        assert float(r["share"]) * 100 == pytest.approx(tot_p, abs=1e-4)
    assert table["tot_p"][0] == 100.0  # from unrounded energies: never 100.2%


def test_csv_cells_are_never_spreadsheet_formulas():
    import csv as _csv
    import io as _io

    from energyprof.facts.profile import Node
    from energyprof.facts.profile import Profile
    from energyprof.render.exports import csv_text

    evil = Node('=HYPERLINK("http://x","click")', "@evil.py", 1, samples=1, self_samples=1,
                energy_j={"cpu": 1.0}, self_energy_j={"cpu": 1.0})
    p = Profile(meta={"target": "t"}, sources=[{"id": "cpu", "component": "cpu", "method": "measured",
                                                "sensor": "replay", "detail": {}}],
                totals={"energy_j": {"cpu": 1.0}, "attributed_j": {"cpu": 1.0}, "duration_s": 1.0},
                root=Node("t", samples=1, energy_j={"cpu": 1.0}, self_energy_j={"cpu": 0.0}, children=[evil]))
    rows = list(_csv.DictReader(_io.StringIO(csv_text(m(p)))))
    row = [r for r in rows if "HYPERLINK" in r["function"]][0]
    assert row["function"].startswith("'=") and row["file"] == "'@evil.py"


def test_csv_errors_sit_beside_their_figures_and_carbon_is_a_column(small: Profile) -> None:
    """Defect: the ± beside self energy came from inclusive samples. Each figure now has its own."""
    rows = {r["function"]: r for r in csv.DictReader(io.StringIO(exports.csv_text(m(small))))}
    train = rows["train"]  # 10 own samples, 10 + 60 + 5 + 5 + 20 + 3 in its subtree
    assert float(train["self_relative_error"]) == pytest.approx(10 ** -0.5)
    assert float(train["relative_error"]) == pytest.approx(103 ** -0.5)
    # carbon per row, one formula: the fixed intensity times PUE times the row's inclusive energy
    rows = {r["function"]: r for r in csv.DictReader(io.StringIO(exports.csv_text(
        m(small, carbon=_fixed(100.0, pue=1.5, price=0.3)))))}
    assert float(rows["train"]["carbon_g"]) == pytest.approx(float(rows["train"]["energy_j"]) / 3.6e6 * 1.5 * 100)
    assert float(rows["train"]["cost"]) == pytest.approx(float(rows["train"]["energy_j"]) / 3.6e6 * 1.5 * 0.3)


def _fixed(g_per_kwh: float, pue: float = 1.0, price: float | None = None):
    from energyprof.analysis.carbon import CarbonSettings
    from energyprof.carbon.intensity import Intensity

    return CarbonSettings(Intensity(g_per_kwh, "given", "as given"), pue=pue, price_per_kwh=price)


def _two_policies() -> Profile:
    """A replayed run (40 W for 2 s, 2 cores, the program using 1 of the 1.5 busy): both policies' figures."""
    from energyprof.core.recording import Recording, Sample, Tick
    from energyprof.core.tree import attribute

    S = 1_000_000_000
    rec = Recording(sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
    a = rec.stacks.intern([("main", "m.py", 1), ("a", "m.py", 5)])
    b = rec.stacks.intern([("main", "m.py", 1), ("b", "m.py", 9)])
    rec.ticks = [Tick(k * S // 10, (40.0 * k / 10,), k * S // 10, 0, 15 * k * S // 100) for k in range(21)]
    rec.samples = [Sample(k * S // 10, (k + 1) * S // 10, a if k < 12 else b, S // 10) for k in range(20)]
    return attribute(rec, "share", cpus=2)


@pytest.mark.parametrize("policy", ["share", "all"])
def test_the_csv_root_row_is_the_programs_energy(policy: str) -> None:
    """Defect: the CSV's root row held the machine's energy (idle and energyprof's own included), where
    the report's headline and table show the program's under the idle policy."""
    model = m(_two_policies(), idle=policy, carbon=_fixed(100.0, pue=1.5, price=0.3))
    assert model.policy == policy and model.program_j > 0
    rows = list(csv.DictReader(io.StringIO(exports.csv_text(model))))
    root = next(r for r in rows if model.is_root(next(x for x in model.rows if x.function == r["function"]
                                                       and x.file == r["file"])))
    assert float(root["energy_j"]) == pytest.approx(model.program_j, rel=1e-12)
    assert float(root["energy_j[cpu]"]) == pytest.approx(model.totals.attributed_j["cpu"], rel=1e-12)
    assert float(root["share"]) == 1.0
    assert float(root["machine_share"]) == pytest.approx(model.program_j / model.total_energy_j)
    assert float(root["carbon_g"]) == pytest.approx(model.carbon.program_g)
    assert float(root["cost"]) == pytest.approx(model.carbon.program_cost)
    if policy == "share":
        assert model.program_j < model.total_energy_j - 1.0  # the idle is a row of its own, not in the root's
