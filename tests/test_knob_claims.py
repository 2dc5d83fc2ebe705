"""The keeper against other users and its own processes: claims no other user can hold, a keeper process
killed and replaced, and a launcher that never finishes."""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from energyprof.knobs import cpufreq
from energyprof.knobs import keeper as keeper_module
from energyprof.knobs.base import KnobError
from energyprof.knobs.keeper import Keeper

import knob_trees as trees
from test_knobs import ROOT, _gone, _keepers, _kill_keepers

NOBODY = 65534

def _spin(path: str, stop: int, report: int) -> None:
    """Another local user's loop, in a forked child: open the claim's path and flock it, again and again. Root's
    claim files used to be 0644, and flock needs only a read descriptor: once this won the race between root's
    open and its lock, every later change of that file was refused ("pid ?"). It counts the opens that succeed
    until `stop` is readable, then opens once more and reports both."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)
    os.write(report, b"ready\n")
    opened = 0
    while not select.select([stop], [], [], 0)[0]:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        opened += 1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass
        os.close(fd)  # let go, to count how often the file is open to this user
    try:
        os.close(os.open(path, os.O_RDONLY))
        last = "open"
    except OSError as exc:
        last = str(exc.errno)
    os.write(report, f"{opened} {last}\n".encode())


def _as_nobody(path: str) -> tuple[int, int, int]:
    """The spinner forked as user nobody: (its pid, the pipe to stop it, the pipe it reports on)."""
    stop_r, stop_w = os.pipe()
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            _spin(path, stop_r, report_w)
        finally:
            os._exit(0)
    os.close(stop_r)
    os.close(report_w)
    return pid, stop_w, report_r


@pytest.fixture
def shared_claims(monkeypatch):
    """A claims folder another user can reach (as /run/energyprof/knobs is), owned by root, 0755."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to be another user in a child")
    top = tempfile.mkdtemp(prefix="claims-")
    os.chmod(top, 0o755)
    monkeypatch.setenv(keeper_module.CLAIMS_ENV, os.path.join(top, "knobs"))
    yield Path(top) / "knobs"
    subprocess.run(["rm", "-rf", top], check=False)


def test_no_other_user_can_open_a_claim_so_none_can_block_roots_changes(tmp_path, shared_claims):
    """Claim files are 0600 and ours: another user spinning on open+flock of the claim's path opens it not
    once in 150 set/restore cycles, every change of root's goes through, and while root holds the claim the
    other user's open is refused (EACCES)."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=1, cur=3_600_000)
    knob = next(k for k in cpufreq.discover(str(tmp_path / "cpu")) if k.index == "0")
    path = keeper_module._claim_path(knob.parts()[0].key)
    keeper = Keeper()
    pid, stop, report = _as_nobody(path)
    try:
        with os.fdopen(report) as lines:
            assert lines.readline() == "ready\n"
            for _ in range(150):
                keeper.set(knob, 1_000_000)
                keeper.restore()
            keeper.set(knob, 1_000_000)
            st = os.stat(path)
            assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == 0
            os.write(stop, b"try\n")
            assert lines.readline().split() == ["0", str(errno.EACCES)]  # never opened; refused while held
    finally:
        os.close(stop)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        keeper.close()
    assert trees.max_freqs(tmp_path / "cpu") == [3_600_000]


def _old_claim(tmp_path: Path, monkeypatch, text: str) -> tuple[cpufreq.MaxFreq, Path]:
    """A CPU's knob and its claim file as an older energyprof left it: 0644, holding `text`."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=1, cur=3_600_000)
    monkeypatch.setenv(keeper_module.CLAIMS_ENV, str(tmp_path / "claims"))
    knob = next(k for k in cpufreq.discover(str(tmp_path / "cpu")) if isinstance(k, cpufreq.MaxFreq) and k.index == "0")
    (tmp_path / "claims").mkdir(mode=0o755)
    path = Path(keeper_module._claim_path(knob.parts()[0].key))
    path.write_text(text)
    path.chmod(0o644)
    return knob, path


def test_a_claim_file_others_can_open_is_made_anew(tmp_path, monkeypatch):
    """A claim file left readable by others (an older energyprof's 0644) is not waited on: it is removed and
    a 0600 one made in its place."""
    knob, path = _old_claim(tmp_path, monkeypatch, "")
    keeper = Keeper()
    try:
        keeper.set(knob, 1_000_000)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600  # made anew: the old one was never chmodded
    finally:
        keeper.close()


def test_a_claims_folder_others_can_write_refuses_the_change(tmp_path, monkeypatch):
    """A claims folder that exists but others can write (so could swap a claim in it) refuses the change in
    one line: going ahead unclaimed would let two setters hold one knob."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=1, cur=3_600_000)
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims").chmod(0o777)
    monkeypatch.setenv(keeper_module.CLAIMS_ENV, str(tmp_path / "claims"))
    knob = next(k for k in cpufreq.discover(str(tmp_path / "cpu")) if k.index == "0")
    keeper = Keeper()
    try:
        with pytest.raises(KnobError) as refused:
            keeper.set(knob, 1_000_000)
        assert "writable by others" in str(refused.value) and "\n" not in str(refused.value)
        assert trees.max_freqs(tmp_path / "cpu") == [3_600_000] and not keeper.held
        assert list((tmp_path / "claims").iterdir()) == []
    finally:
        keeper.close()


def test_a_held_claim_file_others_can_open_is_refused_not_replaced(tmp_path, monkeypatch):
    """An older energyprof's 0644 claim that its holder has flocked is a held claim: the change is refused and
    the file stays (it used to be unlinked under its holder, so two setters held one knob)."""
    knob, path = _old_claim(tmp_path, monkeypatch, "4242 old\n")
    holder = os.open(path, os.O_RDONLY)  # its own open file: its flock conflicts with any other's
    fcntl.flock(holder, fcntl.LOCK_EX)
    inode = path.stat().st_ino
    keeper = Keeper()
    try:
        with pytest.raises(KnobError, match=r"being changed by another energyprof process \(pid 4242\)"):
            keeper.set(knob, 1_000_000)
        assert path.stat().st_ino == inode and trees.max_freqs(tmp_path / "cpu") == [3_600_000]
        os.close(holder)  # let go: now it is replaced by a 0600 claim of ours
        keeper.set(knob, 1_000_000)
        # made anew (the old one was never chmodded; its inode number may be reused)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().split()[0] == str(os.getpid())
    finally:
        keeper.close()


HOLDER = """
import sys
from energyprof.knobs import cpufreq
from energyprof.knobs.keeper import Keeper
Keeper().set(next(k for k in cpufreq.discover() if k.index == "0"), 1000000)
print("set", flush=True)
sys.stdin.readline()
"""


def _claims_held(pid: int, folder: Path, count: int = 1) -> bool:
    """The process holds descriptors of `count` claims in `folder`: its originals were handed over with them."""
    try:
        return sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(folder))
                   for fd in os.listdir(f"/proc/{pid}/fd")) >= count
    except OSError:
        return False


def test_a_killed_keeper_is_replaced_so_a_kill_9_of_the_setter_still_restores(tmp_path):
    """Kill -9 the keeper process: the setter notices, starts another and hands it the original (with its
    claim); then kill -9 the setter: the new keeper process puts the knob back."""
    trees.cpufreq_tree(tmp_path / "cpu", cpus=1, cur=3_600_000)
    mark = f"{os.getpid()}-{tmp_path.name}"
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT), EP_TEST_MARK=mark,
                         **{keeper_module.CLAIMS_ENV: str(tmp_path / "claims")})
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "set\n"
        first = _keepers(f"EP_TEST_MARK={mark}")
        _kill_keepers(f"EP_TEST_MARK={mark}")

        def replaced() -> list[int]:
            return [p for p in _keepers(f"EP_TEST_MARK={mark}") if p not in first
                    and _claims_held(p, tmp_path / "claims")]

        assert trees.wait_for(replaced), "no new keeper process holds the original"
        assert trees.max_freqs(tmp_path / "cpu") == [1_000_000]
        proc.kill()
        proc.wait(timeout=60)
        assert trees.wait_for(lambda: trees.max_freqs(tmp_path / "cpu") == [3_600_000])
        assert trees.wait_for(lambda: list((tmp_path / "claims").iterdir()) == [])
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _keepers(f"EP_TEST_MARK={mark}"):
            os.kill(pid, signal.SIGKILL)


def test_energyprof_knob_run_replaces_its_killed_keeper_then_a_kill_9_restores(tmp_path):
    """`energyprof --knob` end to end: kill -9 its keeper process, then kill -9 energyprof: both CPUs' files
    come back (the issue's reproducer: they stayed set)."""
    from test_knob_sweep import PROGRAM

    trees.cpufreq_tree(tmp_path / "cpu", cpus=2)
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    mark = f"{os.getpid()}-{tmp_path.name}"
    env = trees.env_with(ENERGYPROF_CPUFREQ_ROOT=str(tmp_path / "cpu"), PYTHONPATH=str(ROOT), EP_TEST_MARK=mark,
                         **{keeper_module.CLAIMS_ENV: str(tmp_path / "claims")})
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--knob",
                             "cpu_max_freq=1000000", "-o", os.devnull, "prog.py", "1", "hang"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        assert trees.max_freqs(tmp_path / "cpu") == [1_000_000, 1_000_000]
        first = _keepers(f"EP_TEST_MARK={mark}")
        _kill_keepers(f"EP_TEST_MARK={mark}")
        assert trees.wait_for(lambda: [p for p in _keepers(f"EP_TEST_MARK={mark}") if p not in first
                                       and _claims_held(p, tmp_path / "claims", 2)]), "no new keeper holds both"
        proc.kill()  # energyprof itself, not its program
        proc.wait(timeout=60)
        assert trees.wait_for(lambda: trees.max_freqs(tmp_path / "cpu") == [3_000_000, 3_000_000])
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the orphaned program, in energyprof's session
        except ProcessLookupError:
            pass
        for pid in _keepers(f"EP_TEST_MARK={mark}"):
            os.kill(pid, signal.SIGKILL)


def _stopped_launchers(mark: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if mark.encode() in Path(f"/proc/{pid}/cmdline").read_bytes() and not _gone(int(pid)):
                found.append(int(pid))
        except OSError:
            pass
    return found


def test_a_stopped_launcher_is_within_the_start_limit(tmp_path, monkeypatch):
    """The short process that starts the keeper stopped (SIGSTOP) before it forks: the start limit covers it,
    so the change is refused in one line, nothing is changed, and the launcher does not stay behind."""
    trees.cpufreq_tree(tmp_path, cur=3_600_000)
    mark = f"stopped-launcher-{os.getpid()}-{tmp_path.name}"
    monkeypatch.setattr(keeper_module, "_DETACH", f"import os, signal  # {mark}\nos.kill(os.getpid(), signal.SIGSTOP)\n"
                        + keeper_module._DETACH)
    monkeypatch.setattr(keeper_module, "START_WAIT_S", 1.0)
    keeper = Keeper()
    knob = next(k for k in cpufreq.discover(str(tmp_path)) if k.index == "0")
    refused: list[str] = []

    def change() -> None:
        try:
            keeper.set(knob, 1_000_000)
        except KnobError as exc:
            refused.append(str(exc))

    setter = threading.Thread(target=change, daemon=True)
    setter.start()
    setter.join(120)  # a hang guard: on its own the launcher never goes on
    try:
        assert not setter.is_alive(), "the setter waits on a stopped launcher"
        assert len(refused) == 1 and "did not start" in refused[0] and "\n" not in refused[0]
        assert trees.max_freqs(tmp_path) == [3_600_000, 3_600_000] and not keeper.held
        assert _stopped_launchers(mark) == []
    finally:
        for pid in _stopped_launchers(mark):
            os.kill(pid, signal.SIGKILL)
