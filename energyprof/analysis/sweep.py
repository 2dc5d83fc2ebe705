"""A sweep's table: each configuration's runs as a mean and spread, the best under an objective, the front. Pure.

Objectives (`--objective`), each over the configurations' means:
- `energy`: the least energy; `time`: the least time; `edp`: the least energy x time;
- `slowdown:F`: the least energy among those within F times the fastest's time (Zeus's MaxSlowdown);
- `cost:ETA`: the least ETA x E + (1 - ETA) x P_max x T (Zeus's cost), P_max being the highest power
  limit swept when a power limit is swept, else the highest mean power measured.
"""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from ..record import field, record
from .pareto import front


class ObjectiveError(ValueError):
    """A bad --objective: the message is one line."""


@record(frozen=True)
class Objective:
    name: str  # energy, time, edp, slowdown, cost
    param: float | None = None

    def __str__(self) -> str:
        return self.name if self.param is None else f"{self.name}:{self.param:g}"


def parse_objective(text: str) -> Objective:
    name, colon, arg = text.partition(":")
    if name in ("energy", "time", "edp") and not colon:
        return Objective(name)
    if name in ("slowdown", "cost") and colon:
        try:
            value = float(arg)
        except ValueError:
            raise ObjectiveError(f"--objective {text}: {arg!r} is not a number") from None
        if name == "slowdown" and not value >= 1.0:
            raise ObjectiveError(f"--objective {text}: the slowdown factor must be >= 1")
        if name == "cost" and not 0.0 <= value <= 1.0:
            raise ObjectiveError(f"--objective {text}: cost's eta must be within 0-1")
        return Objective(name, value)
    raise ObjectiveError(f"--objective {text!r}: one of energy, time, edp, slowdown:FACTOR, cost:ETA")


@record(frozen=True)
class RunResult:
    config: int
    repeat: int
    time_s: float
    energy_j: float


@record
class ConfigSummary:
    index: int
    label: str
    values: dict[str, str]
    n: int
    time_s: float
    time_std: float
    energy_j: float
    energy_std: float
    pareto: bool = False
    score: float | None = None  # under the objective (lower is better); None: not eligible (slowdown)
    runs: list[RunResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.index, "label": self.label, "values": self.values, "n": self.n,
                "time_s": {"mean": self.time_s, "std": self.time_std},
                "energy_j": {"mean": self.energy_j, "std": self.energy_std},
                "pareto": self.pareto, "score": self.score,
                "runs": [{"repeat": r.repeat, "time_s": r.time_s, "energy_j": r.energy_j} for r in self.runs]}


def _std(xs: Sequence[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def summarize(configs: Sequence[dict[str, str]], results: Sequence[RunResult]) -> list[ConfigSummary]:
    """One summary per configuration that has at least one run (mean, sample std, n), the front marked."""
    out = []
    for i, values in enumerate(configs):
        runs = [r for r in results if r.config == i]
        if not runs:
            continue
        ts, es = [r.time_s for r in runs], [r.energy_j for r in runs]
        out.append(ConfigSummary(i, label(values), dict(values), len(runs), statistics.fmean(ts), _std(ts),
                                 statistics.fmean(es), _std(es), runs=runs))
    for s, on in zip(out, front([(s.time_s, s.energy_j) for s in out])):
        s.pareto = on
    return out


def label(values: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in values.items())


def score(summaries: list[ConfigSummary], objective: Objective, max_power_w: float | None = None) -> ConfigSummary | None:
    """Score each configuration under the objective (lower is better) and return the best; None when none ran."""
    if not summaries:
        return None
    if objective.name == "energy":
        for s in summaries:
            s.score = s.energy_j
    elif objective.name == "time":
        for s in summaries:
            s.score = s.time_s
    elif objective.name == "edp":
        for s in summaries:
            s.score = s.energy_j * s.time_s
    elif objective.name == "slowdown":
        assert objective.param is not None
        fastest = min(s.time_s for s in summaries)
        for s in summaries:
            s.score = s.energy_j if s.time_s <= objective.param * fastest else None
    else:
        assert objective.param is not None
        eta = objective.param
        p_max = max_power_w if max_power_w is not None else max(s.energy_j / s.time_s for s in summaries if s.time_s > 0)
        for s in summaries:
            s.score = eta * s.energy_j + (1.0 - eta) * p_max * s.time_s
    eligible = [s for s in summaries if s.score is not None]
    # ties go to the first configuration in the grid's order: the same answer every time
    return min(eligible, key=lambda s: (s.score, s.index)) if eligible else None
