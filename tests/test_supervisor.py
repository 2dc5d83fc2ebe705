"""`python -m energyprof` runs the program as a child process: every ending leaves a profile,
and the program sees nothing of energyprof. Real subprocesses, compared with plain python."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from energyprof import load

from conftest import BURN, plain, processes, profiled, run_cli, script

# -- every ending leaves a profile ---------------------------------------------------------------
def test_sigkill_of_the_program_still_writes_the_work_before_it(here):
    script(here, "k.py", BURN, """
    import os, signal
    burn_for(0.6)
    os.kill(os.getpid(), signal.SIGKILL)
    """)
    res = run_cli(profiled("k.py"), cwd=here)
    assert res.returncode == -signal.SIGKILL == plain(here, "k.py").returncode
    p = load(here / "p.json")
    assert p.meta["exit"] == {"status": "signal", "signal": "SIGKILL"}
    assert p.find("burn") and p.function_totals("burn") > 0
    assert processes(p)[0]["exit"] == {"status": "signal", "signal": "SIGKILL"}


def test_os_exit_passes_its_status_with_a_complete_profile(here):
    script(here, "x.py", BURN, """
    import os, sys
    burn_for(0.6)
    print("bye", flush=True)
    os._exit(5)
    """)
    res = run_cli(profiled("x.py"), cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (5, "bye\n", "")
    p = load(here / "p.json")
    assert p.meta["exit"] == {"status": "exit", "code": 5}
    assert p.function_totals("burn") > 0 and (here / "r.html").stat().st_size > 1000


def test_exec_by_the_program_still_writes_outputs(here):
    script(here, "e.py", BURN, """
    import os, sys
    burn_for(0.6)
    print("before", flush=True)
    os.execv(sys.executable, [sys.executable, "-c", "print('after exec')"])
    """)
    res = run_cli(profiled("e.py"), cwd=here)
    assert (res.returncode, res.stdout) == (0, "before\nafter exec\n")
    p = load(here / "p.json")
    assert p.meta["exit"]["status"] == "completed" and p.function_totals("burn") > 0


SLEEPER = """
    import time
    print("ready", flush=True)
    time.sleep(30)
"""


def start(here: Path, args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", *args], cwd=here, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(0.3)
    return proc


def test_sighup_is_forwarded_and_mirrored(here):
    script(here, "s.py", SLEEPER)
    proc = start(here, profiled("s.py"))
    os.kill(proc.pid, signal.SIGHUP)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGHUP
    assert load(here / "p.json").meta["exit"] == {"status": "signal", "signal": "SIGHUP"}


def test_sigterm_is_not_an_exception_the_program_can_swallow(here):
    script(here, "swallow.py", """
        import time
        print("ready", flush=True)
        for _ in range(3):
            try:
                time.sleep(10)
            except BaseException as exc:
                print("caught", type(exc).__name__, flush=True)
        print("survived", flush=True)
    """)
    alone = subprocess.Popen([sys.executable, "swallow.py"], cwd=here, stdout=subprocess.PIPE, text=True)
    assert alone.stdout is not None and alone.stdout.readline() == "ready\n"
    alone.terminate()
    alone_out, _ = alone.communicate(timeout=30)
    proc = start(here, profiled("swallow.py"))
    proc.terminate()
    out, err = proc.communicate(timeout=60)
    # no "caught" line: the signal was never an exception, as without energyprof
    assert (proc.returncode, out, err) == (alone.returncode, alone_out, "") == (-signal.SIGTERM, "", "")
    assert load(here / "p.json").meta["exit"] == {"status": "terminated", "signal": "SIGTERM"}


# -- the program sees nothing of energyprof -----------------------------------------------------
def test_the_program_sees_python_not_energyprof(here):
    script(here, "look.py", """
        import os, signal, sys, threading, warnings
        print(threading.active_count(), [t.name for t in threading.enumerate()])
        print(signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGHUP))
        print(sys.excepthook is sys.__excepthook__, sys.argv, __name__, __file__)
        print(sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
        print([p for p in sys.path if "energyprof" in p])
        warnings.warn("careful")
        while threading.active_count() > 1:  # would never end with a visible profiler thread
            pass
    """)
    base = plain(here, "look.py", "a1")
    res = run_cli(profiled("look.py", "a1"), cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (base.returncode, base.stdout, base.stderr)
    dfl = str(signal.SIG_DFL)  # "0" since 3.11, "Handlers.SIG_DFL" before
    assert res.stdout.startswith(f"1 ['MainThread']\n{dfl} <built-in function default_int_handler> {dfl}\n")


def test_custom_excepthook_runs(here):
    script(here, "hook.py", """
        import sys
        def hook(kind, value, tb):
            print("my hook:", kind.__name__, value, file=sys.stderr)
        sys.excepthook = hook
        raise ValueError("bad")
    """)
    base = plain(here, "hook.py")
    res = run_cli(profiled("hook.py"), cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (base.returncode, base.stdout, base.stderr)
    assert base.stderr == "my hook: ValueError bad\n"
    assert load(here / "p.json").meta["exit"] == {"status": "exception", "exception": "ValueError: bad"}


def test_syntax_error_in_the_script_is_pythons(here):
    script(here, "bad.py", "print('never')\ndef broken(:\n")
    base = plain(here, "bad.py")
    res = run_cli(profiled("bad.py"), cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (base.returncode, base.stdout, base.stderr)
    assert res.returncode == 1 and "SyntaxError" in res.stderr


def test_syntax_error_in_an_imported_module_is_pythons(here):
    script(here, "broken.py", "def f(:\n")
    script(here, "imp.py", "print('start', flush=True)\nimport broken\n")
    base = plain(here, "imp.py")
    res = run_cli(profiled("imp.py"), cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (base.returncode, base.stdout, base.stderr)
    assert res.returncode == 1 and "SyntaxError" in res.stderr


def test_a_non_daemon_thread_working_after_main_returns_is_measured(here):
    script(here, "late.py", """
        import threading, time
        def late_work():
            end = time.perf_counter() + 1.0
            while time.perf_counter() < end:
                sum(range(1000))
        threading.Thread(target=late_work, name="late").start()
        print("main done")
    """)
    res = run_cli(profiled("late.py"), cwd=here)
    assert (res.returncode, res.stdout) == (0, "main done\n")
    p = load(here / "p.json")
    late = p.find("late_work")
    assert late and sum(n.time_s for n in late) > 0.5
    assert p.function_totals("late_work") > 0.5 * p.totals["attributed_j"]["cpu"]


def test_symlinked_script_imports_its_siblings(here):
    real = here / "real"
    real.mkdir()
    (real / "helper.py").write_text("VALUE = 41\n")
    (real / "main.py").write_text("import helper\nprint(helper.VALUE + 1)\n")
    links = here / "links"
    links.mkdir()
    (links / "main.py").symlink_to(real / "main.py")
    base = plain(here, "links/main.py")
    res = run_cli(profiled("links/main.py"), cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (base.returncode, base.stdout, base.stderr) == (0, "42\n", "")


def test_html_and_csv_beside_the_script_are_the_programs_only(here):
    for name in ("html", "csv"):
        (here / f"{name}.py").write_text(f"print('the program imported its own {name}.py')\n")
    script(here, "app.py", "import csv\nprint('app ran')\n")
    base = plain(here, "app.py")
    res = run_cli(["--csv", "f.csv", *profiled("app.py")], cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (base.returncode, base.stdout, base.stderr)
    assert res.stdout == "the program imported its own csv.py\napp ran\n"
    assert "<html" in (here / "r.html").read_text()[:2000].lower()
    assert (here / "f.csv").read_text().count("\n") >= 1 and load(here / "p.json")


def test_relative_outputs_land_where_energyprof_started(here):
    script(here, "cd.py", "import os\nos.makedirs('elsewhere')\nos.chdir('elsewhere')\nprint(os.getcwd() != '')\n")
    res = run_cli(profiled("cd.py"), cwd=here)
    assert res.returncode == 0, res.stderr
    assert (here / "p.json").exists() and (here / "r.html").exists()
    assert not list((here / "elsewhere").iterdir())


def test_a_command_after_double_dash(here):
    script(here, "child.py", BURN, "burn(3_000_000)\nprint('python child')\n")  # ~15 samples
    cmd = f"echo from bash && {sys.executable} child.py && exit 3"
    res = run_cli([*profiled(), "--", "bash", "-c", cmd], cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (3, "from bash\npython child\n", "")
    p = load(here / "p.json")
    assert p.meta["exit"] == {"status": "exit", "code": 3}
    roles = {r["role"]: r for r in processes(p)}
    assert roles["main"]["command"].startswith("bash -c")
    bash = [n for n in p.root.children if n.function.startswith("[process ") and "bash" in n.function]
    assert len(bash) == 1
    kid = [n for n, _ in bash[0].walk() if n.function.startswith("[process ") and "child.py" in n.function]
    assert len(kid) == 1 and [n for n, _ in kid[0].walk() if n.function == "burn"]


def test_bad_command_is_one_line_exit_2(here):
    res = run_cli([*profiled(), "--", "no-such-command-xyz"], cwd=here)
    assert res.returncode == 2 and res.stderr.strip().count("\n") == 0 and "command not found" in res.stderr


# -- CPU and energy across processes ----------------------------------------------------------
def test_cpu_time_is_the_programs_getrusage(here):
    script(here, "ru.py", BURN, """
        import resource, subprocess, sys
        burn_for(2.0)  # long against what the program's own figure cannot see: its shut-down after it
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(15_000_000))"], check=True)
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        print(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime)
    """)
    res = run_cli(profiled("ru.py"), cwd=here)
    assert res.returncode == 0, res.stderr
    own_view = float(res.stdout)
    p = load(here / "p.json")
    # the program's figure includes energyprof's sampler threads (at most energyprof's own CPU,
    # which grows with wall time on a busy machine) but not its own shut-down after it printed
    # (a few tens of ms); the profile's is the other way round
    sampler_bound = p.totals["energyprof_cpu_time_s"]
    assert own_view - sampler_bound - 0.05 * own_view <= p.totals["cpu_time_s"] <= own_view * 1.05
    assert sum(r["cpu_time_s"] for r in processes(p)) == pytest.approx(own_view, rel=0.10)


def test_windows_from_a_supervised_program(here):
    script(here, "win.py", BURN, """
        import energyprof.torch as ept
        from energyprof.drive.profiler import active_profiler
        for epoch in range(2):
            with ept.window("epoch", epoch):
                burn(300_000)
        prof = active_profiler()
        prof.begin_window("tail")
        burn(200_000)
        prof.end_window("tail")
        with prof.window("last"):
            burn(100_000)
    """)
    res = run_cli(profiled("win.py"), cwd=here)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    assert [(w["name"], w["index"]) for w in p.windows] == [("epoch", 0), ("epoch", 1), ("tail", None), ("last", None)]
    assert all(w["energy_j"]["cpu"] > 0 and w["end_s"] > w["start_s"] for w in p.windows)


def test_memory_exact_leaves_a_programs_tracemalloc_alone(here):
    script(here, "tm.py", """
        import tracemalloc
        tracemalloc.stop()   # the program manages tracemalloc itself
        tracemalloc.start(5)
        data = [bytes(100) for _ in range(1000)]
        print(tracemalloc.get_traceback_limit())
    """)
    res = run_cli(["--memory", "exact", *profiled("tm.py")], cwd=here)
    assert (res.returncode, res.stdout) == (0, "5\n"), res.stderr
    notes = [n["message"] for n in load(here / "p.json").notes]
    assert any("exact is off" in m for m in notes), notes


def test_no_zombie_supervisor_state_is_left(here):
    """The spool lives in a temporary folder that is removed at the end (a private TMPDIR, so
    other runs on the machine cannot make this pass or fail)."""
    tmp = here / "tmp"
    tmp.mkdir()
    script(here, "q.py", "print(1)\n")
    assert run_cli(profiled("q.py"), cwd=here, env={"TMPDIR": str(tmp)}).returncode == 0
    assert list(tmp.iterdir()) == []


def test_a_program_closing_every_descriptor_keeps_its_files_its_own(here):
    script(here, "daemon.py", BURN, """
        import os
        os.closerange(3, 1024)  # as daemonising code does
        with open("mine.txt", "w") as fh:  # likely to get the number energyprof's spool had
            for i in range(30):
                burn_for(0.01)
                fh.write(f"line {i}\\n")
    """)
    res = run_cli(profiled("daemon.py"), cwd=here)
    assert res.returncode == 0, res.stderr
    assert (here / "mine.txt").read_text() == "".join(f"line {i}\n" for i in range(30))
    assert load(here / "p.json").function_totals("burn") > 0  # the stream went on, by name


def test_ctrl_c_in_a_terminal_reaches_the_program_once(here):
    """The terminal sends SIGINT to the whole foreground group, energyprof included: it must
    not pass it on a second time."""
    import pty

    script(here, "count.py", """
        import signal, time
        got = []
        signal.signal(signal.SIGINT, lambda s, f: got.append(s))
        print("ready", flush=True)
        end = time.monotonic() + 20
        while not got and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(1.0)  # time for a second delivery, if there were one
        print("signals:", len(got), flush=True)
    """)
    env = dict(os.environ)
    env.pop("ENERGYPROF_POWERCAP_ROOT", None)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a new session whose controlling terminal is the pty
        os.chdir(here)
        os.execve(sys.executable, [sys.executable, "-m", "energyprof", *profiled("count.py")], env)
    out = b""
    deadline = time.monotonic() + 60
    while b"ready" not in out and time.monotonic() < deadline:
        out += os.read(fd, 1024)
    time.sleep(0.3)
    os.write(fd, b"\x03")  # Ctrl-C
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 1024)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert b"signals: 1" in out, out
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert load(here / "p.json").meta["exit"] == {"status": "completed"}
