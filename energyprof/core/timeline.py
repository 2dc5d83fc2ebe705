"""The timeline: power and RSS at bounded resolution, and which stacks ran in each bucket. Pure.

Buckets are the cells of a uniform grid from the first tick: cell k is [origin + k*w, origin +
(k+1)*w). A tick's energy is spread over the cells it overlaps in proportion to the overlap
(constant power within a tick, which is all a cumulative counter can tell), so every bucket has
the same width however the ticks fell: one long first tick during `import torch` no longer
widens every later bucket. When the run outgrows `max_points` cells, the width doubles and
cells merge in pairs.

A counter read faster than it moves (NVML's energy counter moves every ~100 ms; the ticks come every
20-50 ms) reads zero, zero, zero, then a jump that holds the whole update period's energy. Drawn as it
was read, that jump is one tick's power: a 700 W GPU drew 1,330 W in 20-ms cells. So a source's energy
is spread over its own update period: from the tick at which its counter last moved to the tick at
which it moves again, never further back than twice its period (declared by the sensor, or detected
from the gap between its last two moves), so a source that truly drew nothing for a while does not
smear its next reading over the silence. A hardware counter whose period is not known yet (its first
move) is spread back to its last reading that moved: a counter's jump was spent since then, whenever.
The program's part of a jump is spread over the same span. Spreading moves energy between cells, never
in or out of the grid: the cells still sum to the counter.
"""

from __future__ import annotations

from typing import Any, Sequence


TIMELINE_POINTS = 1000
STACKS_PER_BUCKET = 48  # stacks remembered per timeline bucket (the heaviest), for "when did f run"
MIN_WIDTH_NS = 1_000_000  # the finest grid: 1 ms, finer than any sensor's update
LOOKBACK_PERIODS = 2  # a counter's jump is spread back at most this many update periods
MAX_HELD_SPANS = 4096  # tick ends whose spread spans wait for the program's part (charged a few ticks later)


class Timeline:
    """Power, the program's share of it, and RSS per cell of a uniform grid."""

    def __init__(self, n_sources: int, max_points: int = TIMELINE_POINTS, width_ns: int = MIN_WIDTH_NS,
                 periods_s: Sequence[float | None] | None = None, counters: Sequence[bool] | None = None) -> None:
        """`width_ns`: the starting cell width. A cell finer than both the stack sampling and the
        sensor reads holds nothing more (power is constant within a tick, a stack is seen once per
        interval), and each tick pays for every cell it spans: 1 ms cells under 50 ms ticks cost
        the supervisor's tick ~130 us of its ~520 us on a 4 s run. `periods_s`: each source's
        declared update period (None: not declared; then it is detected from the counter's moves);
        `counters`: which sources are cumulative hardware counters (the rest integrate power samples or a model)."""
        self.n = n_sources
        self.period_ns = [int((p or 0.0) * 1e9) if isinstance(p, (int, float)) and p > 0 else 0
                          for p in (list(periods_s or []) + [None] * n_sources)[:n_sources]]
        self.counter = [bool(c) for c in (list(counters or []) + [False] * n_sources)[:n_sources]]
        self._moved: list[int | None] = [None] * n_sources  # per source: the tick end at which its counter last moved
        self._gap: list[int] = [0] * n_sources  # per source: the time between its last two moves (ns)
        # tick end -> each source's spread start, where one began before the tick: the program's part of
        # that tick (charged once its samples are in) is spread over the same span
        self._spans: dict[int, list[int]] = {}
        self.max_points = max_points
        self.width_ns = max(MIN_WIDTH_NS, int(width_ns))
        self.origin_ns: int | None = None
        self.t0: list[int] = []  # cell starts
        self.t1: list[int] = []  # cell ends (the last cell ends at the last tick)
        self.energy: list[list[float]] = []
        # the program's energy per cell under each idle policy: [share, all]
        self.program: list[list[float]] = []
        self.rss: list[int] = []
        self.stacks: list[dict[int, float]] = []  # stack id -> wall ns seen in the cell

    def _ensure(self, t_end: int) -> None:
        """Cells up to t_end, regridding first if the run would not fit in max_points."""
        origin = self.origin_ns or 0
        while t_end - origin > self.width_ns * self.max_points:
            self._regrid()
        last = (t_end - 1 - origin) // self.width_ns
        while len(self.t0) <= last:
            start = origin + len(self.t0) * self.width_ns
            self.t0.append(start)
            self.t1.append(start)
            self.energy.append([0.0] * self.n)
            self.program.append([0.0, 0.0])
            self.rss.append(0)
            self.stacks.append({})

    def _spread(self, t0: int, t1: int) -> list[tuple[int, int, float]]:
        """(cell, end of the overlap, fraction of [t0, t1]) for every cell the interval overlaps."""
        origin, w = self.origin_ns or 0, self.width_ns
        span = t1 - t0
        out = []
        for k in range((t0 - origin) // w, min((t1 - 1 - origin) // w + 1, len(self.t0))):
            lo = max(t0, origin + k * w)
            hi = min(t1, origin + (k + 1) * w)
            if hi > lo and k >= 0:
                out.append((k, hi, (hi - lo) / span))
        return out

    def add(self, t0: int, t1: int, de: list[float], rss: int) -> None:
        if t1 <= t0:
            return
        if self.origin_ns is None:
            self.origin_ns = t0
            self._moved = [t0] * self.n  # every counter is read at the start
        self._ensure(t1)
        starts = self._starts(t0, t1, de)
        for k, hi, f in self._spread(t0, t1):
            cell = self.energy[k]
            for i, v in enumerate(de):
                if starts[i] == t0:
                    cell[i] += v * f
            if hi > self.t1[k]:
                self.t1[k] = hi
            if rss > self.rss[k]:
                self.rss[k] = rss
        spread = [i for i in range(len(de)) if starts[i] < t0]
        for i in spread:  # a jump that holds more than this tick: over the counter's own period
            for k, _, f in self._spread(starts[i], t1):
                self.energy[k][i] += de[i] * f
        if spread:
            self._spans[t1] = starts
            if len(self._spans) > MAX_HELD_SPANS:  # never charged (a checkpoint restored without them)
                del self._spans[next(iter(self._spans))]

    def _starts(self, t0: int, t1: int, de: list[float]) -> list[int]:
        """Where each source's energy of the tick [t0, t1] is spread from: the tick's start, or, for
        a counter that moves more slowly than it is read, the tick at which it last moved (at most
        LOOKBACK_PERIODS of its declared or detected update period back)."""
        starts = [t0] * len(de)
        moved, gap = self._moved, self._gap
        for i, v in enumerate(de):
            if i >= self.n or v == 0.0:
                continue
            last = moved[i]
            if last is not None:
                period = max(self.period_ns[i], gap[i])
                if last < t0 and period > 0:
                    starts[i] = min(t0, max(last, t1 - LOOKBACK_PERIODS * period))
                elif last < t0 and self.counter[i]:
                    starts[i] = last
                gap[i] = t1 - last
            moved[i] = t1
        return starts

    def note_program(self, t0: int, t1: int, share_j: Sequence[float], all_j: Sequence[float]) -> None:
        """The program's energy over [t0, t1] under both idle policies, per source (as the ledger charges
        it), spread like the machine's: each source's part over the span its own energy of that tick was
        spread over."""
        if self.origin_ns is None or t1 <= t0:
            return
        starts = self._spans.pop(t1, None)
        while self._spans and next(iter(self._spans)) <= t1:  # ticks charged already, or never to be
            del self._spans[next(iter(self._spans))]
        by_start: dict[int, list[float]] = {}
        for i, (a, b) in enumerate(zip(share_j, all_j)):
            if a == 0.0 and b == 0.0:
                continue
            # a tick that spans several of the counter's (coarsened while no sample came) keeps its own start
            start = min(t0, starts[i]) if starts is not None and i < len(starts) else t0
            acc = by_start.setdefault(start, [0.0, 0.0])
            acc[0] += a
            acc[1] += b
        for start, (a, b) in by_start.items():
            self._note_program_span(start, t1, a, b)

    def _note_program_span(self, t0: int, t1: int, share_j: float, all_j: float) -> None:
        for k, _, f in self._spread(t0, t1):
            p = self.program[k]
            p[0] += share_j * f
            p[1] += all_j * f

    def note_stacks(self, t_ns: int, weights: dict[int, float]) -> None:
        """Remember which stacks ran in the cell holding t_ns (the heaviest few only)."""
        if self.origin_ns is None:
            return
        k = (t_ns - self.origin_ns) // self.width_ns
        if not 0 <= k < len(self.stacks):
            return
        seen = self.stacks[k]
        for sid, w in weights.items():
            seen[sid] = seen.get(sid, 0.0) + w
        if len(seen) > 2 * STACKS_PER_BUCKET:
            self.stacks[k] = _heaviest(seen)

    def _regrid(self) -> None:
        """Twice the width: cells 2k and 2k+1 become cell k."""
        self.width_ns *= 2
        origin = self.origin_ns or 0
        t0: list[int] = []
        t1: list[int] = []
        en: list[list[float]] = []
        prog: list[list[float]] = []
        rss: list[int] = []
        stacks: list[dict[int, float]] = []
        for i in range(len(self.t0)):
            if i % 2:
                en[-1] = [a + b for a, b in zip(en[-1], self.energy[i])]
                prog[-1] = [a + b for a, b in zip(prog[-1], self.program[i])]
                t1[-1] = max(t1[-1], self.t1[i])
                rss[-1] = max(rss[-1], self.rss[i])
                merged = stacks[-1]
                for sid, w in self.stacks[i].items():
                    merged[sid] = merged.get(sid, 0.0) + w
                if len(merged) > STACKS_PER_BUCKET:
                    stacks[-1] = _heaviest(merged)
                continue
            t0.append(origin + (i // 2) * self.width_ns)
            t1.append(self.t1[i])
            en.append(list(self.energy[i]))
            prog.append(list(self.program[i]))
            rss.append(self.rss[i])
            stacks.append(dict(self.stacks[i]))
        self.t0, self.t1, self.energy, self.program, self.rss, self.stacks = t0, t1, en, prog, rss, stacks

    def export(self, start_ns: int, source_ids: list[str]) -> dict[str, Any]:
        mids = [((a + b) / 2 - start_ns) / 1e9 for a, b in zip(self.t0, self.t1)]
        power: dict[str, list[float]] = {sid: [] for sid in source_ids}
        program: dict[str, list[float]] = {"share": [], "all": []}
        for a, b, row, prog in zip(self.t0, self.t1, self.energy, self.program):
            span = max(b - a, 1) / 1e9
            for sid, e in zip(source_ids, row):
                power[sid].append(e / span)
            program["share"].append(prog[0] / span)
            program["all"].append(prog[1] / span)
        return {
            "t_s": mids,
            "start_s": [(a - start_ns) / 1e9 for a in self.t0],
            "end_s": [(b - start_ns) / 1e9 for b in self.t1],
            "power_w": power,
            "program_w": program,
            "rss_bytes": list(self.rss),
        }


def _heaviest(weights: dict[int, float]) -> dict[int, float]:
    top = sorted(weights.items(), key=lambda kv: -kv[1])[:STACKS_PER_BUCKET]
    return dict(top)
