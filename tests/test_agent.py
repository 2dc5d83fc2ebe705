"""The agent inside the program: stdlib only, one wire format, lossless, invisible.

Each reproducer is a real program run under `python -m energyprof` (or the bootstrap alone),
compared with plain python where the output is the program's."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof import load
from energyprof.agent import spool as spool_module
from energyprof.agent import supervised, wire
from energyprof.supervise.stream import StreamReader

from conftest import plain, profiled, run_cli, script

AGENT = Path(supervised.__file__).resolve().parent
BOOT = AGENT / "_boot"
ROOT = AGENT.parent.parent
ANY_TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40)  # surrogates, NUL, tabs included


# -- the package's boundary ---------------------------------------------------------------------
def imports_of(path: Path) -> list[tuple[int, str]]:
    """(level, module) for every import in a file, wherever it sits (lazy imports included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(0, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node.level, node.module or ""))
    return out


def test_the_agent_imports_the_standard_library_and_itself_only():
    own = {p.stem for p in AGENT.glob("*.py")} | {"kernels"}  # and its package of the capture's half
    inner = {p.stem for p in (AGENT / "kernels").glob("*.py")}
    optional = {"pyinstrument", "torch"}  # --sampler pyinstrument; torch.profiler with --gpu-kernels: each imported when chosen
    files = [*AGENT.glob("*.py"), *BOOT.glob("*.py")]
    for f in (AGENT / "kernels").glob("*.py"):  # the capture's half: its siblings, or agent/'s modules, nothing above
        for level, mod in imports_of(f):
            if level:
                top = mod.split(".")[0]
                assert (level == 1 and (mod == "" or top in inner)) or (level == 2 and top in own), (f.name, level, mod)
            else:
                assert mod.split(".")[0] in sys.stdlib_module_names or mod.split(".")[0] in optional, (f.name, mod)
    assert len(files) >= 6
    for f in files:
        for level, mod in imports_of(f):
            top = mod.split(".")[0]
            if level:
                assert level == 1 and (mod == "" or top in own), (f.name, level, mod)
            else:  # sitecustomize: the bootstrap runs the one it hides
                assert top in sys.stdlib_module_names or top in optional or top == "sitecustomize", (f.name, mod)


def test_torch_and_cpythons_private_surface_is_in_one_module():
    """What any torch or CPython release may change is read in agent/kernels/torch_compat.py only, so one
    module says what the capture relies on and which versions it was tested with."""
    private = {"pythonapi", "_C", "kineto_results", "experimental_event_tree", "_profiler_enabled", "_prepare_profiler",
               "_run_on_profiler_start", "_enable_profiler_legacy"}
    home = AGENT / "kernels" / "torch_compat.py"
    found = set()
    for f in ROOT.joinpath("energyprof").rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) else None
            if name in private:
                assert f == home, (f.relative_to(ROOT), node.lineno, name)
                found.add(name)
    assert found == private  # the list names what the module really reads


def test_no_relative_fromlist_on_the_package():
    """`from . import x` in a package loaded by path goes through __import__ and imports
    energyprof's top package (all of it) into the program."""
    for f in AGENT.glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.module, f"{f.name}: from . import {[a.name for a in node.names]}"


def test_the_bootstrap_parses_on_python_2_and_every_python_3():
    path = BOOT / "sitecustomize.py"
    src = path.read_text()
    ast.parse(src, feature_version=(3, 4))  # the oldest grammar ast still knows
    # Python 2's grammar, print statement and all: a SyntaxError here is one on every 2.7 box.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from lib2to3 import pygram, pytree
            from lib2to3.pgen2 import driver
    except ImportError:  # gone in 3.13: ask a Python 2, where there is one
        for name in ("python2", "python2.7"):
            exe = shutil.which(name)
            check = [exe, "-c", "import sys; assert sys.version_info[0] == 2; compile(open(sys.argv[1]).read(), 'b', 'exec')",
                     str(path)] if exe else None
            if check and subprocess.run(check[:2] + ["pass"], capture_output=True).returncode == 0:
                done = subprocess.run(check, capture_output=True, text=True)
                assert done.returncode == 0, done.stderr
                return
        pytest.skip("no lib2to3 (Python 3.13+) and no Python 2 on PATH to parse the bootstrap")
    driver.Driver(pygram.python_grammar, convert=pytree.convert).parse_string(src)


# -- the wire -------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ANY_TEXT, ANY_TEXT, st.integers(0, 10**6)), min_size=1, max_size=20), ANY_TEXT)
def test_any_text_survives_the_wire(tmp_path_factory, frames, label):
    path = str(tmp_path_factory.mktemp("w") / "1-1.spool")
    sp = spool_module.Spool(path)
    sp.write(wire.header(1, 0, 5, False, "", "", label, label))
    for i, fr in enumerate(frames):
        sp.frame(i, fr)
    sp.event(wire.note(label))
    sp.flush()
    recs = StreamReader(path).read()
    h = wire.parse_header(recs[0])
    assert h is not None and (h.label, h.command, h.rank) == (label, label, None)
    assert [(wire.unesc(r[2]), wire.unesc(r[3]), int(r[4])) for r in recs[1:-1]] == frames
    assert recs[-1][0] == wire.NOTE and wire.unesc(recs[-1][1]) == label


def test_a_header_of_another_version_is_not_read():
    good = wire.header(1, 0, 5, True, "0", "0", "", "python x.py").rstrip("\n").split("\t")
    assert wire.parse_header(good) is not None
    assert wire.parse_header([good[0], str(wire.VERSION + 1), *good[2:]]) is None
    assert wire.parse_header(good[:5]) is None


FULL_DISK = """
import os, resource, signal, sys
from energyprof.agent.spool import Spool
from energyprof.supervise.stream import StreamReader

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing us
path = sys.argv[1]
sp = Spool(path)
sp.frame(0, ("f", "a.py", 1)); sp.stack(0, (0,)); sp.flush()
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 100, hard))  # a disk with 100 bytes left
for i in range(50):
    sp.tick(i, i + 1, i, 0, 0); sp.sample(0, 1, True)
sp.frame(1, ("g", "b.py", 2)); sp.stack(1, (0, 1))
sp.flush()
sp.tick(50, 51, 50, 0, 0); sp.sample(1, 7, True)
sp.flush()  # still full: kept definitions wait
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
sp.tick(60, 61, 60, 0, 0); sp.sample(1, 9, True)
sp.flush()
for r in StreamReader(path).read():
    print("|".join(r))
"""


def test_a_full_disk_keeps_the_stacks_and_says_what_was_lost(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "1-1.spool")], capture_output=True,
                         text=True, timeout=60, env=env)
    assert res.returncode == 0, res.stderr
    recs = [ln.split("|") for ln in res.stdout.splitlines()]
    stacks = {}
    for r in recs:
        if r[0] == wire.STACK and r[2] and all(f.isdigit() for f in r[2].split(",")):
            stacks[r[1]] = r[2]
    assert stacks == {"0": "0", "1": "0,1"}  # the stack defined while the disk was full came through whole
    lost = [r for r in recs if r[0] == wire.LOST]
    assert len(lost) == 1 and int(lost[0][2]) >= int(lost[0][1]) and int(lost[0][3]) > 0
    assert ["s", "1", "9", "1", ""] in recs  # writing goes on once there is room
    assert ["s", "1", "7", "1", ""] not in recs  # a sample dropped is dropped, never half-counted later


CUT_WRITES = """
import os, random, resource, signal, sys
from energyprof.agent import wire
from energyprof.agent.spool import Spool
from energyprof.supervise.stream import StreamReader

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
rng = random.Random(int(sys.argv[2]))
for case in range(int(sys.argv[3])):
    path = os.path.join(sys.argv[1], f"{case}-1.spool")
    sp = Spool(path)
    stacks, written, failed = {}, [], False
    for step in range(rng.randint(1, 25)):
        for _ in range(rng.randint(0, 4)):
            sid = len(stacks)
            stacks[sid] = tuple(rng.randrange(50) for _ in range(rng.randint(1, 5)))
            sp.stack(sid, stacks[sid])
        for _ in range(rng.randint(0, 8)):
            if stacks:
                s = (rng.randrange(len(stacks)), rng.randrange(10**9), rng.random() < 0.5)
                written.append(s)
                sp.sample(*s)
        if rng.random() < 0.5:  # a disk with a few bytes left: the write is cut anywhere, or refused
            resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + rng.randint(0, 120), hard))
            failed = True
        sp.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    sp.flush()  # room again: whatever was held comes through
    recs = StreamReader(path).read()
    got = {}
    for r in recs:
        if r[0] == wire.STACK:
            try:
                got[int(r[1])] = tuple(int(f) for f in r[2].split(","))
            except (IndexError, ValueError):
                pass  # a cut definition: the whole one follows
    assert got == stacks, (case, got, stacks)
    read = [(int(r[1]), int(r[2]), r[3] == "1") for r in recs if r[0] == wire.SAMPLE and wire.complete(r)]
    it = iter(written)
    assert all(s in it for s in read), case  # whole samples only, in order, none altered
    assert len(read) == len(written) or failed and any(r[0] == wire.LOST for r in recs), case
print("ok")
"""


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_writes_cut_anywhere_by_a_full_disk_keep_every_stack_and_alter_no_sample(tmp_path, seed):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", CUT_WRITES, str(tmp_path), str(seed), "40"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert (res.returncode, res.stdout) == (0, "ok\n"), res.stderr


def test_the_spool_folder_must_be_absolute_private_and_ours(tmp_path):
    d = tmp_path / "spool"
    d.mkdir(mode=0o700)
    assert supervised.can_serve(str(d))
    os.chmod(d, 0o755)
    assert not supervised.can_serve(str(d))
    os.chmod(d, 0o700)
    assert not supervised.can_serve(os.path.relpath(d))
    assert not supervised.can_serve(str(tmp_path / "gone"))  # a run that has ended


# -- the bootstrap alone -------------------------------------------------------------------------
def boot_env(tmp_path: Path, **config: str) -> dict[str, str]:
    base = {"python": "%d.%d" % sys.version_info[:2], "spool": str(tmp_path / "spool"), "parent": "1",
            "interval": "0.005", "memory": "rss", "follow": "1", "sampler": "threads"}
    base.update(config)
    env = dict(os.environ, PYTHONPATH=str(BOOT))
    env["ENERGYPROF_AGENT"] = "\x1f".join(f"{k}={v}" for k, v in base.items())
    return env


PROBE = "import sys; print('energyprof.agent.supervised' in sys.modules); print('hi')"


@pytest.mark.parametrize("case", ["ended", "other-python", "relative"])
def test_the_bootstrap_is_silent_where_it_cannot_serve(tmp_path, case):
    (tmp_path / "spool").mkdir(mode=0o700)
    config = {"ended": {"spool": str(tmp_path / "gone")}, "other-python": {"python": "2.7"},
              "relative": {"spool": "spool"}}[case]
    res = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=boot_env(tmp_path, **config))
    assert (res.returncode, res.stdout, res.stderr) == (0, "False\nhi\n", "")
    assert os.listdir(tmp_path / "spool") == []


def test_the_bootstrap_serves_a_run_and_imports_only_the_agent(tmp_path):
    (tmp_path / "spool").mkdir(mode=0o700)
    show = "import sys; print(sorted(sys.modules))"
    stdlib = "import __future__, _thread, atexit, importlib, importlib.util, os, sys, time, types; "
    ran = subprocess.run([sys.executable, "-c", show], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env=boot_env(tmp_path))
    # plain python, plus the standard modules the agent imports (what they pull in differs by version)
    bare = subprocess.run([sys.executable, "-c", stdlib + show], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.stderr == bare.stderr == ""
    extra = set(ast.literal_eval(ran.stdout)) - set(ast.literal_eval(bare.stdout))
    agent = ("", ".wire", ".hooks", ".modules", ".own_threads", ".qualnames", ".sampler", ".stacks", ".thread_book",
             ".own_charge", ".spool", ".supervised", ".units", ".autoload")
    assert extra <= {f"energyprof.agent{s}" for s in agent}
    assert len(os.listdir(tmp_path / "spool")) == 1


def test_the_agent_brings_no_typing_into_the_program(tmp_path):
    """The agent's imports become the program's: its annotations import no `typing`. Run with `-S`, as
    site's .pth files may load `typing` themselves; the program imports the bootstrap as site would
    (and, as site does, ignores the ImportError it ends with when there is no sitecustomize of the user's)."""
    (tmp_path / "spool").mkdir(mode=0o700)
    boot = "try:\n import sitecustomize\nexcept ImportError:\n pass\n"
    # a while running, so the sampler's first ticks and periodic check have run
    show = "import sys, time; time.sleep(0.2); print(sorted(sys.modules))"
    ran = subprocess.run([sys.executable, "-S", "-c", boot + show], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60, env=boot_env(tmp_path))
    bare = subprocess.run([sys.executable, "-S", "-c", show], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.stderr == bare.stderr == ""
    loaded, plain_modules = set(ast.literal_eval(ran.stdout)), set(ast.literal_eval(bare.stdout))
    assert "energyprof.agent.supervised" in loaded  # the agent served this run
    assert {"typing", "typing_extensions"} & loaded <= plain_modules
    assert len(os.listdir(tmp_path / "spool")) == 1


# -- programs under the supervisor --------------------------------------------------------------
def same_as_plain(here: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    res = run_cli(profiled(*extra, name), cwd=here, timeout=240)
    ref = plain(here, name)
    assert (res.returncode, res.stdout, res.stderr) == (ref.returncode, ref.stdout, ref.stderr)
    return res


def test_short_lived_threads_keep_their_cpu(here):
    """150 threads x 10 ms of CPU, started one after another: Python reuses one ident for all."""
    script(here, "churn.py", """
        import threading, time
        spent = []
        def burn_in_thread():
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.010:
                pass
            spent.append(time.thread_time() - t0)
        time.sleep(0.05)  # the sampler's next tick sees `threading`: from then on every thread is counted
        for _ in range(150):
            t = threading.Thread(target=burn_in_thread)
            t.start()
            t.join()
        with open("spent.txt", "w") as fh:
            fh.write(repr(sum(spent)))
    """)
    res = run_cli(profiled("churn.py"), cwd=here, timeout=240)
    assert res.returncode == 0, res.stderr
    spent = float((here / "spent.txt").read_text())
    p = load(here / "p.json")
    threads = sum(n.cpu_time_s for n, _ in p.root.walk() if n.function.startswith("[threads: "))
    # Each thread's CPU is its own: read from its clock while it runs and as it ends (a dead
    # thread's clock cannot be read). Only the few microseconds after that last read escape.
    assert 0.9 * spent <= threads <= 1.1 * spent + 0.05, (threads, spent)
    # ... and none of it is the main thread's: before, it was charged to the main thread's join.
    # How much lands on burn_in_thread rather than on its thread's node depends on how often a
    # 10 ms thread is caught running (fewer times beside two CPU hogs): some, not a fixed share.
    joins = sum(n.cpu_time_s for n in p.find("_wait_for_tstate_lock"))
    assert joins <= 0.1 * spent, (joins, spent)
    # The 150 threads run one target: one node that counts them, and the CPU of a thread that ended
    # between two ticks (never caught running) goes to its target beneath it, so nearly all of it is there.
    groups = [n for n in p.root.children if n.function.startswith("[threads: ")]
    assert [g.function for g in groups] == ["[threads: burn_in_thread x150]"], [g.function for g in groups]
    on_target = sum(n.cpu_time_s for n in groups[0].children if n.function == "burn_in_thread")
    assert on_target >= 0.9 * threads, (on_target, threads, spent, [(n.function, n.cpu_time_s) for n in groups[0].children])


def test_a_program_that_closes_every_descriptor_keeps_its_file(here):
    script(here, "daemon.py", """
        import os, time
        os.closerange(3, 256)
        out = open("mine.txt", "w")  # gets the lowest free number: one energyprof may have held
        for i in range(200):
            out.write(f"line {i}\\n")
            if i % 20 == 0:
                time.sleep(0.01)  # the sampler ticks, reads RSS and flushes meanwhile
        print("done")
        # left open: the interpreter flushes it at exit, after atexit handlers ran
    """)
    same_as_plain(here, "daemon.py")
    assert (here / "mine.txt").read_text() == "".join(f"line {i}\n" for i in range(200))
    assert load(here / "p.json").find("<module>")  # and the profile is whole


def test_a_thread_named_with_a_lone_surrogate_does_not_stop_the_sampler(here):
    script(here, "odd.py", """
        import threading, time
        def spin(seconds):
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass
        t = threading.Thread(target=spin, args=(0.1,), name="odd\\ud800\\tname")
        t.start(); t.join()
        def after():
            spin(0.5)
        after()
    """)
    same_as_plain(here, "odd.py")
    p = load(here / "p.json")
    assert p.function_totals("after") > 0
    assert sum(n.cpu_time_s for n in p.find("after")) >= 0.25  # 0.5 s of CPU on the main thread, sampled each 5 ms
    assert any(n.function == "[threads: odd\\ud800\tname x1]" for n, _ in p.root.walk())  # shown as repr shows it
    assert not [n for n in p.notes if "stopped early" in n["message"]]


def test_a_thread_started_with_thread_module_is_known_by_what_it_runs(here):
    script(here, "raw.py", """
        import _thread, time
        done = _thread.allocate_lock()
        done.acquire()
        def raw_spin():
            end = time.thread_time() + 0.3
            while time.thread_time() < end:
                pass
            done.release()
        _thread.start_new_thread(raw_spin, ())
        done.acquire()
        print("done")
    """)
    same_as_plain(here, "raw.py")
    groups = [n for n, _ in load(here / "p.json").root.walk() if n.function.startswith("[threads: ")]
    # not its thread id, which differs in every run and makes one group per thread
    assert [g.function for g in groups] == ["[threads: raw_spin x1]"], [g.function for g in groups]


def test_fork_pool_workers_write_their_tail_before_os_exit(here):
    script(here, "pool.py", """
        import multiprocessing as mp, time
        kept = []
        def keep(i):
            kept.append(bytes(1_000_000) + bytes([i]))  # still allocated when the worker leaves
            end = time.process_time() + 0.05
            while time.process_time() < end:
                pass
            return i
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                print(sum(pool.map(keep, range(8), chunksize=1)))
                pool.close()
                pool.join()
    """)
    same_as_plain(here, "pool.py", "--memory", "exact")
    p = load(here / "p.json")
    kept = sum(n.alloc_bytes or 0 for n in p.find("keep"))
    assert kept >= 8 * 1_000_000  # every worker's `--memory exact` records came through os._exit
    workers = [r for r in p.processes if r["role"] != "main"]
    assert len(workers) >= 2


def test_a_program_that_patches_time_sleep_then_forks_leaves_no_spinning_sampler(here):
    script(here, "patched.py", """
        import os, select, time
        time.sleep = lambda s: None  # a test's mock, say
        pid = os.fork()
        if pid == 0:
            t = time.process_time()
            select.select([], [], [], 0.5)
            with open("child_cpu.txt", "w") as fh:
                fh.write(repr(time.process_time() - t))
            os._exit(0)
        os.waitpid(pid, 0)
        print("ok")
    """)
    same_as_plain(here, "patched.py")
    # a sampler waiting on the real sleep: ~100 ticks of well under 1 ms; a spinning one: most of 0.5 s
    assert float((here / "child_cpu.txt").read_text()) < 0.1


def test_energyprofs_threads_are_born_with_the_programs_signals_blocked(monkeypatch):
    """Defect: a thread blocked the program's signals from its own first line, so one arriving as it
    began (Pool.terminate's SIGTERM to a fork worker whose sampler was starting) could be taken by
    it; the handler then waited for a main thread asleep on a lock, and the worker never ended. A
    thread takes its starter's mask: the starter blocks them for the moment of the start."""
    import _thread
    import signal

    from energyprof.agent import own_threads

    seen = []
    real = _thread.start_new_thread

    def starting(fn, args):
        seen.append(signal.pthread_sigmask(signal.SIG_BLOCK, []))  # the starter's mask at the start
        return real(fn, args)

    monkeypatch.setattr(_thread, "start_new_thread", starting)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    done = _thread.allocate_lock()
    done.acquire()
    own_threads.start(done.release)
    assert done.acquire(timeout=60)
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before  # the starter's own mask, as it was
    assert {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGCHLD} <= seen[0]
    assert signal.SIGSEGV not in seen[0]  # a fault is the thread's own: never blocked


def test_a_single_threaded_program_that_forks_is_not_warned_about_energyprofs_threads(here):
    # Python 3.12+ warns at os.fork() when the process has more than one OS thread: energyprof's
    # own must not count, the program's must. Each fork decides anew.
    script(here, "forks.py", """
        import os, sys, threading, time, warnings
        warnings.simplefilter("always", DeprecationWarning)
        def fork():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
        fork()
        release = threading.Event()
        t = threading.Thread(target=release.wait)
        t.start()
        fork()  # now the program's own threads are two: warned as under python (3.12+)
        release.set()
        t.join()
        print("forked twice")
    """)
    res, ref = run_cli(profiled("forks.py"), cwd=here, timeout=240), plain(here, "forks.py")
    pids = re.compile(r"pid=\d+")
    got = (res.returncode, res.stdout, pids.sub("pid=N", res.stderr))
    assert got == (ref.returncode, ref.stdout, pids.sub("pid=N", ref.stderr))
    assert ref.stderr.count("multi-threaded") == (1 if sys.version_info >= (3, 12) else 0)
    # The decision itself, on every Python: a stand-in warning with CPython's text, muted only
    # while the program's own threads are one.
    script(here, "decide.py", """
        import os, sys, threading, time, warnings
        from energyprof.agent import own_threads
        own_threads.start(time.sleep, 5)
        text = "This process (pid=%d) is multi-threaded, use of fork() may lead to deadlocks in the child." % os.getpid()
        def shown():
            own_threads._before_fork()
            with warnings.catch_warnings(record=True) as seen:
                # energyprof's mute (a message matcher, not text) first, then everything shown
                warnings.filters[:] = [f for f in warnings.filters if f[1] is not None and not isinstance(f[1], str)]
                warnings.filters.append(("always", None, Warning, None, 0))
                warnings.warn(text, DeprecationWarning)
                warnings.warn("another deprecation", DeprecationWarning)
            return [str(w.message)[:12] for w in seen]
        alone = shown()
        release = threading.Event()
        t = threading.Thread(target=release.wait)
        t.start()
        with_thread = shown()
        release.set()
        t.join()
        while own_threads._os_threads() > 2:  # a joined thread's OS thread may linger a moment
            time.sleep(0.01)
        print(alone, with_thread, shown())
    """)
    res = subprocess.run([sys.executable, "decide.py"], cwd=here, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    alone, with_a_thread, alone_again = res.stdout.split("] [")
    assert (alone, with_a_thread, alone_again) == ("['another depr'", "'This process', 'another depr'", "'another depr']\n")


def test_a_relative_tmpdir_still_follows_a_child_in_another_folder(here):
    (here / "sub").mkdir()
    script(here, "cd.py", """
        import subprocess, sys
        def run_child():
            subprocess.run([sys.executable, "-c", "import time\\ndef child_work():\\n    time.sleep(0.3)\\nchild_work()"],
                           cwd="sub", check=True)
        run_child()
    """)
    res = run_cli(profiled("cd.py"), cwd=here, timeout=240, env={"TMPDIR": "."})
    assert (res.returncode, res.stderr) == (0, "")  # the child's bootstrap found the spool: no word from it
    # its own sampler saw it (a sleep lets the sampler run: dozens of samples in 0.3 s)
    assert load(here / "p.json").find("child_work")


def test_the_program_sees_what_plain_python_shows(here):
    """One thread in `threading`, `import sitecustomize` as without energyprof, a user's own
    sitecustomize run once in the program, and only the agent's modules at start."""
    user = here / "userpath"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nwith open(os.environ['LOG'], 'a') as fh:\n"
                                           "    fh.write(str(os.getpid()) + '\\n')\n")
    script(here, "see.py", """
        import os, sys, threading
        print(threading.active_count(), [t.name for t in threading.enumerate()])
        import sitecustomize
        print(os.path.basename(sitecustomize.__file__), sitecustomize.__name__)
        with open("pid.txt", "w") as fh:
            fh.write(str(os.getpid()))
    """)
    env = {"PYTHONPATH": str(user), "LOG": str(here / "log.txt")}
    res = run_cli(profiled("see.py"), cwd=here, timeout=240, env=env)
    ref = subprocess.run([sys.executable, "see.py"], cwd=here, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **env))
    assert (res.returncode, res.stdout, res.stderr) == (ref.returncode, ref.stdout, ref.stderr)
    pid = (here / "pid.txt").read_text()
    assert (here / "log.txt").read_text().split().count(pid) == 1


def test_the_supervisor_reads_a_lost_span_as_a_note_and_stacks_by_their_own_ids(tmp_path):
    from energyprof.core.ledger import Ledger
    from energyprof.supervise.job import JobFeed

    feed = JobFeed(Ledger([{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}]), str(tmp_path))
    sp = spool_module.Spool(str(tmp_path / f"{os.getpid()}-1.spool"))
    sp.write(wire.header(os.getpid(), os.getppid(), 1, False, "", "", "", "python x.py"))
    sp.frame(0, ("f", "a.py", 1))
    sp.frame(1, ("g", "a.py", 5))
    sp.stack(1, (0, 1))  # ids are explicit: a stack written again (after a cut write) replaces itself
    sp.stack(0, (0,))
    sp.event(wire.lost(1_000_000_000, 3_500_000_000, 4096))
    sp.flush()
    feed._read_streams()
    p = feed.procs[os.getpid()]
    table = feed.table
    names = {sid: [table.frames[f][0] for f in table.stacks[g]] for sid, g in p.ids.stacks.items()}
    assert names == {0: ["f"], 1: ["f", "g"]}
    assert [n["message"] for n in feed.notes] == [
        f"process {os.getpid()} could not write its samples for 2.500 s (measured; 4096 bytes dropped, a full disk"
        " or a write error): its stacks over that span are missing, its energy went to the process as a whole"]



def test_a_thread_sees_its_stack_as_under_plain_python(here):
    """The agent notes what a thread runs from `Thread.start`, on the starting thread: the new
    thread's own stack, as the program prints it, holds no frame of energyprof's."""
    script(here, "stack.py", """
        import threading, time, traceback
        time.sleep(0.3)  # the sampler's ticks have seen `threading` imported: its hooks are in
        def work():
            print("".join(traceback.format_stack()).count("energyprof"), len(traceback.extract_stack()))
        t = threading.Thread(target=work)
        t.start()
        t.join()
    """)
    bare = subprocess.run([sys.executable, "stack.py"], cwd=here, capture_output=True, text=True, timeout=60)
    ran = run_cli(["-q", "--json", "p.json", "-o", os.devnull, "stack.py"], cwd=here)
    assert bare.returncode == ran.returncode == 0, ran.stderr
    assert ran.stdout == bare.stdout  # as many frames, none more of energyprof's
