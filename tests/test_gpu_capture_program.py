"""The kernel capture beside the program's own profiling: the program's torch profiler (kineto, legacy,
ITT, NVTX), its warnings, Kineto's log level and its environment stay as under plain python, and the
default capture's optimizer hook never lands inside a step. Real torch (the CPU build) in subprocesses.
"""

from __future__ import annotations

import pytest

from energyprof.core.gpu_tree import KernelFold

# A program with energyprof's capture armed as on by default (every 4 steps, 2 recorded; the optimizer's
# step the cue), as the agent arms it once the program uses CUDA: here on the CPU activity, forced.
_ARMED = """import sys, warnings, torch
from energyprof.agent import kernel_capture as kc
class Sink:
    def add(self, c): print("cycle", file=sys.stderr if 0 else sys.stdout)
    def note(self, t): print("note:", t)
if sys.argv[1] != "off":  # on: as on by default; a spec: asked for (--gpu-kernels --gpu-kernel-steps SPEC)
    acts = [torch.profiler.ProfilerActivity.CPU]
    cap = (kc.KernelCapture(Sink(), activities=acts, every=4, active=2, budget=None) if sys.argv[1] == "on"
           else kc.KernelCapture(Sink(), activities=acts, steps=sys.argv[1]))
    kc._capture = cap; cap.start(); kc._hook_optimizer(cap)
m = torch.nn.Linear(2, 2); opt = torch.optim.SGD(m.parameters(), lr=0.1)
def steps(n, mark=False):
    for i in range(n):
        if sys.argv[2] == "warn":
            warnings.warn("the program's own warning")  # shown once for this line
        with torch.profiler.record_function(f"mystep{i}") if mark else torch.autograd.profiler.record_function("x"):
            m(torch.ones(2)).sum().backward(); opt.step()
"""


def _armed(tmp_path, body: str, on: bool | str, what: str = "-"):
    import subprocess
    import sys

    script = tmp_path / "prog.py"
    script.write_text(_ARMED + body)
    mode = on if isinstance(on, str) else "on" if on else "off"
    return subprocess.run([sys.executable, str(script), mode, what], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)


def _own_profiler_body(before: int) -> str:
    return (f"steps({before})\n"  # before the program's profiler: energyprof's windows run
            "with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:\n"
            "    steps(30, mark=True)\n"
            "print('kept', len({e.name for e in p.events() if e.name.startswith('mystep')}))\n"
            "steps(12)\n")


@pytest.fixture(scope="module")
def plain_own_profiler(tmp_path_factory):
    """The program of each `before` under plain python, run once for both modes (a torch start each)."""
    runs: dict[int, object] = {}

    def plain(before: int):
        if before not in runs:
            runs[before] = _armed(tmp_path_factory.mktemp("plain"), _own_profiler_body(before), False)
        return runs[before]
    return plain


@pytest.mark.parametrize("mode,before", [("on", 1), ("on", 2), ("on", 3), ("3:2", 1), ("3:2", 2), ("3:2", 3)])
def test_the_programs_own_profiler_keeps_its_trace_beside_the_default_capture(tmp_path, mode, before,
                                                                            plain_own_profiler):
    """The program runs torch.profiler.profile around its loop while energyprof's capture is armed by
    default (or asked for on a schedule), started with energyprof's between windows, preparing one
    (warm-up) or recording one: the program's trace keeps every one of its steps, its stderr is as under
    plain python, the run ends normally (a window prepared before the program's profiler and recorded
    after it crashed the process), and energyprof's capture stops for the run (by default) or waits
    (asked for), with a note. Two sessions on one thread stop each other."""
    pytest.importorskip("torch")
    plain, armed = plain_own_profiler(before), _armed(tmp_path, _own_profiler_body(before), mode)
    assert plain.returncode == armed.returncode == 0, armed.stderr
    assert "kept 30" in plain.stdout and "kept 30" in armed.stdout, armed.stdout
    assert _stderr_lines(armed.stderr) == _stderr_lines(plain.stderr)  # the program's own profiler's lines only
    assert "the program runs its own PyTorch profiler" in armed.stdout
    after = armed.stdout.split("kept 30")[1]
    assert ("cycle" in after) == (mode != "on")  # asked for: windows again once the program's is off


@pytest.mark.parametrize("before", [2, 3])
@pytest.mark.parametrize("kind", ["itt", "legacy", "nvtx"])
def test_a_legacy_or_itt_profiler_in_the_program_never_sees_an_exception(tmp_path, kind, before):
    """The program's own legacy, ITT or NVTX profiler is on around its loop, started while energyprof's
    prepares a window or records one: neither its start nor its optimizer's step raises ("Profiler is
    already enabled on this thread"), and the capture stops with a note."""
    pytest.importorskip("torch")
    ctx = {"itt": "torch.autograd.profiler.emit_itt()", "legacy": "torch.autograd.profiler_legacy.profile()",
           "nvtx": "torch.autograd.profiler.emit_nvtx()"}[kind]
    body = f"steps({before})\nwith {ctx}:\n    steps(20)\nprint('program ok')\n"
    r = _armed(tmp_path, body, True)
    if kind == "nvtx" and "not compiled with CUDA" in r.stderr:
        pytest.skip("no NVTX in this torch build")
    assert r.returncode == 0 and "program ok" in r.stdout, r.stderr
    assert "Traceback" not in r.stderr and "the program runs its own PyTorch profiler" in r.stdout


def test_a_failing_capture_step_never_raises_into_the_program():
    """Whatever the profiler raises at a step stays in energyprof: the capture stops, says why, and the
    next steps do nothing."""
    from energyprof.agent import kernel_capture as kc

    notes = []

    class Sink:
        def note(self, text):
            notes.append(text)

    class Broken:
        current_action = type("A", (), {"name": "RECORD"})()
        step_num = 0

        def step(self):
            raise RuntimeError("Profiler is already enabled on this thread.")

        def stop(self):
            raise RuntimeError("not again")

    cap = kc.KernelCapture(Sink(), every=4, active=2)
    cap.live, cap.prof, cap.stepped_by = True, Broken(), "track"
    kc.register(cap)
    try:
        kc.step()
        kc.step()
    finally:
        kc.register(None)
    assert not cap.live and cap.prof is None and "already enabled" in cap.failed
    assert len(notes) == 1 and "already enabled" in notes[0]


def test_the_programs_once_only_warnings_stay_once_only(tmp_path):
    """A warning the program raises at every step shows once under plain python (the default action):
    with the capture starting and stopping windows between, still once (its filters are installed once,
    never entered and left around each transition, which would make Python forget what it showed)."""
    pytest.importorskip("torch")
    body = "steps(40)\n"
    plain, armed = _armed(tmp_path, body, False, "warn"), _armed(tmp_path, body, True, "warn")
    assert plain.returncode == armed.returncode == 0, armed.stderr
    assert plain.stderr.count("UserWarning") == 1
    assert armed.stderr == plain.stderr
    assert armed.stdout.count("cycle") >= 5  # windows did open and close between the warnings


def test_a_capture_that_gives_up_charges_its_last_reduction_to_energyprof(monkeypatch):
    """The capture gives up while its profiler records (the program's own profiler, a failed step): the
    stop reduces the open cycle on the program's thread, and that CPU is energyprof's, as on the normal
    stop path: every nanosecond the capture spent is handed to the sampler, the give-up's included."""
    pytest.importorskip("torch")
    import torch
    from torch.profiler import ProfilerActivity

    from energyprof.agent import sampler
    from energyprof.agent.kernel_capture import KernelCapture

    charged: list[int] = []
    monkeypatch.setattr(sampler, "charge_own", charged.append)
    fold = KernelFold()
    cap = KernelCapture(fold, activities=[ProfilerActivity.CPU])
    cap.start()
    x = torch.randn(16, 16)
    for _ in range(3):
        x = (x @ x).tanh()
    before, spent = len(charged), cap.cost_ns
    cap._give_up("the program runs its own PyTorch profiler")
    assert cap.cycles == 1 and cap.prof is None and not cap.live  # the open cycle was reduced
    assert len(charged) > before and cap.cost_ns > spent  # the reduction's CPU, charged
    assert sum(charged) == cap.cost_ns


def _stderr_lines(err: str) -> list[str]:
    """stderr's lines, Kineto's without the time and the process's ids they carry (`USDT:DATE TIME PID:TID`)."""
    import re

    return [re.sub(r"^([A-Z]+):\S+ \S+ \d+:\d+ ", r"\1 ", line) for line in err.splitlines()]


_OWN_LEVEL = """import os, sys, torch
import torch.autograd.profiler as tap
from energyprof.agent import kernel_capture as kc
seen = set()
real = tap._run_on_profiler_start
def spy(*a, **k):  # the program's environment at the moment any profiler starts (a child started then inherits it)
    seen.add(os.environ.get("KINETO_LOG_LEVEL"))
    return real(*a, **k)
tap._run_on_profiler_start = spy
class Sink:
    def add(self, c): print("cycle")
    def note(self, t): print("note:", t)
if sys.argv[1] == "on":
    cap = kc.KernelCapture(Sink(), activities=[torch.profiler.ProfilerActivity.CPU], steps="2:1")
    kc.register(cap); cap.start()
m = torch.nn.Linear(2, 2)
def steps(n):
    for _ in range(n):
        kc.step()
        m(torch.ones(2)).sum().backward()
steps(6)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
    m(torch.ones(2)).sum()
steps(6)
if sys.argv[1] == "on":
    cap.stop()
print("seen", sorted(map(str, seen)), "end", os.environ.get("KINETO_LOG_LEVEL"))
"""


@pytest.mark.parametrize("user_level", [None, "2"])
def test_the_capture_leaves_kinetos_level_and_the_programs_environment_as_they_were(tmp_path, user_level):
    """energyprof's profiler cycles are kept off stderr without touching the program's environment: a
    KINETO_LOG_LEVEL the user set (or its absence) is what the program sees at every moment, also while
    energyprof's profiler starts; the program's own profiler logs at the level Kineto would have used
    under plain python (its `profiler_start` lines, or the user's level's); the program's stderr is the
    same as under plain python, torch's warnings included, but for times and ids in Kineto's lines."""
    pytest.importorskip("torch")
    import os
    import subprocess
    import sys

    script = tmp_path / "prog.py"
    script.write_text(_OWN_LEVEL)
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    if user_level is not None:
        env["KINETO_LOG_LEVEL"] = user_level
    plain, armed = (subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True,
                                   cwd=tmp_path, timeout=300, env=env) for mode in ("off", "on"))
    assert plain.returncode == armed.returncode == 0, armed.stderr
    assert armed.stdout.count("cycle") >= 4  # energyprof's windows did start and stop around the program's
    want = f"seen {[str(user_level)]} end {user_level}"
    assert want in plain.stdout and want in armed.stdout, armed.stdout
    assert "profiler_start" in plain.stderr  # Kineto's default level shows it: the program's own profiler's
    assert _stderr_lines(armed.stderr) == _stderr_lines(plain.stderr)


_NO_COMPILER = """import sys
from energyprof.agent import kernel_capture as kc
class Sink:
    def add(self, c): print("cycle")
    def note(self, t): print("note:", t)
cap = None
if sys.argv[1] == "on" and sys.argv[2] == "whole":  # the whole run's capture: started before the program imports torch
    cap = kc.KernelCapture(Sink())
    kc.register(cap); cap.start()
import torch
if sys.argv[1] == "on" and cap is None:
    cap = kc.KernelCapture(Sink(), activities=[torch.profiler.ProfilerActivity.CPU], steps=sys.argv[2])
    kc.register(cap); cap.start()
m = torch.nn.Linear(2, 2)  # no optimizer: torch.optim would import the compiler itself
for _ in range(12):
    kc.step()
    m(torch.ones(2)).sum().backward()
if cap is not None:
    cap.stop()
print("imported", sorted(n for n in ("torch._inductor", "torch._dynamo", "sympy") if n in sys.modules))
"""


@pytest.mark.parametrize("spec", ["2:1", "3:3", "whole"])
def test_the_captures_profiler_imports_nothing_into_the_program(tmp_path, spec):
    """torch's profiler prepares each session with `hasattr(torch, "_inductor")`, which torch's lazy modules
    answer by importing the compiler (`torch._inductor`, `torch._dynamo`, sympy: 1.2 s of CPU here). A
    program that never imported it has, after energyprof's cycles, the modules it has under plain python:
    scheduled, and over the whole run (whose first start imports torch itself)."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    script = tmp_path / "prog.py"
    script.write_text(_NO_COMPILER)
    plain, armed = (subprocess.run([sys.executable, str(script), mode, spec], capture_output=True, text=True,
                                   cwd=tmp_path, timeout=300) for mode in ("off", "on"))
    assert plain.returncode == armed.returncode == 0, armed.stderr
    assert "imported []" in plain.stdout  # this program does not load the compiler by itself
    assert armed.stdout.count("cycle") >= 2  # energyprof's cycles did run
    assert armed.stdout.splitlines()[-1] == plain.stdout.splitlines()[-1], armed.stdout


class _NoSpool:
    """Where the capture's records would go: nowhere (these tests look at its hook and steps)."""

    def event(self, line: str) -> None:
        pass


def _linear_and_sgd(torch):
    m = torch.nn.Linear(2, 2)
    return m, torch.optim.SGD(m.parameters(), lr=0.1)


def test_the_default_captures_optimizer_hook_lands_while_the_main_thread_waits_in_join():
    """A program that trains on a thread while its main thread waits in `join()` runs no bytecode on the
    main thread, so a pending call never runs there: after one period unanswered the sampler registers
    the hook itself, once no thread is inside a step, and the training thread's steps are counted."""
    torch = pytest.importorskip("torch")
    import threading

    from energyprof.agent import kernel_capture as kc

    m, opt = _linear_and_sgd(torch)
    seen: dict[str, object] = {}

    main = threading.main_thread().ident

    def train() -> None:
        import sys
        import time

        while sys._current_frames()[main].f_code.co_name != "_wait_for_tstate_lock":
            time.sleep(0.001)  # until the main thread is inside join()
        time.sleep(0.05)  # and past its last bytecode there, into the wait itself
        kc.start_capture(_NoSpool(), auto=True)  # as the sampler does once CUDA is seen
        cap = kc._capture
        for _period in range(3):  # the agent's periods ask again
            kc.hook_when_safe()
            for _ in range(3):
                m(torch.ones(2)).sum().backward()
                opt.step()
        seen.update(hook=cap.hook, steps=cap.steps)
        cap.stop()

    kc._capture = None
    thread = threading.Thread(target=train)
    thread.start()
    thread.join()  # the main thread waits in C: no pending call runs until it returns
    assert seen["hook"] is not None
    assert 6 <= seen["steps"] <= 9  # registered by the second period, each step counted once


def test_the_default_captures_optimizer_hook_never_lands_while_a_step_runs_the_hooks():
    """On by default, the capture starts on the sampler's thread (the program was just seen using CUDA),
    maybe while the program's main thread is inside optimizer.step() running torch's global post-step
    hooks: a hook inserted then makes that loop raise in the program ("OrderedDict mutated during
    iteration", where a hook of the program's follows). Here the program's own first hook holds
    its step there while the capture starts: the step ends normally, the hook is registered on the main
    thread once no step runs (asked again as the sampler's next period does), and it then counts steps."""
    torch = pytest.importorskip("torch")
    import threading

    from torch.optim.optimizer import register_optimizer_step_post_hook

    from energyprof.agent import kernel_capture as kc

    m, opt = _linear_and_sgd(torch)
    inside, go = threading.Event(), threading.Event()

    def programs_hook(*_a):
        if not go.is_set():
            inside.set()
            go.wait(60)

    mine = [register_optimizer_step_post_hook(programs_hook), register_optimizer_step_post_hook(lambda *_a: None)]
    failed = []

    def sampler():  # the sampler's check: CUDA in use, so the capture starts (as on by default)
        try:
            inside.wait(60)
            kc.start_capture(_NoSpool(), auto=True)
        except BaseException as exc:  # noqa: BLE001
            failed.append(exc)
        finally:
            go.set()

    kc._capture = None
    thread = threading.Thread(target=sampler)
    try:
        thread.start()
        m(torch.ones(2)).sum().backward()
        opt.step()  # the program's step, its hooks running while the capture starts
        thread.join()
        assert not failed
        cap = kc._capture
        assert cap is not None and cap.live
        for _ in range(3):  # the sampler's next periods ask again; the main thread runs a few bytecodes
            kc.hook_when_safe()
            sum(range(100))
        assert cap.hook is not None
        steps = cap.steps
        opt.step()
        assert cap.steps == steps + 1
    finally:
        go.set()
        thread.join()
        for handle in mine:
            handle.remove()
        if kc._capture is not None:
            kc._capture.stop()
        kc._capture = None
