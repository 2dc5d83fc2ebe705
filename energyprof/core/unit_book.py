"""Each unit of work's runs once charged, in memory bounded per name. Pure.

A long-running server ends millions of requests; a window kept per request would grow without bound.
Per name (a route), every run counts in exact sums (how many, their joules per source under both idle
policies, the machine's energy, their time, samples and CPU), while only a bounded set of them is kept one
by one:

* a uniform sample of `sample_runs` of them (Vitter's algorithm R: the n-th run replaces a kept one with
  probability k/n; seeded, so the same runs keep the same sample), for the median and p95;
* the `costliest` under each idle policy, for the costliest list and the max.

Every other run is folded into one window of its name that stands for them (`runs` of them, its figures
their sums: agent/window_facts.RUNS_FACT), so counts, totals and means stay exact however many are folded.
A run kept for the costliest list only says so (COSTLIEST_ONLY): it is not part of the uniform sample.
"""

from __future__ import annotations

import random

from ..agent.window_facts import COSTLIEST_ONLY, CPU_FACT, REQUEST_FACT, RUNS_FACT, RUNS_TIME_FACT, SAMPLES_FACT
from .tallies import WindowTally

SAMPLE_RUNS = 256  # per name: the median and p95 of a uniform sample of 256 are within a few ranks of the runs'
COSTLIEST_KEPT = 5  # per name and idle policy (the report lists the 5 costliest of a kind)


class _Name:
    __slots__ = ("count", "sample", "in_sample", "top", "rest")

    def __init__(self) -> None:
        self.count = 0
        self.sample: list[WindowTally] = []
        self.in_sample: set[int] = set()  # ids of the sampled runs
        self.top: tuple[list[WindowTally], list[WindowTally]] = ([], [])  # the costliest under `share`, under `all`
        self.rest: WindowTally | None = None

    def kept(self, w: WindowTally) -> bool:
        return id(w) in self.in_sample or any(w is r for top in self.top for r in top)


class UnitBook:
    """The runs of each unit name: exact sums, a uniform sample and the costliest kept (`tallies`)."""

    def __init__(self, n: int, sample_runs: int = SAMPLE_RUNS, costliest: int = COSTLIEST_KEPT, seed: int = 0) -> None:
        self.n = n
        self.sample_runs = max(1, sample_runs)
        self.costliest = max(1, costliest)
        self._rng = random.Random(seed)
        self._names: dict[str, _Name] = {}

    def add(self, w: WindowTally) -> None:
        """A unit's window, charged: counted, and kept or folded."""
        g = self._names.get(w.name)
        if g is None:
            g = self._names[w.name] = _Name()
        g.count += 1
        leaving: list[WindowTally] = []
        if len(g.sample) < self.sample_runs:
            g.sample.append(w)
            g.in_sample.add(id(w))
        else:
            j = self._rng.randrange(g.count)
            if j < self.sample_runs:
                out, g.sample[j] = g.sample[j], w
                g.in_sample.discard(id(out))
                g.in_sample.add(id(w))
                leaving.append(out)
            else:
                leaving.append(w)
        for p, top in enumerate(g.top):
            top.append(w)
            if len(top) > self.costliest:
                cheapest = min(top, key=lambda r: (sum(r.share if p == 0 else r.all), -r.start_ns))
                top.remove(cheapest)
                leaving.append(cheapest)
        seen: set[int] = set()
        for r in leaving:
            if id(r) in seen:
                continue
            seen.add(id(r))
            if g.kept(r):
                if id(r) not in g.in_sample:
                    r.loop[COSTLIEST_ONLY] = 1.0  # out of the sample for good: kept for the costliest list only
            else:
                self._fold(g, r)

    def _fold(self, g: _Name, w: WindowTally) -> None:
        rest = g.rest
        if rest is None:
            z = [0.0] * self.n
            rest = g.rest = WindowTally(w.name, None, w.start_ns, list(z), list(z), list(z), pid=w.pid,
                                        end_ns=w.start_ns, done=True,
                                        loop={REQUEST_FACT: 1.0, RUNS_FACT: 0.0, RUNS_TIME_FACT: 0.0})
        for i in range(self.n):
            rest.machine[i] += w.machine[i]
            rest.share[i] += w.share[i]
            rest.all[i] += w.all[i]
        loop = rest.loop
        loop[RUNS_FACT] += 1.0
        loop[RUNS_TIME_FACT] += ((w.end_ns if w.end_ns is not None else w.start_ns) - w.start_ns) / 1e9
        if w.unit is not None:
            loop[SAMPLES_FACT] = loop.get(SAMPLES_FACT, 0.0) + w.samples
            loop[CPU_FACT] = loop.get(CPU_FACT, 0.0) + w.cpu_ns / 1e9
        if rest.pid != w.pid:
            rest.pid = None  # runs of several processes
        rest.start_ns = min(rest.start_ns, w.start_ns)
        rest.end_ns = rest.start_ns

    @property
    def count(self) -> int:
        """Runs added so far, every name."""
        return sum(g.count for g in self._names.values())

    def tallies(self) -> list[WindowTally]:
        """The runs kept one by one and each name's fold of the others, in the order they began."""
        out: list[WindowTally] = []
        for g in self._names.values():
            kept = {id(w): w for w in g.sample}
            for top in g.top:
                kept.update((id(w), w) for w in top)
            out.extend(kept.values())
            if g.rest is not None:
                out.append(g.rest)
        out.sort(key=lambda w: w.start_ns)
        return out
