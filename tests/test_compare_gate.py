"""The compare gate on real repeated runs, beside two CPU hogs: identical code passes, a ~60% change fails.

Under a constant replayed power trace the program's energy under `share` is its CPU share of the
machine's energy, so its noise between repeats is the machine's: how much of the CPU the hogs (and
anything else running) left the program in each interval (beside two hogs, +41% with confidence for
identical code). The gate's figure, the program's CPU-capacity share of the machine's energy, is the
machine's energy (idle included) times the program's CPU over span x CPUs: under a flat trace, the power
times the program's CPU over the CPUs, which the neighbours do not move."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_cli

WORK = """import sys
def spin(n):
    x = 0
    for i in range(n):
        x += i * i
    return x
spin(int(sys.argv[1]))
"""
TIMED_WORK = """import sys, time
def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
spin(float(sys.argv[1]))
"""
N = 12_000_000  # about a CPU-second and a half on a quiet machine: the work, not the start-up, is the figure


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Six runs of N iterations and six of 1.8 x N, interleaved, while two CPU hogs keep both cores busy.

    The program's energy has a fixed part (start-up, about a fifth of it here), so 1.8 x the work is
    about +60% of the energy (measured: 1.6 x the work gave +42%)."""
    d = tmp_path_factory.mktemp("gate")
    (d / "work.py").write_text(WORK)
    (d / "p.csv").write_text("t_s,cpu\n0,50\n")
    # at the lowest priority: they keep the machine busy, so the program's share is of a machine shared
    # with others, but take little CPU from anything else that wants it (the rest of a test run)
    hogs = [subprocess.Popen([sys.executable, "-c", "import os\nos.nice(19)\nwhile True: pass"]) for _ in range(2)]
    try:
        order = [run for i in range(6) for run in (("a", i), ("b", i))]
        for side, i in order:
            n = N if side == "a" else int(N * 1.8)
            res = run_cli(["-q", "--power-trace", "p.csv", "--json", f"{side}{i}.json", "-o", f"{side}{i}.html",
                           "work.py", str(n)], cwd=d, timeout=300)
            assert res.returncode == 0, res.stderr
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return d


@pytest.mark.slow
def test_identical_code_passes_ten_of_ten_three_against_three(runs: Path) -> None:
    """The ten ways to split six identical runs into two sides of three (each split once, not its mirror),
    against a 10% limit: what three runs a side can hold to on this machine, not a quiet one's 5%.

    Beside four CPU hogs and a test module running torch, one run's energy swings by up to +-9%
    (measured: eight runs in a row, twice), and drifts as the other work changes: the first four
    against the last four moved by -1.5% and +8.6%. A split of the first three runs against the last
    three is a before/after design, which that drift moves by as much as a change (one suite run measured
    +7.9%, interval +5.2% to +10.6%, and failed a 5% limit). The gate cannot tell drift from a change:
    README asks for interleaved repeats for that reason, and the 60% test below is interleaved."""
    splits = [s for s in itertools.combinations(range(6), 3) if 0 in s]
    assert len(splits) == 10
    for base in splits:
        head = [i for i in range(6) if i not in base]
        res = run_cli(["compare", "--base", *(f"a{i}.json" for i in base), "--head", *(f"a{i}.json" for i in head),
                       "--fail-above", "10", "-q"], cwd=runs)
        assert res.returncode == 0, res.stderr
        assert re.search(r"program's CPU-capacity share of the machine's energy [+-]\d+\.\d% \(95% interval"
                         r" [+-]\d+\.\d% to [+-]\d+\.\d%, Welch's t over 3 and 3 runs; the smallest change these"
                         r" repeats can detect: \u00b1\d+\.\d%\); that is the machine's CPU energy, idle included, [^;]*"
                         r"(; the machine's load differed: [^;]*; [^;]*)?; limit \+10%: ok", res.stderr), res.stderr


@pytest.mark.slow
def test_sixty_percent_more_energy_fails(runs: Path) -> None:
    """Six interleaved runs a side. Beside the hogs and another test worker, one run's CPU for the same work
    swung by up to 40% (a head run read 1.42 s against 0.99 s for its two others): three a side left Welch's
    interval -10.6% to +202% around a +96% change, which no limit can fail; six a side give the gate the
    repeats README asks for."""
    res = run_cli(["compare", "--base", *(f"a{i}.json" for i in range(6)), "--head", *(f"b{i}.json" for i in range(6)),
                   "--fail-above", "5", "--markdown", "pr.md"], cwd=runs)
    assert res.returncode == 1, res.stderr + res.stdout
    low = float(re.search(r"95% interval ([+-]\d+\.\d)%", res.stderr).group(1))
    assert low > 5 and "FAIL" in res.stderr
    md = (runs / "pr.md").read_text()
    assert md.startswith("### energyprof: +") and "Welch's t over 6 and 6 runs" in md
    # the user's function leads the function table, ahead of the profiler's and the idle node
    names = re.findall(r"^\| (\S+) \| [\d.]+ \w?J \|", md, flags=re.M)
    assert names and names[0] == "spin", md
    assert md.count("\n") < 40  # fits a pull-request comment


def _capacity_share(path: Path) -> tuple[float, float]:
    """The gate's figure and the machine's CPU power, from the profile's JSON by the documented formula
    (docs/profile-format.md), not by energyprof's code: all of the machine's energy x the program's CPU over
    span x CPUs, and that energy over the span."""
    doc = json.loads(path.read_text())
    load, machine = doc["machine_load"], sum(doc["totals"]["energy_j"].values())
    return machine * load["program_cpu_s"] / (load["span_s"] * load["cpus"]), machine / load["span_s"]


@pytest.mark.slow
def test_one_run_per_side_says_it_cannot_separate_noise(runs: Path) -> None:
    """The exit status against an expectation of its own: under the flat trace the machine's power is the same
    on both sides, so no load difference can explain a change, and the verdict is the change as measured
    against the limit: exit 1 above +5%, else 0 (never 3, inconclusive)."""
    res = run_cli(["compare", "a0.json", "a1.json", "--fail-above", "5", "-q"], cwd=runs)
    assert "cannot separate run-to-run noise" in res.stderr and "smallest change it can detect is unknown" in res.stderr
    (base, base_w), (head, head_w) = _capacity_share(runs / "a0.json"), _capacity_share(runs / "a1.json")
    assert base_w == pytest.approx(50.0) and head_w == pytest.approx(50.0)
    pct = (head / base - 1) * 100
    printed = float(re.search(r"share of the machine's energy ([+-]\d+\.\d)%", res.stderr).group(1))
    assert printed == pytest.approx(pct, abs=0.051), res.stderr
    assert res.returncode == (1 if pct > 5 else 0), res.stderr


@pytest.mark.slow
def test_repeats_say_the_smallest_change_they_can_detect(runs: Path) -> None:
    res = run_cli(["compare", "--base", "a0.json", "a1.json", "a2.json", "--head", "a3.json", "a4.json", "a5.json",
                   "-q", "--fail-above", "5"], cwd=runs)
    m = re.search(r"interval ([+-]\d+\.\d)% to ([+-]\d+\.\d)%.*can detect: \u00b1(\d+\.\d)%", res.stderr)
    assert m, res.stderr
    low, high, detectable = (float(x) for x in m.groups())
    assert detectable == pytest.approx((high - low) / 2, abs=0.11)


def test_one_run_per_side_on_40_and_60_watts_fails_a_ten_percent_limit(tmp_path: Path) -> None:
    """The program's total is the machine's energy shared by CPU clocks, not a sampled figure: its
    interval is never the per-function sampling error (which once read "hides changes within ±44%" and
    let this +50% pass).

    Each side is the same 1.5 s of spinning, and the program is charged the whole machine but
    energyprof's own part (no /proc/stat to share it by, `--idle all`): about power x duration, so
    other load on the machine moves neither side. 60 W over 40 W is then about 1.5 x (1.5 + s40) /
    (1.5 + s60), s being the rest of each run (start and exit, 0.05 s on a quiet machine): above
    1.10 while the two differ by less than half a second."""
    (tmp_path / "work.py").write_text(TIMED_WORK)
    for watts in (40, 60):
        (tmp_path / f"p{watts}.csv").write_text(f"t_s,cpu\n0,{watts}\n")
        res = run_cli(["-q", "--idle", "all", "--power-trace", f"p{watts}.csv", "--json", f"w{watts}.json",
                       "-o", "/dev/null", "work.py", "1.5"], cwd=tmp_path, timeout=300, env={"ENERGYPROF_PORTABLE": "1"})
        assert res.returncode == 0, res.stderr
    res = run_cli(["compare", "w40.json", "w60.json", "--idle", "all", "--fail-above", "10", "-q"], cwd=tmp_path)
    pct = float(re.search(r"program energy ([+-]\d+\.\d)%", res.stderr).group(1))
    assert pct > 10
    assert res.returncode == 1 and res.stderr.rstrip().endswith("FAIL"), res.stderr
    assert "sampling error" not in res.stderr and "cannot separate run-to-run noise" in res.stderr
