"""Memory per function through the real CLI: peak, growth, exact mode, peak reset."""

from __future__ import annotations

import signal
import sys
import textwrap
from pathlib import Path

import pytest

from energyprof import load

from conftest import run_cli

MB = 1024 * 1024

SCRIPT = """
    import time

    def pause():
        time.sleep(0.05)

    def nothing():
        s = 0
        for i in range(2_000_000):
            s += i
        time.sleep(0.1)

    def alloc_free():
        x = b"\\x01" * (300 * 1024 * 1024)  # pages written, so resident
        time.sleep(0.3)
        del x

    keep = []

    def alloc_keep():
        keep.append(b"\\x02" * (100 * 1024 * 1024))
        time.sleep(0.3)

    pause(); nothing(); pause(); alloc_free(); pause(); alloc_keep(); pause()
"""


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mem")
    (tmp / "m.py").write_text(textwrap.dedent(SCRIPT))
    res = run_cli(["-q", "--json", "p.json", "-o", "r.html", "m.py"], cwd=tmp)
    assert res.returncode == 0, res.stderr
    return load(tmp / "p.json")


def fn(profile, name):
    return profile.find(name)[0]


def test_peak_of_a_function_that_allocates_and_frees(profile):
    base = profile.totals["baseline_rss_bytes"]
    assert fn(profile, "alloc_free").peak_rss_bytes - base >= 250 * MB
    assert abs(fn(profile, "alloc_free").rss_growth_bytes) < 20 * MB  # it gave it all back


def test_growth_of_a_function_that_keeps_memory(profile):
    assert 90 * MB <= fn(profile, "alloc_keep").rss_growth_bytes <= 110 * MB


def test_a_function_that_allocates_nothing_shows_neither(profile):
    base = profile.totals["baseline_rss_bytes"]
    node = fn(profile, "nothing")
    assert node.peak_rss_bytes - base < 20 * MB
    assert abs(node.rss_growth_bytes) < 10 * MB


def test_timeline_and_totals(profile):
    tl = profile.timeline
    assert len(tl["rss_bytes"]) == len(tl["t_s"])
    assert max(tl["rss_bytes"]) - profile.totals["baseline_rss_bytes"] >= 250 * MB
    # the kernel's exact peak (VmHWM, reset at the start) saw the 300 MB too
    if sys.platform.startswith("linux"):  # VmHWM and clear_refs exist there
        assert profile.totals["peak_rss_exact_bytes"] - profile.totals["baseline_rss_bytes"] >= 290 * MB


def test_exact_mode_counts_python_allocations_per_function(tmp_path: Path):
    (tmp_path / "a.py").write_text(textwrap.dedent("""
        kept = []
        def grow():
            for i in range(20000):
                kept.append(bytes(1000) + bytes([i % 256]))  # distinct objects (no constant folding)
        def idle():
            sum(range(3_000_000))  # long enough to be sampled on a busy machine
        grow(); idle()
    """))
    res = run_cli(["-q", "--memory", "exact", "--json", "p.json", "-o", "r.html", "a.py"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    p = load(tmp_path / "p.json")
    grow = p.find("grow")[0]
    assert 18 * MB <= grow.alloc_bytes <= 30 * MB  # 20,000 objects of ~1 kB still alive
    assert not [n for n, _ in p.nodes() if "energyprof" in n.file]  # its own allocations are not the program's
    assert all((n.alloc_bytes or 0) < 100_000 for n in p.find("idle"))  # idle keeps nothing
    assert any(n["kind"] == "memory-exact" for n in p.notes)


def test_decorated_call_gets_its_exact_peak_and_reset_can_be_turned_off(tmp_path: Path):
    (tmp_path / "d.py").write_text(textwrap.dedent("""
        import sys
        from energyprof import energy_profile
        big = b"\\x03" * (200 * 1024 * 1024)   # before the profile: raises the process's peak mark
        del big

        @energy_profile(json=sys.argv[1], quiet=True, peak_reset=sys.argv[2] == "on")
        def small():
            x = b"\\x04" * (50 * 1024 * 1024)
            return len(x)
        small()
    """))
    import subprocess
    import sys

    for mode in ("on", "off"):
        subprocess.run([sys.executable, "d.py", f"{mode}.json", mode], cwd=tmp_path, check=True, timeout=60)
    on, off = load(tmp_path / "on.json"), load(tmp_path / "off.json")
    base = on.totals["baseline_rss_bytes"]
    exact = on.totals["peak_rss_exact_bytes"]
    assert 45 * MB <= exact - base <= 80 * MB  # the call's own peak, not the earlier 200 MB
    assert on.root.peak_rss_bytes >= exact
    assert "peak_rss_exact_bytes" not in off.totals


def test_memory_off_reads_no_rss(tmp_path: Path):
    (tmp_path / "s.py").write_text("print(1)\n")
    res = run_cli(["-q", "--memory", "off", "--json", "p.json", "-o", "r.html", "s.py"], cwd=tmp_path)
    assert res.returncode == 0
    p = load(tmp_path / "p.json")
    assert not any(p.timeline["rss_bytes"])


def test_exact_mode_keeps_the_allocations_of_pool_workers_ended_by_terminate(tmp_path: Path):
    """Defect: `with Pool() as pool:` ends its workers with SIGTERM (Pool.terminate), which runs no
    exit hook, so --memory exact lost every worker's allocations (0.0 MB of 8.0 MB)."""
    (tmp_path / "pool.py").write_text(textwrap.dedent("""
        import multiprocessing as mp
        import time
        kept = []
        def hold(i):
            kept.append([bytes(1000) + bytes([j % 256]) for j in range(2000)])  # ~2 MB a task, kept
            end = time.process_time() + 0.3  # long enough for the allocating frame to be sampled
            while time.process_time() < end:
                pass
            return i
        if __name__ == "__main__":
            with mp.get_context("fork").Pool(2) as pool:
                print(pool.map(hold, range(4), chunksize=1))
            print("pool done")
    """))
    res = run_cli(["-q", "--memory", "exact", "--json", "p.json", "-o", "r.html", "pool.py"], cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["[0, 1, 2, 3]", "pool done"]
    p = load(tmp_path / "p.json")
    held = sum(n.alloc_bytes or 0 for n in p.find("hold"))
    assert 7 * MB <= held <= 12 * MB, held  # 4 tasks of 2,000 objects of ~1 kB, each still held when terminated


def test_a_sigterm_caught_as_a_worker_blocks_still_ends_it(tmp_path):
    """Defect: under --memory exact a fork worker's SIGTERM runs a Python handler (to write the
    worker's records first), and a Python handler runs between bytecodes: a SIGTERM caught just
    before the worker blocked on its queue's lock (held for good by Pool.terminate) waited for ever.
    A `with Pool()` run hung so in 2 of 6 suite runs beside two CPU hogs. `_thread.interrupt_main`
    makes that state at will: the handler tripped, the main thread blocked in C (a pipe never written)."""
    (tmp_path / "stuck.py").write_text(textwrap.dedent("""
        import _thread, os, signal, threading, time
        pid = os.fork()
        if pid == 0:
            kept = [bytes(1000) for _ in range(2000)]
            r, w = os.pipe()
            def trip():
                time.sleep(0.2)
                _thread.interrupt_main(signal.SIGTERM)  # caught, its handler not yet run
            threading.Thread(target=trip, daemon=True).start()
            os.read(r, 1)  # blocked for good, as on Pool.terminate's held lock
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """))
    res = run_cli(["-q", "--memory", "exact", "--json", "p.json", "-o", "/dev/null", "stuck.py"], cwd=tmp_path,
                  timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"child {-signal.SIGTERM}\n"  # ended by its SIGTERM, as the default action ends it


def test_the_first_function_s_memory_is_its_own(tmp_path: Path):
    """The baseline is the RSS before the program's first line: a first function that takes 300 MB and
    gives it back shows its peak above the baseline and no loss. The sampler's thread may first run
    after the program has begun; its first reading was the baseline (309 MB) and the function's growth
    -299.8 MB when the allocation came before it."""
    (tmp_path / "first.py").write_text(textwrap.dedent("""
        import time

        def first():
            x = b"\\x01" * (300 * 1024 * 1024)  # one C call holding the GIL: no other thread runs meanwhile
            t = time.thread_time()
            while time.thread_time() - t < 0.2:  # CPU, so samples see it there on any machine
                pass
            del x

        def then():
            t = time.thread_time()
            while time.thread_time() - t < 0.2:
                pass

        first(); then()
    """))
    res = run_cli(["-q", "--json", "p.json", "-o", "/dev/null", "first.py"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    p = load(tmp_path / "p.json")
    base = p.totals["baseline_rss_bytes"]
    assert base < 200 * MB
    first = fn(p, "first")
    assert first.peak_rss_bytes - base >= 250 * MB
    assert abs(first.rss_growth_bytes) < 20 * MB  # what it took it gave back
    assert p.totals["peak_rss_bytes"] - base >= 250 * MB
