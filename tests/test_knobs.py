"""Knobs on fake hardware (cpufreq and powercap trees, an injected amdsmi binding, a stand-in nvpmodel), the
registry's specs, and the keeper: every way the setter can end leaves the knob at its original value."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from energyprof.knobs import amdsmi, cpufreq, nvpmodel, rapl, registry
from energyprof.knobs.base import KnobError
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.keeper import Keeper

import knob_trees as trees

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------- cpufreq


def test_cpufreq_all_and_one(tmp_path, keeper):
    trees.cpufreq_tree(tmp_path, cpus=3)
    knobs = {k.name: k for k in cpufreq.discover(str(tmp_path))}
    assert sorted(knobs) == ["cpu_max_freq:0", "cpu_max_freq:1", "cpu_max_freq:2", "cpu_max_freq:all"]
    all_ = knobs["cpu_max_freq:all"]
    assert (all_.range().low, all_.range().high) == (800_000, 3_600_000)
    keeper.set(all_, 1_200_000)
    assert trees.max_freqs(tmp_path) == [1_200_000] * 3
    keeper.set(all_, 2_000_000)  # a second change keeps the first original
    keeper.restore()
    assert trees.max_freqs(tmp_path) == [3_000_000] * 3
    one = knobs["cpu_max_freq:1"]
    keeper.set(one, 900_000)
    assert trees.max_freqs(tmp_path) == [3_000_000, 900_000, 3_000_000]
    keeper.restore()
    assert trees.max_freqs(tmp_path) == [3_000_000] * 3


def test_cpufreq_restores_each_cpus_own_value(tmp_path, keeper):
    trees.cpufreq_tree(tmp_path, cpus=2)
    (tmp_path / "cpu1/cpufreq/scaling_max_freq").write_text("2500000\n")
    k = next(k for k in cpufreq.discover(str(tmp_path)) if k.index == "all")
    keeper.set(k, 1_000_000)
    keeper.restore()
    assert trees.max_freqs(tmp_path) == [3_000_000, 2_500_000]


def test_cpufreq_out_of_range_is_one_line_and_writes_nothing(tmp_path, keeper):
    trees.cpufreq_tree(tmp_path)
    k = cpufreq.discover(str(tmp_path))[0]
    with pytest.raises(KnobError) as err:
        keeper.set(k, 5_000_000)
    assert "\n" not in str(err.value) and "800000-3600000 kHz" in str(err.value)
    assert trees.max_freqs(tmp_path) == [3_000_000, 3_000_000]


def test_cpufreq_root_from_env(tmp_path, monkeypatch):
    trees.cpufreq_tree(tmp_path)
    monkeypatch.setenv(cpufreq.ROOT_ENV, str(tmp_path))
    assert [k.name for k in cpufreq.discover()][0] == "cpu_max_freq:all"


# ---------------------------------------------------------------- RAPL


def test_rapl_long_term_constraint_within_max(tmp_path, keeper):
    trees.powercap_tree(tmp_path)
    (k,) = rapl.discover(str(tmp_path))  # the sub-zone is no package limit
    assert k.name == "cpu_power_limit:0" and k.read() == 65.0
    assert k.range().high == 125.0
    keeper.set(k, 40.5)
    assert (tmp_path / "intel-rapl:0/constraint_0_power_limit_uw").read_text() == "40500000"
    assert (tmp_path / "intel-rapl:0/constraint_1_power_limit_uw").read_text().strip() == "150000000"
    with pytest.raises(KnobError, match="outside its range 1-125 W"):
        keeper.set(k, 130)
    keeper.restore()
    assert k.read() == 65.0


def test_rapl_picks_long_term_by_name(tmp_path):
    trees.powercap_tree(tmp_path)
    z = tmp_path / "intel-rapl:0"
    for what in ("name", "power_limit_uw", "max_power_uw"):  # swap the constraints' order
        a, b = z / f"constraint_0_{what}", z / f"constraint_1_{what}"
        ta, tb = a.read_text() if a.exists() else None, b.read_text() if b.exists() else None
        for path, text in ((a, tb), (b, ta)):
            path.unlink(missing_ok=True)
            if text is not None:
                path.write_text(text)
    (k,) = rapl.discover(str(tmp_path))
    assert k.constraint == 1 and k.read() == 65.0


# ---------------------------------------------------------------- AMD through an injected binding


class FakeAmdSmi:
    """The amdsmi calls the knob uses, in microwatts as the library gives them; one MI210-like GPU per cap."""

    def __init__(self, caps_uw: list[int], lo=100_000_000, hi=300_000_000, refuse: bool = False) -> None:
        self.caps, self.lo, self.hi, self.refuse = list(caps_uw), lo, hi, refuse
        self.calls: list[tuple] = []

    def amdsmi_init(self):
        pass

    def amdsmi_get_processor_handles(self):
        return [f"h{i}" for i in range(len(self.caps))]

    def amdsmi_get_power_cap_info(self, h):
        return {"power_cap": self.caps[int(h[1:])], "default_power_cap": self.hi, "dpm_cap": 0,
                "min_power_cap": self.lo, "max_power_cap": self.hi}

    def amdsmi_set_power_cap(self, h, sensor, cap):
        self.calls.append((h, sensor, cap))
        if self.refuse:
            raise RuntimeError("AMDSMI_STATUS_NO_PERM")
        self.caps[int(h[1:])] = cap


def test_amdsmi_cap_in_watts(keeper):
    lib = FakeAmdSmi([250_000_000, 200_000_000])
    knobs = amdsmi.discover(lib)
    assert [k.name for k in knobs] == ["gpu_power_limit:0", "gpu_power_limit:1"]
    assert knobs[1].read() == 200.0 and (knobs[1].range().low, knobs[1].range().high) == (100.0, 300.0)
    keeper.set(knobs[1], 150)
    assert lib.caps == [250_000_000, 150_000_000] and lib.calls == [("h1", 0, 150_000_000)]
    keeper.restore()
    assert lib.caps == [250_000_000, 200_000_000]


def test_amdsmi_refusal_is_one_line(keeper):
    (k,) = amdsmi.discover(FakeAmdSmi([250_000_000], refuse=True))
    with pytest.raises(KnobError) as err:
        keeper.set(k, 150)
    assert "NO_PERM" in str(err.value) and "\n" not in str(err.value)


def test_amdsmi_absent():
    class NoGpu(FakeAmdSmi):
        def amdsmi_init(self):
            raise RuntimeError("AMDSMI_STATUS_INIT_ERROR")
    assert amdsmi.discover(NoGpu([])) == []


# ---------------------------------------------------------------- Jetson through a stand-in nvpmodel


def test_nvpmodel_modes_and_set(tmp_path, monkeypatch, keeper):
    state = tmp_path / "mode"
    trees.nvpmodel(tmp_path / "bin", state, mode=0)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    (k,) = nvpmodel.discover()
    assert k.modes == {0: "15W", 1: "7W", 2: "MAXN_SUPER"} and k.read() == 0
    keeper.set(k, 2)
    assert state.read_text() == "2"
    with pytest.raises(KnobError, match="outside its range 0, 1, 2"):
        keeper.set(k, 3)
    keeper.restore()
    assert state.read_text() == "0"


def test_nvpmodel_modes_from_conf():
    conf = "< POWER_MODEL ID=0 NAME=MAXN >\nCPU_ONLINE CORE_0 1\n< POWER_MODEL ID=1 NAME=MODE_15W >\n"
    assert nvpmodel.parse_modes(conf) == {0: "MAXN", 1: "MODE_15W"}
    assert nvpmodel.parse_current("NV Power Mode: MODE_15W\n1\n") == 1


# ---------------------------------------------------------------- specs


def test_parse_spec_range_and_list():
    s = registry.parse_spec("gpu_power_limit=100:250:25")
    assert (s.kind, s.index, s.values) == ("gpu_power_limit", None, [100, 125, 150, 175, 200, 225, 250])
    assert registry.parse_spec("cpu_max_freq:3=1200000,2400000").values == [1_200_000, 2_400_000]
    assert registry.parse_spec("cpu_power_limit=10:25:10").values == [10, 20]  # 30 would pass the top


@pytest.mark.parametrize("bad, why", [("gpu_power=100", "unknown knob"), ("gpu_power_limit", "KIND=VALUES"),
                                      ("gpu_power_limit=", "no values"), ("gpu_power_limit=a,b", "not a number"),
                                      ("gpu_power_limit=250:100:25", "LOW <= HIGH"),
                                      ("gpu_power_limit=1:100000:1", "more than"), ("gpu_power_limit=1:2", "LOW:HIGH")])
def test_parse_spec_errors(bad, why):
    with pytest.raises(KnobError, match=why) as err:
        registry.parse_spec(bad)
    assert "\n" not in str(err.value)


def test_resolve_checks_every_value_first(tmp_path):
    trees.cpufreq_tree(tmp_path)
    knobs = registry.discover(cpufreq_root=str(tmp_path), kinds=("cpu_max_freq",))
    ((spec, chosen),) = registry.resolve([registry.parse_spec("cpu_max_freq=1000000,2000000")], knobs)
    assert [k.name for k in chosen] == ["cpu_max_freq:all"]
    with pytest.raises(KnobError, match="outside its range"):
        registry.resolve([registry.parse_spec("cpu_max_freq=1000000,9000000")], knobs)
    with pytest.raises(KnobError, match=r"no knob cpu_max_freq:7 \(there are: cpu_max_freq:all"):
        registry.resolve([registry.parse_spec("cpu_max_freq:7=1000000")], knobs)
    with pytest.raises(KnobError, match="none on this machine"):
        registry.resolve([registry.parse_spec("cpu_power_limit=50")], knobs)
    assert trees.max_freqs(tmp_path) == [3_000_000, 3_000_000]


# ---------------------------------------------------------------- the keeper: every exit path restores


SETTER = """
import os, signal, sys, time
from energyprof.knobs import cpufreq
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.keeper import Keeper
how = sys.argv[1]
keeper = Keeper()
knob = next(k for k in cpufreq.discover() if k.index == "all")
keeper.set(knob, 1000000)
print("set", flush=True)
sys.stdin.readline()  # the test has seen the change
if how == "raise":
    raise RuntimeError("the program failed")
if how in ("sigterm", "kill"):
    time.sleep(120)
if how == "close":
    keeper.close()
"""


@pytest.mark.parametrize("how", ["normal", "close", "raise", "sigterm", "kill"])
def test_every_exit_restores(tmp_path, how):
    trees.cpufreq_tree(tmp_path / "cpu")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/setter.py").write_text(SETTER)
    (tmp_path / "json.py").write_text("raise SystemExit('a json.py of the folder was imported')\n")
    # a relative root: the keeper, elsewhere, must still find the files; and the folder's json.py must not reach it
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT="cpu", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, str(tmp_path / "bin/setter.py"), how], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "set\n"
    assert trees.max_freqs(tmp_path / "cpu") == [1_000_000, 1_000_000]  # it did change
    proc.stdin.write("\n")
    proc.stdin.flush()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "kill":
        proc.kill()
    proc.wait(timeout=60)
    assert trees.wait_for(lambda: trees.max_freqs(tmp_path / "cpu") == [3_000_000, 3_000_000])


def test_keeper_restores_only_what_is_still_changed(tmp_path, monkeypatch):
    trees.cpufreq_tree(tmp_path)
    monkeypatch.setenv(cpufreq.ROOT_ENV, str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    k = next(k for k in cpufreq.discover() if k.index == "all")
    keeper = Keeper()
    keeper.set(k, 1_500_000)
    keeper.restore()
    (tmp_path / "cpu0/cpufreq/scaling_max_freq").write_text("2000000\n")  # someone else's change afterwards
    keeper.close()
    assert trees.max_freqs(tmp_path) == [2_000_000, 3_000_000]


def test_keeper_refuses_out_of_range_before_starting(tmp_path):
    trees.cpufreq_tree(tmp_path)
    k = cpufreq.discover(str(tmp_path))[0]
    keeper = Keeper()
    with pytest.raises(KnobError):
        keeper.set(k, 1)
    assert keeper._sock is None and trees.max_freqs(tmp_path) == [3_000_000, 3_000_000]


FORKER = """
import os, sys, time
from energyprof.knobs import cpufreq
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.keeper import Keeper
keeper = Keeper()
keeper.set(next(k for k in cpufreq.discover() if k.index == "0"), 1000000)
keeper.set(next(k for k in cpufreq.discover() if k.index == "all"), 2000000)
child = os.fork()
if child == 0:  # a forked worker that outlives its parent
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
time.sleep(120)
"""


def test_a_forked_child_does_not_keep_the_knobs_changed_after_kill_9_of_the_setter(tmp_path):
    """The keeper process restores when the setter's pipe closes: a forked child (a DataLoader worker) that
    lives on must not hold it open. Overlapping knobs: CPU 0 back to its original, not to 1 GHz."""
    trees.cpufreq_tree(tmp_path / "cpu", cur=3_600_000)
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", FORKER], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    child = int(proc.stdout.readline())
    try:
        assert trees.max_freqs(tmp_path / "cpu") == [2_000_000, 2_000_000]
        proc.kill()
        proc.wait(timeout=60)
        assert trees.wait_for(lambda: trees.max_freqs(tmp_path / "cpu") == [3_600_000, 3_600_000])
        os.kill(child, 0)  # the child still lives
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass


# ---------------------------------------------------------------- shared policies, the keeper's start, its loss


def test_cpus_of_one_policy_write_one_file_under_one_key(tmp_path):
    """Real sysfs: cpuN/cpufreq links to ../cpufreq/policyM, and on ARM several CPUs share a policy. Two
    knob names over one file are one part: a second owner is refused, and both leaving leaves the original."""
    trees.cpufreq_tree(tmp_path, cpus=2, cur=3_600_000, per_policy=2)
    policy = tmp_path / "cpufreq/policy0/scaling_max_freq"
    knobs = {k.name: k for k in cpufreq.discover(str(tmp_path))}
    assert {p.key for p in knobs["cpu_max_freq:0"].parts()} == {p.key for p in knobs["cpu_max_freq:1"].parts()} \
        == {str(policy.resolve())}
    keeper = Keeper()
    try:
        keeper.set(knobs["cpu_max_freq:0"], 1_000_000, owner="A")
        with pytest.raises(KnobError, match="set by another client"):
            keeper.set(knobs["cpu_max_freq:1"], 2_000_000, owner="B")
        assert policy.read_text() == "1000000"
        keeper.restore(owner="A")
        assert int(policy.read_text()) == 3_600_000
        keeper.set(knobs["cpu_max_freq:all"], 2_000_000, owner="B")  # one file written twice, one original
        keeper.set(knobs["cpu_max_freq:1"], 1_000_000, owner="B")
        keeper.restore(owner="B")
        assert int(policy.read_text()) == 3_600_000 and not keeper.held
    finally:
        keeper.close()


def test_a_refused_write_part_way_puts_back_the_owners_own_setting(tmp_path, monkeypatch):
    """`cpu_max_freq:all` to 1 GHz refused at CPU 1 after CPU 0 was written: CPU 0 goes back to the 2 GHz this
    owner had set (not left at the refused 1 GHz), and the originals are still held."""
    trees.cpufreq_tree(tmp_path, cpus=2, cur=3_600_000)
    every = next(k for k in cpufreq.discover(str(tmp_path)) if k.index == "all")
    keeper = Keeper()
    try:
        keeper.set(every, 2_000_000, owner="A")
        real = cpufreq.MaxFreq._write_one

        def refuse_cpu1(self, d, value):  # the hardware refusing one CPU's value (as cpufreq may, EINVAL)
            if d.parent.name == "cpu1" and value == 1_000_000:
                raise KnobError("cpu_max_freq:all: cannot write cpu1: Invalid argument")
            real(self, d, value)

        monkeypatch.setattr(cpufreq.MaxFreq, "_write_one", refuse_cpu1)
        with pytest.raises(KnobError, match="Invalid argument"):
            keeper.set(every, 1_000_000, owner="A")
        assert trees.max_freqs(tmp_path) == [2_000_000, 2_000_000]
        keeper.restore(owner="A")
        assert trees.max_freqs(tmp_path) == [3_600_000, 3_600_000]
    finally:
        keeper.close()


def _is_keeper(cmdline: bytes) -> bool:
    return b"energyprof.knobs.keeper import main" in cmdline or cmdline.endswith(b"-m\0energyprof.knobs.keeper\0")


def _keepers(mark: str) -> list[int]:
    """The keeper processes started by a setter whose environment holds `mark`."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if pid.isdigit() and mark.encode() in Path(f"/proc/{pid}/environ").read_bytes() \
                    and _is_keeper(Path(f"/proc/{pid}/cmdline").read_bytes()):
                found.append(int(pid))
        except OSError:
            pass
    return found


def _kill_keepers(mark: str) -> None:
    pids = _keepers(mark)
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    assert trees.wait_for(lambda: all(_gone(p) for p in pids))


def _gone(pid: int) -> bool:
    """Dead, its descriptors closed (a zombie at most: the kernel closes them before it becomes one)."""
    try:
        return "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


OWN_FOLDER = """
import os, sys
sys.path.insert(0, sys.argv[1])  # energyprof from a folder of the program's choosing, not from site-packages
from energyprof.knobs import cpufreq
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.keeper import Keeper
Keeper().set(next(k for k in cpufreq.discover() if k.index == "0"), 1000000)
print("set", flush=True)
sys.stdin.readline()
os._exit(0)  # no atexit: only the keeper process can restore
"""


def test_the_keeper_process_finds_energyprof_where_its_setter_did(tmp_path):
    """A program that has energyprof from its own sys.path edit (an interpreter without it installed) gets a
    keeper process that starts, and is ready before the change: os._exit after it still restores. Nothing
    of the keeper's reaches the program's stderr."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    python = str(tmp_path / "venv/bin/python")
    assert subprocess.run([python, "-c", "import energyprof"], env=trees.env_with(PYTHONPATH=""), cwd="/",
                          capture_output=True).returncode != 0  # a fresh interpreter does not find it
    trees.cpufreq_tree(tmp_path / "cpu", cur=3_600_000)
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH="")
    proc = subprocess.Popen([python, "-c", OWN_FOLDER, str(ROOT)], env=env, cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = proc.communicate("\n", timeout=60)
    assert out == "set\n" and proc.returncode == 0, err
    assert trees.wait_for(lambda: trees.max_freqs(tmp_path / "cpu") == [3_600_000, 3_600_000])
    assert err == ""


def test_a_keeper_that_never_answers_refuses_the_change(tmp_path, monkeypatch):
    """No ready byte (the keeper process cannot start): one line, and nothing is changed."""
    trees.cpufreq_tree(tmp_path, cur=3_600_000)
    monkeypatch.setattr("energyprof.knobs.keeper._BOOT", "raise SystemExit(3)")
    keeper = Keeper()
    with pytest.raises(KnobError, match="did not start"):
        keeper.set(next(k for k in cpufreq.discover(str(tmp_path)) if k.index == "0"), 1_000_000)
    assert trees.max_freqs(tmp_path) == [3_600_000, 3_600_000] and not keeper.held and keeper._sock is None


SIGPIPE_DFL = """
import os, signal, sys
signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as many command-line programs do
from energyprof.knobs import cpufreq
from energyprof.knobs.base import KnobError
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.keeper import Keeper
knobs = {k.name: k for k in cpufreq.discover()}
keeper = Keeper()
keeper.set(knobs["cpu_max_freq:0"], 1000000)
print("set", flush=True)
sys.stdin.readline()  # the test kills the keeper process here
try:
    keeper.set(knobs["cpu_max_freq:1"], 2000000)
    print("set again", flush=True)  # the death was noticed first: a new keeper process holds both
except KnobError as exc:
    print("refused:", exc, flush=True)
keeper.restore()
print("goes on", flush=True)
"""


def test_a_keeper_gone_is_an_error_not_a_sigpipe(tmp_path):
    """With SIGPIPE at its default action, a set after the keeper process died is never a SIGPIPE: either the
    death was noticed first and a new keeper process holds the change, or the set is refused (one line) and
    what was held goes back in-process; the program goes on."""
    trees.cpufreq_tree(tmp_path / "cpu", cur=3_600_000)
    mark = f"EP_TEST_MARK={os.getpid()}-{tmp_path.name}"
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT),
                         EP_TEST_MARK=mark.partition("=")[2])
    proc = subprocess.Popen([sys.executable, "-c", SIGPIPE_DFL], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "set\n"
    _kill_keepers(mark)
    out, err = proc.communicate("\n", timeout=60)
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert ("refused: the process that restores knobs has gone" in out or "set again" in out) \
        and out.endswith("goes on\n"), out
    assert trees.max_freqs(tmp_path / "cpu") == [3_600_000, 3_600_000]


def test_a_respawning_keeper_hands_the_originals_to_a_new_keeper_process(tmp_path, monkeypatch):
    """The reader's keeper: its keeper process killed, the next change starts another and gives it every
    original still held; the reader's end then closing (its kill -9) restores them all."""
    trees.cpufreq_tree(tmp_path, cpus=2, cur=3_600_000)
    mark = f"{os.getpid()}-{tmp_path.name}"
    monkeypatch.setenv("EP_TEST_MARK", mark)
    knobs = {k.name: k for k in cpufreq.discover(str(tmp_path))}
    keeper = Keeper(respawn=True)
    keeper.set(knobs["cpu_max_freq:0"], 1_000_000, owner=1)
    first = _keepers(f"EP_TEST_MARK={mark}")
    _kill_keepers(f"EP_TEST_MARK={mark}")
    keeper.set(knobs["cpu_max_freq:1"], 2_000_000, owner=2)
    assert trees.max_freqs(tmp_path) == [1_000_000, 2_000_000]
    assert set(_keepers(f"EP_TEST_MARK={mark}")) - set(first)
    keeper._lost()  # as the kernel does at the reader's kill -9
    keeper.held.clear()
    assert trees.wait_for(lambda: trees.max_freqs(tmp_path) == [3_600_000, 3_600_000])


# ---------------------------------------------------------------- the machine-wide claim


def test_two_keepers_of_one_file_the_second_is_refused(tmp_path, monkeypatch):
    """The reader's keeper holds CPU 0 for a client; a second keeper (a root `--knob` run, an optimizer) is
    refused with one line instead of taking the changed value as its original; free again once restored."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=1, cur=3_600_000)
    monkeypatch.setenv(keeper_module.CLAIMS_ENV, str(tmp_path / "claims"))
    knob = next(k for k in cpufreq.discover(str(tmp_path / "cpu")) if k.index == "0")
    reader, run = Keeper(), Keeper()
    try:
        reader.set(knob, 1_000_000, owner=1)
        with pytest.raises(KnobError, match=rf"is being changed by another energyprof process \(pid {os.getpid()}\)"):
            run.set(knob, 2_000_000)
        assert trees.max_freqs(tmp_path / "cpu") == [1_000_000] and not run.held
        reader.restore(owner=1)
        run.set(knob, 2_000_000)
        run.close()
        assert trees.max_freqs(tmp_path / "cpu") == [3_600_000]
        assert list((tmp_path / "claims").iterdir()) == []
    finally:
        reader.close()
        run.close()


HOLDER = """
import sys
from energyprof.knobs import cpufreq
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.keeper import Keeper
Keeper().set(next(k for k in cpufreq.discover() if k.index == "0"), 1000000)
print("set", flush=True)
sys.stdin.readline()
"""


def test_the_claim_outlives_a_kill_9_of_its_setter_until_the_original_is_back(tmp_path, monkeypatch):
    """Another process's claim refuses this one; after the setter's kill -9 its keeper process holds the
    claim until the original is back, so the next setter takes the true original."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=1, cur=3_600_000)
    monkeypatch.setenv(keeper_module.CLAIMS_ENV, str(tmp_path / "claims"))
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "set\n"
    knob = next(k for k in cpufreq.discover(str(tmp_path / "cpu")) if k.index == "0")
    keeper = Keeper()
    try:
        with pytest.raises(KnobError, match=rf"another energyprof process \(pid {proc.pid}\)"):
            keeper.set(knob, 2_000_000)
        proc.kill()
        proc.wait(timeout=60)

        def taken() -> bool:
            try:
                keeper.set(knob, 2_000_000)
                return True
            except KnobError:
                return False

        assert trees.wait_for(taken)
        assert keeper.held[next(iter(keeper.held))].original == "3600000"  # the true original, not 1 GHz
    finally:
        keeper.close()
    assert trees.max_freqs(tmp_path / "cpu") == [3_600_000]
