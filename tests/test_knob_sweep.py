"""`--knob` on a run and `energyprof sweep`, end to end: real runs of energyprof over a tiny program, a replayed
power trace (so a window's machine energy is exactly 50 W x its time) and a fake cpufreq tree as the knob."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from energyprof.facts.profile import load

import knob_trees as trees

ROOT = Path(__file__).resolve().parent.parent
WATTS = 50.0

# The program reports the knob it runs under (the fake tree's file) and works in one window named train.
PROGRAM = """
import os, sys, time
from energyprof.torch import window
n = int(sys.argv[1])
seen = open(os.path.join(os.environ["ENERGYPROF_CPUFREQ_ROOT"], "cpu0/cpufreq/scaling_max_freq")).read().strip()
with open("seen.log", "a") as f:
    f.write(f"{n} {seen}\\n")
if len(sys.argv) > 2 and sys.argv[2] == "hang":
    print("ready", flush=True)
    time.sleep(120)
if len(sys.argv) > 2 and sys.argv[2] == "kill-self":
    os.kill(os.getpid(), 9)

def burn(t):
    end = time.perf_counter() + t
    while time.perf_counter() < end:
        pass

burn(0.02)
with window("train"):
    burn(0.02 * n)
"""


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    trees.cpufreq_tree(tmp_path / "cpu", cpus=2)
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "trace.csv").write_text(f"t_s,cpu\n0,{WATTS:g}\n")
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT))
    return tmp_path, env


def energyprof(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "energyprof", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_run_sets_records_and_restores_the_knob(setup):
    d, env = setup
    res = energyprof(["-q", "--power-trace", "trace.csv", "--knob", "cpu_max_freq=1200000", "--json", "p.json",
                      "-o", "p.html", "prog.py", "1"], d, env)
    assert res.returncode == 0, res.stderr
    assert (d / "seen.log").read_text() == "1 1200000\n"  # in effect while the program ran
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]  # and put back
    assert load(str(d / "p.json")).meta["knobs"] == {
        "cpu_max_freq:all": {"value": 1_200_000, "original": 3_000_000, "unit": "kHz"}}


@pytest.mark.parametrize("knob, why", [("gpu_power=100", "unknown knob 'gpu_power'"),
                                       ("cpu_max_freq=9000000", "outside its range 800000-3600000 kHz"),
                                       ("cpu_max_freq=1000000,2000000", "one value per run"),
                                       ("cpu_max_freq:9=1000000", "no knob cpu_max_freq:9"),
                                       ("cpu_power_limit=20", "no knob cpu_power_limit")])
def test_bad_knob_is_one_line_before_the_program(setup, knob, why):
    d, env = setup
    res = energyprof(["-q", "--knob", knob, "prog.py", "1"], d, env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and why in res.stderr, res.stderr
    assert not (d / "seen.log").exists()
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]


def test_kill_9_of_the_program_restores(setup):
    d, env = setup
    res = energyprof(["-q", "--power-trace", "trace.csv", "--knob", "cpu_max_freq=1000000", "-o", "p.html",
                      "prog.py", "1", "kill-self"], d, env)
    assert res.returncode != 0 and (d / "seen.log").read_text() == "1 1000000\n"
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]


def test_kill_9_of_energyprof_restores(setup):
    d, env = setup
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--knob",
                             "cpu_max_freq=1000000", "-o", "p.html", "prog.py", "1", "hang"], cwd=d, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert trees.max_freqs(d / "cpu") == [1_000_000, 1_000_000]
        proc.kill()  # energyprof itself, not its program
        proc.wait(timeout=60)
        assert trees.wait_for(lambda: trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the orphaned program, in energyprof's session
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("how", ["kill", "sigterm"])
def test_overlapping_knobs_then_kill_9_of_energyprof_restore_every_file(setup, how):
    """`cpu_max_freq` (every CPU) then `cpu_max_freq:0` write CPU 0's file twice: its original is the one found
    before the first change, so CPU 0 comes back to 3 GHz, not to the 2 GHz of the first knob."""
    d, env = setup
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--knob",
                             "cpu_max_freq=2000000", "--knob", "cpu_max_freq:0=1000000", "--json", "p.json", "-o",
                             "p.html", "prog.py", "1", "hang"], cwd=d, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert trees.max_freqs(d / "cpu") == [1_000_000, 2_000_000]
        proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)  # energyprof itself, not its program
        proc.wait(timeout=60)
        assert trees.wait_for(lambda: trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]), trees.max_freqs(d / "cpu")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_overlapping_knobs_record_the_originals_found_before_any_change(setup):
    d, env = setup
    res = energyprof(["-q", "--power-trace", "trace.csv", "--knob", "cpu_max_freq=2000000", "--knob",
                      "cpu_max_freq:0=1000000", "--json", "p.json", "-o", "p.html", "prog.py", "1"], d, env)
    assert res.returncode == 0, res.stderr
    assert (d / "seen.log").read_text() == "1 1000000\n"
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]
    assert load(str(d / "p.json")).meta["knobs"] == {
        "cpu_max_freq:all": {"value": 2_000_000, "original": 3_000_000, "unit": "kHz"},
        "cpu_max_freq:0": {"value": 1_000_000, "original": 3_000_000, "unit": "kHz"}}


def test_sweep_grid_by_knob_interleaved_with_exact_energies(setup):
    d, env = setup
    res = energyprof(["sweep", "--grid", "n=1,3", "--knob", "cpu_max_freq=1000000,2000000", "--repeats", "2",
                      "--window", "train", "--energy", "machine", "--objective", "edp", "--out", "out",
                      "--power-trace", "trace.csv", "--", sys.executable, "prog.py", "{n}"], d, env)
    assert res.returncode == 0, res.stderr
    # interleaved: each repeat goes through all four configurations, in the grid's order, each under its knob value
    order = ["1 1000000", "1 2000000", "3 1000000", "3 2000000"]
    assert (d / "seen.log").read_text().splitlines() == order * 2
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]
    table = json.loads((d / "out/sweep.json").read_text())
    configs = table["configurations"]
    assert [c["values"] for c in configs] == [{"n": n, "cpu_max_freq": f} for n in ("1", "3")
                                             for f in ("1000000", "2000000")]
    for c in configs:
        runs = c["runs"]
        assert c["n"] == 2 and [r["repeat"] for r in runs] == [0, 1]
        for r in runs:  # a replayed 50 W: the window's machine energy is exactly 50 W x its time
            assert r["energy_j"] == pytest.approx(WATTS * r["time_s"], rel=1e-9)
            assert r["time_s"] >= 0.02 * int(c["values"]["n"])  # the window holds at least its busy loop
        ts = [r["time_s"] for r in runs]
        assert c["time_s"]["mean"] == pytest.approx(sum(ts) / 2)
        assert c["time_s"]["std"] == pytest.approx(abs(ts[0] - ts[1]) / 2 ** 0.5)
        assert c["energy_j"]["mean"] == pytest.approx(WATTS * c["time_s"]["mean"])
    edp = [c["energy_j"]["mean"] * c["time_s"]["mean"] for c in configs]
    assert table["best"]["config"] == edp.index(min(edp)) and table["best"]["score"] == pytest.approx(min(edp))
    # energy proportional to time: the front is the fastest configuration alone
    fastest = min(range(4), key=lambda i: configs[i]["time_s"]["mean"])
    assert [c["pareto"] for c in configs] == [i == fastest for i in range(4)]
    rows = list(csv.DictReader((d / "out/sweep.csv").open()))
    assert [r["n"] for r in rows] == ["1", "1", "3", "3"] and sum(int(r["best"]) for r in rows) == 1
    assert float(rows[2]["energy_j_mean"]) == pytest.approx(configs[2]["energy_j"]["mean"], rel=1e-5)
    profiles = sorted(p.name for p in (d / "out").glob("run-*.json"))
    assert len(profiles) == 8
    assert load(str(d / "out/run-c01-r1.json")).meta["knobs"]["cpu_max_freq:all"]["value"] == 2_000_000
    page = (d / "out/sweep.html").read_text()
    assert "id='sweep'" in page and "n=1,cpu_max_freq=1000000 (n=2" in page


def test_sweep_program_energy_is_within_the_machines(setup):
    d, env = setup
    res = energyprof(["sweep", "--grid", "n=1,2", "--out", "o", "--power-trace", "trace.csv", "--objective",
                      "slowdown:1.5", "--", sys.executable, "prog.py", "{n}"], d, env)
    assert res.returncode == 0, res.stderr
    table = json.loads((d / "o/sweep.json").read_text())
    assert table["energy"] == "program" and table["power"] == "replayed power trace"
    for c in table["configurations"]:
        p = load(str(d / f"o/run-c{c['config']:02d}-r0.json"))
        assert 0 < c["energy_j"]["mean"] <= WATTS * p.meta["duration_s"] * (1 + 1e-9)
        assert c["time_s"]["std"] == 0.0 and c["n"] == 1
    fastest = min(c["time_s"]["mean"] for c in table["configurations"])
    eligible = [c for c in table["configurations"] if c["time_s"]["mean"] <= 1.5 * fastest]
    assert table["best"]["config"] == min(eligible, key=lambda c: c["energy_j"]["mean"])["config"]
    assert "best under slowdown:1.5" in res.stderr


@pytest.mark.parametrize("args, why", [
    (["--grid", "n=1,2", "--", "python", "prog.py"], "the command has no {n}"),
    (["--grid", "n=1", "--"], "needs the program after --"),
    (["--grid", "n=1", "--objective", "slowdown:0.5", "--", "x", "{n}"], "slowdown factor must be >= 1"),
    (["--grid", "n=1", "--objective", "fast", "--", "x", "{n}"], "one of energy, time, edp"),
    (["--knob", "cpu_max_freq=1:5:1", "--", "x"], "outside its range"),
    (["--knob", "cpu_max_freq=1000000", "--knob", "cpu_max_freq:0=2000000", "--", "x"],
     "cpu_max_freq and cpu_max_freq:0 set the same knob"),  # one knob under two names
    (["--", "x"], "nothing to sweep"),
    (["--grid", "n=1", "--repeats", "0", "--", "x", "{n}"], "--repeats must be at least 1")])
def test_sweep_bad_input_is_one_line(setup, args, why):
    d, env = setup
    res = energyprof(["sweep", *args], d, env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and why in res.stderr, res.stderr
    assert not (d / "sweep").exists() and not (d / "seen.log").exists()


def test_kill_9_of_the_whole_sweep_restores(setup):
    d, env = setup
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "sweep", "--knob", "cpu_max_freq=1000000", "--out", "o",
                             "--power-trace", "trace.csv", "--", sys.executable, "prog.py", "1", "hang"], cwd=d, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert trees.max_freqs(d / "cpu") == [1_000_000, 1_000_000]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep, its energyprof and the program, all at once
        proc.wait(timeout=60)
    assert trees.wait_for(lambda: trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000])


def test_sigterm_to_energyprof_restores(setup):
    d, env = setup
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--knob",
                             "cpu_max_freq=1000000", "-o", "p.html", "prog.py", "1", "hang"], cwd=d, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        proc.terminate()
        proc.wait(timeout=60)
        assert trees.wait_for(lambda: trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ctrl_c_keeps_the_runs_that_finished(setup):
    d, env = setup
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "sweep", "--grid", "mode=x,hang", "--knob",
                             "cpu_max_freq=1000000", "--out", "o", "--power-trace", "trace.csv", "--window", "train",
                             "--", sys.executable, "prog.py", "1", "{mode}"], cwd=d, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"  # the second configuration hangs
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err
    table = json.loads((d / "o/sweep.json").read_text())
    assert [c["values"]["mode"] for c in table["configurations"]] == ["x"] and table["best"]["values"]["mode"] == "x"
    assert trees.wait_for(lambda: trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000])


def test_sweep_runs_its_configurations_as_ray_tasks(setup):
    """`--ray local`: each run a Ray task (here on a local cluster); each trial's energy its own (a replayed
    50 W: its window's machine energy is exactly 50 W x its time), its knob set and put back where it ran."""
    pytest.importorskip("ray", reason="the [ray] extra is not installed")
    import shutil
    import socket
    import tempfile

    d, env = setup
    ray_tmp = tempfile.mkdtemp(prefix="ep-ray-", dir="/tmp")  # Ray's sockets: a short path of the test's own
    try:
        # One knob axis of two values (the grid's cross product with a knob, interleaved, is the local
        # sweep's test above: the same plan): a Ray start and two runs, each a task on its own
        res = energyprof(["sweep", "--ray", "local", "--grid", "n=1", "--knob", "cpu_max_freq=1000000,2000000",
                      "--window", "train", "--energy", "machine", "--out", "out", "--power-trace", "trace.csv", "--",
                          sys.executable, "prog.py", "{n}"], d, {**env, "RAY_TMPDIR": ray_tmp})
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert res.returncode == 0, res.stderr
    # runs that set a knob go one at a time (a knob is the machine's), in the order submitted
    assert (d / "seen.log").read_text().splitlines() == ["1 1000000", "1 2000000"]
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]
    table = json.loads((d / "out/sweep.json").read_text())
    assert [c["values"]["cpu_max_freq"] for c in table["configurations"]] == ["1000000", "2000000"]
    for c in table["configurations"]:
        for r in c["runs"]:
            assert r["energy_j"] == pytest.approx(WATTS * r["time_s"], rel=1e-9)
    profiles = sorted((d / "out").glob("run-*.json"))
    assert len(profiles) == 2
    for path in profiles:
        assert load(str(path)).meta["sweep"]["ray_host"] == socket.gethostname()


def test_sweep_refuses_two_cpus_of_one_policy(tmp_path):
    """CPUs 0 and 1 of one cpufreq policy (cpuN/cpufreq links to ../cpufreq/policy0, as on ARM) write one
    file: as axes they would not be independent."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=2, per_policy=2)
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT))
    res = energyprof(["sweep", "--knob", "cpu_max_freq:0=1000000", "--knob", "cpu_max_freq:1=2000000", "--",
                      "true"], tmp_path, env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "cpu_max_freq:0 and cpu_max_freq:1 set the same knob" in res.stderr


PLANT = """
import os, sys
link = os.path.join(sys.argv[1], "sweep.csv")
if not os.path.lexists(link):  # another user's link, made while the sweep runs
    os.symlink(sys.argv[2], link)
    os.lchown(link, 65534, 65534)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's link needs root")
def test_sweep_never_follows_another_users_link_in_a_shared_folder(setup):
    """`sweep --knob` runs as root: an --out in a sticky world-writable folder where another user planted
    sweep.json or sweep.csv as a link is refused (before the first run, or when the table is written), and
    the link's target is never written."""
    d, env = setup
    shared = d / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    victim = d / "victim"
    victim.write_text("keep\n")
    os.symlink(victim, shared / "sweep.json")
    os.lchown(shared / "sweep.json", 65534, 65534)
    args = ["sweep", "--grid", "n=1", "--out", str(shared), "--power-trace", "trace.csv", "--"]
    res = energyprof([*args, sys.executable, "prog.py", "{n}"], d, env)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "not followed" in res.stderr, res.stderr
    assert not (d / "seen.log").exists() and victim.read_text() == "keep\n"
    os.unlink(shared / "sweep.json")
    (d / "plant.py").write_text(PLANT)
    res = energyprof([*args, sys.executable, "plant.py", str(shared), str(victim), "{n}"], d, env)
    assert res.returncode == 1 and "could not write the table" in res.stderr, res.stderr
    assert victim.read_text() == "keep\n" and os.path.islink(shared / "sweep.csv")


def test_a_knob_claimed_by_another_process_is_one_line_before_the_program(setup, monkeypatch):
    """A file held by another energyprof process (here the reader's keeper, in this one): a `--knob` run is
    refused with one line and exit 2, the program never runs, and the holder's value stays."""
    from energyprof.knobs import cpufreq
    from energyprof.knobs.keeper import CLAIMS_ENV, Keeper

    d, env = setup
    monkeypatch.setenv(CLAIMS_ENV, str(d / "claims"))
    env = {**env, CLAIMS_ENV: str(d / "claims")}
    holder = Keeper()
    try:
        holder.set(next(k for k in cpufreq.discover(str(d / "cpu")) if k.index == "0"), 1_500_000, owner=1)
        res = energyprof(["-q", "--power-trace", "trace.csv", "--knob", "cpu_max_freq=1200000", "prog.py", "1"], d, env)
        assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
        assert f"being changed by another energyprof process (pid {os.getpid()})" in res.stderr
        assert not (d / "seen.log").exists() and trees.max_freqs(d / "cpu") == [1_500_000, 3_000_000]
    finally:
        holder.close()
    assert trees.max_freqs(d / "cpu") == [3_000_000, 3_000_000]
