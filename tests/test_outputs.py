"""Bad input before the program runs, and outputs that never replace what is not a regular file.

Every CLI case runs the real CLI in a subprocess; a marker file proves whether the program ran.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from conftest import run_cli
from energyprof.options import BOUNDS, Options, OptionError
from energyprof.files import write_text
from energyprof.preflight import keep_old_checkpoint, preflight

PROGRAM = "from pathlib import Path\nPath('ran.txt').write_text('yes')\nprint('hello')\n"


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,40\n")
    (tmp_path / "w.py").write_text(PROGRAM)
    return tmp_path


def _one_line_exit_2(res, here: Path, needle: str) -> None:
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("energyprof: error:") and needle in lines[0], res.stderr
    assert not (here / "ran.txt").exists(), "the program ran despite the bad option"


@pytest.mark.parametrize("flag,value,needle", [
    ("--interval", "1e308", "--interval"), ("--checkpoint-interval", "1e308", "--checkpoint-interval"),
    ("--sensor-timeout", "1e308", "--sensor-timeout"), ("--sensor-interval", "inf", "--sensor-interval"),
    ("--cpu-tdp", "1e9", "--cpu-tdp"), ("--cpu-tdp", "0", "--cpu-tdp"), ("--pue", "1e308", "--pue"),
    ("--pue", "0.5", "--pue"), ("--carbon-intensity", "1e308", "--carbon-intensity"),
    ("--carbon-intensity", "-1", "--carbon-intensity"), ("--price-per-kwh", "1e308", "--price-per-kwh"),
    ("--price-per-kwh", "nan", "--price-per-kwh"), ("--idle", "most", "--idle"),
])
def test_absurd_numbers_are_one_line_exit_2(here: Path, flag: str, value: str, needle: str) -> None:
    res = run_cli(["--power-trace", "trace.csv", flag, value, "w.py"], cwd=here)
    _one_line_exit_2(res, here, needle)


def test_every_bound_is_enforced_and_its_edges_are_allowed() -> None:
    for name, (low, high, _) in BOUNDS.items():
        Options(**{name: high})
        with pytest.raises(OptionError):
            Options(**{name: high * 1.001 + 1})
        with pytest.raises(OptionError):
            Options(**{name: float("inf")})
        if low > 0:
            Options(**{name: low})
        with pytest.raises(OptionError):
            Options(**{name: low - 1e-9 if low > 0 else -1.0})


def test_options_validation_reads_no_file(tmp_path: Path) -> None:
    """Pure: a missing trace or an unwritable folder is preflight's to find, not Options'."""
    opts = Options(output=str(tmp_path / "no" / "r.html"), power_trace=str(tmp_path / "missing.csv"))
    with pytest.raises(OptionError, match="does not exist"):
        preflight(opts)


@pytest.mark.parametrize("args,needle", [
    (["-o", "", "w.py"], "--output"),
    (["--json", "r.html", "-o", "r.html", "w.py"], "same file"),
    (["--csv", "x.csv", "--folded", "./x.csv", "w.py"], "same file"),
])
def test_empty_and_shared_output_paths_are_refused(here: Path, args: list[str], needle: str) -> None:
    res = run_cli(["--power-trace", "trace.csv", *args], cwd=here)
    _one_line_exit_2(res, here, needle)


def test_report_onto_its_own_input_is_refused(here: Path) -> None:
    res = run_cli(["--power-trace", "trace.csv", "-q", "--json", "p.json", "-o", "r.html", "w.py"], cwd=here)
    assert res.returncode == 0, res.stderr
    before = (here / "p.json").read_bytes()
    res = run_cli(["report", "p.json", "--json", "p.json"], cwd=here)
    assert res.returncode == 2 and "same file" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert (here / "p.json").read_bytes() == before


def test_outputs_write_through_devices_and_follow_symlinks(here: Path) -> None:
    (here / "real.html").write_text("old")
    os.symlink("real.html", here / "link.html")
    res = run_cli(["--power-trace", "trace.csv", "-q", "-o", "link.html", "--json", "/dev/null", "--csv", "/dev/null",
                   "w.py"], cwd=here)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "hello\n"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)  # still the device
    assert (here / "link.html").is_symlink() and os.readlink(here / "link.html") == "real.html"
    assert "<html" in (here / "real.html").read_text()


def test_writer_keeps_a_fifo_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_text(str(fifo), "through the pipe\n")
    reader.join(10)
    assert got == [b"through the pipe\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_writer_replaces_a_regular_file_atomically_keeping_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "r.html"
    path.write_text("old")
    os.chmod(path, 0o640)
    write_text(str(path), "new")
    assert path.read_text() == "new" and stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left


def test_an_earlier_runs_checkpoint_is_kept_and_said_so(here: Path) -> None:
    """Defect: re-running with the same -o deleted a killed run's checkpoint without a word."""
    old = here / "r.energyprof-checkpoint.json"
    old.write_text(json.dumps({"kind": "energyprof.checkpoint/1", "from": "the killed run"}))
    res = run_cli(["--power-trace", "trace.csv", "-o", "r.html", "w.py"], cwd=here)
    assert res.returncode == 0, res.stderr
    kept = here / "r.energyprof-checkpoint.1.json"
    assert json.loads(kept.read_text())["from"] == "the killed run"
    said = [ln for ln in res.stderr.splitlines() if "checkpoint" in ln]
    assert len(said) == 1 and str(kept.name) in said[0] and "energyprof report" in said[0]
    # a second earlier checkpoint gets the next free name, the first is never overwritten
    old.write_text("{}")
    assert keep_old_checkpoint(str(old)) == str(here / "r.energyprof-checkpoint.2.json")
    assert json.loads(kept.read_text())["from"] == "the killed run"


def test_help_lists_values_the_report_subcommand_and_the_order(here: Path) -> None:
    res = run_cli(["--help"], cwd=here)
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for needle in ("--idle {share,all}", "--sampler {threads,pyinstrument}", "--memory {rss,exact,off}",
                   "report PROFILE.json", "options come before the script"):
        assert needle in text, needle
    res = run_cli(["report", "--help"], cwd=here)
    assert res.returncode == 0 and "--idle {share,all}" in " ".join(res.stdout.split())


def test_right_to_left_characters_in_paths_are_isolated(tmp_path: Path) -> None:
    from conftest_report import profile_from, build as build_tree
    from energyprof.analysis.report import build
    from energyprof.render.html import render_html

    rlo = "evil\u202egnp.py"  # RIGHT-TO-LEFT OVERRIDE: would show as "evilyp.png"
    root = build_tree((rlo, "", {"cpu": 1.0}, 0.1, 1, []))
    page = render_html(build(profile_from(root, [{"id": "cpu", "component": "cpu", "method": "measured",
                                                   "sensor": "replay", "detail": {}}],
                                          meta={"target": rlo, "command": rlo})))
    assert f"<bdi>{rlo}</bdi>" in page  # the header and the command
    assert f"<title>energyprof: \u2068{rlo}\u2069</title>" in page
