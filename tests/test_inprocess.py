"""The decorator's engine (Profiler) in-process: invisible threads, fork-safe, stops cleanly
when starting or stopping fails; the ledger's per-process books."""

from __future__ import annotations

from energyprof.core import ledger_state
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from energyprof import Profiler
from energyprof.core.ledger import Ledger
from energyprof.core.processes import process_table
from energyprof.core.tree import build_profile
from energyprof.drive.profiler import active_profiler
from energyprof.core.recording import Sample, StackTable, Tick

ROOT = Path(__file__).resolve().parent.parent


def native_threads(within: set[str] | None = None) -> set[str]:
    """This process's kernel threads; with `within`, given a moment until none but those are left
    (a thread that has signalled its end may still be listed for an instant; a thread an earlier
    test left behind may end meanwhile, so the check is "nothing new", not "as many")."""
    import time

    tids = set(os.listdir("/proc/self/task"))
    deadline = time.monotonic() + 10
    while within is not None and not tids <= within and time.monotonic() < deadline:
        time.sleep(0.01)
        tids = set(os.listdir("/proc/self/task"))
    return tids


@pytest.fixture
def trace(tmp_path: Path) -> str:
    p = tmp_path / "trace.csv"
    p.write_text("t_s,cpu\n0,50\n")
    return str(p)


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "s.py").write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "s.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def test_profiler_threads_are_invisible_to_the_program(tmp_path, trace):
    res = run_script(tmp_path, f"""
        import threading
        from energyprof import Profiler
        prof = Profiler(power_trace={trace!r}, quiet=True).start()
        print(threading.active_count(), [t.name for t in threading.enumerate()])
        sum(range(200_000))
        profile = prof.stop()
        print(profile.root.samples > 0)
    """)
    assert (res.returncode, res.stdout, res.stderr) == (0, "1 ['MainThread']\nTrue\n", "")


def test_a_forked_child_does_not_own_the_parents_profile(tmp_path, trace):
    res = run_script(tmp_path, f"""
        import os
        from energyprof import Profiler
        from energyprof.drive.profiler import active_profiler
        prof = Profiler(power_trace={trace!r}, quiet=True).start()
        pid = os.fork()
        if pid == 0:
            print("child", active_profiler() is None, prof.stop() is None, flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        profile = prof.stop()
        print("parent", profile is not None and profile.meta["pid"] == os.getpid(), flush=True)
    """)
    assert (res.returncode, res.stdout, res.stderr) == (0, "child True True\nparent True\n", "")


def test_a_failed_start_stops_what_it_started(monkeypatch, trace):
    from energyprof.agent import sampler

    def broken(self):
        raise RuntimeError("no sampler today")

    before = native_threads()
    monkeypatch.setattr(sampler.Sampler, "start", broken)
    prof = Profiler(power_trace=trace, quiet=True)
    with pytest.raises(RuntimeError, match="no sampler today"):
        prof.start()
    assert active_profiler() is None
    assert native_threads(before) <= before  # the collector and watchdog threads are gone
    monkeypatch.undo()
    Profiler(power_trace=trace, quiet=True).start().stop()  # the slot is free again


def test_a_failure_while_stopping_still_stops_everything(monkeypatch, trace):
    before = native_threads()
    prof = Profiler(power_trace=trace, quiet=True).start()

    def sync_fails():
        raise RuntimeError("CUDA error: device lost")

    monkeypatch.setattr(prof, "_cuda_sync", sync_fails)
    profile = prof.stop()
    assert profile is not None and any("device lost" in n["message"] for n in profile.notes)
    assert active_profiler() is None and native_threads(before) <= before


# -- the ledger's per-process books ----------------------------------------------------------------
SOURCES = [{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"},
           {"id": "gpu:0", "component": "gpu:0", "method": "measured", "sensor": "replay"}]


@st.composite
def job(draw):
    """Ticks and samples of up to three processes, delivered out of order."""
    table = StackTable()
    stacks = {pid: [table.intern([(f"p{pid}", "x.py", 1), (f"f{i}", "x.py", i + 2)]) for i in range(3)]
              for pid in (10, 11, 12)}
    ticks, samples = [], []
    t = e0 = e1 = proc = own = busy = 0
    for _ in range(draw(st.integers(2, 20))):
        t += draw(st.integers(1, 30_000_000))
        e0 += draw(st.floats(0, 5))
        e1 += draw(st.floats(0, 5))
        proc += draw(st.integers(0, 40_000_000))
        own += draw(st.integers(0, 1_000_000))
        busy += draw(st.integers(0, 80_000_000))
        ticks.append(Tick(t, (e0, e1), proc + own, own, busy))
    for pid in (10, 11, 12):
        a = 0
        while a < t:
            b = a + draw(st.integers(1, 20_000_000))
            samples.append(Sample(a, b, draw(st.sampled_from(stacks[pid])), draw(st.integers(0, 5_000_000)),
                                  draw(st.booleans()), draw(st.integers(0, 10**9)), pid))
            a = b
    return table, ticks, draw(st.permutations(samples))


@settings(max_examples=60, deadline=None)
@given(job(), st.sampled_from(["share", "all"]))
def test_processes_table_adds_up_to_the_programs_energy(data, policy):
    table, ticks, samples = data
    led = Ledger(SOURCES, table, cpus=2)
    for s in samples:  # all samples first: the supervisor releases a tick only once they are in
        led.add_sample(s)
    for tk in ticks:
        led.add_tick(tk)
    led.finish()
    led.note_process(10, role="main", parent_pid=1, command="python x.py")
    led.note_process(11, role="child", parent_pid=10, command="python x.py")
    rows = process_table(led, policy)
    profile = build_profile(led, policy, {})
    for sid in ("cpu", "gpu:0"):
        assert sum(r["energy_j"][sid] for r in rows) == pytest.approx(profile.totals["attributed_j"][sid], abs=1e-9)
    assert [r["pid"] for r in rows] == [10, 11]  # process 12 was not listed: its energy is the main one's
    for r in rows:
        assert r["peak_rss_bytes"] == (max(s.rss_bytes for s in samples if s.proc == r["pid"]) or None)


def test_checkpoint_keeps_waiting_samples_and_processes():
    table = StackTable()
    a = table.intern([("main", "m.py", 1)])
    led = Ledger(SOURCES[:1], table, cpus=1)
    led.add_tick(Tick(0, (0.0,), 0, 0, 0))
    led.add_tick(Tick(100, (10.0,), 100, 0, 100))
    led.add_sample(Sample(0, 50, a, 50, True, 1000, 7))  # waits: no sample has reached the second tick yet
    led.note_process(7, role="main", command="python m.py")
    resumed = ledger_state.restore(json.loads(json.dumps(ledger_state.save(led))))
    assert resumed._pending == led._pending and resumed.process_info == led.process_info
    resumed.add_sample(Sample(50, 100, a, 50, True, 2000, 7))
    resumed.finish()
    assert resumed.stats[a].share == [pytest.approx(10.0)]
    assert process_table(resumed, "share")[0]["energy_j"]["cpu"] == pytest.approx(10.0)
    assert resumed.stats[a].rss_growth == 1000


def test_gpu_energy_goes_to_the_processes_using_the_gpu():
    """A DataLoader worker's main thread is as busy as the trainer's, but only the trainer
    runs CUDA: the GPU's energy is the trainer's; the CPU's is shared by CPU time."""
    table = StackTable()
    trainer = table.intern([("train_step", "t.py", 1)])
    worker = table.intern([("[DataLoader worker 0]", "", 0), ("__getitem__", "d.py", 1)])

    def run(gpu_procs: set[int]) -> dict[int, dict[str, float]]:
        led = Ledger(SOURCES, table, cpus=2)
        led.gpu_procs = set(gpu_procs)
        led.add_sample(Sample(0, 100, trainer, 50, True, 0, 10))
        led.add_sample(Sample(0, 100, worker, 50, True, 0, 11))
        led.add_tick(Tick(0, (0.0, 0.0), 0, 0, 0))
        led.add_tick(Tick(100, (4.0, 8.0), 100, 0, 100))
        led.finish()
        led.note_process(10, role="main")
        led.note_process(11, role="child")
        return {r["pid"]: r["energy_j"] for r in process_table(led, "all")}

    rows = run({10})
    assert rows[10]["gpu:0"] == pytest.approx(8.0) and rows[11]["gpu:0"] == 0.0
    assert rows[10]["cpu"] == pytest.approx(2.0) and rows[11]["cpu"] == pytest.approx(2.0)
    rows = run(set())  # nobody said: by wall time on every process's main thread
    assert rows[10]["gpu:0"] == pytest.approx(4.0) and rows[11]["gpu:0"] == pytest.approx(4.0)
