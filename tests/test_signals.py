"""Signals between the user, energyprof and the program: every signal a shell would deliver
reaches the program, a deadly one ends energyprof the same way, and energyprof killed with
SIGKILL leaves no process behind. Real processes, compared with plain python; each runs on
Linux's own paths and on the paths macOS takes (no /proc, no sigtimedwait: ENERGYPROF_PORTABLE)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from energyprof import load

from conftest import plain, profiled, run_cli, script

PATHS = [pytest.param({}, id="linux"), pytest.param({"ENERGYPROF_PORTABLE": "1"}, id="portable")]
SENT = ("SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "SIGWINCH", "SIGINT", "SIGHUP", "SIGTERM")

HANDLERS = """
    import signal, sys, time
    def on(signo, frame):
        print("got", signal.Signals(signo).name, flush=True)
    for name in sys.argv[1].split(","):
        signal.signal(getattr(signal, name), on)
    print("ready", flush=True)
    for line in sys.stdin:  # the test says when to stop
        break
    print("end", flush=True)
"""


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ENERGYPROF_POWERCAP_ROOT", None)
    env.update(extra)
    return env


def _send_each(proc: subprocess.Popen[str], names: tuple[str, ...]) -> list[str]:
    """Send the signals one at a time (two pending signals of one kind merge), each once the
    program has said it got the one before; the lines it printed."""
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline() == "ready\n"
    lines = []
    for name in names:
        proc.send_signal(getattr(signal, name))
        lines.append(proc.stdout.readline())
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    lines.extend(proc.stdout.readlines())
    proc.wait(timeout=60)
    return lines


def _start(cmd: list[str], here: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, cwd=here, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


@pytest.mark.parametrize("extra", PATHS)
def test_every_signal_a_shell_delivers_reaches_the_programs_handler(here, extra):
    """Defect: SIGUSR1/USR2/ALRM/QUIT killed energyprof with no profile, and the program never
    got them (a SLURM --signal=USR1@60 checkpoint handler never ran)."""
    script(here, "h.py", HANDLERS)
    names = ",".join(SENT)
    alone = _start([sys.executable, "h.py", names], here, _env(extra))
    base = _send_each(alone, SENT)
    proc = _start([sys.executable, "-m", "energyprof", *profiled("h.py", names)], here, _env(extra))
    lines = _send_each(proc, SENT)
    assert base == [f"got {n}\n" for n in SENT] + ["end\n"]
    assert (proc.returncode, lines) == (alone.returncode, base) == (0, base)
    assert load(here / "p.json").meta["exit"] == {"status": "completed"}


@pytest.mark.parametrize("extra", PATHS)
@pytest.mark.parametrize("name", ["SIGUSR1", "SIGALRM", "SIGQUIT"])
def test_a_signal_that_kills_the_program_is_recorded_and_ends_energyprof_the_same_way(here, extra, name):
    script(here, "h.py", HANDLERS)
    alone = _start([sys.executable, "h.py", "SIGUSR2"], here, _env(extra))
    proc = _start([sys.executable, "-m", "energyprof", *profiled("h.py", "SIGUSR2")], here, _env(extra))
    for p in (alone, proc):
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        p.send_signal(getattr(signal, name))
        p.wait(timeout=60)  # stdin stays open: the program ends by the signal alone
        out, err = p.communicate(timeout=60)
        assert (out, err) == ("", "")
    assert proc.returncode == alone.returncode == -getattr(signal, name)
    assert load(here / "p.json").meta["exit"] == {"status": "signal", "signal": name}


def test_sigchld_inherited_as_ignored_keeps_the_exit_status(here):
    """Defect: with SIGCHLD ignored the kernel reaped the program and exit 7 read as "completed"."""
    script(here, "seven.py", """
        import signal, sys
        print(signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN)
        sys.exit(7)
    """)
    ignoring = ["-c", "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN);"
                " os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"]
    alone = subprocess.run([sys.executable, *ignoring, "seven.py"], cwd=here, capture_output=True, text=True)
    res = subprocess.run([sys.executable, *ignoring, "-m", "energyprof", *profiled("seven.py")], cwd=here,
                         capture_output=True, text=True, env=_env({}))
    assert (res.returncode, res.stdout, res.stderr) == (alone.returncode, alone.stdout, alone.stderr)
    assert alone.stdout == "True\n" and alone.returncode == 7
    assert load(here / "p.json").meta["exit"] == {"status": "exit", "code": 7}


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("extra", PATHS)
def test_sigkill_of_energyprof_leaves_no_process_and_a_checkpoint(here, extra):
    """Defect: kill -9 of energyprof left the program running forever (one burned a core for 15 minutes)."""
    script(here, "family.py", """
        import json, subprocess, sys, time
        kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]),
                subprocess.Popen(["sleep", "600"])]
        with open("pids.json", "w") as fh:
            json.dump([kid.pid for kid in kids], fh)
        print("ready", flush=True)
        while True:
            sum(range(10_000))
    """)
    proc = _start([sys.executable, "-m", "energyprof", "--checkpoint-interval", "0.2", *profiled("family.py")],
                  here, _env(extra))
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    job = [c.pid for c in psutil.Process(proc.pid).children()]
    kids = json.loads((here / "pids.json").read_text())
    deadline = time.monotonic() + 60
    while not (here / "p.energyprof-checkpoint.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the supervisor has seen the children (it tells the watcher every 0.25 s)
    proc.kill()
    _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while not all(_gone(p) for p in [*job, *kids]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in [*job, *kids] if not _gone(p)] == []
    ckpt = here / "p.energyprof-checkpoint.json"
    assert f"energyprof report {ckpt.name}" in err  # the watcher keeps energyprof's stderr until it has said so
    res = run_cli(["report", str(ckpt), "--json", "again.json", "-o", "again.html"], cwd=here)
    assert res.returncode == 0, res.stderr
    again = load(here / "again.json")
    assert again.meta["exit"]["status"] == "checkpoint" and again.totals["duration_s"] > 0


def test_sigkill_of_energyprof_is_said_with_the_checkpoint(here):
    script(here, "sleeper.py", "import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    proc = _start([sys.executable, "-m", "energyprof", "--checkpoint-interval", "0.1", *profiled("sleeper.py")],
                  here, _env({}))
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    ckpt = here / "p.energyprof-checkpoint.json"
    deadline = time.monotonic() + 60
    while not ckpt.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    program = psutil.Process(proc.pid).children()
    proc.kill()
    proc.wait(timeout=30)
    psutil.wait_procs(program, timeout=60)
    # the watcher said so on energyprof's stderr, which it keeps open until it has (the program
    # may have ended already by the kernel's PR_SET_PDEATHSIG, hence 0 or 1 still running)
    _, err = proc.communicate(timeout=60)
    assert re.fullmatch(r"energyprof: energyprof was killed before the program ended; the job's processes still running"
                        r" were ended \([01]\); the run up to its last checkpoint is in p\.energyprof-checkpoint\.json"
                        r" \(energyprof report p\.energyprof-checkpoint\.json\)\n", err), err


@pytest.mark.parametrize("extra", PATHS)
def test_sigtstp_stops_both_and_sigcont_resumes_both(here, extra):
    """`kill -TSTP energyprof`: the program stops as it would alone, and so does energyprof, so a
    shell sees its job stopped; SIGCONT resumes both and the run completes. (Each in a process
    group of its own within this session, as a shell runs a job: the kernel does not stop an
    orphaned group.)"""
    script(here, "h.py", HANDLERS)
    states = []
    for cmd in ([sys.executable, "h.py", "SIGUSR1"], [sys.executable, "-m", "energyprof", *profiled("h.py", "SIGUSR1")]):
        proc = subprocess.Popen(cmd, cwd=here, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env(extra), preexec_fn=os.setpgrp)
        assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline() == "ready\n"
        top = psutil.Process(proc.pid)
        job = [top, *(c for c in top.children() if c.cmdline()[1:2] == ["h.py"])]  # not the watcher
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 60
        while any(p.status() != psutil.STATUS_STOPPED for p in job) and time.monotonic() < deadline:
            time.sleep(0.05)
        states.append([p.status() for p in job])
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out, err) == (0, "end\n", "")
    assert states == [[psutil.STATUS_STOPPED], [psutil.STATUS_STOPPED] * 2]
    assert load(here / "p.json").meta["exit"] == {"status": "completed"}


def test_a_signal_sent_to_the_whole_job_reaches_the_program_once(here):
    """SLURM's `--signal=USR1@60` (without B:) and `kill -- -PGID` signal every process of the job,
    the program included: energyprof must not pass it on a second time."""
    script(here, "slow.py", """
        import os, signal, sys, time
        def on(signo, frame):
            print("got", signal.Signals(signo).name, flush=True)
            time.sleep(1)  # a second delivery meanwhile would run the handler again
        signal.signal(signal.SIGUSR1, on)
        signal.signal(signal.SIGUSR2, on)
        print("ready", flush=True)
        while not os.path.exists("stop"):
            time.sleep(0.01)
        print("end", flush=True)
    """)
    seen = []
    for cmd in ([sys.executable, "slow.py"], [sys.executable, "-m", "energyprof", *profiled("slow.py")]):
        (here / "stop").unlink(missing_ok=True)
        proc = subprocess.Popen(cmd, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env({}), preexec_fn=os.setpgrp)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGUSR1)
        assert proc.stdout.readline() == "got SIGUSR1\n"
        proc.send_signal(signal.SIGUSR2)  # then one to energyprof alone: passed on, once
        assert proc.stdout.readline() == "got SIGUSR2\n"
        (here / "stop").touch()
        out, err = proc.communicate(timeout=60)
        seen.append((proc.returncode, out, err))
    assert seen[0] == seen[1] == (0, "end\n", "")


TTY_LAUNCH = """
import fcntl, os, sys, termios
os.setsid()
fd = os.open(sys.argv[1], os.O_RDWR)  # the session's controlling terminal: its group is the foreground
fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
attrs = termios.tcgetattr(fd)
attrs[3] &= ~termios.ECHO  # Ctrl-C still signals (ISIG); nothing typed is echoed into the output
# A Ctrl-C signals the foreground group and then flushes the terminal's output queue: a handler's
# line written in between (another core, a loaded machine) would be lost, with plain python too.
attrs[3] |= termios.NOFLSH
termios.tcsetattr(fd, termios.TCSANOW, attrs)
for n in (0, 1, 2):
    os.dup2(fd, n)
os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
"""


def _read_until(master: int, text: bytes, deadline: float) -> bytes:
    import select

    got = b""
    while text not in got and time.monotonic() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            try:
                got += os.read(master, 4096)
            except OSError:  # EIO: the terminal is not open on the other side (yet)
                time.sleep(0.05)
    return got


def test_ctrl_c_reaches_the_program_once_and_a_later_kill_is_passed_on(here):
    """The terminal's Ctrl-C goes to the whole foreground group: the program has it, energyprof does
    not send it again; a later `kill -INT` to energyprof alone is passed on. (Linux only: without
    sigtimedwait a signal cannot say who sent it, and while energyprof is in the terminal's
    foreground group an INT is taken to be the terminal's; docs/processes.md says so.)"""
    extra: dict[str, str] = {}
    import pty

    script(here, "tty.py", TTY_LAUNCH)
    script(here, "h.py", HANDLERS)
    outputs = []
    for args in (["h.py", "SIGINT"], ["-m", "energyprof", *profiled("h.py", "SIGINT")]):
        master, slave = pty.openpty()
        os.set_blocking(master, False)
        name = os.ttyname(slave)
        proc = subprocess.Popen([sys.executable, "tty.py", name, *args], cwd=here, env=_env(extra), pass_fds=())
        os.close(slave)
        deadline = time.monotonic() + 60
        # The whole line, its end included: a Ctrl-C flushes the terminal's output queue, and a line
        # end still queued there (a loaded machine) would be lost from the transcript.
        got = _read_until(master, b"ready\r\n", deadline)
        os.write(master, b"\x03")  # Ctrl-C
        got += _read_until(master, b"got SIGINT", deadline)
        got += _read_until(master, b"a second delivery, which must not come", time.monotonic() + 0.5)
        os.kill(proc.pid, signal.SIGINT)
        got += _read_until(master, b"got SIGINT", deadline)
        os.write(master, b"stop\n")
        got += _read_until(master, b"end", deadline)
        proc.wait(timeout=60)
        os.close(master)
        outputs.append(got.decode().splitlines())
    assert outputs[0] == outputs[1] == ["ready", "got SIGINT", "got SIGINT", "end"]


TAKERS = """
    import os, sys, time

    def takers():
        '''This process's threads that do not block SIGUSR1: those a signal sent to it may land on.'''
        n = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/status") as fh:
                    blocked = next(int(line.split()[1], 16) for line in fh if line.startswith("SigBlk:"))
            except (OSError, StopIteration):
                continue  # a thread that ended meanwhile
            n += not blocked & (1 << (10 - 1))  # SIGUSR1 is 10 on Linux
        return n

    def report():
        end = time.monotonic() + 2.0  # energyprof's threads mask themselves as they start
        while takers() > 1 and time.monotonic() < end:
            time.sleep(0.01)
        print("threads a signal can land on:", takers())
    """


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
def test_a_signal_to_the_program_can_land_only_on_its_own_threads(here):
    """A process-directed signal goes to any thread not blocking it. Plain python has one; energyprof's
    sampler (and an in-process collector) block every signal but faults, so a handler runs on the
    program's thread at once and interrupts its blocking read, as under plain python."""
    script(here, "t.py", TAKERS, "report()\n")
    script(here, "d.py", TAKERS, """
        from energyprof import energy_profile
        energy_profile(json="d.json", power_trace="trace.csv", quiet=True, output=None)(report)()
        """)
    want = plain(here, "t.py")
    assert want.stdout == "threads a signal can land on: 1\n"
    res = run_cli(profiled("t.py"), cwd=here)
    assert (res.returncode, res.stdout) == (0, want.stdout), res.stderr
    res = subprocess.run([sys.executable, "d.py"], cwd=here, capture_output=True, text=True, timeout=120)
    assert (res.returncode, res.stdout) == (0, want.stdout), res.stderr


def _own_group_dfl() -> None:
    os.setpgrp()  # Popen(process_group=0), which Python 3.10 lacks
    _dfl()


def _dfl() -> None:
    """The child starts with the job-control signals at their default, as a shell's foreground job
    does (a non-interactive shell starts background commands with SIGINT and SIGQUIT ignored)."""
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGCONT, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(s, signal.SIG_DFL)


def test_sigcont_to_the_whole_job_reaches_the_program_once(here):
    """Defect: `fg` and `bg` send SIGCONT to the job's process group; the program's handler ran
    twice, once from the group's copy and once from the copy energyprof passed on."""
    script(here, "cont.py", """
        import os, signal, time
        def on(signo, frame):
            print("got", signal.Signals(signo).name, flush=True)
            time.sleep(1)  # a second delivery meanwhile would run the handler again
        signal.signal(signal.SIGCONT, on)
        print("ready", flush=True)
        while not os.path.exists("stop"):
            time.sleep(0.01)
        print("end", flush=True)
    """)
    seen = []
    for cmd in ([sys.executable, "cont.py"], [sys.executable, "-m", "energyprof", *profiled("cont.py")]):
        (here / "stop").unlink(missing_ok=True)
        proc = subprocess.Popen(cmd, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env({}), preexec_fn=_own_group_dfl)
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGCONT)
        assert proc.stdout.readline() == "got SIGCONT\n"
        if cmd[1] == "-m":
            # Two of one standard signal pending at once are one (POSIX): the next must not reach
            # energyprof before it has taken this one, which shows as its watcher's copy dropped.
            _wait_until_taken(proc.pid, signal.SIGCONT)
        proc.send_signal(signal.SIGCONT)  # then one to energyprof alone: passed on, once
        assert proc.stdout.readline() == "got SIGCONT\n"
        (here / "stop").touch()
        out, err = proc.communicate(timeout=60)
        seen.append((proc.returncode, out, err))
    assert seen[0] == seen[1] == (0, "end\n", "")


def _wait_until_taken(supervisor: int, signo: int) -> None:
    """Until energyprof's watcher (its forked child that is not the program) no longer holds a
    copy of `signo`: the supervisor has taken the job's signal and told the watcher to drop it."""
    deadline = time.monotonic() + 60  # a hang guard only
    me = psutil.Process(supervisor)
    while time.monotonic() < deadline:
        watchers = [c for c in me.children() if c.cmdline()[1:3] == ["-m", "energyprof"]]
        pending = 0
        for w in watchers:
            with open(f"/proc/{w.pid}/status") as fh:
                pending |= int(next(ln for ln in fh if ln.startswith("ShdPnd:")).split()[1], 16)
        if watchers and not pending >> (signo - 1) & 1:
            return
        time.sleep(0.01)
    raise AssertionError("energyprof never took the job's signal")


def _events(pid: int, deadline: float) -> list[str]:
    """What a shell's waitpid(WUNTRACED) sees of the job until it exits: each stop (answered with
    SIGCONT, as `fg` would), then its exit. The deadline is a hang guard only."""
    seen = []
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if done != pid:
            time.sleep(0.02)
        elif os.WIFSTOPPED(status):
            seen.append(f"stopped by {signal.Signals(os.WSTOPSIG(status)).name}")
            os.kill(pid, signal.SIGCONT)
        else:
            seen.append(f"exit {os.waitstatus_to_exitcode(status)}")
            return seen
    seen.append("still running")
    os.kill(pid, signal.SIGKILL)
    return seen


@pytest.mark.parametrize("extra", PATHS)
def test_sigtstp_that_the_program_handles_stops_nothing(here, extra):
    """Defect: energyprof passed SIGTSTP on and then stopped itself; the program handled it and
    finished, and energyprof stayed stopped: no outputs, and the job never ended without a SIGCONT."""
    script(here, "h.py", HANDLERS)
    runs = []
    for cmd in ([sys.executable, "h.py", "SIGTSTP"], [sys.executable, "-m", "energyprof", *profiled("h.py", "SIGTSTP")]):
        proc = subprocess.Popen(cmd, cwd=here, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env(extra), preexec_fn=_own_group_dfl)
        assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTSTP)
        lines = [proc.stdout.readline()]
        proc.stdin.write("stop\n")
        proc.stdin.close()
        events = _events(proc.pid, time.monotonic() + 120)
        lines += proc.stdout.readlines()
        runs.append((events, lines))
        proc.returncode = 0  # reaped above
        proc.stdout.close()
        assert proc.stderr is not None and proc.stderr.read() == ""
        proc.stderr.close()
    assert runs[0] == runs[1] == (["exit 0"], ["got SIGTSTP\n", "end\n"])
    assert load(here / "p.json").meta["exit"] == {"status": "completed"}


@pytest.mark.parametrize("extra", PATHS)
def test_sigtstp_at_its_default_stops_energyprof_with_the_program_and_sigcont_resumes_both(here, extra):
    """The program stopped by SIGTSTP's default: energyprof stops too, once the program has, as
    the shell expects of its job; SIGCONT to energyprof resumes it and it resumes the program."""
    script(here, "h.py", HANDLERS)
    runs = []
    for cmd in ([sys.executable, "h.py", "SIGUSR1"], [sys.executable, "-m", "energyprof", *profiled("h.py", "SIGUSR1")]):
        proc = subprocess.Popen(cmd, cwd=here, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=_env(extra), preexec_fn=_own_group_dfl)
        assert proc.stdout is not None and proc.stdin is not None and proc.stdout.readline() == "ready\n"
        program = [c for c in psutil.Process(proc.pid).children() if c.cmdline()[1:2] == ["h.py"]]
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # hang guard only
            done, status = os.waitpid(proc.pid, os.WNOHANG | os.WUNTRACED)
            if done == proc.pid:
                break
            time.sleep(0.02)
        assert done == proc.pid and os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGTSTP
        assert [p.status() for p in program] == [psutil.STATUS_STOPPED] * len(program)  # the program first
        proc.send_signal(signal.SIGCONT)
        proc.stdin.write("stop\n")
        proc.stdin.close()
        events = _events(proc.pid, time.monotonic() + 120)
        lines = proc.stdout.readlines()
        proc.returncode = 0  # reaped above
        proc.stdout.close()
        assert proc.stderr is not None and proc.stderr.read() == ""
        proc.stderr.close()
        runs.append((len(program), events, lines))
    assert runs == [(0, ["exit 0"], ["end\n"]), (1, ["exit 0"], ["end\n"])]
    assert load(here / "p.json").meta["exit"] == {"status": "completed"}
