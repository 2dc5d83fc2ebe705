"""Charge every measured joule to the stack that was running when it was spent.

Pure: no I/O, no clock, no hardware. The math is DESIGN.md's, done as an online fold so a
run of any length costs memory in proportion to its distinct stacks:

* Sensor ticks split the run into intervals k = [tau_k, tau_k+1]; source c spent
  dE_c,k = E_c(tau_k+1) - E_c(tau_k) in it (the sensor made E cumulative and wrap-free).
* The program's share phi of a CPU-class source is its CPU time over the machine's busy CPU
  time in a trailing window (`share_window_ns`, because /proc/stat counts in 10 ms ticks and a
  single 10 ms interval would be mostly quantisation noise). energyprof's own threads get
  their share as the node `[energyprof]`; the rest is `[other processes and idle]`.
* The program's part of an interval is split among the samples overlapping it, in
  proportion to weight x overlap / duration: CPU time for CPU-class sources (a thread or
  process that used no CPU in an interval gets none of it), wall time on running main-thread
  stacks for GPUs and for intervals in which nothing of the program burnt CPU (never to a
  thread blocked in a wait); with no such stack, the program's root carries it.

Both idle policies are accumulated side by side, so the policy is a rendering choice.

A run may be several processes (the supervisor feeds every followed process's samples into
one ledger, each tagged with its pid): an interval's energy is then shared among all of
them by CPU weight, and `core/processes.process_table` gives each process its part. RSS arrives with each
sample, so memory growth is charged per process to the stack running when it was seen.
Samples may arrive in any order; the caller adds a tick only once every sample that ends
before it is in.
"""

# No `from __future__ import annotations`: NamedTuple turns each string annotation into a ForwardRef, compiling
# it (a millisecond of every run's start for this module's fields and the ledger's); they are evaluated as written.

import heapq
import math
from collections import deque
from collections.abc import Collection
from typing import Any, Callable, NamedTuple

from .recording import Sample, StackTable, Tick
from ..agent.window_facts import (
    CPU_FACT, END_RUN, ENDED_BY, OPENED_AS, PENDING, REQUEST_FACT, SAMPLES_FACT, WINDOW_INDEX
)
from ..facts.policy import IDLE_FLOOR  # noqa: F401  (the floor's name where the ledger's readers look for it)
from ..facts.policy import PolicyPair, WindowAccount, check_policy, cpu_share
from .allocations import place_allocations
from .tallies import ProcessTally, StackTally, WindowTally
from .unit_book import UnitBook
from .window_parts import Rows, UnitRows, subtree_part, unit_part, unit_row
from .waits import CHILD_FRAME, is_wait, move_wait_cpu
from .timeline import MIN_WIDTH_NS, TIMELINE_POINTS, Timeline

GPU_PREFIX = "gpu"
MAX_PENDING_TICKS = 512
DEFAULT_SHARE_WINDOW_NS = 100_000_000
PEERS_STALE_NS = 500_000_000  # twice the supervisor's /proc walk for the other ranks' CPU
CARRY_LIMIT = 2.0  # an interval's samples are charged at most twice the worth of the CPU they carry
ROUNDING = 1e-12  # a remainder below this fraction of an interval's energy is float dust, not energy


def remainder(d: float, taken: float) -> float:
    """What is left of an interval's `d` joules once `taken` is charged: 0 for rounding dust, which
    would otherwise show as femtojoules of idle under `all` and as a change in a comparison."""
    rest = d - taken
    return rest if rest > ROUNDING * d else 0.0


def is_gpu(component: str) -> bool:
    return component.split(":")[0] == GPU_PREFIX


WeightKey = tuple[int, int, int]  # (stack, process, unit: the web request the sample ran, -1 for none)


class _Weights(NamedTuple):
    """An interval's samples by (stack, process, unit): their CPU in it, their wall time in it on a running
    main thread, on the main thread of a process using a GPU, on a main thread that used CPU; and
    every sample's wall time in it by stack (`seen`, for the timeline)."""

    cpu: dict[WeightKey, float]
    wall: dict[WeightKey, float]
    gpu: dict[WeightKey, float]
    main: dict[WeightKey, float]
    seen: dict[int, float]

    def for_source(self, gpu: bool) -> dict[WeightKey, float]:
        """The weights a source's energy goes by: a GPU's by wall time on the processes using it;
        a CPU-class source's by CPU time, by wall time where no sample used CPU."""
        return (self.gpu or self.wall or self.cpu) if gpu else (self.cpu or self.wall)


class Ledger:
    """The online fold of ticks and samples into per-stack energy (both idle policies)."""

    def __init__(
        self,
        sources: list[dict[str, Any]],
        stacks: StackTable | None = None,
        share_window_ns: int = DEFAULT_SHARE_WINDOW_NS,
        timeline_points: int = TIMELINE_POINTS,
        cpus: int = 1,
        timeline_width_ns: int = MIN_WIDTH_NS,
    ) -> None:
        self.sources = sources
        self.source_ids = [s["id"] for s in sources]
        self.gpu = [is_gpu(s.get("component", "")) for s in sources]
        self.n = len(sources)
        self.stacks = stacks if stacks is not None else StackTable()
        self.share_window_ns = share_window_ns
        self.cpus = max(1, int(cpus))
        self.stats: dict[int, StackTally] = {}
        z = [0.0] * self.n
        self.total = list(z)
        # Per source, under each idle policy: what is no one's (under `all`, nothing but for one rank of
        # several: its peers' part), energyprof's own threads', and the program's with no sample to carry it.
        self.idle: PolicyPair[list[float]] = PolicyPair(list(z), list(z))
        self.own: PolicyPair[list[float]] = PolicyPair(list(z), list(z))
        self.root: PolicyPair[list[float]] = PolicyPair(list(z), list(z))
        self.timeline = Timeline(self.n, timeline_points, timeline_width_ns,
                                 periods_s=[s.get("update_period_s") for s in sources],
                                 counters=[s.get("tier") == "counter" for s in sources])
        self.windows: list[WindowTally] = []  # the windows the program marked; units of work go to `book` once charged
        self.book = UnitBook(self.n)
        self.on_unit: Callable[[WindowTally], None] | None = None  # told of each unit's window as it is charged
        self._open_windows: list[WindowTally] = []
        self._live_windows: list[WindowTally] = []
        self._ticks: deque[Tick] = deque()
        self._share_hist: deque[Tick] = deque()
        self._peer_points: deque[tuple[int, int]] = deque(maxlen=64)  # (t_ns, peers_cpu_ns) as read
        self._pending: list[Sample] = []
        self._watermark = -1
        self.first_tick: Tick | None = None
        self.last_tick: Tick | None = None
        self.start_rss: int | None = None  # the program's RSS before its first line, where its agent read it
        self.anomalies: dict[str, int] = {}
        self._child_sid: dict[int, int] = {}
        # Per process: energy (the `processes` table), CPU, memory; stack -> its process.
        self.procs: dict[int, ProcessTally] = {}
        self.sid_proc: dict[int, int] = {}
        self.process_info: dict[int, dict[str, Any]] = {}  # pid -> what the collector knows of it
        # pid -> {stack ending at a `[threads: T]` node -> how many of its threads ran there}: the tree names it `T xN`
        self.thread_counts: dict[int, dict[int, int]] = {}
        # Processes known to use a GPU: GPU energy goes by wall time to their samples only
        # (not to DataLoader workers, say); empty, to every process's main thread.
        self.gpu_procs: set[int] = set()
        self._wait_cache: dict[int, bool] = {}
        # One rank of several on this node (energyprof inside each rank): under `all` the rank pays
        # for its own CPU plus an even part of what no rank used (idle, other processes), so the
        # ranks' files add up to the node. None: the program is the whole job.
        self.node_ranks: int | None = None
        self._iv: dict[int | None, Rows] = {}  # the interval being charged, per process
        # ... and per unit of work its samples ran ((process, unit): share, all, samples ending in it), for its window
        self._iv_units: UnitRows = {}
        self.wait_cpu_moved_ns = 0  # CPU seen on waits, given to the same threads' running stacks at finish
        self._d_proc = 0.0  # the program's own CPU ns (children not included) in the interval being charged

    @property
    def first_ns(self) -> int | None:
        return self.first_tick.t_ns if self.first_tick is not None else None

    @property
    def last_ns(self) -> int | None:
        return self.last_tick.t_ns if self.last_tick is not None else None

    # -- events -------------------------------------------------------------------------
    def add_sample(self, s: Sample) -> None:
        # The hottest path of a long run (millions of calls): fields unpacked once, and
        # _drain called only when this sample reaches the next tick (its own loop test).
        t0, t1, sid, cpu, main, rss, proc, _ = s
        st = self.stats.get(sid)
        if st is None:
            st = self.stats[sid] = StackTally(share=[0.0] * self.n, all=[0.0] * self.n)
            self.sid_proc[sid] = proc
        st.time_ns += t1 - t0
        st.cpu_ns += cpu
        st.samples += 1
        ps = self.procs.get(proc)
        if ps is None:
            ps = self.procs[proc] = ProcessTally([0.0] * self.n, [0.0] * self.n)
        ps.cpu_ns += cpu
        if rss:
            if rss > st.peak_rss:
                st.peak_rss = rss
            if rss > ps.peak_rss:
                ps.peak_rss = rss
        if main and rss:
            self._rss(st, ps, sid, rss)
        if t1 > t0:
            self._pending.append(s)
        if t1 > self._watermark:
            self._watermark = t1
            ticks = self._ticks
            if len(ticks) >= 2 and t1 >= ticks[1].t_ns:
                self._drain(final=False)

    def _rss(self, st: StackTally, ps: ProcessTally, sid: int, rss: int) -> None:
        """RSS seen to change between two samples of a process's main thread.

        A sample knows the stack only at its end. Memory is mostly taken by the code that
        runs next and given back at scope exit by the code that ran before: growth goes to
        this sample's stack, release to the previous sample's.
        """
        if ps.last_rss:
            d = rss - ps.last_rss
            if d > 0:
                st.rss_growth += d
            elif d < 0:
                prev = self.stats.get(ps.last_sid) if ps.last_sid >= 0 else None
                (prev or st).rss_growth += d
        ps.last_rss = rss
        ps.last_sid = sid

    def add_allocations(self, proc: int, items: list[tuple[int | None, int]], sids: Collection[int] | None = None) -> int:
        """memory=exact: bytes still allocated at the end, per function, on `proc`'s stacks (core/allocations.py)."""
        return place_allocations(self.stats, self.stacks, self.sid_proc, self.n, proc, items, sids)

    def add_tick(self, tick: Tick) -> None:
        if self.last_tick is not None:
            if tick.t_ns <= self.last_tick.t_ns:
                return  # a clock never goes back; a duplicate tick carries nothing
            self.timeline.add(self.last_tick.t_ns, tick.t_ns, self._deltas(self.last_tick, tick), tick.rss_bytes)
        else:
            self.first_tick = tick
        self.last_tick = tick
        self._ticks.append(tick)
        self._share_hist.append(tick)
        self._note_peers(tick)
        if len(self._ticks) > MAX_PENDING_TICKS:
            # No sample has arrived for a long time (one long C call under a call-hook
            # sampler): coarsen the waiting intervals. Cumulative counters make this lossless
            # for energy; only the resolution of the split is lost.
            keep = [self._ticks[0], *list(self._ticks)[1:-1:2], self._ticks[-1]]
            self._ticks = deque(keep)
            # The share history keeps the window before the first waiting tick and the waiting
            # ticks themselves, so it stays bounded too.
            lo, hi = keep[0].t_ns - self.share_window_ns, keep[0].t_ns
            pending = {id(t) for t in keep}
            self._share_hist = deque(t for t in self._share_hist if lo <= t.t_ns < hi or id(t) in pending)
        self._drain(final=False)

    def begin_window(self, t_ns: int, name: str, index: int | None = None, pid: int | None = None) -> None:
        """A window opens. A web request's (PENDING, under its index) is a unit of work: the program's part
        of it is what its own samples were charged (`Sample.unit`), not the program's over its span."""
        depth = sum(1 for o in self._open_windows if o.pid == pid)
        z = [0.0] * self.n
        w = WindowTally(name, index, t_ns, list(z), list(z), list(z), depth=depth, pid=pid,
                        unit=index if name == PENDING and index is not None else None)
        if w.unit is None:
            self.windows.append(w)
        self._open_windows.append(w)
        self._live_windows.append(w)

    def end_window(self, t_ns: int, name: str | None = None, pid: int | None = None,
                   facts: dict[str, float] | None = None) -> WindowTally | None:
        """End the last window opened under `name` (any, when None) by `pid` (any, when None);
        returns it (its figures are final once it is `done`), or None when none is open.
        `facts`: numbers the program measured about the span, kept as they are (`loop`); a fact
        WINDOW_INDEX names the index of the window that ends, not kept (concurrent requests of one
        route end in any order, agent/requests.py); OPENED_AS, that the window was opened as PENDING
        under that index (a web request, opened before routing named it): it takes `name` and the
        WINDOW_INDEX now, so every interval of its span was charged to it from its start."""
        want = facts.get(WINDOW_INDEX) if facts else None
        opened = facts.get(OPENED_AS) if facts else None
        match_name, match_index = (PENDING, opened) if opened is not None else (name, want)
        for i in range(len(self._open_windows) - 1, -1, -1):
            w = self._open_windows[i]
            if ((match_name is None or w.name == match_name) and (pid is None or w.pid == pid)
                    and (match_index is None or w.index == match_index)):
                w.end_ns = t_ns
                if opened is not None and name is not None:
                    w.name, w.index = name, None if want is None else int(want)
                if facts:
                    w.loop = {str(k): float(v) for k, v in facts.items()
                              if math.isfinite(v) and k not in (WINDOW_INDEX, OPENED_AS)}
                del self._open_windows[i]
                return w
        return None

    def account(self, w: WindowTally) -> WindowAccount:
        """The typed account of one of this ledger's windows (`windows`, `end_window`): what every
        view of a window is built from. One still open ends, for now, at the last tick."""
        end = w.end_ns if w.end_ns is not None else (self.last_ns or w.start_ns)
        loop = w.loop if w.unit is None else {**w.loop, SAMPLES_FACT: float(w.samples), CPU_FACT: w.cpu_ns / 1e9}
        return WindowAccount(
            name=str(w.name), index=w.index, depth=w.depth, pid=w.pid, start_ns=w.start_ns, end_ns=end,
            sources=tuple(self.source_ids), machine_j=tuple(w.machine),
            program_j=PolicyPair(share=tuple(w.share), all=tuple(w.all)),
            estimated=any(src.get("method") == "estimated" for src in self.sources), done=w.done,
            loop=tuple(loop.items()))

    def all_windows(self) -> list[WindowTally]:
        """Every window: the program's, in the order they began, and the units' that the book keeps (and each name's
        fold of the rest) and those still being charged, merged in among them by start."""
        units = [*self.book.tallies(), *(w for w in self._live_windows if w.unit is not None)]
        if not units:
            return list(self.windows)
        return list(heapq.merge(self.windows, sorted(units, key=lambda w: w.start_ns), key=lambda w: w.start_ns))

    def accounts(self) -> list[WindowAccount]:
        """Every window's account (`all_windows`)."""
        return [self.account(w) for w in self.all_windows()]

    def finish(self) -> None:
        """Charge every interval still waiting; call once, when the run has ended."""
        self._drain(final=True)
        self._move_wait_cpu()
        end = self.last_ns or 0
        for w in self._open_windows:
            w.end_ns = end
            if w.unit is not None and w.name == PENDING:  # a request the run's end cut: a request all the same
                w.loop = {REQUEST_FACT: 1.0, ENDED_BY: END_RUN}
        self._open_windows.clear()
        for w in [w for w in self._live_windows if w.unit is not None]:
            self._unit_done(w)
        self._live_windows = [w for w in self._live_windows if w.unit is None]

    def _unit_done(self, w: WindowTally) -> None:
        """A unit's window is charged: into the book (bounded per name), told to whoever watches."""
        if self.on_unit is not None:
            self.on_unit(w)
        self.book.add(w)

    def _move_wait_cpu(self) -> None:
        """CPU a thread was seen with while sampled in a wait goes to the stacks it was seen running (waits.py)."""
        self.wait_cpu_moved_ns += move_wait_cpu(self.stats, self.stacks, self.sid_proc, self.n, self._waiting)

    # -- the math -----------------------------------------------------------------------
    def _deltas(self, a: Tick, b: Tick) -> list[float]:
        out = [0.0] * self.n
        for i in range(self.n):
            ea = a.energy_j[i] if i < len(a.energy_j) else None
            eb = b.energy_j[i] if i < len(b.energy_j) else None
            if ea is None or eb is None:
                continue
            d = eb - ea
            if not (d >= 0.0) or math.isinf(d):  # negative, NaN or inf: the sensor misbehaved
                self.anomalies[self.source_ids[i]] = self.anomalies.get(self.source_ids[i], 0) + 1
                continue
            out[i] = d
        return out

    def _drain(self, final: bool) -> None:
        ticks = self._ticks
        cut = None
        while len(ticks) >= 2 and (final or self._watermark >= ticks[1].t_ns):
            a = ticks.popleft()
            self._charge(a, ticks[0])
            cut = ticks[0].t_ns
        if final:
            self._pending = []
        elif cut is not None and self._pending:
            # Samples of several processes arrive out of order: keep those still to charge.
            self._pending = [s for s in self._pending if s.t1_ns > cut]

    def _cpu_shares(self, b: Tick, a: Tick) -> tuple[float, float, float, float]:
        """(phi_program, phi_own, child fraction of the program, the program's part under 'all').

        The program's and energyprof's CPU over [a, b] come from nanosecond clocks and are
        used as they are. Other processes' CPU is busy - ours, where busy comes from
        /proc/stat in 10 ms ticks; over one interval that is mostly quantisation, so it
        (and the coarsely polled live children) is taken as a rate over a trailing window.
        """
        hist = self._share_hist
        limit = b.t_ns - self.share_window_ns
        while len(hist) >= 2 and hist[1].t_ns <= limit and hist[1].t_ns <= a.t_ns:
            hist.popleft()
        ref = hist[0] if hist and hist[0].t_ns <= a.t_ns else a
        dt = b.t_ns - a.t_ns
        span = b.t_ns - ref.t_ns
        d_own = max(0, b.own_cpu_ns - a.own_cpu_ns)
        d_proc = max(0, b.process_cpu_ns - a.process_cpu_ns - d_own)
        w_children = max(0, b.children_cpu_ns - ref.children_cpu_ns)
        w_others = max(0, (b.busy_cpu_ns - ref.busy_cpu_ns) - (b.process_cpu_ns - ref.process_cpu_ns) - w_children)
        d_children = w_children * dt / span if span > 0 else 0.0
        d_others = w_others * dt / span if span > 0 else 0.0
        d_prog = d_proc + d_children
        self._d_proc = d_proc
        capacity = dt * self.cpus
        # energyprof pays for the fraction of the machine it occupied, never for idle power.
        phi_own = min(1.0, d_own / capacity) if capacity > 0 else 0.0
        # The program pays its share of the busy CPU (the one rule, facts/policy.cpu_share); below
        # IDLE_FLOOR of capacity the machine counts as idle and what nobody used goes to
        # [other processes and idle].
        busy = d_prog + d_own + d_others
        if busy <= 0 and capacity <= 0:
            return 0.0, phi_own, 0.0, 1.0 - phi_own
        phi_prog = min(cpu_share(d_prog, busy, capacity), 1.0 - phi_own)
        child_frac = d_children / d_prog if d_prog else 0.0
        # Under 'all' the job pays for the whole machine, less energyprof's part.
        return phi_prog, phi_own, child_frac, self._all_part(phi_own, d_prog, d_own, b, dt, capacity)

    def _note_peers(self, tick: Tick) -> None:
        """Keep the points at which the peers' CPU was read anew. The supervisor walks /proc for
        them every 250 ms, so between two walks their cumulative figure stands still and then
        jumps: a delta over the 100 ms share window would be 0 most of the time and 2.5 times
        the rate the rest, and the clamp of the unused pool at 0 would turn that into ranks that
        charge more than the node. A figure unchanged for PEERS_STALE_NS counts as read (idle peers)."""
        if not self.node_ranks or self.node_ranks <= 1:
            return
        pts = self._peer_points
        if not pts or tick.peers_cpu_ns != pts[-1][1] or tick.t_ns - pts[-1][0] >= PEERS_STALE_NS:
            pts.append((tick.t_ns, tick.peers_cpu_ns))

    def _peers_rate(self, t_ns: int) -> float:
        """The peers' CPU per nanosecond between the last two readings at or before `t_ns`."""
        last: list[tuple[int, int]] = []
        for p in reversed(self._peer_points):
            if p[0] <= t_ns:
                last.append(p)
                if len(last) == 2:
                    break
        if len(last) < 2 or last[0][0] <= last[1][0]:
            return 0.0
        return max(0, last[0][1] - last[1][1]) / (last[0][0] - last[1][0])

    def _all_part(self, phi_own: float, d_prog: float, d_own: float, b: Tick, dt: int, capacity: float) -> float:
        """The program's part of a CPU-class source under `all`: the machine less energyprof's part
        or, for one rank of R on the node, its own CPU plus 1/R of the CPU no rank used."""
        ranks = self.node_ranks
        if not ranks or ranks <= 1 or capacity <= 0:
            return 1.0 - phi_own
        d_peers = self._peers_rate(b.t_ns) * dt
        pool = max(0.0, capacity - d_prog - d_own - d_peers)
        return min(1.0 - phi_own, (d_prog + pool / ranks) / capacity)

    def _charge(self, a: Tick, b: Tick) -> None:
        """Charge the interval [a, b]: the machine's energy, the program's part of it spread over the
        samples that overlap it, energyprof's part, what is no one's, and the windows open in it."""
        lo, hi = a.t_ns, b.t_ns
        if hi <= lo:
            return
        de = self._deltas(a, b)
        for i in range(self.n):
            self.total[i] += de[i]
        parts = self._program_parts(a, b, de) if any(de) else None
        self._iv = {}
        self._iv_units = {}
        weights = self._weights(lo, hi)
        if weights.seen:
            self.timeline.note_stacks(lo, weights.seen)
        if parts is not None:
            self._charge_program(lo, hi, de, parts, weights)
        self._charge_windows(lo, hi, de, parts)

    def _weights(self, lo: int, hi: int) -> _Weights:
        """How much each waiting sample weighs in [lo, hi], by the part of its span inside it.

        Weights are kept per (stack, process): a stack may recur in processes that come and go
        (each epoch's DataLoader worker N has the same stacks), and each is charged for its own."""
        w = _Weights({}, {}, {}, {}, {})
        cpu_w, wall_w, gpu_w, main_w, seen = w
        gpu_procs = self.gpu_procs
        for s in self._pending:
            t0, t1, sid, cpu, main, _, proc, unit = s
            if t1 <= lo or t0 >= hi:
                continue
            ov = (t1 if t1 < hi else hi) - (t0 if t0 > lo else lo)
            key = (sid, proc, unit)
            if unit >= 0 and t1 <= hi:
                counts = unit_row(self._iv_units, self.n, proc, unit)[2]
                counts[0] += 1
                counts[1] += cpu
            if cpu:
                cpu_w[key] = cpu_w.get(key, 0.0) + cpu * ov / (t1 - t0)
            if main:
                # A GPU's energy goes by wall time to the main thread of a process using it,
                # whatever it waits for (the kernels it launched run meanwhile).
                if proc in gpu_procs:
                    gpu_w[key] = gpu_w.get(key, 0.0) + ov
                # The fallback counts only a stack that was running: with CPU, or in a call that
                # is not a known wait. A thread blocked in a wait gets none of it.
                if cpu or not self._waiting(sid):
                    wall_w[key] = wall_w.get(key, 0.0) + ov
                if cpu:
                    main_w[key] = main_w.get(key, 0.0) + ov
            seen[sid] = seen.get(sid, 0.0) + ov
        return w

    def _carried(self, cpu_w: dict[WeightKey, float]) -> float:
        """The fraction of the program's CPU in the interval that its samples may carry.

        Samples are prorated over their spans, which straddle the ticks: an interval's samples may
        hold from about half to twice its CPU, and the fold scales them to it. Beyond that the CPU
        was one no sample saw, and the samples keep no more than CARRY_LIMIT times their worth."""
        carried_ns = sum(cpu_w.values())
        return CARRY_LIMIT * carried_ns / self._d_proc if self._d_proc > CARRY_LIMIT * carried_ns else 1.0

    def _charge_program(self, lo: int, hi: int, de: list[float], parts: list[tuple[float, float, float, float]],
                        weights: _Weights) -> None:
        """Each source's part of the interval: energyprof's and no one's booked, the program's spread
        over its samples (CPU-class energy by CPU time, to wall time only where nothing of the program
        used CPU in the interval; GPU energy by wall time, to the processes using the GPU)."""
        carried = self._carried(weights.cpu)
        prog_share_by = [0.0] * self.n  # per source: the timeline spreads each over its counter's own period
        prog_all_by = [0.0] * self.n
        for i, d in enumerate(de):
            if d == 0.0:
                continue
            prog_share, own_share, prog_all, cf = parts[i]
            self._book_outside(i, d, prog_share, own_share, prog_all)
            prog_share_by[i] = prog_share
            prog_all_by[i] = prog_all
            w = weights.for_source(self.gpu[i])
            if w is weights.cpu and carried < 1.0:
                prog_share, prog_all, cf = self._charge_unseen_cpu(i, weights.main, prog_share, prog_all, cf,
                                                                   1.0 - carried)
            if w:
                self._spread(w, i, prog_share, prog_all, cf)
            else:
                self._charge_root(i, prog_share, prog_all)
        self.timeline.note_program(lo, hi, prog_share_by, prog_all_by)  # the program's power line

    def _book_outside(self, i: int, d: float, prog_share: float, own_share: float, prog_all: float) -> None:
        """What of source i's `d` joules is not the program's: energyprof's part (the fraction of the
        machine it used, under either policy) and the rest, no one's (idle, other processes)."""
        self.own.share[i] += own_share
        self.own.all[i] += own_share
        self.idle.all[i] += remainder(d, prog_all + own_share)
        self.idle.share[i] += remainder(d, prog_share + own_share)  # phi_prog <= 1 - phi_own

    def _charge_unseen_cpu(self, i: int, main_w: dict[WeightKey, float], prog_share: float, prog_all: float,
                           child_frac: float, lost: float) -> tuple[float, float, float]:
        """The program's CPU that its samples do not carry (under 1/CARRY_LIMIT of what its clocks
        counted: work before the sampler's first tick or after its last, a thread it never saw).

        Its `lost` fraction goes by wall time to the main threads that used CPU in the interval, else
        to the root: never onto the few samples that carried some (a departing thread's last 0.1 ms
        would take a whole interval's share), nor to a thread that used no CPU. Returns what is left
        for the samples: (share, all, the children's fraction of it)."""
        lost_share, lost_all = prog_share * (1.0 - child_frac) * lost, prog_all * (1.0 - child_frac) * lost
        if main_w:
            self._spread(main_w, i, lost_share, lost_all, 0.0)
        else:
            self._charge_root(i, lost_share, lost_all)
        kept_share, kept_all = prog_share - lost_share, prog_all - lost_all
        kept_child_frac = prog_share * child_frac / kept_share if kept_share > 0 else 0.0
        return kept_share, kept_all, kept_child_frac

    def _charge_root(self, i: int, e_share: float, e_all: float) -> None:
        """The program's energy that no sample carries: its root's own."""
        self.root.share[i] += e_share
        self.root.all[i] += e_all
        self._note_interval(None, i, e_share, e_all)

    def _note_interval(self, proc: int | None, i: int, e_share: float, e_all: float) -> None:
        """What a process (None: no sample carried it) was charged in the interval being charged,
        for the windows its processes marked."""
        row = self._iv.get(proc)
        if row is None:
            row = self._iv[proc] = ([0.0] * self.n, [0.0] * self.n)
        row[0][i] += e_share
        row[1][i] += e_all

    def _spread(self, weights: dict[WeightKey, float], i: int, e_share: float, e_all: float,
                child_frac: float) -> None:
        total_w = sum(weights.values())
        stats = self.stats
        procs = self.procs
        for (sid, proc, unit), w in weights.items():
            f = w / total_w
            ps = procs[proc]
            ps.share[i] += e_share * f
            ps.all[i] += e_all * f
            self._note_interval(proc, i, e_share * f, e_all * f)
            if unit >= 0:
                row = unit_row(self._iv_units, self.n, proc, unit)
                row[0][i] += e_share * f
                row[1][i] += e_all * f
            st = stats[sid]
            if child_frac:
                own_f = f * (1.0 - child_frac)
                st.share[i] += e_share * own_f
                st.all[i] += e_all * own_f
                cst = self._child_stat(sid)
                cst.share[i] += e_share * (f - own_f)
                cst.all[i] += e_all * (f - own_f)
            else:
                st.share[i] += e_share * f
                st.all[i] += e_all * f

    def _waiting(self, sid: int) -> bool:
        """The stack's innermost frame is a standard-library wait (select, accept, a lock, a
        queue's get): a thread sampled there was blocked, not running."""
        w = self._wait_cache.get(sid)
        if w is None:
            frames = self.stacks.stacks[sid]
            w = bool(frames) and is_wait(self.stacks.frames[frames[-1]])
            self._wait_cache[sid] = w
        return w

    def _child_stat(self, sid: int) -> StackTally:
        csid = self._child_sid.get(sid)
        if csid is None:
            csid = self._child_sid[sid] = self.stacks.extend(sid, CHILD_FRAME)
        st = self.stats.get(csid)
        if st is None:
            st = self.stats[csid] = StackTally(share=[0.0] * self.n, all=[0.0] * self.n)
        return st

    def _program_parts(self, a: Tick, b: Tick, de: list[float]) -> list[tuple[float, float, float, float]]:
        """Per source, of interval [a, b]: (the program's part under 'share', energyprof's under
        'share', the program's under 'all', the fraction of the program's that its children spent)."""
        phi_prog, phi_own, child_frac, all_prog = self._cpu_shares(b, a)
        gpu_share = b.gpu_share or {}
        out = []
        for i, d in enumerate(de):
            if self.gpu[i]:
                g = min(1.0, max(0.0, gpu_share.get(self.source_ids[i], 1.0)))
                # one rank of several pays under `all` for the devices it uses, not its peers'
                out.append((g * d, 0.0, g * d if self.node_ranks and self.node_ranks > 1 else d, 0.0))
            else:
                out.append((phi_prog * d, phi_own * d, all_prog * d, child_frac))
        return out

    def _charge_windows(self, lo: int, hi: int, de: list[float],
                        parts: list[tuple[float, float, float, float]] | None) -> None:
        """Each window open in [lo, hi] gets the part of the interval's energy it overlaps: the
        machine's, and the program's under both idle policies, spread alike (by overlap). A window
        marked by one process of several (a rank) gets what that process and the processes it
        started were charged, never the whole program's."""
        if not self._live_windows:
            return
        dt = hi - lo
        still = []
        for w in self._live_windows:
            end = w.end_ns
            if w.start_ns < hi and (end is None or end > lo):
                ov = min(hi, end if end is not None else hi) - max(lo, w.start_ns)
                if ov > 0 and (parts is not None or w.unit is not None):  # a unit counts its samples regardless
                    machine, share, all_ = w.machine, w.share, w.all
                    # a unit's part is what its samples were charged in the interval, whole; another's, by overlap
                    own = (subtree_part(self._iv, self.process_info, self.n, w.pid) if w.unit is None
                           else unit_part(self._iv_units, self.n, w))
                    scale = ov / dt if w.unit is None else 1.0
                    for i, d in enumerate(de):
                        machine[i] += d * ov / dt
                        share[i] += (parts[i][0] if own is None else own[0][i]) * scale
                        all_[i] += (parts[i][2] if own is None else own[1][i]) * scale
            if end is None or end > hi:
                still.append(w)
            else:
                w.done = True
                if w.unit is not None:
                    self._unit_done(w)
        self._live_windows = still

    # -- processes ----------------------------------------------------------------------
    def note_start_rss(self, proc: int, rss: int, main: bool) -> None:
        """A process's RSS before its program's first line: its first sample's growth is from there
        (memory its first function took before a sample saw it is that function's), and the main
        process's is the run's baseline."""
        ps = self.procs.get(proc)
        if ps is None:
            ps = self.procs[proc] = ProcessTally([0.0] * self.n, [0.0] * self.n)
        if not ps.last_rss:
            ps.last_rss = rss
        if main and self.start_rss is None:
            self.start_rss = rss

    def baseline_rss(self, rss: list[int]) -> int | None:
        """RSS at the start: the first reading's (an in-process profile: when profiling began), else the
        program's before its first line, else (a run whose first reading precedes the program and whose
        agent read none) the first RSS seen in `rss`."""
        first = self.first_tick
        if first is not None and first.rss_bytes:
            return first.rss_bytes
        if self.start_rss:
            return self.start_rss
        return next((r for r in rss if r), None)

    def note_process(self, pid: int, **info: Any) -> None:
        """Record what the collector knows of one process of the job (see `core/processes.process_table`)."""
        self.process_info.setdefault(pid, {"pid": pid}).update(info)

    def note_threads(self, pid: int, sid: int, count: int) -> None:
        """So far `count` threads of process `pid` ran under the thread group whose node ends stack `sid`."""
        self.thread_counts.setdefault(pid, {})[sid] = count

    @property
    def charged_ns(self) -> int | None:
        """The time up to which the ticks have been charged: the oldest tick still held (waiting for the
        samples that cover it), else the last one; None before any tick."""
        return self._ticks[0].t_ns if self._ticks else self.last_ns

    def program_parts(self, policy: str) -> tuple[list[float], dict[int, list[float]]]:
        """The program's energy so far per source under `policy`: what no sample carried, and each
        process's part (their sum is the program's attributed energy so far)."""
        share = check_policy(policy) == "share"
        return (list(self.root.pick(policy)),
                {proc: list(ps.share if share else ps.all) for proc, ps in self.procs.items()})

    def program_energy(self, policy: str) -> list[float]:
        """The program's energy so far per source under `policy` (the `core/processes.process_table` rows' sum)."""
        total, parts = self.program_parts(policy)
        for row in parts.values():
            for i, v in enumerate(row):
                total[i] += v
        return total
