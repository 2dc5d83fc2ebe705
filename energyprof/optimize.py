"""`from energyprof.optimize import PowerLimitOptimizer, Energy, Time, MaxSlowdown, Cost`.

The online power-limit optimizer (integrations/power_limit.py) and its objectives (analysis/optimize.py),
under a stable public name. Zeus users switch by changing the import: the callbacks keep Zeus's names.
"""

from __future__ import annotations

from .analysis.optimize import Cost, Energy, MaxSlowdown, Objective, Time
from .integrations.power_limit import PowerLimitOptimizer

__all__ = ["PowerLimitOptimizer", "Objective", "Energy", "Time", "MaxSlowdown", "Cost"]
