"""Monitor: windows and their Measurements with no stack sampling at all.

The cheapest always-on mode: the sensors are read when a window begins and when it ends,
nothing in between, unless a sensor needs periodic reads to stay right (a RAPL counter must be
read before it can wrap twice; an NVML power-only GPU is integrated from polled power), and
then one light thread reads them every `poll_s`.

The program's share of a CPU-class source over a window is the ledger's rule, on the window
as one interval: this process's CPU time (reaped children included) over the machine's busy
CPU time, with below IDLE_FLOOR of all cores busy counting as idle; a GPU's is the driver's
figure for this process (1 when it is the only one). Under the idle policy 'all' the program
pays for the whole machine.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

from ..collect import probes
from ..collect.collector import _Thread, find_sources
from ..core.ledger import is_gpu
from ..facts.policy import IDLE_FLOOR, check_policy, cpu_share  # noqa: F401  (cpu_share: the rule _measure inlines)
from ..facts.measurement import Measurement
from ..facts.measurement import any_estimated
from ..facts.measurement import carbon_setting
from ..setup.options import Options

POLL_S = {"nvml-power": 0.1, "counter": 1.0}
_perf, _proc_ns = time.perf_counter_ns, time.process_time_ns
_children_ns, _busy_ns = probes.reaped_children_cpu_ns, probes.machine_busy_ns


#: One edge's reading: (perf_counter_ns, cumulative joules per sensor, this process's CPU ns with
#: its reaped children's less the poller's, the machine's busy CPU ns). A plain tuple: a class
#: instance cost a window 0.4 us more.
_Reading = tuple[int, list[float], int, int]


class Monitor:
    """`mon = Monitor(power_trace=None, gpus=True)`; `mon.begin_window("epoch")`;
    `m = mon.end_window("epoch")` (a Measurement); or `with mon.window("epoch") as m:`.

    Windows may nest and overlap; two open windows of one name end last-opened first. Takes the
    same keyword arguments as `energy_profile` that make sense here: sensors (`sensor`, `power_trace`,
    `powercap_root`, `cpu_tdp`, `gpus`), `idle`, and the carbon settings (`country`, `region`,
    `cloud`, `carbon_intensity`, `pue`). `poll_s` overrides the period of the background reads.
    """

    def __init__(self, options: Options | None = None, *, poll_s: float | None = None, **kwargs: Any) -> None:
        o = options if options is not None else Options.from_kwargs(kwargs)
        self.options = o
        found = find_sources(o)  # the Profiler's discovery: sensor=[...] chooses the backends here too
        self.sensors = found.sensors
        self.notes = found.notes
        self.sources = [s.describe() for s in self.sensors]
        self.estimated = any_estimated(self.sources)
        self._gpu = [is_gpu(s.component) for s in self.sensors]
        self._cpus = probes.logical_cpus()
        self._carbon = carbon_setting(o)
        self._share = check_policy(o.idle) == "share"
        self._lock = threading.Lock()  # one sensor read at a time: they keep running state
        self._open: list[tuple[str, int | None, _Reading]] = []
        self._own_ns = 0  # the poller thread's CPU, as it last recorded it (energyprof's, not the program's)
        self._thread: _Thread | None = None
        t0 = time.perf_counter_ns()
        for s in self.sensors:
            s.start(t0)
        self._first = self._read(t0)
        self._stop = threading.Event()
        self.poll_s = poll_s if poll_s is not None else self._default_poll()
        if self.poll_s:
            self._thread = _Thread(self._poll)  # invisible to threading.enumerate(), never joined at exit

    def _default_poll(self) -> float | None:
        periods = [POLL_S["nvml-power"] if s.sensor == "nvml" and getattr(s, "kind", "") != "counter"
                   else POLL_S["counter"] for s in self.sensors if s.sensor in ("rapl", "nvml")]
        return min(periods) if periods else None

    def _poll(self) -> None:
        # The poller writes down its own CPU after each round, under the lock, so a window's edge
        # reads no thread clock: what it misses is the few microseconds between that note and
        # the next wait, once a poll period.
        assert self.poll_s is not None
        thread_ns = time.thread_time_ns
        while not self._stop.wait(self.poll_s):
            with self._lock:
                t = time.perf_counter_ns()
                for s in self.sensors:
                    s.read(t)
                self._own_ns = thread_ns()

    def _read(self, t_ns: int | None = None) -> _Reading:
        # The hot path of a window (twice each): no lock without a poller to race, no
        # comprehension frame; the clocks and /proc reads are the rest of its cost. The machine's
        # busy CPU only matters to the 'share' policy.
        energy: list[float] = []
        if self._thread is None:
            t = t_ns if t_ns is not None else _perf()
            for s in self.sensors:
                energy.append(float(s.read(t)))
            proc = _proc_ns() + _children_ns()
        else:
            with self._lock:
                t = t_ns if t_ns is not None else _perf()
                for s in self.sensors:
                    energy.append(float(s.read(t)))
                own = self._own_ns
            proc = _proc_ns() + _children_ns() - own  # the poller is energyprof's, not the program's
        return t, energy, proc, _busy_ns() if self._share else 0

    # -- windows -----------------------------------------------------------------------
    def begin_window(self, name: str, index: int | None = None) -> None:
        self._open.append((name, index, self._read()))

    def end_window(self, name: str | None = None) -> Measurement:
        """The Measurement of the last window opened under `name` (any, when None)."""
        end = self._read()
        for i in range(len(self._open) - 1, -1, -1):
            wname, index, begin = self._open[i]
            if name is None or wname == name:
                del self._open[i]
                return self._measure(wname, index, begin, end)
        raise KeyError(f"no window {name!r} is open")

    def window(self, name: str, index: int | None = None) -> _Window:
        """`with mon.window("step") as m:`; m is filled when the block ends, however it ends."""
        return _Window(self, name, index)

    def measure(self) -> Measurement:
        """Everything since the Monitor was made."""
        return self._measure("<run>", None, self._first, self._read())

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        for s in self.sensors:
            with contextlib.suppress(Exception):
                s.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the arithmetic ----------------------------------------------------------------
    def _measure(self, name: str, index: int | None, a: _Reading, b: _Reading,
                 into: Measurement | None = None) -> Measurement:
        t0, energy0, proc0, busy0 = a
        t1, energy1, proc1, busy1 = b
        dt = t1 - t0
        share = self._share
        if share:  # cpu_share(), inline: a function call is a tenth of this arithmetic's cost
            proc = proc1 - proc0 if proc1 > proc0 else 0
            denom = max(proc, busy1 - busy0, IDLE_FLOOR * dt * self._cpus)
            phi = min(1.0, proc / denom) if denom > 0 else 0.0
        else:
            phi = 1.0
        energy: dict[str, float] = {}
        program: dict[str, float] = {}
        for s, e0, e1, gpu in zip(self.sensors, energy0, energy1, self._gpu):
            d = e1 - e0 if e1 > e0 else 0.0
            energy[s.id] = d
            if not share:
                program[s.id] = d
            elif gpu:
                g = 1.0
                if hasattr(s, "process_share"):
                    with contextlib.suppress(Exception):
                        g = min(1.0, max(0.0, float(s.process_share())))
                program[s.id] = g * d
            else:
                program[s.id] = phi * d
        g_per_kwh, pue = self._carbon
        if into is None:
            return Measurement(name=name, index=index, time_s=dt / 1e9, energy_j=energy, program_energy_j=program,
                               intensity_g_per_kwh=g_per_kwh, pue=pue, estimated=self.estimated, complete=True)
        into.time_s, into.energy_j, into.program_energy_j = dt / 1e9, energy, program
        into.intensity_g_per_kwh, into.pue, into.estimated, into.complete = g_per_kwh, pue, self.estimated, True
        return into


class _Window:
    """`Monitor.window`'s context manager: a class, not a generator, for the few microseconds a
    window costs; the Measurement handed out is the one filled at the end."""

    __slots__ = ("_mon", "_name", "_index", "_m", "_begin")

    def __init__(self, mon: Monitor, name: str, index: int | None) -> None:
        self._mon, self._name, self._index = mon, name, index
        self._m = Measurement(name=name, index=index)

    def __enter__(self) -> Measurement:
        self._begin = self._mon._read()
        return self._m

    def __exit__(self, *exc: Any) -> None:
        mon = self._mon
        mon._measure(self._name, self._index, self._begin, mon._read(), into=self._m)

