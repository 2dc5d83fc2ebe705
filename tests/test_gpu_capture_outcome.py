"""The capture never changes the program's outcome: a read of the profiler's results that hangs is given up
after a bound, and what the profiler raises (KeyboardInterrupt and SystemExit included) stays inside."""

from __future__ import annotations

import _thread
import time

import pytest

from energyprof.agent.kernel_capture import KernelCapture


class _Sink:
    def __init__(self) -> None:
        self.cycles: list = []
        self.notes: list[str] = []

    def add(self, cycle) -> None:
        self.cycles.append(cycle)

    def note(self, text: str) -> None:
        self.notes.append(text)


class _Results:
    def __init__(self, events) -> None:
        self._events = events

    def events(self):
        return self._events()

    def experimental_event_tree(self):
        return []


class _Prof:
    def __init__(self, events) -> None:
        self.profiler = type("P", (), {"kineto_results": _Results(events)})()


def test_a_read_that_hangs_is_given_up_after_the_bound():
    """The profiler's results never come back: the program's thread waits the bound, not forever; the
    capture stops for the run and says why; no cycle is handed on."""
    stuck = _thread.allocate_lock()
    stuck.acquire()
    sink = _Sink()
    cap = KernelCapture(sink, every=100, active=3)
    cap.live = True
    cap.read_bound_s = 0.2

    def hang():
        stuck.acquire()  # released at the end of the test: the left thread then ends
        return []

    t0 = time.monotonic()
    cap._ready(_Prof(hang))
    waited = time.monotonic() - t0
    stuck.release()
    assert not cap.live and "took over 0.2 s" in (cap.failed or "")
    assert sink.cycles == [] and any("took over" in n for n in sink.notes)
    assert waited >= 0.2  # the bound, waited once (no upper bound in wall time: the machine may be busy)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit, RuntimeError, MemoryError])
def test_what_the_profiler_raises_stays_inside_the_capture(raised):
    """A read that raises, whatever it raises: the cycle is left out with a note, nothing reaches the program."""
    sink = _Sink()
    cap = KernelCapture(sink, every=100, active=3)
    cap.live = True

    def boom():
        raise raised("from the profiler")

    cap._ready(_Prof(boom))
    assert cap.failed is not None and cap.failed.startswith(raised.__name__)
    assert sink.cycles == [] and any("could not be reduced" in n for n in sink.notes)


@pytest.mark.parametrize("raised", [KeyboardInterrupt, SystemExit])
def test_a_step_that_raises_a_base_exception_stops_the_capture_not_the_program(raised, monkeypatch):
    sink = _Sink()
    cap = KernelCapture(sink, every=100, active=3)
    cap.live = True

    def step(_source):
        raise raised()

    monkeypatch.setattr(cap, "_step", step)
    cap.step("optimizer")  # returns: the program's optimizer step goes on
    assert not cap.live and cap.failed is not None and cap.failed.startswith(raised.__name__)
