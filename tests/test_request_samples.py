"""Each web request's joules are its own samples': a sample under a route's node goes to the request whose task
(on an event loop) or thread (a WSGI server's, an anyio worker's) ran it, so requests that overlap share nothing
and a request that awaits costs only what it ran. Known answers on a real ledger, the sampler's lookup on real
asyncio tasks and anyio worker threads, and a real uvicorn + FastAPI server driven concurrently on loopback.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from energyprof.agent import units as agent_units
from energyprof.agent.window_facts import (
    COSTLIEST_ONLY, CPU_FACT, END_NEXT, END_RUN, END_THREAD, ENDED_BY, OPENED_AS, PENDING, REQUEST_FACT, RUNS_FACT, SAMPLES_FACT,
    STATUS_FACT, WINDOW_INDEX
)
from energyprof.analysis.units import unit_runs, unit_table
from energyprof.core.ledger import Ledger
from energyprof.core.recording import Sample, StackTable, Tick
from energyprof.core.tallies import WindowTally
from energyprof.core.unit_book import COSTLIEST_KEPT, SAMPLE_RUNS, UnitBook
from energyprof.core.tree import window_record
from energyprof.facts.profile import load

MS = 1_000_000


def _ledger() -> tuple[Ledger, int, int, int]:
    table = StackTable()
    node = table.frame_id(("[request GET /a]", "", 0))
    burn = table.stack_id((node, table.frame_id(("burn", "app.py", 1))))
    other = table.stack_id((table.frame_id(("[request GET /b]", "", 0)), table.frame_id(("other", "app.py", 9))))
    loop = table.stack_id((table.frame_id(("select", "selectors.py", 1)),))
    led = Ledger([{"id": "cpu", "component": "cpu", "method": "measured", "sensor": "replay"}], table, cpus=1)
    return led, burn, other, loop


def _end(led: Ledger, t_ns: int, name: str, opened: int, index: int) -> None:
    led.end_window(t_ns, name, facts={REQUEST_FACT: 1.0, STATUS_FACT: 200.0, WINDOW_INDEX: float(index),
                                      OPENED_AS: float(opened)})


def test_overlapping_requests_are_each_charged_their_own_samples_exactly() -> None:
    """Three requests open over the same 400 ms at a flat 100 W, the program alone on its one CPU (it gets every
    joule). Request 0 (`GET /a`) and request 2 (`GET /b`) burn CPU on two threads, in the shares below; request 1
    (`GET /a` too) awaits throughout, so no sample runs it. Each interval's 10 J go to the samples by CPU:
    request 0 gets 10 x (0.6 + 0.3 + 1 + 0) = 19 J, request 2 the other 21 J, request 1 nothing. Span-based
    figures would give each the program's 40 J (120 J in all)."""
    led, burn, other, loop = _ledger()
    for opened in range(3):
        led.begin_window(0, PENDING, opened)
    a_cpu, b_cpu = [60, 30, 100, 0], [40, 70, 0, 100]
    for k in range(4):
        t0, t1 = k * 100 * MS, (k + 1) * 100 * MS
        led.add_sample(Sample(t0, t1, burn, a_cpu[k] * MS, True, 0, 0, 0))
        led.add_sample(Sample(t0, t1, other, b_cpu[k] * MS, False, 0, 0, 2))
        led.add_sample(Sample(t0, t1, loop, 0, False, 0, 0))  # the loop's other thread, waiting
        if k == 0:
            led.add_tick(Tick(0, (0.0,), 0, 0, 0))
        led.add_tick(Tick(t1, (100.0 * t1 / 1e9,), t1, 0, t1))
    _end(led, 400 * MS, "GET /a", 0, 0)
    _end(led, 400 * MS, "GET /a", 1, 1)
    _end(led, 400 * MS, "GET /b", 2, 0)
    led.finish()
    windows = [window_record(a, "share", 0) for a in led.accounts()]
    joules = [w.program_energy_j["cpu"] for w in windows]
    assert joules == pytest.approx([19.0, 0.0, 21.0], abs=1e-9)
    assert [w.loop[SAMPLES_FACT] for w in windows] == [4, 0, 4]  # a sample with no CPU is a sample of it all the same
    assert [w.loop[CPU_FACT] for w in windows] == pytest.approx([0.19, 0.0, 0.21], abs=1e-12)
    # the same samples build the tree's route nodes: each request's joules are its node's, to the last joule
    assert led.stats[burn].share[0] == pytest.approx(19.0, abs=1e-9)
    assert led.stats[other].share[0] == pytest.approx(21.0, abs=1e-9)
    # the table's total for a route is its requests' sum, and the routes add up to the program's 40 J
    t = unit_table(unit_runs(windows), 40.0, "request")
    assert {g.name: (g.count, g.total_j) for g in t.groups} == {"GET /a": (2, pytest.approx(19.0, abs=1e-9)),
                                                               "GET /b": (1, pytest.approx(21.0, abs=1e-9))}
    assert t.totals_from == "samples" and t.total_j == pytest.approx(40.0, abs=1e-9)
    # the machine's energy over the span stays span-based beside it (the machine spent it whoever ran)
    assert [w.energy_j["cpu"] for w in windows] == pytest.approx([40.0, 40.0, 40.0], abs=1e-9)


def test_a_request_the_runs_end_cut_is_a_request_ended_by_the_run() -> None:
    led, burn, _, _ = _ledger()
    led.begin_window(0, PENDING, 0)
    led.add_tick(Tick(0, (0.0,), 0, 0, 0))
    led.add_sample(Sample(0, 100 * MS, burn, 100 * MS, True, 0, 0, 0))
    led.add_tick(Tick(100 * MS, (10.0,), 100 * MS, 0, 100 * MS))
    led.finish()
    (w,) = [window_record(a, "share", 0) for a in led.accounts()]
    assert (w.name, w.loop[REQUEST_FACT], w.loop[ENDED_BY]) == (PENDING, 1.0, END_RUN)
    assert w.program_energy_j["cpu"] == pytest.approx(10.0, abs=1e-9)
    (r,) = unit_runs([w])
    assert "the run's end" in " ".join(unit_table([r], 10.0, "request").notes)


# -- the sampler's lookup: which request a thread runs -----------------------------------------------------------
def test_a_sample_finds_the_request_whose_task_runs_not_one_that_awaits() -> None:
    """Two requests' tasks on one loop: each coroutine's frame is registered, and a stack taken inside a task
    names that task's request; the other task, awaiting, is on no stack."""
    found: dict[str, int] = {}

    async def handler(name: str, go: asyncio.Event, other: asyncio.Event) -> None:
        await go.wait()
        found[name] = agent_units.unit_of(threading.get_ident(), sys._getframe())
        other.set()

    async def main() -> None:
        e1, e2 = asyncio.Event(), asyncio.Event()
        c1, c2 = handler("one", e1, e2), handler("two", e2, e1)
        for unit, coro in ((7, c1), (8, c2)):
            agent_units.running_frames[id(coro.cr_frame)] = (coro.cr_frame, unit)
        t1, t2 = asyncio.create_task(c1), asyncio.create_task(c2)
        e1.set()
        await asyncio.gather(t1, t2)
        for coro in (c1, c2):
            agent_units.running_frames.pop(id(coro.cr_frame), None)

    asyncio.run(main())
    assert found == {"one": 7, "two": 8}
    assert agent_units.unit_of(threading.get_ident(), sys._getframe()) == -1  # no request here


def test_a_call_handed_to_anyios_thread_pool_runs_as_its_request_on_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starlette and FastAPI hand a request's sync work (a handler, a dependency, response validation) to anyio's
    `to_thread.run_sync`: hooked, the worker thread is the request's for the call's length, whatever its stack (no
    route's node here), and is no one's once the call returns."""
    pytest.importorskip("anyio")
    import anyio.to_thread

    from energyprof.agent import requests as agent_requests
    from energyprof.agent.request_hooks import patch

    monkeypatch.setattr(anyio.to_thread, "run_sync", anyio.to_thread.run_sync)  # put back as it was afterwards
    patch("anyio.to_thread", anyio.to_thread)

    class Req:  # the request as agent/requests.py keeps it: its index, and whether it ended
        opened, done = 41, False

    worker: list[int] = []

    def handler() -> int:
        worker.append(threading.get_ident())
        return agent_units.unit_of(threading.get_ident(), sys._getframe())

    async def main() -> tuple[int, int]:
        alone = await anyio.to_thread.run_sync(handler)  # no request open here: the call is handed over as it is
        agent_requests._current.set(Req())  # type: ignore[arg-type]
        return alone, await anyio.to_thread.run_sync(handler)

    assert anyio.run(main) == (-1, 41)
    assert worker[1] not in agent_units.running_threads  # the worker is no request's between calls


def _run(tmp_path: Path, program: str) -> subprocess.CompletedProcess[str]:
    """`program` (profiled in process at a replayed flat 50 W) run as plain `python` would."""
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    (tmp_path / "prog.py").write_text(textwrap.dedent(program))
    return subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)


POOL_LIFETIMES = """
import gc, sys, threading, time, weakref
import anyio, anyio.to_thread
from energyprof import energy_profile
from energyprof.agent.request_hooks import install_routers
from energyprof.agent.requests import close_request, open_request
from energyprof.agent.units import unit_of

class Job:
    pass

def first(job):
    start = time.thread_time()  # CPU by this thread's clock, so the sampler sees the worker run it
    while time.thread_time() - start < 0.05:
        pass
    return unit_of(threading.get_ident(), sys._getframe())  # what the sampler asks of this worker's stack

async def main():
    req = open_request("GET", on_loop=True)
    job = Job()
    ref = weakref.ref(job)
    seen = await anyio.to_thread.run_sync(first, job)
    del job
    await anyio.to_thread.run_sync(int)  # the worker's next job
    gc.collect()
    close_request(req, 200)
    return seen == req.opened, ref() is None

with energy_profile(json="p.json", output=None, quiet=True, power_trace="trace.csv", interval=0.002):
    install_routers()
    print(*anyio.run(main))
"""


def test_the_sampler_keeps_no_object_of_a_pool_workers_job_alive(tmp_path: Path) -> None:
    """A request's job on anyio's worker thread, sampled and asked which request it runs: once the worker has run its
    next job and the program has dropped the first job's argument, nothing of energyprof's holds it (reading the
    worker's frame's locals would leave a snapshot of them on the frame, on Python <= 3.12)."""
    pytest.importorskip("anyio")
    done = _run(tmp_path, POOL_LIFETIMES)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True True\n", done.stderr  # the job ran as its request's, and its argument is freed


# -- a real server ----------------------------------------------------------------------------------------------
APP = """
import asyncio, time
from fastapi import FastAPI

def work(units):
    start = time.thread_time()  # CPU by this thread's own clock: the same work however busy the machine is
    s = 0
    while time.thread_time() - start < 0.05 * units:
        for i in range(2000):
            s += i * i
    return s

app = FastAPI()

@app.get("/items/{item_id}")
def item(item_id: int):      # sync: on anyio's worker threads
    work(4)
    return {"id": item_id}

@app.get("/ping")
async def ping():            # async: on the event loop, beside the others
    work(1)
    return {"ok": True}

@app.get("/wait")
async def wait():            # awaits: it runs for microseconds of its 0.2 s
    await asyncio.sleep(0.2)
    return {"ok": True}
"""
ROUNDS = {"/wait": 6, "/ping": 6, "/items/1": 3}


def _drive_concurrently(port: int) -> list[int]:
    """Each route's requests one after another on a connection of their own, the three connections at once."""
    statuses: list[int] = []

    def go(path: str, n: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(n):
            conn.request("GET", path)
            r = conn.getresponse()
            r.read()
            statuses.append(r.status)
        conn.close()

    threads = [threading.Thread(target=go, args=item) for item in ROUNDS.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statuses


def _serve(app: str, tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """`app` (a module's source) served by uvicorn under `python -m energyprof` at a replayed flat 50 W."""
    from test_requests import free_port

    (tmp_path / "app.py").write_text(textwrap.dedent(app))
    (tmp_path / "trace.csv").write_text("t_s,cpu\n0,50\n")
    port = free_port()
    env = dict(os.environ)
    env.pop("ENERGYPROF_POWERCAP_ROOT", None)
    proc = subprocess.Popen([sys.executable, "-m", "energyprof", "-q", "--power-trace", "trace.csv", "--json", "p.json",
                             "--interval", "0.005", "--sensor-interval", "0.01", "-m", "uvicorn", "app:app", "--port",
                             str(port), "--log-level", "warning"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    return proc, port


def test_concurrent_requests_on_uvicorn_are_charged_what_they_ran_and_add_up(tmp_path: Path) -> None:
    """A FastAPI app under `python -m energyprof -m uvicorn` at a replayed flat power, its routes driven at once:
    `/wait` awaits 0.2 s while `/ping` (0.05 CPU-s, on the loop) and `/items/{item_id}` (0.2 CPU-s, on worker
    threads) burn CPU beside it. Over its span a `/wait` shares the program's energy with the busy routes
    (span-based, it would read more than a `/ping`); by its samples it reads next to nothing."""
    pytest.importorskip("uvicorn")
    from test_requests import wait_for  # the sequential tests' server helper

    proc, port = _serve(APP, tmp_path)
    try:
        wait_for(port, proc)
        statuses = _drive_concurrently(port)
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    assert statuses == [200] * sum(ROUNDS.values()), err
    profile = load(tmp_path / "p.json")
    runs = unit_runs(profile.windows)
    by = {n: [r for r in runs if r.name == n] for n in ("GET /wait", "GET /ping", "GET /items/{item_id}")}
    assert {n: len(rs) for n, rs in by.items()} == {"GET /wait": 6, "GET /ping": 6, "GET /items/{item_id}": 3}
    assert all(r.samples is not None for r in runs)
    # a `/wait` runs for microseconds: a sample rarely catches it, and one that does carries at most one sampling
    # interval (5 ms) of its thread's CPU, a twentieth of a `/ping`'s 50 ms; both ran on the same loop at the same
    # times, so at the same joules per CPU-second
    wait_j = statistics.mean(r.joules for r in by["GET /wait"])
    ping_j = statistics.mean(r.joules for r in by["GET /ping"])
    assert ping_j > 0 and wait_j < 0.1 * ping_j, (wait_j, ping_j)
    # the table's route totals are the requests' sums, and add up to at most the program's energy
    derived = json.loads((tmp_path / "p.json").read_text())["derived"]["units"]
    table = next(t for t in derived if t["kind"] == "request")
    assert table["totals_from"] == "samples"
    for g in table["groups"]:
        assert g["total_j"] == pytest.approx(sum(r.joules for r in runs if r.name == g["name"]), rel=1e-9, abs=1e-12)
    assert table["total_j"] <= table["program_j"] * (1 + 1e-9)
    # a request's samples are all its task's or thread's while it runs: its handler's, which the tree's route node
    # holds, and the framework's around it (routing, serialising the response). Every sample at the node is one of
    # its requests', so their CPU (by the threads' own clocks) holds the node's, but for the CPU its threads were seen
    # with in a wait and that the run's end moved to their running stacks (the profile's note says how much), and
    # at most one sample interval (5 ms) a request whose last sample read it as it ended
    moved = sum(n.extra.get("cpu_s", 0.0) for n in profile.notes if n.kind == "wait-cpu")
    node_cpu: dict[str, float] = {}
    for n, _ in profile.walk():
        if n.function.startswith("[request "):
            node_cpu[n.function[9:-1]] = node_cpu.get(n.function[9:-1], 0.0) + n.cpu_time_s
    for name in ("GET /ping", "GET /items/{item_id}"):
        ran = sum(w.loop.get(CPU_FACT, 0.0) for w in profile.windows if w.name == name and w.loop.get(REQUEST_FACT))
        assert ran >= node_cpu[name] - moved - 0.005 * len(by[name]) - 1e-9, (name, node_cpu[name], ran, moved)


DEPENDENCY_APP = """
import time
from fastapi import Depends, FastAPI

def heavy():                 # sync: FastAPI runs it on anyio's worker threads, outside the handler
    start = time.thread_time()  # CPU by this thread's own clock: the same work however busy the machine is
    s = 0
    while time.thread_time() - start < 0.3:
        for i in range(2000):
            s += i * i
    return time.thread_time() - start

app = FastAPI()

@app.get("/dep")
async def dep(spent: float = Depends(heavy)):  # async: on the event loop, for microseconds
    return {"spent": spent}
"""


def test_a_sync_dependencys_work_on_the_thread_pool_is_its_requests(tmp_path: Path) -> None:
    """FastAPI runs a sync dependency through the thread pool, outside the route's handler: under
    `python -m energyprof -m uvicorn`, the worker's CPU while it runs is the request's. Each request's samples ran
    the dependency's 0.3 CPU-s (by the worker's own clock) but for what each edge's sample may miss, one sampling
    interval's CPU at most, so their CPU holds at least half of it; unattributed, it would hold next to nothing."""
    pytest.importorskip("uvicorn")
    from test_requests import wait_for  # the sequential tests' server helper

    proc, port = _serve(DEPENDENCY_APP, tmp_path)
    spent: list[float] = []
    try:
        wait_for(port, proc)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for _ in range(2):
            conn.request("GET", "/dep")
            r = conn.getresponse()
            assert r.status == 200
            spent.append(json.loads(r.read())["spent"])
        conn.close()
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    profile = load(tmp_path / "p.json")
    runs = [w for w in profile.windows if w.name == "GET /dep" and w.loop.get(REQUEST_FACT)]
    assert len(runs) == 2, err
    for w, cpu in zip(sorted(runs, key=lambda w: w.start_s), spent):
        assert w.loop[CPU_FACT] >= 0.5 * cpu, (w.loop, cpu)
        assert w.program_energy_j["cpu"] > 0
    # the dependency's own frames stay in the tree: the call's wrapper on the worker is passed over, not a cut
    assert any(n.function == "heavy" and n.cpu_time_s > 0 for n, _ in profile.walk())


THREAD_END = """
import threading, time
from energyprof import energy_profile
from energyprof.agent.requests import name_request, open_request

def serve():                  # a server's thread whose request no hook saw end
    name_request(open_request("GET"), "/lost")

with energy_profile(json="p.json", output=None, quiet=True, power_trace="trace.csv"):
    t = threading.Thread(target=serve)
    t.start()
    t.join()
    time.sleep(0.2)           # the run goes on after the thread's end
    open_request("GET")       # and ends with this one still open
print("done")
"""


def test_a_request_no_hook_ended_closes_with_its_thread_or_the_run_and_says_so(tmp_path: Path) -> None:
    done = _run(tmp_path, THREAD_END)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    profile = load(tmp_path / "p.json")
    lost, cut = unit_runs(profile.windows)
    assert (lost.name, lost.ended_by, cut.name, cut.ended_by) == ("GET /lost", END_THREAD, PENDING, END_RUN)
    assert lost.start_s + lost.time_s < cut.start_s  # it ended with its thread, not at the next request or the run's end
    notes = " ".join(unit_table([lost, cut], 1.0, "request").notes)
    assert "its thread's end" in notes and "the run's end" in notes


OTHER_CONTEXT = """
import contextvars
from energyprof import energy_profile
from energyprof.agent.requests import name_request, open_request

def serve(path):              # a server's thread whose request no hook saw end, each opened in a context of its own
    name_request(open_request("GET"), path)

with energy_profile(json="p.json", output=None, quiet=True, power_trace="trace.csv"):
    contextvars.copy_context().run(serve, "/first")
    contextvars.copy_context().run(serve, "/second")  # same thread: the first ends here, by the next request
print("done")
"""


def test_a_threads_next_request_from_another_context_ends_the_one_before_as_the_next(tmp_path: Path) -> None:
    done = _run(tmp_path, OTHER_CONTEXT)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    first, second = unit_runs(load(tmp_path / "p.json").windows)
    assert (first.name, first.ended_by, second.ended_by) == ("GET /first", END_NEXT, END_RUN)


ODD_APP = """
from energyprof import energy_profile
from energyprof.asgi import EnergyMiddleware

class Odd:                    # an awaitable whose `cr_frame` is no frame (another coroutine library's)
    cr_frame = object()

    def __await__(self):
        return iter(())

def app(scope, receive, send):
    return Odd()

with energy_profile(json="p.json", output=None, quiet=True, power_trace="trace.csv"):
    got = EnergyMiddleware(app)({"type": "http", "method": "GET"}, None, None)
print(type(got).__name__)
"""


def test_the_asgi_hooks_bookkeeping_never_raises_into_the_server(tmp_path: Path) -> None:
    done = _run(tmp_path, ODD_APP)
    assert (done.returncode, done.stdout) == (0, "Odd\n"), done.stderr  # the application's own awaitable, handed back


# -- bounded memory: a long-running server's requests ------------------------------------------------------------
def _tally(name: str, k: int, joules: float) -> WindowTally:
    return WindowTally(name, k, k * MS, [3 * joules], [joules], [2 * joules], end_ns=k * MS + MS // 2, done=True,
                       loop={REQUEST_FACT: 1.0, STATUS_FACT: 200.0}, unit=k, samples=2, cpu_ns=MS // 4)


def test_the_book_keeps_a_bounded_sample_and_the_costliest_and_sums_every_run_exactly() -> None:
    """20 000 runs of one route holding 1, 2, ... 20 000 J: the book keeps 16 sampled and the 3 costliest under each
    policy one by one and folds the rest into one window, so what it holds does not grow with the runs; the count,
    the total (sum 1..N = N(N+1)/2, exact in floats), the time and the max stay exact."""
    book = UnitBook(1, sample_runs=16, costliest=3, seed=7)
    n = 20_000
    for k in range(1, n + 1):
        book.add(_tally("GET /a", k, float(k)))
        if k in (100, 1000):
            assert len(book.tallies()) <= 16 + 2 * 3 + 1
    kept = book.tallies()
    assert len(kept) <= 16 + 2 * 3 + 1
    windows = [window_record(Ledger([{"id": "cpu", "component": "cpu"}]).account(w), "share", 0) for w in kept]
    (rest,) = [w for w in windows if w.loop.get(RUNS_FACT)]
    assert sum(w.program_energy_j["cpu"] for w in windows) == n * (n + 1) / 2
    assert sum(w.other_policy_program_energy_j["cpu"] for w in windows) == n * (n + 1)
    t = unit_table(unit_runs(windows), float(n * (n + 1) / 2), "request", costliest=3)
    (g,) = t.groups
    assert (g.count, g.total_j, g.max_j, g.mean_j, g.sampled) == (n, n * (n + 1) / 2, float(n), (n + 1) / 2, 16)
    assert [r.joules for r in t.costliest] == [20_000.0, 19_999.0, 19_998.0]
    assert sum(r.time_s for r in unit_runs(windows)) == pytest.approx(n * 0.0005, rel=1e-9)  # each run's 0.5 ms
    assert "uniform sample" in " ".join(t.notes) and "16 of 20000" in " ".join(t.notes)


@pytest.mark.parametrize("extra", [1, 2])
def test_a_fold_of_one_run_is_a_fold_and_not_a_run_of_the_sample(extra: int) -> None:
    """SAMPLE_RUNS + 1 (or + 2) runs, each cheaper than the one before: the costliest kept are the first ones, and a
    run the uniform sample drops is folded. A fold stands for the runs it holds however few: in no sample (the table
    says 256 of N, at N = 257 too), its time its runs' 0.5 ms each (its window spans nothing), never a costliest."""
    n = SAMPLE_RUNS + extra
    for seed in range(100):  # a seed under which the fold holds every run the sample left out (none kept as costliest)
        book = UnitBook(1, seed=seed)
        for k in range(1, n + 1):
            book.add(_tally("GET /a", k, float(n + 1 - k)))
        if any(w.loop.get(RUNS_FACT) == extra for w in book.tallies()):
            break
    else:
        pytest.fail("no seed folds every run the sample left out")
    windows = [window_record(Ledger([{"id": "cpu", "component": "cpu"}]).account(w), "share", 0) for w in book.tallies()]
    runs = unit_runs(windows)
    (fold,) = [r for r in runs if r.index is None]  # the book's fold has no index of its own
    assert (fold.runs, fold.sampled) == (extra, False)
    assert fold.time_s == pytest.approx(extra * 0.0005, rel=1e-9)
    assert sum(r.runs for r in runs) == n and sum(r.time_s for r in runs) == pytest.approx(n * 0.0005, rel=1e-9)
    t = unit_table(runs, float(n * (n + 1) / 2), "request")
    (g,) = t.groups
    assert (g.count, g.sampled, g.total_j) == (n, SAMPLE_RUNS, n * (n + 1) / 2)
    assert f"{SAMPLE_RUNS} of {n}" in " ".join(t.notes)
    assert all(r.index is not None for r in t.costliest)


def test_the_books_sample_is_uniform() -> None:
    """Each of 20 runs is in a sample of 4 with probability 4/20: over 2000 books (fixed seeds), each run's share
    of them is 0.2 within 4 standard deviations (sqrt(0.2 x 0.8 / 2000) = 0.009)."""
    hits = [0] * 20
    for seed in range(2000):
        book = UnitBook(1, sample_runs=4, costliest=1, seed=seed)
        for k in range(20):
            book.add(_tally("GET /a", k, 1.0 + k / 1000))  # the costliest is the last: kept outside the sample
        for w in book.tallies():
            if not w.loop.get(COSTLIEST_ONLY) and not w.loop.get(RUNS_FACT):
                hits[w.index] += 1
    assert all(abs(h / 2000 - 0.2) < 4 * 0.009 for h in hits), hits


def test_a_ledger_under_many_requests_keeps_a_bounded_set_and_every_view_counts_them_all() -> None:
    """600 requests one after another, each the program's only sample of its 10 ms at 100 W (1 J each): the
    ledger keeps at most the book's bound of windows, the table counts 600 and 600 J, and the live export's
    counters (told of every request as it is charged) hold all 600."""
    from energyprof.output.live.units import RequestCounters

    led, burn, _, _ = _ledger()
    seen = RequestCounters()
    led.on_unit = lambda w: seen.add(led.account(w), "share")
    led.add_tick(Tick(0, (0.0,), 0, 0, 0))
    for k in range(600):
        t0, t1 = k * 10 * MS, (k + 1) * 10 * MS
        led.begin_window(t0, PENDING, k)
        led.add_sample(Sample(t0, t1, burn, 10 * MS, True, 0, 0, k))
        _end(led, t1, "GET /a", k, k)
        led.add_tick(Tick(t1, (100.0 * t1 / 1e9,), t1, 0, t1))
    led.finish()
    accounts = led.accounts()
    assert len(accounts) <= SAMPLE_RUNS + 2 * COSTLIEST_KEPT + 1
    windows = [window_record(a, "share", 0) for a in accounts]
    (g,) = unit_table(unit_runs(windows), 600.0, "request").groups
    assert (g.count, g.sampled) == (600, SAMPLE_RUNS)
    assert g.total_j == pytest.approx(600.0, abs=1e-9) and g.mean_j == pytest.approx(1.0, abs=1e-12)
    assert seen.count == {"GET /a": 600} and seen.joules["GET /a"]["cpu"] == pytest.approx(600.0, abs=1e-9)


def test_a_checkpoint_keeps_the_books_runs_and_the_requests_still_being_charged() -> None:
    """Ten requests, the checkpoint taken while the last is still open: restored, the ledger goes on charging it by
    its samples, and every request is in the profile once (the book's kept runs listed, none twice)."""
    import json as _json

    from energyprof.core import ledger_state

    led, burn, _, _ = _ledger()
    led.add_tick(Tick(0, (0.0,), 0, 0, 0))

    def request(led: Ledger, k: int, end: bool = True) -> None:
        t0, t1 = k * 10 * MS, (k + 1) * 10 * MS
        if k < 10:
            led.begin_window(t0, PENDING, k)
        led.add_sample(Sample(t0, t1, burn, 10 * MS, True, 0, 0, min(k, 9)))
        if end:
            _end(led, t1, "GET /a", min(k, 9), min(k, 9))
        led.add_tick(Tick(t1, (100.0 * t1 / 1e9,), t1, 0, t1))

    for k in range(10):
        request(led, k, end=k < 9)
    again = ledger_state.restore(_json.loads(_json.dumps(ledger_state.save(led))))
    request(again, 10)  # the open request's last 10 ms, then its end
    again.finish()
    windows = [window_record(a, "share", 0) for a in again.accounts()]
    runs = unit_runs(windows)
    assert [r.index for r in runs] == list(range(10))
    assert [r.joules for r in runs] == pytest.approx([1.0] * 9 + [2.0], abs=1e-9)
