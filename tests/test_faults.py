"""Never lose a run, never change the program: endings, signals, bad input, threads, children,
sensors at fault. Every case runs the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from energyprof import load

from conftest import processes, run_cli

TRACE = "t_s,cpu\n0,40\n"


@pytest.fixture
def here(tmp_path: Path) -> Path:
    (tmp_path / "trace.csv").write_text(TRACE)
    return tmp_path


def script(dirpath: Path, name: str, body: str) -> Path:
    p = dirpath / name
    p.write_text(textwrap.dedent(body))
    return p


def profiled(args: list[str]) -> list[str]:
    return ["--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", *args]


# -- endings --------------------------------------------------------------------------------
def test_exception_traceback_exit_code_and_outputs(here):
    script(here, "boom.py", """
        def inner():
            raise RuntimeError("bad thing")
        print("before")
        inner()
    """)
    plain = subprocess.run([sys.executable, "boom.py"], cwd=here, capture_output=True, text=True)
    res = run_cli(["-q", *profiled(["boom.py"])], cwd=here)
    assert res.returncode == plain.returncode == 1
    assert res.stdout == plain.stdout == "before\n"
    assert res.stderr == plain.stderr  # the traceback exactly as Python prints it
    p = load(here / "p.json")
    assert p.meta["exit"] == {"status": "exception", "exception": "RuntimeError: bad thing"}
    assert "RuntimeError: bad thing" in (here / "r.html").read_text()


@pytest.mark.parametrize("code,expected_rc,expected_err", [("7", 7, ""), ("None", 0, ""), ("'bye'", 1, "bye\n")])
def test_sys_exit_passes_through(here, code, expected_rc, expected_err):
    script(here, "ex.py", f"import sys\nprint('x')\nsys.exit({code})\n")
    res = run_cli(["-q", *profiled(["ex.py"])], cwd=here)
    assert (res.returncode, res.stdout, res.stderr) == (expected_rc, "x\n", expected_err)
    # the exit status is all the program leaves: 0 reads as a completed run
    expected = {"status": "completed"} if expected_rc == 0 else {"status": "exit", "code": expected_rc}
    assert load(here / "p.json").meta["exit"] == expected


SLEEPER = """
    import sys, time
    print("ready", flush=True)
    time.sleep(30)
"""


def start(here: Path, args: list[str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", *args], cwd=here, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.3)
    return proc


def checkpoint_durations(path: Path, rewrites: int, guard_s: float = 60.0) -> list[float]:
    """The durations of the checkpoints seen at `path` until it was rewritten `rewrites` times
    (each later than the last): the run is known to have gone at least that far, whatever the
    machine's load. The deadline only guards against a hang."""
    from energyprof.collect.checkpoint import load_any

    seen: list[float] = []
    deadline = time.monotonic() + guard_s
    while len(seen) < rewrites and time.monotonic() < deadline:
        try:
            d = load_any(str(path)).totals["duration_s"]
        except (OSError, ValueError):  # not written yet
            d = None
        if d is not None and (not seen or d > seen[-1]):
            seen.append(d)
        time.sleep(0.05)
    assert len(seen) == rewrites, seen
    return seen


def plain(here: Path, name: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, name], cwd=here, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    time.sleep(0.3)
    return proc


def test_sigint_writes_outputs_then_ends_like_python(here):
    script(here, "sleeper.py", SLEEPER)
    alone = plain(here, "sleeper.py")
    alone.send_signal(signal.SIGINT)
    _, alone_err = alone.communicate(timeout=30)
    proc = start(here, ["-q", *profiled(["sleeper.py"])])
    os.kill(proc.pid, signal.SIGINT)  # to energyprof alone: passed on to the program, once
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == alone.returncode == -signal.SIGINT  # Python dies by SIGINT after the traceback
    assert err == alone_err and err.rstrip().endswith("KeyboardInterrupt")
    p = load(here / "p.json")
    assert p.meta["exit"]["status"] == "interrupted" and p.totals["duration_s"] > 0.2


def test_sigterm_writes_outputs_then_dies_by_sigterm(here):
    script(here, "sleeper.py", SLEEPER)
    proc = start(here, ["-q", *profiled(["sleeper.py"])])
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # default SIGTERM semantics, as without energyprof
    assert err == ""
    assert load(here / "p.json").meta["exit"] == {"status": "terminated", "signal": "SIGTERM"}
    assert (here / "r.html").exists()


def test_programs_own_sigterm_handler_still_runs(here):
    script(here, "handler.py", """
        import signal, sys, time
        def on_term(signum, frame):
            print("cleaning up", flush=True)
            sys.exit(3)
        signal.signal(signal.SIGTERM, on_term)
        print("ready", flush=True)
        time.sleep(30)
    """)
    proc = start(here, ["-q", *profiled(["handler.py"])])
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3 and out == "cleaning up\n"
    assert load(here / "p.json").meta["exit"] == {"status": "exit", "code": 3}


def test_sigkill_leaves_a_checkpoint_that_becomes_a_report(here):
    script(here, "sleeper.py", SLEEPER)
    proc = start(here, ["-q", "--checkpoint-interval", "0.3", *profiled(["sleeper.py"])])
    ckpt = here / "p.energyprof-checkpoint.json"  # default: next to the JSON
    seen = checkpoint_durations(ckpt, rewrites=3)
    proc.kill()
    proc.wait(timeout=10)
    assert ckpt.exists() and not (here / "p.json").exists()
    res = run_cli(["report", str(ckpt), "-o", "from-ckpt.html", "--json", "from-ckpt.json"], cwd=here)
    assert res.returncode == 0, res.stderr
    p = load(here / "from-ckpt.json")
    assert p.meta["exit"]["status"] == "checkpoint"
    # nothing a checkpoint held before the kill is lost: the report reaches at least the last one seen
    assert p.totals["duration_s"] >= max(seen) > 0
    assert p.totals["energy_j"]["cpu"] == pytest.approx(40.0 * p.totals["duration_s"], rel=0.02)
    assert (here / "from-ckpt.html").stat().st_size > 1000


def test_finished_run_removes_its_checkpoint(here):
    script(here, "quick.py", "import time\ntime.sleep(0.5)\n")
    res = run_cli(["-q", "--checkpoint-interval", "0.1", *profiled(["quick.py"])], cwd=here)
    assert res.returncode == 0
    assert not list(here.glob("*checkpoint*"))


def test_stdio_warnings_and_quiet(here):
    script(here, "io.py", """
        import sys, warnings
        data = sys.stdin.read()
        print(data.upper(), end="")
        warnings.warn("careful")
        print("to stderr", file=sys.stderr)
    """)
    plain = subprocess.run([sys.executable, "io.py"], cwd=here, capture_output=True, text=True, input="abc\n")
    res = run_cli(["-q", *profiled(["io.py"])], cwd=here, stdin="abc\n")
    assert res.stdout == plain.stdout == "ABC\n"
    assert res.stderr == plain.stderr
    loud = run_cli(profiled(["io.py"]), cwd=here, stdin="abc\n")
    assert loud.stderr.startswith(plain.stderr) and "energyprof:" in loud.stderr


# -- threads and children ---------------------------------------------------------------------
THREADS = """
    import threading, time
    def worker_burn():
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            sum(range(1000))
    t = threading.Thread(target=worker_burn, name="burner")
    t.start()
    def main_waits():
        t.join()
    main_waits()
"""


def test_threads_sampler_charges_the_working_thread(here):
    script(here, "th.py", THREADS)
    res = run_cli(["-q", "--idle", "all", *profiled(["th.py"])], cwd=here)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    total = p.totals["attributed_j"]["cpu"]
    assert p.function_totals("worker_burn") > 0.7 * total  # intervals where nobody got a CPU go by wall time
    assert p.function_totals("main_waits") < 0.25 * total


def test_pyinstrument_sampler_charges_main_and_says_so(here):
    script(here, "th.py", THREADS)
    res = run_cli(["-q", "--idle", "all", "--sampler", "pyinstrument", *profiled(["th.py"])], cwd=here)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    # the hook sees the main thread only: the worker's stack never appears, and its CPU goes to
    # the main thread's stack, which waits in join() for the 1 s the worker burns (the rest of the
    # run is start-up, longer on a busy machine)
    assert not p.find("worker_burn")
    assert p.function_totals("main_waits") > 0.5 * p.totals["attributed_j"]["cpu"]
    assert any("main thread" in n["message"] for n in p.notes)


def test_child_process_cpu_lands_under_the_waiting_stack(here):
    script(here, "kids.py", """
        import subprocess, sys
        def wait_for_child():  # 1.2 CPU-seconds: the child's start and exit (~0.05) stay under a tenth however loaded
            subprocess.run([sys.executable, "-c",
                            "import time\\nend = time.process_time() + 1.2\\nwhile time.process_time() < end: pass"])
        wait_for_child()
    """)
    res = run_cli(["-q", *profiled(["kids.py"])], cwd=here)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    waiting = p.find("wait_for_child")[0]
    kids = [n for n, _ in waiting.walk() if n.function.startswith("[process ")]
    assert len(kids) == 1, [n.function for n, _ in waiting.walk()]
    # the child's own code beneath it: its module, and on a busy machine perhaps the interpreter's
    # exit (threading's _shutdown) caught by a sample after the module ended
    below = {c.function: c for c in kids[0].children}
    assert "<module>" in below and set(below) <= {"<module>", "_shutdown"}, list(below)
    assert below["<module>"].energy_j["cpu"] > 0.9 * kids[0].energy_j["cpu"]
    assert kids[0].energy_j["cpu"] > 0.5 * p.totals["attributed_j"]["cpu"]
    listed = processes(p)
    assert [c["role"] for c in listed] == ["main", "child"]
    assert "process_time" in listed[1]["command"] and listed[1]["cpu_time_s"] > 1.0, listed
    assert listed[1]["parent_pid"] == listed[0]["pid"]


def test_no_children_flag_leaves_child_cpu_out(here):
    script(here, "kids.py", """
        import subprocess, sys
        subprocess.run([sys.executable, "-c", "sum(range(30_000_000))"])
    """)
    res = run_cli(["-q", "--no-children", *profiled(["kids.py"])], cwd=here)
    assert res.returncode == 0
    p = load(here / "p.json")
    assert not [n for n, _ in p.nodes() if n.function.startswith(("[child processes]", "[process "))]
    assert p.totals["cpu_time_s"] < 0.2  # the child's CPU is left to other processes


# -- sensors at fault -----------------------------------------------------------------------------
def fake_rapl(root: Path) -> Path:
    for name, label in (("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram")):
        z = root / name
        z.mkdir(parents=True)
        (z / "name").write_text(label + "\n")
        (z / "energy_uj").write_text("0\n")
        (z / "max_energy_range_uj").write_text("262143328850\n")
    return root


def test_sensor_returning_garbage_is_dropped_and_the_run_goes_on(here):
    root = fake_rapl(here / "powercap")
    script(here, "s.py", f"""
        import os, time
        pkg = {str(root / 'intel-rapl:0' / 'energy_uj')!r}
        end = time.perf_counter() + 0.4
        uj = 0
        while time.perf_counter() < end:  # a counter that counts (one that stands still is judged frozen)
            uj += 10_000
            open(pkg + ".tmp", "w").write(f"{{uj}}\\n")
            os.replace(pkg + ".tmp", pkg)  # whole, as sysfs gives it: never an empty file to read
            time.sleep(0.005)
        open(pkg, "w").write("garbage\\n")
        time.sleep(0.6)
        print("still running")
    """)
    res = run_cli(["--powercap-root", str(root), "--json", "p.json", "-o", "r.html", "s.py"], cwd=here)
    assert res.returncode == 0 and res.stdout == "still running\n"
    p = load(here / "p.json")
    drops = [n for n in p.notes if n["kind"] == "sensor-dropped"]
    assert [d["source"] for d in drops] == ["cpu"]
    # Dropped after the program's first 0.4 s and well before its last 0.6 s: the first read after the
    # garbage (the program's start-up under load comes before both, so the times are held to the run's own)
    assert 0.4 <= drops[0]["at_s"] <= p.totals["duration_s"] - 0.3
    assert "sensor cpu (rapl) dropped" in res.stderr
    assert p.totals["duration_s"] > 1.0  # the other sensor (dram) went on to the end
    assert p.timeline["t_s"][-1] > drops[0]["at_s"] + 0.3


# -- bad input ----------------------------------------------------------------------------------
MARKER = "open('marker', 'w').write('ran')\n"


@pytest.mark.parametrize("make,args,needle", [
    (None, ["missing.py"], "script not found"),
    ("dir", ["adir"], "is a directory"),
    ("ok", ["--no-such-flag", "ok.py"], "unrecognized arguments"),
    ("ok", ["--interval", "-1", "ok.py"], "--interval must be"),
    ("ok", ["--sensor-interval", "abc", "ok.py"], "invalid float value"),
    ("ok", ["--idle", "shrae", "ok.py"], "--idle must be one of"),
    ("ok", ["--sampler", "nope", "ok.py"], "--sampler must be one of"),
    ("ok", ["-o", "nowhere/r.html", "ok.py"], "does not exist"),
    ("ok", ["--json", "/dev/null/x.json", "ok.py"], "--json"),
    ("ok", ["--power-trace", "missing.csv", "ok.py"], "is not a file"),
    ("ok", ["-m", "no_such_module_xyz"], "no module named"),
    (None, [], "no script given"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_runs(here, make, args, needle):
    if make == "dir":
        (here / "adir").mkdir()
    elif make == "ok":
        (here / "ok.py").write_text(MARKER)
    res = run_cli(args, cwd=here)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("energyprof: error: ") and needle in lines[0], res.stderr
    assert not (here / "marker").exists()


@pytest.mark.parametrize("content,needle", [
    ("{not json", "not valid JSON"),
    ('{"schema": "energyprof.profile/1", "meta": {}', "not valid JSON"),
    ('{"schema": "energyprof.profile/99", "meta": {}}', "newer than this energyprof"),
    ('{"schema": "something/1"}', "not an energyprof profile"),
    ('{"schema": "energyprof.profile/1", "meta": {}}', "missing"),
    ("[1, 2]", "not a profile"),
])
def test_bad_profiles_for_report(here, content, needle):
    (here / "bad.json").write_text(content)
    res = run_cli(["report", "bad.json", "-o", "out.html"], cwd=here)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], res.stderr
    assert not (here / "out.html").exists()


def test_truncated_real_profile_is_refused(here):
    script(here, "ok.py", "print(1)\n")
    assert run_cli(["-q", *profiled(["ok.py"])], cwd=here).returncode == 0
    text = (here / "p.json").read_text()
    (here / "cut.json").write_text(text[: len(text) // 2])
    res = run_cli(["report", "cut.json"], cwd=here)
    assert res.returncode == 2 and "truncated" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    json.loads(text)  # the original stays valid


# -- limits: energyprof runs where plain python does, or says in one line why not ------------------
HELLO = "import sys\nwith open(sys.argv[0]) as fh:\n    fh.read()\nprint('hello', flush=True)\n"


def _pids_cgroup() -> Path | None:
    """A pids cgroup this test may make (v1's own hierarchy, or v2 where the pids controller is on)."""
    for root in (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and (root == Path("/sys/fs/cgroup/pids")
                                                  or "pids" in _read(root / "cgroup.subtree_control").split()):
            return root
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _compare_limited(here: Path, preexec, extra: dict[str, str]) -> tuple[tuple, tuple]:
    """(plain python's (status, stdout), energyprof's (status, stdout, stderr)) for one program under
    one limit; the timeouts are hang guards only."""
    script(here, "hello.py", HELLO)
    env = {**{k: v for k, v in os.environ.items() if k != "ENERGYPROF_POWERCAP_ROOT"}, **extra}
    alone = subprocess.run([sys.executable, "hello.py"], cwd=here, capture_output=True, text=True, timeout=120,
                           preexec_fn=preexec, env=env)
    prof = subprocess.run([sys.executable, "-m", "energyprof", "-q", *profiled(["hello.py"])], cwd=here,
                          capture_output=True, text=True, timeout=120, preexec_fn=preexec, env=env)
    return (alone.returncode, alone.stdout), (prof.returncode, prof.stdout, prof.stderr)


def _same_or_one_line(alone: tuple, prof: tuple, needle: str) -> None:
    if prof[0] == 2:  # it said so before the program started
        assert prof[1] == "" and prof[2].count("\n") == 1 and needle in prof[2], prof
    else:
        assert (prof[0], prof[1]) == alone and prof[2] == "", prof
    assert "Traceback" not in prof[2] and "was killed" not in prof[2]


@pytest.mark.parametrize("room", [1, 2, 3, 5])
def test_a_process_limit_leaves_the_run_alone_or_one_line_and_exit_2(here, room):
    """Defect: with room for one more process (RLIMIT_NPROC, a pids cgroup near its max) energyprof
    forked its watcher, could not fork the launcher, and waited forever for the watcher. Root
    ignores RLIMIT_NPROC, so the limit here is a pids cgroup's pids.max, which counts the same
    tasks (processes and threads): the program's interpreter and `room` more."""
    if os.geteuid() != 0:
        pytest.skip("making a pids cgroup needs root (and root ignores RLIMIT_NPROC)")
    root = _pids_cgroup()
    if root is None:
        pytest.skip("no pids cgroup controller to limit the test's processes with")
    group = root / f"energyprof-test-{os.getpid()}-{room}"
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(1 + room))
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup here: {exc}")
    procs = str(group / "cgroup.procs")

    def enter() -> None:
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))

    try:
        alone, prof = _compare_limited(here, enter, {})
        left = _read(group / "cgroup.procs").split()  # the watcher too has gone
    finally:
        for pid in _read(group / "cgroup.procs").split():
            os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    assert alone == (0, "hello\n")
    _same_or_one_line(alone, prof, "process limit")
    assert left == []
    if room == 1:  # energyprof needs threads and its watcher: there is no room for them
        assert prof[0] == 2


@pytest.mark.parametrize("extra", [pytest.param({}, id="linux"), pytest.param({"ENERGYPROF_PORTABLE": "1"}, id="portable")])
@pytest.mark.parametrize("files", [8, 6, 5])
def test_an_open_file_limit_leaves_the_run_alone_or_one_line_and_exit_2(here, files, extra):
    """Defect: under `ulimit -n 8` energyprof printed two chained tracebacks (Launch.abort closed
    descriptor -1) and exited 1, and its watcher then said energyprof had been killed."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))

    alone, prof = _compare_limited(here, limit, extra)
    assert alone == (0, "hello\n")
    _same_or_one_line(alone, prof, "open-file limit")
    if files == 8:  # as python does: the watcher and the launcher each talk over one socket, not two pipes
        assert prof[0] == 0 and load(here / "p.json").meta["exit"] == {"status": "completed"}


def test_the_first_checkpoint_comes_soon_so_an_early_kill_9_leaves_one(here):
    """Defect: the first checkpoint waited a whole interval (30 s by default), so kill -9 (the OOM
    killer, a scheduler's hard kill) in the first interval left nothing of the run. With an
    interval of an hour, a checkpoint seen at all is the early first one."""
    script(here, "sleeper.py", "import time\nprint('ready', flush=True)\ntime.sleep(600)\n")
    proc = start(here, ["-q", "--checkpoint-interval", "3600", *profiled(["sleeper.py"])])  # it said "ready"
    ckpt = here / "p.energyprof-checkpoint.json"
    deadline = time.monotonic() + 120  # a hang guard: the interval is 30 times as long
    while not ckpt.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ckpt.exists()
    proc.kill()
    _, err = proc.communicate(timeout=120)
    assert f"the run up to its last checkpoint is in {ckpt.name} (energyprof report {ckpt.name})" in err, err
    res = run_cli(["report", ckpt.name, "--json", "again.json", "-o", "again.html"], cwd=here)
    assert res.returncode == 0, res.stderr
    again = load(here / "again.json")
    assert again.meta["exit"]["status"] == "checkpoint" and again.totals["duration_s"] > 0
