"""The timeline: power and RSS at bounded resolution, and which stacks ran in each bucket. Pure."""

from __future__ import annotations

import bisect
from typing import Any

TIMELINE_POINTS = 1000
STACKS_PER_BUCKET = 48  # stacks remembered per timeline bucket (the heaviest), for "when did f run"


class Timeline:
    """Power and RSS at bounded resolution: when full, adjacent buckets merge in pairs."""

    def __init__(self, n_sources: int, max_points: int = TIMELINE_POINTS) -> None:
        self.n = n_sources
        self.max_points = max_points
        self.width_ns = 0  # 0: one bucket per tick until the first merge
        self.t0: list[int] = []
        self.t1: list[int] = []
        self.energy: list[list[float]] = []
        self.rss: list[int] = []
        self.stacks: list[dict[int, float]] = []  # stack id -> wall ns seen in the bucket

    def add(self, t0: int, t1: int, de: list[float], rss: int) -> None:
        if self.t0 and self.width_ns and t1 - self.t0[-1] <= self.width_ns:
            last = self.energy[-1]
            for i, v in enumerate(de):
                last[i] += v
            self.t1[-1] = t1
            self.rss[-1] = max(self.rss[-1], rss)
            return
        self.t0.append(t0)
        self.t1.append(t1)
        self.energy.append(list(de))
        self.rss.append(rss)
        self.stacks.append({})
        if len(self.t0) > self.max_points:
            self._halve()

    def note_stacks(self, t_ns: int, weights: dict[int, float]) -> None:
        """Remember which stacks ran in the bucket holding t_ns (the heaviest few only)."""
        k = bisect.bisect_right(self.t0, t_ns) - 1
        if k < 0:
            return
        seen = self.stacks[k]
        for sid, w in weights.items():
            seen[sid] = seen.get(sid, 0.0) + w
        if len(seen) > 2 * STACKS_PER_BUCKET:
            self.stacks[k] = _heaviest(seen)

    def _halve(self) -> None:
        t0, t1, en, rss, stacks = [], [], [], [], []
        for i in range(0, len(self.t0), 2):
            j = min(i + 1, len(self.t0) - 1)
            t0.append(self.t0[i])
            t1.append(self.t1[j])
            en.append([a + (b if j != i else 0.0) for a, b in zip(self.energy[i], self.energy[j])])
            rss.append(max(self.rss[i], self.rss[j]))
            merged = dict(self.stacks[i])
            if j != i:
                for sid, w in self.stacks[j].items():
                    merged[sid] = merged.get(sid, 0.0) + w
            stacks.append(_heaviest(merged) if len(merged) > STACKS_PER_BUCKET else merged)
        self.t0, self.t1, self.energy, self.rss, self.stacks = t0, t1, en, rss, stacks
        spans = [b - a for a, b in zip(self.t0, self.t1)]
        self.width_ns = max(spans) if spans else 0

    def export(self, start_ns: int, source_ids: list[str]) -> dict[str, Any]:
        mids = [((a + b) / 2 - start_ns) / 1e9 for a, b in zip(self.t0, self.t1)]
        power: dict[str, list[float]] = {sid: [] for sid in source_ids}
        for a, b, row in zip(self.t0, self.t1, self.energy):
            span = max(b - a, 1) / 1e9
            for sid, e in zip(source_ids, row):
                power[sid].append(e / span)
        return {
            "t_s": mids,
            "start_s": [(a - start_ns) / 1e9 for a in self.t0],
            "end_s": [(b - start_ns) / 1e9 for b in self.t1],
            "power_w": power,
            "rss_bytes": list(self.rss),
        }


def _heaviest(weights: dict[int, float]) -> dict[int, float]:
    top = sorted(weights.items(), key=lambda kv: -kv[1])[:STACKS_PER_BUCKET]
    return dict(top)


