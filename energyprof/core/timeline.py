"""The timeline: power and RSS at bounded resolution, and which stacks ran in each bucket. Pure.

Buckets sit on a uniform grid: bucket k holds the ticks that start in [origin + k*w, origin +
(k+1)*w). When there are too many, the grid's width at least doubles (to fit the run in half the
points) and buckets in the same cell merge. A tick longer than the grid (a long first tick during
`import torch`) stays one bucket of its own length; every other bucket is one cell wide, however
the ticks fell.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

TIMELINE_POINTS = 1000
STACKS_PER_BUCKET = 48  # stacks remembered per timeline bucket (the heaviest), for "when did f run"


class Timeline:
    """Power, the program's share of it, and RSS at bounded resolution on a uniform grid."""

    def __init__(self, n_sources: int, max_points: int = TIMELINE_POINTS) -> None:
        self.n = n_sources
        self.max_points = max_points
        self.width_ns = 0  # 0: one bucket per tick until the first regrid
        self.origin_ns: int | None = None
        self.t0: list[int] = []
        self.t1: list[int] = []
        self.energy: list[list[float]] = []
        # the program's energy per bucket under each idle policy: [share, all]
        self.program: list[list[float]] = []
        self.rss: list[int] = []
        self.stacks: list[dict[int, float]] = []  # stack id -> wall ns seen in the bucket

    def _cell(self, t_ns: int) -> int:
        return (t_ns - (self.origin_ns or 0)) // self.width_ns

    def add(self, t0: int, t1: int, de: list[float], rss: int) -> None:
        if self.origin_ns is None:
            self.origin_ns = t0
        if self.t0 and self.width_ns and self._cell(t0) == self._cell(self.t0[-1]):
            last = self.energy[-1]
            for i, v in enumerate(de):
                last[i] += v
            self.t1[-1] = max(self.t1[-1], t1)
            self.rss[-1] = max(self.rss[-1], rss)
            return
        self.t0.append(t0)
        self.t1.append(t1)
        self.energy.append(list(de))
        self.program.append([0.0, 0.0])
        self.rss.append(rss)
        self.stacks.append({})
        if len(self.t0) > self.max_points:
            self._regrid()

    def _bucket(self, t_ns: int) -> int:
        return bisect.bisect_right(self.t0, t_ns) - 1

    def note_program(self, t_ns: int, share_j: float, all_j: float) -> None:
        """Add the program's energy over an interval starting at t_ns (both idle policies)."""
        k = self._bucket(t_ns)
        if k >= 0:
            p = self.program[k]
            p[0] += share_j
            p[1] += all_j

    def note_stacks(self, t_ns: int, weights: dict[int, float]) -> None:
        """Remember which stacks ran in the bucket holding t_ns (the heaviest few only)."""
        k = self._bucket(t_ns)
        if k < 0:
            return
        seen = self.stacks[k]
        for sid, w in weights.items():
            seen[sid] = seen.get(sid, 0.0) + w
        if len(seen) > 2 * STACKS_PER_BUCKET:
            self.stacks[k] = _heaviest(seen)

    def _regrid(self) -> None:
        """A grid at least twice as wide, fitting the run so far in half the points."""
        span = self.t1[-1] - (self.origin_ns or 0)
        self.width_ns = max(2 * self.width_ns, math.ceil(2 * span / self.max_points), 1)
        t0: list[int] = []
        t1: list[int] = []
        en: list[list[float]] = []
        prog: list[list[float]] = []
        rss: list[int] = []
        stacks: list[dict[int, float]] = []
        cell = None
        for i in range(len(self.t0)):
            c = self._cell(self.t0[i])
            if c == cell:
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
            cell = c
            t0.append(self.t0[i])
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
