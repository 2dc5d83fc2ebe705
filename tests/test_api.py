"""The Python API: decorator (bare and with options), context manager, Profiler, nesting."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from energyprof import Profiler, energy_profile, load
from energyprof.setup.options import OptionError
from energyprof.drive.profiler import active_profiler
from energyprof.facts.profile import THREAD_PREFIX


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "trace.csv"
    p.write_text("t_s,cpu\n0,20\n")
    return str(p)


def spin(seconds: float) -> int:
    """Burn `seconds` of this thread's CPU: on a loaded machine a wall-clock spin may barely run
    (and no sample then finds it), while CPU time is what the sampler charges."""
    end = time.thread_time() + seconds
    n = 0
    while time.thread_time() < end:
        n += 1
    return n


def test_bare_decorator_returns_value_and_prints_summary(capsys):
    @energy_profile
    def work(x):
        spin(0.05)
        return x * 2

    assert work(21) == 42
    assert work.__name__ == "work"
    err = capsys.readouterr().err
    assert "energyprof: " in err and "work" in err and "estimated" in err


def test_decorator_with_options_writes_json_and_reraises(tmp_path, trace, capsys):
    out = tmp_path / "p.json"

    @energy_profile(json=str(out), power_trace=trace, idle="all", quiet=True)
    def fails():
        spin(0.05)
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        fails()
    p = load(out)
    assert p.meta["exit"]["status"] == "exception" and "boom" in p.meta["exit"]["exception"]
    assert p.meta["idle_policy"] == "all"
    assert p.totals["energy_j"]["cpu"] == pytest.approx(20.0 * p.totals["duration_s"], rel=0.02)
    assert capsys.readouterr().err == ""  # quiet


def test_decorated_function_is_the_root_of_its_profile(tmp_path, trace):
    out = tmp_path / "p.json"

    def inner():
        spin(0.1)

    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    def outer():
        inner()

    outer()
    p = load(out)
    assert p.meta["target"].endswith("outer")
    # a thread that runs beside the test (a test runner's own, as pytest-xdist's) is not the function's
    mine = [c for c in p.root.children if not c.function.startswith(THREAD_PREFIX)]
    names = [n.function.rsplit(".", 1)[-1] for c in mine for n, _ in c.walk()]
    assert names[0] == "outer" and "inner" in names and "spin" in names
    assert "test_decorated_function_is_the_root_of_its_profile" not in names  # the caller is outside


def test_async_function(tmp_path, trace):
    out = tmp_path / "p.json"

    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    async def work():
        await asyncio.sleep(0.02)
        return "ok"

    assert asyncio.iscoroutinefunction(work)
    assert asyncio.run(work()) == "ok"
    assert load(out).totals["duration_s"] > 0.015


def test_generator_behaves_as_without_the_decorator(tmp_path, trace):
    out = tmp_path / "p.json"

    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    def gen(n):
        for i in range(n):
            yield i * i

    assert list(gen(4)) == [0, 1, 4, 9]
    assert out.exists()


def test_context_manager_and_windows(tmp_path, trace):
    out = tmp_path / "p.json"
    walls = []
    with energy_profile(json=str(out), power_trace=trace, quiet=True) as prof:
        for epoch in range(2):
            t0 = time.perf_counter()
            with prof.window("epoch", epoch):
                spin(0.05)
            walls.append(time.perf_counter() - t0)
    p = load(out)
    assert [(w["name"], w["index"]) for w in p.windows] == [("epoch", 0), ("epoch", 1)]
    for w, wall in zip(p.windows, walls):
        assert 0.05 <= w["time_s"] <= wall  # the window is the span it enclosed, however slow the machine
        assert w["energy_j"]["cpu"] == pytest.approx(20.0 * w["time_s"], rel=0.3)


def test_re_entering_one_profile_object_stops_the_profile_it_started(tmp_path, trace):
    """Defect: the inner `with` forgot the outer one's session, so the profile ran on unstopped."""
    out = tmp_path / "p.json"
    block = energy_profile(json=str(out), power_trace=trace, quiet=True)
    with block as outer:
        with block as inner:
            spin(0.02)
        assert inner is outer and active_profiler() is not None  # the inner one is part of the outer profile
        spin(0.02)
    assert active_profiler() is None
    assert load(out).totals["duration_s"] >= 0.04
    with block:  # the object serves again
        spin(0.01)
    assert active_profiler() is None


def test_one_profile_object_entered_from_two_threads_is_ended_by_the_thread_that_started_it(tmp_path, trace):
    """Defect: the object kept one stack of sessions for every thread: thread A's profile ran on
    past A's block, and thread B's exit ended it, with B's exception. Now B's block is part of
    A's profile (one profile runs in a process at a time) and A's exit ends it."""
    import threading

    out = tmp_path / "p.json"
    block = energy_profile(json=str(out), power_trace=trace, quiet=True)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def a() -> None:
        with block as prof:
            seen["a"] = prof
            a_in.set()
            assert b_in.wait(timeout=60)  # a hang guard
            spin(0.02)
        seen["after a"] = active_profiler()
        a_out.set()

    def b() -> None:
        assert a_in.wait(timeout=60)
        try:
            with block as prof:
                seen["b"] = prof
                b_in.set()
                assert a_out.wait(timeout=60)
                raise ValueError("b's own failure")
        except ValueError:
            pass

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert seen["b"] is seen["a"] is not None  # B's block ran inside A's profile
    assert seen["after a"] is None  # ended at A's exit, not left running for B to end
    assert load(out).meta["exit"] == {"status": "completed"}  # A's block ended cleanly; B's error is not its
    assert block._sessions == {}


def test_profiler_start_stop(trace):
    prof = Profiler(power_trace=trace, quiet=True, interval=0.002)  # spin is 25 samples, not 5
    prof.start()
    spin(0.05)
    p = prof.stop()
    assert active_profiler() is None
    assert p.totals["energy_j"]["cpu"] > 0
    assert any(n.function == "spin" for n, _ in p.nodes())


def test_nested_decorated_calls_are_part_of_the_outer_profile(tmp_path, trace):
    outer_json, inner_json = tmp_path / "outer.json", tmp_path / "inner.json"

    @energy_profile(json=str(inner_json), power_trace=trace, quiet=True)
    def inner():
        spin(0.05)
        return 1

    @energy_profile(json=str(outer_json), power_trace=trace, quiet=True)
    def outer():
        return inner() + inner()

    assert outer() == 2
    assert outer_json.exists() and not inner_json.exists()
    p = load(outer_json)
    assert p.function_totals("test_nested_decorated_calls_are_part_of_the_outer_profile.<locals>.inner") > 0


def test_recursive_decorated_function(tmp_path, trace):
    out = tmp_path / "p.json"

    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    def fact(n):
        return 1 if n <= 1 else n * fact(n - 1)

    assert fact(10) == 3628800
    assert out.exists()


def test_concurrent_calls_from_threads_profile_once(tmp_path, trace):
    """The first call profiles; calls from other threads meanwhile run unprofiled (they are
    already inside the running profile when the all-threads sampler is on)."""
    out = tmp_path / "p.json"
    results = []
    started = threading.Barrier(3)

    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    def work(i):
        spin(0.1)
        return i

    def call(i):
        started.wait()
        results.append(work(i))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [0, 1, 2]
    assert active_profiler() is None
    assert out.exists()


def test_starting_twice_is_an_error(trace):
    prof = Profiler(power_trace=trace, quiet=True)
    prof.start()
    try:
        with pytest.raises(RuntimeError, match="already running"):
            Profiler(power_trace=trace, quiet=True).start()
    finally:
        prof.stop()


@pytest.mark.parametrize("kwargs", [{"idle": "some"}, {"interval": -1}, {"sensor_interval": 0}, {"bogus": 1},
                                    {"output": "/nonexistent-dir/r.html"}, {"pue": 0.5}])
def test_bad_options_are_refused_with_one_line(kwargs):
    with pytest.raises(OptionError) as info:
        energy_profile(**kwargs)
    assert "\n" not in str(info.value)


def test_pyinstrument_sampler(tmp_path, trace):
    out = tmp_path / "p.json"

    @energy_profile(json=str(out), power_trace=trace, sampler="pyinstrument", quiet=True, interval=0.002)
    def work():
        spin(0.1)

    work()
    p = load(out)
    assert p.meta["sampler"] == "pyinstrument"
    assert p.function_totals("spin") > 0.5 * p.totals["attributed_j"]["cpu"]


def test_context_manager_generator_keeps_its_semantics(tmp_path, trace):
    from contextlib import contextmanager

    out = tmp_path / "p.json"
    events = []

    @contextmanager
    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    def resource():
        events.append("enter")
        try:
            yield 5
        finally:
            events.append("exit")

    with resource() as v:
        assert v == 5
    with pytest.raises(KeyError):
        with resource():
            raise KeyError("inside")
    assert events == ["enter", "exit", "enter", "exit"]
    assert out.exists()


def test_with_block_tree_holds_what_the_block_called(tmp_path, trace):
    """The block is the root: the functions it calls are its children (the function holding
    the block and its callers are outside the profile)."""
    out = tmp_path / "p.json"
    walls: dict[str, float] = {}

    def timed(name, fn, *args):
        t0 = time.perf_counter()
        fn(*args)
        walls[name] = time.perf_counter() - t0

    def inner():
        spin(0.15)

    def holder():
        with energy_profile(json=str(out), power_trace=trace, quiet=True):
            timed("inner", inner)
            timed("spin", spin, 0.1)

    holder()
    p = load(out)
    kids = {c.function.rsplit(".", 1)[-1]: c for c in p.root.children}
    assert "timed" in kids and "holder" not in kids  # the block's callees, not its callers
    under = {c.function.rsplit(".", 1)[-1]: c for c in kids["timed"].children}
    assert under["inner"].children[0].function == "spin"
    # samples cover the wall time the block measured itself, less what a starved sampler missed,
    # plus at most the span of the one sample that began before the call (an interval and a
    # GIL hand-off, allowed 50 ms on a busy machine)
    for name in ("inner", "spin"):
        assert 0 < under[name].time_s <= walls[name] + 0.05, (name, under[name].time_s, walls)


def test_an_abandoned_generator_stops_its_profile(tmp_path, trace):
    """Defect: `for x in gen(): break` left the profile running; later calls ran unprofiled."""
    import gc

    out, later = tmp_path / "gen.json", tmp_path / "later.json"

    @energy_profile(json=str(out), power_trace=trace, quiet=True)
    def numbers():
        for i in range(1000):
            spin(0.002)
            yield i

    for x in numbers():
        if x == 2:
            break
    gc.collect()
    assert active_profiler() is None
    assert load(out).meta["exit"]["status"] == "completed"

    @energy_profile(json=str(later), power_trace=trace, quiet=True)
    def after():
        spin(0.02)

    after()
    assert load(later).meta["target"].endswith("after")


def test_value_and_exception_pass_through_when_the_report_cannot_be_written(tmp_path, trace, capsys):
    folder = tmp_path / "gone"
    folder.mkdir()

    @energy_profile(json=str(folder / "p.json"), power_trace=trace, summary=False)
    def answer(fail: bool):
        spin(0.01)
        folder.rmdir()  # checked when the profile started; gone by the time the report is written
        if fail:
            raise KeyError("mine")
        return 42

    assert answer(False) == 42
    folder.mkdir()
    with pytest.raises(KeyError, match="mine"):
        answer(True)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(ln.startswith("energyprof: error: could not write") for ln in lines)
    assert active_profiler() is None


def test_a_stop_that_returns_nothing_writes_and_prints_nothing(tmp_path, trace, capsys, monkeypatch):
    """In a forked child Profiler.stop() returns None: the parent's profile owns the outputs."""
    original = Profiler.stop

    def child_stop(self, *args, **kwargs):
        original(self, *args, **kwargs)
        return None

    monkeypatch.setattr(Profiler, "stop", child_stop)
    out = tmp_path / "p.json"

    @energy_profile(json=str(out), power_trace=trace)
    def work():
        spin(0.01)
        return "done"

    assert work() == "done"
    with energy_profile(json=str(out), power_trace=trace):
        spin(0.01)
    assert not out.exists() and capsys.readouterr().err == ""


def test_a_failed_start_runs_the_function_unprofiled_and_says_so(tmp_path, trace, capsys, monkeypatch):
    def broken(self, *args, **kwargs):
        raise OSError("no sampler today")

    monkeypatch.setattr(Profiler, "_start", broken)

    @energy_profile(json=str(tmp_path / "p.json"), power_trace=trace)
    def work():
        return 5

    assert work() == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "running unprofiled" in err[0] and "no sampler today" in err[0]
    assert active_profiler() is None


def test_a_fifo_given_as_checkpoint_to_the_api_is_never_removed(tmp_path, trace):
    """Defect: a device or FIFO given as the checkpoint was unlinked at the end (/dev/null was removed)."""
    import os
    import stat

    fifo = tmp_path / "ckpt.fifo"
    os.mkfifo(fifo)
    with energy_profile(json=str(tmp_path / "p.json"), power_trace=trace, quiet=True, checkpoint=str(fifo),
                        checkpoint_interval=3600):
        spin(0.01)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and load(tmp_path / "p.json")


@pytest.mark.parametrize("interval, sensor_interval, cell", [(0.01, 0.05, 0.01), (0.02, 0.004, 0.004)])
def test_timeline_cells_are_as_fine_as_the_finer_rate(trace, interval, sensor_interval, cell):
    """A cell finer than both the stack samples and the sensor reads holds nothing more, and every
    tick pays for each cell it spans: the grid starts at the finer of the two rates (0.3 s of run
    fits 1,000 cells, so no regrid widens it)."""
    prof = Profiler(power_trace=trace, quiet=True, interval=interval, sensor_interval=sensor_interval)
    prof.start()
    spin(0.3)
    p = prof.stop()
    starts = p.timeline.start_s
    assert len(starts) >= 10
    assert {round((b - a) / cell, 6) for a, b in zip(starts, starts[1:])} == {1.0}
