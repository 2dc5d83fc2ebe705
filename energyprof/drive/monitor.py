"""Monitor: windows and their Measurements with no stack sampling at all.

The cheapest always-on mode: the sensors are read when a window begins and when it ends,
nothing in between, unless a sensor needs periodic reads to stay right (a RAPL counter must be
read before it can wrap twice; an NVML power-only GPU is integrated from polled power), and
then one light thread reads them every `poll_s`.

Each window is a WindowAccount, the ledger's shape, and its Measurement is filled from it as the
Profiler's is. The program's share of a CPU-class source over a window is the one rule
(facts/policy.cpu_share) on the window as one interval: this process's CPU time (reaped children
included) over the machine's busy CPU time, with below IDLE_FLOOR of all cores busy counting as
idle; a GPU's is the driver's figure for this process (1 when it is the only one). Under the idle
policy 'all' the program pays for the whole machine, and the machine's busy CPU, which only the
share needs, is not read: those accounts hold `all` only.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

from ..collect import probes
from ..agent.own_threads import Thread
from ..collect.collector import find_sources
from ..core.ledger import is_gpu
from ..facts.policy import IDLE_POLICIES, PolicyPair, WindowAccount, check_policy, cpu_share
from ..facts.measurement import Measurement
from ..facts.measurement import any_estimated
from ..facts.measurement import carbon_setting
from ..facts.measurement import fill_from_account
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
        self._ids = tuple(s.id for s in self.sensors)
        # Per sensor: None for a CPU-class source; for a GPU, what reads this process's part of it.
        self._gpu = [_gpu_part(s) if is_gpu(s.component) else None for s in self.sensors]
        self._any_gpu = any(part is not None for part in self._gpu)
        self._cpus = probes.logical_cpus()
        self._carbon = carbon_setting(o)
        self.policy = check_policy(o.idle)
        self._share = self.policy == "share"
        self._gpu_at_edge = self._share and self._any_gpu  # a GPU's part is the driver's figure when the window ends
        self._held = IDLE_POLICIES if self._share else (self.policy,)
        self._unread = (float("nan"),) * len(self.sensors)  # the share's figures where the busy CPU was not read
        self._lock = threading.Lock()  # one sensor read at a time: they keep running state
        self._open: list[tuple[str, int | None, _Reading]] = []
        self._own_ns = 0  # the poller thread's CPU, as it last recorded it (energyprof's, not the program's)
        self._thread: Thread | None = None
        t0 = time.perf_counter_ns()
        for s in self.sensors:
            s.start(t0)
        self._first = self._read(t0)
        self._stop = threading.Event()
        self.poll_s = poll_s if poll_s is not None else self._default_poll()
        self._live: Any = None  # influx=, pushgateway=: the live export (output/live/), fed by the poller
        self.live_summary: dict[str, Any] | None = None  # what it sent and dropped, once closed
        if o.influx or o.pushgateway:
            self._start_live()
        if self.poll_s:
            self._thread = Thread(self._poll)  # invisible to threading.enumerate(), never joined at exit

    def _default_poll(self) -> float | None:
        periods = [POLL_S["nvml-power"] if s.sensor == "nvml" and getattr(s, "kind", "") != "counter"
                   else POLL_S["counter"] for s in self.sensors if s.sensor in ("rapl", "nvml")]
        return min(periods) if periods else None

    def _poll(self) -> None:
        # The poller writes down its own CPU after each round, under the lock, so a window's edge
        # reads no thread clock: what it misses is the few microseconds between that note and
        # the next wait, once a poll period. The live export's threads are energyprof's too.
        assert self.poll_s is not None
        thread_ns = time.thread_time_ns
        while not self._stop.wait(self.poll_s):
            with self._lock:
                t = time.perf_counter_ns()
                energy = [float(s.read(t)) for s in self.sensors]
                if self._live is not None:
                    self._live_round(t, energy)
                self._own_ns = thread_ns() + (self._live_own.read_ns() if self._live is not None else 0)

    # -- live export ---------------------------------------------------------------------
    def _start_live(self) -> None:
        from ..collect.probes import OwnClocks
        from ..output.live.export import PERIOD_S, LiveExport

        self._live_own = OwnClocks()
        self._live = LiveExport(self.options, own=self._live_own)
        self._live.carbon = self._carbon
        self._live.methods = {s["id"]: s["method"] for s in self.sources}  # each point says measured or estimated
        self._live_next = 0
        self._live_last: tuple[int, list[float], list[float]] = (self._first[0], [0.0] * len(self.sensors),
                                                                 [0.0] * len(self.sensors))
        self._live_history: list[tuple[int, list[float], list[float]]] = []  # the last figures sent: the end's power
        self._live_ended: list[tuple[Measurement, int]] = []  # windows ended, sent from the poller's thread
        self.poll_s = min(self.poll_s or PERIOD_S, PERIOD_S)

    def _live_round(self, t: int, energy: list[float] | None = None) -> None:
        """On the poller's thread, under the lock: the windows that ended, and once a second the run's figures."""
        from ..output.live.export import PERIOD_S

        live = self._live
        while self._live_ended:
            m, t_end = self._live_ended.pop(0)
            if m.energy_j is not None and m.program_energy_j is not None:  # the first read fills it, here
                live.emit(live.window_points(m.name, m.index, m.time_s, live.wall_ns(t_end), m.energy_j, m.program_energy_j))
        if energy is None or t < self._live_next:
            return
        self._live_next = t + int(PERIOD_S * 1e9)
        machine, program = self._run_so_far(t, energy)
        t0, m0, p0 = self._live_last
        dt = (t - t0) / 1e9
        pm = [max(0.0, (a - b) / dt) if dt > 0 else 0.0 for a, b in zip(machine, m0)]
        pp = [max(0.0, (a - b) / dt) if dt > 0 else 0.0 for a, b in zip(program, p0)]
        self._live_last = (t, machine, program)
        self._live_history = [*self._live_history[-2:], (t, machine, program)]
        live.poll_point_sources(live.wall_ns(t))
        live.emit(live.source_points(live.wall_ns(t), list(self._ids), machine, program, pm, pp))

    def _run_so_far(self, t: int, energy: list[float]) -> tuple[list[float], list[float]]:
        proc = _proc_ns() + _children_ns() - self._own_ns
        a = self._account("<run>", None, self._first, (t, energy, proc, _busy_ns() if self._share else 0))
        machine, program = a.machine(), a.program(self.policy)
        return [machine.get(i, 0.0) for i in self._ids], [program.get(i, 0.0) for i in self._ids]

    def _close_live(self) -> None:
        from ..output.live.export import Figures, dropped_line

        live = self._live
        with self._lock:
            self._live_round(time.perf_counter_ns())
        total = self.measure()
        end = live.wall_ns(time.perf_counter_ns())
        ids = self._ids
        history = [Figures(live.wall_ns(t), dict(zip(ids, m)), dict(zip(ids, p))) for t, m, p in self._live_history]
        try:
            self.live_summary = live.finish(history=history, end_ns=end,
                                            totals=(dict(total.energy_j or {}), dict(total.program_energy_j or {})))
        except Exception as exc:  # noqa: BLE001 - the export is never worth the program's run
            self.live_summary = {"run": live.run, "sinks": [], "error": f"{type(exc).__name__}: {exc}"}
        line = dropped_line(self.live_summary)
        if line is not None:
            self.notes.append(line.split(": ", 1)[1])
            if not self.options.quiet:
                import sys

                print(line, file=sys.stderr, flush=True)

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
    def begin_window(self, name: str, index: int | None = None, t_ns: int | None = None) -> None:
        """Open a window (drive/windows.py's protocol); `t_ns`: its start as the caller read it (perf_counter_ns)."""
        self._open.append((name, index, self._read(t_ns)))

    def end_window(self, name: str | None = None, facts: dict[str, float] | None = None,
                   t_ns: int | None = None) -> Measurement:
        """The Measurement of the last window opened under `name` (any, when None): its account
        under the Monitor's policy, worked out at the first read of one of its figures. A Monitor keeps
        no facts (`facts` is for the Profiler's profile); `t_ns`: the end as the caller read it."""
        end = self._read(t_ns)
        wname, index, begin = self._pop(name)
        return self._measure(wname, index, begin, end)

    def end_account(self, name: str | None = None) -> WindowAccount:
        """End the last window opened under `name` (any, when None) and give its account: the
        figures under every policy read, of which `end_window`'s Measurement is one."""
        end = self._read()
        wname, index, begin = self._pop(name)
        return self._account(wname, index, begin, end, self._gpu_parts())

    def _pop(self, name: str | None) -> tuple[str, int | None, _Reading]:
        for i in range(len(self._open) - 1, -1, -1):
            if name is None or self._open[i][0] == name:
                return self._open.pop(i)
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
        if self._live is not None and not self._live.finished:
            self._close_live()
        for s in self.sensors:
            with contextlib.suppress(Exception):
                s.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the arithmetic ----------------------------------------------------------------
    def _gpu_parts(self) -> list[float | None] | None:
        """This process's part of each GPU now (None for a CPU-class source); None without a GPU or
        under `all`, where no part is taken."""
        if not self._gpu_at_edge:
            return None
        return [None if part is None else part() for part in self._gpu]

    def _account(self, name: str, index: int | None, a: _Reading, b: _Reading,
                 gpu: list[float | None] | None = None) -> WindowAccount:
        """The window between two readings as one interval, in the ledger's account: the machine's
        energy per source, and the program's part under each policy read (`gpu`: each GPU's part,
        as `_gpu_parts` read it when the window ended). A Monitor keeps no tree of windows (depth 0)
        and measures its own process (pid None: the whole program)."""
        t0, energy0, proc0, busy0 = a
        t1, energy1, proc1, busy1 = b
        machine = tuple([e1 - e0 if e1 > e0 else 0.0 for e0, e1 in zip(energy0, energy1)])
        if not self._share:
            share = self._unread
        else:
            phi = cpu_share(proc1 - proc0, busy1 - busy0, (t1 - t0) * self._cpus)
            if gpu is None and self._any_gpu:
                gpu = self._gpu_parts()
            share = tuple([d * phi for d in machine] if gpu is None else
                          [d * phi if g is None else d * g for d, g in zip(machine, gpu)])
        return WindowAccount(name, index, 0, None, t0, t1, self._ids, machine, PolicyPair(share, machine),
                             self.estimated, True, (), self._held)

    def _measure(self, name: str, index: int | None, a: _Reading, b: _Reading,
                 into: Measurement | None = None) -> Measurement:
        """The window's Measurement (`into`, or a new one): its account under the Monitor's policy,
        worked out at the first read of one of its figures, as the Profiler's is, so a window whose
        figures nobody reads costs its two readings only. A GPU's part is read now, as the window ends."""
        m = into if into is not None else Measurement(name=name, index=index)
        gpu = self._gpu_parts()
        m.defer(lambda m: fill_from_account(m, self._account(name, index, a, b, gpu), self.policy, *self._carbon))
        if self._live is not None and name != "<run>":  # sent from the poller's thread, which fills it there
            self._live_ended.append((m, b[0]))
        return m


def _gpu_part(sensor: Any) -> Callable[[], float]:
    """What reads this process's part of a GPU: the driver's figure, in [0, 1]; the whole GPU where
    the driver has none or refuses one."""
    process_share = getattr(sensor, "process_share", None)
    if process_share is None:
        return lambda: 1.0

    def part() -> float:
        try:
            return min(1.0, max(0.0, float(process_share())))
        except Exception:  # noqa: BLE001 - a refusal leaves the GPU to the program, as with no figure
            return 1.0

    return part


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

