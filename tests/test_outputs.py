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
from energyprof.setup.options import BOUNDS
from energyprof.setup.options import Options
from energyprof.setup.options import OptionError
from energyprof.store.files import write_text
from energyprof.drive.preflight import keep_old_checkpoint
from energyprof.drive.preflight import preflight

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


# -- outputs that never harm ----------------------------------------------------------------------
LINES = "import sys\nfor i in range(1000):\n    print('line', i)\n"


def test_json_to_dev_stdout_keeps_the_programs_output_in_a_redirected_file(here: Path) -> None:
    """Defect: `--json /dev/stdout` with stdout redirected to a file replaced that file: the
    program's 1,000 lines were lost. The JSON now follows them, through the same descriptor."""
    (here / "lines.py").write_text(LINES)
    import subprocess
    import sys

    with open(here / "alone.txt", "wb") as fh:
        subprocess.run([sys.executable, "lines.py"], cwd=here, stdout=fh, check=True)
    with open(here / "out.txt", "wb") as fh:
        res = subprocess.run([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--json",
                              "/dev/stdout", "-o", "r.html", "lines.py"], cwd=here, stdout=fh, stderr=subprocess.PIPE)
    assert res.returncode == 0 and res.stderr == b""
    alone, out = (here / "alone.txt").read_bytes(), (here / "out.txt").read_bytes()
    assert out.startswith(alone) and len(alone) > 8000
    profile = json.loads(out[len(alone):])
    assert profile["schema"].startswith("energyprof.profile/") and profile["meta"]["exit"] == {"status": "completed"}
    assert not list(here.glob("*checkpoint*")) and not list(here.glob(".out.txt*"))


def test_a_device_report_writes_no_checkpoint_into_dev(here: Path, tmp_path: Path) -> None:
    """Defect: `-o /dev/null` put its default checkpoint into /dev."""
    before = set(os.listdir("/dev"))
    (tmp_path / "spool").mkdir()
    res = run_cli(["-q", "--power-trace", "trace.csv", "--checkpoint-interval", "0.05", "-o", "/dev/null", "w.py"],
                  cwd=here, env={"TMPDIR": str(tmp_path / "spool")})
    assert (res.returncode, res.stdout, res.stderr) == (0, "hello\n", "")
    assert {n for n in set(os.listdir("/dev")) - before if "energyprof" in n} == set()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert os.listdir(tmp_path / "spool") == []  # its checkpoint went to the temporary folder and was removed


def test_a_fifo_as_checkpoint_is_written_through_and_never_removed(here: Path) -> None:
    """Defect: `--checkpoint` on a device node unlinked it (/dev/null was removed)."""
    fifo = here / "ckpt.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    done = threading.Event()

    def drain() -> None:
        while not done.is_set():
            with open(fifo, "rb") as fh:
                got.append(fh.read())

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    (here / "slow.py").write_text("import time\ntime.sleep(0.6)\nprint('done')\n")
    res = run_cli(["-q", "--power-trace", "trace.csv", "--checkpoint", str(fifo), "--checkpoint-interval", "0.1",
                   "slow.py"], cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (0, "done\n", "")
    done.set()
    with open(fifo, "wb"):  # the reader's last open returns, and it sees it is done
        pass
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    text, checkpoints, decoder = b"".join(got).decode(), [], json.JSONDecoder()
    while text:  # one read may hold several checkpoints, written back to back
        doc, end = decoder.raw_decode(text)
        checkpoints.append(doc)
        text = text[end:]
    assert checkpoints and all(c["kind"] == "energyprof.checkpoint/1" for c in checkpoints)


@pytest.mark.parametrize("path", ["/", ".", "..", "a" * 300 + ".html", "d/" + "b" * 250 + ".html"])
def test_bad_report_paths_are_one_line_exit_2(here: Path, path: str) -> None:
    """Defect: `-o /`, `-o .` and long names gave tracebacks."""
    (here / "d").mkdir()
    res = run_cli(["--power-trace", "trace.csv", "-o", path, "w.py"], cwd=here)
    _one_line_exit_2(res, here, "--output")


def test_the_default_checkpoint_goes_beside_the_json_or_to_the_temporary_folder(here: Path, monkeypatch) -> None:
    import tempfile

    from energyprof.cli.run import default_checkpoint

    spool = here / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    long = str(here / ("c" * 220 + ".html"))  # fits, but a checkpoint's name beside it would not
    assert default_checkpoint(str(here / "p.json"), long) == str(here / "p.energyprof-checkpoint.json")
    assert default_checkpoint(None, str(here / "r.html")) == str(here / "r.energyprof-checkpoint.json")
    assert os.path.dirname(default_checkpoint(None, long)) == str(spool)
    assert os.path.dirname(default_checkpoint("/dev/stdout", "/dev/null")) == str(spool)
    # `..` after a symlink is the link target's parent, as the kernel reads it: beside the JSON there
    (here / "real" / "nested").mkdir(parents=True)
    os.symlink(here / "real" / "nested", here / "link")
    made = default_checkpoint(str(here / "link" / ".." / "p.json"), str(here / "r.html"))
    assert os.path.realpath(os.path.dirname(made)) == str(here / "real") and made.endswith("p.energyprof-checkpoint.json")


# -- facts first -----------------------------------------------------------------------------------
VANISHING = """
import shutil, time
time.sleep(0.3)
shutil.rmtree("gone")  # the folder an output was to go to
print("ran")
"""


def test_a_failing_view_is_one_line_and_loses_nothing_else(here: Path) -> None:
    (here / "gone").mkdir()
    (here / "v.py").write_text(VANISHING)
    res = run_cli(["-q", "--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "--csv", "gone/f.csv",
                   "--folded", "f.txt", "v.py"], cwd=here)
    assert (res.returncode, res.stdout) == (0, "ran\n")
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("energyprof: error: could not write --csv gone/f.csv:"), res.stderr
    assert json.loads((here / "p.json").read_text())["meta"]["exit"] == {"status": "completed"}
    assert (here / "r.html").stat().st_size > 1000 and (here / "f.txt").read_text()
    assert not list(here.glob("*checkpoint*"))  # the facts are on disk: the checkpoint served


def test_without_json_a_failing_view_keeps_the_profile_in_the_checkpoint(here: Path) -> None:
    (here / "gone").mkdir()
    (here / "v.py").write_text(VANISHING)
    res = run_cli(["-q", "--power-trace", "trace.csv", "-o", "gone/r.html", "--checkpoint", "keep.json", "v.py"],
                  cwd=here)
    assert (res.returncode, res.stdout) == (0, "ran\n")
    assert res.stderr.splitlines() == [
        res.stderr.splitlines()[0],
        "energyprof: the profile is kept in keep.json (energyprof report keep.json renders it)"]
    assert res.stderr.startswith("energyprof: error: could not write --output gone/r.html:")
    again = run_cli(["report", "keep.json", "--json", "again.json", "-o", "again.html", "-q"], cwd=here)
    assert again.returncode == 0, again.stderr
    assert json.loads((here / "again.json").read_text())["meta"]["exit"] == {"status": "completed"}


def test_a_json_that_cannot_be_written_leaves_the_profile_in_the_checkpoint(here: Path) -> None:
    (here / "gone").mkdir()
    (here / "v.py").write_text(VANISHING)
    res = run_cli(["-q", "--power-trace", "trace.csv", "--json", "gone/p.json", "-o", "r.html", "--checkpoint",
                   "keep.json", "v.py"], cwd=here)
    assert res.returncode == 0
    assert res.stderr.splitlines()[0].startswith("energyprof: error: could not write the JSON profile gone/p.json:")
    assert res.stderr.splitlines()[-1] == "energyprof: the profile is kept in keep.json (energyprof report keep.json renders it)"
    assert json.loads((here / "keep.json").read_text())["meta"]["exit"] == {"status": "completed"}
    assert (here / "r.html").stat().st_size > 1000


def test_writer_writes_through_an_open_descriptor_at_its_offset(tmp_path: Path) -> None:
    target = tmp_path / "t.txt"
    with open(target, "w") as fh:
        fh.write("kept\n")
        fh.flush()
        write_text(f"/proc/self/fd/{fh.fileno()}" if os.path.isdir("/proc/self/fd") else f"/dev/fd/{fh.fileno()}",
                   "appended\n")
    assert target.read_text() == "kept\nappended\n"
    assert sorted(os.listdir(tmp_path)) == ["t.txt"]


def _read_only_bind(src: Path, dst: Path) -> bool:
    """`dst`, a read-only bind mount of `src` (root with CAP_SYS_ADMIN only): False where it cannot be made."""
    import subprocess

    dst.mkdir()
    ok = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,ro,bind", str(dst)], capture_output=True).returncode != 0:
        subprocess.run(["umount", str(dst)], capture_output=True)
        ok = False
    return ok


def test_a_read_only_mount_is_said_so(here: Path) -> None:
    """An output on a read-only file system is refused as such, not as "permission denied" (what the user
    would fix is the mount, not a file's mode): both a new file in the mount and one already there."""
    import subprocess

    src = here / "src"
    src.mkdir()
    (src / "old.json").write_text("{}")
    ro = here / "ro"
    if not _read_only_bind(src, ro):
        pytest.skip("no read-only bind mount here (needs root with CAP_SYS_ADMIN)")
    try:
        for args in (["--json", "ro/new.json"], ["--json", "ro/old.json"], ["-o", "ro/r.html"]):
            res = run_cli(["--power-trace", "trace.csv", *args, "w.py"], cwd=here)
            _one_line_exit_2(res, here, "read-only file system")
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_not_writable_says_read_only_from_the_file_system_s_flags(tmp_path: Path, monkeypatch) -> None:
    """The reason comes from the file system's flags (statvfs ST_RDONLY), as a mount shows it to anyone."""
    from energyprof.store import files

    assert files.why_not_writable(str(tmp_path)) == "permission denied"

    class ReadOnly:
        f_flag = os.ST_RDONLY

    monkeypatch.setattr(files.os, "statvfs", lambda path: ReadOnly())
    assert files.why_not_writable(str(tmp_path)) == "read-only file system"
