"""The collector thread: reads every sensor on one tick and hands the reading to a feed.

A feed turns readings into Ledger events: `LocalFeed` for an in-process profile (this
process's clocks, samples handed over through a deque), the supervisor's job feed for a
whole run (streams from every process of the job). A sensor that raises, stalls past its
timeout or returns garbage is dropped with a note; the run goes on.

The threads are started with `_thread`, so a profiled program never sees them in
`threading.enumerate()` and they never keep it alive.
"""

from __future__ import annotations

import _thread
import json
import math
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Protocol

from . import probes
from ..agent.own_threads import Thread
from ..core.feed import MAX_HOLD_NS, Clock, HeldTicks
from ..core.ledger import Ledger
from .probes import OwnClocks
from ..store.files import remove
from ..store.files import write_text
from ..core.recording import Sample, Tick
from .sensors.base import Continued, Sensor

CHILD_POLL_S = 0.5


def find_sources(options: Any) -> Any:
    """The run's sensors (with why any is missing), for the supervisor, the in-process Profiler
    and the Monitor alike. The one note a user can act on at once (RAPL readable by root only,
    and its fix) goes to stderr unless quiet. Named backends (`--sensor`, `sensor=[...]`) that
    find nothing at all are bad input: OptionError, before the program starts."""
    import sys

    from . import sensors

    from ..setup.options import OptionError

    o = options
    found = sensors.discover(o.power_trace, o.powercap_root, o.cpu_tdp, gpus=o.gpus, only=o.sensor)
    if o.sensor and not found.sensors:
        why = "; ".join(found.notes) or "nothing found"
        raise OptionError(f"--sensor {' --sensor '.join(o.sensor)} found no source: {why}")
    if not o.quiet:
        for note in found.notes:
            if note.startswith("RAPL: cannot read"):
                print(f"energyprof: {note}", file=sys.stderr)
    return found


def open_sources(options: Any) -> tuple[Any, Ledger]:
    """The run's sensors (`find_sources`) and an empty ledger over them."""
    found = find_sources(options)
    # the chart's finest cell: the finer of the two rates that put anything into it
    width_ns = int(min(options.interval, options.sensor_interval) * 1e9)
    return found, Ledger([s.describe() for s in found.sensors], cpus=probes.logical_cpus(), timeline_width_ns=width_ns)


class Feed(Protocol):
    ledger: Ledger

    def on_tick(self, t_ns: int, energy: tuple[float | None, ...], gpu_share: dict[str, float] | None) -> None: ...
    def finish(self) -> None: ...


FIRST_CHECKPOINT_NS = 1_000_000_000  # the first checkpoint, at most this long after the start


class Collector:
    def __init__(self, sensors: list[Sensor], feed: Feed, interval_s: float, own: OwnClocks,
                 sensor_timeout_s: float = 2.0, checkpoint: Callable[[], dict[str, Any]] | None = None,
                 checkpoint_path: str | None = None, checkpoint_interval_s: float = 30.0,
                 extras: list[Callable[[int], None]] | None = None) -> None:
        self.sensors = sensors
        self.extras = list(extras or [])  # other readers on the same clock (collect/io.py), each tick
        self.alive = [True] * len(sensors)
        self.feed = feed
        self.ledger = feed.ledger
        self.interval_s = interval_s
        self.own = own
        self.sensor_timeout_ns = int(sensor_timeout_s * 1e9)
        self.notes: list[dict[str, Any]] = []
        self._stop = threading.Event()
        # Released once, at stop: the tick thread waits on it (one futex wait a tick, where
        # Event.wait builds and takes a fresh lock under a Condition each time).
        self._halt = _thread.allocate_lock()
        self._halt.acquire()
        self._halt_open = False
        self._thread: Thread | None = None
        self._checkpoint_state = checkpoint
        self.checkpoint_path = checkpoint_path
        self.checkpoint_interval_ns = int(checkpoint_interval_s * 1e9)
        self.t0_ns = 0
        self._next_checkpoint = 0  # perf_counter_ns of the next one
        self.ticks = 0
        # Watchdog state: a read that never returns (a wedged driver) must not stop the run.
        # The stuck thread is abandoned (it exits when its read returns, touching nothing)
        # and a new collector thread carries on without that sensor.
        self._generation = 0
        self._reading: tuple[int, int] | None = None  # (sensor index, read start ns)
        self._watchdog: Thread | None = None
        self._lock = threading.Lock()  # one tick at a time (the final tick runs on the caller's thread)

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self.t0_ns = time.perf_counter_ns()
        for i, s in enumerate(self.sensors):
            try:
                s.start(self.t0_ns)
            except Exception as exc:  # noqa: BLE001 - any failure just drops this sensor
                self._drop(i, f"failed to start: {exc}", self.t0_ns)
        # The first soon after the start, then on the interval: a kill -9 in the first interval
        # (the OOM killer, a scheduler's hard kill) still leaves the run up to it.
        self._next_checkpoint = self.t0_ns + min(FIRST_CHECKPOINT_NS, self.checkpoint_interval_ns)
        self.tick(self.t0_ns)
        try:
            self._spawn()
            self._watchdog = Thread(self._watch)
        except BaseException:
            self.stop()
            raise

    def _spawn(self) -> None:
        self._thread = Thread(self._run, self._generation)

    def stop(self) -> None:
        """Stop the threads, take the last reading and close the sensors; never raises."""
        self._stop.set()
        if not self._halt_open:
            self._halt_open = True
            self._halt.release()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.sensor_timeout_ns / 1e9 + 1.0)
            if self._thread.is_alive():
                self._abandon_stuck_reader()
        if self._watchdog is not None:
            self._watchdog.join(timeout=1.0)
        try:
            self.tick(final=True)
            self.feed.finish()
        finally:
            for s in self.sensors:
                try:
                    s.close()
                except Exception:  # noqa: BLE001
                    pass

    def _run(self, generation: int) -> None:
        self.own.register_current()
        while not self._halted(self.interval_s):
            if generation != self._generation:
                return
            try:
                self.tick(generation=generation)
            except Exception as exc:  # noqa: BLE001 - one bad tick must not end the measurement
                if not any(n["kind"] == "collector-error" for n in self.notes):
                    self.notes.append({"kind": "collector-error", "message": f"a collector tick failed:"
                                       f" {type(exc).__name__}: {exc}"})
            if self.checkpoint_path and time.perf_counter_ns() >= self._next_checkpoint:
                self.write_checkpoint()

    def _halted(self, timeout: float) -> bool:
        """Wait `timeout` seconds; True at once when the collector stops."""
        if self._halt.acquire(timeout=timeout):
            self._halt.release()  # every waiter (a respawned tick thread) sees it too
            return True
        return False

    def _watch(self) -> None:
        self.own.register_current()
        period = max(0.05, self.sensor_timeout_ns / 2e9)
        while not self._stop.wait(period):
            reading = self._reading
            if reading is not None and time.perf_counter_ns() - reading[1] > self.sensor_timeout_ns:
                self._abandon_stuck_reader()
                if not self._stop.is_set():
                    self._spawn()

    def _abandon_stuck_reader(self) -> None:
        reading = self._reading
        self._generation += 1
        self._reading = None
        if reading is not None and self.alive[reading[0]]:
            self._drop(reading[0], f"a read did not return within {self.sensor_timeout_ns / 1e9:g} s (hung)",
                       reading[1])

    # -- one tick ----------------------------------------------------------------------
    def _guarded(self, i: int, call: Callable[[], Any], t: int, generation: int | None) -> tuple[bool, Any]:
        """(ok, value) of one sensor call under the watchdog; (False, None) drops or abandons."""
        t_read = time.perf_counter_ns()
        self._reading = (i, t_read)
        try:
            v = call()
        except Exception as exc:  # noqa: BLE001
            self._reading = None
            if generation is None or generation == self._generation:
                self._drop(i, f"{type(exc).__name__}: {exc}", t)
            return False, None
        self._reading = None
        if generation is not None and generation != self._generation:
            return False, None
        took = time.perf_counter_ns() - t_read
        if took > self.sensor_timeout_ns:
            self._drop(i, f"a read took {took / 1e9:.1f} s (timeout {self.sensor_timeout_ns / 1e9:g} s)", t)
            return False, None
        return True, v

    def tick(self, t_ns: int | None = None, generation: int | None = None, final: bool = False) -> None:
        t = t_ns if t_ns is not None else time.perf_counter_ns()
        energy: list[float | None] = []
        for i, s in enumerate(self.sensors):
            if not self.alive[i]:
                energy.append(None)
                continue
            ok, v = self._guarded(i, lambda s=s: float(s.read(t)), t, generation)
            if generation is not None and generation != self._generation:
                return  # abandoned while this read hung: the new collector owns the ledger now
            if ok and not math.isfinite(v):
                self._drop(i, f"returned a non-finite reading ({v})", t)
                ok = False
            energy.append(v if ok else None)
        shares: dict[str, float] = {}
        for i, s in enumerate(self.sensors):
            if self.alive[i] and s.per_process_share:
                ok, v = self._guarded(i, s.process_share, t, generation)
                if generation is not None and generation != self._generation:
                    return
                if ok:
                    shares[s.id] = float(v)
        with self._lock:
            self.feed.on_tick(t, tuple(energy), shares or None)
            self.ticks += 1
        for i, s in enumerate(self.sensors):
            if s.frozen is not None and self.alive[i] and energy[i] is not None:
                self._replace_frozen(i, t, energy[i])
        for extra in list(self.extras):
            try:
                extra(time.perf_counter_ns())  # read now: the sensors' reads took time since t
            except Exception as exc:  # noqa: BLE001 - an extra reading is not worth the run
                self.extras.remove(extra)
                self.notes.append({"kind": "collector-error",
                                   "message": f"{type(extra).__name__} stopped reading: {type(exc).__name__}: {exc}"})

    def _replace_frozen(self, i: int, t_ns: int, joules: float) -> None:
        """A counter that stood still while its component was busy is not a sensor: the source carries
        on from its figure so far with the sensor's fallback (the model, or a GPU's power readings),
        relabelled in the ledger's sources, or is dropped where there is none; a note says which."""
        s = self.sensors[i]
        at = max(0, t_ns - self.t0_ns) / 1e9
        try:
            new = s.fallback()
        except Exception as exc:  # noqa: BLE001 - no fallback: dropped like a sensor that failed
            new, why = None, f"{s.frozen}; its fallback failed ({type(exc).__name__}: {exc})"
        else:
            why = s.frozen or ""
        if new is not None:
            try:
                relay = Continued(s, new, t_ns, joules, at)
            except Exception as exc:  # noqa: BLE001
                new.close()
                new, why = None, f"{why}; its fallback failed to start ({type(exc).__name__}: {exc})"
        if new is None:
            self._drop(i, why, t_ns)
            self.ledger.sources[i]["frozen"] = why
            self._close(s)
            return
        with self._lock:
            self.sensors[i] = relay
            src = self.ledger.sources[i]
            src.clear()
            src.update(relay.describe())
        self._close(s)
        kind = f"{relay.method} by {relay.sensor}" + (f" ({relay.tier})" if relay.tier != "model" else "")
        self.notes.append({"kind": "sensor-frozen", "source": s.id, "at_s": round(at, 3),
                           "message": f"sensor {s.id} ({s.sensor}) replaced at {at:.2f} s: {why}; from then on "
                                      f"{s.id} is {kind}, and before then it holds the counter's own figure"})

    @staticmethod
    def _close(s: Sensor) -> None:
        try:
            s.close()
        except Exception:  # noqa: BLE001
            pass

    def _drop(self, i: int, why: str, t_ns: int) -> None:
        if not self.alive[i]:
            return
        self.alive[i] = False
        s = self.sensors[i]
        at = max(0, t_ns - self.t0_ns) / 1e9
        self.notes.append({"kind": "sensor-dropped", "source": s.id, "at_s": round(at, 3),
                           "message": f"sensor {s.id} ({s.sensor}) dropped at {at:.2f} s: {why}"})

    # -- checkpoints -------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        self._next_checkpoint = time.perf_counter_ns() + self.checkpoint_interval_ns
        if not self.checkpoint_path or self._checkpoint_state is None:
            return
        from ..core import ledger_state  # a run short of its first checkpoint never loads it

        try:
            with self._lock:
                state = self._checkpoint_state()
                state["ledger"] = ledger_state.save(self.ledger)
            state["notes"] = list(self.notes) + list(state.get("notes", []))
            write_text(self.checkpoint_path, json.dumps(state, separators=(",", ":")))
        except Exception as exc:  # noqa: BLE001 - a failed checkpoint must not stop the run
            self.notes.append({"kind": "checkpoint-failed", "message": f"checkpoint failed: {exc}"})

    def remove_checkpoint(self) -> None:
        if self.checkpoint_path:
            remove(self.checkpoint_path)  # a regular file only: a device or FIFO given as checkpoint stays


class LocalFeed:
    """An in-process profile: this process's clocks; samples and windows through a deque
    (append is atomic and never blocks the program), folded in on each tick."""

    def __init__(self, ledger: Ledger, own: OwnClocks, children: bool = True, rss: bool = True,
                 rss_children: bool = False) -> None:
        self.ledger = ledger
        self.own = own
        self.children = children
        self.rss = rss
        self.rss_children = rss_children
        self.queue: deque[Any] = deque()
        self._children_rss = 0
        self._live_children_ns = 0
        self._children_polled = 0
        self._children_floor = 0
        self.child_processes: dict[int, dict[str, Any]] = {}
        self._held: HeldTicks[Tick] = HeldTicks(lambda tick: tick.t_ns, MAX_HOLD_NS)
        self._clock = Clock(counters=2)  # the sampler's (t, process CPU, its own CPU)

    def on_tick(self, t: int, energy: tuple[float | None, ...], gpu_share: dict[str, float] | None) -> None:
        self._drain()
        self._held.add(Tick(
            t_ns=t,
            energy_j=energy,
            process_cpu_ns=time.process_time_ns(),
            own_cpu_ns=self.own.read_ns(),
            busy_cpu_ns=probes.machine_busy_ns(),
            rss_bytes=(probes.rss_bytes() + self._children_rss) if self.rss else 0,
            children_cpu_ns=self._children_cpu_ns(t) if (self.children or self.rss_children) else 0,
            gpu_share=gpu_share,
        ))
        self._release(final=False)

    def finish(self) -> None:
        self._drain()
        self._release(final=True)
        self.ledger.finish()

    def _release(self, final: bool) -> None:
        """Hand the held ticks to the ledger, with the program's CPU as the sampler's clocks read it.

        The samples' CPU comes from the sampler's readings of the process's clock, the tick's from
        the collector's, taken at other moments. Interpolating the sampler's readings to the
        tick makes the two agree in every interval (as the supervisor does for each process), and
        leaves out what ran before the sampler's first reading or after its last: energyprof
        starting and stopping on the program's thread. A tick waits until the sampler has read
        past it, or for MAX_HOLD_NS when it cannot (a C call holding the GIL).
        """
        clock = self._clock
        for tick in self._held.release(clock.last_t, final):
            if clock:
                proc, sampler = clock.at(tick.t_ns)
                clock.forget_before(tick.t_ns)
                tick = tick._replace(process_cpu_ns=proc, own_cpu_ns=tick.own_cpu_ns + sampler)
            self.ledger.add_tick(tick)

    def _drain(self) -> None:
        q = self.queue
        led = self.ledger
        while q:
            ev = q.popleft()
            if type(ev) is Sample:
                led.add_sample(ev)
            elif ev[0] == "clock":
                self._clock.add(*ev[1:])
            elif ev[0] == "threads":
                led.note_threads(ev[1], ev[2], ev[3])
            elif ev[0] == "begin":
                led.begin_window(ev[1], ev[2], ev[3])
            else:
                led.end_window(ev[1], ev[2], facts=ev[3])

    def begin_window(self, name: str, index: int | None, t_ns: int | None = None) -> int:
        """Queue a window's start; `t_ns`: the edge the caller read (perf_counter_ns), so its own figure
        and the window's agree. Returns the start's time."""
        t = time.perf_counter_ns() if t_ns is None else int(t_ns)
        self.queue.append(("begin", t, name, index))
        return t

    def end_window(self, name: str | None, facts: dict[str, float] | None = None, t_ns: int | None = None) -> int:
        """Queue a window's end (at `t_ns` when the caller read it); returns its time (perf_counter_ns)."""
        t = time.perf_counter_ns() if t_ns is None else int(t_ns)
        self.queue.append(("end", t, name, facts))
        return t

    def _children_cpu_ns(self, t: int) -> int:
        """Reaped children (exact) plus live ones (polled every CHILD_POLL_S)."""
        reaped = probes.reaped_children_cpu_ns()
        if t - self._children_polled >= CHILD_POLL_S * 1e9:
            self._children_polled = t
            self._live_children_ns = self._poll_live_children()
        # A child that ends moves from 'live' to 'reaped'; never let the total step back.
        total = max(self._children_floor, reaped + self._live_children_ns)
        self._children_floor = total
        return total

    def _poll_live_children(self) -> int:
        try:
            import psutil

            from .sensors.soc.stream import tool_pids

            pids = probes.descendant_pids()
            if pids is None:
                kids = psutil.Process().children(recursive=True)
            else:
                kids = [psutil.Process(pid) for pid in pids if pid]
            tools = tool_pids()  # a sensor's own tool (tegrastats, ...) is energyprof's, not the program's child
            kids = [k for k in kids if k.pid not in tools]
        except Exception:  # noqa: BLE001 - a child that ended between the listing and now
            return 0
        total = 0
        rss = 0
        for k in kids:
            try:
                with k.oneshot():
                    if self.rss_children:
                        rss += k.memory_info().rss
                    ct = k.cpu_times()
                    cpu_ns = int((ct.user + ct.system) * 1e9)
                    info = self.child_processes.get(k.pid)
                    if info is None:
                        try:
                            cmd = " ".join(k.cmdline())[:200]
                        except Exception:  # noqa: BLE001
                            cmd = k.name()
                        # its role is a fact, taken once here: every view (page, JSON) reads this field
                        from ..engines.roles import process_role

                        info = self.child_processes[k.pid] = {"pid": k.pid, "command": cmd, "cpu_time_s": 0.0,
                                                              "role": process_role(cmd) or "child"}
                    info["cpu_time_s"] = max(info["cpu_time_s"], cpu_ns / 1e9)
                    total += cpu_ns
            except Exception:  # noqa: BLE001 - it ended while we looked
                continue
        self._children_rss = rss
        return total if self.children else 0


class LocalSink:
    """The sampler's sink for an in-process profile: local ids to the ledger's table, and
    `Sample`s into the feed's queue (the collector folds them in on its next tick)."""

    def __init__(self, feed: LocalFeed) -> None:
        self.feed = feed
        self.table = feed.ledger.stacks
        self._fids: list[int] = []
        self._sids: list[int] = []
        self._t = (0, 0, 0)
        self.pid = os.getpid()

    def frame(self, fid: int, fr: tuple[str, str, int]) -> None:
        self._fids.append(self.table.frame_id(fr))

    def stack(self, sid: int, fids: tuple[int, ...]) -> None:
        self._sids.append(self.table.stack_id(tuple(self._fids[f] for f in fids)))

    def tick(self, t0: int, t1: int, proc: int, own: int, rss: int) -> None:
        self._t = (t0, t1, rss)
        self.feed.queue.append(("clock", t1, proc, own))

    def sample(self, sid: int, cpu: int, main: bool, unit: int = -1) -> None:
        t0, t1, rss = self._t
        self.feed.queue.append(Sample(t0, t1, self._sids[sid], cpu, main, rss, self.pid, unit))

    def threads(self, sid: int, count: int) -> None:
        self.feed.queue.append(("threads", self.pid, self._sids[sid], count))

    def flush(self) -> None:
        pass
