"""The tree's CPU adds up to the headline CPU: within UNSAMPLED_CPU_SHOWN, or the gap is its own node."""

from __future__ import annotations

import textwrap

import pytest
from hypothesis import given
from hypothesis import strategies as st

from energyprof.core.recording import Recording, Sample, Tick
from energyprof.core.tree import _parents_first, attribute
from energyprof.facts.profile import UNSAMPLED_CPU_NODE
from energyprof.facts.profile import UNSAMPLED_CPU_SHOWN
from energyprof.facts.profile import Profile
from energyprof.facts.profile import load
from energyprof.facts.records import Process

from conftest import profiled, run_cli

S = 1_000_000_000


def tree_cpu(p: Profile) -> float:
    return sum(n.self_cpu_time_s for n, _ in p.root.walk())


def recording(sampled_cpu_ns: int) -> Recording:
    """2 s at 1 CPU by the process's clock (the headline), of which the samples carry `sampled_cpu_ns`."""
    rec = Recording(sources=[{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}])
    work = rec.stacks.intern([("main", "m.py", 1), ("work", "m.py", 5)])
    rec.ticks = [Tick(k * S // 10, (20.0 * k,), k * S // 10, 0, k * S // 10) for k in range(21)]
    rec.samples = [Sample(k * S // 10, (k + 1) * S // 10, work, sampled_cpu_ns // 20, True) for k in range(20)]
    return rec


@pytest.mark.parametrize("policy", ["share", "all"])
def test_cpu_no_sample_carried_is_its_own_node(policy):
    p = attribute(recording(int(1.7 * S)), policy, cpus=1)
    assert p.totals.cpu_time_s == pytest.approx(2.0)
    gap = [n for n in p.root.children if n.function == UNSAMPLED_CPU_NODE]
    assert len(gap) == 1 and gap[0].cpu_time_s == pytest.approx(0.3)
    assert tree_cpu(p) == pytest.approx(p.totals.cpu_time_s)
    assert gap[0].is_special and gap[0].total_energy == 0.0  # the ledger charged no energy to it
    assert sum(n.total_energy for n in p.root.children) == pytest.approx(p.totals.energy_j["cpu"])


def test_a_gap_within_the_margin_adds_no_node():
    p = attribute(recording(int((1 - UNSAMPLED_CPU_SHOWN / 2) * 2 * S)), "share", cpus=1)
    assert not p.find(UNSAMPLED_CPU_NODE)
    assert tree_cpu(p) >= (1 - UNSAMPLED_CPU_SHOWN) * p.totals.cpu_time_s


def test_a_torch_loop_s_tree_cpu_adds_up_to_the_headline(here):
    pytest.importorskip("torch")
    (here / "loop.py").write_text(textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
        for _ in range(100):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    """))
    res = run_cli(profiled("loop.py"), cwd=here, timeout=240)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    headline = p.totals.cpu_time_s
    assert headline > 0
    # Every CPU-second of the headline is in the tree: on a sampled function, or on the labelled gap.
    assert abs(tree_cpu(p) - headline) <= UNSAMPLED_CPU_SHOWN * headline, (tree_cpu(p), headline)
    assert p.find("backward")  # and the loop's own functions hold it


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_the_processes_table_adds_up_to_the_headline_shutdown_included(here, start):
    """The program spends 0.4 CPU-s after its sampler has stopped (an object's __del__ at interpreter
    shutdown: no stream record carries it, only the kernel's figure for the reaped program), beside
    two children of 0.3 CPU-s. The headline holds all of it, and the processes table's rows add up
    to the headline: two views of one run give one number. (The last reading used to be released
    before the run's end was known in some runs, and the shutdown's CPU went with it: the headline
    was then 0.4 s short of the table.)"""
    (here / "prog.py").write_text(textwrap.dedent(f"""
        import multiprocessing as mp, time

        def spin(s):
            end = time.process_time() + s
            while time.process_time() < end:
                pass

        class AtShutdown:
            def __del__(self):
                spin(0.4)

        if __name__ == "__main__":
            mp.set_start_method("{start}")
            keep = AtShutdown()
            spin(0.2)
            kids = [mp.Process(target=spin, args=(0.3,)) for _ in range(2)]
            for k in kids:
                k.start()
            for k in kids:
                k.join()
    """))
    res = run_cli(profiled("prog.py"), cwd=here, timeout=240)
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    rows = p.processes
    main = next(r for r in rows if r.role == "main")
    assert p.totals.cpu_time_s >= 0.2 + 0.4 + 2 * 0.3, p.totals
    assert main.cpu_time_s >= 0.2 + 0.4, rows
    assert sum(r.cpu_time_s for r in rows) == pytest.approx(p.totals.cpu_time_s, abs=1e-6)
    assert abs(tree_cpu(p) - p.totals.cpu_time_s) <= UNSAMPLED_CPU_SHOWN * p.totals.cpu_time_s


def test_the_processes_table_lists_parents_first_when_pids_wrap():
    """pids wrap (at 32768 here: a suite on this machine saw a child get a smaller pid than its
    parent): the table still lists the program first and every process after its parent."""
    rows = [Process(pid=50, parent_pid=100, role="child"), Process(pid=20, parent_pid=1, role="child"),
            Process(pid=30000, parent_pid=4000, role="main"), Process(pid=100, parent_pid=30000, role="worker"),
            Process(pid=30001, parent_pid=30000, role="worker"), Process(pid=7, parent_pid=8, role="child"),
            Process(pid=8, parent_pid=7, role="child")]
    assert [p.pid for p in _parents_first(rows)] == [30000, 100, 50, 30001, 20, 7, 8]


@given(st.lists(st.floats(0.0, 1e4, allow_nan=False), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_a_sources_attributed_energy_is_never_a_round_off_below_zero(parts: list[float], rnd) -> None:
    """A source whose energy all went to energyprof's and idle's shares: the program's rest is 0, never the
    -2.2e-16 J a float subtraction leaves (a profile with it was written, then refused by its own reader);
    a real shortfall stays negative, so a wrong split is still seen."""
    from energyprof.core.tree import _rest

    shuffled = list(parts)
    rnd.shuffle(shuffled)
    whole = sum(shuffled)  # summed in another order than the subtraction takes them
    assert _rest(whole, *parts) >= 0.0
    assert _rest(whole, *parts) <= 1e-9 * max(whole, 1.0)
    assert _rest(whole, *parts, whole + 1.0) < 0.0
