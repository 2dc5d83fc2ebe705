"""Threads and processes grouped by what they run, with how many ran it: `[threads: T x150]`,
`[processes: pool worker x4]`. Real threads and real processes under `python -m energyprof` and
in-process; the tree's naming and the comparison of two runs on the pure core."""

from __future__ import annotations

from energyprof.core import ledger_state
import gzip
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from energyprof import load
from energyprof.agent import wire
from energyprof.agent.wire import PROCESS_MARKER
from energyprof.analysis.compare import compare
from energyprof.core.ledger import Ledger
from energyprof.core.recording import Sample, StackTable, Tick
from energyprof.core.tree import build_profile
from energyprof.facts.profile import group_role
from energyprof.supervise.job import JobFeed

from conftest import plain, processes, profiled, report_text, run_cli, script

ROOT = Path(__file__).resolve().parent.parent
S = 1_000_000_000

CHURN = """
import threading, time

def burn_in_thread():
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.010:
        pass

def churn(n):
    for _ in range(n):
        t = threading.Thread(target=burn_in_thread)
        t.start()
        t.join()
"""


def groups(node, prefix: str) -> list:
    return [n for n, _ in node.walk() if n.function.startswith(prefix)]


# -- the pure core ------------------------------------------------------------------------
def _ledger() -> tuple[Ledger, StackTable]:
    stacks = StackTable()
    led = Ledger([{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}], stacks, cpus=1)
    return led, stacks


def _fold(led: Ledger, samples: list[Sample]) -> None:
    led.add_tick(Tick(0, (0.0,), 0, 0, 0))
    for s in samples:
        led.add_sample(s)
    cpu = sum(s.cpu_ns for s in samples)
    led.add_tick(Tick(S, (10.0,), cpu, 0, cpu))
    led.finish()


def test_a_group_node_is_named_with_the_threads_of_every_process_under_it():
    led, stacks = _ledger()
    pool = ("[processes: pool worker]", "", 0)
    head = stacks.intern([pool, ("[threads: fetch]", "", 0)])
    work = stacks.intern([pool, ("[threads: fetch]", "", 0), ("fetch", "w.py", 3)])
    alone = stacks.intern([("[threads: idle]", "", 0)])  # counted, but no sample ever reached it
    main = stacks.intern([("train", "t.py", 1)])
    _fold(led, [Sample(0, S, work, S // 4, False, 0, 11), Sample(0, S, work, S // 4, False, 0, 12),
                Sample(0, S, main, S // 2, True, 0, 10)])
    led.note_threads(11, head, 2)
    led.note_threads(11, head, 3)  # a count is the process's latest: it replaces the one before
    led.note_threads(12, head, 4)
    led.note_threads(10, alone, 7)
    for pid in (11, 12):
        led.note_process(pid, group="[processes: pool worker]")
    p = build_profile(ledger_state.restore(json.loads(json.dumps(ledger_state.save(led)))), "share", {})  # through a checkpoint
    names = [n.function for n, _ in p.root.walk()]
    assert "[processes: pool worker x2]" in names
    assert "[threads: fetch x7]" in names  # 3 threads in one worker, 4 in the other: one node
    assert not any(n.startswith("[threads: idle") for n in names)
    fetch = p.find("fetch")[0]
    assert fetch.cpu_time_s == pytest.approx(0.5)


def test_a_tree_without_counts_keeps_its_names():
    led, stacks = _ledger()
    work = stacks.intern([("[threads: T]", "", 0), ("work", "w.py", 1)])
    _fold(led, [Sample(0, S, work, S // 2, False)])
    p = build_profile(led, "share", {})
    assert p.root.children[0].function == "[threads: T]"


def test_two_runs_groups_match_whatever_their_counts():
    def run(threads: int, cpu: int):
        led, stacks = _ledger()
        head = stacks.intern([("[threads: loader]", "", 0)])
        work = stacks.intern([("[threads: loader]", "", 0), ("load", "l.py", 1)])
        main = stacks.intern([("train", "t.py", 1)])
        _fold(led, [Sample(0, S, work, cpu, False), Sample(0, S, main, S - cpu, True)])
        led.note_threads(0, head, threads)
        return build_profile(led, "all", {})

    a, b = run(3, S // 2), run(5, S // 4)
    assert [c.function for c in a.root.children][0] == "[threads: loader x3]"
    rows = [f for f in compare([a, b]).functions if f.function.startswith("[threads: ")]
    assert [f.function for f in rows] == ["[threads: loader]"]
    assert rows[0].energy.delta == pytest.approx(b.find("[threads: loader x5]")[0].total_energy
                                                 - a.find("[threads: loader x3]")[0].total_energy)
    assert rows[0].energy.delta < 0


def test_group_role_strips_only_a_count():
    assert group_role("[threads: burn_in_thread x150]") == "[threads: burn_in_thread]"
    assert group_role("[processes: pool worker x4]") == "[processes: pool worker]"
    assert group_role("[threads: box]") == "[threads: box]"
    assert group_role("[threads: a x]") == "[threads: a x]"
    assert group_role("load x3]") == "load x3]"


# -- threads, under the supervisor and in-process ------------------------------------------------
def test_a_thread_groups_count_shows_in_every_view(here):
    script(here, "churn.py", CHURN, """
        # The sampler learns that the program uses `threading` at its next tick (it never imports it):
        # a 10 ms thread started and ended before that tick would go uncounted, its CPU the main thread's.
        time.sleep(0.05)
        churn(60)
    """)
    res = run_cli(["--power-trace", "trace.csv", "--json", "p.json", "-o", "r.html", "--folded", "f.txt",
                   "--speedscope", "s.json", "--csv", "c.csv", "--pprof", "p.pb.gz", "churn.py"], cwd=here, timeout=240)
    assert res.returncode == 0, res.stderr
    label = "[threads: burn_in_thread x60]"
    p = load(here / "p.json")
    assert [n.function for n in p.root.children if n.function.startswith("[threads: ")] == [label]
    assert label in res.stderr  # the console's summary
    assert label in report_text(here / "r.html")
    for name in ("f.txt", "s.json", "c.csv"):
        assert label in (here / name).read_text(), name
    assert label.encode() in gzip.decompress((here / "p.pb.gz").read_bytes())


def test_a_thread_pool_is_counted_by_its_threads_not_its_tasks(here):
    script(here, "tp.py", """
        import time
        from concurrent.futures import ThreadPoolExecutor

        def task(i):
            end = time.thread_time() + 0.01
            while time.thread_time() < end:
                pass
            time.sleep(0.005)  # each worker is seen running, and each takes several tasks
            return i

        with ThreadPoolExecutor(max_workers=3) as ex:
            print(sum(ex.map(task, range(60))))
    """)
    res = run_cli(profiled("tp.py"), cwd=here, timeout=240)
    assert res.returncode == 0, res.stderr
    assert res.stdout == f"{sum(range(60))}\n"
    p = load(here / "p.json")
    assert [g.function for g in groups(p.root, "[threads: ")] == ["[threads: ThreadPoolExecutor x3]"]


def run_in_process(here: Path, body: str) -> subprocess.CompletedProcess[str]:
    (here / "s.py").write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "s.py"], cwd=here, capture_output=True, text=True, timeout=240, env=env)


def test_in_process_threads_are_counted_and_their_cpu_is_their_targets(here):
    """`with energy_profile()`: the first thread starts at once, before the sampler's first tick."""
    res = run_in_process(here, CHURN + textwrap.dedent("""
        from energyprof import energy_profile

        with energy_profile(json="p.json", output="r.html", power_trace="trace.csv", quiet=True):
            churn(150)
    """))
    assert res.returncode == 0, res.stderr
    p = load(here / "p.json")
    found = groups(p.root, "[threads: ")
    assert [g.function for g in found] == ["[threads: burn_in_thread x150]"]
    # 150 x 10 ms of CPU, measured by each thread's clock: a thread that ended between two ticks was
    # never caught running, and its CPU goes to its target all the same, not to the group's own node.
    group = found[0]
    on_target = sum(n.cpu_time_s for n in group.children if n.function == "burn_in_thread")
    assert on_target >= 0.9 * group.cpu_time_s, [(n.function, n.cpu_time_s) for n, _ in group.walk()]
    assert group.self_cpu_time_s <= 0.05 * group.cpu_time_s
    assert on_target >= 0.9 * 150 * 0.010


# -- process pools whose workers are new interpreters -------------------------------------------
POOLS = """
import multiprocessing as mp, sys, time
from concurrent.futures import ProcessPoolExecutor

def square(i):
    end = time.process_time() + 0.02
    while time.process_time() < end:
        pass
    return i * i

def run_pool(method):
    with mp.get_context(method).Pool(4) as pool:
        print(sum(pool.map(square, range(40), chunksize=1)))

def run_executor(method):
    with ProcessPoolExecutor(4, mp_context=mp.get_context(method)) as ex:
        print(sum(ex.map(square, range(40))))

if __name__ == "__main__":
    (run_pool if sys.argv[1] == "pool" else run_executor)(sys.argv[2])
"""


@pytest.mark.parametrize("kind, label", [("pool", "[processes: pool worker x4]"),
                                         ("executor", "[processes: process pool worker x4]")])
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_pool_workers_are_one_node_with_their_count(here, kind, label, method):
    script(here, "pools.py", POOLS)
    res = run_cli(profiled("pools.py", kind, method), cwd=here, timeout=240)
    ref = plain(here, "pools.py", kind, method)
    assert (res.returncode, res.stdout, res.stderr) == (ref.returncode, ref.stdout, ref.stderr)
    p = load(here / "p.json")
    found = groups(p.root, "[processes: ")
    assert [g.function for g in found] == [label], [g.function for g in found]
    group = found[0]
    # No worker on a node of its own, and none of multiprocessing's way in (spawn_main, _serve_one)
    # between the group and the worker's loop: its functions start where a forked worker's do.
    assert not [n.function for n, _ in p.root.walk() if "multiprocessing.spawn" in n.function]
    assert "BaseProcess._bootstrap" in [c.function for c in group.children]
    assert not {"spawn_main", "_main", "_serve_one"} & {n.function for n, _ in group.walk()}
    # 40 tasks x 20 ms of the workers' CPU under the one node
    assert sum(n.cpu_time_s for n, _ in group.walk() if n.function == "square") >= 0.8 * 40 * 0.02
    # The workers' CPU that no sample caught (their interpreters starting) is the group's, not a
    # bare process node's nor the run's "[CPU no sample saw]": the node holds nearly all they used.
    main = next(r for r in processes(p) if r["role"] == "main")
    workers = [r for r in processes(p) if r is not main and ("spawn_main" in r["command"] or r["parent_pid"] != main["pid"])]
    assert len(workers) == 4, [(r["pid"], r["parent_pid"], r["command"]) for r in processes(p)]
    used = sum(r["cpu_time_s"] for r in workers)
    assert group.cpu_time_s >= 0.9 * used, (group.cpu_time_s, used)
    assert group.self_cpu_time_s > 0


# -- the job feed, its streams' records in an order the test drives --------------------------------
POOL_ROLE = "[processes: process pool worker]"
FS_CMD = "python -B -c from multiprocessing.forkserver import main; main(8, 9, ['__main__'])"


class Spools:
    """Processes' streams written as their agents write them, `<pid>-<t_ns>.spool` in one folder, pids
    past any pid_max so that /proc knows none of them. Their clocks start an hour from now: no wait of
    the feed's (a parent's samples, a role) runs out while the test drives it, whatever the machine's load."""

    def __init__(self, folder: Path) -> None:
        self.wire, self.folder = wire, folder
        self.base = time.perf_counter_ns() + 3600 * S
        self.paths: dict[int, Path] = {}
        self.fids: dict[int, dict[tuple, int]] = {}

    def hello(self, pid: int, ppid: int, ms: int, forked: bool, label: str, command: str) -> None:
        t = self.base + ms * 1_000_000
        self.paths[pid] = self.folder / f"{pid}-{t}{self.wire.SPOOL_SUFFIX}"
        self.fids[pid] = {}
        self.write(pid, self.wire.header(pid, ppid, t, forked, "", "", label, command))

    def write(self, pid: int, text: str) -> None:
        with open(self.paths[pid], "a", encoding="utf-8") as fh:
            fh.write(text)

    def sample(self, pid: int, ms0: int, ms1: int, frames: list[tuple], main: bool = True) -> None:
        """One tick of `pid`'s sampler, its one thread in `frames` (outermost first) for 10 ms of CPU."""
        w, fids = self.wire, self.fids[pid]
        for fr in frames:
            if fr not in fids:
                fids[fr] = len(fids)
                self.write(pid, w.frame(fids[fr], *fr))
        sid = len(fids) * 1000 + len(frames)  # a stack's id: any the stream defines before it uses it
        self.write(pid, w.stack(sid, tuple(fids[fr] for fr in frames)))
        ms = 1_000_000
        self.write(pid, w.tick(self.base + ms0 * ms, self.base + ms1 * ms, 10 * ms, 0, 0) + w.sample(sid, 10 * ms, main))


def _marker(pid: int) -> tuple:
    return (PROCESS_MARKER, "", pid)


MAIN_STACK = [("<module>", "pools.py", 1), ("run_executor", "pools.py", 9), ("submit", "process.py", 700)]
WORKER_OWN = [("BaseProcess._bootstrap", "process.py", 290), ("_process_worker", "process.py", 230)]


def _feed_groups(here: Path, drive) -> list[str]:
    """The `[processes: ...]` nodes of the profile a JobFeed builds from the streams `drive` writes."""
    led, _ = _ledger()
    feed = JobFeed(led, str(here))
    sp = Spools(here)
    feed.main_pid = 9_000_001
    led.add_tick(Tick(sp.base, (0.0,), 0, 0, 0))
    drive(sp, feed)
    cpu = sum(p.cpu_ns for p in feed.procs.values())
    led.add_tick(Tick(sp.base + S, (10.0,), cpu, 0, cpu))
    led.finish()
    return [g.function for g in groups(build_profile(led, "share", {}).root, "[processes: ")]


@pytest.mark.parametrize("server_cmd, pending", [(FS_CMD, True), ("python child.py", False)], ids=["forkserver", "fork-in-child"])
def test_forked_workers_placed_before_and_after_their_parent_are_one_node(here, server_cmd, pending):
    """A forkserver's workers are forked from it: their stacks begin with its node, which exists only once the
    forkserver is placed (when the main process's samples have reached its start). A worker that learned its
    role before that, and one after, were two nodes: the first at the root, the second under the forkserver.
    The same for a `fork` pool in a child the program started with subprocess (its workers know their role
    as they are forked)."""
    main, fs, w1, w2 = 9_000_001, 9_000_002, 9_000_003, 9_000_004
    server = [("<module>", "<string>", 1), ("main", "forkserver.py", 130)]

    def worker(sp: Spools, pid: int, ms: int) -> None:
        sp.hello(pid, fs, ms, True, sp.wire.LABEL_PENDING if pending else POOL_ROLE, server_cmd)
        if pending:
            sp.write(pid, sp.wire.role(POOL_ROLE))
        sp.sample(pid, ms, ms + 10, [_marker(fs), *server, _marker(pid), *WORKER_OWN])

    def drive(sp: Spools, feed) -> None:
        sp.hello(main, 1, 0, False, "", "python pools.py executor forkserver")
        sp.sample(main, 0, 10, MAIN_STACK)  # the main process's samples so far end before the forkserver began
        sp.hello(fs, main, 20, False, "", server_cmd)
        sp.sample(fs, 20, 30, [_marker(fs), *server])
        worker(sp, w1, 30)
        feed._read_streams()
        sp.sample(main, 10, 50, MAIN_STACK)  # ... and now past it
        feed._read_streams()
        worker(sp, w2, 40)
        feed._read_streams()

    assert _feed_groups(here, drive) == [f"{POOL_ROLE[:-1]} x2]"]


@pytest.mark.parametrize("w1_until, nodes", [(50, 1), (35, 2)])
def test_a_spawned_worker_slow_to_say_hello_joins_its_pool_after_a_peer_ended(here, w1_until, nodes):
    """A spawned worker is placed under the stack its parent ran when it said hello, or where a peer of its
    pool went. One slow to start says hello when its parent has moved on from `Pool()` to `map()`, and its
    peers may have ended by the time its role is read (a pool that finished its tasks without it): it is of
    their pool all the same, having lived beside them, and its node is theirs. A worker that began after
    the other had ended is of another pool (two pools one after the other), under its own stack."""
    main, w1, w2 = 9_000_001, 9_000_003, 9_000_004
    pool = [("<module>", "pools.py", 1), ("run_pool", "pools.py", 13), ("Pool.__init__", "pool.py", 183)]
    mapping = [("<module>", "pools.py", 1), ("run_pool", "pools.py", 13), ("Pool.map", "pool.py", 362)]
    spawn = "python -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"

    def drive(sp: Spools, feed) -> None:
        sp.hello(main, 1, 0, False, "", "python pools.py pool spawn")
        sp.sample(main, 0, 30, pool)
        sp.hello(w1, main, 20, False, sp.wire.LABEL_PENDING, spawn)
        sp.write(w1, sp.wire.role(POOL_ROLE))
        sp.sample(w1, 20, w1_until, [_marker(w1), *WORKER_OWN])
        sp.hello(w2, main, 40, False, sp.wire.LABEL_PENDING, spawn)  # its interpreter began after Pool() returned
        sp.sample(main, 30, 60, mapping)
        feed._read_streams()  # the first worker is placed under Pool(), the second does not know its role yet
        sp.write(w1, sp.wire.end(sp.base + (w1_until + 1) * 1_000_000))
        feed._read_streams()
        assert feed.procs[w1].ended and not feed.procs[w2].placed
        sp.write(w2, sp.wire.role(POOL_ROLE))
        sp.sample(w2, 40, 70, [_marker(w2), *WORKER_OWN])
        feed._read_streams()

    assert _feed_groups(here, drive) == [f"{POOL_ROLE[:-1]} x2]"] * nodes


def test_a_thread_caught_between_its_departure_and_its_removal_is_counted_once():
    """A thread reports its CPU as it ends (`_delete`, hooked), and `threading` drops it from its
    table a moment later: a tick that falls in between sees it live, with no clock to read, and
    departed. Under load a run counted one such thread twice (`x151` for 150 threads)."""
    from energyprof.agent import sampler as sampler_mod

    class Sink:
        def __init__(self) -> None:
            self.counts: dict[int, int] = {}

        def frame(self, *a: object) -> None: ...
        def stack(self, *a: object) -> None: ...
        def tick(self, *a: object) -> None: ...
        def sample(self, *a: object) -> None: ...
        def flush(self) -> None: ...

        def threads(self, sid: int, n: int) -> None:
            self.counts[sid] = n

    release = threading.Event()
    worker = threading.Thread(target=release.wait, name="ending")
    worker.start()
    sink = Sink()
    s = sampler_mod.Sampler(sink, 0.01)
    frames = sys._current_frames()
    try:
        assert worker.ident in frames and worker.ident in threading._active
        sampler_mod._departures.append((worker.native_id, "ending", 0))  # what `_delete`'s hook does first
        s._one(0, 1, frames, 0, 0, 0)
    finally:
        sampler_mod._departures.clear()
        release.set()
        worker.join()
    assert sink.counts[s._group_sids["ending"]] == 1


def test_a_python_child_of_a_shell_found_in_the_same_pass_goes_under_the_shell(here):
    """`energyprof -- bash -c "... && python child.py && ..."`: the shell is found by the walk of /proc once
    its grace for a stream has passed, and placed when its readings are next taken. On a loaded machine the
    child's interpreter says hello in that same pass, between the two: it went under the shell's node,
    which was not there yet, so to the root (`test_a_command_after_double_dash` found no child.py under
    bash). A parent found, not yet placed, is placed before its child."""
    from energyprof.supervise.job import Proc

    main, kid = 9_000_001, 9_000_002
    shell = "bash -c echo from bash && python child.py && exit 3"

    def drive(sp: Spools, feed) -> None:
        # as the walk of /proc registers a process without a stream (JobFeed._scan)
        feed.procs[main] = Proc(pid=main, ppid=1, python=False, command=shell)
        feed.procs[main].t_start = feed.procs[main].last_data = sp.base
        sp.hello(kid, main, 20, False, "", "python child.py")
        sp.sample(kid, 20, 30, [_marker(kid), ("<module>", "child.py", 1), ("burn", "child.py", 3)])
        feed._read_streams()
        feed._read_non_python(sp.base + 40_000_000)  # the rest of the pass (JobFeed.on_tick)

    led, _ = _ledger()
    feed = JobFeed(led, str(here))
    sp = Spools(here)
    feed.main_pid = main
    led.add_tick(Tick(sp.base, (0.0,), 0, 0, 0))
    drive(sp, feed)
    led.add_tick(Tick(sp.base + S, (10.0,), 10_000_000, 0, 10_000_000))
    led.finish()
    root = build_profile(led, "share", {}).root
    (shell_node,) = [n for n in root.children if n.function.startswith("[process ") and "bash" in n.function]
    assert [n.function for n, _ in shell_node.walk() if "child.py" in n.function and n.function.startswith("[process ")]
