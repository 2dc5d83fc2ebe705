"""CPU that energyprof burns on the program's threads (`sampler.charge_own`: the kernel capture's
steps, the I/O reads at a window's edge) is energyprof's: the sampler takes it off the thread that
burnt it, never off another, and counts it once."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator

from energyprof.agent import sampler
from energyprof.agent.wire import THREAD_FRAME_PREFIX


class Sink:
    """What a sampler reports: its ticks' CPU clocks and each sample's CPU, by thread."""

    def __init__(self) -> None:
        self.frames: dict[int, tuple] = {}
        self.stacks: dict[int, tuple] = {}
        self.ticks: list[tuple[int, int]] = []  # (process CPU, own CPU)
        self.samples: list[tuple[int, int, bool]] = []
        self.tick_cpu: list[int] = []  # the CPU of each tick's samples

    def conserved(self) -> int:
        """The samples' CPU after the first tick less the process's CPU less energyprof's over the
        same ticks: 0 when each tick's samples hold exactly the program's CPU."""
        (proc0, own0), (proc1, own1) = self.ticks[0], self.ticks[-1]
        return sum(self.tick_cpu[1:]) - ((proc1 - proc0) - (own1 - own0))

    def frame(self, fid, frame) -> None:
        self.frames[fid] = frame

    def stack(self, sid, fids) -> None:
        self.stacks[sid] = fids

    def tick(self, t0, t1, proc, own, rss) -> None:
        self.ticks.append((proc, own))
        self.tick_cpu.append(0)

    def sample(self, sid, cpu, main) -> None:
        self.samples.append((sid, cpu, main))
        self.tick_cpu[-1] += cpu

    def flush(self) -> None:
        pass

    def on_thread(self, name: str) -> int:
        head = f"{THREAD_FRAME_PREFIX}{name}]"
        return sum(cpu for sid, cpu, main in self.samples
                   if not main and any(self.frames[f][0] == head for f in self.stacks[sid]))

    def on_main(self) -> int:
        return sum(cpu for _, cpu, main in self.samples if main)


# The clocks of a tick are read one after another: a program thread that takes the GIL between
# two reads (after a switch interval) moves up to that much CPU from one tick's figure to the next.
SKEW_NS = int(sys.getswitchinterval() * 1e9)


def spin(ns: int) -> int:
    """Burn `ns` of this thread's CPU (whatever the machine's load); the CPU it burnt."""
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < ns:
        pass
    return time.thread_time_ns() - t0


@contextlib.contextmanager
def sampling(sink: Sink, ticks_after: int = 2) -> Iterator[None]:
    """A 2-ms sampler over the block: two ticks read before it, `ticks_after` more after it (a thread
    that ended in the block is read at a tick after), then stopped."""
    s = sampler.Sampler(sink, 0.002, sampler.View(), rss=False)
    s.start()
    try:
        _ticks(sink, 2)
        yield
        _ticks(sink, len(sink.ticks) + ticks_after)
    finally:
        s.stop()


def _ticks(sink: Sink, n: int) -> None:
    while len(sink.ticks) < n:
        time.sleep(0.002)


def test_cpu_charged_on_a_thread_comes_off_that_thread_not_the_main_one():
    """A thread (a training loop's, say) burns CPU for energyprof, charges it, and goes on with the
    program's work; the main thread meanwhile burns its own. The thread's samples carry what it burnt
    less the charge (its clock is read at each tick and as it ends), the main thread's all it burnt,
    energyprof's own figure the charge. The charge used to come off the main thread: 60 ms short
    there, and the thread kept it too, counted twice."""
    charged = 60_000_000
    burnt: dict[str, int] = {}

    def work() -> None:
        t0 = time.thread_time_ns()
        spin(40_000_000)  # the program's
        sampler.charge_own(spin(charged))  # energyprof's, charged after it ran (it spans ticks)
        spin(2 * charged)  # the program's again: enough to take the whole charge from
        burnt["thread"] = time.thread_time_ns() - t0

    sink = Sink()
    before_charged = sampler._charged[0]
    with sampling(sink):  # the worker's departure is read at a tick after it ended
        worker = threading.Thread(target=work, name="charger")
        worker.start()
        main_burnt = spin(100_000_000)
        worker.join()
    own_charge = sampler._charged[0] - before_charged
    assert own_charge >= charged

    thread_cpu = sink.on_thread("charger")
    # Its clock from 0 to its end, less the charge: the few microseconds `threading` runs around
    # `work` are the only CPU not in `burnt`.
    assert 0 <= thread_cpu - (burnt["thread"] - own_charge) < 1_000_000, (thread_cpu, burnt, own_charge)
    # The main thread keeps all it burnt (and the little it ran around the spin)
    assert sink.on_main() >= main_burnt - SKEW_NS, (sink.on_main(), main_burnt)
    # energyprof's figure holds the charge (its own thread's CPU is the rest). The samples' sum is not
    # checked here: with two program threads running, one that takes the GIL between a tick's clock
    # reads (a switch interval, under load) can leave the main thread's rest below zero, clamped.
    assert sink.ticks[-1][1] - sink.ticks[0][1] >= own_charge


def test_a_charge_on_the_main_thread_is_taken_from_its_next_cpu_when_a_tick_holds_too_little():
    """The main thread charges CPU that earlier ticks already gave its samples (the work spanned them):
    the tick after the charge holds less than it. What it could not cover was dropped at zero, so it
    was counted twice (in energyprof's figure and the program's samples); now it is owed and taken
    from the main thread's next CPU, and the samples add up to the process's CPU less energyprof's."""
    charged = 50_000_000
    sink = Sink()
    before_charged = sampler._charged[0]
    with sampling(sink):
        sampler.charge_own(spin(charged))
        spin(2 * charged)
    own_charge = sampler._charged[0] - before_charged
    assert sink.ticks[-1][1] - sink.ticks[0][1] >= own_charge
    assert abs(sink.conserved()) <= SKEW_NS, sink.conserved()


def test_the_charges_of_threads_that_ended_are_forgotten():
    """A server that starts a thread per request, each charging a window's I/O read: the charges are
    read and the ended threads' entries go, so what every charging tick copies does not grow with the
    threads the run ever had. The charges still reach energyprof's figure."""
    sink = Sink()
    before_charged, before_entries = sampler._charged[0], set(sampler._charged_by)
    with sampling(sink, ticks_after=3):  # the last departures read
        for _ in range(40):
            t = threading.Thread(target=lambda: sampler.charge_own(spin(200_000)))
            t.start()
            t.join()
    own_charge = sampler._charged[0] - before_charged
    assert own_charge >= 40 * 200_000
    assert set(sampler._charged_by) - before_entries == set(), len(sampler._charged_by)
    assert sink.ticks[-1][1] - sink.ticks[0][1] >= own_charge
