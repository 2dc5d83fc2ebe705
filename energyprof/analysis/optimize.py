"""Objectives that pick a power limit from measured windows: pure functions of {limit: (energy, time)}.

Each objective is Zeus's (`zeus/optimizer/power_limit.py`) with one correction: `Cost` takes the real
world size. Zeus's ZeusCost is eta*E + (1 - eta)*MaxPower*T with a world size of 1, while under DDP the
energy E is summed over N GPUs; the time term then weighs N times too little against energy and the cost
leans to low limits (on Zeus's own 4-GPU log it picks 100 W instead of 150 W). Here the time term is
MaxPower*T*world_size, the energy N GPUs could have spent at full power in that time.
"""

from __future__ import annotations

from ..record import record


Windows = dict[float, tuple[float, float]]  # limit (W) -> (energy J, time s) of one window


class Objective:
    name = ""

    def choose(self, windows: Windows, max_limit_w: float, world_size: int = 1) -> float:
        if not windows:
            raise ValueError("no window was measured, so no limit can be chosen")
        return min(windows, key=lambda lim: (self.score(windows, lim, max_limit_w, world_size), -lim))

    def score(self, windows: Windows, limit: float, max_limit_w: float, world_size: int) -> float:
        raise NotImplementedError


@record(frozen=True)
class Energy(Objective):
    name = "energy"

    def score(self, windows: Windows, limit: float, max_limit_w: float, world_size: int) -> float:
        return windows[limit][0]


@record(frozen=True)
class Time(Objective):
    name = "time"

    def score(self, windows: Windows, limit: float, max_limit_w: float, world_size: int) -> float:
        return windows[limit][1]


@record(frozen=True)
class MaxSlowdown(Objective):
    """The lowest limit whose time is within `factor` of the time at the highest limit measured."""

    factor: float = 1.1
    name = "max_slowdown"

    def __post_init__(self) -> None:
        if self.factor < 1.0:
            raise ValueError(f"MaxSlowdown factor must be at least 1, not {self.factor:g}")

    def choose(self, windows: Windows, max_limit_w: float, world_size: int = 1) -> float:
        if not windows:
            raise ValueError("no window was measured, so no limit can be chosen")
        budget = windows[max(windows)][1] * self.factor
        within = [lim for lim, (_, t) in windows.items() if t <= budget]
        return min(within)


@record(frozen=True)
class Cost(Objective):
    """eta*E + (1 - eta)*MaxPower*T*world_size (Zeus's ZeusCost with the real world size)."""

    eta: float = 0.5
    name = "cost"

    def __post_init__(self) -> None:
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"Cost eta must be in [0, 1], not {self.eta:g}")

    def score(self, windows: Windows, limit: float, max_limit_w: float, world_size: int) -> float:
        energy, time_s = windows[limit]
        return self.eta * energy + (1.0 - self.eta) * max_limit_w * time_s * max(1, world_size)


def describe(objective: Objective) -> str:
    if isinstance(objective, MaxSlowdown):
        return f"MaxSlowdown({objective.factor:g})"
    if isinstance(objective, Cost):
        return f"Cost({objective.eta:g})"
    return type(objective).__name__ + "()"
